"""Fixtures shared by the engine's tests.

`each_codec`: a test using it (a module: `pytestmark = pytest.mark.usefixtures("each_codec")`)
runs twice, once with the compiled record batch codec and once with the pure Python one
(record_batch's `_codec` set to None for the test, as WEIR_PURE_PYTHON_CODEC=1 does at
import), so that the fallback stays exercised by the reads and puts it serves.
Processes a test forks inherit the choice; processes it starts afresh read the
environment (tests/engine/test_batch_codec.py runs those with the variable set).
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiokafka.errors import CorruptRecordException

from channel_engine.event import Event
from channel_engine.log import record_batch


@pytest.fixture(params=["compiled", "python"])
def each_codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The codec the test runs on: "compiled" (which must be built) or "python"."""
    if request.param == "compiled":
        if record_batch._codec is None:  # turned off for the run: this test turns it on
            from channel_engine.log import _batch_codec  # an ImportError: it was not built
            _batch_codec.configure(Event, CorruptRecordException)
            monkeypatch.setattr(record_batch, "_codec", _batch_codec)
    else:
        monkeypatch.setattr(record_batch, "_codec", None)
        monkeypatch.setattr(record_batch, "CODEC", "python (turned off by the test)")
    yield request.param

"""Fixtures shared by the engine's tests.

`each_codec`: a test using it (a module: `pytestmark = pytest.mark.usefixtures("each_codec")`)
runs twice, once with the compiled record batch codec and once with the pure Python one
(record_batch's `_codec` set to None for the test, as WEIR_PURE_PYTHON_CODEC=1 does at
import), so that the fallback stays exercised by the reads and puts it serves.
Processes a test forks inherit the choice; processes it starts afresh read the
environment (tests/engine/test_batch_codec.py runs those with the variable set).

`batch_codec`: the compiled codec module itself, imported directly, so that its tests run
whatever WEIR_PURE_PYTHON_CODEC says. Where it was not built (no C compiler at install)
the tests that need it are skipped, saying so, unless WEIR_REQUIRE_COMPILED_CODEC=1 (set
by scripts/test.sh, whose bootstrap compiles it): then they fail (codec_helpers.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from codec_helpers import compiled_codec

from channel_engine.log import record_batch


@pytest.fixture
def batch_codec() -> ModuleType:
    """The compiled codec module (conftest.compiled_codec: skipped or failed when not built)."""
    return compiled_codec()


@pytest.fixture(params=["compiled", "python"])
def each_codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The codec the test runs on: "compiled" (skipped when not built) or "python"."""
    if request.param == "compiled":
        codec = compiled_codec()
        monkeypatch.setattr(record_batch, "_codec", codec)
        monkeypatch.setattr(record_batch, "CODEC", f"compiled (C, CRC-32C "
                                                   f"{codec.CRC32C_IMPLEMENTATION})")
    else:
        monkeypatch.setattr(record_batch, "_codec", None)
        monkeypatch.setattr(record_batch, "CODEC", "python (turned off by the test)")
    yield request.param

"""The compiled record batch codec for the tests that need it: skipped where it was not
built, failed instead when WEIR_REQUIRE_COMPILED_CODEC=1 (scripts/test.sh sets it: its
bootstrap compiles the codec, so a missing one there is a broken build, not a machine
without a compiler)."""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_COMPILED_VARIABLE = "WEIR_REQUIRE_COMPILED_CODEC"


def compiled_codec() -> ModuleType:
    """The compiled codec module; skip the calling test when it was not built, or fail it
    when WEIR_REQUIRE_COMPILED_CODEC=1."""
    return compiled_module("_batch_codec", "record batch codec")


def compiled_module(name: str, what: str) -> ModuleType:
    """channel_engine.log.<name>, one of the engine's optional C extensions, as
    compiled_codec says."""
    try:
        return importlib.import_module(f"channel_engine.log.{name}")
    except ImportError as exc:
        reason = f"the compiled {what} is not built ({exc})"
        if os.environ.get(REQUIRE_COMPILED_VARIABLE) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_COMPILED_VARIABLE}=1 requires it")
        pytest.skip(f"{reason}: run scripts/bootstrap.sh where a C compiler can be installed")

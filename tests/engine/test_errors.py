"""Every error class of channel_engine lives in errors.py, under ChannelEngineError."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from channel_engine import errors

PACKAGE = Path(__file__).resolve().parents[2] / "channel_engine"


def test_it_defines_no_error_class_outside_errors_py() -> None:
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(base) for base in getattr(node, "bases", [])]
            if isinstance(node, ast.ClassDef) and (
                    node.name.endswith(("Error", "Exception"))
                    or any(base.endswith(("Error", "Exception")) for base in bases)):
                elsewhere.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not elsewhere, "error classes outside errors.py:\n" + "\n".join(elsewhere)


def test_every_error_in_errors_py_is_a_channel_engine_error() -> None:
    classes = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, BaseException) and cls.__module__ == errors.__name__]
    assert len(classes) > 20
    assert all(issubclass(cls, errors.ChannelEngineError) for cls in classes), classes


def test_the_errors_callers_caught_as_builtins_still_are() -> None:
    assert issubclass(errors.ExportError, RuntimeError)
    assert issubclass(errors.ExportRunningError, RuntimeError)
    assert issubclass(errors.RangeUnavailableError, LookupError)
    assert issubclass(errors.ConfigError, ValueError)

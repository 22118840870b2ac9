"""channel_engine imports only downward: tools -> channel -> owner -> queue -> log -> base.

Every module of the package is parsed (not imported) and mapped to its layer; every import
in it — at the top, inside a function, under TYPE_CHECKING — must name a module of its own
layer or a lower one. The drains — `spark` (the exporter, run by Spark's driver and
executors) and `kafka_sink` — may use the public API (`from channel_engine import ...`),
their own modules and only the lower modules DRAIN_ALLOWED names, each with the reason.
A failure names the module, the line and the import.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "channel_engine"

LAYERS = ("base", "log", "queue", "owner", "channel", "tools")  # lowest first
BASE = frozenset({"errors", "event", "atomic_file", "disk_space", "filenames", "encryption",
                  "channel_id", "offset_ranges", "incarnations"})
CHANNEL = frozenset({"channel_engine", "channel_engine.channel", "channel_engine.transaction"})
FOLDERS = frozenset({"log", "queue", "owner", "tools"})

DRAINS = ("spark", "kafka_sink")
# What the drains may import below the public API, and why.
DRAIN_ALLOWED = {
    # Executors decode a committed batch column by column into Arrow
    # (record_columns, check_batch, unseal); the public API hands out Events one by one.
    "channel_engine.log.record_batch": "columnar decode of committed batches",
    # Executors open sealed batches with the channel's key ring, as the owner does.
    "channel_engine.encryption": "the key ring for encrypted channels",
    # Base helpers with no channel semantics, shared by both drains.
    "channel_engine.atomic_file": "writing files atomically",
    "channel_engine.channel_id": "the id the drains' records know a channel by",
    "channel_engine.offset_ranges": "merging and subtracting offset ranges",
    "channel_engine.incarnations": "checking what a drain sent against each partition's "
                                   "incarnation",
    # Every error class lives there, the drains' own (RangeUnavailableError,
    # ExportRunningError, ...) among them; the public API exports only the channel's.
    "channel_engine.errors": "the drains' error classes",
    # One definition of text (utf8_text) for the API's events and the export's columns.
    "channel_engine.event": "what counts as an event's text",
}


def module_name(path: Path) -> str:
    """The dotted name of a module file of the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """The layer a module of channel_engine belongs to (its drain for a drain's)."""
    parts = module.split(".")
    if module in CHANNEL:
        return "channel"
    if module == "channel_engine.__main__":
        return "tools"  # `python -m channel_engine` is the CLI
    if parts[1] in DRAINS:
        return parts[1]
    if parts[1] in FOLDERS:
        return parts[1]
    if len(parts) == 2 and parts[1] in BASE:
        return "base"
    raise AssertionError(f"{module}: in no layer; place it in a folder or name it in BASE")


def is_module(dotted: str) -> bool:
    """Whether a dotted name of channel_engine is a module or package (not a name in one)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(module: str, is_package: bool, source: str) -> list[tuple[int, str]]:
    """(line, module) for every channel_engine module that `source` imports, anywhere."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if is_module(name) else base))
    return [(line, name) for line, name in found
            if name == "channel_engine" or name.startswith("channel_engine.")]


def violations(module: str, is_package: bool, source: str) -> list[str]:
    """What in `source` (the text of `module`) imports upward, one line each."""
    own = layer_of(module)
    wrong = []
    for line, target in imported_modules(module, is_package, source):
        there = layer_of(target)
        if own in DRAINS:
            ok = (there == own or target == "channel_engine" or target in DRAIN_ALLOWED)
        else:
            ok = there not in DRAINS and LAYERS.index(there) <= LAYERS.index(own)
        if not ok:
            wrong.append(f"{module}:{line} ({own}) imports {target} ({there})")
    return wrong


def engine_modules() -> list[Path]:
    """Every Python file of channel_engine."""
    return sorted(PACKAGE.rglob("*.py"))


def test_it_places_every_module_in_a_layer() -> None:
    for path in engine_modules():
        assert layer_of(module_name(path)) in LAYERS + DRAINS


def test_nothing_imports_upward() -> None:
    wrong = []
    for path in engine_modules():
        wrong += violations(module_name(path), path.name == "__init__.py", path.read_text())
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_it_catches_an_upward_import_even_inside_a_function() -> None:
    source = ("from channel_engine.errors import ConfigError\n"
              "def f() -> None:\n"
              "    from channel_engine.queue import checkpoint\n")
    assert violations("channel_engine.log.segment", False, source) == [
        "channel_engine.log.segment:3 (log) imports channel_engine.queue.checkpoint (queue)"]


def test_it_catches_a_relative_upward_import() -> None:
    source = "from ..owner.protocol import SOCKET_NAME\n"
    assert violations("channel_engine.queue.home_files", False, source) == [
        "channel_engine.queue.home_files:1 (queue) imports channel_engine.owner.protocol (owner)"]


def test_it_keeps_spark_to_the_public_api() -> None:
    assert violations("channel_engine.spark.source", False,
                      "from channel_engine import ChannelConfig, PartitionLog\n") == []
    assert violations("channel_engine.spark.source", False,
                      "from channel_engine.log.partition_log import PartitionLog\n") == [
        "channel_engine.spark.source:1 (spark) imports channel_engine.log.partition_log (log)"]


def test_the_engine_never_imports_spark() -> None:
    assert violations("channel_engine.tools.cli", False, "import channel_engine.spark.export\n")

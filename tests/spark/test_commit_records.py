"""Commit records (channel_engine/spark/commit_records.py): what a run writes reads back
the same; records of runs from before the format marker still read; a damaged record or
one of another format or version is an ExportError naming it, never skipped or trusted.
(The records' place in the protocol, with real Spark: test_export.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from channel_engine.errors import ExportError
from channel_engine.spark.commit_records import (
    RECORD_FORMAT,
    RECORD_VERSION,
    CommitRecords,
    commit_record,
    read_record,
    schema_version,
)
from channel_engine.spark.dfs import Dfs
from channel_engine.spark.output_layout import OutputLayout

URI = "hdfs://nn:8020/weir/orders/_weir/commits/1795788300000-1a2b3c4d.json"


def test_a_record_reads_back_as_written_with_its_format_and_version() -> None:
    record = commit_record("1795788300000-1a2b3c4d", "5f0c9e", [["tmp/a", "final/a"]],
                           {2: [(0, 100), (150, 200)], 0: [(7, 8)]}, 2, incarnations={})
    assert record["format"] == RECORD_FORMAT and record["version"] == RECORD_VERSION == 1
    assert record["schema_version"] == schema_version(record) == 2
    assert list(record["ranges"]) == ["2", "0"]  # in the order given
    assert read_record(URI, json.dumps(record).encode()) == record


def test_a_record_from_before_the_marker_still_reads() -> None:
    legacy = {"run_id": "r", "moves": [], "ranges": {"0": [[0, 10]]}}  # no channel_id either
    assert read_record(URI, json.dumps(legacy).encode()) == legacy
    assert schema_version(legacy) == 1  # its files are of the layout Weir wrote then


@pytest.mark.parametrize(("data", "says"), [
    (b'{"run_id": "r", "moves": [], "ran', "not JSON"),
    (b"", "not JSON"),
    (b"[1, 2]", "not a Weir commit record"),
    (b'{"format": "weir-export-id", "version": 1, "id": "x"}', "not a Weir commit record"),
    (b'{"format": "weir-export-commit", "version": 2, "moves": [], "ranges": {}}',
     "version 2"),
    (b'{"moves": [], "ranges": {"0": [[10, 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"0": [[-1, 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"0": [["0", 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"p0": [[0, 10]]}}', "malformed"),
    (b'{"moves": [["only-one"]], "ranges": {}}', "malformed"),
    (b'{"ranges": {}}', "malformed"),
    (b'{"moves": [], "ranges": {}, "schema_version": 3}', "schema_version must be one of"),
    (b'{"moves": [], "ranges": {}, "schema_version": "2"}', "schema_version must be one of"),
])
def test_a_damaged_or_unknown_record_is_an_error_naming_it(data: bytes, says: str) -> None:
    with pytest.raises(ExportError, match=says) as raised:
        read_record(URI, data)
    assert URI in str(raised.value) and "the run stops" in str(raised.value)


GOLDEN = Path(__file__).resolve().parent / "golden" / "export-files"


@pytest.mark.parametrize("version", [1, 2])
def test_a_record_without_a_schema_version_has_that_of_its_files(
        spark: Any, tmp_path: Path, version: int) -> None:
    # Weir wrote version 2 from the readable exports on, in records of version 1's shape
    dfs = Dfs(spark, tmp_path.as_uri())
    layout = OutputLayout(dfs, "orders")
    final = tmp_path / "orders" / "2026" / f"orders+0+{0:020d}+{1:020d}.parquet"
    final.parent.mkdir(parents=True)
    shutil.copyfile(GOLDEN / f"v{version}.parquet", final)
    commits = tmp_path / "orders" / "_weir" / "commits"
    commits.mkdir(parents=True)
    (commits / "1795788300000-1a2b3c4d.json").write_text(json.dumps(
        {"format": RECORD_FORMAT, "version": 1, "run_id": "1795788300000-1a2b3c4d",
         "channel_id": "c", "moves": [[dfs.join("orders", "gone"), f"file://{final}"]],
         "ranges": {"0": [[0, 2]]}}))
    # a compaction's summary names no file and sorts after its run's record
    (commits / "1795788300000-1a2b3c4d.summary.json").write_text(json.dumps(
        {"run_id": "1795788300000-1a2b3c4d", "channel_id": "c", "moves": [],
         "ranges": {"0": [[0, 2]]}}))
    records = CommitRecords(layout)
    assert records.recover("c") == {0: [(0, 2)]}
    assert records.schema_version == version

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
    assert record["format"] == RECORD_FORMAT and record["version"] == RECORD_VERSION == 2
    assert record["schema_version"] == schema_version(record) == 2
    assert list(record["ranges"]) == ["2", "0"]  # in the order given
    assert read_record(URI, json.dumps(record).encode()) == record
    assert "path" not in record and "paths" not in record


def test_a_runs_record_keeps_its_path_and_a_summary_its_paths() -> None:
    record = commit_record("r", "c", [["tmp/a", "final/a"]], {0: [(0, 1)]}, 2,
                           incarnations={}, path="v2/%Y/%m/%d/%H")
    assert read_record(URI, json.dumps(record).encode())["path"] == "v2/%Y/%m/%d/%H"
    summary = commit_record("r", "c", [], {0: [(0, 1)]}, 2, incarnations={},
                            paths={"%Y/%m/%d/%H": [1], "v2/%Y/%m/%d/%H": [2]})
    assert read_record(URI, json.dumps(summary).encode())["paths"] == \
        {"%Y/%m/%d/%H": [1], "v2/%Y/%m/%d/%H": [2]}


def test_records_carrying_paths_are_version_2_and_version_1_still_reads() -> None:
    # an older Weir reads version 1 only: it refuses these instead of compacting them into
    # a summary without paths (the module doc)
    run = commit_record("r", "c", [], {0: [(0, 1)]}, 2, incarnations={}, path="%Y")
    summary = commit_record("r", "c", [], {0: [(0, 1)]}, 2, incarnations={},
                            paths={"%Y": [2]})
    assert run["version"] == summary["version"] == 2
    old = {"format": RECORD_FORMAT, "version": 1, "run_id": "r", "moves": [], "ranges": {}}
    assert read_record(URI, json.dumps(old).encode()) == old


def test_a_record_from_before_the_marker_still_reads() -> None:
    legacy = {"run_id": "r", "moves": [], "ranges": {"0": [[0, 10]]}}  # no channel_id either
    assert read_record(URI, json.dumps(legacy).encode()) == legacy
    assert schema_version(legacy) == 1  # its files are of the layout Weir wrote then


@pytest.mark.parametrize(("data", "says"), [
    (b'{"run_id": "r", "moves": [], "ran', "not JSON"),
    (b"", "not JSON"),
    (b"[1, 2]", "not a Weir commit record"),
    (b'{"format": "weir-export-id", "version": 1, "id": "x"}', "not a Weir commit record"),
    (b'{"format": "weir-export-commit", "version": 3, "moves": [], "ranges": {}}',
     "version 3, this export reads versions 1 and 2 only"),
    (b'{"format": "weir-export-commit", "version": true, "moves": [], "ranges": {}}',
     "version True, this export"),
    (b'{"moves": [], "ranges": {"0": [[10, 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"0": [[-1, 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"0": [["0", 10]]}}', "malformed"),
    (b'{"moves": [], "ranges": {"p0": [[0, 10]]}}', "malformed"),
    (b'{"moves": [["only-one"]], "ranges": {}}', "malformed"),
    (b'{"ranges": {}}', "malformed"),
    (b'{"moves": [], "ranges": {}, "schema_version": 3}', "schema_version must be one of"),
    (b'{"moves": [], "ranges": {}, "schema_version": "2"}', "schema_version must be one of"),
    (b'{"moves": [], "ranges": {}, "path": 7}', "path or paths malformed"),
    (b'{"moves": [], "ranges": {}, "paths": ["%Y"]}', "path or paths malformed"),
    (b'{"moves": [], "ranges": {}, "paths": {"%Y": 1}}', "path or paths malformed"),
    (b'{"moves": [], "ranges": {}, "paths": {"%Y": []}}', "path or paths malformed"),
    (b'{"moves": [], "ranges": {}, "paths": {"%Y": [3]}}', "schema_version must be one of"),
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
    # a compaction's summary names no file (it sorts before its run's record, and takes
    # the version of the record before: none here)
    (commits / "1795788300000-1a2b3c4d.summary.json").write_text(json.dumps(
        {"run_id": "1795788300000-1a2b3c4d", "channel_id": "c", "moves": [],
         "ranges": {"0": [[0, 2]]}}))
    records = CommitRecords(layout)
    assert records.recover("c") == {0: [(0, 2)]}
    assert records.schema_version == version


def test_it_tells_what_each_path_holds_and_a_compaction_keeps_it(
        spark: Any, tmp_path: Path) -> None:
    dfs = Dfs(spark, tmp_path.as_uri())
    layout = OutputLayout(dfs, "orders")
    name = f"orders+0+{0:020d}+{1:020d}.parquet"

    def put(place: str, golden: str = "v2.parquet") -> Path:
        file = tmp_path / place
        file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GOLDEN / golden, file)
        return file

    hour = put(f"orders/2026/11/27/14/{name}", "v1.parquet")
    put(f"orders/v2/2026/11/27/15/{name}")
    (tmp_path / "orders" / "says nothing").mkdir()
    (tmp_path / "orders" / "says nothing" / "notes.txt").write_text("not an export file")
    # no data: the records, a temp dir, Spark's _temporary, a hidden folder, the root
    for place in ("orders/_weir/tmp/r/_p=0/a.parquet", "orders/v1/_temporary/0/a.parquet",
                  "orders/v1/.hidden/a.parquet", "orders/a.parquet"):
        put(place, "v1.parquet")
    elsewhere = put(f"elsewhere/2026/{name}", "v1.parquet")
    commits = tmp_path / "orders" / "_weir" / "commits"
    commits.mkdir(parents=True)

    def write(record_name: str, **record: Any) -> None:
        (commits / record_name).write_text(json.dumps({"moves": [], "ranges": {}, **record}))

    # before the paths: a run's record holds the folders of its files still there (not a
    # pruned one's, nor one's outside the root), in the version its files tell; a summary
    # what the output's folders hold, listed (the version a folder's file tells, else its)
    write("1795788299999-99999999.json")  # a run that wrote no files: none of them
    write("1795788300000-aaaaaaaa.json", moves=[
        [dfs.join("orders", "t1"), f"file://{hour}"],  # as Weir names them: not quoted
        [dfs.join("orders", "t2"), dfs.join("orders", "2026/11/27/15/gone.parquet")],
        [dfs.join("orders", "t3"), f"file://{elsewhere}"]])
    write("1795788300001-bbbbbbbb.summary.json", schema_version=2)
    # since: a run's record its path (a trailing slash names the same folder), a
    # summary's the paths it folded
    write("1795788300002-cccccccc.json", schema_version=2, path="v2/%Y/%m/%d/%H/")
    write("1795788300003-dddddddd.summary.json", schema_version=2,
          paths={"old/%Y": [1, 2]})
    held = {"2026/11/27/14": {1}, "v2/2026/11/27/15": {2}, "says nothing": {2},
            "v2/%Y/%m/%d/%H": {2}, "old/%Y": {1, 2}}
    records = CommitRecords(layout)
    records.recover("c")
    assert records.paths == held and records.schema_version == 2
    assert records.missing == [dfs.join("orders", "2026/11/27/15/gone.parquet")]
    assert records.rebuilt  # so it compacts below COMPACT_AFTER records: 4 here
    records.compact("1795788300004-eeeeeeee", "c", {}, incarnations={})
    [summary] = [json.loads(p.read_text()) for p in commits.glob("*.json")]
    assert summary["paths"] == {path: sorted(v) for path, v in sorted(held.items())}
    (tmp_path / "orders" / "v3" / "2026").mkdir(parents=True)  # a listing would see it
    put(f"orders/v3/2026/{name}")
    again = CommitRecords(layout)
    again.recover("c")
    assert again.paths == held  # compaction forgot nothing, and listed nothing again
    assert again.listed is None and not again.rebuilt
    again.compact("1795788300005-ffffffff", "c", {}, incarnations={})
    assert [p.name for p in commits.glob("*.json")] == ["1795788300004-eeeeeeee.summary.json"]


def test_a_files_folder_is_url_decoded_and_none_outside_the_root(
        spark: Any, tmp_path: Path) -> None:
    records = CommitRecords(OutputLayout(Dfs(spark, tmp_path.as_uri()), "orders"))
    root = records.layout.root
    assert records._folder_of(f"{root}/odd%20name/2026/a.parquet") == "odd name/2026"
    assert records._folder_of(f"{root}/2026/11/a.parquet") == "2026/11"
    assert records._folder_of(f"{root}-other/2026/a.parquet") is None
    assert records._folder_of((tmp_path / "elsewhere" / "a.parquet").as_uri()) is None

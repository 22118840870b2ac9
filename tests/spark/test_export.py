"""The export job with real Spark: every event reaches the output exactly once, whatever
step the job is killed at (SIGKILL) before a rerun, and no file is ever visible under its
final name before it is whole. Tests taking the `output` fixture run on file:// (Spark in
local mode) and on a real HDFS with executors in JVMs of their own (the run's Spark
cluster; conftest.py; the HDFS variants are marked `hdfs`).

A killed job is its own process (its own JVM and HDFS client, dead with it; local mode:
the kill points are the driver's); the rerun that must clean up after it runs on the
tests' SparkSession (export_here), which tests the same code without another JVM start."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from channel_engine import Channel, ChannelConfig
from channel_engine.channel_id import channel_id
from channel_engine.errors import ExportError
from channel_engine.spark import commit_records, exporter
from channel_engine.spark.dfs import Dfs
from channel_engine.spark.export_settings import ExportSettings
from channel_engine.spark.exporter import Exporter
from channel_engine.spark.file_formats import (
    AVRO_SCHEMA,
    AVRO_SCHEMA_V1,
    FORMATS,
    MAX_OPEN_FILES,
)
from channel_engine.spark.path_overlap import folder

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000
BASE_MS = 1_795_000_000_000 - 1_795_000_000_000 % HOUR_MS  # on an hour boundary
YEAR = 2026  # of BASE_MS
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAME = re.compile(r"^(?P<channel>[a-z0-9_-]+)\+(?P<p>\d+)\+(?P<first>\d{20})\+(?P<last>\d{20})"
                  r"\.(parquet|json)$")


def output_uri(tmp_path: Path) -> str:
    """A file:// output, for the tests that fail before anything is written."""
    return (tmp_path / "out").as_uri()


def event(i: int) -> tuple[int, bytes | None, dict[str, bytes], bytes]:
    """The i-th generated event: (timestamp, key, headers, body), over three hours."""
    key = None if i % 7 == 0 else f"k{i % 11}".encode()
    headers = {"n": str(i).encode()} if i % 3 else {}
    return BASE_MS + (i % 3) * HOUR_MS + i, key, headers, f"body-{i}".encode()


def put_events(channel: Channel, first: int, last: int) -> None:
    """Put events first..last-1, 50 a transaction."""
    for start in range(first, last, 50):
        with channel.put() as tx:
            for i in range(start, min(last, start + 50)):
                timestamp, key, headers, body = event(i)
                tx.put(body, key=key, headers=headers or None, timestamp=timestamp)


def make_channel(tmp_path: Path, events: int, partitions: int = 3) -> ChannelConfig:
    config = ChannelConfig("orders", [str(tmp_path / "data")], str(tmp_path / "home"),
                           partitions=partitions, minimum_required_space=0)
    with Channel.open(config) as channel:
        put_events(channel, 0, events)
    return config


def as_put(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows without partition and offset, sorted: comparable with event(i)."""
    return sorted((r[2], r[3], r[4], r[5]) for r in rows)


def job_env(*conf: str, **variables: str) -> dict[str, str]:
    """The environment of an export job run as its own process: the repo on its path,
    `conf` (spark.key=value) for its session, `variables` (no crash point unless named)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("WEIR_EXPORT_CRASH_AT", None)
    # A short-lived JVM: C1 only and the serial GC start it about a third faster; they
    # change no behaviour of the job.
    env.setdefault("PYSPARK_SUBMIT_ARGS", "".join(f"--conf {c} " for c in conf)
                   + "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' "
                   "pyspark-shell")
    return {**env, **variables}


def export(config: ChannelConfig, output: str, *args: str,
           crash_at: str | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run the job as spark-submit would, in its own process."""
    env = job_env(**({"WEIR_EXPORT_CRASH_AT": crash_at} if crash_at else {}))
    done = subprocess.run([sys.executable, "-m", "channel_engine.spark.export", "--home",
                           str(config.home), "--output", output, "--master", "local[2]",
                           *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)
    last = [line for line in done.stdout.splitlines() if line.startswith('{"report"')]
    report = json.loads(last[-1]) if last else None
    return done.returncode, report, done.stdout + done.stderr


def export_here(spark: Any, config: ChannelConfig, output: str,
                **settings: Any) -> dict[str, Any]:
    """Run the job in this process, on the tests' SparkSession (no new JVM)."""
    lines: list[str] = []
    report = Exporter(spark, ExportSettings(str(config.home), output, **settings),
                      progress=lines.append).run()
    report["log"] = lines
    return report


def committed_files(spark: Any, output: str) -> list[str]:
    """Every committed data file of the channel, as URIs (any Hadoop filesystem)."""
    dfs = Dfs(spark, output)
    root = dfs.join("orders")
    return sorted(uri for uri, _ in dfs.list_files(root)
                  if not any(part.startswith(("_", "."))
                             for part in uri[len(root):].strip("/").split("/")))


def relative(spark: Any, output: str, uri: str) -> str:
    """A committed file's path under <output>/orders/."""
    return uri[len(Dfs(spark, output).join("orders")):].strip("/")


def local(uri: str) -> Path:
    return Path(urlparse(uri).path)


def as_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """A committed row (read by pyarrow, or by Spark with the timestamp as unix_millis) as
    the channel stores its event: (partition, offset, timestamp ms, key, headers, body),
    text and bytes columns joined back into bytes (file_formats.py)."""
    return (row["partition"], row["offset"], millis(row["timestamp"]), raw(row, "key"),
            {**{name: None if value is None else value.encode()
                for name, value in pairs(row["headers"])}, **dict(pairs(row["headers_bytes"]))},
            raw(row, "body"))


def millis(value: Any) -> int:
    """A timestamp read back (an aware datetime from pyarrow, or millis) as millis."""
    return value if isinstance(value, int) else (value - EPOCH) // timedelta(milliseconds=1)


def raw(row: dict[str, Any], column: str) -> bytes | None:
    """The bytes of a text column and its *_bytes twin (one of them is null)."""
    return row[f"{column}_bytes"] if row[column] is None else row[column].encode()


def pairs(mapping: Any) -> list[tuple[str, Any]]:
    """A map column's entries (pyarrow gives a list of pairs, Spark a dict; None: none)."""
    return list(mapping.items() if isinstance(mapping, dict) else mapping or [])


def rows_by_spark(spark: Any, output: str) -> list[tuple[Any, ...]]:
    """Every committed row, read back by Spark from wherever the output is."""
    files = committed_files(spark, output)
    if not files:
        return []
    frame = spark.read.parquet(*files).withColumn("timestamp", F.unix_millis("timestamp"))
    return sorted(as_row(row.asDict()) for row in frame.collect())


def rows_by_pyarrow(spark: Any, output: str) -> list[tuple[Any, ...]]:
    """Every committed row, read back by pyarrow (each file's bytes through the output's
    own filesystem client)."""
    return sorted(as_row(row) for uri in committed_files(spark, output)
                  for row in file_rows(spark, uri))


def exported(spark: Any, output: str) -> list[tuple[Any, ...]]:
    """The committed rows, after checking Spark and pyarrow read the same ones."""
    rows = rows_by_pyarrow(spark, output)
    assert rows_by_spark(spark, output) == rows
    return rows


def stored(config: ChannelConfig) -> list[tuple[Any, ...]]:
    """Every event of the channel as it is in the logs."""
    events = []
    with Channel.open(config, read_only=True) as channel:
        for partition in range(config.partitions):
            offset = 0
            while batch := channel.read(partition, offset, 1000):
                events += [(e.partition, e.offset, e.timestamp, e.key, dict(e.headers), e.body)
                           for e in batch]
                offset = batch[-1].offset + 1
    return sorted(events)


def untaken(config: ChannelConfig) -> int:
    with Channel.open(config) as channel:
        return int(channel.status()["events_untaken"])


def file_rows(spark: Any, uri: str) -> list[dict[str, Any]]:
    """The rows of one committed Parquet file, read by pyarrow: from the local disk, or
    its bytes fetched through Hadoop's client (one Spark job a file would cost seconds)."""
    if uri.startswith("file:"):
        return list(pq.read_table(local(uri)).to_pylist())
    return list(pq.read_table(io.BytesIO(Dfs(spark, uri).read_bytes(uri))).to_pylist())


def check_names(spark: Any, output: str, roll: int) -> None:
    """Each file sits in its hour, is named by partition and the first and last offset it
    holds, no two files share a name (in any hour) and no two of an hour an offset."""
    seen: dict[str, set[tuple[int, int]]] = {}
    names: set[str] = set()
    for uri in committed_files(spark, output):
        path = relative(spark, output, uri)
        hour, name = path.rsplit("/", 1)
        match = NAME.fullmatch(name)
        assert re.fullmatch(r"\d{4}/\d{2}/\d{2}/\d{2}", hour) and match, path
        assert name not in names, path
        names.add(name)
        first, last = int(match["first"]), int(match["last"])
        assert last - first < roll and first // roll == last // roll, path  # rolled
        rows = file_rows(spark, uri)
        assert {r["partition"] for r in rows} == {int(match["p"])}
        held = [r["offset"] for r in rows]
        assert (min(held), max(held)) == (first, last), path
        offsets = {(r["partition"], r["offset"]) for r in rows}
        assert not offsets & seen.setdefault(hour, set()), path
        seen[hour] |= offsets


def test_an_export_writes_every_event_once_in_files_named_by_range(
        tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 600)
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "10")  # a cluster's default, say
    try:
        report = export_here(spark, config, output, roll_rows=100)
    finally:
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    assert report["rows"] == 600 and report["outcome"] == "ok"
    assert any(line.startswith("export orders: writing 600 events") for line in report["log"])
    rows = exported(spark, output)
    assert rows == stored(config)
    assert as_put(rows) == sorted(event(i) for i in range(600))  # every row as it was put
    check_names(spark, output, 100)
    assert untaken(config) == 0
    assert export_here(spark, config, output)["rows"] == 0  # nothing new: nothing written
    assert exported(spark, output) == stored(config)


def check_whole_files(spark: Any, output: str, config: ChannelConfig) -> None:
    """Every file under a final name is whole: its Parquet footer reads (through the
    output's own filesystem client) and it holds exactly the events of its name's range
    that fall in its hour, no fewer (cut short) and no more."""
    dfs = Dfs(spark, output)
    events = stored(config)
    for uri in committed_files(spark, output):
        hour, name = relative(spark, output, uri).rsplit("/", 1)
        match = NAME.fullmatch(name)
        assert match, uri
        p, first, last = int(match["p"]), int(match["first"]), int(match["last"])
        table = pq.read_table(io.BytesIO(dfs.read_bytes(uri)))  # the footer, then the rows
        assert set(table.column("partition").to_pylist()) == {p}, uri
        assert sorted(table.column("offset").to_pylist()) == [
            e[1] for e in events if e[0] == p and first <= e[1] <= last
            and time.strftime("%Y/%m/%d/%H", time.gmtime(e[2] // 1000)) == hour], uri


def killed_and_rerun(tmp_path: Path, spark: Any, output: str, step: str) -> dict[str, Any]:
    """Kill the job at `step`, check the final names hold whole files only, run it
    again; check every event is out exactly once."""
    config = make_channel(tmp_path, 300)
    code, _, log = export(config, output, "--roll-rows", "50", crash_at=step)
    assert code == -9, log  # SIGKILL at that step
    check_whole_files(spark, output, config)
    report = export_here(spark, config, output, roll_rows=50)
    assert report["outcome"] == "ok", report
    assert exported(spark, output) == stored(config)  # nothing missing, nothing twice
    check_whole_files(spark, output, config)
    assert untaken(config) == 0
    assert Dfs(spark, output).list_files(Dfs(spark, output).join("orders", "_weir", "tmp")) == []
    return report


STEPS = ("reserved", "writing", "written", "recorded", "moving", "moved")


def kill_cases(on_file: tuple[str, ...], on_hdfs: tuple[str, ...]) -> list[Any]:
    """(filesystem, step) cases of a kill test: the default run takes the steps named for
    each filesystem, the slow run (-m slow) every step on both."""
    return [pytest.param(filesystem, step, id=f"{filesystem}-{step}", marks=[
        *([pytest.mark.hdfs] if filesystem == "hdfs" else []),
        *([] if step in (on_hdfs if filesystem == "hdfs" else on_file) else [pytest.mark.slow])])
        for step in STEPS for filesystem in ("file", "hdfs")]


# Every step on HDFS (the target). On file:// the default run kills at "writing" only:
# each step is the same code on both filesystems, and what file:// adds (dfs.py's syncs)
# a kill cannot observe (the page cache survives it). The slow run (-m slow) kills at
# every step on file:// too. (Each case starts a job of its own: ~35 s on 2 CPUs.)
@pytest.mark.parametrize(("output", "step"), kill_cases(
    on_file=("writing",), on_hdfs=STEPS), indirect=["output"])
def test_a_job_killed_at_any_step_then_rerun_exports_each_event_exactly_once(
        tmp_path: Path, spark: Any, output: str, step: str) -> None:
    report = killed_and_rerun(tmp_path, spark, output, step)
    if step in ("recorded", "moving", "moved"):  # the first run's record holds the events
        assert report["rows"] == 0
        assert sum(len(p["skipped"]) for p in report["partitions"]) > 0
        assert len(report["committed_runs"]) == 1  # the killed run committed: its row says
    else:
        assert report["committed_runs"] == []


# Default run: HDFS, killed while writing; the slow run: every step on both.
@pytest.mark.parametrize(("output", "step"), kill_cases(
    on_file=(), on_hdfs=("writing",)), indirect=["output"])
def test_a_job_killed_under_a_live_owner_then_rerun_with_new_events_exports_once(
        tmp_path: Path, spark: Any, output: str, step: str) -> None:
    # The job is a client of this process, which owns the channel: its death returns the
    # take to the head, beside events put since, so the rerun reserves two ranges of a
    # partition (they are joined, and named by what they hold).
    config = make_channel(tmp_path, 0)
    with Channel.open(config) as owner:
        put_events(owner, 0, 300)
        code, _, log = export(config, output, "--roll-rows", "70", crash_at=step)
        assert code == -9, log
        put_events(owner, 300, 420)
        assert export_here(spark, config, output, roll_rows=70)["outcome"] == "ok"
        assert owner.status()["events_untaken"] == 0
    rows = exported(spark, output)
    assert rows == stored(config) and as_put(rows) == sorted(event(i) for i in range(420))
    check_names(spark, output, 70)


def test_returned_ranges_around_a_consumers_take_are_exported_once(
        tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 0, partitions=1)
    with Channel.open(config) as owner:
        put_events(owner, 0, 300)
        first, middle, last = owner.take(), owner.take(), owner.take()
        assert [len(tx.take(50)) for tx in (first, middle, last)] == [50, 50, 50]
        middle.commit()  # a consumer took [50, 100)
        first.rollback()  # [0, 50) returns; [100, 150) stays in flight
        report = export_here(spark, config, output, roll_rows=1000)
        assert report["partitions"][0]["ranges"] == [(0, 50), (150, 300)]
        last.rollback()
        put_events(owner, 300, 350)
        report = export_here(spark, config, output, roll_rows=1000)
        assert report["partitions"][0]["ranges"] == [(100, 150), (300, 350)]
        assert owner.status()["events_untaken"] == 0
    rows = exported(spark, output)
    assert [r[1] for r in rows] == [o for o in range(350) if not 50 <= o < 100]
    check_names(spark, output, 1000)


def test_an_export_on_its_own_subscription_and_a_consumer_each_see_every_event(
        tmp_path: Path, spark: Any) -> None:
    output = output_uri(tmp_path)  # which queue a run drains is the same on any filesystem
    config = make_channel(tmp_path, 0, partitions=2)
    with Channel.open(config) as owner:
        owner.add_subscription("export")  # as the appliance does when it schedules exports
        put_events(owner, 0, 200)
        with owner.take() as consumer:  # a consumer of default takes everything first
            assert len(consumer.take(200)) == 200
        assert export_here(spark, config, output, subscription="export")["rows"] == 200
        put_events(owner, 200, 260)
        assert export_here(spark, config, output, subscription="export")["rows"] == 60
        subs = owner.status()["subscriptions"]
        assert subs["export"]["events_untaken"] == 0 and subs["default"]["events_untaken"] == 60
        # the export moved to a subscription the channel lacks: the run adds it where the
        # slowest (default) stands, and the commit records skip its 60 events, out already
        report = export_here(spark, config, output, subscription="hdfs")
        assert "added subscription 'hdfs' where the slowest" in report["log"][0]
        assert report["rows"] == 0 and sum(len(p["skipped"]) for p in report["partitions"])
        assert owner.status()["subscriptions"]["hdfs"]["events_untaken"] == 0
    assert as_put(exported(spark, output)) == sorted(event(i) for i in range(260))


def test_a_pruned_output_file_is_reported_and_stops_nothing(
        tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 60, partitions=1)
    export_here(spark, config, output)
    gone = committed_files(spark, output)[0]
    Dfs(spark, output).delete(gone)  # an operator pruned an old hour
    with Channel.open(config) as channel:
        put_events(channel, 60, 90)
    report = export_here(spark, config, output)
    assert report["rows"] == 30 and report["missing_files"] == [gone]
    assert any("committed files are gone" in line for line in report["log"])


def test_commit_records_are_compacted_and_still_skip_what_they_hold(
        tmp_path: Path, spark: Any, output: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_channel(tmp_path, 0, partitions=1)
    dfs = Dfs(spark, output)
    commits = dfs.join("orders", "_weir", "commits")
    dfs.mkdirs(commits)
    dfs.write_bytes(f"{commits}/.cut-short.json.tmp", b'{"moves": [[')  # a crash mid-write

    class Crash(Exception):
        pass

    def crash_after_moves(step: str) -> None:  # the take commit is lost after the moves
        if step == "moved" and os.environ.get("CRASH_AFTER_MOVES"):
            raise Crash(step)

    monkeypatch.setattr(exporter, "crash_point", crash_after_moves)
    monkeypatch.setattr(commit_records, "COMPACT_AFTER", 2)
    for i in range(3):
        with Channel.open(config) as channel:
            put_events(channel, i * 20, i * 20 + 20)
        export_here(spark, config, output)
    with Channel.open(config) as channel:
        put_events(channel, 60, 80)
    monkeypatch.setenv("CRASH_AFTER_MOVES", "1")
    with pytest.raises(Crash):
        export_here(spark, config, output)
    assert untaken(config) == 20  # the take rolled back: [60, 80) comes again
    monkeypatch.delenv("CRASH_AFTER_MOVES")
    # The crashed run compacted the 3 records before it into one summary, then wrote its
    # own record; the rerun skips [60, 80) by that record.
    report = export_here(spark, config, output)
    assert report["rows"] == 0 and report["partitions"][0]["skipped"] == [(60, 80)]
    names = sorted(uri.rsplit("/", 1)[-1] for uri, _ in dfs.list_files(commits))
    summaries = [n for n in names if n.endswith(".summary.json")]
    assert len(names) == 2 and len(summaries) == 1, names  # the cut-short record is gone
    summary = json.loads(dfs.read_bytes(f"{commits}/{summaries[0]}"))
    assert summary["ranges"] == {"0": [[0, 60]]} and summary["moves"] == []
    with Channel.open(config) as channel:
        put_events(channel, 80, 100)
    report = export_here(spark, config, output)  # skips by the summary and the record
    assert report["rows"] == 20
    assert [r[1] for r in exported(spark, output)] == list(range(100))


def test_a_channel_created_again_under_its_old_name_is_exported_whole(
        tmp_path: Path, spark: Any, output: str) -> None:
    import shutil

    config = make_channel(tmp_path, 90, partitions=1)
    assert export_here(spark, config, output, roll_rows=1000)["rows"] == 90
    shutil.rmtree(tmp_path / "home")  # deleted (as the appliance deletes a channel) ...
    shutil.rmtree(tmp_path / "data")
    config = make_channel(tmp_path, 90, partitions=1)  # ... and made again: offsets from 0
    report = export_here(spark, config, output, roll_rows=1000)
    assert report["rows"] == 90 and report["partitions"][0]["skipped"] == []
    names = [relative(spark, output, uri) for uri in committed_files(spark, output)]
    renamed = [n for n in names if re.search(r"\+[0-9a-f]{8}\.parquet$", n)]
    assert len(names) == 6 and len(renamed) == 3, names  # the old files' names were taken
    rows = exported(spark, output)
    assert sorted(r[5] for r in rows) == sorted([event(i)[3] for i in range(90)] * 2)


def test_files_roll_by_bytes(tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 6000, partitions=1)
    with Channel.open(config) as channel:
        per_event = channel.status()["bytes_on_disk"] // 6000  # log bytes an event
    report = export_here(spark, config, output, roll_bytes=16 << 10)
    sizes = [len(file_rows(spark, uri)) for uri in committed_files(spark, output)]
    assert report["rows"] == 6000 and sum(sizes) == 6000
    assert max(sizes) <= (16 << 10) // per_event < 1000  # rolled by bytes, not rows
    assert len({relative(spark, output, u).rsplit("/", 1)[-1].split("+")[2]
                for u in committed_files(spark, output)}) >= 6000 * per_event // (16 << 10)


def test_progress_counts_rows_as_they_are_written(tmp_path: Path) -> None:
    # One Spark task per 200,000 rows: a count of finished tasks would jump from 0 to
    # 50% to 100%; the rows written so far rise in between.
    config = make_channel(tmp_path, 0, partitions=1)
    with Channel.open(config) as channel:
        for start in range(0, 400_000, 4_000):
            with channel.put() as tx:
                for i in range(start, start + 4_000):
                    tx.put(b"x" * 200, timestamp=BASE_MS + i)
    code, report, log = export(config, output_uri(tmp_path), "--progress-every", "0.2")
    assert code == 0 and report is not None and report["report"]["rows"] == 400_000, log
    counts = [int(found[1].replace(",", "")) for found in re.finditer(
        r"export orders: ([\d,]+) of 400,000 rows written \(\d+%\)", log)]
    assert counts == sorted(counts), counts  # never backwards
    assert [c for c in counts if 0 < c < 400_000 and c % 200_000], (counts, log[-3000:])


def test_an_empty_channel_writes_nothing(tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 0)
    report = export_here(spark, config, output)
    assert report["rows"] == 0 and report["partitions"] == []
    assert committed_files(spark, output) == []


def test_a_bad_output_uri_is_a_clear_error_and_the_events_stay(
        tmp_path: Path, spark: Any) -> None:
    config = make_channel(tmp_path, 40)
    with pytest.raises(Exception, match="nosuchfs"):
        export_here(spark, config, "nosuchfs://x/y")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(Exception):  # noqa: B017 -- Hadoop's error, whatever its class
        export_here(spark, config, (blocker / "out").as_uri())  # fails while writing
    assert untaken(config) == 40  # the take rolled back
    code, report, log = export(config, "nosuchfs://x/y")  # the CLI says so and exits 1
    assert code == 1 and report is not None and "nosuchfs" in report["error"], log
    code, report, log = export(config, (blocker / "out").as_uri())
    assert code == 1 and report is not None and report["run"] is not None, log
    failed = report["run"]["partitions"]
    assert sum(end - start for p in failed for start, end in p["ranges"]) == 40
    assert {p["outcome"] for p in failed} == {"failed"} and failed[0]["error"]
    assert untaken(config) == 40


@pytest.mark.parametrize("record", [b'{"run_id": "r", "moves": [], "ranges": {"0": [[0,',
                                    b'{"format": "weir-export-commit", "version": 3}'])
def test_a_damaged_or_newer_commit_record_stops_the_run_before_it_takes(
        tmp_path: Path, spark: Any, record: bytes) -> None:
    config = make_channel(tmp_path, 40)
    output = output_uri(tmp_path)
    assert export_here(spark, config, output)["rows"] == 40
    commits = local(Dfs(spark, output).join("orders", "_weir", "commits"))
    bad = commits / "1795788300000-0badc0de.json"
    bad.write_bytes(record)
    with Channel.open(config) as channel:
        put_events(channel, 40, 50)
    with pytest.raises(ExportError, match=re.escape(bad.name)):
        export_here(spark, config, output)
    assert untaken(config) == 10 and bad.read_bytes() == record  # nothing taken or "fixed"
    assert as_put(exported(spark, output)) == sorted(event(i) for i in range(40))


def avro_header(data: bytes) -> dict[str, bytes]:
    """The metadata of an Avro container file (avro.schema, avro.codec, ...): its header
    is b"Obj\\x01", then a map of bytes in blocks of zigzag-varint counts and lengths."""
    assert data[:4] == b"Obj\x01", data[:4]
    at = 4

    def long() -> int:
        nonlocal at
        shift = value = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return (value >> 1) ^ -(value & 1)

    def raw() -> bytes:
        nonlocal at
        size = long()
        at += size
        return data[at - size:at]

    meta: dict[str, bytes] = {}
    while count := long():
        if count < 0:  # a block with its size in bytes too
            count = -count
            long()
        for _ in range(count):
            key = raw().decode()
            meta[key] = raw()
    return meta


def test_json_lines_output(tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 30, partitions=1)
    dfs = Dfs(spark, output)
    export_here(spark, config, output, format="json", path="day=%Y-%m-%d")
    lines = [json.loads(line) for uri in committed_files(spark, output)
             for line in dfs.read_bytes(uri).decode().splitlines()]
    assert sorted(line["offset"] for line in lines) == list(range(30))
    assert all(relative(spark, output, u).startswith("day=")
               for u in committed_files(spark, output))


def test_it_writes_avro_with_sparks_writer_in_weirs_schema(
        tmp_path: Path, spark: Any, output: str) -> None:
    config = make_channel(tmp_path, 30, partitions=1)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"no key", headers={}, timestamp=BASE_MS + 30)
    report = export_here(spark, config, output, format="avro", path="avro/%Y",
                         roll_rows=20)
    files = committed_files(spark, output)
    assert [relative(spark, output, u) for u in files] == [
        f"avro/{YEAR}/orders+0+{first:020d}+{last:020d}.avro"
        for first, last in ((0, 19), (20, 30))]
    assert sorted(report["partitions"][0]["files"]) == files
    dfs = Dfs(spark, output)
    for uri in files:
        meta = avro_header(dfs.read_bytes(uri))
        # the schema readers of the fastavro-written files know (it wrote the full name
        # "weir.Event"; Spark writes name and namespace: the same record), deflated
        schema = json.loads(meta["avro.schema"])
        assert ".".join(filter(None, (schema.get("namespace"), schema["name"]))) == "weir.Event"
        assert schema["fields"] == AVRO_SCHEMA["fields"]
        assert meta["avro.codec"] == b"deflate"
        assert meta["org.apache.spark.version"].decode() == spark.version  # Spark wrote it
    # Spark's reader makes a timestamp of the timestamp-millis long: back to millis
    rows = (spark.read.format(FORMATS["avro"]).load(files)
            .withColumn("timestamp", F.unix_millis("timestamp")).orderBy("offset").collect())
    assert [r["offset"] for r in rows] == list(range(31))
    expected = [event(i) for i in range(30)] + [(BASE_MS + 30, None, {}, b"no key")]
    assert [as_row(r.asDict())[2:] for r in rows] == expected
    assert {(r["channel"], r["partition"]) for r in rows} == {("orders", 0)}


def test_bad_settings_are_refused_before_anything_runs(tmp_path: Path) -> None:
    config = make_channel(tmp_path, 5)
    for args, message in ((["--path", "%Q"], "unknown escape %Q"),
                          (["--roll-rows", "0"], "roll_rows"),
                          (["--roll-bytes", "10"], "roll_bytes"),
                          (["--format", "xml"], "invalid choice")):
        code, _, log = export(config, output_uri(tmp_path), *args)
        assert code == 2 and message in log, log
    code, _, log = export(ChannelConfig("x", [str(tmp_path / "d")], str(tmp_path / "none")),
                          output_uri(tmp_path))
    assert code == 2 and "no channel.json" in log
    assert untaken(config) == 5


# -- the columns written, per format (file_formats.py) ---------------------------------------
# (body, key, headers, timestamp): text (UTF-8, not ASCII), bytes that are not UTF-8, empty
MIXED = [(b'caf\xc3\xa9 {"n": 1}', b"k\xc3\xa9", {"h": b"v", "bin": b"\xff\x00"}, BASE_MS + 5),
         (b"\xff\xfe\x00raw", b"\x80", {}, BASE_MS + 1_006),
         (b"", None, {}, BASE_MS + 2_007)]
# each event as written: (timestamp ms, key, key_bytes, headers, headers_bytes, body,
# body_bytes)
WRITTEN = [(BASE_MS + 5, "k\u00e9", None, {"h": "v"}, {"bin": b"\xff\x00"},
            'caf\u00e9 {"n": 1}', None),
           (BASE_MS + 1_006, None, b"\x80", {}, None, None, b"\xff\xfe\x00raw"),
           (BASE_MS + 2_007, None, None, {}, None, "", None)]


def mixed_export(tmp_path: Path, spark: Any, file_format: str,
                 **settings: Any) -> list[str]:
    """Export MIXED in `file_format` into one file (file://); its URI."""
    config = make_channel(tmp_path, 0, partitions=1)
    with Channel.open(config) as channel, channel.put() as tx:
        for body, key, headers, timestamp in MIXED:
            tx.put(body, key=key, headers=headers or None, timestamp=timestamp)
    output = output_uri(tmp_path)
    report = export_here(spark, config, output, format=file_format, path="%Y", **settings)
    assert report["rows"] == 3
    return committed_files(spark, output)


def written(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row read back as in WRITTEN (timestamps as millis, maps as dicts or None)."""
    raw_headers = row["headers_bytes"]
    return (millis(row["timestamp"]), row["key"], row["key_bytes"], dict(pairs(row["headers"])),
            None if raw_headers is None else dict(pairs(raw_headers)), row["body"],
            row["body_bytes"])


def test_parquet_holds_text_as_strings_and_time_as_timestamp_millis(
        tmp_path: Path, spark: Any) -> None:
    import pyarrow as pa

    [uri] = mixed_export(tmp_path, spark, "parquet")
    parquet = pq.ParquetFile(local(uri))
    types = {field.name: field.type for field in parquet.schema_arrow}
    assert types["timestamp"] == pa.timestamp("ms", tz="UTC")
    assert [types[c] for c in ("key", "body", "key_bytes", "body_bytes")] == \
        [pa.string(), pa.string(), pa.binary(), pa.binary()]
    assert types["headers"] == pa.map_(pa.string(), pa.string())
    assert types["headers_bytes"] == pa.map_(pa.string(), pa.binary())
    columns = {parquet.metadata.schema.column(i).path: parquet.metadata.schema.column(i)
               for i in range(parquet.metadata.num_columns)}
    stamp = columns["timestamp"]
    assert stamp.physical_type == "INT64"
    assert "isAdjustedToUTC=true, timeUnit=milliseconds" in str(stamp.logical_type)
    assert str(columns["body"].logical_type) == "String"
    rows = sorted(parquet.read().to_pylist(), key=lambda r: r["offset"])
    assert [written(r) for r in rows] == WRITTEN


def test_json_lines_hold_text_as_text_and_only_other_bytes_as_base64(
        tmp_path: Path, spark: Any) -> None:
    [uri] = mixed_export(tmp_path, spark, "json")
    lines = [json.loads(line) for line in local(uri).read_text().splitlines()]
    lines.sort(key=lambda line: line["offset"])
    stamps = [datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
              + f"{ms % 1000:03d}Z" for ms, *_ in WRITTEN]
    assert [line["timestamp"] for line in lines] == stamps
    assert lines[0] == {"channel": "orders", "partition": 0, "offset": 0,
                        "timestamp": stamps[0], "key": "k\u00e9", "headers": {"h": "v"},
                        "headers_bytes": {"bin": "/wA="}, "body": 'caf\u00e9 {"n": 1}'}
    assert lines[1] == {"channel": "orders", "partition": 0, "offset": 1,
                        "timestamp": stamps[1], "key_bytes": "gA==", "headers": {},
                        "body_bytes": "//4AcmF3"}  # base64 of the bytes, no text column
    assert lines[2] == {"channel": "orders", "partition": 0, "offset": 2,
                        "timestamp": stamps[2], "headers": {}, "body": ""}


def test_avro_holds_text_as_strings_and_time_as_timestamp_millis(
        tmp_path: Path, spark: Any) -> None:
    from pyspark.sql.types import BinaryType, StringType, TimestampType

    [uri] = mixed_export(tmp_path, spark, "avro")
    schema = json.loads(avro_header(local(uri).read_bytes())["avro.schema"])
    fields = {field["name"]: field["type"] for field in schema["fields"]}
    assert fields["timestamp"] == {"type": "long", "logicalType": "timestamp-millis"}
    assert fields["key"] == fields["body"] == ["null", "string"]
    assert fields["key_bytes"] == fields["body_bytes"] == ["null", "bytes"]
    assert fields["headers"] == {"type": "map", "values": ["null", "string"]}
    frame = spark.read.format(FORMATS["avro"]).load(uri)
    types = {field.name: field.dataType for field in frame.schema}
    assert types["timestamp"] == TimestampType()
    assert (types["body"], types["body_bytes"]) == (StringType(), BinaryType())
    rows = frame.withColumn("timestamp", F.unix_millis("timestamp")).orderBy("offset")
    assert [written(r.asDict()) for r in rows.collect()] == WRITTEN


def test_a_piece_over_more_buckets_than_open_writers_makes_one_file_a_bucket(
        tmp_path: Path, spark: Any) -> None:
    # The write keeps up to max_open_files files open (write_progress.py), then sorts
    # the rest of its task's rows: each bucket still gets one file, named by its offsets.
    config = make_channel(tmp_path, 0, partitions=1)
    buckets = 48  # over every format's default max_open_files
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(buckets * 4):  # a bucket a second, visited again every `buckets`
            tx.put(f"e{i}".encode(), timestamp=BASE_MS + (i % buckets) * 1000)
    output = output_uri(tmp_path)
    report = export_here(spark, config, output, path="%Y/%H%M%S")
    assert report["rows"] == buckets * 4
    names = [relative(spark, output, uri) for uri in committed_files(spark, output)]
    assert len(names) == buckets and len({n.rsplit("/", 1)[1] for n in names}) == buckets
    assert sorted(as_put(exported(spark, output))) == sorted(
        (BASE_MS + (i % buckets) * 1000, None, {}, f"e{i}".encode()) for i in range(buckets * 4))
    for uri in committed_files(spark, output):
        match = NAME.fullmatch(uri.rsplit("/", 1)[1])
        assert match, uri
        offsets = sorted(r["offset"] for r in file_rows(spark, uri))
        assert (offsets[0], offsets[-1], len(offsets)) == (int(match["first"]),
                                                            int(match["last"]), 4)


# -- schema version 1: the layout of the exports from before the versions ----------------------
# each MIXED event as version 1 writes it: (timestamp ms, key, headers, body), all bytes
WRITTEN_V1 = [(timestamp, key, headers, body) for body, key, headers, timestamp in MIXED]


def records(output: str) -> list[dict[str, Any]]:
    """The commit records of a file:// output, oldest first."""
    return [json.loads(path.read_text())
            for path in sorted((local(output) / "orders" / "_weir" / "commits").glob("*.json"))]


def rewrite(path: Path, record: dict[str, Any]) -> None:
    """Replace a file:// commit record as a hand (or an older Weir) would: without the
    .crc sidecar of Hadoop's local filesystem, which would then not match."""
    path.write_text(json.dumps(record))
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def test_schema_version_1_parquet_holds_bytes_and_time_as_a_long(
        tmp_path: Path, spark: Any) -> None:
    import pyarrow as pa

    [uri] = mixed_export(tmp_path, spark, "parquet", schema_version=1)
    parquet = pq.ParquetFile(local(uri))
    types = {field.name: field.type for field in parquet.schema_arrow}
    assert set(types) == {"channel", "partition", "offset", "timestamp", "key", "headers",
                          "body"}
    assert (types["timestamp"], types["key"], types["body"]) == \
        (pa.int64(), pa.binary(), pa.binary())
    assert types["headers"] == pa.map_(pa.string(), pa.binary())
    column = next(parquet.metadata.schema.column(i) for i in
                  range(parquet.metadata.num_columns)
                  if parquet.metadata.schema.column(i).path == "timestamp")
    assert column.physical_type == "INT64" and column.logical_type.type == "NONE"
    rows = sorted(parquet.read().to_pylist(), key=lambda r: r["offset"])
    assert [(r["timestamp"], r["key"], dict(r["headers"]), r["body"]) for r in rows] == \
        WRITTEN_V1
    assert [r["schema_version"] for r in records(output_uri(tmp_path))] == [1]


def test_schema_version_1_json_lines_hold_base64_and_time_as_a_number(
        tmp_path: Path, spark: Any) -> None:
    import base64

    [uri] = mixed_export(tmp_path, spark, "json", schema_version=1)
    lines = sorted((json.loads(line) for line in local(uri).read_text().splitlines()),
                   key=lambda line: line["offset"])
    assert lines[0] == {"channel": "orders", "partition": 0, "offset": 0,
                        "timestamp": BASE_MS + 5, "key": base64.b64encode(b"k\xc3\xa9").decode(),
                        "headers": {"h": "dg==", "bin": "/wA="},
                        "body": base64.b64encode('caf\u00e9 {"n": 1}'.encode()).decode()}
    assert [(line["timestamp"], line.get("key"), line["body"]) for line in lines[1:]] == [
        (BASE_MS + 1_006, "gA==", "//4AcmF3"), (BASE_MS + 2_007, None, "")]


def test_schema_version_1_avro_holds_bytes_in_the_old_schema(
        tmp_path: Path, spark: Any) -> None:
    from pyspark.sql.types import BinaryType

    [uri] = mixed_export(tmp_path, spark, "avro", schema_version=1)
    schema = json.loads(avro_header(local(uri).read_bytes())["avro.schema"])
    assert schema["fields"] == AVRO_SCHEMA_V1["fields"]
    frame = spark.read.format(FORMATS["avro"]).load(uri)
    assert {f.name: f.dataType for f in frame.schema}["body"] == BinaryType()
    rows = frame.withColumn("timestamp", F.unix_millis("timestamp")).orderBy("offset")
    assert [(r["timestamp"], r["key"], dict(r["headers"]), r["body"])
            for r in rows.collect()] == WRITTEN_V1


def test_a_run_told_no_version_keeps_the_version_of_the_outputs_records(
        tmp_path: Path, spark: Any) -> None:
    # An output whose only record is from before the versions (no schema_version): its
    # files are version 1, and a job run again by hand after the upgrade keeps that.
    config = make_channel(tmp_path, 10, partitions=1)
    output = output_uri(tmp_path)
    assert export_here(spark, config, output, schema_version=1)["schema_version"] == 1
    [path] = (local(output) / "orders" / "_weir" / "commits").glob("*.json")
    old = json.loads(path.read_text())
    del old["schema_version"]
    rewrite(path, old)
    with Channel.open(config) as channel:
        put_events(channel, 10, 20)
    report = export_here(spark, config, output)
    assert report["rows"] == 10 and report["schema_version"] == 1
    assert [r.get("schema_version") for r in records(output)] == [None, 1]
    new = next(u for u in committed_files(spark, output) if "+00000000000000000010+" in u)
    assert pq.read_schema(local(new)).field("body").type == "binary"
    # a new output gets the readable layout, and its record says so
    fresh = (tmp_path / "fresh").as_uri()
    other = make_channel(tmp_path / "other", 5, partitions=1)
    assert export_here(spark, other, fresh)["schema_version"] == 2
    assert [r["schema_version"] for r in records(fresh)] == [2]


def test_a_channel_made_again_under_its_name_keeps_the_folders_version(
        tmp_path: Path, spark: Any) -> None:
    # Its files go to the same folders as the deleted one's: a job told no version writes
    # theirs, though none of the records left is of the new channel
    import shutil

    config = make_channel(tmp_path, 10, partitions=1)
    output = output_uri(tmp_path)
    assert export_here(spark, config, output, schema_version=1)["rows"] == 10
    shutil.rmtree(tmp_path / "home")
    shutil.rmtree(tmp_path / "data")
    config = make_channel(tmp_path, 10, partitions=1)
    report = export_here(spark, config, output)
    assert (report["rows"], report["schema_version"]) == (10, 1)


def test_a_commit_record_of_an_unknown_schema_version_stops_the_run(
        tmp_path: Path, spark: Any) -> None:
    config = make_channel(tmp_path, 10, partitions=1)
    output = output_uri(tmp_path)
    export_here(spark, config, output)
    [path] = (local(output) / "orders" / "_weir" / "commits").glob("*.json")
    rewrite(path, {**json.loads(path.read_text()), "schema_version": 3})
    with Channel.open(config) as channel:
        put_events(channel, 10, 20)
    with pytest.raises(ExportError, match="schema_version must be one of 1, 2, not 3"):
        export_here(spark, config, output)
    assert untaken(config) == 10


# -- never two schema versions in one folder (exporter.py step 1, path_overlap.py) -------------
def refused(spark: Any, config: ChannelConfig, output: str, **settings: Any) -> str:
    """The message of the ExportError a run with `settings` stops with."""
    with pytest.raises(ExportError) as raised:
        export_here(spark, config, output, **settings)
    return str(raised.value)


def test_a_run_never_writes_a_version_into_folders_holding_another(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_records, "COMPACT_AFTER", 0)  # each run that goes compacts
    config = make_channel(tmp_path, 30, partitions=1)
    output = output_uri(tmp_path)
    assert export_here(spark, config, output, schema_version=1)["rows"] == 30
    assert [r["path"] for r in records(output)] == ["%Y/%m/%d/%H"]  # as it was told
    with Channel.open(config) as channel:
        put_events(channel, 30, 40)
    before = records(output)
    # the same folder, one below it, one above it: refused, nothing taken or written
    for path in ("%Y/%m/%d/%H/", "%Y/%m/%d/%H/v2", "%Y/%m"):
        message = refused(spark, config, output, schema_version=2, path=path)
        assert f"the folders of export path '{path.rstrip('/')}' under " \
            f"{Dfs(spark, output).join('orders')}" in message, message
        assert "version 1 under '%Y/%m/%d/%H'" in message, message
        assert "told to write version 2" in message and "change the export path to one of " \
            "its own (say 'v2/" in message and "or the schema version to 1" in message
        assert untaken(config) == 10 and records(output) == before  # nor compacted
    # the job run by hand says so in its report line and exits 1
    code, report, log = export(config, output, "--schema-version", "2")
    assert code == 1 and report is not None, log
    assert report["error"].startswith("export of channel 'orders': the folders "
                                      "of export path '%Y/%m/%d/%H'"), report
    assert report["run"]["outcome"] == "failed" and report["run"]["rows"] == 0
    assert untaken(config) == 10 and records(output) == before
    # a path of its own goes; its run compacts the version 1 record into a summary
    report = export_here(spark, config, output, schema_version=2, path="v2/%Y/%m/%d/%H")
    assert report["rows"] == 10
    record, summary = records(output)  # of one run: its record sorts first
    assert summary["paths"] == {"%Y/%m/%d/%H": [1]} and "path" not in summary
    assert (record["path"], record["schema_version"]) == ("v2/%Y/%m/%d/%H", 2)
    # the compacted output keeps refusing, by the summary's paths and by the new record
    with Channel.open(config) as channel:
        put_events(channel, 40, 50)
    assert "version 1 under '%Y/%m/%d/%H'" in refused(
        spark, config, output, schema_version=2, path="%Y/%m/%d")
    assert "version 2 under 'v2/%Y/%m/%d/%H'" in refused(
        spark, config, output, schema_version=1, path="v2/%Y")
    assert untaken(config) == 10 and records(output) == [record, summary]
    # a run told no version writes the one its folders hold (step 1 alone, which then
    # compacts nothing: below COMPACT_AFTER records again)
    monkeypatch.setattr(commit_records, "COMPACT_AFTER", 32)
    for path, version in (("%Y/%m/%d", 1), ("v2/%Y", 2)):
        told_none = Exporter(spark, ExportSettings(str(config.home), output, path=path))
        told_none.channel_id = channel_id(config.home)
        told_none.recover()
        assert told_none.schema_version == version, path
    assert records(output) == [record, summary]


GOLDEN = ROOT / "tests" / "spark" / "golden" / "export-files"


def test_records_from_before_the_paths_refuse_by_their_files_folders_and_version(
        tmp_path: Path, spark: Any) -> None:
    # a record written before the paths (nor versions): its files' folders hold what the
    # files say (file_schema.py); a summary from then, what the output's folders hold
    import shutil

    # its log reaches past the records' ranges (a log ending below them is refused:
    # incarnations.py)
    config = make_channel(tmp_path, 1012, partitions=1)
    output = output_uri(tmp_path)
    name = f"orders+0+{0:020d}+{1:020d}.parquet"
    hour = local(output) / "orders" / "2026" / "11" / "27" / "14"
    hour.mkdir(parents=True)
    shutil.copyfile(GOLDEN / "v1.parquet", hour / name)
    commits = local(output) / "orders" / "_weir" / "commits"
    commits.mkdir(parents=True)
    legacy = {"run_id": "1795788300000-1a2b3c4d", "ranges": {"0": [[1000, 1002]]},
              "moves": [[f"{output}/orders/_weir/tmp/x/{name}",
                         f"{output}/orders/2026/11/27/14/{name}"]]}  # as Weir names them
    (commits / "1795788300000-1a2b3c4d.json").write_text(json.dumps(legacy))
    message = refused(spark, config, output, schema_version=2)
    assert "version 1 under '2026/11/27/14'" in message, message
    assert untaken(config) == 1012
    # folders apart go (step 1 alone here: a whole run with Spark is the test above)
    exporter_ = Exporter(spark, ExportSettings(str(config.home), output, schema_version=2,
                                               path="v2/%Y/%m/%d/%H"))
    assert exporter_.recover() == {0: [(1000, 1002)]}
    # a summary from before the paths that folded version 1 and version 2 files (compacted
    # after the switch, so naming version 2 only): what it holds is listed, and the version
    # 1 files' folder refuses version 2 (another output of the channel's)
    other = tmp_path / "other"
    (other / "orders" / "v2" / "2026" / "11" / "27" / "15").mkdir(parents=True)
    shutil.copytree(local(output) / "orders" / "2026", other / "orders" / "2026")
    shutil.copyfile(GOLDEN / "v2.parquet", other / "orders" / "v2" / "2026" / "11" / "27"
                    / "15" / name)
    (other / "orders" / "_weir" / "commits").mkdir(parents=True)
    folded = other / "orders" / "_weir" / "commits" / "1795788300001-1a2b3c4d.summary.json"
    folded.write_text(json.dumps({"run_id": "1795788300001-1a2b3c4d", "moves": [],
                                  "ranges": {"0": [[1000, 1002]]}, "schema_version": 2}))
    message = refused(spark, config, other.as_uri(), schema_version=2)
    assert "version 1 under '2026/11/27/14'" in message, message
    assert untaken(config) == 1012 and records(other.as_uri()) == [json.loads(folded.read_text())]
    # the README's way to version 2 (v1 under %Y/%m/%d/%H, then v2 under v2/%Y/%m/%d/%H)
    # with a summary from before the paths, compacted before the switch: version 2 goes
    # under v2/ (the summary does not count everywhere), and the run stores what the
    # listing found in a summary of its own, which refuses version 2 by the v1 folder
    (commits / "1795788300000-1a2b3c4d.json").unlink()  # folded into the summary
    (commits / "1795788300001-1a2b3c4d.summary.json").write_text(json.dumps(
        {"run_id": "1795788300001-1a2b3c4d", "moves": [], "ranges": {"0": [[1000, 1002]]},
         "schema_version": 1}))
    assert export_here(spark, config, output, schema_version=2,
                       path="v2/%Y/%m/%d/%H")["rows"] == 1010
    record, summary = records(output)  # by name: the same run id
    assert summary["paths"] == {"2026/11/27/14": [1]} and record["path"] == "v2/%Y/%m/%d/%H"
    assert summary["ranges"] == {"0": [[1000, 1002]]}
    assert "version 1 under '2026/11/27/14'" in refused(spark, config, output, schema_version=2)
    # a run told no version, under folders apart, writes the newest record's: the run's
    # (version 2), not its summary's, which sorts before it (written before it)
    told_none = Exporter(spark, ExportSettings(str(config.home), output, path="x/%Y"))
    told_none.channel_id = channel_id(config.home)
    told_none.recover()
    assert told_none.schema_version == 2 and records(output) == [record, summary]


def test_a_refusal_advises_only_changes_that_would_go(tmp_path: Path, spark: Any) -> None:
    # step 1 alone (recover): the records say what each path holds
    config = make_channel(tmp_path, 0, partitions=1)
    output = output_uri(tmp_path)
    commits = local(output) / "orders" / "_weir" / "commits"
    commits.mkdir(parents=True)
    (commits / "1795788300000-1a2b3c4d.summary.json").write_text(json.dumps(
        commit_records.commit_record("1795788300000-1a2b3c4d", "", [], {}, 2,
                                     incarnations={}, paths={
            "%Y/%m/%d/%H": [1, 2], "v2/%Y/%m/%d/%H": [1], "v1/%Y": [2], "v1/x/%Y": [1],
            **{f"w/%Y/{name}": [1] for name in "abcd"}})))

    def advice(version: int, path: str) -> str:
        told = Exporter(spark, ExportSettings(str(config.home), output, path=path,
                                              schema_version=version))
        with pytest.raises(ExportError) as raised:
            told.recover()
        message = str(raised.value)
        assert f"the folders of export path '{folder(path)}' under" in message, message
        return message.partition("To export, ")[2]

    crashed = local(output) / "orders" / "_weir" / "tmp" / "1795788200000-deadbeef" / "_p=0"
    crashed.mkdir(parents=True)
    (crashed / "part-00000.parquet").write_bytes(b"cut short")
    # the folders hold both versions: another version would mix them too; and v2/ holds
    # version 1, so there is no path of its own to suggest there
    assert advice(2, "%Y/%m/%d/%H").startswith(
        "change the export path to folders apart from those; nothing")
    assert not (local(output) / "orders" / "_weir" / "tmp").exists()  # a crashed run's
    # one other version: a path of its own (checked), or that version; "and N more"
    told = Exporter(spark, ExportSettings(str(config.home), output, path="w/%Y/./",
                                          schema_version=2))
    with pytest.raises(ExportError, match=re.escape(
            "version 1 under 'w/%Y/a', 'w/%Y/b', 'w/%Y/c' and 1 more: the commit records in")):
        told.recover()
    assert advice(2, "w/%Y/./").startswith(
        "change the export path to one of its own (say 'v2/w/%Y'), or the schema version to "
        "1; nothing")
    # a path under a version's folder gets the told version's instead, never v2/v1/...
    assert advice(2, "v1/x/%Y/%m").startswith(
        "change the export path to one of its own (say 'v2/x/%Y/%m'), or the schema")
    # ... when that one holds no other version (v1/%Y holds version 2 here)
    assert advice(1, "v1/%Y/%m").startswith(
        "change the export path to folders apart from those, or the schema version to 2")


# -- open files per task (file_formats.MAX_OPEN_FILES, write_progress.write_conf) ---------------
@contextmanager
def open_files_peak(spark: Any) -> Iterator[list[int]]:
    """The most data files of an export's temp dir the tests' JVM (local mode: its
    executors too) held open for writing at once while the block ran, looked at every
    2 ms ([peak]). (The read-back of the offsets opens them too, read-only.)"""
    proc = Path(f"/proc/{spark.sparkContext._gateway.proc.pid}")
    peak, done = [0], threading.Event()

    def writing(fd: Path) -> bool:
        try:
            target = os.readlink(fd)
            flags = (proc / "fdinfo" / fd.name).read_text().split("flags:")[1].split()[0]
        except (OSError, IndexError):
            return False  # closed meanwhile
        name = target.rsplit("/", 1)[-1]  # a socket or pipe has no "/"
        return "/_weir/tmp/" in target and name.startswith("part-") and \
            int(flags, 8) & (os.O_WRONLY | os.O_RDWR) != 0

    def watch() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], sum(map(writing, (proc / "fd").iterdir())))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield peak
    finally:
        done.set()
        watcher.join()


@pytest.mark.parametrize(("file_format", "cap"), [("parquet", None), ("json", 2),
                                                  ("avro", 1)])
def test_a_task_never_holds_more_files_open_than_max_open_files(
        tmp_path: Path, spark: Any, file_format: str, cap: int | None) -> None:
    # One piece (one task) over 24 buckets, the first met being the last in Spark's sort:
    # once its open writers are all taken it sorts the rest and writes them one file at a
    # time, while the writers it has not come to in that order stay open.
    config = make_channel(tmp_path, 0, partitions=1)
    buckets, per_bucket = 24, 2_000
    with Channel.open(config) as channel:
        for start in range(0, buckets * per_bucket, 1_000):
            with channel.put() as tx:
                for i in range(start, start + 1_000):
                    tx.put(b"x" * 100,
                           timestamp=BASE_MS + (buckets - 1 - i % buckets) * 1000)
    output = output_uri(tmp_path)
    with open_files_peak(spark) as peak:
        report = export_here(spark, config, output, format=file_format, path="%Y/%H%M%S",
                             max_open_files=cap)
    assert report["rows"] == buckets * per_bucket
    assert len(committed_files(spark, output)) == buckets  # still one file a bucket
    limit = cap or MAX_OPEN_FILES[file_format]
    assert 0 < peak[0] <= limit, (peak[0], limit)


def test_max_open_files_is_checked_before_anything_runs(tmp_path: Path) -> None:
    config = make_channel(tmp_path, 5)
    code, _, log = export(config, output_uri(tmp_path), "--max-open-files", "0")
    assert code == 2 and "max_open_files must be from 1 to 1024, not 0" in log, log
    assert untaken(config) == 5

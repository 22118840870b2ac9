"""The export job with real Spark (local mode) against file:// — or a real cluster when
WEIR_TEST_HDFS_URL is set (hdfs://host:8020/some/dir): every event reaches the output
exactly once, whatever step the job is killed at (SIGKILL) before a rerun."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from channel_engine import Channel, ChannelConfig
from channel_engine.spark.export import Exporter, ExportSettings

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000
BASE_MS = 1_795_000_000_000 - 1_795_000_000_000 % HOUR_MS  # on an hour boundary
NAME = re.compile(r"^(?P<channel>[a-z0-9_-]+)\+(?P<p>\d+)\+(?P<first>\d{20})\+(?P<last>\d{20})"
                  r"\.(parquet|json)$")


def output_uri(tmp_path: Path) -> str:
    remote = os.environ.get("WEIR_TEST_HDFS_URL")
    if remote:
        return f"{remote.rstrip('/')}/{uuid.uuid4().hex}"
    return (tmp_path / "out").as_uri()


def make_channel(tmp_path: Path, events: int, partitions: int = 3) -> ChannelConfig:
    config = ChannelConfig("orders", [str(tmp_path / "data")], str(tmp_path / "home"),
                           partitions=partitions, minimum_required_space=0)
    with Channel.open(config) as channel:
        for first in range(0, events, 50):
            with channel.put() as tx:
                for i in range(first, min(events, first + 50)):
                    key = None if i % 7 == 0 else f"k{i % 11}".encode()
                    headers = {"n": str(i).encode()} if i % 3 else None
                    tx.put(f"body-{i}".encode(), key=key, headers=headers,
                           timestamp=BASE_MS + (i % 3) * HOUR_MS + i)
    return config


def export(config: ChannelConfig, output: str, *args: str,
           crash_at: str | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run the job as spark-submit would, in its own process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("WEIR_EXPORT_CRASH_AT", None)
    if crash_at:
        env["WEIR_EXPORT_CRASH_AT"] = crash_at
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


def committed_files(output: str) -> list[str]:
    """Every committed data file of the channel (local output only)."""
    root = Path(output.removeprefix("file://")) / "orders"
    return sorted(str(p) for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts))


def rows_by_pyarrow(output: str) -> list[tuple[Any, ...]]:
    rows = []
    for path in committed_files(output):
        table = pq.read_table(path)
        for row in table.to_pylist():
            rows.append((row["partition"], row["offset"], row["timestamp"], row["key"],
                         dict(row["headers"] or []), row["body"]))
    return sorted(rows)


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


@pytest.mark.skipif(bool(os.environ.get("WEIR_TEST_HDFS_URL")), reason="reads files locally")
def test_an_export_writes_every_event_once_in_files_named_by_range(
        tmp_path: Path, spark: Any) -> None:
    config = make_channel(tmp_path, 600)
    output = output_uri(tmp_path)
    report = export_here(spark, config, output, roll_rows=100)
    assert report["rows"] == 600
    assert any(line.startswith("export orders: writing 600 events") for line in report["log"])
    assert rows_by_pyarrow(output) == stored(config)
    by_spark = spark.read.parquet(*committed_files(output))
    assert by_spark.count() == 600
    assert sorted(r["body"] for r in by_spark.select("body").collect()) == \
        sorted(e[5] for e in stored(config))
    for path in committed_files(output):
        relative = Path(path).relative_to(Path(output.removeprefix("file://")) / "orders")
        hour = re.fullmatch(r"(\d{4})/(\d{2})/(\d{2})/(\d{2})", str(relative.parent))
        match = NAME.fullmatch(relative.name)
        assert hour and match, relative
        first, last = int(match["first"]), int(match["last"])
        assert last - first < 100 and first // 100 == last // 100  # rolled every 100 rows
        table = pq.read_table(path).to_pylist()
        assert {r["partition"] for r in table} == {int(match["p"])}
        assert all(first <= r["offset"] <= last for r in table)
    assert untaken(config) == 0
    assert export_here(spark, config, output)["rows"] == 0  # nothing new: nothing written
    assert rows_by_pyarrow(output) == stored(config)


@pytest.mark.skipif(bool(os.environ.get("WEIR_TEST_HDFS_URL")), reason="reads files locally")
@pytest.mark.parametrize("step", ["reserved", "writing", "written", "recorded", "moved"])
def test_a_job_killed_at_any_step_then_rerun_exports_each_event_exactly_once(
        tmp_path: Path, step: str) -> None:
    config = make_channel(tmp_path, 300)
    output = output_uri(tmp_path)
    code, _, log = export(config, output, "--roll-rows", "50", crash_at=step)
    assert code == -9, log  # SIGKILL at that step
    code, report, log = export(config, output, "--roll-rows", "50")
    assert code == 0, log
    assert rows_by_pyarrow(output) == stored(config)  # nothing missing, nothing twice
    assert untaken(config) == 0
    tmp_left = list((Path(output.removeprefix("file://")) / "orders" / "_weir").glob("tmp/*"))
    assert tmp_left == []
    if step in ("recorded", "moved"):  # the first run's commit record holds the events
        assert report["report"]["rows"] == 0
        assert sum(len(p["skipped"]) for p in report["report"]["partitions"]) > 0


def test_an_empty_channel_writes_nothing(tmp_path: Path, spark: Any) -> None:
    config = make_channel(tmp_path, 0)
    output = output_uri(tmp_path)
    report = export_here(spark, config, output)
    assert report["rows"] == 0 and report["partitions"] == []
    if output.startswith("file://"):
        assert committed_files(output) == []


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


@pytest.mark.skipif(bool(os.environ.get("WEIR_TEST_HDFS_URL")), reason="reads files locally")
def test_json_lines_and_avro_output(tmp_path: Path, spark: Any) -> None:
    import fastavro

    config = make_channel(tmp_path, 30, partitions=1)
    output = output_uri(tmp_path)
    export_here(spark, config, output, format="json", path="day=%Y-%m-%d")
    lines = [json.loads(line) for path in committed_files(output)
             for line in Path(path).read_text().splitlines()]
    assert sorted(line["offset"] for line in lines) == list(range(30))
    assert all(Path(p).parent.name.startswith("day=") for p in committed_files(output))
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(30, 50):
            tx.put(f"body-{i}".encode(), key=b"k", timestamp=BASE_MS + i)
    export_here(spark, config, output, format="avro", path="avro/%Y")
    records = []
    for path in committed_files(output):
        if path.endswith(".avro"):
            with open(path, "rb") as f:
                records += list(fastavro.reader(f))
    assert sorted(r["offset"] for r in records) == list(range(30, 50))
    assert {r["key"] for r in records} == {b"k"} and records[0]["body"].startswith(b"body-")


def test_bad_settings_are_refused_before_anything_runs(tmp_path: Path) -> None:
    config = make_channel(tmp_path, 5)
    for args, message in ((["--path", "%Q"], "unknown escape %Q"),
                          (["--roll-rows", "0"], "roll_rows"),
                          (["--format", "xml"], "invalid choice")):
        code, _, log = export(config, output_uri(tmp_path), *args)
        assert code == 2 and message in log, log
    code, _, log = export(ChannelConfig("x", [str(tmp_path / "d")], str(tmp_path / "none")),
                          output_uri(tmp_path))
    assert code == 2 and "no channel.json" in log
    assert untaken(config) == 5

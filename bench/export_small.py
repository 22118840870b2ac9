"""Benchmark: a small export end to end, cold (a fresh Spark process per run) and warm (the
export worker's warm driver, appliance/export_driver.py), and where a cold run's time goes
(issue 18's target: a small export of 2,000 events completes in <= 3 s end to end on a
warm appliance).

    .venv/bin/python bench/export_small.py [--events 2000] [--runs 5] [--master local[*]]

In a fresh appliance (a temp WEIR_VAR_DIR: SQLite, one channel; Redis at REDIS_URL, else a
private redis-server started for the run) it times, in this process, from the Celery task
called (appliance.tasks.export_channel run eagerly: the task's whole body, its TaskRun,
run_export, the ExportRun row) to its ExportRun row finished, each run exporting --events
new events of 200 B (Parquet, file:// under the var dir):

  cold                 WEIR_EXPORT_DRIVER off: each run a `python -m
                       channel_engine.spark.export` of its own (as before);
  warm, first          the first run with the driver on: it starts the driver;
  warm                 the runs after it, in the same driver;
  nothing new          the task on the drained channel (no Spark at all);

then the warm driver's memory, idle: resident and proportional (PSS: a page shared by n
processes counts 1/n in each; Spark's Python workers are forks sharing most pages) of the
driver's Python, its JVM and Spark's Python workers (every process under it), and where a
cold run's time goes, measured inside one process the way the job runs
(export.spark_session, then Exporter.run with each step timed), twice in one session: the
first run is what a fresh job pays, the second what the warm driver pays. The figures
are printed next to the target.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "spark"))

from common import make_bodies, private_redis  # noqa: E402
from process_helpers import children_by_parent  # noqa: E402

TARGET_S = 3.0


def fill(row: Any, events: int) -> None:
    """Put `events` new events of 200 B into the channel of `row`."""
    from appliance import channels
    from channel_engine import PendingEvent

    with channels.open_channel(row).put() as tx:
        tx.put_all([PendingEvent(b) for b in make_bodies(events, 200)])


def export_once(row: Any, events: int) -> float:
    """Seconds from the export task called to its ExportRun finished, for `events` new
    events; checks that the run exported exactly those."""
    from appliance import tasks
    from appliance.models import ExportRun

    fill(row, events)
    started = time.perf_counter()
    outcome = tasks.export_channel.apply(args=[row.name]).get()
    took = time.perf_counter() - started
    run = ExportRun.objects.latest("started_at")
    assert outcome == "ok" and run.outcome == "ok" and run.rows == events, (outcome, run)
    return took


def tree_memory(pid: int) -> list[tuple[str, int, float, float]]:
    """(name, pid, resident MB, proportional MB: shared pages split among their users) of
    process `pid` and of every process under it."""
    children = children_by_parent()
    todo, found = [pid], []
    while todo:
        current = todo.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()
            name = Path(f"/proc/{current}/comm").read_text().strip()
        except OSError:
            continue
        kb = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:]
              if line.split()[-1] == "kB"}
        found.append((name, current, kb["Rss"] / 1024, kb["Pss"] / 1024))
        todo += children.get(current, [])
    return found


def appliance_figures(var: Path, events: int, runs: int) -> dict[str, Any]:
    """The end-to-end figures (module doc) in a fresh appliance under `var`."""
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)  # every task logs a line: not the figures
    from django.core.management import call_command
    from django.test import override_settings

    from appliance import channels, export_driver, tasks
    from appliance.models import Channel

    call_command("migrate", verbosity=0)
    row = Channel.objects.create(name="small", data_dirs=[str(var / "channels/data")],
                                 checkpoint_dir=str(var / "channels/small"),
                                 minimum_required_space=0)
    channels.open_channel(row, new=True)
    figures: dict[str, Any] = {}
    with override_settings(WEIR_EXPORT_DRIVER=False):
        figures["cold"] = [export_once(row, events) for _ in range(runs)]
    with override_settings(WEIR_EXPORT_DRIVER=True):
        figures["warm, first (starts the driver)"] = [export_once(row, events)]
        figures["warm"] = [export_once(row, events) for _ in range(runs)]
        nothing = []
        for _ in range(runs * 4):
            started = time.perf_counter()
            assert tasks.export_channel.apply(args=[row.name]).get() == "nothing due"
            nothing.append(time.perf_counter() - started)
        figures["nothing new"] = nothing
        pid = export_driver.driver_pid()
        assert pid is not None
        time.sleep(5)  # idle: its Python workers' idle state, as between exports
        figures["memory"] = tree_memory(pid)
        export_driver.stop()
    channels.close_all()
    return figures


class Steps:
    """Seconds spent in each timed function, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Time every call of owner.name under `label`."""
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + \
                    time.perf_counter() - started

        setattr(owner, name, timed)


def breakdown(var: Path, events: int, master: str) -> list[tuple[str, list[float]]]:
    """Where an export's time goes: [(step, [first run in the session, second run])]."""
    from channel_engine import Channel, ChannelConfig, PendingEvent, TakeTransaction
    from channel_engine.spark import exporter as exporter_module
    from channel_engine.spark.commit_records import CommitRecords
    from channel_engine.spark.dfs import Dfs
    from channel_engine.spark.export_settings import ExportSettings

    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import pyspark.sql, channel_engine.spark.export"],
                   check=True)
    imports = time.perf_counter() - started
    steps = Steps()
    steps.wrap(exporter_module.Exporter, "recover", "1 recover (read the commit records)")
    steps.wrap(TakeTransaction, "reserve", "2 take (reserve)")
    steps.wrap(exporter_module.Exporter, "frame", "4 plan the weir source (frame)")
    steps.wrap(exporter_module, "write_files", "4 Spark's write")
    steps.wrap(exporter_module.Exporter, "_plan_moves", "5 read back the files' offsets")
    steps.wrap(Dfs, "sync_file", "5-6 fsync files and directories")
    steps.wrap(Dfs, "sync_dirs_up_to", "5-6 fsync files and directories")
    steps.wrap(CommitRecords, "commit", "5 write the commit record")
    steps.wrap(Dfs, "rename", "6 move the files")
    steps.wrap(TakeTransaction, "commit", "7 commit the take")
    config = ChannelConfig("steps", (str(var / "steps/data"),), str(var / "steps/home"),
                           minimum_required_space=0)
    settings = ExportSettings(str(var / "steps/home"), (var / "steps-out").as_uri(),
                              subscription="export")
    started = time.perf_counter()
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setMaster(master))
    jvm = time.perf_counter() - started
    from channel_engine.spark.export import spark_session

    started = time.perf_counter()
    spark = spark_session(master)
    session = time.perf_counter() - started
    rows: dict[str, list[float]] = {}
    for _ in range(2):
        with Channel.open(config) as channel, channel.put() as tx:
            tx.put_all([PendingEvent(b) for b in make_bodies(events, 200)])
        steps.seconds.clear()
        started = time.perf_counter()
        report = exporter_module.Exporter(spark.newSession(), settings,
                                          progress=lambda line: None).run()
        total = time.perf_counter() - started
        assert report["rows"] == events, report
        for label, seconds in steps.seconds.items():
            rows.setdefault(label, []).append(seconds)
        rows.setdefault("rest of the run (open the channel, the report, ...)", []).append(
            total - sum(steps.seconds.values()))
        rows.setdefault("Exporter.run in all", []).append(total)
    spark.stop()
    return [("Python start and imports (pyspark, the job)", [imports, 0.0]),
            ("the JVM's start (py4j gateway)", [jvm, 0.0]),
            ("the SparkSession (context, conf, the zip for executors)", [session, 0.0]),
            *sorted(rows.items(), key=lambda item: (item[0].startswith(("rest", "Export")),
                                                     item[0]))]


def show(figures: dict[str, Any], steps: list[tuple[str, list[float]]], events: int) -> None:
    """Print the figures next to the target."""
    print(f"\nexport of {events:,} events of 200 B, Celery task called -> ExportRun "
          f"finished (target: warm <= {TARGET_S:g} s)")
    print(f"{'case':<36}{'median s':>10}{'min s':>8}{'max s':>8}  runs")
    for case in ("cold", "warm, first (starts the driver)", "warm", "nothing new"):
        times = figures[case]
        print(f"{case:<36}{statistics.median(times):>10.3f}{min(times):>8.3f}"
              f"{max(times):>8.3f}  {len(times)}")
    warm = statistics.median(figures["warm"])
    print(f"warm median {warm:.2f} s: {'meets' if warm <= TARGET_S else 'misses'} the "
          f"{TARGET_S:g} s target; cold/warm {statistics.median(figures['cold']) / warm:.1f}x")
    memory = figures["memory"]
    print(f"warm driver idle: {sum(m[3] for m in memory):,.0f} MB proportional "
          f"({sum(m[2] for m in memory):,.0f} MB resident, shared pages counted in each) in "
          f"{len(memory)} processes:")
    for name, pid, rss, pss in memory:
        print(f"  {name:<16} pid {pid:<8} {rss:>8,.0f} MB resident {pss:>8,.0f} MB "
              "proportional")
    print("\nwhere the time goes (in one process; first run of a session = a fresh job, "
          "second = the warm driver)")
    print(f"{'step':<58}{'first s':>9}{'second s':>10}")
    for label, (first, second) in steps:
        print(f"{label:<58}{first:>9.3f}{second:>10.3f}")


def main() -> None:
    """Run both parts, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    var = Path(tempfile.mkdtemp(prefix="weir-bench-small-", dir="/var/tmp"))
    os.environ.update(WEIR_VAR_DIR=str(var), WEIR_DATA_ROOT=str(var / "channels"),
                      DJANGO_SETTINGS_MODULE="appliance.settings", WEIR_CHANNEL_WATCH_S="0",
                      WEIR_SPARK_MASTER=args.master)
    os.environ.pop("DATABASE_URL", None)
    server = private_redis()
    try:
        figures = appliance_figures(var, args.events, args.runs)
        steps = breakdown(var, args.events, args.master)
        show(figures, steps, args.events)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()

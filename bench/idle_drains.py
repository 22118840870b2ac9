"""Benchmark: what a scheduled drain costs when its channel has nothing new (issue 18's
target: a scheduled export with nothing new starts no Spark, under 100 ms).

    .venv/bin/python bench/idle_drains.py [--runs 20]

In a fresh appliance (a temp WEIR_VAR_DIR: SQLite, a channel of 1,000 events that the
export's and the Kafka sink's subscriptions have drained; Redis at REDIS_URL, else a
private redis-server started for the run) it times, in this process:

  export task, drained      appliance.tasks.export_channel run eagerly (the task's whole
                            body: channel lock, the subscription asked, the TaskRun
                            logic), --runs times: median and max;
  Kafka sink task, drained  appliance.tasks.kafka_sink_channel likewise (a sink configured
                            at an unreachable address: a run that did start its job would
                            fail, not end "nothing due");
  the job it spares         one start of the export's job on the drained channel
                            (`python -m channel_engine.spark.export`, WEIR_SPARK_MASTER: a JVM and a
                            Spark session that find nothing): what each idle run cost
                            before, measured in the same run.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import private_redis  # noqa: E402


def _timed(call, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        outcome = call()
        times.append((time.perf_counter() - started) * 1000)
        assert outcome == "nothing due", outcome  # TaskRun.NOTHING_DUE
    return times


def main() -> None:
    """Set up the drained channel, time the drains, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    var = Path(tempfile.mkdtemp(prefix="weir-bench-idle-"))
    os.environ.update(WEIR_VAR_DIR=str(var), WEIR_DATA_ROOT=str(var / "channels"),
                      DJANGO_SETTINGS_MODULE="appliance.settings", WEIR_CHANNEL_WATCH_S="0")
    os.environ.pop("DATABASE_URL", None)
    server = private_redis()
    try:
        import logging

        import django

        django.setup()
        logging.disable(logging.INFO)  # every task logs a line: not the figures
        from django.core.management import call_command

        from appliance import channels, exports, tasks
        from appliance.models import Channel

        call_command("migrate", verbosity=0)
        row = Channel.objects.create(name="idle", data_dirs=[str(var / "channels/data")],
                                     checkpoint_dir=str(var / "channels/idle"),
                                     minimum_required_space=0, kafka_topic="idle",
                                     kafka_bootstrap="127.0.0.1:9")
        channels.open_channel(row, new=True)  # its files, as manage_channels' create
        channel = channels.open_channel(row)
        with channel.put() as tx:
            for i in range(1_000):
                tx.put(b"x" * 200, key=str(i).encode())
        for subscription in ("export", "kafka"):  # as their last runs left them: drained
            channel.add_subscription(subscription, "latest")
        export_ms = _timed(lambda: tasks.export_channel.apply(args=["idle"]).get(), args.runs)
        sink_ms = _timed(lambda: tasks.kafka_sink_channel.apply(args=["idle"]).get(),
                         args.runs)
        channels.close_all()  # the job opens the channel itself
        argv = exports.command(row)  # WEIR_SPARK_MASTER, local by default
        started = time.perf_counter()
        job = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
        job_ms = (time.perf_counter() - started) * 1000
        print(f"{args.runs} runs each, a channel of 1,000 events, its drains' subscriptions "
              "drained")
        print(f"{'case':<36}{'median ms':>12}{'max ms':>12}")
        for name, times in (("export task, drained", export_ms),
                            ("Kafka sink task, drained", sink_ms)):
            print(f"{name:<36}{statistics.median(times):>12.1f}{max(times):>12.1f}")
        print(f"{'the job it spares (one start)':<36}{job_ms:>12.0f}{'':>12}  "
              f"(exit {job.returncode})")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()

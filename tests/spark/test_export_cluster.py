"""The export job on a Spark cluster of separate processes (the `spark_master` fixture: a
standalone master and worker from scripts/spark_cluster.sh, or WEIR_TEST_SPARK_MASTER).
The job runs as its own process with --master spark://…, so its executors are other JVMs
with their own Python workers, which import channel_engine from the zip the job ships
(package_zip): their PYTHONPATH and working directory hold no copy of the repository, and
every channel_engine file they open is that zip (recorded by an audit hook, below). Every
event reaches the output exactly once: when the executors read the channel's files, when
they read ranges over the appliance's HTTP API (its access log shows it served every
event), and when an executor JVM is SIGKILLed in
the middle of the write (Spark reruns its tasks on a new executor and the run completes, or it fails
cleanly and the next run completes)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spark_cluster import SparkCluster
from test_export import as_row, exported, make_channel, stored, untaken
from test_remote_read import appliance, consume_token, put_events  # noqa: F401 -- gunicorn

from channel_engine import Channel, ChannelConfig

ROOT = Path(__file__).resolve().parents[2]

# Put on the executors' PYTHONPATH (spark.executorEnv): every Python process records each
# file it opens whose path names channel_engine, with its working directory and PYTHONPATH.
SITECUSTOMIZE = """
import os, sys
_log = os.environ.get("WEIR_TEST_OPEN_LOG")
if _log:
    def _record(event, args, _busy=[]):
        if event != "open" or _busy or not isinstance(args[0], str):
            return
        if "channel_engine" not in args[0] and "channel-engine" not in args[0]:
            return
        _busy.append(1)
        try:
            line = "\\t".join([os.getcwd(), args[0], os.environ.get("PYTHONPATH", "")])
            fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, (line + "\\n").encode())
            os.close(fd)
        finally:
            _busy.pop()
    sys.addaudithook(_record)
"""


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The job's environment: the repo on the driver's PYTHONPATH only; this interpreter
    for the executors' Python workers, named as an operator would in spark-defaults.conf
    (spark.pyspark.python, not PYSPARK_PYTHON: PATH's python3 lacks pyarrow, so a job
    that ignored the setting fails); the audit hook on theirs."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           **extra,
           "PYSPARK_SUBMIT_ARGS": f"--conf spark.pyspark.python={sys.executable} "
                                  f"--conf spark.executorEnv.PYTHONPATH={hook} "
                                  f"--conf spark.executorEnv.WEIR_TEST_OPEN_LOG="
                                  f"{tmp_path / 'opened.log'} "
                                  f"{executor_java_options()}pyspark-shell"}
    env.pop("WEIR_EXPORT_CRASH_AT", None)
    env.pop("PYSPARK_PYTHON", None)  # the tests' session sets it for its own workers
    return env


def executor_java_options() -> str:
    """--conf for the executors' JVMs: the run's class-data-sharing archive (WEIR_SPARK_JAVA_OPTS,
    scripts/common.sh's use_spark_cds) when it has one; they start faster, nothing else."""
    options = os.environ.get("WEIR_SPARK_JAVA_OPTS")
    return f"--conf 'spark.executor.extraJavaOptions={options}' " if options else ""


def job(cluster: SparkCluster, home: Path | str, output: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "channel_engine.spark.export", "--home", str(home),
            "--output", output, "--master", cluster.url, *args]


def run(cluster: SparkCluster, home: Path | str, output: str, tmp_path: Path, *args: str,
        **env: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run the job on the cluster in its own process: (exit status, report, output)."""
    done = subprocess.run(job(cluster, home, output, *args), capture_output=True, text=True,
                          env=job_env(tmp_path, **env), timeout=300, cwd=tmp_path)
    return done.returncode, report_of(done.stdout), done.stdout + done.stderr


def report_of(stdout: str) -> dict[str, Any] | None:
    last = [line for line in stdout.splitlines() if line.startswith('{"report"')]
    return json.loads(last[-1]) if last else None


def committed(spark_or_none: Any, output: str) -> list[tuple[Any, ...]]:
    """The committed rows (pyarrow on file://; Spark and pyarrow elsewhere)."""
    if not output.startswith("file:"):
        return exported(spark_or_none, output)
    root = Path(output.removeprefix("file://")) / "orders"
    rows = [row for path in root.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in path.relative_to(root).parts)
            for row in pq.read_table(path).to_pylist()]
    return sorted(as_row(r) for r in rows)


def check_shipped(cluster: SparkCluster, tmp_path: Path) -> None:
    """The executors' Python workers opened channel_engine only from the shipped zip, with
    no repository on their PYTHONPATH or as their working directory."""
    if cluster.work_dir is None:
        return  # an outside cluster: its executors' files are not ours to read
    opened = [line.split("\t") for line in
              (tmp_path / "opened.log").read_text().splitlines()]
    on_executors = [(cwd, path, paths) for cwd, path, paths in opened
                    if Path(cwd).is_relative_to(cluster.work_dir)]
    assert on_executors, f"no executor's Python worker imported channel_engine: {opened}"
    for cwd, path, paths in on_executors:
        assert Path(path).name.startswith("weir-channel-engine-") and path.endswith(".zip"), \
            f"an executor opened {path}, not the shipped zip"
        # its own copy (fetched from the driver): the path is relative to its directory
        assert (Path(cwd) / path).resolve().is_relative_to(cluster.work_dir), (cwd, path)
        assert str(ROOT) not in paths.split(os.pathsep) and not Path(cwd).is_relative_to(ROOT)


# HDFS, the cluster's filesystem, by default; file:// (the executors on this host) in the
# slow run.
@pytest.mark.parametrize("output", [pytest.param("hdfs", marks=pytest.mark.hdfs),
                                    pytest.param("file", marks=pytest.mark.slow)],
                         indirect=True)
def test_it_exports_every_event_once_with_executors_in_their_own_jvms(
        spark_master: SparkCluster, output: str, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    config = make_channel(tmp_path, 900)
    began = time.monotonic()
    status, report, log = run(spark_master, config.home, output, tmp_path, "--roll-rows", "200")
    assert status == 0 and report and report["report"], log
    assert report["report"]["rows"] == 900
    assert report["report"]["spark_master"] == spark_master.url
    spark = None if output.startswith("file:") else request.getfixturevalue("spark")
    assert committed(spark, output) == stored(config)
    assert untaken(config) == 0
    check_shipped(spark_master, tmp_path)
    print(f"cluster start {spark_master.start_s} s; export {time.monotonic() - began:.1f} s")


def test_it_exports_every_event_once_with_executors_reading_over_http(
        spark_master: SparkCluster, appliance: tuple[str, dict[str, str], Path],  # noqa: F811
        tmp_path: Path) -> None:
    url, env, home = appliance
    put_events(home, 300, "remote")
    output = (tmp_path / "out").as_uri()
    # the appliance's data root is not the job's concern: it reads over HTTP
    status, report, log = run(spark_master, home, output, tmp_path, "--read-url", url,
                              "--roll-rows", "100",
                              **{**env, "WEIR_EXPORT_READ_TOKEN": consume_token(env)})
    assert status == 0 and report and report["report"], log
    assert report["report"]["rows"] == 300
    rows = committed(None, output)
    assert sorted(row[5] for row in rows) == sorted(f"remote-{i}".encode() for i in range(300))
    assert len({(row[0], row[1]) for row in rows}) == 300
    with Channel.open(ChannelConfig.load(home)) as channel:
        assert channel.status()["events_untaken"] == 0
        ends = [p["log_end_offset"] for p in channel.status()["partitions"]]
    assert served_over_http(tmp_path / "access.log", "orders", len(ends)) == \
        [set(range(end)) for end in ends]
    check_shipped(spark_master, tmp_path)


def served_over_http(access_log: Path, channel: str, partitions: int) -> list[set[int]]:
    """The offsets of each partition the appliance served in 200 answers to the batches
    endpoint, from its access log (test_remote_read.ACCESS_LOG_FORMAT)."""
    served: list[set[int]] = [set() for _ in range(partitions)]
    request = re.compile(rf'"GET /api/v1/channels/{channel}/partitions/([0-9]+)/batches\?'
                         r'[^ ]* HTTP/[0-9.]+" 200 ([0-9]+)-([0-9]+)$')
    for line in access_log.read_text().splitlines():
        if found := request.fullmatch(line):
            served[int(found[1])].update(range(int(found[2]), int(found[3])))
    return served


def executor_pids(work_dir: Path) -> dict[int, Path]:
    """The executor JVMs the worker runs, by pid: their working directories."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"CoarseGrainedExecutorBackend" not in (proc / "cmdline").read_bytes():
                continue
            cwd = (proc / "cwd").resolve()
        except OSError:
            continue
        if cwd.is_relative_to(work_dir):
            found[int(proc.name)] = cwd
    return found


def kill_an_executor_mid_write(work_dir: Path, job: subprocess.Popen[str],
                               before: set[int]) -> Path:
    """SIGKILL the job's executor JVM once it runs Python tasks; its working directory."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and job.poll() is None:
        for pid, cwd in executor_pids(work_dir).items():
            stderr = cwd / "stderr"
            if pid not in before and stderr.exists() \
                    and "Starting Python task execution" in stderr.read_text(errors="replace"):
                os.kill(pid, signal.SIGKILL)
                return cwd
        time.sleep(0.1)
    raise AssertionError(f"no executor ran a Python task (job exit status {job.poll()})")


def test_it_exports_every_event_once_when_an_executor_is_killed_mid_write(
        spark_master: SparkCluster, tmp_path: Path) -> None:
    if spark_master.work_dir is None:
        pytest.skip("WEIR_TEST_SPARK_MASTER: an outside cluster's executors are not ours "
                    "to kill")
    config = make_channel(tmp_path, 2000)
    output = (tmp_path / "out").as_uri()
    before = set(executor_pids(spark_master.work_dir))
    log = tmp_path / "killed.log"
    with log.open("w") as sink, subprocess.Popen(
            job(spark_master, config.home, output, "--roll-rows", "250"), stdout=sink,
            stderr=subprocess.STDOUT, text=True, env=job_env(tmp_path), cwd=tmp_path) as killed:
        try:
            executor = kill_an_executor_mid_write(spark_master.work_dir, killed, before)
            assert not list((tmp_path / "out" / "orders" / "_weir" / "commits").glob("*")), \
                "the write was over before the executor was killed"
            killed.wait(timeout=300)
        finally:
            if killed.poll() is None:
                killed.kill()
    out = log.read_text()
    report = report_of(out)
    executors = sorted(p.name for p in executor.parent.iterdir() if p.is_dir())
    if killed.returncode == 0:  # Spark reran the lost tasks on a new executor: complete
        assert report and report["report"]["rows"] == 2000, out
        assert len(executors) > 1, f"one executor only: {executors}"
    else:  # a clean failure, saying why; the next run completes the export
        assert killed.returncode == 1 and report and report["report"] is None, out
        status, rerun, again = run(spark_master, config.home, output, tmp_path)
        assert status == 0 and rerun and rerun["report"], again
    assert committed(None, output) == stored(config)
    assert untaken(config) == 0
    print(f"killed run: exit {killed.returncode}, executors {executors}")

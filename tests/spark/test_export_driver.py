"""The warm export driver (appliance/export_driver.py, channel_engine/spark/export_driver.py):
run_export hands the real job to a long-lived Spark driver, which keeps what a fresh
process guarantees: exact output, a killed job handled as today, a timeout, the lock
held by the driver while its job runs (and its Spark jobs), a new driver once its JVM
died, and no orphan once its parent is gone or it has been idle. Few drivers start: each
scenario's "the next export gets a new driver" is the next one's. The off switch:
tests/appliance/test_exports.py (no Spark)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.test import override_settings
from polling import wait_for
from process_helpers import children, comm
from pyspark.sql import SparkSession

from appliance import channels, export_driver, exports
from appliance.models import Channel, ExportRun
from channel_engine import Channel as EngineChannel
from channel_engine.spark import export as export_module
from channel_engine.spark import export_driver as export_driver_process

pytestmark = pytest.mark.django_db(transaction=True)  # the export's thread sees the rows
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def row(tmp_path: Path) -> Iterator[Channel]:
    """A channel of 20 events ("e0".."e19") exporting to file:// under tmp_path."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_SPARK_MASTER="local[1]",
                           WEIR_EXPORT_URI=(tmp_path / "export").as_uri(),
                           WEIR_EXPORT_READ_URL="", WEIR_EXPORT_DRIVER=True):
        row = Channel.objects.create(name="orders", data_dirs=[str(tmp_path / "data")],
                                     checkpoint_dir=str(tmp_path / "home"),
                                     minimum_required_space=0, export_path="%Y-%m-%d")
        EngineChannel.create(channels.to_config(row)).close()
        put(row, 0, 20)
        yield row
        export_driver.stop()
        channels.close_all()


def put(row: Channel, first: int, end: int) -> None:
    with channels.open_channel(row).put() as tx:
        for i in range(first, end):
            tx.put(f"e{i}".encode())


def bodies(*runs: ExportRun) -> list[str]:
    """The bodies in the files the runs committed, sorted."""
    files = [Path(f.removeprefix("file://")) for run in runs for p in run.partitions
             for f in p["files"]]
    return sorted(b for f in files for b in pq.read_table(f).column("body").to_pylist())


def expected(end: int) -> list[str]:
    return sorted(f"e{i}" for i in range(end))


def held_by(pid: int, path: Path) -> bool:
    """Whether process `pid` has a descriptor of `path` open."""
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def gone(pid: int, wait_s: float = 10) -> bool:
    """Whether no process of group `pid` lives any more, within `wait_s` (a killed JVM's
    new parent, init, reaps it a moment later)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def test_it_runs_exports_in_one_warm_driver_and_each_is_exact(row: Channel) -> None:
    """Two exports reuse one driver; its JVM killed while it waits, the next export gets a
    new driver; that one exits once idle. (The off switch: test_exports.py, no Spark.)"""
    with override_settings(WEIR_EXPORT_DRIVER_IDLE_S=4):  # reuse within 2 s, then idle
        first = exports.run_export(row)
        pid = export_driver.driver_pid()
        assert pid is not None
        folder = Path(export_driver._driver.folder)  # type: ignore[union-attr]
        assert folder.parent == Path(tempfile.gettempdir()) and \
            folder.name.startswith("weir-xd-") and folder.stat().st_mode & 0o777 == 0o700
        put(row, 20, 35)
        started = time.monotonic()
        second = exports.run_export(row)
        took = time.monotonic() - started
        assert export_driver.driver_pid() == pid  # the same driver, reused
        assert (first.outcome, first.rows, first.error) == ("ok", 20, "")
        assert (second.outcome, second.rows, second.progress) == ("ok", 15,
                                                                  "exported 15 events")
        assert took < first.duration_s, (took, first.duration_s)  # no JVM start this time
        # its JVM dies while it waits (the OOM killer): the next export gets a new driver
        os.kill(jvm_of(pid), signal.SIGKILL)
        put(row, 35, 40)
        third = exports.run_export(row)
        assert (third.outcome, third.rows, third.error) == ("ok", 5, "")
        fresh = export_driver.driver_pid()
        assert fresh not in (None, pid) and gone(pid) and not folder.exists()
        assert export_driver._driver is not None
        # idle for WEIR_EXPORT_DRIVER_IDLE_S: it exits by itself, its socket file gone
        assert export_driver._driver.process.wait(60) == 0
        assert not export_driver._driver.path.exists()
    assert bodies(first, second, third) == expected(40)  # each event exactly once
    subscription = channels.open_channel(row).status()["subscriptions"]["export"]
    assert subscription["events_untaken"] == 0


def test_a_job_leaves_neither_its_environment_nor_its_session_settings_behind(
        spark: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Each job: its own os.environ (the read token), put back after it; a new session
    (its SQL settings its own); a SystemExit or an uncaught exception its exit status."""
    seen: list[tuple[str | None, str]] = []

    def job(argv: list[str], sessions: Any) -> int:
        with sessions(spark.sparkContext.master) as session:
            assert SparkSession.getActiveSession() is session  # the job's, while it runs
            seen.append((os.environ.get(exports.TOKEN_ENV),
                         session.conf.get("spark.sql.shuffle.partitions")))
            session.conf.set("spark.sql.shuffle.partitions", "7")
            session.createDataFrame([(1,)], "n int")  # makes its session the active one
        if argv:
            raise SystemExit(2) if argv == ["exit"] else ValueError("the job broke")
        return 0

    monkeypatch.setattr(export_module, "main", job)
    driver = export_driver_process.Driver(spark, spark.sparkContext.master, pump=None)
    own = dict(os.environ)
    assert driver._job([], {**own, exports.TOKEN_ENV: "secret"}) == 0
    assert dict(os.environ) == own  # the token is gone with its job
    assert SparkSession.getActiveSession() is spark  # and its session
    assert driver._job([], own) == 0
    assert seen[0][0] == "secret" and seen[1][0] is None
    assert seen[1][1] == seen[0][1] != "7"  # the first job's setting stayed in its session
    assert driver._job(["exit"], own) == 2
    assert driver._job(["raise"], own) == 1
    assert "ValueError: the job broke" in capfd.readouterr().err  # its traceback, as fresh
    # the appliance keeps a driver per master
    with pytest.raises(ValueError, match="runs Spark on"), \
            driver.session("spark://elsewhere:7077"):
        pass


def test_a_jobs_spark_jobs_are_cancelled_and_ended_before_its_lock_is_let_go(
        spark: Any) -> None:
    """After a failed write Spark kills the stage's other tasks asynchronously: the driver
    cancels what still runs and waits for it before it closes the job's lock."""
    context = spark.sparkContext
    outcome: list[str] = []

    def straggler() -> None:
        try:
            context.parallelize(range(2), 2).foreach(lambda _: __import__("time").sleep(120))
            outcome.append("ran to its end")
        except Exception as exc:  # noqa: BLE001 -- its cancellation is the point
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=straggler)
    thread.start()
    wait_for(lambda: context.statusTracker().getActiveJobsIds(), 90, "a Spark job running")
    driver = export_driver_process.Driver(spark, context.master, pump=None)
    started = time.monotonic()
    assert driver.quiesce(60)
    assert time.monotonic() - started < 60 and context.statusTracker().getActiveJobsIds() == []
    thread.join(30)
    assert outcome and outcome != ["ran to its end"], outcome


def test_a_killed_driver_a_timeout_and_a_dead_jvm_each_end_their_job_alone(
        row: Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chained, each scenario's "the next export gets a new driver" the next one's driver:
    a job that kills its driver (kill -9) is a killed job; a job past its timeout is
    killed with its driver, which held the lock while the job ran; a job whose JVM dies
    fails and its driver is not used again; the last export has every event once."""
    monkeypatch.setenv("WEIR_EXPORT_CRASH_AT", "announced")  # SIGKILL once committed
    killed = exports.run_export(row)
    assert (killed.outcome, killed.rows, killed.error) == ("ok", 20, ""), killed.progress
    assert killed.progress.startswith("committed 20 events; its job then ended before its "
                                      "report (the export job exited with -9"), killed.progress
    assert export_driver.driver_pid() is None  # the driver died with its job
    monkeypatch.delenv("WEIR_EXPORT_CRASH_AT")  # never in a driver's own environment
    put(row, 20, 25)
    after = exports.run_export(row)
    pid = export_driver.driver_pid()
    assert pid is not None
    assert (after.outcome, after.rows) == ("ok", 5)
    # the killed job's take came back: its commit record skips it
    assert [(p["ranges"], p["skipped"]) for p in after.partitions] == [([[20, 25]],
                                                                        [[0, 20]])]
    assert bodies(killed, after) == expected(25)  # the killed run's moves finished

    put(row, 25, 35)
    monkeypatch.setenv("WEIR_EXPORT_STOP_AT", "reserved")  # SIGSTOP to the driver's group
    timed_out = timeout_while_held(row, pid)
    assert timed_out.outcome == "failed"
    assert timed_out.error == "the export job ran longer than 8 s and was killed"
    assert gone(pid) and export_driver.driver_pid() is None

    failed = jvm_dies_in_job(row)  # a new driver, the job stopped at "reserved" again
    assert failed.outcome == "failed" and failed.rows == 0, failed.error
    monkeypatch.delenv("WEIR_EXPORT_STOP_AT")
    last = exports.run_export(row)
    assert (last.outcome, last.rows) == ("ok", 10) and export_driver.driver_pid() is not None
    assert bodies(*ExportRun.objects.filter(outcome="ok")) == expected(35)


def timeout_while_held(row: Channel, pid: int) -> ExportRun:
    """A run of 8 s timeout in driver `pid`, which stops itself: while it is stopped the
    driver holds export-run.lock (another run is busy); the run, once timed out."""
    lock = Path(row.checkpoint_dir) / exports.LOCK_FILE
    result: list[ExportRun] = []
    thread = threading.Thread(target=lambda: result.append(exports.run_export(row,
                                                                              timeout_s=8)))
    thread.start()
    try:
        wait_for(lambda: held_by(pid, lock), 8, f"the driver (pid {pid}) holds {lock}")
        with pytest.raises(exports.ExportBusy):
            exports.run_export(row)
    finally:
        thread.join(30)
    [timed_out] = result
    return timed_out


def jvm_dies_in_job(row: Channel) -> ExportRun:
    """A run whose driver's JVM is killed (as the OOM killer would) while its job is
    stopped mid-run; the run, once its driver has exited."""
    result: list[ExportRun] = []
    thread = threading.Thread(target=lambda: result.append(exports.run_export(row)))
    thread.start()
    try:
        pid = wait_for(export_driver.driver_pid, 90, "a driver started")
        lock = Path(row.checkpoint_dir) / exports.LOCK_FILE
        wait_for(lambda: held_by(pid, lock), 90, "the job started")
        jvm = jvm_of(pid)
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
                 == "T", 90, "the job stopped")
        os.kill(jvm, signal.SIGKILL)
        os.killpg(pid, signal.SIGCONT)
    finally:
        thread.join(60)
    # it exits once it has told the job's end: never handed another job
    wait_for(lambda: export_driver.driver_pid() is None, 90, "the driver exited")
    assert gone(pid)
    [failed] = result
    return failed


def jvm_of(pid: int) -> int:
    """The pid of driver `pid`'s JVM, once it runs."""
    [jvm] = wait_for(lambda: [p for p in children(pid) if comm(p) == "java"] or None,
                     90, f"the JVM of {pid}")
    return int(jvm)


def test_the_driver_exits_when_its_parent_dies(tmp_path: Path) -> None:
    parent = subprocess.Popen(  # a worker that starts a driver, then is killed
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "driver = subprocess.Popen(sys.argv[1:] + ['--parent', str(__import__('os')"
         ".getpid())], start_new_session=True)\nprint(driver.pid, flush=True)\n"
         "time.sleep(600)\n", sys.executable, "-m", export_driver.DRIVER, "--socket",
         str(tmp_path / "orphan.sock"), "--master", "local[1]"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    orphan = int(parent.stdout.readline())
    try:
        jvm_of(orphan)  # its session on the way
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert gone(orphan), "the driver (and its JVM) outlived its parent"
        assert not (tmp_path / "orphan.sock").exists()
    finally:
        if not gone(orphan, 0):
            os.killpg(orphan, signal.SIGKILL)


def test_a_driver_never_takes_over_a_socket_path_in_use(tmp_path: Path) -> None:
    """Two drivers given one path (the var volume a compose file's containers share, each
    with its own pids): the second exits at once, the first's socket still its own."""
    path = tmp_path / "driver.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
        first.bind(str(path))
        first.listen(1)
        second = subprocess.run(
            [sys.executable, "-m", export_driver.DRIVER, "--socket", str(path), "--master",
             "local[1]", "--parent", str(os.getpid())], cwd=ROOT, timeout=60,
            capture_output=True, text=True, start_new_session=True)
        assert second.returncode == 2, second.stderr
        assert "cannot listen on" in second.stderr
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the first's
            conn, _ = first.accept()
            conn.close()

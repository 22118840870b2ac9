"""Exports from the appliance: one export of a channel at a time, however it is triggered
(two Celery triggers at once, a Celery trigger during manage.py export_channel), no
ExportRun left "running" by a dead process, the job's own export.lock across processes,
and remote reads with a per-run, channel-scoped consume token revoked after the run.

The Spark job is replaced at the subprocess boundary (exports.command) by a small Python
script that records how it was started, sleeps, and prints a valid report line: the real
job needs Spark (tests/spark/test_export_command.py runs it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, problem
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone
from polling import wait_for
from rest_framework.test import APIClient

from appliance import channels, export_driver, exports, tasks
from appliance.env import env_http_url
from appliance.models import ApiToken, Channel, ExportRun, TaskRun, hash_key
from channel_engine.errors import ExportRunningError
from channel_engine.spark.export_lock import EXIT_BUSY, hold

pytestmark = pytest.mark.django_db(transaction=True)  # the worker's threads see the rows
ROOT = Path(__file__).resolve().parents[2]

# argv: seconds to sleep, file to append this start to, then the real job's command line
FAKE_JOB = """
import json, os, sys, time
with open(sys.argv[2], "a") as record:
    record.write(json.dumps({"argv": sys.argv[3:],
                             "token": os.environ.get("WEIR_EXPORT_READ_TOKEN"),
                             "pid": os.getpid()}) + "\\n")
print("export 5/10 events", flush=True)
time.sleep(float(sys.argv[1]))
print(json.dumps({"report": {"run_id": "fake-run", "output": "file:///fake/orders",
                             "rows": 10, "bytes": 100, "partitions": []}}), flush=True)
"""
# Holds a lock file (flock) until killed: another process's export.
HOLDER = """
import sys, time
from channel_engine.spark.export_lock import hold
with hold(sys.argv[1], "orders"):
    print("held", flush=True)
    time.sleep(120)
"""
HOLD_FILE = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture()
def root(tmp_path: Path) -> Iterator[Path]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_EXPORT_READ_URL=""):
        yield tmp_path
    channels.close_all()


class FakeJob:
    """The fake job's settings and what its starts recorded."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.seconds = 2.0

    def starts(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


@pytest.fixture()
def fake_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJob:
    job = FakeJob(tmp_path / "starts.jsonl")
    real = exports.command
    monkeypatch.setattr(exports, "command", lambda row: [
        sys.executable, "-c", FAKE_JOB, str(job.seconds), str(job.record), *real(row)])
    return job


@pytest.fixture()
def holders() -> Iterator[Callable[[str, Path], subprocess.Popen[str]]]:
    """Start a child that holds a lock; every child is killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(script: str, path: Path) -> subprocess.Popen[str]:
        child = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
        started.append(child)
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def home(row: Channel) -> Path:
    channels.open_channel(row)  # creates the home and its channel.json
    return Path(row.checkpoint_dir)



def export_runs(task: str = "weir.export_channel") -> list[TaskRun]:
    return list(TaskRun.objects.filter(task=task, channel="orders").order_by("started_at"))


# -- one export of a channel at a time ------------------------------------------------------
def test_it_starts_one_export_of_two_triggered_at_once(
        worker: None, root: Path, fake_job: FakeJob) -> None:
    home(channel_row(root))
    with override_settings(WEIR_TASK_LOCK_WAIT_S=0):
        results = [tasks.export_channel.delay("orders") for _ in range(2)]
        outcomes = sorted(r.get(timeout=30) for r in results)
    assert outcomes == [TaskRun.BUSY, TaskRun.OK]
    assert sorted(r.outcome for r in export_runs()) == [TaskRun.BUSY, TaskRun.OK]
    assert len(fake_job.starts()) == 1
    run = ExportRun.objects.get()
    assert run.outcome == ExportRun.OK and run.rows == 10 and run.run_id == "fake-run"


def test_an_export_with_nothing_new_starts_no_spark(worker: None, root: Path,
                                                    fake_job: FakeJob) -> None:
    """The export subscription holds nothing untaken and no open take: the task ends
    "nothing due" without starting the job (seconds of JVM for nothing), and the UI's
    button says so at once; one new event and the job starts again."""
    from django.contrib.auth.models import User
    from django.test import Client

    row = channel_row(root)
    channel = channels.open_channel(row)
    channel.add_subscription("export", "latest")  # as a first export left it: drained
    assert tasks.export_channel.delay("orders").get(timeout=30) == TaskRun.NOTHING_DUE
    assert fake_job.starts() == [] and not ExportRun.objects.exists()
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    answer = operator.post("/channels/orders/export", follow=True)
    assert b"Nothing new to export" in answer.content
    admin = APIClient()
    admin.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue('a', ['admin'])[1]}")
    answer = admin.post("/api/v1/channels/orders/exports")
    assert answer.status_code == 200 and answer.json()["queued"] is False, answer.json()
    with channel.put() as tx:
        tx.put(b"new")
    assert tasks.export_channel.delay("orders").get(timeout=30) == TaskRun.OK
    assert len(fake_job.starts()) == 1


def test_a_drained_channel_with_a_dead_runs_row_still_runs_to_clean_it_up(
        worker: None, root: Path, fake_job: FakeJob) -> None:
    """A worker killed after its run's last take commit leaves a row "running" and its
    read token valid; the subscription is drained, but only a run (holding the lock) marks
    that row failed and revokes the token: "nothing new" must not skip it."""
    row = channel_row(root)
    channels.open_channel(row).add_subscription("export", "latest")
    stale = ExportRun.objects.create(channel="orders", started_at=timezone.now())
    token, _ = ApiToken.issue(exports._token_name(stale), ["consume"], [row])
    assert tasks.export_channel.delay("orders").get(timeout=30) == TaskRun.OK
    stale.refresh_from_db()
    token.refresh_from_db()
    assert stale.outcome == ExportRun.FAILED and token.revoked_at is not None
    assert len(fake_job.starts()) == 1
    assert tasks.export_channel.delay("orders").get(timeout=30) == TaskRun.NOTHING_DUE


def test_a_task_during_a_manual_export_is_busy_and_starts_nothing(
        worker: None, root: Path, fake_job: FakeJob) -> None:
    home(channel_row(root))  # the Redis lock does not cover manage.py: the flock does
    manual = threading.Thread(target=call_command, args=("export_channel", "orders"),
                              kwargs={"stdout": StringIO()})
    manual.start()
    try:
        wait_for(lambda: fake_job.starts(), 10, "the manual export's job started")
        assert tasks.export_channel.delay("orders").get(timeout=30) == TaskRun.BUSY
    finally:
        manual.join(30)
    [busy] = export_runs()
    assert busy.outcome == TaskRun.BUSY
    assert "an export of channel 'orders' is already running" in busy.detail["busy"]
    assert len(fake_job.starts()) == 1
    assert [r.outcome for r in ExportRun.objects.all()] == [ExportRun.OK]


def test_a_manual_export_during_a_task_fails_clearly_and_starts_nothing(
        worker: None, root: Path, fake_job: FakeJob) -> None:
    home(channel_row(root))
    result = tasks.export_channel.delay("orders")
    wait_for(lambda: fake_job.starts(), 10, "the task's job started")
    with pytest.raises(CommandError, match="an export of channel 'orders' is already "
                                           "running .*nothing was started"):
        call_command("export_channel", "orders")
    assert result.get(timeout=30) == TaskRun.OK
    assert len(fake_job.starts()) == 1 and ExportRun.objects.count() == 1


def test_manage_export_channel_exits_non_zero_when_busy(root: Path, holders: Any) -> None:
    row = channel_row(root)
    holders(HOLD_FILE, home(row) / exports.LOCK_FILE)
    with pytest.raises(CommandError, match="already running"):
        call_command("export_channel", "orders")
    assert not ExportRun.objects.exists()


# -- no run left "running" by a dead process -------------------------------------------------
def test_it_marks_a_run_left_running_by_a_dead_process_failed(
        root: Path, fake_job: FakeJob) -> None:
    row = channel_row(root)
    home(row)
    fake_job.seconds = 0
    dead = ExportRun.objects.create(channel="orders", started_at=timezone.now(),
                                    progress="export 10/100 events")
    dead_token, _ = ApiToken.issue(exports._token_name(dead), ["consume"], [row])
    other = ExportRun.objects.create(channel="payments", started_at=timezone.now())
    run = exports.run_export(row)
    dead.refresh_from_db()
    dead_token.refresh_from_db()
    assert dead.outcome == ExportRun.FAILED and "the process running this export died" in \
        dead.error
    assert dead_token.revoked_at is not None
    assert run.outcome == ExportRun.OK
    assert ExportRun.objects.get(pk=other.pk).outcome == ExportRun.RUNNING  # not its channel


def test_a_run_whose_process_lives_is_not_marked_failed(
        root: Path, fake_job: FakeJob, holders: Any) -> None:
    row = channel_row(root)
    holders(HOLD_FILE, home(row) / exports.LOCK_FILE)  # that process's run_export
    live = ExportRun.objects.create(channel="orders", started_at=timezone.now())
    with pytest.raises(exports.ExportBusy, match="an export of channel 'orders' is already "
                                                 "running"):
        exports.run_export(row)
    assert ExportRun.objects.get(pk=live.pk).outcome == ExportRun.RUNNING
    assert ExportRun.objects.count() == 1 and fake_job.starts() == []


def test_the_task_asks_for_the_warm_driver_unless_turned_off_and_manage_py_never(
        root: Path, fake_job: FakeJob, monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver itself, with real Spark: tests/spark/test_export_driver.py. A command line
    # other than the export job's (this fake's) runs as a process whatever is asked.
    row = channel_row(root)
    fake_job.seconds = 0
    real, asked = export_driver.started, []

    def started(argv: list[str], env: Any, lock_fd: int, warm: bool, deadline: float) -> Any:
        asked.append(warm)
        return real(argv, env, lock_fd, warm, deadline)

    monkeypatch.setattr(export_driver, "started", started)
    for _ in range(2):
        with channels.open_channel(row).put() as tx:
            tx.put(b"new")
        assert tasks.export_channel.apply(args=["orders"]).get() == TaskRun.OK
        call_command("export_channel", "orders", stdout=StringIO())
        with override_settings(WEIR_EXPORT_DRIVER=False):
            exports.run_export(row)
    assert asked == [True, False, False] * 2
    assert len(fake_job.starts()) == 6 and export_driver.driver_pid() is None


def test_a_job_asked_for_while_the_driver_is_busy_runs_as_a_process(tmp_path: Path) -> None:
    # Two exports at once in one worker process (Celery threads): the second never waits.
    argv = [sys.executable, "-m", exports.JOB, "--help"]
    with open(tmp_path / "lock", "w") as lock, export_driver._busy, \
            export_driver.started(argv, None, lock.fileno(), True, time.monotonic() + 60) as job:
        output = "".join(job.lines())
        assert job.wait() == 0
    assert isinstance(job, export_driver.ProcessJob) and "usage:" in output
    assert export_driver.driver_pid() is None


def test_the_job_inherits_the_appliance_lock(root: Path, fake_job: FakeJob) -> None:
    # A worker killed mid-export leaves its job's process running (a fresh process, as
    # this fake's; a warm driver's job ends with its worker: tests/spark/
    # test_export_driver.py); the job holds the lock too (a flock lives while any
    # descriptor of it is open), so no second export starts and the row is not failed
    # until the job ends as well.
    row = channel_row(root)
    lock = str(home(row) / exports.LOCK_FILE)
    exporting = threading.Thread(target=exports.run_export, args=(row,))
    exporting.start()
    try:
        [start] = wait_for(lambda: fake_job.starts(), 10, "the job started")
        fds = Path(f"/proc/{start['pid']}/fd")
        held = [fd.name for fd in fds.iterdir() if os.readlink(fd) == lock]
    finally:
        exporting.join(30)
    assert held, f"the job (pid {start['pid']}) has no descriptor of {lock}"
    assert ExportRun.objects.get().outcome == ExportRun.OK


def test_a_job_past_its_time_limit_is_killed_and_its_run_failed(
        root: Path, fake_job: FakeJob) -> None:
    row = channel_row(root)
    home(row)
    fake_job.seconds = 30
    started = time.monotonic()
    run = exports.run_export(row, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert run.outcome == ExportRun.FAILED
    assert run.error == "the export job ran longer than 0.5 s and was killed"


# -- the job's own lock (export.lock), across processes --------------------------------------
def refusal(channel_home: Path) -> str | None:
    """Why hold() refuses the channel's export.lock now (None: it would take it)."""
    try:
        with hold(channel_home, "orders"):
            return None
    except ExportRunningError as exc:
        return str(exc)


def test_the_job_lock_refuses_a_second_process_clearly(root: Path, holders: Any) -> None:
    channel_home = home(channel_row(root))
    holders(HOLDER, channel_home)
    assert refusal(channel_home) == (f"an export of channel 'orders' is already running "
                                     f"(another process holds {channel_home}/export.lock)")
    output = root / "export"
    done = subprocess.run([sys.executable, "-m", "channel_engine.spark.export", "--home",
                           str(channel_home), "--output", output.as_uri(), "--master",
                           "local[1]"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BUSY, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["report"] is None
    assert last["error"].startswith("an export of channel 'orders' is already running")
    assert not output.exists()  # refused before Spark started: nothing written


def test_the_job_lock_is_free_once_its_holder_is_killed(root: Path, holders: Any) -> None:
    channel_home = home(channel_row(root))
    holder = holders(HOLDER, channel_home)
    assert refusal(channel_home) is not None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert refusal(channel_home) is None


def test_the_job_lock_is_reentrant_in_its_thread_only(root: Path) -> None:
    channel_home = home(channel_row(root))
    elsewhere: list[str | None] = []
    with hold(channel_home, "orders"):
        assert refusal(channel_home) is None  # main() holds it, then Exporter.run again
        thread = threading.Thread(target=lambda: elsewhere.append(refusal(channel_home)))
        thread.start()
        thread.join()
        assert refusal(channel_home) is None
    assert elsewhere[0] is not None and "already running" in elsewhere[0]
    assert refusal(channel_home) is None  # released with the outer block


# -- remote reads ----------------------------------------------------------------------------
def test_remote_reads_get_a_channel_scoped_consume_token_revoked_after_the_run(
        root: Path, fake_job: FakeJob) -> None:
    row = channel_row(root)
    other = channel_row(root, name="payments")
    with channels.open_channel(row).put() as tx:
        tx.put(b"e0")
    home(other)
    url = "/api/v1/channels/{}/partitions/0/batches?start=0&end=1"
    with override_settings(WEIR_EXPORT_READ_URL="http://appliance.example:8000"):
        exporting = threading.Thread(target=exports.run_export, args=(row,))
        exporting.start()
        try:
            [start] = wait_for(lambda: fake_job.starts(), 10, "the job started")
            key = start["token"]
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
            during = client.get(url.format("orders"))
            elsewhere = client.get(url.format("payments"))
        finally:
            exporting.join(30)
    argv = start["argv"]
    assert argv[argv.index("--read-url") + 1] == "http://appliance.example:8000"
    assert key and key not in " ".join(argv)  # the environment, not `ps`
    assert during.status_code == 200, during.content
    assert elsewhere.status_code == 403
    token = ApiToken.objects.get(key_hash=hash_key(key))
    assert token.roles == ["consume"] and not token.all_channels
    assert list(token.channels.all()) == [row]
    assert token.revoked_at is not None
    assert client.get(url.format("orders")).status_code in (401, 403)
    assert ExportRun.objects.get(channel="orders").outcome == ExportRun.OK


def test_without_a_read_url_executors_read_files_and_no_token_is_issued(
        root: Path, fake_job: FakeJob) -> None:
    row = channel_row(root)
    home(row)
    fake_job.seconds = 0
    assert exports.run_export(row).outcome == ExportRun.OK
    [start] = fake_job.starts()
    assert "--read-url" not in start["argv"] and start["token"] is None
    assert not ApiToken.objects.exists()


def test_the_token_is_revoked_when_the_job_fails(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)
    monkeypatch.setattr(exports, "command", lambda row: [sys.executable, "-c",
                                                         "raise SystemExit(3)"])
    with override_settings(WEIR_EXPORT_READ_URL="http://appliance.example:8000"):
        run = exports.run_export(row)
    assert run.outcome == ExportRun.FAILED and "exited with 3" in run.error
    assert ApiToken.objects.get().revoked_at is not None


@pytest.mark.parametrize("value", ["ftp://appliance", "appliance:8000", "http://",
                                   "http://a b", "http://appliance?x=1"])
def test_it_refuses_a_read_url_that_is_not_an_http_base_url(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("WEIR_EXPORT_READ_URL", value)
    with pytest.raises(ImproperlyConfigured, match="WEIR_EXPORT_READ_URL"):
        env_http_url("WEIR_EXPORT_READ_URL")


def test_a_read_url_loses_its_trailing_slash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_EXPORT_READ_URL", "https://weir.example/base/")
    assert env_http_url("WEIR_EXPORT_READ_URL") == "https://weir.example/base"
    monkeypatch.setenv("WEIR_EXPORT_READ_URL", "")
    assert env_http_url("WEIR_EXPORT_READ_URL") == ""


# -- export now over the API ----------------------------------------------------------------
def test_it_queues_an_export_now_over_the_api_for_admins_only(
        worker: None, root: Path, fake_job: FakeJob) -> None:
    home(channel_row(root))
    _, produce_key = ApiToken.issue("p", ["produce"])
    producer = APIClient()
    producer.credentials(HTTP_AUTHORIZATION=f"Bearer {produce_key}")
    assert producer.post("/api/v1/channels/orders/exports").status_code == 403
    _, admin_key = ApiToken.issue("a", ["admin"])
    admin = APIClient()
    admin.credentials(HTTP_AUTHORIZATION=f"Bearer {admin_key}")
    assert admin.post("/api/v1/channels/nope/exports").status_code == 404
    response = admin.post("/api/v1/channels/orders/exports")
    assert response.status_code == 202 and response.json()["queued"] is True
    run = wait_for(lambda: ExportRun.objects.filter(outcome=ExportRun.OK).first(), 30,
                   "the export worker ran the queued export")
    assert run.rows == 10 and len(fake_job.starts()) == 1


def test_it_answers_export_now_with_503_and_the_brokers_reason_at_once(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.celery import app
    home(channel_row(root))
    monkeypatch.setattr(app.conf, "broker_write_url", "redis://127.0.0.1:1/0")
    _, admin_key = ApiToken.issue("a", ["admin"])
    admin = APIClient()
    admin.credentials(HTTP_AUTHORIZATION=f"Bearer {admin_key}")
    # A test client builds Django's middleware chain on its first request (whitenoise scans
    # the static files): seconds under CI's load, and no part of the answer timed here.
    assert admin.get("/api/v1/channels/orders").status_code == 200
    started = time.monotonic()
    response = admin.post("/api/v1/channels/orders/exports")
    assert time.monotonic() - started < 1
    error = problem(response, 503, "broker-unavailable", retry_after=1)["detail"]
    assert error.startswith("export not queued: the broker is unreachable (") and \
        "127.0.0.1:1" in error
    assert not ExportRun.objects.exists()


@pytest.mark.parametrize(("output", "expected"), [
    (["Setting default log level to \"WARN\".", "26/11/29 00:01 WARN NativeCodeLoader: Unable",
      "Traceback (most recent call last):", '  File "/x/export.py", line 9, in main',
      "    run()", "ValueError: the output is not writable"],
     'ValueError: the output is not writable (File "/x/export.py", line 9, in main)'),
    (["Using Spark's default log4j profile", "Exception in thread \"main\" "
      "java.lang.OutOfMemoryError: Java heap space", "\tat org.apache.Foo(Foo.java:1)"],
     "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space"),
    (["one", "two"], "one\ntwo"),
])
def test_a_job_dead_without_a_report_is_told_by_its_cause_not_its_banner(
        output: list[str], expected: str) -> None:
    assert exports.cause(output) == expected


def test_a_crashed_job_run_names_its_exception(root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)
    script = ("import sys\nprint('Setting default log level to \"WARN\".', flush=True)\n"
              "print('WARN NativeCodeLoader: Unable to load native-hadoop library', "
              "flush=True)\nraise ValueError('the output is not writable')")
    monkeypatch.setattr(exports, "command", lambda row: [sys.executable, "-c", script])
    run = exports.run_export(row)
    assert run.outcome == ExportRun.FAILED
    assert run.error.startswith("the export job exited with 1: ValueError: the output is not "
                                "writable ("), run.error
    assert "NativeCodeLoader" not in run.error


# -- a job killed after its commit point is recorded as what it did --------------------------
# argv: the run id, then the outcome of each commit line to print before it kills itself
COMMIT_THEN_DIE = """
import json, os, signal, sys
files = ["file:///out/orders/2026/11/27/14/orders+0+%020d+%020d.parquet" % (0, 9)]
run = {"run_id": sys.argv[1], "output": "file:///out/orders", "rows": 10, "bytes": 100,
       "recorded": False, "partitions": [{"partition": 0, "ranges": [[0, 10]],
       "skipped": [], "files": files, "rows": 10, "bytes": 100, "error": None}]}
for outcome in sys.argv[2:]:
    run["outcome"] = run["partitions"][0]["outcome"] = outcome
    print(json.dumps({"commit": run}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
# argv: the run ids whose commit records this run's step 1 read
REPORTS_COMMITTED = """
import json, sys
print(json.dumps({"report": {"run_id": "r-next", "output": "file:///out/orders", "rows": 0,
                             "bytes": 0, "partitions": [], "committed_runs": sys.argv[1:]}}))
"""


def job(monkeypatch: pytest.MonkeyPatch, script: str, *args: str) -> None:
    monkeypatch.setattr(exports, "command", lambda row: [sys.executable, "-c", script, *args])


def test_a_job_killed_after_its_commit_point_is_recorded_as_committed(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)
    job(monkeypatch, COMMIT_THEN_DIE, "r-killed", "committing", "committed")
    run = exports.run_export(row)
    assert run.outcome == ExportRun.OK and run.error == "" and run.run_id == "r-killed"
    assert run.rows == 10 and run.partitions[0]["ranges"] == [[0, 10]]
    assert run.partitions[0]["files"][0].endswith("orders+0+00000000000000000000+"
                                                  "00000000000000000009.parquet")
    assert run.progress.startswith("committed 10 events; its job then ended before its "
                                   "report (the export job exited with -9"), run.progress
    assert "the next export finishes moving its files" in run.progress


def test_a_job_killed_in_its_commit_is_confirmed_committed_by_the_next_run(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)
    job(monkeypatch, COMMIT_THEN_DIE, "r-killed", "committing")  # the record: unknown
    killed = exports.run_export(row)
    assert killed.outcome == ExportRun.FAILED and killed.rows == 0
    assert "while it wrote its commit record" in killed.error
    job(monkeypatch, COMMIT_THEN_DIE, "r-other", "committing")
    other = exports.run_export(row)
    job(monkeypatch, REPORTS_COMMITTED, "r-killed")  # its record is there; r-other's not
    assert exports.run_export(row).outcome == ExportRun.OK
    killed.refresh_from_db()
    other.refresh_from_db()
    assert killed.outcome == ExportRun.OK and killed.error == "" and killed.rows == 10
    assert "run r-next found its commit record" in killed.progress
    assert other.outcome == ExportRun.FAILED and other.rows == 0


# The next run finds r-killed's record, tells it in `line`, then dies: killed once its step 1
# compacted the records (the run id is gone from them), or in its own commit.
RECOVERED_THEN_DIE = """
import json, os, signal, sys
found = {"run_id": "r-next", "committed_runs": ["r-earlier", "r-killed"]}
if sys.argv[1] == "recovered":
    print(json.dumps({"recovered": found}), flush=True)
else:
    print(json.dumps({"commit": {"run_id": "r-next", "output": "file:///out/orders",
                                 "rows": 0, "bytes": 0, "outcome": "committing",
                                 "partitions": [], **found}}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("line", ["recovered", "commit"])
def test_a_run_killed_in_its_commit_is_confirmed_even_when_the_next_job_dies_too(
        root: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    row = channel_row(root)
    home(row)
    job(monkeypatch, COMMIT_THEN_DIE, "r-killed", "committing")
    killed = exports.run_export(row)
    assert killed.outcome == ExportRun.FAILED and killed.rows == 0
    job(monkeypatch, RECOVERED_THEN_DIE, line)
    next_run = exports.run_export(row)
    assert next_run.outcome == ExportRun.FAILED  # it died: no report
    killed.refresh_from_db()
    assert (killed.outcome, killed.rows, killed.error) == (ExportRun.OK, 10, "")
    assert "run r-next found its commit record" in killed.progress


def test_a_run_whose_worker_died_after_its_commit_point_is_committed_not_failed(
        root: Path, fake_job: FakeJob) -> None:
    row = channel_row(root)
    home(row)
    fake_job.seconds = 0
    partition = {"partition": 0, "ranges": [[0, 7]], "files": ["f"], "outcome": "committed"}
    dead = ExportRun.objects.create(channel="orders", started_at=timezone.now(),
                                    run_id="r-dead", partitions=[partition])
    exports.run_export(row)
    dead.refresh_from_db()
    assert dead.outcome == ExportRun.OK and dead.rows == 7 and dead.error == ""
    assert "the process running this export died" in dead.progress


# A job that tells what it recovered, commits (two commit lines) and reports.
RECOVERS_COMMITS_REPORTS = """
import json, sys
found = {"run_id": "r-next", "committed_runs": ["r-killed"]}
print(json.dumps({"recovered": found}), flush=True)
print("export orders: writing 1 partition", flush=True)
run = {"output": "file:///out/orders", "rows": 10, "bytes": 100, "recorded": False,
       "partitions": [{"partition": 0, "ranges": [[0, 10]], "skipped": [], "files": ["f"],
                       "rows": 10, "bytes": 100, "error": None}], **found}
for outcome in ("committing", "committed"):
    run["outcome"] = run["partitions"][0]["outcome"] = outcome
    print(json.dumps({"commit": run}), flush=True)
run.pop("outcome")
print(json.dumps({"report": run}), flush=True)
"""


def test_a_database_error_on_a_line_of_the_running_job_never_kills_it(
        root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    row = channel_row(root)
    home(row)
    partition = {"partition": 0, "ranges": [[0, 7]], "files": ["f"], "outcome": "committing"}
    killed = ExportRun.objects.create(channel="orders", started_at=timezone.now(),
                                      outcome=ExportRun.FAILED, run_id="r-killed",
                                      partitions=[partition])
    confirm, lines = exports._confirm_committed, []

    def locked(*args: Any) -> None:  # while the job runs (its recovered and commit lines)
        lines.append(args)
        if len(lines) <= 3:
            raise OperationalError("database is locked")
        confirm(*args)

    monkeypatch.setattr(exports, "_confirm_committed", locked)
    job(monkeypatch, RECOVERS_COMMITS_REPORTS)
    run = exports.run_export(row)  # not interrupted between its commit lines
    assert (run.outcome, run.run_id, run.rows, run.error) == (ExportRun.OK, "r-next", 10, "")
    assert run.progress == "exported 10 events" and len(lines) == 4
    killed.refresh_from_db()  # confirmed by the report
    assert (killed.outcome, killed.rows) == (ExportRun.OK, 7)
    assert "could not record the job's line" in caplog.text
    assert "database is locked" in caplog.text


def test_a_failed_confirm_never_undoes_the_runs_own_commit_line(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)

    confirm, calls = exports._confirm_found, []

    def locked(*args: Any) -> None:  # on each commit line; not once the job has ended
        calls.append(args)
        if len(calls) <= 2:
            raise OperationalError("database is locked")
        confirm(*args)

    monkeypatch.setattr(exports, "_confirm_found", locked)
    job(monkeypatch, COMMIT_THEN_DIE, "r-killed", "committing", "committed")
    run = exports.run_export(row)  # killed after its commit point: what its lines said
    assert (run.outcome, run.run_id, run.rows, run.error) == (ExportRun.OK, "r-killed", 10, "")
    assert len(calls) == 3


# A commit line cut by the JVM's output on the shared pipe, then the job goes on and reports.
CUT_COMMIT_LINE = """
import json
print('{"commit": {"run_id": "r-cut", "output": "file:///out/orders", "ro' +
      '26/11/29 03:00:00 INFO DAGScheduler: Job 3 finished', flush=True)
print(json.dumps({"report": {"run_id": "r-cut", "output": "file:///out/orders", "rows": 10,
                             "bytes": 100, "partitions": []}}), flush=True)
"""


def test_a_commit_line_cut_by_other_output_never_stops_the_job(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root)
    home(row)
    job(monkeypatch, CUT_COMMIT_LINE)
    run = exports.run_export(row)
    assert (run.outcome, run.run_id, run.rows, run.error) == (ExportRun.OK, "r-cut", 10, "")


def test_the_job_is_told_max_open_files_only_when_set(root: Path) -> None:
    row = channel_row(root)
    assert "--max-open-files" not in exports.command(row)  # the job's default per format
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + ApiToken.issue("ops", ["admin"])[1])
    for bad in (0, 1025, "4"):
        refused = client.patch("/api/v1/channels/orders", {"export_max_open_files": bad},
                               format="json")
        problem(refused, 400, "invalid-setting", field="export_max_open_files")
    changed = client.patch("/api/v1/channels/orders", {"export_max_open_files": 2},
                           format="json")
    assert changed.status_code == 200, changed.content
    argv = exports.command(Channel.objects.get(name="orders"))
    assert argv[argv.index("--max-open-files") + 1] == "2"


def test_a_warm_driver_is_used_only_in_the_environment_it_was_started_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its JVM read HADOOP_CONF_DIR, KRB5CCNAME... at its start; a job's own variables (the
    # read token, the crash tests' hooks) are set per job. (A process stands in for it.)
    real = subprocess.Popen
    monkeypatch.setattr(export_driver.subprocess, "Popen", lambda argv, **kw: real(
        [sys.executable, "-c", "import time; time.sleep(60)"], **kw))
    env = {**os.environ, "HADOOP_CONF_DIR": "/etc/hadoop", exports.TOKEN_ENV: "one"}
    with override_settings(WEIR_EXPORT_DRIVER_MAX_JOBS=2):
        driver = export_driver.WarmDriver("local[1]", env)
    try:
        assert exports.TOKEN_ENV not in driver.process.args and driver.env.get(
            exports.TOKEN_ENV) is None  # never in the driver's own environment
        assert driver.usable("local[1]", {**env, exports.TOKEN_ENV: "two",
                                          "WEIR_EXPORT_CRASH_AT": "announced"})
        for changed in ("HADOOP_CONF_DIR", "HADOOP_USER_NAME", "KRB5CCNAME",
                        "SPARK_CONF_DIR"):
            assert not driver.usable("local[1]", {**env, changed: "/elsewhere"}), changed
        assert not driver.usable("local[2]", env)
        driver.jobs = 2  # its WEIR_EXPORT_DRIVER_MAX_JOBS served
        assert not driver.usable("local[1]", env)
    finally:
        driver.kill()
    assert not driver.folder.exists() and driver.process.returncode == -signal.SIGKILL

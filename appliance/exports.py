"""Exports from the appliance's side: run the Spark export job for a channel row and keep
an ExportRun row of it (progress while it runs, then the report or the error).

The job (channel_engine/spark/export.py) needs no database: it gets the channel's home
and export settings on its command line and runs in a process of its own — the export
worker's warm Spark driver, which runs the same job code with the same output lines, or a
fresh process per run (WEIR_EXPORT_DRIVER off, manage.py export_channel, the driver busy):
appliance/export_driver.py says which and what the driver keeps of a fresh process — so
a crash of the job is a crash of that process only, and the protocol makes the rerun
exact. WEIR_EXPORT_URI, WEIR_SPARK_MASTER and WEIR_EXPORT_READ_URL come from settings.

One export of a channel at a time, and no ExportRun "running" forever:

    lock file                 held (flock, exclusive, never waited for)
    ------------------------  ---------------------------------------------------------------
    <home>/export-run.lock    by run_export, from before its ExportRun row is created until
                              the row is finished; the job inherits it (a warm driver gets it
                              with the job, SCM_RIGHTS, and holds it until the job ends), so it
                              stays held while either the process running the export or its
                              job lives
    <home>/export.lock        by the job itself (channel_engine/spark/export_lock.py)

Held elsewhere, run_export starts nothing and raises ExportBusy: the Celery task records
its run as busy, manage.py export_channel exits with an error. (The task's Redis lock
covers Celery runs only; this one covers manage.py too, and every appliance process.)
Once run_export holds it, an ExportRun of the channel still "running" belongs to a process
that died with its job (a killed worker): it is marked failed. The kernel drops a dead
process's flock, so the lock itself is never stale.

A run killed after its commit point is recorded as what it did. The job prints the
run's report just before its commit point and just after (its commit lines: the ranges,
files, rows and bytes it commits; channel_engine/spark/export_report.py), and the row
keeps it while it runs. A job that then ends without its report (killed, timed out, its
worker gone) leaves a row "ok" with those events and files ("committed …; the next
export finishes moving its files"), never "failed, 0 events"; one that died between the
two lines is "failed" until the next run tells which runs' commit records it read
(committed_runs): those rows become "ok" too. The next job tells it three times: in the
line it prints once its step 1 has read the records (`{"recovered": …}`, before it
compacts them and forgets their run ids), in its commit lines and in its report; the
first to arrive confirms the rows, so they are right however that job ends (killed
after its compaction, say). The next run finishes the moves and skips the committed
ranges (the protocol, channel_engine/spark/exporter.py). A database error while the job
runs (SQLite's "database is locked") is logged and the job goes on: killing it between
its commit lines for a row that the report, or the next run, corrects anyway would be worse.

Remote reads. With WEIR_EXPORT_READ_URL set, the job gets `--read-url` and its executors
read ranges from the raw batches endpoint (appliance/api/batches.py, role consume) instead of the
segment files. Each run issues its own ApiToken: role consume, this channel only, named
"export run <pk> of <channel>". Its key is shown once, at issue (only a hash is stored),
so it goes straight to the job in the environment (WEIR_EXPORT_READ_TOKEN; the command
line is visible to every user in `ps`) and lives nowhere else. It is revoked when the run
ends, whatever the outcome, and with its stale row when the run's process died. Why not
one token per channel, reused: the appliance would have to store its key; a token per run
keeps a leaked key useful only while its run lasts.

Export now (POST /api/v1/channels/{name}/exports, appliance/api/exports.py; the UI's
button): queue_export() sends the task to the export worker, or raises BrokerUnavailable at
once with the broker's reason (the API answers a 503 broker-unavailable problem with
Retry-After, the UI says so): it first asks the
broker's Redis for a PING with a BROKER_CHECK_S timeout (a hung or stopped Redis would
otherwise hold the request for Celery's publish retries and socket waits), then publishes
with Celery's bounded publish retry policy (settings.py), keeping no result.

Nothing new. A drain's task (the export's, the Kafka sink's: appliance/tasks.py) first
asks the channel whether the drain's subscription holds anything (nothing_new): when it
holds no untaken event and no open take, the task ends "nothing due" within milliseconds
instead of starting Spark (seconds of JVM) or the sink's job and its Kafka clients. A
subscription not there yet is the first run's to make: that run goes. The UI's buttons and the API's
"now" endpoints say "nothing new" at once (200, queued false) rather than queue such a run.
A channel with a run row still "running" is never "nothing new": that row may be a dead
process's, and only a run, holding the lock, marks it failed. A drained channel's Kafka
sink does not connect at all: a broken sink (a wrong address, a refused login) shows once
there is something to send.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError
from redis.backoff import NoBackoff
from redis.retry import Retry

from appliance import channels, export_driver
from appliance.export_schema import commit_stage
from appliance.models import ApiToken, Channel, ExportRun
from channel_engine.spark.path_overlap import folder

log = logging.getLogger(__name__)
JOB = export_driver.JOB  # the job: python -m JOB, or its warm driver
LOCK_FILE = "export-run.lock"
TOKEN_ENV = "WEIR_EXPORT_READ_TOKEN"
BROKER_CHECK_S = 0.25
TAIL_LINES = 200  # of a job's output, for the cause of a death without a report
DIED = ("the process running this export died (a killed or restarted worker) before the "
        "job's outcome was recorded; the next export skips whatever this one committed")


def nothing_new(channel: Any, subscription: str, runs: Any) -> bool:
    """Whether a drain of `subscription` would find nothing to do (module doc). `runs`: the
    channel's rows of that drain (ExportRun or KafkaRun); one still "running" may be a dead
    process's, which only a run marks failed (and whose read token it revokes): a run goes."""
    if runs.filter(outcome=ExportRun.RUNNING).exists():
        return False
    found = channel.status()["subscriptions"].get(subscription)
    return found is not None and found["events_untaken"] == 0 and found["open_takes"] == 0


def drained(row: Channel, subscription: str, run_model: Any) -> str | None:
    """Why a drain asked for from a request ("export now", "send now") has nothing to do
    (nothing_new), for people; None when it has, or when the channel cannot be asked (a
    run then says why)."""
    try:
        if not nothing_new(channels.open_channel(row), subscription,
                           run_model.objects.filter(channel=row.name)):
            return None
    except Exception:  # noqa: BLE001 -- a bad setting, a missing file: the run tells it
        return None
    return f"subscription {subscription!r} holds no untaken event"


class ExportBusy(Exception):
    """Another process is running an export of the channel: nothing was started."""


class BrokerUnavailable(Exception):
    """The broker did not take the task's message: nothing was queued. `what` names the
    task for people ("export", "Kafka run")."""

    def __init__(self, reason: str, what: str = "export") -> None:
        super().__init__(reason)
        self.what = what


def queue_export(row: Channel) -> str:
    """Queue an export of the channel for the export worker; its task id. BrokerUnavailable,
    at once and with the broker's reason, when the broker does not answer."""
    from appliance.tasks import export_channel

    return queue_now(export_channel, row.name, "export")


def queue_now(task: Any, name: str, what: str) -> str:
    """Send a per-channel task ("export now", "drain to Kafka now") for a worker; its task
    id, or BrokerUnavailable at once when the broker does not answer (module doc)."""
    from appliance.celery import app

    url = str(app.conf.broker_write_url or app.conf.broker_url).split(";")[0]
    try:
        with redis.Redis.from_url(url, socket_timeout=BROKER_CHECK_S,
                                  socket_connect_timeout=BROKER_CHECK_S,
                                  retry=Retry(NoBackoff(), 0)) as client:
            client.ping()
    except (redis.RedisError, OSError) as exc:
        raise BrokerUnavailable(f"{type(exc).__name__}: {exc}", what) from exc
    try:
        return str(task.apply_async((name,), ignore_result=True).id)
    except BrokerError as exc:
        raise BrokerUnavailable(str(exc), what) from exc


def command(row: Channel) -> list[str]:
    """The job's command line for a channel row."""
    config = channels.to_config(row)
    argv = [sys.executable, "-m", JOB, "--home", str(config.home),
            "--output", settings.WEIR_EXPORT_URI, "--format", row.export_format,
            "--path", row.export_path, "--roll-rows", str(row.export_roll_rows),
            "--roll-bytes", str(row.export_roll_bytes),
            "--subscription", row.export_subscription,
            "--schema-version", str(row.export_schema_version),
            "--master", settings.WEIR_SPARK_MASTER]
    if row.export_max_open_files is not None:  # else the job's default for the format
        argv += ["--max-open-files", str(row.export_max_open_files)]
    if settings.WEIR_EXPORT_READ_URL:
        argv += ["--read-url", settings.WEIR_EXPORT_READ_URL]
    return argv


def run_export(row: Channel, timeout_s: float = 3600, warm: bool | None = None) -> ExportRun:
    """Run one export of the channel now; return its finished ExportRun. ExportBusy, and
    nothing started, when another process is running one. `warm`: in this process's warm
    export driver (appliance/export_driver.py) rather than a fresh process; None:
    WEIR_EXPORT_DRIVER says."""
    if warm is None:
        warm = settings.WEIR_EXPORT_DRIVER
    with _export_lock(row) as lock_fd:
        # the settings as they are now: a change of version or path waits for this lock
        # (manage_channels), so none lands between this read and the run's end
        row.refresh_from_db()
        argv = command(row)
        _fail_stale_runs(row.name)
        run = ExportRun.objects.create(channel=row.name, started_at=timezone.now(),
                                       progress="starting Spark", path=folder(row.export_path),
                                       schema_version=row.export_schema_version)
        env, token = None, None
        if settings.WEIR_EXPORT_READ_URL:
            token, key = ApiToken.issue(_token_name(run), ["consume"], [row])
            env = {**os.environ, TOKEN_ENV: key}
        try:
            _run_job(run, argv, env, lock_fd, timeout_s, warm)
        finally:
            if token is not None:
                token.revoke()
    return run


def _export_lock(row: Channel) -> Any:
    path = channels.to_config(row).home / LOCK_FILE
    return held(path, ExportBusy(f"an export of channel {row.name!r} is already running "
                                 f"({path} is locked)"))


@contextmanager
def held(path: Path, busy: Exception) -> Iterator[int]:
    """An exclusive flock on `path` (made if missing) while the block runs, never waited
    for: `busy` is raised when another process holds it. The descriptor, for a job to
    inherit; the kernel drops the lock with the last process holding it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        yield fd
    finally:
        os.close(fd)


def cause(lines: list[str]) -> str:
    """What a job that died without its report line says about why, from its last output
    lines: a Python traceback's exception (with the line that raised it), else the last
    lines naming an error or exception, else the last lines — never Spark's start-up
    banner and log noise when something better is there."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if starts:
        traceback = [line for line in lines[starts[-1] + 1:] if line.strip()]
        exception = next((line for line in reversed(traceback)
                          if not line.startswith((" ", "\t"))), "")
        where = next((line.strip() for line in reversed(traceback)
                      if line.lstrip().startswith("File ")), "")
        if exception:
            return f"{exception} ({where})" if where else exception
    named = [line for line in lines if re.search(r"(Error|Exception|ERROR|FATAL)\b", line)]
    return "\n".join((named or lines)[-4 if named else -8:])


def _token_name(run: ExportRun) -> str:
    return f"export run {run.pk} of {run.channel}"


def _fail_stale_runs(name: str) -> None:
    """Finish the channel's runs left "running" by a dead process (the caller holds the
    lock): committed when their job had passed its commit point, else failed; revoke
    their read tokens."""
    for stale in ExportRun.objects.filter(channel=name, outcome=ExportRun.RUNNING):
        _died(stale, DIED)
        stale.save()
        for token in ApiToken.objects.filter(name=_token_name(stale), revoked_at=None):
            token.revoke()


def _record_commit(run: ExportRun, report: dict[str, Any]) -> None:
    """Keep a commit line's report in the row (still running): what the run commits."""
    files = sum(len(p["files"]) for p in report["partitions"])
    verb = "committed" if report["outcome"] == "committed" else "committing"
    ExportRun.objects.filter(pk=run.pk).update(
        run_id=report["run_id"], output=report["output"], rows=report["rows"],
        bytes=report["bytes"], partitions=report["partitions"],
        progress=f"export {run.channel}: {verb} {report['rows']:,} events in {files} files")


def _died(run: ExportRun, why: str) -> None:
    """Finish the row of a run whose job ended without its report (`why`): committed
    (outcome ok) when its commit line said so, else failed. Not saved."""
    if commit_stage(run) == "committed":
        _committed(run, f"its job then ended before its report ({why})"[:200])
        return
    run.outcome, run.error = ExportRun.FAILED, why
    if commit_stage(run) == "committing":  # the record may be written: the next run tells
        run.rows = run.bytes = 0
        run.error += (" (while it wrote its commit record: if the record is there, the "
                      "next export says so and this run counts as committed)")


def _committed(run: ExportRun, note: str) -> None:
    """Mark the run committed (outcome ok): the output holds the events its partitions
    name, from its commit record on, whatever its job did after. Not saved."""
    run.outcome, run.error = ExportRun.OK, ""
    run.rows = sum(end - start for p in run.partitions for start, end in p["ranges"])
    for partition in run.partitions:
        partition["outcome"] = "committed"
    run.progress = (f"committed {run.rows:,} events; {note}; the next export finishes "
                    f"moving its files")[:300]


def _confirm_committed(channel: str, runs: list[str], by: str) -> None:
    """Earlier rows of the channel recorded failed whose runs `by` found committed
    (its commit records name them: `runs`) count as committed."""
    for earlier in ExportRun.objects.filter(channel=channel, outcome=ExportRun.FAILED,
                                            run_id__in=[r for r in runs if r]):
        if earlier.partitions:  # what it committed, from its commit line
            _committed(earlier, f"its job died before reporting; run {by} found its "
                                f"commit record")
            earlier.save()


def _run_job(run: ExportRun, argv: list[str], env: dict[str, str] | None, lock_fd: int,
             timeout_s: float, warm: bool) -> None:
    """Run the job, following its progress lines; finish the row with its report."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    report = None
    # from before the job starts: a driver's start counts (it may take minutes)
    deadline = time.monotonic() + timeout_s
    with export_driver.started(argv, env, lock_fd, warm, deadline) as job:
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            job.kill()

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.start()
        try:
            for line in job.lines():
                line = line.rstrip("\n")
                found = _json_line(line)
                if found and "report" in found:
                    report = found
                elif found or line.startswith("export "):
                    _note_while_running(run, line, found)
                else:
                    tail.append(line)
            code = job.wait()
        except BaseException as exc:  # a time limit, a lost database: no orphan job
            job.kill()
            _interrupted(run, f"the export was interrupted and its job killed: "
                              f"{type(exc).__name__}: {exc}")
            raise
        finally:
            timer.cancel()
    run.refresh_from_db()
    run.duration_s = (timezone.now() - run.started_at).total_seconds()
    _finish_run(run, code, report or {}, expired.is_set() and
                f"the export job ran longer than {timeout_s:g} s and was killed", list(tail))
    run.save()


def _note_while_running(run: ExportRun, line: str, found: dict[str, Any] | None) -> None:
    """Keep a progress, commit or recovered line of the running job in the database."""
    if found and "commit" in found:
        _while_running(run, line, _record_commit, run, found["commit"])
        _while_running(run, line, _confirm_found, run, found["commit"])
    elif found and "recovered" in found:
        _while_running(run, line, _confirm_found, run, found["recovered"])
    elif not found:
        _while_running(run, line, ExportRun.objects.filter(pk=run.pk).update,
                       progress=line[:300])


def _while_running(run: ExportRun, line: str, write: Any, *args: Any, **kwargs: Any) -> None:
    """Call a database `write` for the job's `line`, each in its own savepoint (a failed
    confirm never undoes the run's own commit line). A database error (SQLite's "database
    is locked", a lost connection) is logged, never raised: raised, it would kill the job
    between its commit lines, worse than a row behind; the report, or the next run's
    recovered line, tells it again."""
    try:
        with transaction.atomic():
            write(*args, **kwargs)
    except DatabaseError:
        log.exception("export of %s: could not record the job's line %.80s; the job goes on",
                      run.channel, line)


def _json_line(line: str) -> dict[str, Any] | None:
    """A report or commit line of the job, or None for any other line. The JVM writes to
    the same pipe, so a long line may arrive cut by its output: such a line is not one
    (it goes to the tail) and never stops the job at its commit point."""
    if not line.startswith(('{"report"', '{"commit"', '{"recovered"')):
        return None
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _interrupted(run: ExportRun, why: str) -> None:
    """Finish the row of a run whose job this worker killed (a time limit, a lost
    database): by how far its commit lines say it came, as for a job that died."""
    try:
        run.refresh_from_db()
        _died(run, why)
        run.save()
    except Exception:  # the database may be what failed: the next run finishes the row
        log.exception("export of %s: could not record why its job was killed", run.channel)


def _finish_run(run: ExportRun, code: int, line: dict[str, Any], expired: str | bool,
                tail: list[str]) -> None:
    """Finish the row by the job's exit status and report line (`line`; {} without one):
    ok, committed though its job failed after its commit point, or failed. Not saved."""
    done = line.get("report") if code == 0 else None
    if done:
        run.outcome, run.run_id, run.output = ExportRun.OK, done["run_id"], done["output"]
        run.rows, run.bytes, run.partitions = done["rows"], done["bytes"], done["partitions"]
        run.progress = f"exported {done['rows']:,} events"
        if done.get("missing_files"):  # pruned by hand: not an error, but worth seeing
            run.progress += (f"; {len(done['missing_files'])} files of earlier runs are gone "
                             f"from the output, e.g. {done['missing_files'][0]}")[:250]
    failed = line.get("run") or {}  # what the failed run had reserved, or done
    error = line.get("error") or expired or f"the export job exited with {code}: " + \
        cause(tail)
    if not done and failed.get("recorded"):  # it failed after its commit point
        run.run_id, run.partitions = failed["run_id"], failed["partitions"]
        _committed(run, f"its job then failed: {error}"[:200])
    elif not done and failed:
        run.outcome, run.error = ExportRun.FAILED, str(error)
        run.run_id, run.partitions = failed.get("run_id", ""), failed.get("partitions", [])
    elif not done:
        _died(run, str(error))
    _confirm_found(run, done or failed)


def _confirm_found(run: ExportRun, found: dict[str, Any]) -> None:
    """Confirm the earlier rows whose commit records the job of `run` found (a recovered
    line, a commit line or the report: `found` has run_id and committed_runs)."""
    by = str(found.get("run_id") or run.run_id)
    runs = found.get("committed_runs")
    if isinstance(runs, list):
        _confirm_committed(run.channel, [str(r) for r in runs if r != by], by)

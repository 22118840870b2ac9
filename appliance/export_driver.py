"""How run_export runs an export job: in the process's warm export driver, or as a fresh
process (`python -m channel_engine.spark.export`). Either way a Job whose output lines,
kill and exit status are the same, so appliance/exports.py does the same with them.

The warm driver (channel_engine/spark/export_driver.py: what it does per job) is one
process per export worker process, holding a SparkSession: started on the first export
that asks for it (not at the worker's start: a worker whose channels export nothing
holds no JVM), then reused for every export of every channel, one at a time; a job is
handed to it over a Unix socket, driver.sock in a directory of its own made by mkdtemp in
the container's /tmp (weir-xd-*, 0700: a request carries the job's read token; not the
var dir, which every container of the compose file shares while each has its own pid
namespace), with the job's export-run.lock descriptor and its whole environment
(driver_protocol.py). The driver never unlinks a socket it did not bind, and serves only
its own uid (SO_PEERCRED). Only for a local Spark master (local, local[N], local[*]): a
driver on spark:// or YARN would hold the cluster's executors while it waits, so those
runs are fresh processes.

Why, measured (bench/export_small.py, 2026-11-29, this 2-core machine shared with three
other sessions: 2,000 events of 200 B, Parquet, file://, local[*]; from the Celery task
called to its ExportRun finished, medians of 5):

    path                                          end to end   min - max
    --------------------------------------------  -----------  -------------
    fresh process per run (WEIR_EXPORT_DRIVER=0)  20.8 s       19.0 - 30.7 s
    warm driver, its first run (starts it)        18.9 s
    warm driver                                   1.2 s        1.1 - 1.8 s
    nothing new (no Spark either way)             2 ms

A fresh run's time goes to the process and the JVM (4.3 s), the SparkContext and session
(6.9 s) and the first jobs of a JVM (class loading, JIT, starting Spark's Python workers:
the write 12.9 s against 0.7 s warm, planning the "weir" source 6.1 s against 0.3 s,
reading the files' offsets back 3.1 s against 0.4 s); the protocol's own steps (commit
record, moves, take) take milliseconds either way. Only a process that stays up saves
that, hence a driver rather than a faster start (a JVM class-data-sharing archive would
save part of the JVM's start only). Its cost: memory while it waits, 1.2 GB proportional
(1.4 GB resident) idle with its JVM (0.7 GB) and Spark's idle Python workers, for up to
WEIR_EXPORT_DRIVER_IDLE_S.

What the fresh process guarantees, the driver keeps:

    guarantee             how
    --------------------  ----------------------------------------------------------------
    crash isolation       a job that kills its driver (kill -9, OOM, a JVM crash) ends its
                          connection without an exit status: a killed job (exit status of
                          the driver's death; what is left of its group killed), which
                          run_export handles as today; the next export starts a new
                          driver. A JVM that dies between jobs: the driver exits (it
                          watches the JVM, and looks again once a job connects), and the
                          job goes to a new driver
    the lock              the driver holds export-run.lock's descriptor (SCM_RIGHTS) until
                          its job and its Spark jobs have ended (cancelled, waited for; a
                          driver whose Spark jobs would not end dies with the lock): held
                          while the job lives, whether or not the worker does (a dead
                          worker's driver ends within half a second, its job with it)
    a timeout             counts from before the driver's start; kills the driver's process
                          group (the driver and its JVM; PySpark's Python daemon, a group
                          of its own, ends when the JVM's pipe closes): the next export
                          starts a new one
    no leak between jobs  each job gets a new session of the SparkSession (its own SQL
                          settings, views and data sources) and its own os.environ (the read
                          token), put back after it
    no orphan             the driver exits when its parent is gone (it polls getppid), and
                          after WEIR_EXPORT_DRIVER_IDLE_S without a job (900 s)
    one job at a time     a second export in the same process while the driver is busy (two
                          Celery threads) runs as a fresh process, never waits

A driver is used only by a job whose environment is the one it was started in, but for
JOB_ONLY (the read token, the crash tests' hooks): its JVM read HADOOP_CONF_DIR,
HADOOP_USER_NAME, KRB5CCNAME, SPARK_CONF_DIR... at its start, so a change of any starts a
new driver. It is replaced after WEIR_EXPORT_DRIVER_MAX_JOBS jobs too (1000).

WEIR_EXPORT_DRIVER=false: every run a fresh process, as before. manage.py export_channel
always runs a fresh process (a driver would die with the command). A driver that ends
before it starts a job (idle, a SparkSession that failed: its reason is in the worker's
log, where the driver writes its own lines and the JVM's output between jobs) is replaced
once; a new one that does so too leaves the run to a fresh process.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from django.conf import settings

from channel_engine.errors import DriverProtocolError
from channel_engine.spark.driver_protocol import (
    EXIT,
    OUTPUT,
    STARTED,
    recv_frame,
    send_request,
)

log = logging.getLogger(__name__)
JOB = "channel_engine.spark.export"
DRIVER = "channel_engine.spark.export_driver"
CONNECT_TIMEOUT_S = 30.0  # the driver's Python start, until it listens
START_TIMEOUT_S = 300.0  # its SparkSession's start, until the job's "started"
# A job's own environment variables, set per job in the driver: the rest a driver is
# started with, and one started with other values (HADOOP_CONF_DIR, KRB5CCNAME, ...)
# is not used
JOB_ONLY = frozenset({"WEIR_EXPORT_READ_TOKEN", "WEIR_EXPORT_CRASH_AT",
                      "WEIR_EXPORT_STOP_AT"})


class Job(Protocol):
    """A running export job as run_export follows it."""

    def lines(self) -> Iterator[str]:
        """Its output, line by line (each with its newline), until it ends."""

    def kill(self) -> None:
        """Kill it now (from any thread)."""

    def wait(self) -> int:
        """Its exit status (negative: the signal that killed it), once lines() ended."""


class ProcessJob:
    """The job as a process of its own, inheriting the lock's descriptor."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, lock_fd: int) -> None:
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1,
                                        env=env, pass_fds=(lock_fd,))

    def lines(self) -> Iterator[str]:
        """Its output, line by line."""
        assert self.process.stdout is not None
        yield from self.process.stdout

    def kill(self) -> None:
        """SIGKILL the process."""
        self.process.kill()

    def wait(self) -> int:
        """Its exit status."""
        return self.process.wait()

    def __enter__(self) -> ProcessJob:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for it and close its pipe (as Popen's block does)."""
        with self.process:
            pass


class WarmDriver:
    """This process's export driver: its process and socket."""

    def __init__(self, master: str, env: dict[str, str]) -> None:
        # a private directory in this container's /tmp: the var volume is shared by
        # containers whose pid namespaces differ (a pid names no driver there), and a
        # short path fits sun_path's 108 bytes
        self.folder = Path(tempfile.mkdtemp(prefix="weir-xd-"))  # 0700
        self.master, self.path, self.owner = master, self.folder / "driver.sock", os.getpid()
        self.last_job, self.jobs = time.monotonic(), 0
        self.env = fingerprint(env)  # its JVM's: HADOOP_CONF_DIR, KRB5CCNAME, ...
        self.max_jobs = settings.WEIR_EXPORT_DRIVER_MAX_JOBS
        self.process = subprocess.Popen(
            [sys.executable, "-m", DRIVER, "--socket", str(self.path), "--master", master,
             "--parent", str(os.getpid()), "--idle-s", f"{settings.WEIR_EXPORT_DRIVER_IDLE_S:g}",
             "--max-jobs", str(self.max_jobs)],
            stdin=subprocess.DEVNULL, env=self.env,
            start_new_session=True)  # its own group: kill it whole

    @property
    def pid(self) -> int:
        """The driver's pid."""
        return self.process.pid

    def usable(self, master: str, env: dict[str, str]) -> bool:
        """Alive, this process's, on `master`, started in `env` (but for the job's own
        variables), and not about to end for being idle or its jobs served."""
        idle_s = settings.WEIR_EXPORT_DRIVER_IDLE_S
        return (self.owner == os.getpid() and self.master == master and
                self.env == fingerprint(env) and self.jobs < self.max_jobs and
                self.process.poll() is None and time.monotonic() - self.last_job < idle_s - 2)

    def connect(self, deadline: float) -> socket.socket | None:
        """A connection to the driver once it listens; None when it died first, or did
        not listen by CONNECT_TIMEOUT_S or `deadline` (monotonic)."""
        deadline = min(deadline, time.monotonic() + CONNECT_TIMEOUT_S)
        while self.process.poll() is None and time.monotonic() < deadline:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(self.path))
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                time.sleep(0.05)
        return None

    def kill(self) -> None:
        """SIGKILL its process group (the JVM with it) and reap it; its directory removed."""
        if self.owner != os.getpid():  # a forked worker's copy: not its child
            return
        if self.process.returncode is None:  # not reaped: the group id is still its own
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        self.path.unlink(missing_ok=True)  # a killed driver leaves its socket file
        shutil.rmtree(self.folder, ignore_errors=True)


class DriverJob:
    """A job running in the warm driver, read from its connection."""

    def __init__(self, driver: WarmDriver, conn: socket.socket) -> None:
        self.driver, self.conn = driver, conn
        self.code: int | None = None

    def lines(self) -> Iterator[str]:
        """Its output frames cut into lines, until its exit status or the driver's end."""
        pending = b""
        while (frame := recv_frame(self.conn)) is not None:
            kind, payload = frame
            if kind == EXIT:
                self.code = int(payload)
                break
            if kind == OUTPUT:
                pending += payload
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    yield line.decode(errors="replace") + "\n"
        if pending:
            yield pending.decode(errors="replace")

    def kill(self) -> None:
        """Kill the driver's process group, the driver and its JVM (PySpark's Python
        daemon, a group of its own, ends when the JVM's pipe closes); the next export
        starts a new driver."""
        self.driver.kill()

    def wait(self) -> int:
        """The job's exit status; the driver's when it died in the job (-9: killed)."""
        if self.code is None:  # no exit status: what is left of its group is killed
            self.driver.kill()
            self.code = self.driver.process.returncode
        return self.code

    def close(self) -> None:
        """Close the connection; the driver waits for the next job."""
        self.conn.close()
        self.driver.last_job = time.monotonic()


_driver: WarmDriver | None = None
_busy = threading.Lock()  # the driver runs one job at a time


@contextmanager
def started(argv: list[str], env: dict[str, str] | None, lock_fd: int, warm: bool,
            deadline: float) -> Iterator[Job]:
    """The job of command line `argv` started: in the warm driver when `warm`, it is
    free and `argv` is python -m JOB's (module doc), else as a process. `env`: its
    environment (None: this process's); `lock_fd`: export-run.lock's descriptor, held by
    the job until it ends; `deadline` (monotonic): the run's, a driver's start within it."""
    job_args = argv[3:] if argv[:3] == [sys.executable, "-m", JOB] else None
    if warm and job_args is not None and _busy.acquire(blocking=False):
        try:
            job = _in_driver(job_args, dict(os.environ if env is None else env), lock_fd,
                             deadline)
            if job is not None:
                try:
                    yield job
                finally:
                    job.close()
                return
        finally:
            _busy.release()
    with ProcessJob(argv, env, lock_fd) as process:
        yield process


def _in_driver(args: list[str], env: dict[str, str], lock_fd: int,
               deadline: float) -> DriverJob | None:
    """The job handed to the warm driver (a new one if there is none, or it ended before
    starting it); None when a new driver ended before starting it too."""
    global _driver
    master = args[args.index("--master") + 1] if "--master" in args else ""
    if not master.startswith("local"):
        # a warm driver on spark:// or YARN would hold the cluster's executors while idle
        log.info("export driver not used: Spark master %r is not local", master)
        return None
    for _ in range(2):
        new = _driver is None or not _driver.usable(master, env)
        if new:
            stop()
            _driver = WarmDriver(master, env)
        assert _driver is not None
        job = _hand_over(_driver, args, env, lock_fd, deadline)
        if job is not None:
            return job
        log.warning("export driver %d ended before starting a job (exit %s; its reason is "
                    "in this log above)", _driver.pid, _driver.process.poll())
        stop()
        if new:
            break
    return None


def _hand_over(driver: WarmDriver, args: list[str], env: dict[str, str],
               lock_fd: int, deadline: float) -> DriverJob | None:
    """Send the job to `driver`; it, once the driver said "started", else None."""
    try:
        conn = driver.connect(deadline)
        if conn is None:
            return None
        try:
            send_request(conn, args, env, lock_fd)
            conn.settimeout(max(0.1, min(START_TIMEOUT_S, deadline - time.monotonic())))
            frame = recv_frame(conn)
            conn.settimeout(None)
        except (OSError, DriverProtocolError) as exc:
            log.warning("export driver %d: %s", driver.pid, exc)
            frame = None
    except BaseException:  # interrupted (a time limit): the job may have started
        driver.kill()
        raise
    if frame is None or frame[0] != STARTED:
        conn.close()
        return None
    driver.jobs += 1
    return DriverJob(driver, conn)


def fingerprint(env: dict[str, str]) -> dict[str, str]:
    """`env` without what is a job's own (its read token, the crash tests' hooks): what a
    driver started in it keeps for its life (its JVM's Hadoop and Kerberos settings)."""
    return {k: v for k, v in env.items() if k not in JOB_ONLY}


def driver_pid() -> int | None:
    """The pid of this process's warm driver while it lives."""
    if _driver is None or _driver.process.poll() is not None:
        return None
    return _driver.pid


def stop() -> None:
    """Kill this process's warm driver, if any (the next export starts a new one)."""
    global _driver
    if _driver is not None:
        _driver.kill()
        _driver = None


atexit.register(stop)

"""A warm export driver: one long-lived process holding a SparkSession, which runs export
jobs one at a time with the fresh job's own code (export.main), so that a small export
pays no JVM, SparkSession or Python-worker start.

    python -m channel_engine.spark.export_driver --socket PATH --master local[*] \\
        --parent PID [--idle-s 900] [--max-jobs 1000]

The appliance's export worker starts it (appliance/export_driver.py: when, reuse, kill,
restart) and hands it jobs over the Unix socket PATH (driver_protocol.py: the request, the
lock descriptor, the reply frames). For each job it:

    1. holds the job's export-run.lock descriptor (SCM_RIGHTS) until the job and its
       Spark jobs have ended (cancelAllJobs, then up to QUIESCE_S for the tasks a failed
       stage leaves running; past that it sends the exit status and dies, the lock and
       the tasks with it), as a fresh job inherits it: the lock stays held while the job
       lives, even if the worker that asked for it dies;
    2. sets os.environ to the job's environment (the read token, crash points), then
       back to its own: nothing of a job stays in the driver;
    3. runs export.main(argv) on a new session of its SparkSession (newSession: a
       SQLConf, temporary views and data sources of its own, so one job's session settings
       never reach the next; the SparkContext, JVM and Python workers are shared), the
       active session while the job runs, the driver's own again after it;
    4. sends the job's output (its stdout and stderr, and the JVM's and Python workers',
       which write to the same pipe, as in the fresh process) back as it comes, then the
       exit status main returned (an uncaught exception: its traceback, status 1).

Failure behaviour. A job that kills the driver (SIGKILL, a JVM crash, the OOM killer)
closes the connection without an exit status: the worker sees a job killed, as today. A
driver exits after --max-jobs jobs (the next gets a new one: what a JVM accumulates over
a long life goes with it; its status store keeps few finished jobs, RETAINED). A
driver whose SparkContext stopped in a job exits after it; one whose JVM died between
jobs exits at once (a watch thread polls the JVM's process), and a job that connects
before it notices is closed without "started" (the worker starts a new driver). It
exits when idle for --idle-s (a JVM holds hundreds of MB), and at once (SIGKILL to its
process group: the JVM too) when its parent is gone: it polls getppid() rather than
PR_SET_PDEATHSIG, which fires when the thread that started the child ends, and a Celery
worker's threads come and go. Its socket: the path it is given, in a directory of its
caller's (a private one); bound, never unlinked first (a path taken: exit 2), removed at
its exit; a connection from another uid is refused (SO_PEERCRED).
The JVM also ends when the driver does (PySpark's gateway exits at EOF on its stdin).

Concurrency contract: one job at a time, on the main thread; a second connection waits in
the listen backlog until the job before has ended.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from channel_engine.errors import DriverProtocolError
from channel_engine.spark.driver_protocol import (
    EXIT,
    OUTPUT,
    STARTED,
    recv_request,
    send_frame,
)

# Written to the pipe once a job's output is flushed: the pump's sign that the job's
# output has all been sent (a NUL starts no line a job or the JVM prints)
END_MARK = b"\x00weir-export-driver: end of job\n"
PARENT_POLL_S = 0.5
QUIESCE_S = 30.0  # a job's cancelled Spark jobs end within this, or the driver exits
# What its status store keeps of finished jobs, low: a driver lives for many jobs, and
# write_progress.rows_written walks executionsList() for the running one
RETAINED = {"spark.sql.ui.retainedExecutions": "20", "spark.ui.retainedJobs": "50",
            "spark.ui.retainedStages": "50", "spark.ui.retainedTasks": "1000"}
REQUEST_TIMEOUT_S = 10.0  # a request comes whole at once, or never
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class OutputPump:
    """The process's stdout and stderr made one pipe (before the JVM starts, so that it
    and its Python workers inherit it), read by a thread: sent to the running job's
    connection as output frames, else written to the driver's own log (the stderr it
    was started with)."""

    def __init__(self) -> None:
        self.log_fd = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self.read_fd = read_fd
        self.lock = threading.Lock()
        self.conn: socket.socket | None = None
        self.ended = threading.Event()
        threading.Thread(target=self._pump, name="output-pump", daemon=True).start()

    def log(self, line: str) -> None:
        """A line of the driver's own in its log."""
        os.write(self.log_fd, f"export driver {os.getpid()}: {line}\n".encode())

    @contextmanager
    def to(self, conn: socket.socket) -> Iterator[None]:
        """Send the pipe's output to `conn` while the block runs (a job), up to the end
        mark written when it ends."""
        with self.lock:
            self.conn, self.ended = conn, threading.Event()
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(1, END_MARK)
            # until the mark has passed, however long: the report line is before it, and a
            # mark left in the pipe would cut the next job's output. A live connection's
            # send is bounded by the worker's timeout (it kills the driver); a gone one's
            # output goes to the log
            self.ended.wait()

    def _pump(self) -> None:
        pending = b""
        while chunk := os.read(self.read_fd, 65536):
            pending += chunk
            with self.lock:
                at = pending.find(END_MARK)
                if at >= 0:
                    self._emit(pending[:at])
                    pending = pending[at + len(END_MARK):]
                    self.conn = None
                    self.ended.set()
                keep = self._maybe_mark(pending) if self.conn is not None else 0
                self._emit(pending[:len(pending) - keep])
                pending = pending[len(pending) - keep:]

    @staticmethod
    def _maybe_mark(data: bytes) -> int:
        """How many bytes at the end of `data` may be the start of the end mark."""
        at = data.rfind(END_MARK[:1])
        return len(data) - at if at >= 0 and END_MARK.startswith(data[at:]) else 0

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        if self.conn is not None:
            try:
                send_frame(self.conn, OUTPUT, data)
                return
            except OSError:  # the worker is gone: the job goes on, its output to the log
                self.conn = None
        os.write(self.log_fd, data)


class Driver:
    """The driver's SparkSession and the jobs it runs."""

    def __init__(self, spark: Any, master: str, pump: OutputPump | None) -> None:
        self.spark, self.master, self.pump = spark, master, pump
        self.busy = False  # a connection accepted: the JVM watch leaves it to the job

    @contextmanager
    def session(self, master: str | None) -> Iterator[Any]:
        """export.main's sessions: a new session of the driver's for each job."""
        if master != self.master:  # the appliance starts a driver per master
            raise ValueError(f"this export driver runs Spark on {self.master}, not {master}")
        spark = self.spark.newSession()
        spark.conf.set("spark.sql.session.timeZone", "UTC")  # as spark_session's
        # the active one while the job runs (code that asks for the active session gets
        # the job's), then the driver's again: a job's session never outlives its job
        # (createDataFrame makes its session the active one)
        activate(spark)
        try:
            yield spark
        finally:
            activate(self.spark)

    def serve(self, conn: socket.socket) -> bool:
        """Run the job `conn` asks for, holding its lock descriptor until its Spark jobs
        have all ended; False when they would not end (the driver must exit)."""
        assert self.pump is not None
        uid = peer_uid(conn)
        if uid != os.getuid():  # the socket's directory is 0700: defence in depth
            self.pump.log(f"refused a request from uid {uid}")
            return True
        try:
            request, lock_fd = recv_request(conn, REQUEST_TIMEOUT_S)
        except (DriverProtocolError, ValueError, OSError) as exc:
            self.pump.log(f"refused a request: {exc}")
            return True
        conn.settimeout(None)
        os.set_inheritable(lock_fd, False)  # never into the JVM or its workers
        code, settled = None, True
        try:
            send_frame(conn, STARTED, str(os.getpid()).encode())
            with self.pump.to(conn):
                code = self._job([str(a) for a in request["argv"]],
                                 {str(k): str(v) for k, v in request["env"].items()})
        except OSError:  # the worker left before its job started: nothing ran
            pass
        finally:
            settled = self.quiesce(QUIESCE_S)
            if settled:  # else the lock goes with the driver's death, after its tasks'
                os.close(lock_fd)
        if code is not None:
            try:
                send_frame(conn, EXIT, str(code).encode())
            except OSError:
                self.pump.log(f"a job ended (status {code}) after its worker left")
        return settled

    def _job(self, argv: list[str], env: dict[str, str]) -> int:
        """export.main(argv) in the job's environment; its exit status."""
        from channel_engine.spark.export import main

        own = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            return main(argv, self.session)
        except SystemExit as exc:  # argparse's refusal: its message is out already
            if exc.code is None or isinstance(exc.code, int):
                return exc.code or 0
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException:  # noqa: BLE001 -- as an uncaught exception ends the fresh job
            traceback.print_exc()
            return 1
        finally:
            os.environ.clear()
            os.environ.update(own)

    def quiesce(self, bound_s: float) -> bool:
        """Cancel the Spark jobs still running (a failed write's other tasks end
        asynchronously) and wait up to `bound_s` until none is; whether none is."""
        deadline = time.monotonic() + bound_s
        try:
            context = self.spark.sparkContext
            context.cancelAllJobs()
            while context.statusTracker().getActiveJobsIds():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
            return True
        except Exception:  # noqa: BLE001 -- no JVM to ask: its tasks died with it
            return not self.jvm_alive()

    def jvm_alive(self) -> bool:
        """Whether the JVM process of the session still runs."""
        gateway = getattr(self.spark.sparkContext, "_gateway", None)
        process = getattr(gateway, "proc", None)
        return process is None or process.poll() is None

    def healthy(self) -> bool:
        """Whether the SparkContext still runs (a job may have stopped it, or its JVM)."""
        if not self.jvm_alive():
            return False
        try:
            return not self.spark.sparkContext._jsc.sc().isStopped()  # noqa: SLF001
        except Exception:  # noqa: BLE001 -- the JVM is gone
            return False


def activate(spark: Any) -> None:
    """Make `spark` this thread's active SparkSession, in Python and in the JVM."""
    spark_class = type(spark)
    spark_class._activeSession = spark  # noqa: SLF001 -- as createDataFrame does
    spark_class._get_j_spark_session_class(spark._jvm).setActiveSession(  # noqa: SLF001
        spark._jsparkSession)  # noqa: SLF001


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of `conn` (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
    return int(PEERCRED.unpack(creds)[1])


def watch(parent: int, pump: OutputPump, path: Path, driver: list[Driver]) -> None:
    """End the driver and its process group (the JVM) once `parent` is gone, or its JVM
    while it waits for a job (`driver`: the Driver once its session started); its socket
    file (`path`) removed first."""
    def watching() -> None:
        while True:
            if os.getppid() != parent:
                pump.log(f"its worker (pid {parent}) is gone: exiting")
                break
            if driver and not driver[0].busy and not driver[0].jvm_alive():
                pump.log("its JVM is gone: exiting")
                break
            time.sleep(PARENT_POLL_S)
        path.unlink(missing_ok=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watching, name="watch", daemon=True).start()


def listen(path: Path) -> socket.socket:
    """The listening socket at `path` (0600); OSError when the path is taken (never
    another driver's socket unlinked)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket 0600: jobs carry the read token
    try:
        listener.bind(str(path))
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(old)
    listener.listen(8)
    return listener


def serve_until_idle(driver: Driver, listener: socket.socket, idle_s: float,
                     max_jobs: int) -> bool:
    """Serve jobs until idle for `idle_s`, `max_jobs` were served (a new driver then: what
    a JVM accumulates goes with it) or the JVM is gone; False when a job's Spark jobs
    would not end (the driver must die, its tasks with it)."""
    assert driver.pump is not None
    listener.settimeout(idle_s)
    for _ in range(max_jobs):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            driver.pump.log(f"idle for {idle_s:g} s: exiting")
            return True
        with conn:
            driver.busy = True
            if not driver.healthy():  # closed without "S": the worker starts a new driver
                return True
            conn.settimeout(None)
            settled = driver.serve(conn)
            driver.busy = False
        if not settled:
            driver.pump.log(f"a job's Spark jobs still ran {QUIESCE_S:g} s after it ended: "
                            f"exiting, its tasks with it")
            return False
        if not driver.healthy():
            return True
    driver.pump.log(f"{max_jobs} jobs served: exiting")
    return True


def main(argv: list[str] | None = None) -> int:
    """Start the session, then serve jobs until idle for --idle-s."""
    parser = argparse.ArgumentParser(description="A warm Spark driver for Weir's exports.")
    parser.add_argument("--socket", required=True,
                        help="the Unix socket to listen on, in a directory of its own")
    parser.add_argument("--master", required=True, help="the Spark master of every job")
    parser.add_argument("--parent", type=int, required=True, help="exit once it is gone")
    parser.add_argument("--idle-s", type=float, default=900.0,
                        help="exit after this long without a job")
    parser.add_argument("--max-jobs", type=int, default=1000,
                        help="exit after this many jobs")
    args = parser.parse_args(argv)
    pump = OutputPump()
    path = Path(args.socket)
    if os.getpgrp() != os.getpid():  # the watch kills the group: it must be ours
        os.setpgid(0, 0)
    try:
        listener = listen(path)  # before the session starts: the first job waits for it
    except OSError as exc:
        pump.log(f"cannot listen on {path}: {exc}")
        return 2
    found: list[Driver] = []
    watch(args.parent, pump, path, found)
    try:
        started = time.monotonic()
        from channel_engine.spark.export import spark_session

        found.append(Driver(spark_session(args.master, RETAINED), args.master, pump))
        pump.log(f"SparkSession on {args.master} started in "
                 f"{time.monotonic() - started:.1f} s; listening on {path}")
        settled = serve_until_idle(found[0], listener, args.idle_s, args.max_jobs)
    finally:
        path.unlink(missing_ok=True)
        listener.close()
    if not settled:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if found[0].healthy():
        found[0].spark.stop()
        return 0
    pump.log("its SparkContext or JVM stopped: exiting")
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""The log writer: one process, started by the supervisor (scripts/supervisor.py) before any
child, that reads every child's stdout/stderr pipe and writes it to the child's rotated log
(scripts/log_rotation.py: a PipeLog thread per pipe). It runs in a session of its own and
without the supervisor's death signal, so it outlives a supervisor killed with SIGKILL:
the children then get SIGTERM from the kernel, and what they write while they stop (gunicorn's
graceful stop, a Celery warm shutdown waiting for an export, their tracebacks) still reaches
their logs. It exits once the supervisor has closed its end of the control socket (or is
gone) and every pipe has ended (every process holding its write end, grandchildren too,
gone).

The control socket: a unix SOCK_SEQPACKET socket pair (messages keep their bounds; fds
pass with SCM_RIGHTS), the writer's end passed as an inherited fd (`--control FD`).

    supervisor -> writer   "<name>\\0<log path>", fds [pipe read end, log fd]: a child's
                           pipe and its log, opened by the supervisor (so it knows it can
                           before starting the child); the writer owns both from then on
    writer -> supervisor   b"L<name>\\0<line>"  a line of the child `name` (only with
                           --follow, for the foreground view; cut at VIEW_LINE_MAX bytes)
                           b"D<count>"          that many lines were not sent: the
                                                supervisor was behind (never waited for)
                           b"E<name>"           the pipe of `name` ended and its last line
                                                is written (waited for up to END_WAIT_S)

The writer's own errors go to its stderr (the supervisor gives it supervisor.log).
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scripts.log_rotation import PipeLog, RotatingLog, Rotation

VIEW_LINE_MAX = 4096  # bytes of a line shown in the foreground view (the log keeps all)
END_WAIT_S = 5.0  # how long an "ended" message may wait for a supervisor that is behind
MESSAGE_MAX = VIEW_LINE_MAX + 512  # room for the kind and the name


class Control:
    """The writer's end of the control socket: never blocks a PipeLog thread for a line
    (a stalled supervisor costs the view lines, never the logs). Thread-safe."""

    def __init__(self, fd: int, follow: bool) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self.follow = follow
        self.unsent = 0  # lines not sent since the last one that was
        self.lock = threading.Lock()  # for `unsent` (a message is sent whole or not at all)

    def receive(self) -> tuple[bytes, list[int]]:
        """The next message from the supervisor (b"" once it is gone) and its fds."""
        while True:
            select.select([self.sock], [], [])
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_MAX, 2)
            except BlockingIOError:
                continue
            except OSError:
                return b"", []
            return data, fds

    def line_sender(self, name: str) -> Callable[[bytes], None] | None:
        """What the PipeLog of `name` hands each line to (None: not following)."""
        if not self.follow:
            return None
        head = b"L" + name.encode() + b"\0"
        return lambda line: self._send_line(head + line[:VIEW_LINE_MAX])

    def _send_line(self, message: bytes) -> None:
        with self.lock:
            if self.unsent and self._send(f"D{self.unsent}".encode(), 0):
                self.unsent = 0
            if self.unsent or not self._send(message, 0):
                self.unsent += 1

    def ended(self, name: str) -> None:
        """Tell the supervisor that the last line of `name` is written."""
        self._send(b"E" + name.encode(), END_WAIT_S)  # no lock: the others' lines go on

    def _send(self, message: bytes, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.sock.send(message)
                return True
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                select.select([], [self.sock], [], left)
            except OSError:  # the supervisor is gone: nobody to tell
                return False


def serve(control: Control, rotation: Rotation) -> None:
    """Take pipes until the supervisor is done, then write them all to their end."""
    pipes: list[PipeLog] = []
    while True:
        data, fds = control.receive()
        if not data:
            break
        if len(fds) != 2:  # not ours (no such message is sent): nothing to write
            for fd in fds:
                os.close(fd)
            continue
        name, _, path = data.decode().partition("\0")
        pipe_fd, log_fd = fds
        pipes.append(PipeLog(pipe_fd, RotatingLog(Path(path), rotation, log_fd),
                             control.line_sender(name), lambda name=name: control.ended(name)))
    for pipe in pipes:
        pipe.join(None)


def main(argv: list[str] | None = None) -> int:
    """`python -m scripts.log_writer --control FD ...`: run by LogWriter only."""
    parser = argparse.ArgumentParser(prog="python -m scripts.log_writer")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--max-bytes", type=int, default=Rotation.max_bytes)
    parser.add_argument("--backups", type=int, default=Rotation.backups)
    parser.add_argument("--follow", action="store_true")
    args = parser.parse_args(argv)
    # It ends by itself once every pipe has ended: a SIGTERM sent to every process (a
    # service manager stopping them all) must not cut off the lines the children write
    # while they stop. SIGKILL still ends it.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    serve(Control(args.control, args.follow), Rotation(args.max_bytes, args.backups))
    return 0


class Written:
    """Set once the writer has written a child's last line (its pipe ended)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def join(self, timeout_s: float) -> bool:
        """Wait until it is set (or timeout_s passes); True when it is."""
        return self.event.wait(timeout_s)


class LogWriter:
    """The supervisor's end: starts the writer process, hands it each child's pipe and log,
    and reads back its lines (for `on_line(name, line)`) and the ends of the pipes. Call
    add() from one thread; the reading runs in a thread of its own."""

    def __init__(self, rotation: Rotation, output_fd: int,
                 on_line: Callable[[str, bytes], None] | None = None,
                 on_unsent: Callable[[int], None] | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "scripts.log_writer", "--control", str(theirs.fileno()),
                "--max-bytes", str(rotation.max_bytes), "--backups", str(rotation.backups)]
        # Its own session and no death signal: it must outlive a killed supervisor.
        self.process = subprocess.Popen(
            [*argv, *(["--follow"] if on_line else [])], cwd=Path(__file__).parent.parent,
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=output_fd,
            stderr=subprocess.STDOUT, start_new_session=True)
        theirs.close()
        self.sock = ours
        self.on_line, self.on_unsent = on_line, on_unsent
        self.written: dict[str, Written] = {}
        self.thread = threading.Thread(target=self._read, name="log writer", daemon=True)
        self.thread.start()

    def add(self, name: str, path: Path, pipe_fd: int, log_fd: int) -> Written:
        """Hand over the read end of `name`'s pipe and its open log (the caller then
        closes both); OSError when the writer is gone."""
        written = self.written[name] = Written()
        socket.send_fds(self.sock, [f"{name}\0{path}".encode()], [pipe_fd, log_fd])
        return written

    def _read(self) -> None:
        while message := self._receive():
            kind, body = message[:1], message[1:]
            if kind == b"L" and self.on_line is not None:
                name, _, line = body.partition(b"\0")
                self.on_line(name.decode(), line)
            elif kind == b"D" and self.on_unsent is not None:
                self.on_unsent(int(body))
            elif kind == b"E" and body.decode() in self.written:
                self.written[body.decode()].event.set()
        for written in list(self.written.values()):  # the writer is gone: nothing comes
            written.event.set()

    def _receive(self) -> bytes:
        try:
            return self.sock.recv(MESSAGE_MAX)
        except OSError:
            return b""

    def close(self, timeout_s: float) -> None:
        """No more pipes: the writer exits once those it has end; wait up to timeout_s."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass  # a grandchild still holds a pipe: the writer stays for its lines


if __name__ == "__main__":
    sys.exit(main())

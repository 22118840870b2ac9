"""A child process whose stdout is read line by line on a thread, for the kill -9 tests:
a line counts only when printed whole (the kill may cut the last one); and the child's
script imported into the test (load_script) for its shared definitions.

The child's side, for the scripts (channel_worker.py, crash_writer.py): Output prints
whole lines, freeze() announces a stop and waits for the kill, nth_call() says when a
stop hook's moment has come."""
from __future__ import annotations

import importlib.util
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


class Output:
    """Whole lines to stdout, one write and flush each, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def freeze(out: Output, phase: str) -> None:
    """Announce the stop and wait for the parent's SIGKILL (never returns)."""
    out.line(f"STOP {phase}")
    while True:
        time.sleep(3600)


def nth_call(at: int) -> Callable[[], bool]:
    """A check, safe from any thread, that is true at its `at`-th call only."""
    calls = itertools.count(1)
    lock = threading.Lock()

    def due() -> bool:
        with lock:
            return next(calls) == at
    return due


def load_script(path: Path, name: str) -> ModuleType:
    """A child's script (not a package module) imported under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ChildLines:
    """Start reading `proc`'s stdout; `lines` grows as the child prints."""

    def _start_reading(self, proc: subprocess.Popen[str], wait_s: float) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._wait_s = wait_s
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # a line cut by the kill was never printed whole
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, done: Callable[[list[str]], bool], timeout: float | None = None) -> bool:
        """Wait until done(lines), the child exits or the timeout passes; return done()."""
        deadline = time.monotonic() + (self._wait_s if timeout is None else timeout)
        with self._changed:
            while not done(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return done(self.lines)
                self._changed.wait(min(left, 0.5))
        return True

    def _kill(self) -> int:
        """SIGKILL the child (if still running), reap it and read what was left in the
        pipe; its exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:  # pragma: no cover - only if wait() timed out
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()

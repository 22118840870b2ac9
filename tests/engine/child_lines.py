"""A child process whose stdout is read line by line on a thread, for the kill -9 tests:
a line counts only when printed whole (the kill may cut the last one); and the child's
script imported into the test (load_script) for its shared definitions."""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


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

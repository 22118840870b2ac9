"""A child process whose stdout is read line by line on a thread, for the kill -9 tests:
a line counts only when printed whole (the kill may cut the last one)."""
from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable


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

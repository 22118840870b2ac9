"""FlushSlot: one thread at a time flushes or closes a partition log's files, and the
committers waiting for that flush are woken only when it can matter to them.

Group commit (log_flush.py) has one leader fsync everything written so far while the
other committers wait. A threading.Condition with notify_all wakes every waiter after
each flush; most of them arrived during the fsync, wrote after the leader looked at the
log's end, are not covered by it, and go back to sleep. Each such wake is a futex call
made holding the GIL, a context switch and a fight for the GIL (bench/README.md,
owner_rtt.py: 30 % of the owner's GIL samples were in Condition.notify). Here a
releasing thread wakes:

  * every waiter whose wait is over (its `done` check is true, or raises: a truncation
    or the log going offline, which the waiter reports);
  * and the oldest of the others, to take the slot and lead the next flush: the rest
    wrote before it takes the slot, so that flush covers them.

A waiter woken to lead that leaves without taking the slot (its own wait was over, or
failed) passes the turn on (wakes the oldest waiter left), so no waiter is left asleep
while the slot is free; a waiter woken because it was covered leaves without waking
anyone. Maintenance (truncation, close, checkpoint of the recovery
point, deleting files) waits for the slot itself (`done` None), as the next leader
does.

Concurrency: every field is guarded by the slot's own lock, taken under no other lock of
the log's and never held across a `done` check's caller's I/O; `done` runs under it,
so it must only read the log's state.
"""
from __future__ import annotations

import threading
from collections.abc import Callable


class _Waiter:
    """A thread asleep until the slot's holder wakes it."""

    __slots__ = ("done", "lead", "wake")

    def __init__(self, done: Callable[[], bool] | None) -> None:
        self.done = done  # None: waits for the slot itself
        self.lead = False  # woken to take the slot: passes the turn on if it does not
        self.wake = threading.Lock()
        self.wake.acquire()


class FlushSlot:
    """The flush slot of one partition log (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = False
        self._waiting: list[_Waiter] = []  # oldest first

    def take(self, done: Callable[[], bool] | None = None) -> bool:
        """Take the slot and return True, or return False as soon as `done()` is true
        (evaluated under the slot's lock, first and after each wake; what it raises is
        raised here)."""
        with self._lock:
            waiter: _Waiter | None = None  # the last sleep's
            while True:
                try:
                    if done is not None and done():
                        if waiter is not None and waiter.lead:
                            self._pass_turn()
                        return False
                except BaseException:
                    if waiter is not None and waiter.lead:
                        self._pass_turn()
                    raise
                if not self.taken:
                    self.taken = True
                    return True
                waiter = _Waiter(done)
                self._sleep(waiter)

    def _sleep(self, waiter: _Waiter) -> None:
        """Wait to be woken by a release. Caller holds the lock; it is let go meanwhile."""
        self._waiting.append(waiter)
        self._lock.release()
        try:
            waiter.wake.acquire()
        except BaseException:  # interrupted asleep: never left in the list to lead
            with self._lock:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                else:
                    self._pass_turn()
            raise
        finally:
            self._lock.acquire()

    def release(self) -> None:
        """Give the slot back: wake the waiters whose wait is over and the oldest other."""
        with self._lock:
            self.taken = False
            waiting = self._waiting
            if not waiting:
                return
            woken, kept, leader = [], [], None
            for waiter in waiting:
                if waiter.done is not None and _over(waiter.done):
                    woken.append(waiter)
                elif leader is None:
                    leader = waiter
                    leader.lead = True
                    woken.append(waiter)
                else:
                    kept.append(waiter)
            self._waiting = kept
        for waiter in woken:
            waiter.wake.release()

    def _pass_turn(self) -> None:
        """A thread leaving without the slot: if the slot is free, wake the oldest waiter
        (it may have been woken to lead and left). Caller holds the lock."""
        if not self.taken and self._waiting:
            leader = self._waiting.pop(0)
            leader.lead = True
            leader.wake.release()


def _over(done: Callable[[], bool]) -> bool:
    """Whether a waiter's wait is over: done, or failed (it raises it when it runs)."""
    try:
        return done()
    except Exception:
        return True

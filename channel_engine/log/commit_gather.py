"""CommitGather: a group commit leader waits briefly for a committer that takes turns with it.

Group commit (log_flush.py) lets an fsync serve every batch written before it starts.
Two committers that alternate fall into step the wrong way, though: A's fsync runs
while B builds its next batch, B's while A builds its own, so every fsync carries one
batch. Measured with two producing processes (the owner and a client over owner.sock,
batches of 100 events, fsync durability): 0.8 fsyncs per put, and the two together no
faster than one alone; the owner's thread serving the client spent 69% of its time
waiting for a flush that did not carry its batch.

The rule (PostgreSQL's commit_delay with commit_siblings, made adaptive): when appends
to this log came from more than one thread within the last SIBLINGS_SECONDS, a leader
about to fsync waits up to GATHER_SECONDS for another append after its own, then
fsyncs them together. The two committers then return together and meet again at the
next fsync. One committer (one thread appending) never waits; once the others stop,
a leader waits at most GATHER_SECONDS per commit for SIBLINGS_SECONDS.

Durability is unchanged: a commit still returns only after an fsync that began after
its batch was written; only when that fsync starts moves, by at most GATHER_SECONDS.

Concurrency: note_append runs under the log's lock (the appender's); wake after it,
outside it; wait in the flush leader holding the flush slot, inside `cond` (whose
wait releases it, so committers can reach make_durable and queue behind the leader).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

GATHER_SECONDS = 0.0005
NOOP = 1  # the longest a leader waits for another append (a batch's build)
SIBLINGS_SECONDS = 0.01  # appends from two threads this recent: committers take turns


class CommitGather:
    """Who appended last, and the leader's wait for a sibling's append (module doc)."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond  # the log's flush_cond: leaders wait on it, appends wake them
        self._last_thread = 0
        self._alternated_at = -SIBLINGS_SECONDS  # when a thread appended after another
        self._gathering = False

    def note_append(self) -> None:
        """An append was written by this thread. Caller holds the log's lock."""
        me = threading.get_ident()
        if me != self._last_thread:
            if self._last_thread:  # the first append follows nobody's
                self._alternated_at = time.monotonic()
            self._last_thread = me

    def wake(self) -> None:
        """After an append, outside the log's lock: wake a leader waiting for it."""
        if self._gathering:
            with self._cond:
                self._cond.notify_all()

    def wait(self, arrived: Callable[[], bool]) -> None:
        """The leader, about to fsync (holding `cond`): if committers take turns, wait until
        arrived() (another append, or a reason to stop) or GATHER_SECONDS passed."""
        now = time.monotonic()
        if now - self._alternated_at > SIBLINGS_SECONDS or arrived():
            return
        deadline = now + GATHER_SECONDS
        self._gathering = True
        try:
            while not arrived():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)
        finally:
            self._gathering = False

"""PutPlacement: the owner's choice of partition for a movable put, so that concurrent puts
share one fsync.

Why: a keyless put goes to one partition its producer picks round-robin (put_batch.py),
and group commit is per partition log (log/log_flush.py). With 3 partitions, concurrent
1-event puts from several web workers spread over 3 logs and each log's fsync carried
about one put: one fdatasync (~290 us of system CPU here) a request
(bench/http_small.py). Appended to the same log, the puts that arrive while its fsync
runs all share the next one.

The rule (Kafka's uniform sticky partitioner, KIP-794, with the log's committers in
place of the producer's batch): a movable put goes to the sticky partition while
another movable put placed there has not finished (committers are known to be on their way to
its fsync), the put fits in what is left of its STICKY_BYTES, and the partition is
usable (below); otherwise its producer's own pick becomes the sticky partition. So puts
that come one at a time keep their producer's round-robin order, and under concurrency
the sticky partition moves on every STICKY_BYTES, which keeps the partitions even (each
move costs at most one fsync more). A put with a key, or one across partitions, is never
moved (the owner checks the records of a put it would move: a client's flag is not
trusted with a key's order), and in policy durability none is (a put returns before any
fsync: there is none to share, and the producer's round-robin keeps the partitions even).

Partitions fail one by one (they are spread over data_dirs): a put never moves to a
partition the owner's `usable` check refuses (its log offline, or on the data dir of the
last DiskFullError), and a failed put drops the stickiness of its partition, so healthy
puts are not drawn to a failing one. A put larger than what is left of the sticky
partition's STICKY_BYTES stays where its producer put it, the stickiness unchanged: a
large batch would delay the small puts sharing its fsync.

Concurrency: thread-safe (its own lock, taken under no other lock of the channel's).
"""
from __future__ import annotations

import threading
from collections.abc import Callable

STICKY_BYTES = 16384  # Kafka's batch.size: how much one partition takes before moving on


class PutPlacement:
    """Where the owner appends movable puts (see the module doc)."""

    def __init__(self, partitions: int,
                 usable: Callable[[int], bool] = lambda _partition: True) -> None:
        self._usable = usable  # may a put be moved to this partition (module doc)
        self._lock = threading.Lock()
        # movable puts placed here and not finished, per partition: a keyed or multi-partition
        # put in flight does not count (it may be waiting for no fsync at all, or past it)
        self._in_flight = [0] * partitions
        self._sticky: int | None = None
        self._sticky_bytes = 0

    def place(self, wanted: int, size: int) -> int:
        """The partition for a movable put of `size` bytes its producer put in `wanted`;
        the caller calls finished() with it once the put is done (or failed)."""
        with self._lock:
            partition = self._sticky
            if partition is None or not self._in_flight[partition] or \
                    self._sticky_bytes >= STICKY_BYTES or not self._usable(partition):
                partition = wanted
                self._sticky = wanted if self._usable(wanted) else None
                self._sticky_bytes = size
            elif size <= STICKY_BYTES - self._sticky_bytes:
                self._sticky_bytes += size
            else:  # too large to share the sticky fsync: where it was put, stickiness kept
                partition = wanted
            self._in_flight[partition] += 1
            return partition

    def finished(self, partition: int, failed: bool = False) -> None:
        """A put place() placed in `partition` is done; `failed`: it raised, and no more
        puts are drawn to that partition."""
        with self._lock:
            self._in_flight[partition] -= 1
            if failed and self._sticky == partition:
                self._sticky = None

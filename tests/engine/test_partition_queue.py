"""PartitionQueue against a model that tracks every offset by itself."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from channel_engine.queue.partition_queue import PartitionQueue


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = PartitionQueue()
        self.log_end = 0
        self.frontier = 0  # model: first offset never reserved
        self.returned: set[int] = set()
        self.committed: set[int] = set()
        self.takes: dict[int, list[int]] = {}
        self.next_take = 1

    @rule(n=st.integers(1, 50))
    def put(self, n: int) -> None:
        self.log_end += n

    @rule(n=st.integers(1, 40))
    def take(self, n: int) -> None:
        expected = sorted(self.returned)[:n]
        fresh = list(range(self.frontier, min(self.log_end, self.frontier + n - len(expected))))
        expected += fresh
        take_id, self.next_take = self.next_take, self.next_take + 1
        ranges = self.queue.reserve(take_id, n, self.log_end)
        got = [o for start, end in ranges for o in range(start, end)]
        assert got == expected
        self.returned -= set(got)
        self.frontier += len(fresh)
        if got:
            self.takes[take_id] = got

    @precondition(lambda self: self.takes)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        take_id = data.draw(st.sampled_from(sorted(self.takes)))
        assert self.queue.commit(take_id) == len(self.takes[take_id])
        self.committed |= set(self.takes.pop(take_id))

    @precondition(lambda self: self.takes)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        take_id = data.draw(st.sampled_from(sorted(self.takes)))
        assert self.queue.rollback(take_id) == len(self.takes[take_id])
        self.returned |= set(self.takes.pop(take_id))

    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        """The log can no longer deliver a range: it leaves every state, counted if untaken."""
        start = data.draw(st.integers(0, self.log_end))
        end = data.draw(st.integers(start, self.log_end))
        offsets = set(range(start, end))
        expected = len(offsets - self.committed)
        assert self.queue.mark_lost(start, end) == expected
        self.committed |= offsets
        self.returned -= offsets
        if end > self.frontier:
            self.returned |= set(range(self.frontier, start))
            self.frontier = end
        for take_id, taken in self.takes.items():
            self.takes[take_id] = [o for o in taken if o not in offsets]

    @rule()
    def restart(self) -> None:
        """Checkpoint and restore: what was in flight comes back to the queue."""
        saved = self.queue.to_checkpoint(0, self.log_end, self.log_end)
        self.queue = PartitionQueue.from_checkpoint(saved)
        for offsets in self.takes.values():
            self.returned |= set(offsets)
        self.takes.clear()

    @invariant()
    def counts_agree(self) -> None:
        in_flight = sum(len(o) for o in self.takes.values())
        queued = len(self.returned) + (self.log_end - self.frontier)
        assert self.queue.queued(self.log_end) == queued
        assert self.queue.in_flight_events() == in_flight
        assert self.queue.untaken(self.log_end) == self.log_end - len(self.committed)
        head = next(o for o in range(self.log_end + 1) if o not in self.committed)
        assert self.queue.taken_through == head

    @invariant()
    def state_stays_small(self) -> None:
        assert len(self.queue.committed) <= len(self.committed)
        ranges = self.queue.committed
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))


TestPartitionQueue = QueueMachine.TestCase
TestPartitionQueue.settings = settings(max_examples=150, stateful_step_count=40,
                                       deadline=None)


def test_a_rolled_back_take_is_served_again_first_and_in_order() -> None:
    queue = PartitionQueue()
    assert queue.reserve(1, 3, 10) == [(0, 3)]
    assert queue.reserve(2, 3, 10) == [(3, 6)]
    queue.rollback(1)
    assert queue.reserve(3, 5, 10) == [(0, 3), (6, 8)]


def test_an_out_of_order_commit_waits_for_the_head() -> None:
    queue = PartitionQueue()
    queue.reserve(1, 3, 10)
    queue.reserve(2, 3, 10)
    queue.commit(2)
    assert queue.taken_through == 0 and queue.committed == [(3, 6)]
    queue.commit(1)
    assert queue.taken_through == 6 and queue.committed == []


def test_skip_to_drops_what_retention_deleted() -> None:
    queue = PartitionQueue()
    queue.reserve(1, 4, 10)
    queue.rollback(1)
    queue.skip_to(2)
    assert queue.taken_through == 2 and queue.reserve(2, 10, 10) == [(2, 4), (4, 10)]


def test_it_takes_lost_offsets_out_of_every_state_and_counts_the_untaken() -> None:
    queue = PartitionQueue()
    queue.reserve(1, 4, 20)          # [0, 4) in flight
    queue.commit(1)                  # taken through 4
    queue.reserve(2, 4, 20)          # [4, 8) in flight
    queue.reserve(3, 2, 20)          # [8, 10) in flight
    queue.rollback(3)                # [8, 10) returned
    queue.reserve(4, 2, 20)          # [8, 10) in flight again
    queue.commit(4)                  # [8, 10) committed out of order
    assert queue.mark_lost(2, 12) == 6  # 4..7 in flight, 10, 11 queued; the rest taken
    assert queue.in_flight[2] == [] and queue.in_flight_events() == 0
    assert queue.taken_through == 12 and queue.committed == []
    assert queue.queued(20) == 8 and queue.untaken(20) == 8
    assert queue.commit(2) == 0      # the take never marks taken what it did not return
    assert queue.reserve(5, 100, 20) == [(12, 20)]


def test_it_returns_what_lies_below_a_lost_range_beyond_the_frontier() -> None:
    queue = PartitionQueue()
    queue.reserve(1, 2, 20)
    assert queue.mark_lost(5, 8) == 3
    assert queue.reserve(2, 100, 20) == [(2, 5), (8, 20)]
    assert queue.mark_lost(5, 8) == 0  # reported again: counted once


def test_clip_to_counts_untaken_offsets_beyond_the_log_end_not_taken_ones() -> None:
    queue = PartitionQueue()
    queue.reserve(1, 10, 10)
    queue.commit(1)                  # 0..9 taken
    queue.reserve(2, 5, 20)          # 10..14 in flight
    queue.reserve(3, 5, 20)          # 15..19 in flight
    queue.commit(3)                  # 15..19 committed out of order
    assert queue.known_end == 20
    assert queue.clip_to(8) == 5     # only 10..14 were untaken
    assert queue.known_end == 8 and queue.untaken(8) == 0

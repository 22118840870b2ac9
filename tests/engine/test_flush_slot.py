"""FlushSlot (channel_engine/log/flush_slot.py): who a release wakes, and that no waiter is
ever left asleep while the slot is free."""
from __future__ import annotations

import random
import threading
import time

import pytest

from channel_engine.log.flush_slot import FlushSlot

TIMEOUT = 10.0


def start(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def wait_until(predicate, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_it_gives_the_slot_at_once_when_free_and_not_when_done():
    slot = FlushSlot()
    assert slot.take(lambda: True) is False  # done: the slot is not needed
    assert slot.taken is False
    assert slot.take(lambda: False) is True
    assert slot.taken is True
    slot.release()
    assert slot.taken is False


def test_it_wakes_only_the_covered_waiters_and_one_to_lead():
    slot = FlushSlot()
    slot.take()
    durable = [0]  # what the holder's "fsync" covered
    events: list[str] = []
    lock = threading.Lock()

    def committer(name: str, end: int) -> None:
        took = slot.take(lambda: durable[0] >= end)
        with lock:
            events.append(f"{name}:{'lead' if took else 'covered'}")
        if took:
            durable[0] = 100  # its flush covers everyone
            slot.release()

    threads = [start(committer, f"c{end}", end) for end in (1, 2, 50, 60)]
    wait_until(lambda: len(slot._waiting) == 4)
    durable[0] = 10  # the holder's flush covered c1 and c2, not c50 or c60
    slot.release()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not any(thread.is_alive() for thread in threads)
    assert {"c1:covered", "c2:covered"} < set(events)
    assert {e for e in events if e.startswith("c5") or e.startswith("c6")} in (
        {"c50:lead", "c60:covered"}, {"c50:covered", "c60:lead"})


def test_a_release_leaves_asleep_the_waiters_the_next_leader_covers():
    slot = FlushSlot()
    slot.take()
    durable = [0]
    own_checks: dict[int, int] = {}  # waiter -> done() calls made in its own thread (wakes)
    lock = threading.Lock()

    def committer(end: int) -> None:
        def done() -> bool:
            if threading.current_thread() is me:
                with lock:
                    own_checks[end] = own_checks.get(end, 0) + 1
            return durable[0] >= end
        me = threading.current_thread()
        if slot.take(done):
            return  # leads: holds the slot

    for end in (5, 6, 7):
        start(committer, end)
        wait_until(lambda end=end: own_checks.get(end) == 1)
    assert len(slot._waiting) == 3
    slot.release()  # nothing covered: the oldest is woken to lead, the others sleep on
    wait_until(lambda: slot.taken)
    time.sleep(0.05)
    assert own_checks == {5: 2, 6: 1, 7: 1}
    assert len(slot._waiting) == 2


def test_a_waiter_woken_to_lead_that_finds_its_wait_over_passes_the_turn():
    slot = FlushSlot()
    slot.take()
    durable = [0]
    released = threading.Event()
    results: dict[str, bool] = {}

    def first() -> None:  # woken to lead; by the time it runs, someone else covered it
        me = threading.current_thread()

        def done() -> bool:
            if released.is_set() and threading.current_thread() is me:
                durable[0] = 5  # covered meanwhile (as by another leader's flush)
            return durable[0] >= 5
        results["first"] = slot.take(done)

    def second() -> None:
        results["second"] = slot.take(lambda: durable[0] >= 50)
        if results["second"]:
            slot.release()

    a = start(first)
    wait_until(lambda: len(slot._waiting) == 1)
    b = start(second)
    wait_until(lambda: len(slot._waiting) == 2)
    released.set()
    slot.release()  # wakes `first` to lead; it leaves without the slot, so wakes `second`
    a.join(TIMEOUT)
    b.join(TIMEOUT)
    assert results == {"first": False, "second": True}
    assert slot.taken is False


def test_a_waiter_whose_check_raises_is_woken_and_raises():
    slot = FlushSlot()
    slot.take()
    failed = [False]
    raised: list[BaseException] = []

    def done() -> bool:
        if failed[0]:
            raise OSError("offline")
        return False

    def committer() -> None:
        try:
            slot.take(done)
        except OSError as exc:
            raised.append(exc)

    threads = [start(committer) for _ in range(3)]
    wait_until(lambda: len(slot._waiting) == 3)
    failed[0] = True
    slot.release()
    for thread in threads:
        thread.join(TIMEOUT)
    assert [str(exc) for exc in raised] == ["offline"] * 3
    assert slot.taken is False and slot._waiting == []


def test_maintenance_waits_for_the_slot_itself():
    slot = FlushSlot()
    slot.take()
    got = threading.Event()

    def maintenance() -> None:
        assert slot.take() is True
        got.set()
        slot.release()

    thread = start(maintenance)
    wait_until(lambda: len(slot._waiting) == 1)
    assert not got.is_set()
    slot.release()
    thread.join(TIMEOUT)
    assert got.is_set()


@pytest.mark.parametrize("seed", range(3))
def test_every_committer_returns_under_contention(seed):
    """Many threads, each writing then waiting for a flush that covers it, some failing:
    every one returns, covered or leading, and the slot ends free."""
    rng = random.Random(seed)
    slot = FlushSlot()
    state = {"written": 0, "durable": 0}
    lock = threading.Lock()
    leads = [0]

    def committer(rounds: int, delay: float) -> None:
        for _ in range(rounds):
            with lock:
                state["written"] += 1
                end = state["written"]
            while slot.take(lambda end=end: state["durable"] >= end):
                try:
                    with lock:
                        upto = state["written"]
                    time.sleep(delay)  # the fsync
                    state["durable"] = max(state["durable"], upto)
                    leads[0] += 1
                finally:
                    slot.release()

    threads = [start(committer, 40, rng.choice((0, 0.0002, 0.001))) for _ in range(12)]
    for thread in threads:
        thread.join(TIMEOUT * 3)
    assert not any(thread.is_alive() for thread in threads)
    assert state["durable"] == state["written"] == 12 * 40
    assert 0 < leads[0] < 12 * 40  # flushes were shared
    assert slot.taken is False and slot._waiting == []


def test_covered_waiters_leave_without_waking_another():
    slot = FlushSlot()
    slot.take()
    durable = [0]
    checks_asleep = [0]  # the last waiter's checks in its own thread
    leading = threading.Event()
    finish = threading.Event()

    def covered(end: int) -> None:
        assert slot.take(lambda: durable[0] >= end) is False

    def leader_done() -> bool:
        if durable[0]:  # woken to lead: slow to take the slot, so the covered ones leave first
            time.sleep(0.1)
        return False

    def leader() -> None:
        assert slot.take(leader_done) is True
        leading.set()
        finish.wait(TIMEOUT)
        slot.release()

    own: list[int] = []  # the last waiter's thread: its first check is its own

    def last_done() -> bool:
        own.append(own[0] if own else threading.get_ident())
        checks_asleep[0] += threading.get_ident() == own[0]
        return durable[0] >= 100

    threads = [start(covered, 1), start(covered, 2), start(leader)]
    wait_until(lambda: len(slot._waiting) == 3)
    last = start(lambda: slot.take(last_done))
    wait_until(lambda: len(slot._waiting) == 4)
    durable[0] = 10  # covers the first two; the third leads the next flush
    slot.release()
    leading.wait(TIMEOUT)
    time.sleep(0.05)
    assert checks_asleep[0] == 1  # only its first check: nobody woke it meanwhile
    durable[0] = 100
    finish.set()
    for thread in [*threads, last]:
        thread.join(TIMEOUT)
    assert not any(thread.is_alive() for thread in [*threads, last])

"""CommitGather (log/commit_gather.py): an fsync leader waits for a committer that takes turns
with it, so one fsync carries both; one committer alone never waits."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.log import commit_gather
from channel_engine.log.commit_gather import CommitGather


def append_from_another_thread(gather: CommitGather) -> None:
    thread = threading.Thread(target=gather.note_append)
    thread.start()
    thread.join()


def timed_wait(gather: CommitGather, cond: threading.Condition, arrived: list[bool]) -> float:
    start = time.monotonic()
    with cond:
        gather.wait(lambda: arrived[0])
    return time.monotonic() - start


def test_it_never_waits_when_one_thread_appends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_gather, "GATHER_SECONDS", 5.0)
    cond = threading.Condition()
    gather = CommitGather(cond)
    for _ in range(3):
        gather.note_append()
    assert timed_wait(gather, cond, [False]) < 1.0


def test_it_waits_for_a_sibling_append_and_returns_when_it_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_gather, "GATHER_SECONDS", 5.0)
    cond = threading.Condition()
    gather = CommitGather(cond)
    append_from_another_thread(gather)
    gather.note_append()  # this thread's own batch, after the sibling's: they take turns
    arrived = [False]

    def sibling() -> None:
        time.sleep(0.05)
        gather.note_append()
        arrived[0] = True
        gather.wake()
    thread = threading.Thread(target=sibling)
    thread.start()
    waited = timed_wait(gather, cond, arrived)
    thread.join()
    assert arrived[0] and 0.04 <= waited < 2.0


def test_it_waits_at_most_gather_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_gather, "GATHER_SECONDS", 0.05)
    cond = threading.Condition()
    gather = CommitGather(cond)
    append_from_another_thread(gather)
    gather.note_append()
    assert 0.04 <= timed_wait(gather, cond, [False]) < 1.0


def test_it_stops_waiting_once_the_siblings_went_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_gather, "GATHER_SECONDS", 5.0)
    monkeypatch.setattr(commit_gather, "SIBLINGS_SECONDS", 0.05)
    cond = threading.Condition()
    gather = CommitGather(cond)
    append_from_another_thread(gather)
    gather.note_append()
    time.sleep(0.1)
    gather.note_append()  # the same thread again: no new alternation
    assert timed_wait(gather, cond, [False]) < 1.0


def test_two_committers_taking_turns_share_each_fsync(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a generous bound, so a loaded machine cannot make the sibling late; the pairing, not
    # the wait, is what is tested (group commit alone: ~0.7 fsyncs per append here)
    monkeypatch.setattr(commit_gather, "GATHER_SECONDS", 0.05)
    syncs = []
    real = os.fdatasync
    log = PartitionLog.open(tmp_path, LogConfig(durability="fsync"))
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    events = [PendingEvent(b"x" * 200)] * 100

    def committer() -> None:
        for _ in range(100):
            log.append(events)
    threads = [threading.Thread(target=committer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.undo()
    assert log.recovery_point == log.log_end_offset == 20_000
    assert len(syncs) <= 0.55 * 200, len(syncs)
    log.close()
    with PartitionLog.open(tmp_path, LogConfig(durability="fsync")) as again:
        assert again.log_end_offset == 20_000

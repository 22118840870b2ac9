"""The commit journal: take and put commits survive, torn appends are ignored and counted,
and replay after a checkpoint rebuilds the same queue as the live one."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channel_engine import CorruptStateError
from channel_engine import commit_journal as tj
from channel_engine.partition_queue import PartitionQueue


def test_it_replays_what_was_appended(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 3)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE, 2, [(0, 10, 20), (1, 5, 7)])
    journal.close()
    takes, ignored = tj.replay(tj.journal_path(tmp_path, 3))
    assert [(t.generation, t.kind, t.commit_id, t.entries) for t in takes] == [
        (3, tj.TAKE, 1, ((0, 0, 10),)), (3, tj.TAKE, 2, ((0, 10, 20), (1, 5, 7)))]
    assert ignored == 0


@pytest.mark.parametrize("cut", [1, 7, 9, 20])
def test_it_ignores_and_counts_a_torn_last_record(tmp_path: Path, cut: int) -> None:
    journal = tj.CommitJournal(tmp_path, 0)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE, 2, [(0, 10, 20)])
    journal.close()
    path = tj.journal_path(tmp_path, 0)
    size = path.stat().st_size
    os.truncate(path, size - cut)
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == [1] and ignored == 41 - cut  # a record is 41 bytes


def test_it_stops_at_a_damaged_record(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 0)
    for take in range(3):
        journal.append(tj.TAKE, take, [(0, take * 10, take * 10 + 10)])
    journal.close()
    path = tj.journal_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[16 + 41 + 20] ^= 0xFF  # inside the second record
    path.write_bytes(bytes(data))
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == [0] and ignored == 82


def test_it_refuses_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    path = tj.journal_path(tmp_path, 0)
    path.write_bytes(b"NOPE" + bytes(12))
    with pytest.raises(CorruptStateError, match="magic"):
        tj.replay(path)


def test_it_replays_newer_generations_in_order_and_removes_older(tmp_path: Path) -> None:
    for generation in (1, 2, 3):
        journal = tj.CommitJournal(tmp_path, generation)
        journal.append(tj.TAKE, generation, [(0, generation, generation + 1)])
        journal.close()
    replayed = [t.commit_id for _, takes, _ in tj.replay_from(tmp_path, 2) for t in takes]
    assert replayed == [2, 3]
    assert tj.remove_before(tmp_path, 2) == 1 and tj.generations(tmp_path) == [2, 3]


def test_it_refuses_a_journal_generation_no_checkpoint_reaches(tmp_path: Path) -> None:
    tj.journal_path(tmp_path, 2**31).write_bytes(b"")
    with pytest.raises(CorruptStateError, match="generation 2147483648 is beyond"):
        tj.generations(tmp_path)


@settings(max_examples=200, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 60))
def test_checkpoint_plus_journal_rebuilds_the_live_queue(rng: random.Random,
                                                        checkpoint_at: int) -> None:
    live, log_end, take_id, open_takes = PartitionQueue(), 0, 0, []
    saved, journalled = None, []
    for step in range(60):
        if step == checkpoint_at:
            saved, journalled = live.to_checkpoint(0, log_end, log_end), []
        action = rng.choice(["put", "take", "commit", "rollback"])
        if action == "put":
            log_end += rng.randint(1, 20)
        elif action == "take":
            take_id += 1
            if live.reserve(take_id, rng.randint(1, 15), log_end):
                open_takes.append(take_id)
        elif open_takes:
            chosen = open_takes.pop(rng.randrange(len(open_takes)))
            ranges = list(live.in_flight[chosen])
            if action == "commit":
                live.commit(chosen)
                journalled.append(ranges)
            else:
                live.rollback(chosen)
    if saved is None:
        return
    restored = PartitionQueue.from_checkpoint(saved)
    for ranges in journalled + journalled[:1]:  # replaying one twice is harmless
        restored.mark_committed(ranges)
    for take in open_takes:  # a restart returns what was in flight
        live.rollback(take)
    assert restored.taken_through == live.taken_through
    assert restored.untaken(log_end) == live.untaken(log_end)
    assert restored.queued(log_end) == live.queued(log_end)
    def order(queue: PartitionQueue) -> list[int]:
        return [o for start, end in queue.reserve(-1, 10**6, log_end) for o in range(start, end)]

    assert order(restored) == order(live)


WRITER = """
import sys
from pathlib import Path
from channel_engine import commit_journal as tj
journal = tj.CommitJournal(Path(sys.argv[1]), 0)
take = 0
while True:
    take += 1
    entries = [(take % 3, take * 10, take * 10 + 10)] * (1 + take % 4)
    journal.sync(journal.append(tj.TAKE, take, entries))
    print(take, flush=True)
"""


@pytest.mark.parametrize("acks", [1, 50, 400])
def test_every_acknowledged_commit_survives_kill_9(tmp_path: Path, acks: int) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    acked = 0
    try:
        assert writer.stdout is not None
        while acked < acks:
            acked = int(writer.stdout.readline())
        os.kill(writer.pid, signal.SIGKILL)
        for line in writer.stdout:  # lines printed before the kill were acknowledged too
            acked = int(line)
    finally:
        writer.kill()
        writer.wait()
    takes, _ = tj.replay(tj.journal_path(tmp_path, 0))
    assert [t.commit_id for t in takes][:acked] == list(range(1, acked + 1))

"""The commit journal: take and put commits survive, torn appends are ignored and counted,
and replay after a checkpoint rebuilds the same queue as the live one."""
from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channel_engine import ChannelEngineError, CorruptRecordError, CorruptStateError
from channel_engine.errors import JournalOfflineError
from channel_engine.queue import commit_journal as tj
from channel_engine.queue.partition_queue import PartitionQueue


def test_it_replays_what_was_appended(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 3)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE, 2, [(0, 10, 20), (1, 5, 7)])
    journal.close()
    takes, ignored = tj.replay(tj.journal_path(tmp_path, 3))
    assert [(t.generation, t.kind, t.commit_id, t.entries) for t in takes] == [
        (3, tj.TAKE, 1, ((0, 0, 10),)), (3, tj.TAKE, 2, ((0, 10, 20), (1, 5, 7)))]
    assert ignored == 0


def test_it_replays_take_commits_of_subscriptions_by_id(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 3)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])  # subscription `default`: kind 1 as before
    journal.append(tj.TAKE, 2, [(1, 5, 7)], subscription=4)
    journal.append(tj.PUT, 9, [(0, 10, 12)])
    journal.close()
    data = tj.journal_path(tmp_path, 3).read_bytes()
    assert data[4] == tj.VERSION == 2
    commits, ignored = tj.replay(tj.journal_path(tmp_path, 3))
    assert [(c.kind, c.commit_id, c.subscription, c.entries) for c in commits] == [
        (tj.TAKE, 1, 0, ((0, 0, 10),)), (tj.TAKE_OF, 2, 4, ((1, 5, 7),)),
        (tj.PUT, 9, 0, ((0, 10, 12),))]
    assert ignored == 0 and len(data) == 16 + 41 + 45 + 41  # kind 3: 4 bytes more


def test_it_reads_a_version_1_journal_and_appends_to_it(tmp_path: Path) -> None:
    # a journal of the release before subscriptions (same records, kinds 1 and 2 only),
    # still open at an upgrade: the next owner appends to it, any kind
    path = tj.journal_path(tmp_path, 5)
    record = tj.RECORD_BODY.pack(tj.TAKE, 7, 1) + tj.ENTRY.pack(0, 0, 3)
    path.write_bytes(tj.HEADER.pack(tj.MAGIC, 1, 0, 5)
                     + tj.RECORD_HEAD.pack(len(record), __import__("crc32c").crc32c(record))
                     + record)
    journal = tj.CommitJournal(tmp_path, 5)
    journal.append(tj.TAKE, 8, [(0, 3, 4)], subscription=2)
    journal.close()
    commits, ignored = tj.replay(path)
    assert [(c.kind, c.commit_id, c.subscription) for c in commits] == [
        (tj.TAKE, 7, 0), (tj.TAKE_OF, 8, 2)] and ignored == 0


def test_a_take_commit_of_subscription_id_0_as_kind_3_is_no_record(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 0)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE_OF, 2, [(0, 10, 20)], subscription=0)  # only a bug writes this
    journal.close()
    commits, ignored = tj.replay(tj.journal_path(tmp_path, 0))
    assert [c.commit_id for c in commits] == [1] and ignored == 45  # a torn tail: last


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


def three_takes(directory: Path) -> Path:
    journal = tj.CommitJournal(directory, 0)
    for take in range(3):
        journal.append(tj.TAKE, take, [(0, take * 10, take * 10 + 10)])
    journal.close()
    return tj.journal_path(directory, 0)


def test_it_refuses_a_damaged_record_that_intact_records_follow(tmp_path: Path) -> None:
    path = three_takes(tmp_path)
    data = bytearray(path.read_bytes())
    data[16 + 41 + 20] ^= 0xFF  # inside the second record
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="byte 57: record CRC-32C mismatch") as caught:
        tj.replay(path)
    assert caught.value.path == str(path) and caught.value.position == 57
    found = tj.scan(path)
    assert [t.commit_id for t in found.commits] == [0] and found.valid_bytes == 57
    assert found.damaged and not found.torn_tail
    assert [(t.commit_id, t.entries) for t in found.after] == [(2, ((0, 20, 30),))]
    assert found.unreadable_bytes == 41


def test_it_ignores_a_zero_hole_and_what_follows_as_a_torn_tail(tmp_path: Path) -> None:
    path = three_takes(tmp_path)
    data = bytearray(path.read_bytes())
    data[57:98] = bytes(41)  # an append that never reached the disk, a later one that did
    path.write_bytes(bytes(data))
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == [0] and ignored == 82
    assert tj.scan(path).torn_tail


@pytest.mark.parametrize("kept", [0, 3, 8, 30])
def test_it_ignores_a_write_cut_short_and_what_follows_as_a_torn_tail(
        tmp_path: Path, kept: int) -> None:
    path = three_takes(tmp_path)
    data = bytearray(path.read_bytes())
    data[57 + kept:98] = bytes(41 - kept)  # the second append kept only its first bytes
    path.write_bytes(bytes(data))
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == [0] and ignored == 82


def takes_across_a_sector(directory: Path) -> tuple[Path, int, int]:
    """A journal of 41-byte take records, one straddling byte 512; returns its path and
    that record's start and end."""
    journal = tj.CommitJournal(directory, 0)
    for take in range(15):
        journal.append(tj.TAKE, take, [(0, take * 10, take * 10 + 10)])
    journal.close()
    start = 16 + 41 * ((512 - 16) // 41)
    assert start < 512 < start + 41
    return tj.journal_path(directory, 0), start, start + 41


def test_it_ignores_an_append_whose_first_sector_was_dropped_as_a_torn_tail(
        tmp_path: Path) -> None:
    """Power loss kept the sector after byte 512 and an older version of the one before:
    the straddling record's head is zeros, its tail and the records after are intact."""
    path, start, _end = takes_across_a_sector(tmp_path)
    data = bytearray(path.read_bytes())
    data[start:512] = bytes(512 - start)
    path.write_bytes(bytes(data))
    found = tj.scan(path)
    assert found.torn_tail and found.valid_bytes == start
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == list(range(12)) and ignored == len(data) - start


def test_it_refuses_damage_across_a_sector_boundary_that_zeroes_no_sector_piece(
        tmp_path: Path) -> None:
    path, start, end = takes_across_a_sector(tmp_path)
    data = bytearray(path.read_bytes())
    data[end - 2] ^= 0x40  # inside the straddling record, after byte 512
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=f"byte {start}: record CRC-32C mismatch"):
        tj.replay(path)


def test_it_ignores_a_file_whose_header_never_reached_the_disk(tmp_path: Path) -> None:
    path = tj.journal_path(tmp_path, 4)
    for data in (b"", bytes(16), bytes(30), tj.HEADER.pack(tj.MAGIC, tj.VERSION, 0, 4)[:9]):
        path.write_bytes(data)
        assert tj.replay(path) == ([], len(data))


def test_it_names_what_a_checkpoints_own_journal_lacks(tmp_path: Path) -> None:
    path = tj.journal_path(tmp_path, 3)
    assert tj.checkpoint_journal_problem(tmp_path, 3) == "missing"
    tj.CommitJournal(tmp_path, 3).close()
    assert tj.checkpoint_journal_problem(tmp_path, 3) is None  # a whole header: no record yet
    header = path.read_bytes()
    for data, why in ((b"", "0 bytes, shorter than its 16-byte header"),
                      (header[:9], "9 bytes, shorter than its 16-byte header"),
                      (bytes(40), "its header is zeros")):
        path.write_bytes(data)
        assert tj.checkpoint_journal_problem(tmp_path, 3) == why
    path.unlink()
    path.mkdir()
    assert tj.checkpoint_journal_problem(tmp_path, 3) == "not a regular file"


def test_it_refuses_a_header_whose_generation_is_not_its_name(tmp_path: Path) -> None:
    path = three_takes(tmp_path)
    data = bytearray(path.read_bytes())
    data[15] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="generation 1 but the file is named for 0"):
        tj.replay(path)
    found = tj.scan(path)
    assert found.header_damaged and [t.commit_id for t in found.after] == [0, 1, 2]


def test_it_raises_an_engine_error_for_a_directory_in_its_place(tmp_path: Path) -> None:
    tj.journal_path(tmp_path, 0).mkdir()
    with pytest.raises(CorruptStateError, match="cannot be read"):
        tj.replay(tj.journal_path(tmp_path, 0))


def _journal_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        journal = tj.CommitJournal(Path(directory), 0)
        for commit in range(6):
            journal.append(tj.TAKE if commit % 2 else tj.PUT, commit,
                           [(commit % 2, commit, commit + 3)] * (commit % 3))
        journal.close()
        return tj.journal_path(Path(directory), 0).read_bytes()


JOURNAL_BYTES = _journal_bytes()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_replay_of_a_mutated_journal_raises_or_reports_never_loses_silently(
        data: st.DataObject) -> None:
    original = bytes(JOURNAL_BYTES)
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "append"]))
        at = data.draw(st.integers(0, max(0, len(mutated) - 1)))
        if kind == "flip" and mutated:
            mutated[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "overwrite":
            mutated[at:at + 8] = data.draw(st.binary(min_size=8, max_size=8))
        elif kind == "truncate":
            del mutated[at:]
        else:
            mutated += data.draw(st.binary(min_size=1, max_size=60))
    with tempfile.TemporaryDirectory() as directory:
        path = tj.journal_path(Path(directory), 0)
        path.write_bytes(bytes(mutated))
        try:
            takes, ignored = tj.replay(path)
        except ChannelEngineError as exc:
            assert str(path) in str(exc)
            return
    expected = list(range(6))
    got = [t.commit_id for t in takes]
    assert got == expected[:len(got)]
    assert got == expected or ignored > 0 or len(mutated) < len(original)


def test_it_refuses_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    path = tj.journal_path(tmp_path, 0)
    path.write_bytes(b"NOPE" + bytes(12))
    with pytest.raises(CorruptStateError, match="magic"):
        tj.replay(path)


@pytest.mark.parametrize("length", [tj.HEADER.size, tj.HEADER.size + 61, 4096])
def test_it_replays_a_journal_whose_unsynced_header_was_lost_as_empty(tmp_path: Path,
                                                                     length: int) -> None:
    """Power loss after the file's length reached the disk but before its header did
    (found by the power-loss simulation): zeros, no commit, and the channel still opens."""
    path = tj.journal_path(tmp_path, 4)
    path.write_bytes(bytes(length))
    assert tj.replay(path) == ([], length)


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
from channel_engine.queue import commit_journal as tj
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


def test_it_keeps_zeros_ahead_and_replays_them_as_no_record(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 0, zero_fill=8192)
    for take in range(300):  # 12,300 bytes of records: the zeros move ahead twice
        journal.append(tj.TAKE, take, [(0, take, take + 1)])
        size = journal.path.stat().st_size
        assert 16 + 41 * (take + 1) < size <= 16 + 41 * (take + 1) + 8192 + tj.PAGE
    journal.sync()
    found = tj.scan(journal.path)  # as a kill leaves it: zeros after the last record
    assert [c.commit_id for c in found.commits] == list(range(300))
    assert found.valid_bytes == 16 + 41 * 300 and found.zero_tail == size - found.valid_bytes
    assert found.ignored == 0 and not found.problem and not found.damaged
    assert tj.replay(journal.path)[1] == 0
    journal.close()
    assert journal.path.stat().st_size == 16 + 41 * 300  # close trims them


def test_it_counts_a_torn_record_before_the_zeros_ahead_as_ignored(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 0, zero_fill=8192)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE, 2, [(0, 10, 20)])
    journal.sync()
    with open(journal.path, "r+b") as f:  # the second record's last sector never written
        f.seek(16 + 41 + 30)
        f.write(bytes(11))
    takes, ignored = tj.replay(journal.path)
    assert [t.commit_id for t in takes] == [1] and ignored == 41
    found = tj.scan(journal.path)
    assert found.torn_tail and found.zero_tail == found.file_size - 16 - 82


def test_it_appends_after_the_records_of_a_journal_with_zeros_ahead(tmp_path: Path) -> None:
    journal = tj.CommitJournal(tmp_path, 4, zero_fill=8192)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.sync()
    again = tj.CommitJournal(tmp_path, 4, zero_fill=8192)  # a refused checkpoint's retry
    again.append(tj.TAKE, 2, [(0, 10, 20)])
    again.close()
    takes, ignored = tj.replay(tj.journal_path(tmp_path, 4))
    assert [t.commit_id for t in takes] == [1, 2] and ignored == 0


def test_a_journal_with_zeros_ahead_says_so_in_its_header(tmp_path: Path) -> None:
    tj.CommitJournal(tmp_path, 1, zero_fill=8192).close()
    tj.CommitJournal(tmp_path, 2).close()
    flagged, plain = (tj.journal_path(tmp_path, g).read_bytes() for g in (1, 2))
    assert flagged[5] == tj.ZEROS_AHEAD and plain[5] == 0 and flagged[6:8] == plain[6:8] == b"\0\0"
    # bytes 5..7 were reserved: the header as every earlier reader unpacked it
    assert struct.unpack_from(">4sB3xq", flagged) == (tj.MAGIC, tj.VERSION, 1)


@pytest.mark.parametrize("zero_fill", [0, 8192])
def test_it_counts_zeros_ending_a_journal_without_zeros_ahead_as_ignored(
        tmp_path: Path, zero_fill: int) -> None:
    """Policy durability (or a journal written before the flag): zeros at the end are
    appends a power loss dropped, commits that may have returned: never silent. Only
    a journal flagged ZEROS_AHEAD takes them for its preallocated space."""
    journal = tj.CommitJournal(tmp_path, 0, zero_fill=zero_fill)
    journal.append(tj.TAKE, 1, [(0, 0, 10)])
    journal.append(tj.TAKE, 2, [(0, 10, 20)])
    journal.close()
    path = journal.path
    with open(path, "r+b") as f:  # the second record dropped, the file's length kept
        f.seek(16 + 41)
        f.write(bytes(41 + 4096))
    takes, ignored = tj.replay(path)
    assert [t.commit_id for t in takes] == [1]
    assert ignored == (0 if zero_fill else 41 + 4096)
    assert tj.scan(path).zero_tail == (41 + 4096 if zero_fill else 0)



def test_a_failed_fsync_leaves_every_later_record_undurable_even_if_one_succeeds_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tj.CommitJournal(tmp_path, 1)
    first = journal.append(tj.TAKE, 1, [(0, 0, 1)])
    journal.sync(first)
    second = journal.append(tj.TAKE, 2, [(0, 1, 2)])
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(5, "input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(JournalOfflineError, match="offline after a failed fsync"):
        journal.sync(second)
    monkeypatch.setattr(os, "fdatasync", real)  # the disk answers again: the pages it
    third = journal.append(tj.TAKE, 3, [(0, 2, 3)])  # failed to write may be gone even so
    for ticket in (second, third):
        with pytest.raises(JournalOfflineError):
            journal.sync(ticket)
        assert not journal.synced(ticket)
    journal.sync(first)  # on disk before the failure: still so
    assert journal.synced(first)
    journal.close()

"""Power-loss simulation (power_loss.py): crash states built from a recorded workload's
file operations, where only what was fsynced is sure to survive, opened by the engine.

The default suite checks a few hundred seeded states; `-m slow` checks more than
10,000. Each run prints its summary (states checked, failures by kind; `pytest -s`
shows it); `python tests/engine/power_loss.py summary --states N` prints it too.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import power_loss as pl
import pytest
from channel_helpers import crash, make_config

from channel_engine import Channel, LogConfig, PartitionLog, PendingEvent
from channel_engine.atomic_file import write_atomically
from channel_engine.log.record_batch import LEADER_EPOCH_AT
from channel_engine.queue import commit_journal

DEFAULT_STATES = {"log-fsync": 60, "log-fsync-prealloc": 60, "log-policy": 60,
                  "channel-fsync": 160, "channel-fsync-encrypted": 60, "channel-policy": 80}
SLOW_SEEDS = range(1, 11)
SLOW_STATES = 200  # per workload and seed: 8 x 10 x 200 = 16,000 states


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir=pl.scratch_base(), prefix="weir-power-loss-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
def recordings(scratch: Path) -> dict[str, pl.Recording]:
    """Each workload recorded once (seed 1) for the module."""
    return {name: pl.record(name, 1, scratch / f"{name}-root") for name in pl.DETERMINISTIC}


@pytest.fixture(autouse=True)
def quiet_recovery_logs() -> Iterator[None]:
    logging.disable(logging.WARNING)  # every crash state's recovery report is expected
    yield
    logging.disable(logging.NOTSET)


def check(recording: pl.Recording, states: int, seed: int = 1) -> pl.Summary:
    summary = pl.check_states(recording, pl.choose_states(recording, states, seed))
    print(summary.render())
    return summary


# -- the recorder and the crash-state model -----------------------------------------------


def test_it_records_an_atomic_write_as_create_write_sync_rename_and_directory_sync(
        tmp_path: Path) -> None:
    rec = pl.Recorder(tmp_path)
    rec.install()
    try:
        write_atomically(tmp_path / "state", b"x" * 700)
        os.unlink(tmp_path / "state")
    finally:
        rec.uninstall()
    assert os.open is not rec._open  # the real functions are back
    fid = rec.ops[0][2]
    assert rec.ops == [("create", "state.tmp", fid), ("write", fid, 0, b"x" * 700),
                       ("sync", fid), ("rename", "state.tmp", "state"), ("dsync", ""),
                       ("unlink", "state")]


def test_it_records_appends_at_the_end_and_ignores_files_outside_the_root(
        tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    rec = pl.Recorder(tmp_path / "root")
    rec.install()
    try:
        fd = os.open(tmp_path / "root" / "j", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"abc")
        os.write(fd, b"de")
        os.fdatasync(fd)
        os.close(fd)
        outside = os.open(tmp_path / "outside", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(outside, b"zz")
        os.close(outside)
    finally:
        rec.uninstall()
    fid = rec.ops[0][2]
    assert rec.ops == [("create", "j", fid), ("write", fid, 0, b"abc"),
                       ("write", fid, 3, b"de"), ("sync", fid)]


def synthetic(ops: list[pl.Op]) -> pl.Recording:
    return pl.Recording("log-fsync", 0, "/nonexistent", {}, ops)


def test_it_keeps_synced_data_and_only_names_made_durable_by_a_directory_sync() -> None:
    ops: list[pl.Op] = [
        ("create", "a", 1), ("write", 1, 0, b"A" * 1000), ("sync", 1), ("dsync", ""),
        ("create", "b", 2), ("write", 2, 0, b"B" * 10), ("sync", 2),  # name never durable
        ("write", 1, 1000, b"C" * 1200),                              # data never synced
    ]
    namespace, contents = pl.build_state(synthetic(ops), pl.CrashState(len(ops), "durable", "s"))
    assert namespace == {"a": 1}
    assert contents[1] == b"A" * 1000
    namespace, contents = pl.build_state(synthetic(ops), pl.CrashState(len(ops), "cache", "s"))
    assert namespace == {"a": 1, "b": 2}
    assert contents[1] == b"A" * 1000 + b"C" * 1200


def test_it_tears_unsynced_writes_at_sector_boundaries_only() -> None:
    ops: list[pl.Op] = [("create", "a", 1), ("dsync", ""), ("write", 1, 100, b"\x01" * 2000)]
    shapes = set()
    for k in range(200):
        _, contents = pl.build_state(synthetic(ops), pl.CrashState(
            len(ops), "random", f"t{k}", keep_probability=0.5, tear_probability=1.0))
        data = contents[1]
        kept = [i for i in range(len(data)) if data[i]]
        for start in range(0, len(data), pl.SECTOR):  # a sector is all written or all not
            sector = data[max(start, 100):start + pl.SECTOR]
            assert len(set(sector)) <= 1, f"sector at {start} torn inside"
        shapes.add((len(data), len(kept)))
    assert len(shapes) > 5  # prefixes and subsets of different sizes were produced


def test_it_catches_an_engine_that_skips_an_fsync(recordings: dict[str, pl.Recording]) -> None:
    """The checker can fail: drop the fsyncs of the first segment from the record, as an
    engine that acknowledged puts without them would have, and committed events go."""
    recording = recordings["log-fsync"]
    segment = next(op[2] for op in recording.ops if op[0] == "create" and op[1].endswith(".log"))
    broken = pl.Recording(recording.workload, recording.seed, recording.root,
                          recording.initial,
                          [op for op in recording.ops if op != ("sync", segment)])
    summary = check(broken, 40)
    assert summary.failures["lost_committed"] > 0


def test_it_catches_an_engine_that_skips_a_directory_fsync(
        recordings: dict[str, pl.Recording]) -> None:
    recording = recordings["channel-fsync"]
    broken = pl.Recording(recording.workload, recording.seed, recording.root,
                          recording.initial, [op for op in recording.ops if op[0] != "dsync"])
    summary = check(broken, 60)
    assert summary.failures["lost_committed"] + summary.failures["open_raised"] > 0


def test_it_catches_a_committed_take_that_comes_back(
        recordings: dict[str, pl.Recording]) -> None:
    recording = recordings["channel-fsync"]
    journal = {op[2] for op in recording.ops if op[0] == "create" and ".journal" in op[1]}
    ops = [op for op in recording.ops if not (op[0] == "sync" and op[1] in journal)]
    broken = pl.Recording(recording.workload, recording.seed, recording.root,
                          recording.initial, ops)
    summary = check(broken, 80)
    assert summary.failures["take_resurrected"] + summary.failures["lost_committed"] > 0


# -- the engine under power loss ----------------------------------------------------------


@pytest.mark.parametrize("workload", ["log-fsync", "log-fsync-prealloc"])
def test_it_keeps_every_committed_append_of_a_partition_log_after_power_loss(
        recordings: dict[str, pl.Recording], workload: str) -> None:
    summary = check(recordings[workload], DEFAULT_STATES[workload])
    assert summary.states == DEFAULT_STATES[workload]
    assert not summary.failures, summary.render()


@pytest.mark.parametrize("workload", ["channel-fsync", "channel-fsync-encrypted"])
def test_it_keeps_committed_puts_and_takes_of_a_channel_after_power_loss(
        recordings: dict[str, pl.Recording], workload: str) -> None:
    """channel-fsync-encrypted creates its key file first: it was not fsynced (file nor
    directory), so a power loss could leave it empty and every sealed batch unreadable."""
    summary = check(recordings[workload], DEFAULT_STATES[workload])
    assert not summary.failures, summary.render()


@pytest.mark.parametrize("workload", ["log-policy", "channel-policy"])
def test_it_loses_only_events_inside_the_flush_window_in_policy_mode(
        recordings: dict[str, pl.Recording], workload: str) -> None:
    summary = check(recordings[workload], DEFAULT_STATES[workload])
    assert summary.policy_states_with_loss > 0  # the window is real: unflushed events go
    assert not summary.failures, summary.render()


# -- regressions: what the simulation found ------------------------------------------------


def cross_partition_put(channel: Channel, n: int) -> list[tuple[int, int, int]]:
    with channel.put() as tx:
        for i in range(n):
            tx.put(f"e{i}".encode(), key=f"k{i}".encode())
    assert len(tx.committed) > 1, "the keys should span partitions"
    return tx.committed


def test_it_flushes_a_cross_partition_put_before_its_commit_record_in_policy_mode(
        tmp_path: Path) -> None:
    """Else a power loss keeps the record (or a stamp) and one partition's batch and loses
    the other's: part of a committed put delivered."""
    config = make_config(tmp_path, partitions=2, durability="policy", flush_messages=10_000)
    with Channel.open(config) as channel:
        owner = channel.owner
        assert owner is not None
        for partition, _first, last in cross_partition_put(channel, 8):
            assert owner.logs[partition].recovery_point > last


def test_it_syncs_cross_partition_put_records_before_a_partition_could_lose_flush_messages(
        tmp_path: Path) -> None:
    """Policy mode syncs a put's commit record only on flush: losing it aborts the put. So
    the events waiting on unsynced records count toward flush_messages, per partition, with
    the log's unflushed ones (the simulation's multi-partition put aborted beyond
    flush_messages)."""
    config = make_config(tmp_path, partitions=2, durability="policy", flush_messages=10,
                         flush_ms=3_600_000)
    with Channel.open(config) as channel:
        owner = channel.owner
        assert owner is not None
        journal = owner.state.journal
        assert journal is not None

        def all_synced() -> bool:
            return journal.synced(journal._appended)

        waiting = [0, 0]
        while True:
            for partition, first, last in cross_partition_put(channel, 4):
                waiting[partition] += last - first + 1
            if max(waiting) >= 10:
                break
            assert not all_synced()  # no fsync of its own while the window allows
        assert all_synced()


def test_it_commits_every_batch_of_a_put_one_batch_of_which_is_stamped(
        tmp_path: Path) -> None:
    """Policy mode does not sync the commit record, but a stamp may reach the disk by
    writeback: one stamped batch decides the put, in every partition."""
    config = make_config(tmp_path, partitions=2, durability="policy", flush_messages=1,
                         checkpoint_on_close=False)
    channel = Channel.open(config)
    owner = channel.owner
    assert owner is not None
    committed = cross_partition_put(channel, 8)
    partition, first, _ = committed[-1]
    segment = owner.logs[partition].segments[-1]
    position = segment.find_position(first, segment.size)
    assert position is not None
    crash(channel)
    journal = commit_journal.journal_path(config.home, owner.checkpointer.sequence)
    with open(journal, "r+b") as f:  # the unsynced commit record did not survive
        f.truncate(commit_journal.HEADER.size)
    with open(segment.log_path, "r+b") as f:  # nor did this batch's stamp
        f.seek(position + LEADER_EPOCH_AT)
        f.write((-1).to_bytes(4, "big", signed=True))
    with Channel.open(config) as channel, channel.take() as tx:
        taken = tx.take(100)
        tx.rollback()
    assert sorted(e.body for e in taken) == sorted(f"e{i}".encode() for i in range(8))


def test_it_opens_a_channel_whose_newest_journal_lost_its_unsynced_header(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel:
        cross_partition_put(channel, 4)
        sequence = channel.owner.checkpointer.sequence if channel.owner else 0
    commit_journal.journal_path(config.home, sequence + 5).write_bytes(bytes(16))
    with Channel.open(config) as channel, channel.take() as tx:
        assert len(tx.take(100)) == 4
        tx.rollback()


def test_it_never_hands_out_again_the_offsets_a_policy_log_lost_to_power_loss(
        tmp_path: Path) -> None:
    """Policy mode: appends return before their fsync, and log.state may record an end
    past what reached the disk. After power loss the log continues at that end, and
    the offsets in between are reported lost (not given to new events)."""
    config = LogConfig(durability="policy", flush_messages=1000)
    log = PartitionLog.open(tmp_path, config)
    log.append([PendingEvent(b"a"), PendingEvent(b"b")])
    log.flush()
    durable_bytes = log.segments[-1].size
    log.append([PendingEvent(b"c"), PendingEvent(b"d"), PendingEvent(b"e")])
    log.checkpoint_recovery_point()  # log.state: recovery point 2, log end 5
    log.state.release_dir_lock()  # power loss: no clean close, and the unflushed batch is gone
    for segment in log.segments:
        segment.close()
    os.truncate(log.segments[-1].log_path, durable_bytes)
    with PartitionLog.open(tmp_path, config) as log:
        assert log.log_end_offset == 5
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(2, 5)]
        assert log.append([PendingEvent(b"f")]).first_offset == 5


@pytest.mark.slow
def test_it_survives_ten_thousand_power_losses(scratch: Path) -> None:
    total = pl.Summary()
    for seed in SLOW_SEEDS:
        for name in pl.WORKLOADS:
            recording = pl.record(name, seed, scratch / f"slow-{name}-{seed}")
            total.add(pl.check_states(recording, pl.choose_states(recording, SLOW_STATES, seed)))
    print(total.render())
    assert total.states >= 10_000
    assert not total.failures, total.render()


def test_it_builds_the_same_states_from_the_same_seed(
        recordings: dict[str, pl.Recording]) -> None:
    recording = recordings["channel-fsync"]
    first = pl.choose_states(recording, 20, 7)
    assert first == pl.choose_states(recording, 20, 7)
    state = first[random.Random(1).randrange(20)]
    assert pl.build_state(recording, state) == pl.build_state(recording, state)
    assert not Path(recording.root).exists() or shutil.rmtree(recording.root) is None

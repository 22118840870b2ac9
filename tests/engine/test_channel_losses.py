"""Losses are counted in events and told: real damage (a deleted middle or last segment, a
segment cut below the recovery point, a lost log.state with a cut log) and losses met at
use. Every test computes the lost events itself from what it put and took, and checks
that status() counts exactly those, that takes deliver every other event exactly once and
never a lost one, that events_untaken equals what takes then deliver, and that health is
degraded until an operator acknowledges the loss."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import crash, make_config

from channel_engine import Channel, ChannelConfig, PartitionLog, StorageError
from channel_engine.errors import CorruptRecordError
from channel_engine.filenames import LOG_STATE_FILE
from channel_engine.log.recovery import LostRange
from channel_engine.offset_ranges import subtract
from channel_engine.queue import loss_ledger
from channel_engine.queue.loss_ledger import LEDGER_FILE, LEDGER_PARTITION
from channel_engine.tools import cli

REPO = Path(__file__).resolve().parents[2]
EVENTS = 60
TAKEN_FIRST = 5  # taken and committed before the damage


def _config(tmp_path: Path) -> ChannelConfig:
    return make_config(tmp_path, segment_bytes=1024, checkpoint_interval_ms=3_600_000)


def _fill(config: ChannelConfig, events: int = EVENTS, taken: int = TAKEN_FIRST) -> set[int]:
    """Put `events` events (one batch each: offset i holds body i), take and commit the
    first `taken`, close; return the taken offsets."""
    with Channel.open(config) as channel:
        for i in range(events):
            with channel.put() as tx:
                tx.put(b"event-%04d" % i + b"." * 40)
        with channel.take() as tx:
            assert [e.offset for e in tx.take(taken)] == list(range(taken))
    return set(range(taken))


def _bases(config: ChannelConfig) -> list[int]:
    return sorted(int(p.stem) for p in config.partition_dir(0).glob("*.log"))


def _segment(config: ChannelConfig, base: int) -> Path:
    return config.partition_dir(0) / f"{base:020d}.log"


def _batch_positions(path: Path) -> list[int]:
    """Byte positions of the batches of a segment file (Kafka v2: base offset i64, then
    the batch length i32 counting from after itself)."""
    data = path.read_bytes()
    positions, position = [], 0
    while position + 12 <= len(data):
        positions.append(position)
        position += 12 + int.from_bytes(data[position + 8:position + 12], "big")
    return positions


def _drain(channel: Channel, per_take: int = 7) -> list[int]:
    """Take and commit until nothing is left; the offsets delivered, in order."""
    got: list[int] = []
    while True:
        with channel.take() as tx:
            events = tx.take(per_take)
        for event in events:
            assert event.body.startswith(b"event-%04d" % event.offset)
        got += [event.offset for event in events]
        if not events:
            return got


def _check_counted(channel: Channel, lost: set[int], delivered_before: set[int],
                   all_offsets: set[int]) -> dict[str, Any]:
    """status() counts exactly `lost`; takes deliver every other offset once; the counts
    promised what the takes then delivered. Return the status seen before the takes."""
    status = channel.status()
    losses = status["losses"]
    assert losses["events_lost"] == losses["unacknowledged_events"] == len(lost), losses
    assert status["partitions"][0]["lost_events"] == len(lost)
    assert status["health"] == "degraded", status["health_reason"]
    assert f"{len(lost)} events lost" in status["health_reason"]
    assert "--ack" in status["health_reason"]
    untaken, queued = status["events_untaken"], status["events_queued"]
    got = _drain(channel)
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert set(got) == all_offsets - delivered_before - lost
    assert untaken == queued == len(got)
    assert channel.status()["events_untaken"] == 0
    return status


def _single_record(status: dict[str, Any]) -> dict[str, Any]:
    records = [r for r in status["losses"]["records"] if r["partition"] != LEDGER_PARTITION]
    assert len(records) == 1, records
    return records[0]


# -- damage the loader reports -----------------------------------------------------------
def test_it_counts_the_events_of_a_deleted_middle_segment_once(tmp_path: Path) -> None:
    config = _config(tmp_path)
    taken = _fill(config)
    bases = _bases(config)
    assert len(bases) >= 4
    lo, hi = bases[2], bases[3]
    _segment(config, lo).unlink()
    lost = set(range(lo, hi)) - taken
    with Channel.open(config) as channel:
        status = _check_counted(channel, lost, taken, set(range(EVENTS)))
        record = _single_record(status)
        assert (record["partition"], record["start"], record["end"]) == (0, lo, hi)
        assert record["events"] == len(lost) and record["cause"].startswith("gap")
        assert record["acknowledged_at_ms"] is None
        assert status["recovery"]["lost_events"] == len(lost)
        assert status["counters"]["lost_events"] == len(lost)
        assert [r["start"] for r in status["recovery"]["lost_ranges"]] == [lo]
    for _ in range(2):  # the hole is reported at every open: it stays one record
        with Channel.open(config) as channel:
            status = channel.status()
            assert _single_record(status)["events"] == len(lost)
            assert status["losses"]["events_lost"] == len(lost)
            # counted once, and kept across opens (counters count since the channel was made)
            assert status["counters"]["lost_events"] == len(lost)
            assert status["events_untaken"] == 0 and _drain(channel) == []


def test_it_counts_the_events_of_a_deleted_last_segment(tmp_path: Path) -> None:
    config = _config(tmp_path)
    taken = _fill(config)
    last = _bases(config)[-1]
    _segment(config, last).unlink()
    lost = set(range(last, EVENTS)) - taken
    with Channel.open(config) as channel:
        record = _single_record(_check_counted(channel, lost, taken, set(range(EVENTS))))
        assert (record["start"], record["end"], record["events"]) == (last, EVENTS, len(lost))
        with channel.put() as tx:
            tx.put(b"event-%04d" % EVENTS)
        assert tx.committed == [(0, EVENTS, EVENTS)]  # no lost offset is handed out again
        assert _drain(channel) == [EVENTS]


@pytest.mark.parametrize("which", ["middle", "last"])
def test_it_counts_the_events_of_a_segment_cut_below_the_recovery_point(
        tmp_path: Path, which: str) -> None:
    config = _config(tmp_path)
    taken = _fill(config)
    bases = _bases(config)
    i = 2 if which == "middle" else len(bases) - 1
    base = bases[i]
    end = bases[i + 1] if which == "middle" else EVENTS
    path = _segment(config, base)
    positions = _batch_positions(path)
    assert len(positions) == end - base >= 4
    with open(path, "r+b") as f:
        f.truncate(positions[3] + 10)  # batch 3 cut in the middle: offsets base+3.. lost
    lost = set(range(base + 3, end)) - taken
    with Channel.open(config) as channel:
        status = _check_counted(channel, lost, taken, set(range(EVENTS)))
        record = _single_record(status)
        assert (record["start"], record["end"]) == (base + 3, end)


def test_it_counts_damage_inside_a_sealed_segment_at_a_clean_open(tmp_path: Path) -> None:
    config = _config(tmp_path)
    taken = _fill(config)
    base = _bases(config)[2]
    path = _segment(config, base)
    position = _batch_positions(path)[1]
    data = bytearray(path.read_bytes())
    data[position + 70] ^= 0x04  # inside the records: only a CRC sees it
    path.write_bytes(bytes(data))
    lost = {base + 1} - taken
    with Channel.open(config) as channel:  # counted at open, not by the take that meets it
        record = _single_record(_check_counted(channel, lost, taken, set(range(EVENTS))))
        assert (record["start"], record["end"]) == (base + 1, base + 2)


def test_it_counts_a_damaged_last_batch_after_a_kill_and_never_reuses_it(
        tmp_path: Path) -> None:
    config = _config(tmp_path)
    channel = Channel.open(config)
    for i in range(EVENTS):
        with channel.put() as tx:
            tx.put(b"event-%04d" % i + b"." * 40)
    crash(channel)  # every put returned after its fsync: all were committed
    path = _segment(config, _bases(config)[-1])
    data = bytearray(path.read_bytes())
    data[len(data.rstrip(b"\0")) - 5] ^= 0x01  # the last batch, complete and damaged
    path.write_bytes(bytes(data))
    with Channel.open(config) as channel:
        record = _single_record(_check_counted(channel, {EVENTS - 1}, set(),
                                               set(range(EVENTS))))
        assert (record["start"], record["end"]) == (EVENTS - 1, EVENTS)
        with channel.put() as tx:
            tx.put(b"event-%04d" % EVENTS)
        assert tx.committed == [(0, EVENTS, EVENTS)]


@pytest.mark.parametrize("durability", ["fsync", "policy"])
@pytest.mark.parametrize("how", ["delete", "truncate_zero"])
def test_it_counts_the_events_of_an_active_segment_destroyed_after_a_kill(
        tmp_path: Path, durability: str, how: str) -> None:
    """No index entry names them (every segment is below index_interval_bytes) and no
    journal record (one partition): log.state's committed end alone remembers them."""
    extra = {"flush_messages": 10**6} if durability == "policy" else {}
    config = make_config(tmp_path, segment_bytes=1024, checkpoint_interval_ms=3_600_000,
                         durability=durability, **extra)
    channel = Channel.open(config)
    for i in range(EVENTS):
        with channel.put() as tx:
            tx.put(b"event-%04d" % i + b"." * 40)
    crash(channel)  # every put returned: all were committed
    last = _bases(config)[-1]
    assert last < EVENTS
    assert all(p.stat().st_size == 0 for p in config.partition_dir(0).glob("*.index"))
    path = _segment(config, last)
    if how == "delete":
        path.unlink()
    else:
        os.truncate(path, 0)
    with Channel.open(config) as channel:
        lost = set(range(last, EVENTS))
        record = _single_record(_check_counted(channel, lost, set(), set(range(EVENTS))))
        assert (record["start"], record["end"], record["events"]) == (last, EVENTS, len(lost))
        with channel.put() as tx:
            tx.put(b"event-%04d" % EVENTS)
        assert tx.committed == [(0, EVENTS, EVENTS)]  # no lost offset is handed out again


def test_it_counts_what_the_checkpoint_saw_beyond_a_cut_log_without_log_state(
        tmp_path: Path) -> None:
    """Without log.state the log cannot tell where it ended; the checkpoint can."""
    config = _config(tmp_path)
    taken = _fill(config)
    last = _bases(config)[-1]
    path = _segment(config, last)
    with open(path, "r+b") as f:
        f.truncate(_batch_positions(path)[2])
    (config.partition_dir(0) / LOG_STATE_FILE).unlink()
    lost = set(range(last + 2, EVENTS)) - taken
    with Channel.open(config) as channel:
        status = _check_counted(channel, lost, taken, set(range(EVENTS)))
        record = _single_record(status)
        assert (record["start"], record["end"]) == (last + 2, EVENTS)
        assert record["cause"].startswith("queue_beyond_log_end")


def test_a_read_only_open_shows_the_losses_and_writes_no_ledger(tmp_path: Path) -> None:
    config = _config(tmp_path)
    taken = _fill(config)
    bases = _bases(config)
    _segment(config, bases[2]).unlink()
    before = (config.home / LEDGER_FILE).read_bytes()
    with Channel.open(config, read_only=True) as channel:
        status = channel.status()
        assert status["losses"]["events_lost"] == len(set(range(bases[2], bases[3])) - taken)
        assert status["health"] == "degraded"
    assert (config.home / LEDGER_FILE).read_bytes() == before


# -- losses met at use -------------------------------------------------------------------
def _fresh(tmp_path: Path, events: int = 30) -> Channel:
    config = make_config(tmp_path)
    channel = Channel.open(config)
    for i in range(events):
        with channel.put() as tx:
            tx.put(b"event-%04d" % i)
    return channel


def _log(channel: Channel) -> PartitionLog:
    """The owner's log of the channel's one partition."""
    owner = channel.owner
    assert owner is not None
    return owner.logs[0]


def test_a_loss_met_by_a_take_is_counted_and_never_delivered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _fresh(tmp_path)
    log = _log(channel)
    read_batches = log.read_batches

    def damaged(start: int, end: int, max_bytes: int) -> Iterator[Any]:
        log.state.new_losses.append(LostRange(start + 2, start + 4, str(log.directory),
                                         cause="test: damage met by a read"))
        monkeypatch.undo()
        yield from read_batches(start, end, max_bytes)
    monkeypatch.setattr(log, "read_batches", damaged)
    with channel.take() as tx:
        assert [e.offset for e in tx.take(10)] == [0, 1, *range(4, 10)]
    assert channel.status()["counters"]["take_successes"] == 8
    crash(channel)  # no checkpoint: the marking was journalled after the ledger record
    with Channel.open(channel.config) as again:
        assert again.status()["losses"]["events_lost"] == 2
        _check_counted(again, {2, 3}, set(range(10)), set(range(30)))


def test_a_loss_reported_between_takes_leaves_the_queue_first(tmp_path: Path) -> None:
    with _fresh(tmp_path) as channel:
        with channel.take() as tx:
            tx.take(5)
        _log(channel).state.new_losses.append(LostRange(3, 12, "x", cause="test"))
        # 3 and 4 were taken already: only 5..11 are lost events
        _check_counted(channel, set(range(5, 12)), set(range(5)), set(range(30)))


def test_offsets_a_read_did_not_return_are_counted_not_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _fresh(tmp_path)
    log = _log(channel)
    read_batches = log.read_batches

    def skipping(start: int, end: int, max_bytes: int) -> Iterator[Any]:
        for item in read_batches(start, end, max_bytes):
            if item[1].base_offset != 3:  # one batch silently missing
                yield item
    monkeypatch.setattr(log, "read_batches", skipping)
    with channel.take() as tx:
        assert [e.offset for e in tx.take(10)] == [0, 1, 2, *range(4, 10)]
    monkeypatch.undo()
    status = channel.status()
    record = _single_record(status)
    assert (record["start"], record["end"], record["events"]) == (3, 4, 1)
    assert record["cause"].startswith("unreadable")
    _check_counted(channel, {3}, set(range(10)), set(range(30)))
    channel.close()


# -- acknowledging -----------------------------------------------------------------------
def _damaged(tmp_path: Path) -> tuple[ChannelConfig, int]:
    config = _config(tmp_path)
    taken = _fill(config)
    bases = _bases(config)
    _segment(config, bases[2]).unlink()
    return config, len(set(range(bases[2], bases[3])) - taken)


def test_health_is_degraded_until_the_owner_acknowledges(tmp_path: Path) -> None:
    config, lost = _damaged(tmp_path)
    with Channel.open(config) as channel:
        assert channel.status()["health"] == "degraded"
        assert channel.acknowledge_losses() == 1
        assert channel.acknowledge_losses() == 0
        status = channel.status()
        assert status["health"] == "healthy", status["health_reason"]
        assert status["losses"]["events_lost"] == lost
        assert status["losses"]["unacknowledged"] == 0
        assert status["losses"]["unacknowledged_events"] == 0
        assert status["losses"]["records"][0]["acknowledged_at_ms"] is not None
    with Channel.open(config) as channel:  # the acknowledgement survives reopening
        status = channel.status()
        assert status["health"] == "healthy", status["health_reason"]
        assert status["losses"]["events_lost"] == lost


def test_a_client_process_acknowledges_through_the_owner(tmp_path: Path) -> None:
    config, _ = _damaged(tmp_path)
    with Channel.open(config) as channel:
        assert channel.role == "owner" and channel.status()["health"] == "degraded"
        code = textwrap.dedent(f"""
            from channel_engine import Channel
            with Channel.open({str(config.home)!r}) as channel:
                print(channel.role, channel.acknowledge_losses())
        """)
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.stdout.split() == ["client", "1"], out.stderr
        assert channel.status()["health"] == "healthy"


def test_recover_ack_acknowledges_and_prints_what_it_acknowledged(tmp_path: Path) -> None:
    config, lost = _damaged(tmp_path)
    out = _Output()
    assert cli.main(["recover", str(config.home), "--ack", "--json"], out) == 0
    printed = json.loads(out.text)
    assert printed["lost_events"] == lost
    [acknowledged] = printed["acknowledged"]
    assert acknowledged["events"] == lost and acknowledged["acknowledged_at_ms"] is not None
    with Channel.open(config) as channel:
        assert channel.status()["health"] == "healthy"
    text = _Output()
    assert cli.main(["recover", str(config.home), "--ack"], text) == 0
    assert "acknowledged 0 loss records" in text.text


class _Output:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


# -- a damaged or missing ledger ---------------------------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_a_damaged_or_missing_ledger_is_reported_not_fatal(tmp_path: Path, damage: str) -> None:
    config, _ = _damaged(tmp_path)
    with Channel.open(config) as channel:
        channel.acknowledge_losses()
    ledger = config.home / LEDGER_FILE
    if damage == "garbage":
        ledger.write_bytes(b"\x00garbage")
    else:
        ledger.unlink()
    with Channel.open(config) as channel:
        status = channel.status()
        causes = [r["cause"] for r in status["losses"]["records"]]
        assert causes[0].startswith(f"ledger_{'damaged' if damage == 'garbage' else 'missing'}")
        assert status["health"] == "degraded"
        # the hole is still reported (its events were counted before the ledger went)
        assert any(c.startswith("gap") for c in causes)
    if damage == "garbage":
        assert [p.name for p in config.home.glob(f"{LEDGER_FILE}.damaged-*")]


# -- kill -9 between the ledger and the checkpoint ------------------------------------------
@pytest.mark.parametrize("when", ["before_ledger", "after_ledger"])
def test_a_kill_between_ledger_and_checkpoint_loses_no_count(tmp_path: Path,
                                                            when: str) -> None:
    config, lost = _damaged(tmp_path)
    code = textwrap.dedent(f"""
        import os, signal
        from channel_engine import Channel
        from channel_engine.queue import loss_ledger
        save = loss_ledger.LossLedger.save
        def dying_save(self):
            if any(r.partition >= 0 for r in self.records):
                if {when!r} == "before_ledger":
                    os.kill(os.getpid(), signal.SIGKILL)
                save(self)
                os.kill(os.getpid(), signal.SIGKILL)
            save(self)
        loss_ledger.LossLedger.save = dying_save
        Channel.open({str(config.home)!r})
        print("not killed")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == -9, (out.stdout, out.stderr)
    records = json.loads((config.home / LEDGER_FILE).read_text())["records"]
    assert len(records) == (1 if when == "after_ledger" else 0)
    with Channel.open(config) as channel:
        status = channel.status()
        assert _single_record(status)["events"] == lost
        assert status["losses"]["events_lost"] == lost
        assert status["events_untaken"] == len(_drain(channel))


def test_a_loss_met_by_an_inspection_read_is_counted(tmp_path: Path) -> None:
    with _fresh(tmp_path) as channel:
        owner = channel.owner
        assert owner is not None
        log = owner.logs[0]
        reader = log.reader  # the part whose reads PartitionLog.read delegates to
        read_batches = reader.read_batches

        def damaged(start: int, end: int, max_bytes: int) -> Iterator[Any]:
            log.state.new_losses.append(LostRange(20, 25, str(log.directory), cause="test"))
            yield from read_batches(start, end, max_bytes)
        reader.read_batches = damaged  # type: ignore[method-assign]
        channel.read(0, 18, 5)
        del reader.read_batches
        _check_counted(channel, set(range(20, 25)), set(), set(range(30)))
        log.state.new_losses.append(LostRange(0, 2, str(log.directory), cause="test"))
        assert len(list(owner.events(0, 0, 30))) == 30  # an owner's full scan counts too
        assert len(owner.losses.ledger.unacknowledged()) == 2  # counted before any status call


def test_no_checkpoint_persists_a_marking_whose_ledger_record_is_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _fresh(tmp_path)

    def fail(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as patch:
        patch.setattr(loss_ledger, "write_atomically", fail)
        _log(channel).state.new_losses.append(LostRange(4, 9, "x", cause="test"))
        status = channel.status()  # status still answers, and shows the loss
        assert status["losses"]["events_lost"] == 5 and status["health"] == "degraded"
        with pytest.raises(StorageError, match="losses.json"):
            channel.checkpoint()
        crash(channel)
    with Channel.open(channel.config) as again:
        # nothing of the loss reached the disk: the events are still there to take
        assert again.status()["losses"]["events_lost"] == 0
        assert len(_drain(again)) == 30


def test_an_open_takes_lost_offsets_leave_it_and_its_commit_never_marks_them(
        tmp_path: Path) -> None:
    """The channel's rule for a loss met while a take holds the offsets: they leave the
    take and are counted lost (the take's commit journals only what it still holds)."""
    channel = _fresh(tmp_path)
    tx = channel.take()
    assert [e.offset for e in tx.take(10)] == list(range(10))
    _log(channel).state.new_losses.append(LostRange(5, 15, "x", cause="test"))
    status = channel.status()
    assert status["losses"]["events_lost"] == 10
    assert status["events_in_flight"] == 5 and status["events_queued"] == 15
    tx.commit()
    assert channel.status()["counters"]["take_successes"] == 5
    crash(channel)  # the take's journal record and the loss's replay alike
    with Channel.open(channel.config) as again:
        assert again.status()["losses"]["events_lost"] == 10
        assert _drain(again) == list(range(15, 30))


def test_a_read_that_reports_a_loss_and_raises_does_not_wedge_the_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _fresh(tmp_path)
    log = _log(channel)

    def failing(start: int, end: int, max_bytes: int) -> Iterator[Any]:
        log.state.new_losses.append(LostRange(0, 3, str(log.directory), cause="test"))
        raise CorruptRecordError(str(log.directory), 0, "test: damage met by a read")
        yield
    monkeypatch.setattr(log, "read_batches", failing)
    with pytest.raises(CorruptRecordError), channel.take() as tx:
        tx.take(3)
    monkeypatch.undo()
    assert channel.status()["counters"]["take_errors"] == 1
    _check_counted(channel, {0, 1, 2}, set(), set(range(30)))
    channel.close()


def _as_version_2(checkpoint: Path) -> None:
    """Rewrite a checkpoint as a release before loss ledgers wrote it: version 2, whose
    layout is version 5's without the records versions 4 and 5 append (no subscriptions
    besides `default`, no aborted ranges, no counters: test_checkpoint.py's golden v2)."""
    import dataclasses

    import crc32c

    from channel_engine.queue import checkpoint as checkpoint_file

    saved = checkpoint_file.read(checkpoint)
    bare = dataclasses.replace(saved, subscriptions=(), aborted=(), counters=(),
                               subscription_counters=())
    appended = 8 + 4 * len(saved.partitions) + 8  # v4: subscriptions, aborted; v5: counters
    data = bytearray(checkpoint_file.encode(bare)[:-4 - appended])
    data[4] = 2
    data += crc32c.crc32c(bytes(data)).to_bytes(4, "big")
    assert checkpoint_file.decode(bytes(data)).version == 2
    checkpoint.write_bytes(bytes(data))


def test_an_upgraded_channel_without_a_ledger_opens_healthy(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"before the upgrade")
    (config.home / LEDGER_FILE).unlink()
    _as_version_2(config.home / "checkpoint")
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["health"] == "healthy" and status["losses"]["records"] == []
        assert status["events_untaken"] == 1
    assert (config.home / LEDGER_FILE).exists()


def test_a_ledger_lost_beside_a_version_3_checkpoint_is_reported(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / LEDGER_FILE).unlink()
    with Channel.open(config) as channel:
        records = channel.status()["losses"]["records"]
        assert [r["partition"] for r in records] == [LEDGER_PARTITION]
        assert "ledger_missing" in records[0]["cause"]
        assert channel.status()["health"] == "degraded"


def test_a_kill_between_the_ledger_and_the_takes_journal_record_counts_the_place_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A take's read meets a damaged batch part of which was taken before (so it reports
    the rest: offsets 7..9); the ledger record is durable, then the owner dies before the
    journal record that marks them. The next open repairs the segment and reports the whole
    damaged batch (5..9): the same place, the same offsets 7..9, counted once."""
    config = _config(tmp_path)
    with Channel.open(config) as channel:
        for b in range(6):  # batch b holds offsets 5b..5b+4
            with channel.put() as tx:
                for i in range(5):
                    tx.put(b"event-%04d" % (5 * b + i) + b"." * 40)
        with channel.take() as tx:
            assert len(tx.take(7)) == 7  # 0..6: batch 1 partly taken
    channel = Channel.open(config)
    owner = channel.owner
    assert owner is not None
    path = _segment(config, 0)
    position = _batch_positions(path)[1]
    with open(path, "r+b") as f:  # damage met at use: the open has checked the bytes
        f.seek(position + 80)
        byte = f.read(1)
        f.seek(position + 80)
        f.write(bytes([byte[0] ^ 0x20]))

    def killed() -> None:
        raise RuntimeError("killed before the take-0 journal record")
    monkeypatch.setattr(owner.state, "live_journal", killed)
    with pytest.raises(RuntimeError, match="killed"), channel.take() as tx:
        tx.take(5)
    [record] = json.loads((config.home / LEDGER_FILE).read_text())["records"]
    assert (record["start"], record["end"], record["events"]) == (7, 10, 3)
    crash(channel)
    with Channel.open(config) as again:
        records = [r for r in again.status()["losses"]["records"] if r["partition"] == 0]
        assert sum(r["events"] for r in records) == 3, records
        _check_counted(again, {7, 8, 9}, set(range(7)), set(range(30)))


# -- a partition directory lost and made again ---------------------------------------------
def _drain_run(channel: Channel, sent: dict[int, list[tuple[int, int]]]) -> dict[int, list[int]]:
    """What a drain (the export, the Kafka sink) delivers in one run: its subscription's
    reserved ranges less what it has sent (offset_ranges.subtract); marks them sent."""
    delivered: dict[int, list[int]] = {}
    with channel.take(subscription="export") as tx:
        for partition, start, end in tx.reserve(1_000):
            for low, high in subtract((start, end), sent.get(partition, [])):
                delivered.setdefault(partition, []).extend(range(low, high))
                sent.setdefault(partition, []).append((low, high))
    return delivered


def test_a_recreated_partition_never_hands_out_its_lost_offsets_again(tmp_path: Path) -> None:
    """The home (checkpoint) survives, a data directory does not: the partition made again
    goes on at the end the checkpoint knew, the loss names that range, and a drain that
    sent the old offsets delivers the new events (offsets reused would be skipped)."""
    config = make_config(tmp_path, partitions=2)
    sent: dict[int, list[tuple[int, int]]] = {}
    with Channel.open(config) as channel:
        channel.add_subscription("export")
        with channel.put() as tx:
            for i in range(10):
                tx.put(b"old-%d" % i, key=b"%d" % i)
        first = _drain_run(channel, sent)
    held = len(first[1])
    assert held > 0 and first[1] == list(range(held))
    shutil.rmtree(config.partition_dir(1))
    with Channel.open(config, existed=True) as channel:  # the operator's recreate
        status = channel.status()
        part = status["partitions"][1]
        assert (part["log_start_offset"], part["log_end_offset"]) == (held, held)
        assert [(r["partition"], r["start"], r["end"]) for r in status["losses"]["records"]
                ] == [(1, 0, held)]
        with channel.put() as tx:
            for i in range(10):
                tx.put(b"new-%d" % i, key=b"%d" % i)
        assert {p for p, _, _ in tx.committed} == {0, 1}
        assert all(start >= held for p, start, _ in tx.committed if p == 1)
        again = _drain_run(channel, sent)
        assert again[1] == list(range(held, held * 2))
        bodies = [e.body for e in channel.read(1, held, 100)]
        assert len(bodies) == held and all(b.startswith(b"new-") for b in bodies)
    with Channel.open(config) as channel:  # the next open finds no new loss, no gap
        assert channel.status()["partitions"][1]["log_start_offset"] == held
        assert len(channel.status()["losses"]["records"]) == 1

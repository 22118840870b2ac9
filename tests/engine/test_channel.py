"""Channel semantics, one behaviour per test: transactions, capacity, the disk guard,
takes and leases, multi-partition atomicity, checkpoints, reopen, roles, status."""
from __future__ import annotations

import contextlib
import errno
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from channel_helpers import appends_refused, crash, make_config
from kafka.partitioner.default import murmur2 as kafka_murmur2

from channel_engine import (
    Channel,
    ChannelConfig,
    ChannelFullError,
    ChannelGoneError,
    ConfigError,
    DiskFullError,
    DiskSpaceError,
    InvalidEventError,
    LogDirectoryError,
    OffsetOutOfRangeError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
    TransactionStateError,
)
from channel_engine.log.recovery import LostRange
from channel_engine.log.segment import LogSegment
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal


def put(channel: Channel, *bodies: bytes, key: bytes | None = None) -> list[tuple[int, int, int]]:
    with channel.put() as tx:
        for body in bodies:
            tx.put(body, key=key)
    return tx.committed


def take_all(channel: Channel, n: int | None = None) -> list[bytes]:
    with channel.take() as tx:
        return [e.body for e in tx.take(n or channel.config.transaction_capacity)]


def bodies(n: int, prefix: str = "e") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


# -- put and take --------------------------------------------------------------------------
def test_put_then_take_returns_every_field(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        with channel.put() as tx:
            tx.put(b"body", key=b"k", headers={"h": b"v", "empty": b""}, timestamp=1234)
            tx.put(b"")
        assert tx.committed == [(0, 0, 1)]
        with channel.take() as take:
            first, second = take.take(10)
        assert (first.partition, first.offset, first.timestamp, first.key, first.headers,
                first.body) == (0, 0, 1234, b"k", {"h": b"v", "empty": b""}, b"body")
        assert (second.offset, second.key, second.body) == (1, None, b"")
        assert take_all(channel) == []


def test_a_rolled_back_put_writes_nothing(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        with pytest.raises(RuntimeError), channel.put() as tx:
            tx.put(b"never")
            raise RuntimeError("producer failed")
        explicit = channel.put()
        explicit.put(b"never either")
        explicit.rollback()
        assert channel.owner is not None
        assert channel.owner.logs[0].log_end_offset == 0
        assert take_all(channel) == []
        assert channel.status()["counters"]["rollbacks"] == 2
        with pytest.raises(TransactionStateError):
            explicit.put(b"after the end")


def test_bad_events_are_refused_naming_index_and_field(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        tx = channel.put()
        tx.put(b"fine")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"body": "text"}, "body"), ({"body": b"x", "key": 5}, "key"),
            ({"body": b"x", "headers": {"h": 1.5}}, "headers.h"),
            ({"body": b"x", "headers": {"h": "\udcff"}}, "headers.h"),
            ({"body": b"x", "headers": [("h", b"v")]}, "headers"),
            ({"body": b"x", "timestamp": -1}, "timestamp"),
            ({"body": b"x", "timestamp": 1.5}, "timestamp")]
        for kwargs, field in cases:
            with pytest.raises(InvalidEventError) as info:
                tx.put(**kwargs)
            assert info.value.field == field and info.value.index == 1
        assert len(tx) == 1
        tx.commit()
        assert take_all(channel) == [b"fine"]


def test_transaction_capacity_is_enforced_and_the_transaction_unchanged(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, transaction_capacity=3)) as channel:
        with channel.put() as tx:
            for body in bodies(3):
                tx.put(body)
            with pytest.raises(TransactionCapacityError, match="transaction_capacity=3"):
                tx.put(b"one too many")
        assert len(tx.committed) == 1 and tx.committed[0][1:] == (0, 2)
        put(channel, b"x", b"y")
        with channel.take() as take:
            assert len(take.take(2)) == 2
            with pytest.raises(TransactionCapacityError):
                take.take(2)
            assert len(take.take(1)) == 1


def test_a_full_channel_waits_keep_alive_then_fails_naming_the_channel(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, name="orders", capacity=5, transaction_capacity=5,
                                  keep_alive_ms=200)) as channel:
        put(channel, *bodies(4))
        started = time.monotonic()
        with pytest.raises(ChannelFullError, match="'orders' is full") as info:
            put(channel, b"a", b"b")
        assert time.monotonic() - started >= 0.19
        assert info.value.untaken == 4 and info.value.capacity == 5
        put(channel, b"fits")  # exactly at capacity
        assert channel.status()["fill_percent"] == 100.0
        assert channel.status()["counters"]["put_errors"] == 1


def test_a_waiting_put_goes_through_when_a_take_commits(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, capacity=4, keep_alive_ms=5_000)) as channel:
        put(channel, *bodies(4))

        def consume() -> None:
            time.sleep(0.2)
            take_all(channel, 2)

        consumer = threading.Thread(target=consume)
        consumer.start()
        started = time.monotonic()
        put(channel, b"late-1", b"late-2")
        consumer.join()
        assert 0.15 < time.monotonic() - started < 4
        assert take_all(channel) == [b"e2", b"e3", b"late-1", b"late-2"]


def test_the_disk_guard_refuses_puts_but_takes_and_checkpoints_go_on(tmp_path: Path) -> None:
    free = {"bytes": 10**12}
    config = make_config(tmp_path, minimum_required_space=1_000_000)
    with Channel.open(config, free_space=lambda _d: free["bytes"]) as channel:
        put(channel, b"before")
        free["bytes"] = 999_999
        with pytest.raises(DiskSpaceError, match="minimum_required_space=1000000"):
            put(channel, b"refused")
        assert channel.status()["health"] == "unhealthy"
        assert take_all(channel) == [b"before"]
        channel.checkpoint()
        assert channel.owner is not None and channel.owner.logs[0].log_end_offset == 1


def test_it_counts_a_full_disk_and_is_degraded_until_space_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = {"bytes": 0}
    with Channel.open(make_config(tmp_path), free_space=lambda _d: free["bytes"]) as channel:
        put(channel, b"before")
        real_append = LogSegment.append

        def enospc(*args: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(LogSegment, "append", enospc)  # the disk is full
        with pytest.raises(DiskFullError, match="No space left"):
            put(channel, b"refused")
        status = channel.status()
        assert status["counters"]["disk_full_errors"] == 1
        assert (status["health"], status["health_reason"][:17]) == ("degraded",
                                                                    "the disk is full:")
        free["bytes"] = 10**9  # space is back (an operator cleaned up): healthy again
        assert channel.status()["health"] == "healthy"
        free["bytes"] = 0
        with pytest.raises(DiskFullError):
            put(channel, b"refused again")
        assert channel.status()["health"] == "degraded"
        monkeypatch.setattr(LogSegment, "append", real_append)
        put(channel, b"after")  # a put that succeeds proves it too
        assert channel.status()["health"] == "healthy"
        assert take_all(channel) == [b"before", b"after"]


# -- takes ---------------------------------------------------------------------------------
def test_take_on_an_empty_channel_returns_at_once(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        started = time.monotonic()
        assert take_all(channel) == []
        assert time.monotonic() - started < 0.5


def test_rollback_returns_events_to_the_head_in_order(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        put(channel, *bodies(10))
        first = channel.take()
        assert [e.body for e in first.take(3)] == bodies(3)
        second = channel.take()
        assert [e.body for e in second.take(3)] == [b"e3", b"e4", b"e5"]
        first.rollback()
        second.commit()
        assert take_all(channel) == [b"e0", b"e1", b"e2", b"e6", b"e7", b"e8", b"e9"]


def test_concurrent_takes_never_get_the_same_event(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=3, transaction_capacity=100)
    with Channel.open(config) as channel:
        for batch in range(40):
            with channel.put() as tx:
                for i in range(50):
                    tx.put(f"{batch}-{i}".encode(), key=str(i).encode())
        got: list[bytes] = []
        lock = threading.Lock()

        def consume(seed: int) -> None:
            rollbacks = 0
            while True:
                with channel.take() as tx:
                    events = tx.take(7 + seed)
                    if seed % 2 and events and rollbacks < 20:
                        rollbacks += 1
                        tx.rollback()
                        continue
                with lock:
                    got.extend(e.body for e in events)
                if not events:
                    return

        threads = [threading.Thread(target=consume, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 2000 and len(set(got)) == 2000


def test_a_lapsed_lease_returns_the_events_and_the_commit_fails(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        put(channel, *bodies(3))
        take = channel.take(lease_ms=50)
        assert len(take.take(2)) == 2
        time.sleep(0.1)
        assert take_all(channel) == bodies(3)
        with pytest.raises(TakeExpiredError, match="lease"):
            take.commit()
        assert take.state == "rolled back"
        assert channel.status()["counters"]["takes_expired"] == 1


def test_keys_go_where_kafka_would_put_them_and_keyless_puts_rotate(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=3)) as channel:
        for key in (b"alpha", b"beta", b"gamma", b"21"):
            [(partition, _, _)] = put(channel, b"x", key=key)
            assert partition == (kafka_murmur2(key) & 0x7FFFFFFF) % 3
        keyless = [put(channel, b"a", b"b")[0][0] for _ in range(6)]
        assert sorted(keyless) == [0, 0, 1, 1, 2, 2]


# -- multi-partition puts ------------------------------------------------------------------
def keyed_put(channel: Channel, n: int) -> PutTransactionLike:
    tx = channel.put()
    for i in range(n):
        tx.put(f"k{i}".encode(), key=f"key-{i}".encode())
    return tx


PutTransactionLike = Any


def test_a_put_failing_on_its_second_partition_leaves_nothing_visible(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    with appends_refused(1), pytest.raises(DiskFullError):
        keyed_put(channel, 10).commit()
    assert channel.owner is not None and channel.owner.logs[0].log_end_offset > 0  # written...
    assert take_all(channel) == []  # ...but never delivered
    log = channel.owner.logs[0]  # made durable as written, as the log's end says: read to it
    assert log.high_watermark == log.log_end_offset
    assert channel.read(0, log.log_end_offset) == []
    status = channel.status()
    assert status["counters"]["aborted_events"] > 0 and status["events_untaken"] == 0
    crash(channel)
    with Channel.open(config) as reopened:
        assert take_all(reopened) == []
        assert reopened.status()["recovery"]["aborted_events"] > 0
        tx = keyed_put(reopened, 10)
        tx.commit()
        assert sorted(take_all(reopened)) == sorted(f"k{i}".encode() for i in range(10))


def test_a_crash_before_the_commit_record_aborts_the_whole_put(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    put(channel, b"committed before")
    owner = channel.owner
    assert owner is not None

    def die(*_args: object) -> None:
        raise SystemExit("killed between the batches and the commit record")

    monkeypatch.setattr(owner.puts, "_journal_put", die)
    with pytest.raises(SystemExit):
        keyed_put(channel, 10).commit()
    crash(channel)
    with Channel.open(config) as reopened:
        assert take_all(reopened) == [b"committed before"]
        assert reopened.status()["recovery"]["aborted_events"] == 10


def read_all(channel: Channel, partition: int, start: int = 0, limit: int = 100) -> list[bytes]:
    """Every event body a partition serves from `start` on, read `limit` at a time."""
    got, offset = [], start
    while events := channel.read(partition, offset, limit):
        got += [e.body for e in events]
        offset = events[-1].offset + 1
    return got


@pytest.mark.parametrize("limit", [1, 3, 100])
@pytest.mark.parametrize("how", ["failed in the owner", "crashed before its record"])
def test_reads_never_show_the_events_of_an_aborted_put(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, limit: int) -> None:
    """An aborted put's batches stay in the log; read() skips them as Kafka's read_committed
    consumer skips an aborted transaction, in the owner, through a client, in a read-only
    snapshot, after recovery aborted it, and once a checkpoint keeps the abort."""
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    before = [put(channel, b"p0-before-%d" % i, key=b"key-1") for i in range(2)]
    owner = channel.owner
    assert owner is not None and {p for [(p, _, _)] in before} == {0}
    if how == "failed in the owner":  # its partition 0 batch written, partition 1's refused
        with appends_refused(1), pytest.raises(DiskFullError):
            keyed_put(channel, 10).commit()
    else:
        def die(*_args: object) -> None:
            raise SystemExit("killed between the batches and the commit record")

        monkeypatch.setattr(owner.puts, "_journal_put", die)
        with pytest.raises(SystemExit):
            keyed_put(channel, 10).commit()
        monkeypatch.undo()
    aborted_end = owner.logs[0].log_end_offset
    assert aborted_end > 2  # the aborted batch is in partition 0's log, after the two puts
    put(channel, b"p0-after", key=b"key-1")
    wanted = [b"p0-before-0", b"p0-before-1", b"p0-after"]

    def check(reader: Channel) -> None:
        assert read_all(reader, 0, limit=limit) == wanted
        assert read_all(reader, 0, start=3, limit=limit) == [b"p0-after"]  # inside it
        assert reader.read(0, aborted_end - 1, limit) == reader.read(0, aborted_end, limit)
        assert read_all(reader, 1) == []

    check(channel)
    with Channel.open(config) as client:
        assert client.owner is None
        check(client)
    with Channel.open(config, read_only=True) as snapshot:
        check(snapshot)
    crash(channel)
    with Channel.open(config) as reopened:  # recovery aborts it (no commit record)
        assert reopened.status()["recovery"]["aborted_events"] > 0
        check(reopened)
        reopened.checkpoint()
    with Channel.open(config) as again:  # the checkpoint keeps the abort
        check(again)
        assert sorted(take_all(again)) == sorted(wanted)


def test_takes_wait_behind_a_put_that_is_still_committing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        owner = channel.owner
        assert owner is not None
        journal_put = owner.puts._journal_put
        written, release = threading.Event(), threading.Event()

        def slow_commit(*args: Any) -> None:
            written.set()
            release.wait(5)
            journal_put(*args)

        monkeypatch.setattr(owner.puts, "_journal_put", slow_commit)
        committer = threading.Thread(target=lambda: keyed_put(channel, 10).commit())
        committer.start()
        assert written.wait(5)
        assert take_all(channel) == []  # both batches are in the logs, not yet committed
        assert channel.status()["partitions"][0]["last_stable_offset"] == 0
        release.set()
        committer.join()
        assert len(take_all(channel)) == 10


# -- checkpoints and reopen ----------------------------------------------------------------
def test_checkpoint_deletes_taken_segments_and_old_journals(tmp_path: Path) -> None:
    config = make_config(tmp_path, segment_bytes=2048, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    with Channel.open(config) as channel:
        for i in range(30):
            put(channel, *bodies(10, f"{i:-<100}"))
        assert channel.owner is not None
        log = channel.owner.logs[0]
        segments = len(log.segments)
        assert segments > 3
        assert len(take_all(channel)) == 300
        result = channel.checkpoint()
        assert result.backup == "written" and result.segments_deleted == segments - 1
        assert result.lock_held_ms < 50
        assert len(log.segments) == 1 and log.log_start_offset == log.segments[0].base_offset
        assert commit_journal.generations(config.home) == [result.sequence]
        status = channel.status()
        assert status["checkpoint"]["sequence"] == result.sequence
        assert status["checkpoint"]["history"][-1]["sequence"] == result.sequence


def test_a_damaged_primary_checkpoint_falls_back_to_the_backup(tmp_path: Path) -> None:
    config = make_config(tmp_path, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    channel = Channel.open(config)
    put(channel, *bodies(5))
    take_all(channel, 2)
    channel.checkpoint()
    crash(channel)
    primary = config.home / checkpoint_file.FILE_NAME
    data = bytearray(primary.read_bytes())
    data[30] ^= 0xFF
    primary.write_bytes(bytes(data))
    with Channel.open(config) as reopened:
        recovery = reopened.status()["recovery"]
        assert recovery["checkpoint_source"] == "backup"
        assert any("CRC" in problem for problem in recovery["problems"])
        assert take_all(reopened) == [b"e2", b"e3", b"e4"]


def test_without_any_checkpoint_the_logs_are_replayed_and_it_says_so(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    channel = Channel.open(config)
    put(channel, *bodies(4))
    crash(channel)
    (config.home / checkpoint_file.FILE_NAME).unlink()
    with Channel.open(config) as reopened:
        recovery = reopened.status()["recovery"]
        assert recovery["checkpoint_source"] is None
        assert any("no valid checkpoint" in p for p in recovery["problems"])
        assert take_all(reopened) == bodies(4)


def test_capacity_changes_across_reopen_without_a_rebuild(tmp_path: Path) -> None:
    config = make_config(tmp_path, capacity=100, keep_alive_ms=0)
    with Channel.open(config) as channel:
        put(channel, *bodies(8))
    smaller = config.replace(capacity=5, transaction_capacity=5)
    with Channel.open(smaller) as channel:
        status = channel.status()
        assert status["recovery"]["checkpoint_source"] == "primary"
        assert status["events_untaken"] == 8 and status["fill_percent"] == 160.0
        with pytest.raises(ChannelFullError):
            put(channel, b"no room")
        assert len(take_all(channel, 4)) == 4
        put(channel, b"room again")
    with Channel.open(config.replace(capacity=1_000)) as channel:
        assert len(take_all(channel)) == 5


def test_partitions_can_grow_but_not_shrink_and_data_dirs_stay(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    Channel.open(config).close()
    with pytest.raises(ConfigError, match="cannot shrink"):
        Channel.open(config.replace(partitions=1))
    with pytest.raises(ConfigError, match="data_dirs") as info:
        Channel.open(config.replace(data_dirs=(str(tmp_path / "elsewhere"),)))
    assert info.value.field == "data_dirs"
    with Channel.open(config.replace(partitions=4)) as channel:
        assert len(channel.status()["partitions"]) == 4
    assert ChannelConfig.load(config.home).partitions == 4


def test_policy_mode_reports_unflushed_events_until_flush(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, durability="policy", flush_ms=60_000)) as channel:
        put(channel, *bodies(5))
        assert channel.status()["unflushed_events"] == 5
        assert take_all(channel) == bodies(5)  # visible at once in policy mode
        channel.flush()
        assert channel.status()["unflushed_events"] == 0


def test_opt_in_retention_drops_untaken_events_and_counts_them(tmp_path: Path) -> None:
    now = {"s": 1_700_000_000.0}
    config = make_config(tmp_path, segment_bytes=1024, retention_ms=60_000)
    with Channel.open(config, clock=lambda: now["s"]) as channel:
        for i in range(10):
            with channel.put() as tx:
                for body in bodies(5, f"old{i}-"):
                    tx.put(body, timestamp=int(now["s"] * 1000))
        now["s"] += 3600
        put(channel, b"fresh")
        result = channel.apply_retention()
        assert result["events_dropped"] > 0
        assert channel.status()["counters"]["dropped_events"] == result["events_dropped"]
        left = take_all(channel)
        assert left[-1] == b"fresh" and len(left) == 51 - result["events_dropped"]


# -- roles and status ----------------------------------------------------------------------
def test_a_second_open_becomes_a_client_of_the_owner(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as owner, Channel.open(config.home) as client:
        assert (owner.role, client.role) == ("owner", "client")
        put(client, b"from the client", key=b"k")
        take = client.take()
        [event] = take.take(5)
        assert event.body == b"from the client"
        assert owner.status()["events_in_flight"] == 1
        take.rollback()
        assert take_all(owner) == [b"from the client"]
        with pytest.raises(OffsetOutOfRangeError) as info:  # the owner's errors, same class
            client.read(0, 999)
        assert info.value.log_end_offset == 1
        with pytest.raises(ValueError, match="partitions 0...1"):
            client.read(7, 0)
        status = client.status()
        assert status["role"] == "client" and status["owner_pid"] == owner.status()["owner_pid"]


def test_closing_a_client_returns_its_takes(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as owner:
        put(owner, *bodies(3))
        client = Channel.open(config)
        take = client.take()
        assert len(take.take(2)) == 2
        client.close()
        deadline = time.monotonic() + 5
        while owner.status()["events_in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert take_all(owner) == bodies(3)


def test_when_the_owner_closes_a_client_becomes_the_owner(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    first = Channel.open(config)
    second = Channel.open(config)
    put(second, b"one")
    first.close()
    put(second, b"two")  # elects itself
    assert second.role == "owner"
    assert take_all(second) == [b"one", b"two"]
    second.close()


def test_read_only_opens_a_snapshot_beside_the_owner(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as owner:
        put(owner, *bodies(3))
        owner.checkpoint()
        with Channel.open(config.home, read_only=True) as snapshot:
            status = snapshot.status()
            assert status["role"] == "read-only" and status["events_untaken"] == 3
            with pytest.raises(TransactionStateError, match="read-only"):
                snapshot.put()
            assert [e.body for e in snapshot.read(0, 0)] == bodies(3)


def test_the_owner_enforces_transaction_capacity_whatever_a_client_believes(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, transaction_capacity=5)
    with Channel.open(config) as owner, \
            Channel.open(config.replace(transaction_capacity=50)) as client:
        tx = client.put()
        for body in bodies(6):
            tx.put(body)
        with pytest.raises(TransactionCapacityError, match="transaction_capacity=5"):
            tx.commit()
        assert owner.status()["events_untaken"] == 0
        put(owner, *bodies(5))
        with client.take() as take, pytest.raises(TransactionCapacityError):
            take.take(6)


def test_status_is_json_and_counts_like_flume(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=2, capacity=100)) as channel:
        put(channel, *bodies(10))
        with channel.take() as tx:
            tx.take(4)
        rolled = channel.take()
        rolled.take(3)
        rolled.rollback()
        status = json.loads(json.dumps(channel.status()))
        assert status["counters"]["put_attempts"] == 10
        assert status["counters"]["put_successes"] == 10
        assert status["counters"]["take_successes"] == 4
        assert status["counters"]["rollbacks"] == 1
        assert status["events_untaken"] == 6 and status["fill_percent"] == 6.0
        assert status["health"] == "healthy" and len(status["partitions"]) == 2
        assert {"recovery_point", "log_end_offset", "unflushed_events", "segments",
                "last_stable_offset"} <= set(status["partitions"][0])


def test_reading_by_offset_and_time_does_not_move_the_queue(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path)) as channel:
        with channel.put() as tx:
            for i in range(5):
                tx.put(f"t{i}".encode(), timestamp=1000 + 10 * i)
        assert [e.body for e in channel.read(0, 2, 2)] == [b"t2", b"t3"]
        assert channel.offsets_for_time(0, 1015) == 2
        assert len(take_all(channel)) == 5
        with pytest.raises(ValueError, match="partitions 0...0"):
            channel.read(3, 0)


# -- durability ----------------------------------------------------------------------------
def test_concurrent_commits_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    calls = {"n": 0}
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls["n"] += 1
        time.sleep(0.002)  # a disk that takes a little while, as real ones do
        real(fd)

    with Channel.open(make_config(tmp_path)) as channel:
        monkeypatch.setattr(os, "fdatasync", counting)

        def produce() -> None:
            for i in range(20):
                put(channel, f"{threading.get_ident()}-{i}".encode())

        threads = [threading.Thread(target=produce) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        commits = 8 * 20
        assert channel.status()["counters"]["put_successes"] == commits
        assert calls["n"] < commits * 0.75, f"{calls['n']} fsyncs for {commits} commits"


def test_policy_mode_bounds_unflushed_events_by_flush_messages(tmp_path: Path) -> None:
    config = make_config(tmp_path, durability="policy", flush_messages=25)
    with Channel.open(config) as channel:
        for i in range(20):
            put(channel, *bodies(7, f"p{i}-"))
            assert channel.status()["unflushed_events"] < 25 + 7
        assert channel.owner is not None
        assert channel.owner.logs[0].recovery_point >= 140 - 25 - 7


def test_a_leased_take_can_be_committed_from_another_process_by_id(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as owner:
        put(owner, *bodies(4))
        worker_a = Channel.open(config)
        take = worker_a.take(lease_ms=60_000)
        assert len(take.take(2)) == 2
        worker_a.close()  # the web worker that began it went away: the lease keeps it
        assert owner.status()["events_in_flight"] == 2
        with Channel.open(config) as worker_b:
            worker_b.commit_take(take.take_id)
            with pytest.raises(TakeCommittedError):  # a retry learns the truth
                worker_b.commit_take(take.take_id)
            with pytest.raises(TakeCommittedError, match="cannot be returned"):
                worker_b.rollback_take(take.take_id)
        assert take_all(owner) == [b"e2", b"e3"]


def test_it_says_how_a_take_by_id_ended_rolled_back_or_expired(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as owner, Channel.open(config) as worker:
        put(owner, *bodies(4))
        returned = worker.take(lease_ms=60_000)
        returned.take(2)
        worker.rollback_take(returned.take_id)
        worker.rollback_take(returned.take_id)  # again: nothing to do, no error
        with pytest.raises(TakeExpiredError, match="it was rolled back"):
            worker.commit_take(returned.take_id)
        lapsed = worker.take(lease_ms=300)
        lapsed.take(2)
        time.sleep(0.4)
        with pytest.raises(TakeExpiredError, match="its lease expired, and"):
            worker.commit_take(lapsed.take_id)
        assert len(take_all(owner)) == 4


def test_take_ids_never_repeat_across_owners(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as first:
        put(first, b"x")
        stale = first.take(lease_ms=60_000).take_id
    with Channel.open(config) as second:
        fresh = second.take(lease_ms=60_000)
        fresh.take(1)
        assert fresh.take_id != stale
        with pytest.raises(TakeExpiredError):
            second.commit_take(stale)


def test_an_owner_whose_channel_was_deleted_and_recreated_writes_nothing_there(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    old = Channel.open(config)
    put(old, b"old")
    for directory in (*config.data_dirs, config.checkpoint_dir):
        shutil.rmtree(directory, ignore_errors=True)
    with Channel.open(config) as new:  # a new channel of the same name and directories
        assert new.role == "owner"
        put(new, b"new")
        new.checkpoint()
        def files() -> dict[Path, bytes]:
            return {path: path.read_bytes() for directory in (*config.data_dirs, config.home)
                    for path in Path(directory).rglob("*") if path.is_file()}

        before = files()
        with pytest.raises(ChannelGoneError):
            old.checkpoint()
        assert old.owner is not None
        old.owner.logs[0].state.new_losses.append(LostRange(0, 1, "x", cause="test"))
        assert old.status()["losses"]["unacknowledged"] == 1  # shown, written nowhere
        with pytest.raises(ChannelGoneError):
            old.acknowledge_losses()
        old.close()  # no checkpoint, no clean-shutdown state over the new channel's files
        assert files() == before
        assert take_all(new) == [b"new"]
        put(new, b"next")
        assert new.status()["partitions"][0]["log_end_offset"] == 2


def test_it_never_recreates_a_deleted_channel_unless_asked_to_create(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with pytest.raises(ChannelGoneError, match="deleted"):
        Channel.open(config, create=False)  # never opened: nothing to reopen
    assert not config.home.exists() and not config.partition_dir(0).exists()
    with Channel.open(config) as channel:  # create=True: a new channel
        put(channel, b"a", key=b"k")
    shutil.rmtree(config.partition_dir(1))  # removal of a deleted channel, half done
    with pytest.raises(ChannelGoneError, match=str(config.partition_dir(1))):
        Channel.open(config, create=False)
    assert not config.partition_dir(1).exists()
    shutil.rmtree(config.home)
    with pytest.raises(ChannelGoneError, match=str(config.home)):
        Channel.open(config, create=False)
    assert not config.home.exists()


def test_a_checkpoint_the_delete_overtakes_makes_no_backup_dir_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint wrote the home's copy; then the channel was deleted (home and backup
    dir removed) before it wrote the backup copy: the backup dir is not made again."""
    config = make_config(tmp_path, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    channel = Channel.open(config)
    put(channel, b"a")
    real_write = checkpoint_file.write

    def home_then_delete(saved: Any, directory: Path, *args: Any, **kwargs: Any) -> None:
        real_write(saved, directory, *args, **kwargs)
        if directory == config.home:
            for gone in (config.home, tmp_path / "backup"):
                shutil.rmtree(gone, ignore_errors=True)
    monkeypatch.setattr(checkpoint_file, "write", home_then_delete)
    with pytest.raises(ChannelGoneError):
        channel.checkpoint()
    assert not (tmp_path / "backup").exists() and not config.home.exists()
    channel.close()
    assert not (tmp_path / "backup").exists() and not config.home.exists()


def test_it_grows_partitions_of_an_existing_channel_without_create(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    Channel.open(config).close()
    with Channel.open(config.replace(partitions=3), create=False) as channel:
        assert channel.status()["partitions"][2]["log_end_offset"] == 0
    assert config.partition_dir(2).is_dir()


def test_an_open_owner_notices_a_partition_directory_that_vanished(tmp_path: Path) -> None:
    """A data dir deleted or unmounted under a running owner, with nothing to write: status
    says unhealthy naming it and flush fails, as the home lock's check does for the home;
    the checkpoint still records the partition's end (a recreate goes on after it)."""
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel:
        with channel.put() as tx:
            for i in range(6):
                tx.put(b"e%d" % i, key=b"%d" % i)
        assert channel.status()["health"] == "healthy"
        shutil.rmtree(config.partition_dir(1))
        status = channel.status()
        assert status["health"] == "unhealthy"
        assert str(config.partition_dir(1)) in status["health_reason"]
        assert "no longer exists" in status["health_reason"]
        with pytest.raises(LogDirectoryError, match="no longer exists"):
            channel.flush()
        assert status["partitions"][1]["offline"]


def test_an_open_owner_notices_another_directory_mounted_in_place(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        put(channel, b"a")
        shutil.move(config.partition_dir(0), tmp_path / "away")
        config.partition_dir(0).mkdir()  # an empty directory where the volume was
        with pytest.raises(LogDirectoryError, match="another directory is at this path"):
            channel.flush()
        assert channel.status()["health"] == "unhealthy"


def test_takes_and_checkpoints_fail_naming_a_home_that_was_deleted(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel:
        put(channel, b"a")
        put(channel, b"b")
        tx = channel.take()
        assert [e.body for e in tx.take(1)] == [b"a"]
        shutil.rmtree(config.checkpoint_dir)
        with pytest.raises(ChannelGoneError, match=str(config.home)):
            tx.commit()  # never journalled into a file no open will read
        with pytest.raises(ChannelGoneError, match=str(config.home)):
            channel.take()
        with pytest.raises(ChannelGoneError, match=str(config.home)):
            channel.checkpoint()
        status = channel.status()
        assert status["health"] == "unhealthy" and str(config.home) in status["health_reason"]


def test_reserve_takes_ranges_without_reading_them(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2, transaction_capacity=10)
    with Channel.open(config) as owner, Channel.open(config) as client:
        for i in range(6):
            put(owner, *bodies(5, f"p{i}-"), key=f"k{i}".encode())
        with client.take() as tx:
            ranges = tx.reserve(25)  # more than transaction_capacity: ranges, not events
        assert sum(end - start for _, start, end in ranges) == 25
        assert all(0 <= p < 2 and start < end for p, start, end in ranges)
        rolled = client.take()
        again = rolled.reserve(100)
        rolled.rollback()
        assert sum(end - start for _, start, end in again) == 5
        left = take_all(owner)
        assert len(left) == 5
        taken = {(p, o) for p, start, end in ranges for o in range(start, end)}
        assert len(taken) == 25  # no event twice


# -- a channel deleted and recreated in the same home -------------------------------------
def test_it_never_removes_the_owner_socket_of_a_channel_recreated_in_a_deleted_ones_home(
        tmp_path: Path) -> None:
    from channel_engine.owner.client import OwnerClient

    config = make_config(tmp_path)
    old = Channel.open(config)
    assert old.role == "owner"
    for place in ("home", "data-a", "data-b"):
        shutil.rmtree(tmp_path / place, ignore_errors=True)
    new = Channel.open(config)  # the old owner's lock is on the deleted .lock
    assert new.role == "owner"
    try:
        with contextlib.suppress(ChannelGoneError):
            old.close()  # a process letting go of the deleted channel late
        assert (config.home / "owner.sock").exists()
        client = OwnerClient.connect(config, 5.0)  # other processes still reach the owner
        client.close()
    finally:
        new.close()


def test_it_takes_the_lock_again_when_its_lock_file_was_unlinked_before_the_flock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from channel_engine import ChannelLockedError, ChannelOwner
    from channel_engine.queue import home_lock as owner_module

    config = make_config(tmp_path)
    Channel.open(config).close()
    real_open = owner_module.open_lock_file
    unlinked: list[int] = []

    def racing_open(path: Path, what: str) -> tuple[int, Path | None]:
        fd, moved = real_open(path, what)
        if not unlinked:  # another open let go of the file it made, between open and flock
            unlinked.append(fd)
            path.unlink()
        return fd, moved

    monkeypatch.setattr(owner_module, "open_lock_file", racing_open)
    first = ChannelOwner.open(config, create=False)
    monkeypatch.setattr(owner_module, "open_lock_file", real_open)
    try:
        assert unlinked
        with pytest.raises(ChannelLockedError):  # one owner a home, never two
            ChannelOwner.open(config, create=False)
    finally:
        first.close()

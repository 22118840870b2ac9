"""Subscriptions: each sees every event once, at its own pace, from where it started;
add, remove and reset are durable and refused when they cannot be right; capacity counts
the slowest; a segment goes once every subscription took it; a crash loses no
subscription's committed take."""
from __future__ import annotations

import json
import os
from operator import methodcaller
from pathlib import Path

import pytest
from channel_helpers import appends_refused, crash, make_config
from test_cli import tool

from channel_engine import (
    Channel,
    ChannelFullError,
    DiskFullError,
    StorageError,
    SubscriptionBusyError,
    SubscriptionExistsError,
    UnknownSubscriptionError,
)
from channel_engine.queue import checkpointer
from channel_engine.queue.partition_queue import PartitionQueue
from channel_engine.queue.subscription import Subscription, take_out


def put(channel: Channel, start: int, end: int, timestamp: int | None = None) -> None:
    with channel.put() as tx:
        for i in range(start, end):
            tx.put(f"e{i}".encode(), key=f"k{i % 3}".encode(), timestamp=timestamp)


def take(channel: Channel, subscription: str = "default", n: int = 1000) -> list[str]:
    with channel.take(subscription=subscription) as tx:
        return sorted(e.body.decode() for e in tx.take(n))


def names(start: int, end: int) -> list[str]:
    return sorted(f"e{i}" for i in range(start, end))


def test_two_subscriptions_each_take_every_event_once(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=3)) as channel:
        put(channel, 0, 10)
        channel.add_subscription("archive")  # earliest: every event still stored
        put(channel, 10, 15)
        assert take(channel) == names(0, 15)
        assert take(channel) == []
        assert take(channel, "archive", 4) and take(channel, "archive") != []
        assert take(channel, "archive") == []
        status = channel.status()
        assert channel.subscriptions() == ["default", "archive"]
        assert status["subscriptions"]["archive"]["events_untaken"] == 0
        assert status["subscriptions"]["archive"]["counters"]["take_successes"] == 15
        assert status["subscriptions"]["default"]["counters"]["take_successes"] == 15
        assert status["counters"]["take_successes"] == 30


def test_a_subscription_starts_where_it_is_told(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=1)) as channel:
        put(channel, 0, 5, timestamp=1_000)
        put(channel, 5, 10, timestamp=2_000)
        channel.add_subscription("live", "latest")
        channel.add_subscription("recent", {"timestamp_ms": 1_500})
        channel.add_subscription("from-7", {"0": 7})
        put(channel, 10, 12, timestamp=3_000)
        assert take(channel, "live") == names(10, 12)
        assert take(channel, "recent") == names(5, 12)
        assert take(channel, "from-7") == names(7, 12)


def test_a_subscription_added_at_slowest_starts_where_the_most_behind_one_stands(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2, capacity=12, transaction_capacity=12)
    with Channel.open(config) as channel:
        put(channel, 0, 8)
        assert take(channel, n=12) == names(0, 8)
        channel.add_subscription("archive", "slowest")  # default took all: nothing back
        assert take(channel, "archive", 12) == []
        put(channel, 8, 12)
        channel.add_subscription("audit", "earliest")  # 12 untaken: the channel is full
        channel.add_subscription("export", "slowest")  # audit's place: every event
        assert channel.status()["subscriptions"]["export"]["events_untaken"] == 12
        assert take(channel, "export", 12) == names(0, 12)
        assert take(channel, "archive", 12) == names(8, 12)


def test_reset_moves_a_subscription_and_is_refused_while_it_has_takes_open(
        tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        put(channel, 0, 8)
        assert take(channel) == names(0, 8)
        channel.reset_subscription("default", "earliest")
        assert take(channel) == names(0, 8)  # Kafka's --to-earliest: again from the start
        open_take = channel.take()
        open_take.take(1)
        with pytest.raises(SubscriptionBusyError, match="1 of its takes are open"):
            channel.reset_subscription("default", "latest")
        open_take.rollback()
        channel.reset_subscription("default", "latest")
        assert take(channel) == []
        assert channel.status()["subscriptions"]["default"]["events_untaken"] == 0


def test_remove_is_refused_for_default_and_with_takes_open(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=1)) as channel:
        put(channel, 0, 3)
        channel.add_subscription("archive")
        with pytest.raises(ValueError, match="'default' cannot be removed"):
            channel.remove_subscription("default")
        held = channel.take(subscription="archive")
        held.take(1)
        with pytest.raises(SubscriptionBusyError):
            channel.remove_subscription("archive")
        held.commit()
        channel.remove_subscription("archive")
        assert channel.subscriptions() == ["default"]
        with pytest.raises(UnknownSubscriptionError, match="has no subscription 'archive'"):
            channel.take(subscription="archive")
        channel.add_subscription("archive")  # a new one of the old name: from the start
        assert take(channel, "archive") == names(0, 3)


@pytest.mark.parametrize(("name", "start", "error"), [
    ("Bad Name", "earliest", ValueError), ("", "earliest", ValueError),
    ("x" * 65, "earliest", ValueError), ("ok", "yesterday", ValueError),
    ("ok", {"0": 99}, ValueError), ("ok", {"7": 0}, ValueError),
    ("ok", {"timestamp_ms": -1}, ValueError), ("default", "earliest", SubscriptionExistsError),
])
def test_a_bad_add_is_refused_and_changes_nothing(tmp_path: Path, name: str, start: object,
                                                  error: type[Exception]) -> None:
    with Channel.open(make_config(tmp_path, partitions=1)) as channel:
        put(channel, 0, 3)
        sequence = channel.status()["checkpoint"]["sequence"]
        with pytest.raises(error):
            channel.add_subscription(name, start)
        assert channel.subscriptions() == ["default"]
        assert channel.status()["checkpoint"]["sequence"] in (sequence, sequence + 1)


def test_the_slowest_subscription_fills_the_channel(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, capacity=10, keep_alive_ms=50)
    with Channel.open(config) as channel:
        channel.add_subscription("slow")
        put(channel, 0, 10)
        assert take(channel, n=10) == names(0, 10)  # default is empty; "slow" has 10
        with pytest.raises(ChannelFullError):
            put(channel, 10, 11)
        assert channel.status()["slowest_subscription"] == "slow"
        assert channel.status()["health"] == "degraded"
        take(channel, "slow", 5)
        put(channel, 10, 15)


def test_a_segment_is_deleted_once_every_subscription_took_it(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, segment_bytes=300, preallocate=False)
    with Channel.open(config) as channel:
        channel.add_subscription("archive")
        for i in range(0, 40, 4):
            put(channel, i, i + 4)
        take(channel)
        channel.checkpoint()
        assert channel.status()["partitions"][0]["log_start_offset"] == 0  # archive holds
        take(channel, "archive")
        channel.checkpoint()
        assert channel.status()["partitions"][0]["log_start_offset"] > 0


def test_removing_a_subscription_frees_what_only_it_held(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1, segment_bytes=300, preallocate=False)
    with Channel.open(config) as channel:
        channel.add_subscription("archive")
        for i in range(0, 40, 4):
            put(channel, i, i + 4)
        take(channel)
        channel.checkpoint()
        channel.remove_subscription("archive")
        channel.checkpoint()
        assert channel.status()["partitions"][0]["log_start_offset"] > 0


def test_every_subscriptions_commits_and_positions_survive_a_crash(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    put(channel, 0, 10)
    channel.add_subscription("archive")
    channel.add_subscription("live", "latest")
    first = take(channel, "archive", 4)  # journalled after the add's checkpoint
    put(channel, 10, 12)
    in_flight = channel.take(subscription="live")
    assert len(in_flight.take(1)) == 1
    crash(channel)
    with Channel.open(config) as reopened:
        assert reopened.subscriptions() == ["default", "archive", "live"]
        assert take(reopened, "archive") == sorted(set(names(0, 12)) - set(first))
        assert take(reopened, "live") == names(10, 12)  # its in-flight take came back
        assert take(reopened) == names(0, 12)


def test_a_client_process_takes_from_a_subscription_through_the_owner(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as owner, Channel.open(config) as client:
        assert client.role == "client"
        put(owner, 0, 3)
        client.add_subscription("archive")
        assert owner.subscriptions() == ["default", "archive"]
        assert take(client, "archive") == names(0, 3)
        with pytest.raises(UnknownSubscriptionError):
            client.take(subscription="nope")
        client.remove_subscription("archive")
        assert owner.subscriptions() == ["default"]


def test_the_tools_show_every_subscription(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        put(channel, 0, 6)
        channel.add_subscription("archive")
        take(channel, "archive", 4)
        take(channel)
    stat = tool("stat", str(config.home))
    assert stat.returncode == 0, stat.stderr
    assert "subscription 'archive': 2 untaken (lag), 0 in flight; taken through p0 4" \
        in stat.stdout
    assert "subscription 'default': 0 untaken (lag)" in stat.stdout
    dump = tool("dump", str(config.home), "--json")
    assert dump.returncode == 0, dump.stderr
    records = [json.loads(line) for line in dump.stdout.splitlines() if line.startswith("{")]
    saved = next(r for r in records if r.get("checkpoint") == "primary")
    assert saved["version"] == 5 and saved["next_subscription_id"] == 2
    assert saved["counters"]["put_successes"] == saved["counters"]["put_attempts"] > 0
    assert set(saved["subscription_counters"]) == {"0", "1"}
    assert saved["subscriptions"] == [{"id": 1, "name": "archive", "queues": [
        {"taken_through": 4, "committed": [], "in_flight": []}]}]


def test_a_reset_of_some_partitions_leaves_the_others_whole(tmp_path: Path) -> None:
    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        with channel.put() as tx:
            for i in range(10):
                tx.put(f"e{i}".encode(), key=b"one-partition")
        first, second = channel.take(), channel.take()
        first.take(3)
        committed = second.take(3)
        second.commit()  # out of order: above the head, in its committed ranges
        first.rollback()
        partition = committed[0].partition
        channel.reset_subscription("default", {str(1 - partition): 0})
        again = take(channel)
        assert not {e.body.decode() for e in committed} & set(again)
        assert len(again) == 7


def test_a_put_that_never_committed_reaches_no_subscription_added_or_reset_later(
        tmp_path: Path) -> None:
    # its batch on partition 0 stays in the log, unstamped: every queue holds it as taken,
    # and so must a queue made later, also after reopens (the checkpoint keeps the range)
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    failed = channel.put()
    for i in range(10):
        failed.put(f"e{i}".encode(), key=f"key-{i}".encode())  # both partitions
    with appends_refused(1), pytest.raises(DiskFullError):
        failed.commit()
    assert channel.status()["partitions"][0]["log_end_offset"] > 0  # its batch is there
    put(channel, 10, 12)
    channel.add_subscription("archive")
    assert take(channel, "archive") == names(10, 12)
    channel.close()
    for _ in range(2):  # the second open restores the ranges from the checkpoint only
        with Channel.open(config) as reopened:
            reopened.reset_subscription("default", "earliest")
            assert take(reopened) == names(10, 12)
            reopened.reset_subscription("archive", "earliest")
            reopened.add_subscription("late")
            assert take(reopened, "late") == names(10, 12)
            reopened.remove_subscription("late")


@pytest.mark.parametrize("change", ["reset", "remove"])
def test_a_change_whose_checkpoint_fails_leaves_the_subscription_as_it_was_and_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    channel = Channel.open(make_config(tmp_path, partitions=1))
    put(channel, 0, 5)
    channel.add_subscription("archive")
    write = checkpointer.checkpoint_file.write

    def put_then_fail(*args: object, **kwargs: object) -> None:
        put(channel, 5, 8)  # a put while the change's checkpoint is being written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointer.checkpoint_file, "write", put_then_fail)
    with pytest.raises(StorageError):
        if change == "reset":
            channel.reset_subscription("archive", "latest")
        else:
            channel.remove_subscription("archive")
    monkeypatch.setattr(checkpointer.checkpoint_file, "write", write)
    assert channel.subscriptions() == ["default", "archive"]
    assert channel.status()["subscriptions"]["archive"]["events_untaken"] == 8
    assert take(channel, "archive") == names(0, 8)  # where it was, with the put made meanwhile
    channel.close()


def open_journals(under: Path) -> list[str]:
    """The commit journals under `under` (one test's channel: other tests' channels may
    still be open in this process) that this process holds open."""
    paths = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
             if os.path.exists(f"/proc/self/fd/{fd}")]
    return sorted(path for path in paths
                  if path.endswith(".journal") and path.startswith(str(under)))


def test_a_refused_change_leaves_no_journal_open(tmp_path: Path) -> None:
    # the state machine found it: every refused add, remove or reset kept a descriptor of
    # the next checkpoint's journal open, until a long-lived owner ran out of them
    with Channel.open(make_config(tmp_path, partitions=1)) as channel:
        channel.add_subscription("archive")
        held = channel.take(subscription="archive")
        before = open_journals(tmp_path)
        with pytest.raises(SubscriptionExistsError):
            channel.add_subscription("archive")
        with pytest.raises(SubscriptionBusyError):
            channel.reset_subscription("archive", "latest")
        with pytest.raises(SubscriptionBusyError):
            channel.remove_subscription("archive")
        with pytest.raises(UnknownSubscriptionError):
            channel.remove_subscription("nope")
        with pytest.raises(ValueError, match="outside"):
            channel.reset_subscription("default", {0: 5})
        assert open_journals(tmp_path) == before
        held.rollback()
        channel.checkpoint()  # the journal a refused change made is the next one's
        assert len(open_journals(tmp_path)) == 1


def test_what_leaves_every_queue_is_counted_once_and_per_subscription_as_each_lost_it(
        ) -> None:
    # a log cut back to offset 6 (a flush-policy crash): "a" had taken 5..9 out of order,
    # "b" nothing; so b loses 6..9 (4 events), a none, and 4 events are lost in all
    a, b = (Subscription(i, name, [PartitionQueue(0)]) for i, name in ((1, "a"), (2, "b")))
    a.queues[0].reserve(1, 5, 10)
    a.queues[0].reserve(2, 5, 10)
    a.queues[0].commit(2)  # [5, 10) committed above a head of 0
    a.queues[0].rollback(1)
    b.queues[0].reserve(3, 10, 10)
    b.queues[0].rollback(3)
    lost = take_out([a, b], 0, 6, 10, 6, methodcaller("clip_to", 6), "lost_events")
    assert lost == 4
    assert (a.counters["lost_events"], b.counters["lost_events"]) == (0, 4)

"""The Kafka sink (channel_engine/kafka_sink) against the run's real Kafka broker: every
event reaches the topic exactly once, in partition order, with its key, headers and
timestamp — also when the sink's process is killed (-9) at any step of its protocol,
while producers keep putting; the errors a user meets fail the run, name the cause and
take nothing; a second run waits its turn; a stale instance is fenced."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka_sink_helpers import (
    ROOT,
    channel_partitions,
    drain,
    event_fields,
    new_channel,
    new_topic,
    parse_run,
    put_events,
    read_topic,
    run_async,
    run_sink,
    sink_command,
)

from channel_engine import Channel

STEPS = ("reserved", "producing", "produced", "kafka-committed", "taken")


def assert_exactly_once(config, bootstrap: str, topic: str) -> None:
    """The topic holds each channel partition's events, in their order, once: a keyed
    event goes to murmur2(key) mod the partition count, as the channel put it."""
    assert read_topic(bootstrap, topic) == channel_partitions(config)


def untaken(config, subscription: str = "kafka") -> int:
    with Channel.open(config) as channel:
        return channel.status()["subscriptions"][subscription]["events_untaken"]


def test_it_forwards_every_event_once_with_keys_headers_and_timestamps(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 1_000)
    topic = new_topic(kafka_broker.bootstrap)
    run = run_sink(config, kafka_broker.bootstrap, topic, max_events=300)
    assert run.returncode == 0, run.output
    assert run.report["events"] == 1_000 and run.report["transactions"] == 4
    assert sum(c["events"] for c in run.committed) == 1_000
    assert_exactly_once(config, kafka_broker.bootstrap, topic)
    first = read_topic(kafka_broker.bootstrap, topic)
    again = run_sink(config, kafka_broker.bootstrap, topic)
    assert again.report["events"] == 0 and again.report["transactions"] == 0
    assert read_topic(kafka_broker.bootstrap, topic) == first
    assert untaken(config) == 0
    with Channel.open(config) as channel:  # the HTTP consumers' queue still holds them all
        assert channel.status()["subscriptions"]["default"]["events_untaken"] == 1_000


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_any_step_leaves_every_event_in_the_topic_once(tmp_path, kafka_broker, step):
    config = new_channel(tmp_path)
    put_events(config, 0, 600)
    topic = new_topic(kafka_broker.bootstrap)
    # the second transaction's step: the first one's events are in Kafka already
    killed = run_sink(config, kafka_broker.bootstrap, topic, max_events=200,
                      env={"WEIR_KAFKA_SINK_CRASH_AT": f"{step}@2"})
    assert killed.returncode == -signal.SIGKILL, killed.output
    put_events(config, 600, 100)  # and producers went on meanwhile
    runs = drain(config, kafka_broker.bootstrap, topic, max_events=200)
    skipped = sum(r.report["skipped"] for r in runs)
    assert skipped == (200 if step == "kafka-committed" else 0)  # sent, take not committed
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


@pytest.mark.parametrize("step", ["producing", "kafka-committed"])
def test_a_killed_sink_that_was_a_client_of_the_owner_returns_its_take_at_once(
        tmp_path, kafka_broker, step):
    """The appliance's processes own its channels: the sink's job is their client. Its
    take has no lease, so the owner returns it as soon as the job is gone, and the next
    run goes on at once (a leased take would hold the events until its lease lapsed)."""
    config = new_channel(tmp_path)
    put_events(config, 0, 300)
    topic = new_topic(kafka_broker.bootstrap)
    with Channel.open(config) as owner:
        killed = run_sink(config, kafka_broker.bootstrap, topic, max_events=100,
                          env={"WEIR_KAFKA_SINK_CRASH_AT": f"{step}@2"})
        assert killed.returncode == -signal.SIGKILL, killed.output
        deadline = time.monotonic() + 5  # the owner notices a closed socket at once
        while owner.status()["subscriptions"]["kafka"]["open_takes"]:
            assert time.monotonic() < deadline, "the killed run's take is still open"
            time.sleep(0.05)
        rerun = run_sink(config, kafka_broker.bootstrap, topic, max_events=100)
        assert rerun.returncode == 0, rerun.output
        assert owner.status()["subscriptions"]["kafka"]["events_untaken"] == 0
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


@pytest.mark.parametrize("trials", [6, pytest.param(40, marks=pytest.mark.slow)])
def test_random_kills_while_producers_put(tmp_path, kafka_broker, trials):
    seed = int(os.environ.get("WEIR_SEED", time.time_ns()))
    print(f"WEIR_SEED={seed}")  # to replay a failure
    rng = random.Random(seed)
    config = new_channel(tmp_path, partitions=3)
    put_events(config, 0, 10)
    topic = new_topic(kafka_broker.bootstrap, partitions=3)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, config.checkpoint_dir,
                               str(30 * trials)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    kills, runs = 0, []
    try:
        for _ in range(trials):
            step = f"{rng.choice(STEPS)}@{rng.randint(1, 3)}"
            run = run_sink(config, kafka_broker.bootstrap, topic, max_events=rng.randint(50, 400),
                           env={"WEIR_KAFKA_SINK_CRASH_AT": step})
            runs.append(f"{step}: exit {run.returncode}, {run.report or run.error}")
            # a run that was the writer's client fails when the writer's process ends
            # (the owner gone mid-take): named, nothing taken, the next run resumes
            handed_over = run.returncode == 1 and "owner process" in (run.error or "") \
                and ended(writer, within=30)
            assert run.returncode in (0, -signal.SIGKILL) or handed_over, run.output
            kills += run.returncode == -signal.SIGKILL
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
        writer.wait()
    drain(config, kafka_broker.bootstrap, topic)
    print(f"{trials} runs, {kills} killed")
    with Channel.open(config, read_only=True) as channel:
        counters = channel.status()["counters"]
    print("\n".join(runs), f"\nchannel counters: {counters}")  # shown when the check fails
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def ended(process: subprocess.Popen, within: float) -> bool:
    """Whether the process ends within the time (it closes its channel before it exits)."""
    try:
        process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        return False
    return True


WRITER = """
import sys, time
from kafka_sink_helpers import event_fields
from channel_engine import Channel, ChannelConfig, OwnerLostError
config = ChannelConfig.load(sys.argv[1])
with Channel.open(config) as channel:
    for n in range(int(sys.argv[2])):
        try:
            with channel.put() as tx:
                for i in range(10 + n * 10, 20 + n * 10):
                    tx.put(**event_fields(i))
        except OwnerLostError:  # the sink owned the channel and was killed: outcome unknown,
            pass                # the check reads what the channel holds
        time.sleep(0.01)
"""


def test_a_second_run_started_meanwhile_is_busy_and_sends_nothing(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 300)
    topic = new_topic(kafka_broker.bootstrap)
    first = subprocess.Popen(sink_command(config, kafka_broker.bootstrap, topic), cwd=ROOT,
                             env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": "producing"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(first.pid)
        second = run_sink(config, kafka_broker.bootstrap, topic)
        assert second.returncode == 75 and "already going" in second.error
    finally:
        first.send_signal(signal.SIGCONT)
    output, _ = first.communicate(timeout=60)
    assert first.returncode == 0, output
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_a_stale_instance_is_fenced_and_commits_nothing(tmp_path, kafka_broker):
    """A run stopped mid-transaction (SIGSTOP: a hung process, a paused VM) while a new
    instance starts — its lock file was replaced, as on a second host sharing the disk:
    the newcomer's InitProducerId fences it, and it commits nothing when it wakes."""
    config = new_channel(tmp_path)
    put_events(config, 0, 300)
    topic = new_topic(kafka_broker.bootstrap)
    owner = Channel.open(config)  # the appliance's process that owns the channel
    # a transaction timeout far beyond the test: the stale one ends fenced, never timed out
    stale = subprocess.Popen(sink_command(config, kafka_broker.bootstrap, topic,
                                          transaction_timeout_ms=300_000), cwd=ROOT,
                             env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": "producing"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(stale.pid)
        (Path(config.checkpoint_dir) / "kafka-sink.lock").unlink()
        newer = run_sink(config, kafka_broker.bootstrap, topic)
        # it fenced the stale one, then found its take still open: it waits, never jumps it
        assert newer.returncode == 1 and "take(s) open" in newer.error, newer.output
    finally:
        stale.send_signal(signal.SIGCONT)
    output, _ = stale.communicate(timeout=60)
    stale_run = parse_run(stale.returncode, output)
    assert stale.returncode == 1 and stale_run.error.startswith("fenced"), output
    assert read_topic(kafka_broker.bootstrap, topic) == {0: [], 1: []}
    assert owner.status()["subscriptions"]["kafka"]["open_takes"] == 0  # it rolled back
    owner.close()
    drain(config, kafka_broker.bootstrap, topic)
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never stopped itself")


# -- errors a user meets: the run fails naming the cause, takes nothing; the next resumes --
def test_a_missing_topic_fails_the_run_unless_creation_is_asked_for(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic = f"missing-{os.getpid()}-{time.monotonic_ns()}"
    run = run_sink(config, kafka_broker.bootstrap, topic)
    assert run.returncode == 1 and run.error.startswith("topic missing"), run.output
    assert topic in run.error and untaken(config) == 100
    made = run_sink(config, kafka_broker.bootstrap, topic, create_topic=True, topic_partitions=2)
    assert made.returncode == 0 and "created topic" in made.output
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_an_unreachable_broker_fails_the_run_and_takes_nothing(tmp_path):
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    run = run_sink(config, "127.0.0.1:1", "orders", request_timeout_ms=2_000)
    assert run.returncode == 1 and run.error.startswith("broker unreachable"), run.output
    assert "127.0.0.1:1" in run.error and untaken(config) == 100


def test_a_message_too_large_fails_the_run_and_the_next_resumes(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 50)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"x" * 20_000, key=b"k1")
    topic = new_topic(kafka_broker.bootstrap, **{"max.message.bytes": "10000"})
    run = run_sink(config, kafka_broker.bootstrap, topic)
    assert run.returncode == 1 and run.error.startswith("message too large"), run.output
    assert untaken(config) == 51 and read_topic(kafka_broker.bootstrap, topic) == {0: [], 1: []}
    _alter_topic(kafka_broker.bootstrap, topic, {"max.message.bytes": "100000"})
    drain(config, kafka_broker.bootstrap, topic)
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_an_event_kafka_will_not_timestamp_fails_the_run_naming_it(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 10)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"from the future", key=b"k1", timestamp=int(time.time() * 1000) + 86_400_000)
    topic = new_topic(kafka_broker.bootstrap)
    run = run_sink(config, kafka_broker.bootstrap, topic)
    assert run.returncode == 1 and run.error.startswith("invalid timestamp"), run.output
    assert untaken(config) == 11 and read_topic(kafka_broker.bootstrap, topic) == {0: [], 1: []}


def test_a_transaction_past_its_timeout_is_aborted_and_told(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic = new_topic(kafka_broker.bootstrap)
    slow = subprocess.Popen(sink_command(config, kafka_broker.bootstrap, topic,
                                         transaction_timeout_ms=1_000), cwd=ROOT,
                            env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": "producing"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_stopped(slow.pid)
    _wait_until_aborted(kafka_broker.bootstrap, topic)  # by the broker, past its timeout
    slow.send_signal(signal.SIGCONT)
    output, _ = slow.communicate(timeout=60)
    run = parse_run(slow.returncode, output)
    assert run.returncode == 1 and run.error.startswith("transaction timeout"), output
    assert read_topic(kafka_broker.bootstrap, topic) == {0: [], 1: []}
    drain(config, kafka_broker.bootstrap, topic)
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def _wait_until_aborted(bootstrap: str, topic: str) -> None:
    """Until the open transaction's records are aborted: a read_committed consumer's end
    offsets (the last stable offset) stay at 0 while it is open, and pass its abort
    marker once the broker aborted it (scripts/kafka.sh checks every second)."""

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def stable_end() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TopicPartition(topic, p) for p in (0, 1)])
            return sum(ends.values())
        finally:
            await consumer.stop()
    deadline = time.monotonic() + 60
    while run_async(stable_end) == 0:
        assert time.monotonic() < deadline, "the broker never aborted the transaction"
        time.sleep(0.3)


def test_authentication_and_authorization_failures_are_named(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 20)
    topic = new_topic(kafka_broker.bootstrap)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-her-password\n")
    right = tmp_path / "right"
    right.write_text("alice-secret\n")
    sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_username": "alice",
            "request_timeout_ms": 5_000}
    run = run_sink(config, kafka_broker.sasl_bootstrap, topic, sasl_password_file=wrong, **sasl)
    assert run.returncode == 1 and run.error.startswith("authentication failed"), run.output
    _deny_writes(kafka_broker.bootstrap, topic, "User:alice")
    run = run_sink(config, kafka_broker.sasl_bootstrap, topic, sasl_password_file=right, **sasl)
    assert run.returncode == 1 and run.error.startswith("not authorized"), run.output
    assert untaken(config) == 20
    run = run_sink(config, kafka_broker.bootstrap, topic)  # as a user allowed to
    assert run.returncode == 0
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_tls_checks_the_broker_and_can_present_a_client_certificate(tmp_path, kafka_broker):
    """security_protocol SSL: a broker whose certificate the given CA did not sign is
    refused, naming the certificate, and nothing is taken; with its CA the run goes; with
    a client certificate (mutual TLS) the broker knows the sink by it — an ACL on that
    name denies it — and without one the run is anonymous again."""
    tls = kafka_broker.tls_dir
    assert tls is not None, "WEIR_TEST_KAFKA_TLS_DIR must name the broker's TLS material"
    config = new_channel(tmp_path)
    put_events(config, 0, 30)
    topic = new_topic(kafka_broker.bootstrap)
    ssl = {"security_protocol": "SSL", "request_timeout_ms": 5_000}
    untrusted = run_sink(config, kafka_broker.ssl_bootstrap, topic,
                         ssl_cafile=tls / "other-ca.pem", **ssl)
    assert untrusted.returncode == 1, untrusted.output
    assert untrusted.error.startswith("TLS handshake failed") and \
        "CERTIFICATE_VERIFY_FAILED" in untrusted.error, untrusted.error
    assert untaken(config) == 30
    run = run_sink(config, kafka_broker.ssl_bootstrap, topic, ssl_cafile=tls / "ca.pem", **ssl)
    assert run.returncode == 0 and run.report["events"] == 30, run.output
    mutual = {"ssl_cafile": tls / "ca.pem", "ssl_certfile": tls / "client.pem",
              "ssl_keyfile": tls / "client.key", **ssl}
    put_events(config, 30, 10)
    run = run_sink(config, kafka_broker.ssl_bootstrap, topic, **mutual)
    assert run.returncode == 0 and run.report["events"] == 10, run.output
    _deny_writes(kafka_broker.bootstrap, topic, "User:CN=weir-sink")
    put_events(config, 40, 5)
    denied = run_sink(config, kafka_broker.ssl_bootstrap, topic, **mutual)
    assert denied.returncode == 1 and denied.error.startswith("not authorized"), denied.output
    run = run_sink(config, kafka_broker.ssl_bootstrap, topic, ssl_cafile=tls / "ca.pem", **ssl)
    assert run.returncode == 0 and run.report["events"] == 5, run.output
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def _alter_topic(bootstrap: str, topic: str, configs: dict[str, str]) -> None:

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def alter() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                      configs=configs)])
        finally:
            await admin.close()
    run_async(alter)


def _deny_writes(bootstrap: str, topic: str, principal: str) -> None:
    """An ACL denying `principal` writes to `topic` (kafka-python's admin client: aiokafka's
    has no ACL calls)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import (
            ACL,
            ACLOperation,
            ACLPermissionType,
            KafkaAdminClient,
            ResourcePattern,
            ResourceType,
        )
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.create_acls([ACL(principal, "*", ACLOperation.WRITE, ACLPermissionType.DENY,
                                        ResourcePattern(ResourceType.TOPIC, topic))])
        assert not result["failed"], result
    finally:
        admin.close()
    time.sleep(1)  # the authorizer applies it from the metadata log


# -- partitions, the offsets record, subscriptions ---------------------------------------
def test_key_partitioning_into_a_topic_of_another_partition_count(tmp_path, kafka_broker):
    from aiokafka.partitioner import murmur2

    config = new_channel(tmp_path, partitions=2)
    put_events(config, 0, 200)
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(10):  # keyless: they keep their channel partition's number mod 3
            tx.put(f"keyless-{i}".encode())
    topic = new_topic(kafka_broker.bootstrap, partitions=3)
    assert run_sink(config, kafka_broker.bootstrap, topic).returncode == 0
    got = read_topic(kafka_broker.bootstrap, topic)
    expected: dict[int, list[tuple]] = {0: [], 1: [], 2: []}
    for partition, events in channel_partitions(config).items():
        for record in events:
            key = record[0]
            expected[partition % 3 if key is None
                     else (murmur2(key) & 0x7FFFFFFF) % 3].append(record)
    # each channel partition's events keep their order; two merge in one topic partition
    for p in expected:
        assert sorted(got[p], key=repr) == sorted(expected[p], key=repr)
        for source in channel_partitions(config).values():
            mine = [r for r in got[p] if r in source]
            assert mine == [r for r in source if r in mine]


def test_same_partitioning_needs_enough_topic_partitions(tmp_path, kafka_broker):
    config = new_channel(tmp_path, partitions=2)
    put_events(config, 0, 10)
    small = new_topic(kafka_broker.bootstrap, partitions=1)
    run = run_sink(config, kafka_broker.bootstrap, small, partitioning="same")
    assert run.returncode == 1 and "at least 2 partitions" in run.error
    topic = new_topic(kafka_broker.bootstrap, partitions=2)
    assert run_sink(config, kafka_broker.bootstrap, topic, partitioning="same").returncode == 0
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_a_reset_subscription_sends_nothing_twice(tmp_path, kafka_broker):
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic = new_topic(kafka_broker.bootstrap)
    assert run_sink(config, kafka_broker.bootstrap, topic).returncode == 0
    with Channel.open(config) as channel:
        channel.reset_subscription("kafka", "earliest")
    put_events(config, 100, 50)
    run = run_sink(config, kafka_broker.bootstrap, topic)
    assert run.report["skipped"] == 100 and run.report["events"] == 50
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_a_damaged_offsets_record_stops_the_sink_rather_than_send_again(tmp_path, kafka_broker):

    from aiokafka import AIOKafkaProducer

    from channel_engine.channel_id import channel_id
    from channel_engine.kafka_sink.offsets_record import record_key

    config = new_channel(tmp_path)
    put_events(config, 0, 30)
    topic = new_topic(kafka_broker.bootstrap)
    offsets = new_topic(kafka_broker.bootstrap, partitions=1)
    assert run_sink(config, kafka_broker.bootstrap, topic, offsets_topic=offsets).returncode == 0

    async def damage() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(offsets, b'{"format": "something else"}', partition=0,
                                         key=record_key(channel_id(config.checkpoint_dir), topic))
        finally:
            await producer.stop()
    run_async(damage)
    put_events(config, 30, 10)
    run = run_sink(config, kafka_broker.bootstrap, topic, offsets_topic=offsets)
    assert run.returncode == 1 and "offsets record" in run.error and offsets in run.error
    assert untaken(config) == 10


def test_bad_options_exit_2_naming_the_field(tmp_path):
    config = new_channel(tmp_path)
    put_events(config, 0, 1)
    for options, field in (({"partitioning": "random"}, "partitioning"),
                           ({"max_events": 0}, "max_events"),
                           ({"security_protocol": "SASL_SSL"}, "sasl_username")):
        run = run_sink(config, "127.0.0.1:9092", "orders", **options)
        assert run.returncode == 2 and field in run.output, run.output
    run = run_sink(config, "127.0.0.1:9092", "bad topic!")
    assert run.returncode == 2 and "topic" in run.output


def test_event_fields_round_trip_through_kafka_exactly(tmp_path, kafka_broker):
    """A record's key, value, headers (order, empty and binary values) and timestamp are
    the event's; an event without a key or headers stays so."""
    config = new_channel(tmp_path, partitions=1)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(**event_fields(1))
        tx.put(b"", key=None, headers={}, timestamp=5)
        tx.put(b"\x00" * 3, key=b"", headers={"b": b"", "a": b"\x01"}, timestamp=2**40)
    topic = new_topic(kafka_broker.bootstrap, partitions=1)
    assert run_sink(config, kafka_broker.bootstrap, topic).returncode == 0
    assert read_topic(kafka_broker.bootstrap, topic)[0] == [
        (b"k1", b"event-1", [("i", b"1"), ("z-last", b"\x00\xff")], BASE_TS + 1),
        (None, b"", [], 5),
        (b"", b"\x00" * 3, [("b", b""), ("a", b"\x01")], 2**40)]


BASE_TS = 1_700_000_000_000


def test_a_retriable_error_before_the_commit_sends_the_transaction_again(
        tmp_path, kafka_broker, monkeypatch):
    """A retriable error before the commit (a new topic's leader not yet known to the
    transaction coordinator answers NotLeaderForPartition) aborts the transaction and sends
    it again on a new producer, in the same run; the aborted records are never read."""
    from aiokafka.errors import NotLeaderForPartitionError

    from channel_engine.kafka_sink.job import parse
    from channel_engine.kafka_sink.sink import KafkaSink

    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic = new_topic(kafka_broker.bootstrap)
    lines: list[str] = []
    sink = KafkaSink(parse(["--home", config.checkpoint_dir, "--bootstrap",
                            kafka_broker.bootstrap, "--topic", topic]),
                     lambda line, committed: lines.append(line))
    real, calls = KafkaSink._send, []

    async def flaky(self, producer, to_send):
        calls.append(len(to_send))
        if len(calls) == 1:  # records sent in the open transaction, then the error
            await producer.begin_transaction()
            await (await producer.send(topic, b"never read", key=b"k1", partition=0))
            raise NotLeaderForPartitionError()
        await real(self, producer, to_send)

    monkeypatch.setattr(KafkaSink, "_send", flaky)
    report = run_async(sink.run)
    assert report["events"] == 100 and report["transactions"] == 1 and len(calls) == 2
    assert any("NotLeaderForPartitionError before the commit" in line for line in lines)
    assert_exactly_once(config, kafka_broker.bootstrap, topic)


def test_another_streams_open_transaction_never_hides_this_streams_last_record(
        tmp_path, kafka_broker):
    """Streams share the offsets topic's partition. Stream b's sink stopped between writing
    its record and committing it holds the last stable offset below stream a's record
    committed after it; a's next run waits for b's transaction to end (the broker aborts
    it at its timeout) rather than read a's older record and send its events again."""
    bootstrap = kafka_broker.bootstrap
    offsets = new_topic(bootstrap, partitions=1)
    a, b = new_channel(tmp_path, name="a"), new_channel(tmp_path, name="b")
    put_events(a, 0, 200)
    put_events(b, 0, 50)
    topic_a, topic_b = new_topic(bootstrap), new_topic(bootstrap)
    stale = subprocess.Popen(sink_command(b, bootstrap, topic_b, offsets_topic=offsets,
                                          transaction_timeout_ms=3_000), cwd=ROOT,
                             env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": "produced"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(stale.pid)
        killed = run_sink(a, bootstrap, topic_a, offsets_topic=offsets,
                          env={"WEIR_KAFKA_SINK_CRASH_AT": "kafka-committed"})
        assert killed.returncode == -signal.SIGKILL, killed.output
        rerun = run_sink(a, bootstrap, topic_a, offsets_topic=offsets)
        assert rerun.returncode == 0, rerun.output
        assert rerun.report["skipped"] == 200 and rerun.report["events"] == 0
    finally:
        stale.send_signal(signal.SIGCONT)
        stale.communicate(timeout=60)
    assert_exactly_once(a, bootstrap, topic_a)


def _topic_configs(bootstrap: str, topic: str) -> dict[str, str]:

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def describe() -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            [answer] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)])
            return {entry[0]: entry[1] for entry in answer.resources[0][4]}
        finally:
            await admin.close()
    return run_async(describe)


def test_the_offsets_topic_it_makes_is_compacted_and_one_that_deletes_is_refused(
        tmp_path, kafka_broker):
    """A stream's record must stay for good: the sink makes its offsets topic compacted
    (segments rolled hourly, so that compaction keeps it short), and refuses one whose
    retention would delete an idle stream's record, taking nothing."""
    bootstrap = kafka_broker.bootstrap
    config = new_channel(tmp_path)
    put_events(config, 0, 20)
    topic, offsets = new_topic(bootstrap), f"weir-offsets-{uuid.uuid4().hex[:8]}"
    assert run_sink(config, bootstrap, topic, offsets_topic=offsets).returncode == 0
    made = _topic_configs(bootstrap, offsets)
    assert (made["cleanup.policy"], made["segment.ms"], made["min.cleanable.dirty.ratio"]) \
        == ("compact", "3600000", "0.1")
    put_events(config, 20, 10)
    deleting = new_topic(bootstrap, partitions=1, **{"retention.ms": "600000"})
    run = run_sink(config, bootstrap, topic, offsets_topic=deleting)
    assert run.returncode == 1, run.output
    assert f"the offsets topic {deleting!r} has cleanup.policy=delete with " \
           "retention.ms=600000" in run.error, run.error
    assert untaken(config) == 10
    forever = new_topic(bootstrap, partitions=1, **{"retention.ms": "-1"})
    assert run_sink(config, bootstrap, forever + "-x", offsets_topic=forever,
                    create_topic=True).returncode == 0  # a deleting policy that never does


def test_partitions_added_to_the_offsets_topic_send_nothing_twice(tmp_path, kafka_broker):
    """The record lives in partition 0 whatever the partition count: were it placed by its
    key's hash, adding partitions would move it, and the next run, finding none, would
    send everything again. The counts are picked so that the hash would move it."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    from channel_engine.channel_id import channel_id
    from channel_engine.kafka_sink.offsets_record import key_partition, record_key

    bootstrap = kafka_broker.bootstrap
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic, offsets = new_topic(bootstrap), new_topic(bootstrap, partitions=2)
    assert run_sink(config, bootstrap, topic, offsets_topic=offsets).returncode == 0
    key = record_key(channel_id(config.checkpoint_dir), topic)
    grown = next(n for n in range(3, 64) if key_partition(key, n) != key_partition(key, 2))

    async def grow() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({offsets: NewPartitions(total_count=grown)})
        finally:
            await admin.close()
    run_async(grow)
    with Channel.open(config) as channel:
        channel.reset_subscription("kafka", "earliest")
    put_events(config, 100, 30)
    run = run_sink(config, bootstrap, topic, offsets_topic=offsets)
    assert run.returncode == 0, run.output
    assert (run.report["skipped"], run.report["events"]) == (100, 30)
    assert_exactly_once(config, bootstrap, topic)


def _records_of(bootstrap: str, topic: str, key: bytes) -> int:
    """How many records of `key` partition 0 of `topic` still holds (every one, committed
    or not: what compaction left)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def count() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end, found = (await consumer.end_offsets([tp]))[tp], 0
            while await consumer.position(tp) < end:
                found += sum(m.key == key for m in
                             (await consumer.getmany(tp, timeout_ms=500)).get(tp, []))
            return found
        finally:
            await consumer.stop()
    return run_async(count)


def test_a_compacted_offsets_topic_still_knows_what_was_sent(tmp_path, kafka_broker):
    """Compaction drops a stream's older records (and aborted transactions' ones); the
    last committed one stays, and a run killed after its Kafka commit is still followed by
    one that sends nothing twice."""
    from channel_engine.channel_id import channel_id
    from channel_engine.kafka_sink.offsets_record import record_key

    bootstrap = kafka_broker.bootstrap
    config = new_channel(tmp_path)
    topic = new_topic(bootstrap)
    offsets = new_topic(bootstrap, partitions=1, **{
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"})
    for first in range(0, 100, 20):  # five records, each in a segment of its own
        put_events(config, first, 20)
        run = run_sink(config, bootstrap, topic, offsets_topic=offsets)
        assert run.returncode == 0 and run.report["transactions"] == 1, run.output
        time.sleep(0.15)
    put_events(config, 100, 10)
    killed = run_sink(config, bootstrap, topic, offsets_topic=offsets,
                      env={"WEIR_KAFKA_SINK_CRASH_AT": "kafka-committed"})
    assert killed.returncode == -signal.SIGKILL, killed.output
    key = record_key(channel_id(config.checkpoint_dir), topic)  # six records written
    deadline = time.monotonic() + 60  # the broker's cleaner looks every second (kafka.sh)
    while (left := _records_of(bootstrap, offsets, key)) > 2:
        assert time.monotonic() < deadline, f"{offsets} not compacted: {left} records"
        time.sleep(1)
    with Channel.open(config) as channel:
        channel.reset_subscription("kafka", "earliest")
    run = run_sink(config, bootstrap, topic, offsets_topic=offsets)
    assert run.returncode == 0, run.output
    assert (run.report["skipped"], run.report["events"]) == (110, 0), run.output
    assert_exactly_once(config, bootstrap, topic)


def test_damage_in_a_segment_is_skipped_counted_lost_and_told_to_the_owner(
        tmp_path, kafka_broker):
    """A batch damaged while the channel is open (its owner has not met it yet): the run
    sends every other event once, counts the batch's events "lost" in its report, and has
    the owner count them in the channel's loss ledger (the run's read-only snapshot cannot),
    so that the channel is no longer reported healthy."""
    from channel_engine import ChannelConfig

    home = tmp_path / "orders"
    config = ChannelConfig(name="orders", checkpoint_dir=str(home),
                           data_dirs=[str(home / "data")], partitions=1, segment_bytes=1024)
    with Channel.open(config) as owner:  # the sink's run is a client of this process
        for i in range(60):
            with owner.put() as tx:  # one batch each
                tx.put(**event_fields(i))
        owner.add_subscription("kafka", "earliest")
        segment = sorted(config.partition_dir(0).glob("*.log"))[2]  # sealed
        data = bytearray(segment.read_bytes())
        second = 12 + int.from_bytes(data[8:12], "big")  # the segment's second batch
        batch_events = 1  # put alone
        data[second + 70] ^= 0x04  # inside its records: only the CRC sees it
        segment.write_bytes(bytes(data))
        topic = new_topic(kafka_broker.bootstrap, partitions=1)
        run = run_sink(config, kafka_broker.bootstrap, topic)
        assert run.returncode == 0, run.output
        assert (run.report["events"], run.report["lost"]) == (60 - batch_events, batch_events)
        assert sum(c["lost"] for c in run.committed) == batch_events
        status = owner.status()
        assert status["losses"]["events_lost"] == batch_events, status["losses"]
        assert status["health"] != "healthy"
        assert status["subscriptions"]["kafka"]["events_untaken"] == 0
    sent = read_topic(kafka_broker.bootstrap, topic)[0]
    assert len(sent) == 60 - batch_events
    assert sent == channel_partitions(config)[0]  # the intact events, in order, once


def test_a_commit_whose_answer_is_lost_is_skipped_by_the_next_run(
        tmp_path, kafka_broker, monkeypatch):
    """The commit reached the coordinator and took effect, but its answer never came back
    (a network cut, a broker stalled after it wrote the marker): the run fails within
    max_block_ms as "outcome unknown", its take returned; the next run reads the record the
    transaction committed and skips every event rather than send it again."""
    from aiokafka import AIOKafkaProducer

    from channel_engine.kafka_sink.job import parse
    from channel_engine.kafka_sink.sink import KafkaSink

    config = new_channel(tmp_path)
    put_events(config, 0, 120)
    topic = new_topic(kafka_broker.bootstrap)
    real = AIOKafkaProducer.commit_transaction

    async def answer_lost(producer):
        await real(producer)  # committed in Kafka
        await asyncio.sleep(3600)  # and the answer never comes
    monkeypatch.setattr(AIOKafkaProducer, "commit_transaction", answer_lost)
    sink = KafkaSink(parse(["--home", config.checkpoint_dir, "--bootstrap",
                            kafka_broker.bootstrap, "--topic", topic, "--max-block-ms", "2000"]),
                     lambda line, committed: None)
    with pytest.raises(Exception, match="outcome unknown"):
        run_async(sink.run)
    assert sink.error.startswith("outcome unknown"), sink.error
    assert untaken(config) == 120  # the take was returned
    monkeypatch.undo()
    rerun = run_sink(config, kafka_broker.bootstrap, topic)
    assert rerun.returncode == 0, rerun.output
    assert (rerun.report["skipped"], rerun.report["events"]) == (120, 0), rerun.output
    assert_exactly_once(config, kafka_broker.bootstrap, topic)

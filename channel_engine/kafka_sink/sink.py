"""The sink's protocol: one run forwards a subscription's next events into a Kafka topic,
exactly once (KafkaSink). Kafka's transactions make it so; the offsets record
(offsets_record.py), written in each transaction, is the single source of truth of what
the topic holds.

    step  what                                            after a kill -9 here, the next run
    ----  ----------------------------------------------  -----------------------------------
    1     start the transactional producer: Kafka's       -
          InitProducerId fences an older instance of
          the same transactional.id and aborts its open
          transaction
    2     check the topic (made when create_topic says    -
          so) and the offsets topic (made when missing;
          its cleanup policy must keep records)
    3     read the offsets record (read_committed);      -
          check it against each partition's
          incarnation (a conflict fails the run:
          SinkError, nothing taken or sent:
          channel_engine/incarnations.py)
    4     take: reserve the subscription's next events    the take returns (its process
          ("reserved"); a partition made again since      died): the same events come again
          step 3 rolls it back and fails the run
          (SinkError)
    5     skip what the record says the topic holds       -
    6     begin a Kafka transaction, send the events:     step 1 aborts the open transaction:
          batches per topic partition ("producing" once   a read_committed reader never
          the first is acknowledged)                      sees its records
    7     send the new offsets record in it; wait for     as 6
          every batch's acknowledgement ("produced")
    8     commit the Kafka transaction: the commit point  the record says the topic holds the
          ("kafka-committed")                             events: step 5 skips them and the
                                                          take is committed
    9     commit the take ("taken")                       -
    4-9 repeat until the subscription is drained or max_run_s has passed.

Order: within a channel partition, events reach their topic partition in offset order,
and one key's events are in one channel partition (the channel partitions by key), so a
key's order holds. A run's take has no lease: the owner returns it the moment the
run's process is gone (a leased take would outlive it until the lease lapsed). A take from
a run killed a moment ago may still be open while the owner notices: a run waits for the
subscription's open takes to close (OPEN_TAKES_WAIT_S) and fails if they do not (a run
stopped or hung, a consumer using the sink's subscription), rather than send newer events
before them. Two runs of one channel never overlap: the job
holds `kafka-sink.lock` in the home (job.py). A run whose process was stopped, not
killed, past its transaction timeout is fenced or aborted by Kafka: it commits nothing.

Partitions (settings.partitioning): `key` sends a keyed event to murmur2(key) mod the
topic's partition count (the Java client's default partitioner, which the channel's own
partitioner is too: with as many topic as channel partitions an event keeps its
partition number) and an event without a key to its channel partition's number mod that
count; `same` sends channel partition p to topic partition p (the topic needs at least
as many partitions). Each record keeps the event's key, headers (in order) and
timestamp (CreateTime); its value is the event's body.

Waiting: aiokafka waits for a transaction coordinator, or for a partition leader it knows
but cannot reach, as long as it takes. A run waits at most max_block_ms (Java's
max.block.ms) for each such answer — the producer's start, a transaction's begin, its
batches' acknowledgements, its commit — then fails, its take returned. A commit that got
no answer in time has an unknown outcome; the next run's step 1 lets the coordinator
finish it either way, and its step 3 reads which, so its events are never sent twice.

Damage: events of the reserved range that the log can no longer read are skipped and
counted in the report ("lost"); the rest go out. The run reads from a read-only snapshot,
which cannot write the channel's loss ledger: before its take commits, it has the
channel's owner read each such gap, whose read meets the damage and counts it there
(status()["losses"], health "degraded" until acknowledged).

Concurrency contract: a KafkaSink is one run in one thread with its own event loop
(job.py: asyncio.run); crash_point() is the kill tests' hook.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError, for_code

from channel_engine import Channel, ChannelConfig, SubscriptionExistsError
from channel_engine.channel_id import channel_id
from channel_engine.errors import SinkError
from channel_engine.incarnations import PartitionIncarnation, changed_since, conflicts, labels
from channel_engine.kafka_sink import client, offsets_record
from channel_engine.kafka_sink.offsets_record import OffsetsRecord, describe_sent, key_partition
from channel_engine.kafka_sink.settings import SinkSettings
from channel_engine.offset_ranges import Range, merge, subtract

SEND_ATTEMPTS = 3  # a transaction sent again after a retriable error before its commit
OPEN_TAKES_WAIT_S = 10.0  # a killed run's take: the owner returns it within moments
STABLE_GRACE_S = 15.0  # past a transaction timeout, until the broker has aborted it
READ_CHUNK = 5_000  # events read from the log at once
KEY_CACHE = 100_000  # keys whose topic partition a run remembers
UNKNOWN_TOPIC = 3  # Kafka's error codes in a metadata answer
TOPIC_AUTHORIZATION_FAILED = 29
TOPIC_ALREADY_EXISTS = 36
CLOSE_S = 5.0  # a failed run's producer: its stop waits for batches Kafka may never take
T = TypeVar("T")


def crash_point(step: str, count: int) -> None:
    """Die here (SIGKILL) when WEIR_KAFKA_SINK_CRASH_AT names this step ("step", or
    "step@N" for its Nth time in the run); stop (SIGSTOP) when WEIR_KAFKA_SINK_STOP_AT
    does, once: the kill and fencing tests' hooks."""
    for variable, sig in (("WEIR_KAFKA_SINK_CRASH_AT", signal.SIGKILL),
                          ("WEIR_KAFKA_SINK_STOP_AT", signal.SIGSTOP)):
        wanted = os.environ.get(variable, "")
        name, _, nth = wanted.partition("@")
        if name == step and int(nth or 1) == count:
            if sig == signal.SIGSTOP:
                del os.environ[variable]
            os.kill(os.getpid(), sig)


class KafkaSink:
    """One run of the protocol above for one channel."""

    def __init__(self, settings: SinkSettings,
                 progress: Callable[[str, dict[str, Any] | None], None]) -> None:
        self.settings = settings
        self.progress = progress
        self.config = ChannelConfig.load(settings.home)
        self.name = self.config.name
        self.run_id = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
        self.channel_id = channel_id(self.config.home)
        self.transactional_id = (f"weir-sink.{self.name}.{settings.topic}."
                                 f"{self.channel_id[:12]}")
        self.record = OffsetsRecord(self.name, self.channel_id, settings.topic,
                                    settings.subscription)
        self.topic_partitions = 0
        self.started = time.monotonic()
        self.transaction_started = 0.0  # monotonic, while a Kafka transaction is open
        self.in_transaction_s = 0.0  # how long the transaction that failed had been open
        self.counts = {"events": 0, "skipped": 0, "lost": 0, "transactions": 0}
        self.ranges: dict[int, list[Range]] = {}  # what this run sent, by channel partition
        self.steps: dict[str, int] = {}
        self.pending = {"events": 0, "lost": 0}  # of the open Kafka transaction
        self.gaps: list[tuple[int, int, int]] = []  # (partition, start, end) it could not read
        self.key_partitions: dict[bytes, int] = {}
        self.leaderless = False  # a partition of the topics last described had no leader
        self.error = ""
        self.connection_log = client.watch_connections()
        self.channel: Channel | None = None  # the run's handle (owner or client of it)
        self.producer: AIOKafkaProducer | None = None
        self.committing = False  # commit_transaction was called: its outcome is Kafka's
        self.incarnations: list[PartitionIncarnation] = []  # the channel's, at the run's start

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """Steps 1-9 until the subscription is drained or max_run_s passed; the report."""
        try:
            # a drain never makes a channel: files missing fail it (StorageMissingError)
            with Channel.open(self.config.home, create=False) as channel:
                self.channel = channel
                self._ensure_subscription(channel)  # first: it keeps events while Kafka is down
                producer = await self._start_producer()  # step 1: InitProducerId
                await self._check_topics()
                for topic in (self.settings.topic, self.settings.offsets_topic):
                    # their leaders known now, so that no send in a transaction waits for them
                    await self._answer(producer.partitions_for(topic), "broker "
                                       f"unreachable: {self.where} gave no metadata of topic "
                                       f"{topic!r}")
                self.record = await self._read_record() or self.record
                self._check_incarnations(channel)  # before anything is taken
                self._wait_for_open_takes(channel)
                deadline = self.started + self.settings.max_run_s
                while time.monotonic() < deadline and await self._transaction(channel):
                    pass
        except BaseException as exc:
            self.error = client.describe(exc, self.settings, self.in_transaction_s,
                                         self.connection_log)
            raise
        finally:
            if self.producer is not None:
                await _quietly(self.producer.stop(), CLOSE_S)
            self.connection_log.close()
        return self.report("ok")

    async def _start_producer(self) -> AIOKafkaProducer:
        """A started transactional producer (step 1), in place of the run's last one."""
        if self.producer is not None:
            await _quietly(self.producer.stop(), CLOSE_S)
        self.producer = client.producer(self.settings, self.transactional_id)
        await self._answer(self.producer.start(), f"broker unreachable: {self.where} did "
                           "not start the transactional producer (InitProducerId of "
                           f"{self.transactional_id!r}, from its transaction coordinator)")
        return self.producer

    async def _answer(self, step: Awaitable[T], failure: str, then: str = "") -> T:
        """`step`'s result, or a SinkError "<failure> within max_block_ms[; <then>]" when
        Kafka has not answered it in that time."""
        try:
            return await asyncio.wait_for(step, self.settings.max_block_ms / 1000)
        except TimeoutError:
            raise SinkError(f"{failure} within max_block_ms ({self.settings.max_block_ms} "
                            f"ms){'; ' + then if then else ''}") from None

    def _unacknowledged(self, number: int) -> str:
        return (f"broker unreachable: {self.where} did not acknowledge the batches of "
                f"transaction {number}")

    @property
    def where(self) -> str:
        """The cluster, as errors name it."""
        return f"Kafka at {self.settings.bootstrap}"

    def report(self, outcome: str, error: str | None = None) -> dict[str, Any]:
        """What the run did (also a failed one: what it had committed before failing)."""
        return {"channel": self.name, "run_id": self.run_id, "outcome": outcome,
                "error": error, "topic": self.settings.topic,
                "subscription": self.settings.subscription,
                "transactional_id": self.transactional_id, **self.counts,
                "ranges": describe_sent(self.ranges),
                "duration_s": round(time.monotonic() - self.started, 3)}

    def _step(self, step: str) -> None:
        self.steps[step] = self.steps.get(step, 0) + 1
        crash_point(step, self.steps[step])

    # -- steps 2-3 --------------------------------------------------------------------------
    async def _check_topics(self) -> None:
        """The topic exists (or is made) and so does the offsets topic (made when not)."""
        admin = client.admin(self.settings)
        try:
            await admin.start()
            topic, offsets = self.settings.topic, self.settings.offsets_topic
            found = await self._partitions(admin, [topic, offsets])
            replication = self.settings.topic_replication or min(
                3, len((await admin.describe_cluster())["brokers"]))
            if topic not in found:
                if not self.settings.create_topic:
                    raise SinkError(f"topic missing: {topic!r} does not exist on Kafka at "
                                    f"{self.settings.bootstrap} (create it, or set "
                                    "create_topic)")
                count = self.settings.topic_partitions or self.config.partitions
                await self._create(admin, NewTopic(topic, count, replication))
            if offsets not in found:
                await self._create(admin, NewTopic(offsets, 1, replication,
                                                   topic_configs=offsets_record.TOPIC_CONFIGS))
            found = await self._ready(admin, [topic, offsets])
            self.topic_partitions = found[topic]
            await self._check_offsets_topic(admin)
        finally:
            await _quietly(admin.close())
        if self.settings.partitioning == "same" and self.topic_partitions < self.config.partitions:
            raise SinkError(f"partitioning 'same' needs topic {topic!r} to have at least "
                            f"{self.config.partitions} partitions (the channel's); it has "
                            f"{self.topic_partitions}")

    async def _check_offsets_topic(self, admin: Any) -> None:
        """The offsets topic keeps every key's last record (offsets_record.keeps_records)."""
        name = self.settings.offsets_topic
        wanted = {"cleanup.policy": None, "retention.ms": None, "retention.bytes": None}
        deadline = time.monotonic() + self.settings.request_timeout_ms / 1000
        while True:
            [answer] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, wanted)])
            [(code, message, _, _, entries)] = answer.resources
            # a broker other than the controller may not know a topic made a moment ago
            if code != UNKNOWN_TOPIC or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        if code:
            raise for_code(code)(f"describing the configs of topic {name!r}: {message}")
        configs = {entry[0]: entry[1] for entry in entries}
        if not offsets_record.keeps_records(configs):
            raise SinkError(
                f"the offsets topic {name!r} has cleanup.policy={configs.get('cleanup.policy')}"
                f" with retention.ms={configs.get('retention.ms')} and retention.bytes="
                f"{configs.get('retention.bytes')}: Kafka would delete the offsets record of "
                "a stream idle that long, and the sink would then send everything again "
                "(set cleanup.policy=compact on it, as the sink does on the topic it makes)")

    async def _ready(self, admin: Any, topics: list[str]) -> dict[str, int]:
        """Partition count of each topic, once every partition has a leader: a topic made a
        moment ago (by this run, or another) answers NotLeaderForPartition until then."""
        deadline = time.monotonic() + self.settings.request_timeout_ms / 1000
        while True:
            found = await self._partitions(admin, topics)
            if all(t in found for t in topics) and not self.leaderless:
                return found
            if time.monotonic() > deadline:
                raise SinkError(f"topics {', '.join(sorted(set(topics) - set(found)) or topics)}"
                                f" have partitions without a leader after request_timeout_ms")
            await asyncio.sleep(0.1)

    async def _partitions(self, admin: Any, topics: list[str]) -> dict[str, int]:
        """Partition count of each topic that exists; errors other than "unknown" raise.
        Notes in `leaderless` whether a partition has no leader yet."""
        found = {}
        self.leaderless = False
        for described in await admin.describe_topics(topics):
            self.leaderless |= any(p["error_code"] != 0 or p["leader"] < 0
                                   for p in described.get("partitions", []))
            code = described["error_code"]
            if code == TOPIC_AUTHORIZATION_FAILED:
                raise TopicAuthorizationFailedError(f"topic {described['topic']!r}")
            if code == 0:
                found[described["topic"]] = len(described["partitions"])
            elif code != UNKNOWN_TOPIC:
                raise for_code(code)(f"topic {described['topic']!r}")
        return found

    async def _create(self, admin: Any, topic: NewTopic) -> None:
        answer = await admin.create_topics([topic])
        for name, code, message in answer.topic_errors:
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise for_code(code)(f"creating topic {name!r}: {message}")
        self.progress(f"kafka {self.name}: created topic {topic.name!r} "
                      f"({topic.num_partitions} partitions)", None)

    async def _read_record(self) -> OffsetsRecord | None:
        """Step 3: the last committed offsets record of this stream, or None."""
        tp = TopicPartition(self.settings.offsets_topic, offsets_record.PARTITION)
        consumer = client.consumer(self.settings)
        try:
            await consumer.start()
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = await self._stable_end(consumer, tp)
            found = None
            stuck = f"broker unreachable: {self.where} did not serve {tp.topic} partition " \
                    f"{tp.partition}"
            stalled_s = self.settings.request_timeout_ms / 1000
            deadline = time.monotonic() + stalled_s
            position = await self._answer(consumer.position(tp), stuck)
            while position < end:
                if time.monotonic() > deadline:
                    raise SinkError(f"could not read {tp.topic} partition {tp.partition} up "
                                    f"to offset {end}: it stayed at offset {position} for "
                                    "request_timeout_ms")
                fetched = await self._answer(consumer.getmany(tp, timeout_ms=500), stuck)
                messages = fetched.get(tp, [])
                now = await self._answer(consumer.position(tp), stuck)
                if now > position:  # a long partition may take a while: only a stall fails
                    position, deadline = now, time.monotonic() + stalled_s
                for message in messages:
                    if message.key == self.record.key:
                        found = None if message.value is None else OffsetsRecord.decode(
                            message.value, f"{tp.topic} partition {tp.partition} offset "
                                           f"{message.offset}")
            return found
        finally:
            await _quietly(consumer.stop())

    async def _stable_end(self, consumer: Any, tp: TopicPartition) -> int:
        """Where reading the record's partition may stop: its last stable offset, once that
        has passed the high watermark as it is now. Other streams share the partition: a
        transaction of theirs left open (a sink stopped or killed mid-transaction) holds the
        last stable offset below records committed after it, this stream's last record among
        them, and stopping there would read an older record of ours and send its events
        again. Such a transaction ends within its timeout (the broker aborts it)."""
        every = client.consumer(self.settings, committed=False)
        try:
            await every.start()
            high = (await every.end_offsets([tp]))[tp]
        finally:
            await _quietly(every.stop())
        wait_s = self.settings.transaction_timeout_ms / 1000 + STABLE_GRACE_S
        deadline = time.monotonic() + wait_s
        while (end := (await consumer.end_offsets([tp]))[tp]) < high:
            if time.monotonic() > deadline:
                raise SinkError(
                    f"{tp.topic} partition {tp.partition} has a transaction open below offset "
                    f"{high} for longer than {wait_s:g} s (another sink's, stopped or hung, "
                    "with a longer transaction timeout?): its record there cannot be read yet")
            await asyncio.sleep(0.2)
        return int(end)

    # -- step 4 -----------------------------------------------------------------------------
    def _ensure_subscription(self, channel: Channel) -> None:
        name = self.settings.subscription
        if name in channel.subscriptions():
            return
        try:
            channel.add_subscription(name, "slowest")
            self.progress(f"kafka {self.name}: added subscription {name!r} where the "
                          "slowest subscription stands", None)
        except SubscriptionExistsError:
            pass  # added meanwhile (by an operator): use it

    def _wait_for_open_takes(self, channel: Channel) -> None:
        name = self.settings.subscription
        deadline = time.monotonic() + OPEN_TAKES_WAIT_S
        while True:
            open_takes = channel.status()["subscriptions"][name]["open_takes"]
            if not open_takes:
                return
            if time.monotonic() > deadline:
                raise SinkError(f"subscription {name!r} of channel {self.name!r} has "
                                f"{open_takes} take(s) open (a run still going, stopped or "
                                "hung, or a consumer reading the sink's subscription): "
                                "the sink waits for them, to keep each partition's order")
            time.sleep(0.1)

    # -- steps 4-9 --------------------------------------------------------------------------
    async def _transaction(self, channel: Channel) -> bool:
        """One take and one Kafka transaction; False when nothing was left to take."""
        # No lease: a leased take outlives its process until the lease lapses (so that
        # another process may commit it); this one must return the moment the run dies.
        take = channel.take(subscription=self.settings.subscription)
        try:
            reserved = take.reserve(self.settings.max_events)
            if not reserved:
                take.rollback()
                return False
            self._step("reserved")
            self._recheck_incarnations(channel)
            to_send = self._plan(reserved)
            if to_send:
                await self._send_with_retries(to_send)
            take.commit()
            self._step("taken")
        except BaseException:
            if take.state == "open":
                take.rollback()
            raise
        return True

    def _check_incarnations(self, channel: Channel) -> None:
        """Step 3's check: what the record says was sent, against each partition's
        incarnation now (channel_engine/incarnations.py); SinkError on a conflict."""
        self.incarnations = channel.incarnations()
        found = conflicts(self.name, self.incarnations, self.record.by_incarnation(),
                          "Kafka sink")
        if found:
            raise SinkError(" ".join(found))

    def _recheck_incarnations(self, channel: Channel) -> None:
        """After each reserve, before step 5: SinkError (the take is rolled back) when a
        partition was made again since step 3's check (incarnations.changed_since)."""
        changed = changed_since(self.name, self.incarnations, channel.incarnations(),
                                "Kafka sink")
        if changed:
            raise SinkError(changed)

    def _plan(self, reserved: list[tuple[int, int, int]]) -> list[tuple[int, Range]]:
        """Step 5: (partition, range) to send: the reserved ranges, joined where they
        touch, less what the offsets record says the topic holds."""
        by_partition: dict[int, list[Range]] = {}
        for partition, start, end in reserved:
            by_partition.setdefault(partition, []).append((start, end))
        to_send = []
        for partition, ranges in sorted(by_partition.items()):
            for wanted in merge(ranges):
                pieces = subtract(wanted, self.record.sent.get(partition, []))
                self.counts["skipped"] += (wanted[1] - wanted[0]) - sum(e - s for s, e in pieces)
                to_send += [(partition, piece) for piece in pieces]
        return to_send

    async def _send_with_retries(self, to_send: list[tuple[int, Range]]) -> None:
        """_send, again in a new transaction (with a new producer: aiokafka leaves one that
        met such an error unusable) after an error Kafka calls retriable that came before
        the commit was asked for — a topic made a moment ago whose leader the transaction
        coordinator does not know yet answers NotLeaderForPartition. Nothing of an aborted
        transaction is ever read (read_committed), and the take is still open. An error
        during the commit is never retried here: its outcome is for the next run's record
        to say."""
        for attempt in range(1, SEND_ATTEMPTS + 1):
            assert self.producer is not None
            try:
                await self._send(self.producer, to_send)
                return
            except KafkaError as exc:
                if not exc.retriable or self.committing or attempt == SEND_ATTEMPTS:
                    raise
                self.progress(f"kafka {self.name}: {type(exc).__name__} before the commit: "
                              f"transaction aborted, sent again ({attempt})", None)
                await asyncio.sleep(0.2 * attempt)
                await self._start_producer()

    async def _send(self, producer: AIOKafkaProducer, to_send: list[tuple[int, Range]]) -> None:
        """Steps 6-8: the events and the new offsets record in one Kafka transaction."""
        self.committing = False
        number = self.counts["transactions"] + 1
        await self._answer(producer.begin_transaction(), "broker unreachable: "
                           f"{self.where} did not let transaction {number} begin")
        self.transaction_started = time.monotonic()
        try:
            acks = await self._send_events(producer, to_send)
            record = self.record.with_sent(to_send, self.run_id, number,
                                           self.settings.subscription,
                                           incarnations=labels(self.incarnations))
            acks.append(await producer.send(self.settings.offsets_topic, record.encode(),
                                            key=record.key, partition=offsets_record.PARTITION))
            await self._answer(asyncio.gather(*acks), self._unacknowledged(number),
                               "nothing was taken, and the transaction never commits "
                               "(the next run's start aborts it)")
            self._step("produced")
            self._count_gaps()
            self.committing = True
            await self._answer(  # the commit point
                producer.commit_transaction(),
                f"outcome unknown: {self.where} did not answer the commit of transaction "
                f"{number}", "nothing was taken, and the next run reads from the offsets "
                "record whether it committed (its events are never sent twice)")
        except BaseException as exc:
            self.in_transaction_s = time.monotonic() - self.transaction_started
            cause = _sender_error(producer)
            if not self.committing:  # after the commit was asked for, its outcome is Kafka's
                await _quietly(producer.abort_transaction(), CLOSE_S)
            if cause is not None and cause is not exc and not isinstance(exc, SinkError):
                raise cause from exc
            raise
        self.transaction_started = 0.0
        self.record = record
        self.counts["transactions"] += 1
        self.counts["events"] += self.pending["events"]
        self.counts["lost"] += self.pending["lost"]
        for partition, piece in to_send:
            self.ranges[partition] = merge(self.ranges.get(partition, []) + [piece])
        lost = f", {self.pending['lost']:,} lost" if self.pending["lost"] else ""
        self.progress(f"kafka {self.name}: transaction {self.counts['transactions']} "
                      f"committed, {self.pending['events']:,} events{lost}", {
                          "transaction": self.counts["transactions"], **self.pending,
                          "ranges": describe_sent({p: [r] for p, r in to_send})})
        self._step("kafka-committed")

    async def _send_events(self, producer: AIOKafkaProducer,
                           to_send: list[tuple[int, Range]]) -> list[Awaitable[Any]]:
        """Step 6: batches of the events, per topic partition; their acknowledgements."""
        acks: list[Awaitable[Any]] = []
        batches: dict[int, Any] = {}
        self.pending = {"events": 0, "lost": 0}  # counted once the transaction commits
        self.gaps = []
        topic = self.settings.topic

        async def ship(kafka_partition: int) -> None:
            acks.append(await producer.send_batch(batches.pop(kafka_partition), topic,
                                                  partition=kafka_partition))
            if len(acks) == 1:
                await self._answer(acks[0], self._unacknowledged(self.counts["transactions"]
                                                                 + 1))
                self._step("producing")

        with Channel.open(self.config.home, read_only=True) as snapshot:
            for partition, (start, end) in to_send:
                for event in self._events(snapshot, partition, start, end):
                    target = self._partition_of(partition, event.key)
                    headers = list(event.headers.items())
                    batch = batches.get(target)
                    if batch is None or batch.append(key=event.key, value=event.body,
                                                     timestamp=event.timestamp,
                                                     headers=headers) is None:
                        if batch is not None:
                            await ship(target)
                        batch = batches[target] = producer.create_batch()
                        batch.append(key=event.key, value=event.body,
                                     timestamp=event.timestamp, headers=headers)
                    self.pending["events"] += 1
        for target in sorted(batches):
            await ship(target)
        return acks

    def _events(self, snapshot: Channel, partition: int, start: int, end: int) -> Iterator[Any]:
        """The events [start, end) of a partition the log still holds; what it does not
        (damage the engine counted lost) is counted in "lost"."""
        offset = start
        while offset < end:
            events = snapshot.read(partition, offset, min(READ_CHUNK, end - offset))
            events = [e for e in events if e.offset < end]
            if not events:
                break
            for event in events:  # a damaged batch inside a chunk leaves a hole in it
                if event.offset != offset:
                    self._gap(partition, offset, event.offset)
                yield event
                offset = event.offset + 1
        self._gap(partition, offset, end)

    def _gap(self, partition: int, start: int, end: int) -> None:
        if end > start:
            self.pending["lost"] += end - start
            self.gaps.append((partition, start, end))

    def _count_gaps(self) -> None:
        """Before the Kafka commit records them sent: have the channel's owner read what the
        snapshot could not, so that its read meets the damage and counts it in the loss
        ledger. Should the owner read an event there, the gap was not damage: the
        transaction aborts rather than record that event sent."""
        assert self.channel is not None
        for partition, start, end in self.gaps:
            # a read skips damage and goes on (log_read.py): it meets every damaged batch of
            # the gap on its way to the first intact event after it
            events = self.channel.read(partition, start, min(end - start, READ_CHUNK))
            inside = [e.offset for e in events if e.offset < end]
            if inside:
                raise SinkError(f"channel {self.name!r} partition {partition}: offsets "
                                f"{start}-{end - 1} were missing from the run's read but its "
                                f"owner reads offset {inside[0]}: nothing is sent as lost that "
                                "is not (the next run reads them again)")
            self.progress(f"kafka {self.name}: partition {partition} offsets {start}-"
                          f"{end - 1} could not be read (damage): not sent, counted lost",
                          None)

    def _partition_of(self, partition: int, key: bytes | None) -> int:
        if self.settings.partitioning == "same":
            return partition
        if key is None:
            return partition % self.topic_partitions
        found = self.key_partitions.get(key)
        if found is None:  # aiokafka's murmur2 is Python: a third of a run's CPU, uncached
            if len(self.key_partitions) >= KEY_CACHE:
                self.key_partitions.clear()
            found = self.key_partitions[key] = key_partition(key, self.topic_partitions)
        return found


def _sender_error(producer: AIOKafkaProducer) -> BaseException | None:
    """The error aiokafka's background sender met in this transaction (fenced, timed out),
    if any: a call made after it fails only with "Can't send messages while not in
    transaction", which names no cause. aiokafka keeps it on its transaction manager's
    waiter and has no public accessor."""
    manager = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "_transaction_waiter", None)
    if waiter is not None and waiter.done() and not waiter.cancelled():
        error: BaseException | None = waiter.exception()
        return error
    return None


async def _quietly(step: Awaitable[Any], timeout_s: float = 30) -> None:
    """Await a clean-up step, ignoring its failure (the run's own error is the one told)."""
    try:
        await asyncio.wait_for(step, timeout_s)
    except Exception:  # noqa: BLE001,S110 -- a closing client's error changes nothing
        pass

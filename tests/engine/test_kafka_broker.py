"""A Kafka broker serves Weir's partition directories: Kafka's consumer reads what Weir wrote.

One KRaft node (broker and controller, `kafka.Kafka`, the pinned `kafka-tools` set or
`WEIR_KAFKA_HOME`, as in test_kafka_tools.py) on two free 127.0.0.1 ports, its log.dirs
in a temp dir. The topic `weir` is created with two partitions (kafka-python's admin
client), the broker is stopped cleanly, the segment files of each partition directory
are replaced by a copy of a Weir partition (golden v1; one written with every codec,
keys and headers), and the broker is started again: it loads Weir's segments and
indexes as its own (a clean shutdown: Weir's indexes are used, nothing rebuilt). Kafka's
console consumer (`org.apache.kafka.tools.consumer.ConsoleConsumer`) then reads both
partitions from the beginning, printing offset, timestamp, key, headers with their
values and payload; every record must be what Weir put. Retention is off
(`log.retention.ms=-1`): the golden timestamps are from 2020.

Costs: four JVM starts (format, two broker starts, the consumer), ~25 s. The broker is
stopped when the module's tests end, whatever happened.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
import warnings
from pathlib import Path

import pytest
from test_golden import EXPECTED as GOLDEN_EVENTS
from test_golden import GOLDENS
from test_kafka_tools import LOG4J, java, kafka_classpath, write_mixed_partition

TOPIC = "weir"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_properties(logs: Path, port: int, controller_port: int) -> str:
    return "\n".join([
        "process.roles=broker,controller", "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT", f"log.dirs={logs}",
        "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0", "auto.create.topics.enable=false",
        "log.retention.ms=-1", ""])


class Broker:
    """One KRaft node in a temp dir; start() waits for its port, stop() for a clean exit."""

    def __init__(self, root: Path, classpath: str) -> None:
        self.root, self.classpath = root, classpath
        self.logs = root / "logs"
        self.port, controller_port = free_port(), free_port()
        self.config = root / "server.properties"
        self.config.write_text(server_properties(self.logs, self.port, controller_port))
        self.process: subprocess.Popen | None = None
        self.run_jvm("kafka.tools.StorageTool", "format", "-t", uuid.uuid4().hex[:22],
                     "-c", str(self.config))

    def jvm(self, main: str, *args: str) -> list[str]:
        return [java(), f"-Dlog4j.configuration=file:{LOG4J}", "-Xmx512m",
                "-cp", self.classpath, main, *args]

    def run_jvm(self, main: str, *args: str) -> str:
        result = subprocess.run(self.jvm(main, *args), capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 0, f"{main} {args} exited {result.returncode}:\n" \
                                       f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        return result.stdout

    def start(self) -> float:
        started = time.monotonic()
        log = (self.root / "broker.log").open("a")
        self.process = subprocess.Popen(self.jvm("kafka.Kafka", str(self.config)),
                                        stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - started < 90:
            assert self.process.poll() is None, \
                f"the broker exited {self.process.returncode}: see {self.root / 'broker.log'}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"the broker did not listen within 90 s: {self.root / 'broker.log'}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # a controlled shutdown
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def create_topic(port: int, partitions: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import KafkaAdminClient, NewTopic
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        admin.create_topics([NewTopic(TOPIC, partitions, 1)])
    finally:
        admin.close()


def install_partition(partition_dir: Path, weir_dir: Path) -> None:
    """Replace the broker's segment files of a partition by Weir's (keeping its metadata)."""
    for old in partition_dir.glob("0*"):
        old.unlink()
    for segment_file in weir_dir.glob("0*"):  # .log, .index, .timeindex; not log.state
        shutil.copy2(segment_file, partition_dir / segment_file.name)


@pytest.fixture(scope="module")
def consumed(tmp_path_factory) -> tuple[dict[int, list[tuple]], dict[int, list[str]]]:
    """What Weir wrote to each partition, and the lines Kafka's console consumer printed."""
    root = tmp_path_factory.mktemp("kafka-broker")
    expected = {
        0: [(e.offset, e.timestamp, e.key, list(e.headers.items()), e.body)
            for e in GOLDEN_EVENTS],
        1: write_mixed_partition(root / "mixed"),
    }
    broker = Broker(root, kafka_classpath())
    try:
        first = broker.start()
        create_topic(broker.port, 2)
        deadline = time.monotonic() + 30
        while not all((broker.logs / f"{TOPIC}-{p}").is_dir() for p in expected):
            assert time.monotonic() < deadline, "the broker made no partition directories"
            time.sleep(0.2)
        broker.stop()
        install_partition(broker.logs / f"{TOPIC}-0", GOLDENS[1])
        install_partition(broker.logs / f"{TOPIC}-1", root / "mixed")
        second = broker.start()
        total = sum(len(e) for e in expected.values())
        started = time.monotonic()
        output = broker.run_jvm(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server", f"127.0.0.1:{broker.port}", "--topic", TOPIC,
            "--from-beginning", "--max-messages", str(total), "--timeout-ms", "30000",
            *[arg for p in ("key", "headers", "timestamp", "offset", "partition")
              for arg in ("--property", f"print.{p}=true")])
        print(f"broker up in {first:.1f} s, again with Weir's files in {second:.1f} s; "
              f"console consumer read {total} records in {time.monotonic() - started:.1f} s")
    finally:
        broker.stop()
    lines: dict[int, list[str]] = {p: [] for p in expected}
    for line in output.splitlines():
        partition = int(line.split("\t")[1].removeprefix("Partition:"))
        lines[partition].append(line)
    return expected, lines


def console_line(offset: int, timestamp: int, key: bytes | None,
                 headers: list[tuple[str, bytes]], body: bytes) -> tuple:
    """What the console consumer prints for a record, split at its tabs."""
    printed_headers = ",".join(f"{k}:{v.decode()}" for k, v in headers) or "NO_HEADERS"
    printed_key = "null" if key is None else key.decode()
    return (f"CreateTime:{timestamp}", f"Offset:{offset}", printed_headers, printed_key,
            body.decode())


@pytest.mark.parametrize("partition", [0, 1], ids=["golden-v1", "every-codec"])
def test_it_serves_weirs_partition_to_kafkas_consumer_record_for_record(consumed, partition):
    expected, lines = consumed
    got = []
    for line in lines[partition]:
        created, _partition, offset, headers, key, payload = line.split("\t", 5)
        got.append((created, offset, headers, key, payload))
    assert got == [console_line(*record) for record in expected[partition]]

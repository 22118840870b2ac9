"""The Kafka sink when its broker goes away: restarted (cleanly or killed) in the middle of
a run's transaction, or down for a while as producers keep putting. Each run either
commits or fails naming the broker; the channel keeps every event meanwhile; once the
broker is back the sink catches up, every event in the topic exactly once.

A broker of this module's own (scripts/kafka.sh in a temp dir, ~10 s to start), since
the tests stop and restart it: the run's shared broker serves other tests meanwhile.
"""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest
from kafka_sink_helpers import (
    ROOT,
    channel_partitions,
    drain,
    new_channel,
    new_topic,
    parse_run,
    put_events,
    read_topic,
    run_sink,
    sink_command,
)
from services import SCRIPTS, started_service
from test_kafka_sink import _wait_stopped

from channel_engine import Channel


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """(bootstrap, the env naming its state dir for scripts/kafka.sh)."""
    env = {**os.environ, "WEIR_KAFKA_DIR": str(tmp_path_factory.mktemp("kafka-faults"))}
    with started_service("kafka.sh", env) as bootstrap:
        yield bootstrap, env


def kafka(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([str(SCRIPTS / "kafka.sh"), *args], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_broker_restart_mid_transaction_loses_and_duplicates_nothing(tmp_path, broker, how):
    bootstrap, env = broker
    config = new_channel(tmp_path)
    put_events(config, 0, 400)
    topic = new_topic(bootstrap)
    sink = subprocess.Popen(sink_command(config, bootstrap, topic, max_events=150,
                                         request_timeout_ms=10_000), cwd=ROOT,
                            env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": "producing@2"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(sink.pid)  # one transaction committed, the second one open
        kafka(env, "stop", *(["--kill"] if how == "kill" else []))
        kafka(env, "start", "--keep")
    finally:
        sink.send_signal(signal.SIGCONT)
    output, _ = sink.communicate(timeout=180)
    run = parse_run(sink.returncode, output)
    assert run.returncode in (0, 1), output
    if run.returncode == 1:
        assert run.error, output
    drain(config, bootstrap, topic, max_events=150)
    assert read_topic(bootstrap, topic) == channel_partitions(config)


@pytest.mark.parametrize(("step", "error"), [
    ("producing", "broker unreachable: Kafka at {} did not acknowledge the batches of "
                  "transaction 1 within max_block_ms (5000 ms); nothing was taken"),
    ("produced", "outcome unknown: Kafka at {} did not answer the commit of transaction 1 "
                 "within max_block_ms (5000 ms); nothing was taken")])
def test_a_broker_gone_mid_transaction_fails_the_run_within_max_block_ms(tmp_path, broker,
                                                                         step, error):
    """aiokafka waits for a leader it cannot reach, or for the coordinator's answer to a
    commit, as long as it takes: the run must not. A commit with no answer has an unknown
    outcome: the next run learns it from the offsets record and sends nothing twice."""
    bootstrap, env = broker
    config = new_channel(tmp_path)
    put_events(config, 0, 400)
    topic = new_topic(bootstrap)
    sink = subprocess.Popen(sink_command(config, bootstrap, topic, max_events=150,
                                         request_timeout_ms=3_000, max_block_ms=5_000),
                            cwd=ROOT, env={**os.environ, "WEIR_KAFKA_SINK_STOP_AT": step},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(sink.pid)  # the first transaction open: sending, or about to commit
        kafka(env, "stop")
    finally:
        sink.send_signal(signal.SIGCONT)
    try:
        output, _ = sink.communicate(timeout=60)  # 5 s of max_block_ms, 5 s to close
        run = parse_run(sink.returncode, output)
        assert run.returncode == 1, output
        assert run.error.startswith(error.format(bootstrap)), run.error
        assert run.report["transactions"] == 0, output
        with Channel.open(config) as channel:  # the take was returned
            kafka_queue = channel.status()["subscriptions"]["kafka"]
            assert (kafka_queue["events_untaken"], kafka_queue["open_takes"]) == (400, 0)
    finally:
        kafka(env, "start", "--keep")
    drain(config, bootstrap, topic, max_events=150)
    assert read_topic(bootstrap, topic) == channel_partitions(config)


def test_the_sink_catches_up_after_the_broker_was_down_for_a_while(tmp_path, broker):
    bootstrap, env = broker
    config = new_channel(tmp_path)
    put_events(config, 0, 100)
    topic = new_topic(bootstrap)
    assert run_sink(config, bootstrap, topic).returncode == 0
    kafka(env, "stop")
    try:
        for start in range(100, 1_100, 250):  # producers go on; every run fails, takes nothing
            put_events(config, start, 250)
            run = run_sink(config, bootstrap, topic, request_timeout_ms=2_000)
            assert run.returncode == 1 and run.error.startswith("broker unreachable"), run.output
        with Channel.open(config) as channel:
            assert channel.status()["subscriptions"]["kafka"]["events_untaken"] == 1_000
    finally:
        kafka(env, "start", "--keep")
    drain(config, bootstrap, topic)
    assert read_topic(bootstrap, topic) == channel_partitions(config)

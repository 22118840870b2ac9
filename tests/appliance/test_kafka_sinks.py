"""The Kafka sink from the appliance's side (appliance/kafka_sinks.py) against the run's real
Kafka broker: a run's KafkaRun row says what it sent — also a run whose job was killed, or
whose worker died — one run per channel at a time, manage.py drain_to_kafka, the Celery
task on a real worker, the settings checked naming the field, and the sink's subscription
kept while the sink is scheduled."""
from __future__ import annotations

import fcntl
import os
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, token_client
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.utils import timezone
from polling import wait_for

from appliance import channels, kafka_sinks, tasks
from appliance.kafka_sinks import SinkBusy, run_sink
from appliance.models import Channel, KafkaRun, TaskRun

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from kafka_sink_helpers import channel_partitions, new_topic, read_topic  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)  # the worker's threads see the rows


def sink_row(root: Path, bootstrap: str, events: int = 300, **settings: Any) -> Channel:
    """A channel with a Kafka sink into a topic of its own, holding `events` events."""
    row = channel_row(root, partitions=2, kafka_topic=new_topic(bootstrap),
                      kafka_bootstrap=bootstrap, **settings)
    channel = channels.open_channel(row)
    with channel.put() as tx:
        for i in range(events):
            tx.put(f"event-{i}".encode(), key=f"k{i % 5}".encode(), headers={"i": str(i)})
    return row


def assert_in_kafka_once(row: Channel, bootstrap: str) -> None:
    channels.close_all()  # the sink's job owned it meanwhile: a fresh look
    assert read_topic(bootstrap, row.kafka_topic) == channel_partitions(
        channels.to_config(row))


def test_a_run_sends_every_event_and_records_what_it_sent(root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap)
    run = run_sink(row)
    assert run.outcome == "ok" and run.events == 300 and run.transactions == 1, run.error
    assert run.topic == row.kafka_topic and run.duration_s > 0 and run.run_id
    assert sum(e - s for ranges in run.ranges.values() for s, e in ranges) == 300
    assert_in_kafka_once(row, kafka_broker.bootstrap)
    assert run_sink(row) is None  # drained: no row for a run that did nothing
    assert list(KafkaRun.objects.filter(channel=row.name)) == [run]
    metrics = token_client("admin").get("/metrics").content.decode()
    labels = f'channel="{row.name}",topic="{row.kafka_topic}"'
    assert f'weir_kafka_sink_info{{{labels},subscription="kafka"}} 1' in metrics
    assert f"weir_kafka_sink_last_run_events{{{labels}}} 300" in metrics
    assert f"weir_kafka_sink_last_run_failed{{{labels}}} 0" in metrics
    status = channels.open_channel(row).status()["subscriptions"]
    assert status["kafka"]["events_untaken"] == 0 and status["default"]["events_untaken"] == 300


def test_a_killed_job_leaves_a_row_that_tells_what_it_committed(root, kafka_broker,
                                                                 monkeypatch):
    row = sink_row(root, kafka_broker.bootstrap, kafka_interval_ms=None)
    Channel.objects.filter(pk=row.pk).update(kafka_topic=row.kafka_topic)
    monkeypatch.setenv("WEIR_KAFKA_SINK_CRASH_AT", "kafka-committed@2")
    monkeypatch.setattr(kafka_sinks, "command",
                        lambda r, f=kafka_sinks.command: [*f(r), "--max-events", "100"])
    run = run_sink(row)
    assert run.outcome == "failed" and "exited with -9" in run.error, run.error
    assert run.events == 200 and run.transactions == 2  # both committed to Kafka
    monkeypatch.delenv("WEIR_KAFKA_SINK_CRASH_AT")
    rerun = run_sink(row)
    assert rerun.outcome == "ok", rerun.error
    assert rerun.skipped == 100 and rerun.events == 100
    assert_in_kafka_once(row, kafka_broker.bootstrap)


def test_a_run_left_running_by_a_dead_worker_is_marked_failed(root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap, events=10)
    stale = KafkaRun.objects.create(channel=row.name, started_at=timezone.now(), events=5,
                                    transactions=1)
    run_sink(row)
    stale.refresh_from_db()
    assert stale.outcome == "failed" and "died" in stale.error and stale.events == 5


def test_one_run_per_channel_at_a_time(root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap, events=10)
    lock = channels.to_config(row).home / kafka_sinks.LOCK_FILE
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(SinkBusy, match="already running"):
            run_sink(row)
        with pytest.raises(CommandError, match="nothing was started"):
            call_command("drain_to_kafka", row.name)
    finally:
        os.close(fd)
    assert not KafkaRun.objects.exists()


def test_manage_drain_to_kafka(root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap, events=50)
    out = StringIO()
    call_command("drain_to_kafka", row.name, stdout=out)
    assert f"sent 50 events of '{row.name}' to topic '{row.kafka_topic}'" in out.getvalue()
    out = StringIO()
    call_command("drain_to_kafka", row.name, stdout=out)
    assert "nothing to send" in out.getvalue()
    with pytest.raises(CommandError, match="no channel named"):
        call_command("drain_to_kafka", "nope")
    Channel.objects.filter(pk=row.pk).update(kafka_topic="")
    with pytest.raises(CommandError, match="kafka_topic"):
        call_command("drain_to_kafka", row.name)


def test_a_failed_run_names_the_cause_and_takes_nothing(root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap, events=20)
    Channel.objects.filter(pk=row.pk).update(kafka_topic="never-made-" + row.kafka_topic)
    row.refresh_from_db()
    run = run_sink(row)
    assert run.outcome == "failed" and run.error.startswith("topic missing"), run.error
    with pytest.raises(CommandError, match="topic missing"):
        call_command("drain_to_kafka", row.name)
    status = channels.open_channel(row).status()["subscriptions"]
    assert status["kafka"]["events_untaken"] == 20


def test_the_task_runs_the_sink_on_a_real_worker(worker, root, kafka_broker, monkeypatch):
    row = sink_row(root, kafka_broker.bootstrap, events=40)
    result = tasks.kafka_sink_channel.delay(row.name)
    assert result.get(timeout=120) == TaskRun.OK
    [run] = KafkaRun.objects.filter(channel=row.name)
    assert run.outcome == "ok" and run.events == 40
    started = []  # drained: the next task starts no job (and no Kafka client) at all
    monkeypatch.setattr(kafka_sinks, "run_sink", lambda row: started.append(row))
    assert tasks.kafka_sink_channel.delay(row.name).get(timeout=120) == TaskRun.NOTHING_DUE
    assert started == []
    monkeypatch.undo()
    assert_in_kafka_once(row, kafka_broker.bootstrap)


def test_the_api_sends_to_kafka_now_for_admins_only(worker, root, kafka_broker):
    row = sink_row(root, kafka_broker.bootstrap, events=30)
    plain = channel_row(root, name="plain")
    assert token_client("produce").post(f"/api/v1/channels/{row.name}/kafka-runs") \
        .status_code == 403
    assert token_client("admin", channels=[plain]).post(
        f"/api/v1/channels/{row.name}/kafka-runs").status_code == 403  # another channel's
    admin = token_client("admin")
    assert admin.post("/api/v1/channels/nope/kafka-runs").status_code == 404
    refused = admin.post(f"/api/v1/channels/{plain.name}/kafka-runs")
    assert refused.status_code == 409 and refused.json()["field"] == "kafka_topic"
    answer = admin.post(f"/api/v1/channels/{row.name}/kafka-runs")
    assert answer.status_code == 202 and answer.json()["queued"] is True, answer.json()
    run = wait_for(lambda: KafkaRun.objects.filter(channel=row.name, outcome="ok").first(),
                   60, "the Kafka worker ran the queued run")
    assert run.events == 30
    assert_in_kafka_once(row, kafka_broker.bootstrap)


@pytest.mark.parametrize(("changes", "field"), [
    ({"kafka_topic": "orders"}, "kafka_bootstrap"),  # no broker named anywhere
    ({"kafka_topic": "bad topic", "kafka_bootstrap": "h:1"}, "kafka_topic"),
    ({"kafka_partitioning": "random"}, "kafka_partitioning"),
    ({"kafka_subscription": "Bad Name"}, "kafka_subscription"),
    ({"kafka_topic": "o", "kafka_bootstrap": "nohost"}, "kafka_bootstrap"),
    ({"kafka_topic": "o", "kafka_bootstrap": "h:1", "kafka_security_protocol": "SASL_SSL"},
     "kafka_sasl_username"),
    ({"kafka_interval_ms": 5_000}, "kafka_interval_ms"),  # no topic
    ({"kafka_topic": "o", "kafka_bootstrap": "h:1", "kafka_interval_ms": 10}, "kafka_interval_ms"),
])
def test_the_settings_are_checked_naming_the_field(root, settings, changes, field):
    settings.WEIR_KAFKA_BOOTSTRAP = ""
    row = channel_row(root)
    for name, value in changes.items():
        setattr(row, name, value)
    with pytest.raises(ValidationError) as caught:
        channels.to_config(row)
    assert field in caught.value.message_dict, caught.value.message_dict


def test_the_api_sets_the_sink_and_keeps_its_subscription_while_scheduled(root, settings):
    settings.WEIR_KAFKA_BOOTSTRAP = "127.0.0.1:9092"
    row = channel_row(root)
    admin = token_client("admin")
    bad = admin.patch(f"/api/v1/channels/{row.name}", {"kafka_partitioning": "random"},
                      format="json")
    assert bad.status_code == 400 and "kafka_partitioning" in bad.json()["errors"], bad.json()
    answer = admin.patch(f"/api/v1/channels/{row.name}",
                         {"kafka_topic": "orders", "kafka_interval_ms": 5_000}, format="json")
    assert answer.status_code == 200, answer.json()
    detail = admin.get(f"/api/v1/channels/{row.name}").json()
    assert detail["settings"]["kafka_topic"] == "orders" and detail["recent_kafka_runs"] == []
    assert "kafka" in channels.open_channel(row).subscriptions()  # added at "slowest"
    refused = admin.delete(f"/api/v1/channels/{row.name}/subscriptions/kafka")
    assert refused.status_code == 409 and "Kafka sink" in str(refused.json())
    admin.patch(f"/api/v1/channels/{row.name}", {"kafka_interval_ms": None}, format="json")
    assert admin.delete(f"/api/v1/channels/{row.name}/subscriptions/kafka").status_code == 204


def test_the_channel_page_shows_the_sink_and_sends_now_on_a_worker(worker, root, kafka_broker):
    from django.contrib.auth.models import User
    from django.test import Client

    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    row = sink_row(root, kafka_broker.bootstrap, events=25)
    page = operator.get(f"/channels/{row.name}/").content.decode()
    assert f"Into topic <code>{row.kafka_topic}</code>" in page and 'id="kafka-now"' in page
    assert "No runs that sent or failed yet." in page
    answer = operator.post(f"/channels/{row.name}/kafka", follow=True)
    assert b"Kafka run queued" in answer.content
    deadline = time.monotonic() + 60
    while not KafkaRun.objects.filter(channel=row.name, outcome="ok").exists():
        assert time.monotonic() < deadline, "the worker never ran the sink"
        time.sleep(0.2)
    status = operator.get(f"/channels/{row.name}/status").content.decode()
    assert 'class="kafka-run"' in status and '<td class="n events">25</td>' in status
    assert 'id="kafka-lag">Lag: <strong>0</strong> events' in status
    assert '<span class="badge running">kafka sink</span>' in status
    Channel.objects.filter(pk=row.pk).update(kafka_topic="")
    page = operator.get(f"/channels/{row.name}/").content.decode()
    assert 'id="kafka-now"' not in page and "No Kafka sink" in page


def test_send_now_answers_503_naming_the_broker_when_redis_is_down(root, monkeypatch):
    from appliance.celery import app

    row = channel_row(root, kafka_topic="orders", kafka_bootstrap="127.0.0.1:9092")
    monkeypatch.setattr(app.conf, "broker_write_url", "redis://127.0.0.1:1/0")
    answer = token_client("admin").post(f"/api/v1/channels/{row.name}/kafka-runs")
    assert answer.status_code == 503 and answer["Retry-After"], answer.content
    assert answer.json()["detail"].startswith("Kafka run not queued: the broker is "
                                              "unreachable (") and "127.0.0.1:1" in \
        answer.json()["detail"]
    assert not KafkaRun.objects.exists()

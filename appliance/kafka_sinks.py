"""The Kafka sink from the appliance's side: run the sink's job (channel_engine/kafka_sink)
for a channel row and keep a KafkaRun row of it, truthful also when the job is killed.

The job needs no database: it gets the channel's home and sink settings on its command
line (kafka_bootstrap, else WEIR_KAFKA_BOOTSTRAP; WEIR_KAFKA_OFFSETS_TOPIC) and runs in a
process of its own, so a kill of it is a kill of that process only: the protocol
(channel_engine/kafka_sink/sink.py) makes the next run exact. Secrets never go on the
command line: the SASL password and the TLS key are read by the job from their files.

While the job runs, each Kafka transaction it commits prints a `{"committed": ...}` line,
and the row is updated from it (events, lost, transactions): a run killed midway keeps
what it did commit. The next run marks such a row failed (the process died), and its own
row counts what that run had committed after its last line as "skipped" (the offsets
record in Kafka says they are there).

One run of a channel at a time:

    lock file                      held (flock, exclusive, never waited for)
    -----------------------------  ----------------------------------------------------------
    <home>/kafka-sink-run.lock     by run_sink, from before its KafkaRun row is created until
                                   the row is finished; the job inherits it
    <home>/kafka-sink.lock         by the job itself (channel_engine/kafka_sink/job.py)

Held elsewhere, run_sink starts nothing and raises SinkBusy (the Celery task records its run
as busy; manage.py drain_to_kafka exits with an error). A run that sent nothing and failed
nothing (the subscription was drained) keeps no KafkaRun row: at one a second they would
bury the runs that did something; its TaskRun says "nothing due".
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque
from dataclasses import fields
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from appliance.exports import TAIL_LINES, cause
from appliance.models import Channel, KafkaRun
from channel_engine import ChannelConfig, ConfigError
from channel_engine.kafka_sink.settings import SinkSettings

JOB = "channel_engine.kafka_sink"
LOCK_FILE = "kafka-sink-run.lock"
EXIT_BUSY = 75
DIED = ("the process running this Kafka sink run died (a killed or restarted worker) "
        "before its outcome was recorded; the counts are those of the transactions it "
        "reported, and the next run skips whatever it committed after them")
# The channel row's field of each SinkSettings field the row sets.
ROW_FIELDS = {"topic": "kafka_topic", "bootstrap": "kafka_bootstrap",
              "subscription": "kafka_subscription", "partitioning": "kafka_partitioning",
              "compression": "kafka_compression", "create_topic": "kafka_create_topic",
              "security_protocol": "kafka_security_protocol",
              "sasl_mechanism": "kafka_sasl_mechanism", "sasl_username": "kafka_sasl_username",
              "sasl_password_file": "kafka_sasl_password_file",
              "ssl_cafile": "kafka_ssl_cafile", "ssl_certfile": "kafka_ssl_certfile",
              "ssl_keyfile": "kafka_ssl_keyfile"}


class SinkBusy(Exception):
    """Another process is running the channel's Kafka sink: nothing was started."""


def sink_settings(row: Channel, config: ChannelConfig | None = None) -> SinkSettings:
    """The job's settings for a row; ValidationError naming the kafka_ field that is wrong.
    A row without a topic (the sink off) is checked with a stand-in topic and broker."""
    from appliance import channels

    config = config or channels.to_config(row)
    bootstrap = row.kafka_bootstrap or settings.WEIR_KAFKA_BOOTSTRAP
    if row.kafka_topic and not bootstrap:
        raise ValidationError({"kafka_bootstrap": "set it (host:port[,host:port]), or "
                                                  "WEIR_KAFKA_BOOTSTRAP for every channel"})
    values = {name: getattr(row, field) for name, field in ROW_FIELDS.items()}
    values.update(home=str(config.home), bootstrap=bootstrap or "off:9092",
                  topic=row.kafka_topic or "off",
                  offsets_topic=settings.WEIR_KAFKA_OFFSETS_TOPIC)
    try:
        return SinkSettings(**values)
    except ConfigError as exc:
        field = ROW_FIELDS.get(exc.field)
        if field is None:  # offsets_topic: the appliance's setting, not the row's
            raise ValidationError({"kafka_topic": str(exc)}) from exc
        raise ValidationError({field: exc.reason}) from exc


def queue_sink(row: Channel) -> str:
    """Queue a run of the channel's sink for the Kafka worker ("send to Kafka now"); its
    task id, or exports.BrokerUnavailable at once when the broker does not answer."""
    from appliance.exports import queue_now
    from appliance.tasks import kafka_sink_channel

    return queue_now(kafka_sink_channel, row.name, "Kafka run")


def command(row: Channel) -> list[str]:
    """The job's command line for a channel row with a topic."""
    sink = sink_settings(row)
    defaults = SinkSettings(home="", bootstrap="x:1", topic="x")
    argv = [sys.executable, "-m", JOB]
    for field in fields(SinkSettings):
        value = getattr(sink, field.name)
        flag = "--" + field.name.replace("_", "-")
        if field.name in ("home", "bootstrap", "topic") or value != getattr(defaults, field.name):
            argv += [flag] if value is True else [flag, str(value)]
    return argv


def run_sink(row: Channel, timeout_s: float = 600) -> KafkaRun | None:
    """Run the channel's Kafka sink once now; its finished KafkaRun, or None when it had
    nothing to send. SinkBusy, and nothing started, when another process runs it."""
    if not row.kafka_topic:
        raise ValidationError({"kafka_topic": "the channel has no Kafka sink (no topic)"})
    argv = command(row)  # ValidationError before anything starts
    with _run_lock(row) as lock_fd:
        _fail_stale_runs(row.name)
        run = KafkaRun.objects.create(channel=row.name, topic=row.kafka_topic,
                                      started_at=timezone.now())
        report = _run_job(run, argv, lock_fd, timeout_s)
        if report.get("code") == EXIT_BUSY:  # the job's own lock: run by hand meanwhile
            run.delete()
            raise SinkBusy(report.get("error") or "the Kafka sink is already running")
        run.refresh_from_db()
        _finish(run, report)
    if run.outcome == KafkaRun.OK and not (run.events or run.skipped or run.lost):
        run.delete()  # drained already: nothing worth a row (module doc)
        return None
    return run


def _run_lock(row: Channel) -> Any:
    from appliance import channels
    from appliance.exports import held

    path = channels.to_config(row).home / LOCK_FILE
    return held(path, SinkBusy(f"the Kafka sink of channel {row.name!r} is already running "
                               f"({path} is locked)"))


def _fail_stale_runs(name: str) -> None:
    """Mark failed the channel's runs left "running" by a dead process (the caller holds
    the lock)."""
    KafkaRun.objects.filter(channel=name, outcome=KafkaRun.RUNNING).update(
        outcome=KafkaRun.FAILED, error=DIED)


def _run_job(run: KafkaRun, argv: list[str], lock_fd: int,
             timeout_s: float) -> dict[str, Any]:
    """Run the job, recording each committed transaction on the row; its last JSON line."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    last: dict[str, Any] = {}
    committed = {"events": 0, "lost": 0, "transactions": 0}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1, pass_fds=(lock_fd,)) as job:
        assert job.stdout is not None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            job.kill()

        timer = threading.Timer(timeout_s, expire)
        timer.start()
        try:
            for line in job.stdout:
                line = line.rstrip("\n")
                if line.startswith('{"committed"'):
                    done = json.loads(line)["committed"]
                    committed["events"] += done["events"]
                    committed["lost"] += done.get("lost", 0)
                    committed["transactions"] = done["transaction"]
                    KafkaRun.objects.filter(pk=run.pk).update(**committed)
                elif line.startswith('{"report"'):
                    last = json.loads(line)
                else:
                    tail.append(line)
            code = job.wait()
        except BaseException as exc:  # a time limit, a lost database: no orphan job
            job.kill()
            KafkaRun.objects.filter(pk=run.pk).update(
                outcome=KafkaRun.FAILED, error=f"the run was interrupted and its job killed: "
                                               f"{type(exc).__name__}: {exc}")
            raise
        finally:
            timer.cancel()
    if not last:
        last = {"report": None, "error": (
            f"the Kafka sink's job ran longer than {timeout_s:g} s and was killed"
            if expired.is_set() else f"the Kafka sink's job exited with {code}: "
            + cause(list(tail)))}
    last["code"] = code
    return last


def _finish(run: KafkaRun, last: dict[str, Any]) -> None:
    """The row from the job's report line."""
    report = last.get("report") or {}
    run.duration_s = (timezone.now() - run.started_at).total_seconds()
    run.run_id = report.get("run_id", "")
    for name in ("events", "skipped", "lost", "transactions"):
        setattr(run, name, report.get(name, getattr(run, name)))
    run.ranges = report.get("ranges", run.ranges)
    if last.get("code") == 0 and report.get("outcome") == "ok":
        run.outcome, run.error = KafkaRun.OK, ""
    else:
        run.outcome = KafkaRun.FAILED
        run.error = report.get("error") or last.get("error") or "the job failed"
    run.save()

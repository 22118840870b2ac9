"""manage.py drain_to_kafka NAME — forward a channel's next events to its Kafka topic now
(exactly once; see channel_engine/kafka_sink/sink.py). Prints what the run sent; exits with
an error, starting nothing, while another run of the channel's sink goes on, and with the
run's error when it failed (nothing of the failed transaction was taken)."""
from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance.kafka_sinks import SinkBusy, run_sink
from appliance.models import Channel


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        row = Channel.objects.filter(name=options["name"]).first()
        if row is None:
            raise CommandError(f"no channel named {options['name']!r}")
        try:
            run = run_sink(row)
        except SinkBusy as exc:
            raise CommandError(f"{exc}; nothing was started") from exc
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(errors)}" for field, errors
                                         in exc.message_dict.items())) from exc
        if run is None:
            self.stdout.write(f"nothing to send: {row.name!r} is all in topic "
                              f"{row.kafka_topic!r}")
            return
        if run.outcome != "ok":
            raise CommandError(f"Kafka sink of {row.name!r} failed: {run.error}")
        self.stdout.write(f"sent {run.events:,} events of {row.name!r} to topic "
                          f"{row.kafka_topic!r} in {run.transactions} transaction(s)"
                          + (f"; {run.skipped:,} were there already" if run.skipped else ""))
        self.stdout.write(json.dumps({"run_id": run.run_id, "ranges": run.ranges}))

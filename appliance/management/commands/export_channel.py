"""manage.py export_channel NAME — export a channel's next events to WEIR_EXPORT_URI now
(Spark, exactly once; see channel_engine/spark/export.py). Prints the run's report."""
from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance.exports import run_export
from appliance.models import Channel


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        row = Channel.objects.filter(name=options["name"]).first()
        if row is None:
            raise CommandError(f"no channel named {options['name']!r}")
        run = run_export(row)
        if run.outcome != "ok":
            raise CommandError(f"export of {row.name!r} failed: {run.error}")
        self.stdout.write(f"exported {run.rows:,} events ({run.bytes:,} bytes) of "
                          f"{row.name!r} to {run.output}")
        self.stdout.write(json.dumps({"run_id": run.run_id, "partitions": run.partitions}))

"""manage.py export_channel NAME — export a channel's next events to WEIR_EXPORT_URI now
(Spark, exactly once; see channel_engine/spark/exporter.py), in a fresh Spark process (no
warm driver: appliance/export_driver.py). Prints the run's report; exits
with an error, starting nothing, while another export of the channel runs."""
from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance.exports import ExportBusy, run_export
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
            run = run_export(row, warm=False)  # a warm driver would die with the command
        except ExportBusy as exc:
            raise CommandError(f"{exc}; nothing was started") from exc
        if run.outcome != "ok":
            raise CommandError(f"export of {row.name!r} failed: {run.error}")
        self.stdout.write(f"exported {run.rows:,} events ({run.bytes:,} bytes) of "
                          f"{row.name!r} to {run.output}")
        self.stdout.write(json.dumps({"run_id": run.run_id, "partitions": run.partitions}))

"""manage.py create_channel NAME [--partitions N] [--set key=value]... — create a channel
record and its files. Directories default to WEIR_DATA_ROOT/<name>. The same settings and
rules as the API's create (appliance.channels.SETTABLE, api/channel_settings.py's type
check, appliance.manage_channels): the export's, the Kafka sink's and the schedules' too;
directories apart from every other channel's, new or empty, and recorded as the
channel's own."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance import channels
from appliance.api.channel_settings import SETTING_SCHEMAS, check_settings
from appliance.manage_channels import Refused, create_channel
from appliance.models import Channel

SETTABLE = sorted(channels.SETTABLE - {"name"})  # the API's, every one


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--partitions", type=int, default=1)
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help=f"any setting ({', '.join(SETTABLE)}); VALUE is JSON "
                                 "or a plain string")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if Channel.objects.filter(name=name).exists():
            raise CommandError(f"channel {name!r} exists already")
        root = Path(settings.WEIR_DATA_ROOTS[0]) / name
        values: dict[str, Any] = {"data_dirs": [str(root / "data")],
                                  "checkpoint_dir": str(root / "checkpoint"),
                                  "partitions": options["partitions"]}
        for item in options["set"]:
            key, sep, raw = item.partition("=")
            if not sep or key not in SETTABLE:
                raise CommandError(f"--set {item!r}: expected KEY=VALUE with KEY one of "
                                   f"{', '.join(SETTABLE)}")
            if SETTING_SCHEMAS[key].get("type") == "string":
                values[key] = raw  # as typed: --set kafka_topic=2024 is the text "2024"
                continue
            try:
                values[key] = json.loads(raw)
            except ValueError:
                values[key] = raw
        try:
            row = create_channel(check_settings({"name": name, **values}))
        except Refused as refused:
            raise CommandError("; ".join(f"{field}: {' '.join(msgs)}"
                                         for field, msgs in refused.errors.items())) from refused
        finally:
            channels.close_all()
        self.stdout.write(f"created channel {name!r} with {row.partitions} partition(s) in "
                          f"{root}")

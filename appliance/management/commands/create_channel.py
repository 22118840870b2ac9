"""manage.py create_channel NAME [--partitions N] [--set key=value]... — create a channel
record and its files. Directories default to WEIR_DATA_ROOT/<name>."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from appliance import channels
from appliance.models import Channel

SETTABLE = sorted(set(channels.SETTINGS) - {"name"})


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
            try:
                values[key] = json.loads(raw)
            except ValueError:
                values[key] = raw
        row = Channel(name=name, **values)
        try:
            with transaction.atomic():
                channels.to_config(row)
                row.save()
                channels.open_channel(row)  # creates the files, or fails before the commit
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(msgs)}"
                                         for field, msgs in exc.message_dict.items())) from exc
        finally:
            channels.close_all()
        self.stdout.write(f"created channel {name!r} with {row.partitions} partition(s) in "
                          f"{root}")

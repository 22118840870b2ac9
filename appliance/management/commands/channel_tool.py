"""manage.py channel_tool {dump,verify,stat,recover} NAME [--json] — the engine's
operator tools (python -m channel_engine) on a channel named by its record.

verify and recover get the channel's settings from its record (as the engine's
--config FILE gives them), so they work when channel.json is damaged or missing:
verify reports it, recover keeps it aside as channel.json.damaged and writes it
again from the record."""
from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance import channels
from appliance.models import Channel
from channel_engine.tools import cli

TOOLS = ("dump", "verify", "stat", "recover")


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tool", choices=TOOLS)
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        row = Channel.objects.filter(name=options["name"]).first()
        if row is None:
            raise CommandError(f"no channel named {options['name']!r}")
        try:
            config = channels.to_config(row)
        except ValidationError as exc:
            raise CommandError(f"channel {row.name!r} has invalid settings: {exc}") from exc
        argv = [options["tool"], str(config.home)] + (["--json"] if options["json"] else [])
        supplied = config if options["tool"] in ("verify", "recover") else None
        status = cli.main(argv, out=self.stdout, config=supplied)
        if status:
            raise CommandError(f"{options['tool']} found problems (exit status {status})")

"""manage.py channel_tool {dump,verify,stat,recover} NAME [--json] — the engine's
operator tools (python -m channel_engine) on a channel named by its record."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance import channels
from appliance.models import Channel
from channel_engine import cli

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
        home = str(channels.to_config(row).home)
        argv = [options["tool"], home] + (["--json"] if options["json"] else [])
        status = cli.main(argv, out=self.stdout)
        if status:
            raise CommandError(f"{options['tool']} found problems (exit status {status})")

"""manage.py create_token NAME --role produce [--role consume] [--channel NAME]... — issue
an API token; the key is printed once and never stored."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance.models import ROLES, ApiToken, Channel


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--role", action="append", required=True, choices=ROLES)
        parser.add_argument("--channel", action="append", default=[],
                            help="limit the token to these channels (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = []
        for name in options["channel"]:
            row = Channel.objects.filter(name=name).first()
            if row is None:
                raise CommandError(f"no channel named {name!r}")
            rows.append(row)
        token, key = ApiToken.issue(options["name"], options["role"], rows or None)
        scope = ", ".join(options["channel"]) or "all channels"
        self.stdout.write(f"token {token.name!r} ({', '.join(token.roles)} on {scope}):")
        self.stdout.write(key)

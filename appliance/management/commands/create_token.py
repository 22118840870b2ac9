"""manage.py create_token NAME --role produce [--role consume] [--channel NAME]...
[--subscription NAME]... — issue an API token; the key is printed once and never stored."""
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
        parser.add_argument("--subscription", action="append", default=[],
                            help="limit its takes to these subscriptions (default: any)")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = []
        for name in options["channel"]:
            row = Channel.objects.filter(name=name).first()
            if row is None:
                raise CommandError(f"no channel named {name!r}")
            rows.append(row)
        try:
            token, key = ApiToken.issue(options["name"], options["role"], rows or None,
                                        options["subscription"])
        except ValueError as exc:
            raise CommandError(f"--subscription: {exc}") from exc
        scope = ", ".join(options["channel"]) or "all channels"
        if token.subscriptions:
            scope += f", subscriptions {', '.join(token.subscriptions)}"
        self.stdout.write(f"token {token.name!r} ({', '.join(token.roles)} on {scope}):")
        self.stdout.write(key)

"""manage.py revoke_token PREFIX — revoke an API token (the 8 hex digits after `weir_` in
its key, as listings show); every web worker refuses it from its next request on."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance.models import ApiToken


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        token = ApiToken.objects.filter(prefix=options["prefix"]).first()
        if token is None:
            raise CommandError(f"no token with prefix {options['prefix']!r}")
        if token.revoked_at is not None:
            raise CommandError(f"token {token} was revoked already, at {token.revoked_at}")
        token.revoke()
        self.stdout.write(f"revoked token {token}")

"""manage.py ensure_admin — make sure the appliance has an admin user to sign in with.

Creates a superuser named WEIR_ADMIN_USER (default "admin") when no user of that name
exists. Its password is WEIR_ADMIN_PASSWORD when set (and not empty), else a random one,
printed this once only. An existing user is left as it is (its password is not shown
or changed). scripts/run.sh runs this at every start."""
from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction


class Command(BaseCommand):
    help = __doc__
    requires_system_checks: list[str] = []  # run.sh runs it right after migrate's checks

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        username = os.environ.get("WEIR_ADMIN_USER", "admin").strip()
        if not username:
            raise CommandError("WEIR_ADMIN_USER is empty: set it to a user name, or unset it "
                               "for 'admin'")
        try:
            users._meta.get_field("username").run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"WEIR_ADMIN_USER {username!r}: {' '.join(exc.messages)}") from exc
        if users.objects.filter(username=username).exists():
            self.stdout.write(f"admin user {username!r} exists")
            return
        given = os.environ.get("WEIR_ADMIN_PASSWORD", "")
        password = given or secrets.token_urlsafe(12)
        try:
            validate_password(password, users(username=username))
        except ValidationError as exc:
            raise CommandError(f"WEIR_ADMIN_PASSWORD: {' '.join(exc.messages)}") from exc
        try:
            with transaction.atomic():
                users.objects.create_superuser(username, "", password)
        except IntegrityError:  # created meanwhile by another ensure_admin
            self.stdout.write(f"admin user {username!r} exists")
            return
        if given:
            self.stdout.write(f"created admin user {username!r} with the password in "
                              "WEIR_ADMIN_PASSWORD")
            return
        self.stdout.write(f"created admin user {username!r} with password: {password}")
        self.stdout.write("this password is shown only now: sign in at /admin/ and change it "
                          "there (top right: Change password)")

"""API token authentication: `Authorization: Bearer <key>` (or `Token <key>`, DRF's word).

Keys are random secrets shown once at creation; only their SHA-256 is stored,
so a lookup is one indexed query and a leaked database leaks no usable key. Lookups go
through row_cache: a per-process cache, exact via a generation file in the var dir (no
Redis on this path), so a revoked token is refused from the next request in every
process.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from appliance import row_cache
from appliance.models import ApiToken, hash_key

LAST_USED_RESOLUTION = timedelta(minutes=1)  # no write per request just to say "still used"


class TokenAuthentication(authentication.BaseAuthentication):
    """Authenticate a request by its API token; request.auth is the ApiToken."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        """Return (user, token) for a valid token, None without one; 401 for a bad one."""
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization: expected 'Bearer <token>'")
        key = header[1].decode(errors="replace")
        token = row_cache.token(hash_key(key))
        if token is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        touch(token)
        return TokenUser(token), token

    def authenticate_header(self, request: Request) -> str:
        """Ask for a bearer token in 401 responses."""
        return 'Bearer realm="weir"'


def touch(token: ApiToken) -> None:
    """Record that `token` is in use, at most once per LAST_USED_RESOLUTION."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now  # the cached row too: one write a minute, not a request


class TokenUser:
    """The user a token request runs as: authenticated, named after its token."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False

    def __init__(self, token: ApiToken) -> None:
        self.token = token
        self.username = f"token:{token.name}"
        self.pk = None

    def __str__(self) -> str:
        return self.username


class TokenScheme(OpenApiAuthenticationExtension):  # type: ignore[misc]
    """Describe the bearer token in the OpenAPI schema."""

    target_class = "appliance.auth.TokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        """An HTTP bearer scheme."""
        return {"type": "http", "scheme": "bearer", "bearerFormat": "weir_<prefix>_<secret>"}

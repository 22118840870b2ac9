"""Who may do what: a token's roles and channel scope, or a staff user's session.

Roles: produce (put events), consume (take transactions), admin (everything,
including inspection and channel management). A token scoped to channels acts on
those alone: it never creates a channel (allowed_everywhere: an admin token for
all channels, or a staff user). Anonymous users get nothing but /health.
docs/THREAT_MODEL.md says who may do what.
"""
from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from appliance.models import ApiToken, Channel


def allowed(request: Request, role: str, channel: Channel | None) -> bool:
    """May the request's caller act in `role` on `channel`?"""
    token = request.auth
    if isinstance(token, ApiToken):
        return token.allows(role, channel)
    user = request.user
    return bool(user and user.is_authenticated and user.is_staff)


def allowed_everywhere(request: Request, role: str) -> bool:
    """May the caller act in `role` on every channel, those to come included (a token for
    all channels, or a staff user)?"""
    token = request.auth
    if isinstance(token, ApiToken):
        return token.all_channels and token.allows(role, None)
    return allowed(request, role, None)


class HasRole(BasePermission):
    """The view's role for the request's method on the channel named in the URL (checked
    again per object)."""

    message = "this token may not do that on this channel"

    def has_permission(self, request: Request, view: Any) -> bool:
        return allowed(request, view.role_for(request.method), None)

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return allowed(request, view.role_for(request.method),
                       obj if isinstance(obj, Channel) else None)

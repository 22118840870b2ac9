"""The Django admin (/admin/) over the appliance's records: channels and API tokens to look
up and search, tokens to revoke. Both are read-only here: a channel is created, changed
and deleted through appliance.manage_channels (the channel pages, the API, manage.py),
which checks its directories and applies changes to the running channel; a token's key
is shown once, when it is made (the channel pages, manage.py create_token), and a token
is revoked rather than deleted, so that its use stays on record."""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from appliance.models import ApiToken, Channel


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shown and searched by staff, never added, changed or deleted here (module doc)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Channel)
class ChannelAdmin(ReadOnly):
    """Channels: their settings, to look up (changed on the channel's page)."""

    list_display = ("name", "partitions", "durability", "capacity", "export_interval_ms",
                    "kafka_topic", "puts_paused")
    search_fields = ("name", "kafka_topic")
    list_filter = ("durability", "puts_paused")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnly):
    """API tokens: who may do what, when last used; revoke selected ones."""

    list_display = ("name", "prefix", "roles", "all_channels", "created_at", "last_used_at",
                    "revoked_at")
    search_fields = ("name", "prefix")
    list_filter = ("all_channels", "revoked_at")
    exclude = ("key_hash",)
    actions = ("revoke",)

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        """No filtering by the key's hash (?key_hash__startswith=...: an oracle for it)."""
        if lookup.split("__")[0] == "key_hash":
            return False
        return bool(super().lookup_allowed(lookup, value, request))

    @admin.action(description="Revoke the selected tokens (clients get 401 at once)",
                  permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        """Revoke each selected token (announced to every web worker)."""
        tokens = list(queryset.filter(revoked_at=None))
        for token in tokens:
            token.revoke()
            self.log_change(request, token, "Revoked.")
        messages.success(request, f"{len(tokens)} token(s) revoked.")

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

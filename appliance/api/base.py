"""The base of every API view: who may call it, and the channel it acts on.

ApiView runs, before any handler: authentication (401), the view's `role` anywhere (403),
throttling (429, appliance/throttling.py) — DRF's own order — and then, for a URL that
names a channel (`<name>`), finds the channel (404 channel-not-found, a problem) and
checks the caller's scope on it (403): a token scoped to other channels learns no more
than that it may not. The handler finds the row in `self.row`. Every refusal is raised,
so that appliance/api/handler.py answers it as a problem.

Rows come from row_cache (per process, exact: appliance/row_cache.py) for the hot paths;
a view that changes the row or shows its settings sets `fresh_row` and reads the
database, since a cached row is shared by the process's threads.
"""
from __future__ import annotations

from typing import Any, ClassVar

from rest_framework.request import Request
from rest_framework.views import APIView

from appliance import row_cache
from appliance.api.problems import Problem
from appliance.models import Channel
from appliance.permissions import HasRole


class ApiView(APIView):
    """An API endpoint acting in `role` (permissions.py), on the channel its URL names."""

    permission_classes = [HasRole]
    role: ClassVar[str]
    method_roles: ClassVar[dict[str, str]] = {}  # a method needing another role than `role`
    fresh_row: ClassVar[bool] = False
    row: Channel  # the channel the URL names, once initial() found it

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """DRF's checks, then the channel and the caller's scope on it."""
        super().initial(request, *args, **kwargs)
        name = kwargs.get("name")
        if name is not None:
            self.row = self.find_channel(name)
            self.check_object_permissions(request, self.row)

    def role_for(self, method: str) -> str:
        """The role a request of this HTTP method needs (HEAD: GET's, as Django answers a
        HEAD by running get() and its Content-Length tells what GET would)."""
        return self.method_roles.get("GET" if method == "HEAD" else method, self.role)

    def find_channel(self, name: str) -> Channel:
        """The channel row called `name`; a 404 problem when there is none."""
        row = (Channel.objects.filter(name=name).first() if self.fresh_row
               else row_cache.channel(name))
        if row is None:
            raise Problem(404, "channel-not-found", f"no channel {name!r}")
        return row

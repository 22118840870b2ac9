"""DRF's exception handler for the API: engine errors a view leaves uncaught that have a
documented answer get it instead of a 500.

    ChannelGoneError,    404 {"detail": ...}                the channel was deleted (or
    any engine error                                        recreated) under the request,
    once the channel is gone                                as any channel there is not
    ChannelLockedError   503 {"error": ...}, Retry-After    no process could become the
                                                            channel's owner nor reach it in
                                                            time (an owner changing hands
                                                            while a channel of that name is
                                                            deleted and created again)
    ChannelClosedError,  503 likewise                       the handle was closed under the
    OwnerLostError                                          request (its channel changed)

The views that open a channel document both (their 503 is in the OpenAPI schema).
Everything else goes to DRF's handler, and what that leaves (any other exception) to
Django's handler500 (appliance/request_id.py: logged with its traceback, 500).
"""
from __future__ import annotations

import logging
from typing import Any

from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from appliance.models import Channel
from channel_engine import (
    ChannelClosedError,
    ChannelEngineError,
    ChannelGoneError,
    ChannelLockedError,
    OwnerLostError,
)

RETRY_AFTER_S = 1
log = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The API's answer to an exception a view raised (None: Django's 500)."""
    name = context["view"].kwargs.get("name") if context.get("view") else None
    gone = isinstance(exc, ChannelGoneError) or (
        isinstance(exc, ChannelEngineError) and isinstance(name, str)
        and not Channel.objects.filter(name=name).exists())
    if gone:
        return drf_exception_handler(NotFound(f"no such channel (deleted): {exc}"), context)
    if isinstance(exc, (ChannelLockedError, ChannelClosedError, OwnerLostError)):
        log.warning("channel owner unreachable: %s", exc)
        response = Response({"error": f"the channel is changing owner, try again: {exc}"},
                            status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return drf_exception_handler(exc, context)

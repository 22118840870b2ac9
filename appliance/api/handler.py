"""The API's exception handler (REST_FRAMEWORK["EXCEPTION_HANDLER"]): every exception a
view raises becomes a problem (appliance/api/problems.py), or reaches Django's handler500.

    exception                                     status  type slug            notes
    --------------------------------------------  ------  -------------------  ----------------
    Problem (a view's own refusal)                its own its own
    ValidationError (DRF)                         400     validation-error     field, errors
    ParseError                                    400     parse-error
    NotAuthenticated / AuthenticationFailed       401     not-authenticated /  WWW-Authenticate
                                                          authentication-failed
    PermissionDenied (DRF, Django)                403     permission-denied
    NotFound, Http404                             404     not-found
    MethodNotAllowed                              405     method-not-allowed   Allow
    NotAcceptable                                 406     not-acceptable
    UnsupportedMediaType                          415     unsupported-media-type
    Throttled                                     429     throttled            retry_after
    any engine error, the view's channel's row    404     channel-not-found    deleted or
      gone (deleted or recreated under the request)                            recreated
    InvalidEventError                             400     invalid-event        index, field
    BatchTooLargeError                            413     batch-too-large      field (setting)
    TransactionCapacityError                      413     too-many-events
    OffsetOutOfRangeError                         416     offset-out-of-range  the log's range
    TakeExpiredError                              409     take-expired
    TakeCommittedError                            409     take-committed
    UnknownSubscriptionError                      404     subscription-not-    field
                                                          found
    SubscriptionExistsError                       409     subscription-exists  field
    SubscriptionBusyError                         409     subscription-busy    takes open, or
                                                                               being changed
    ChannelFullError                              503     channel-full         retry_after
    DiskSpaceError                                503     disk-space-low       retry_after
    DiskFullError                                 507     disk-full            retry_after
    StorageError, LogOfflineError                 503     channel-write-failed retry_after
    StorageMissing (appliance.channels), and     503     channel-storage-     paths
      ChannelGoneError, LogDirectoryError of a            missing
      channel whose row is there and files not
    ChannelLockedError, ChannelClosedError,       503     channel-owner-       retry_after
      OwnerLostError, and ChannelGoneError of a           changing
      channel whose row and files are there (made
      again meanwhile by another process)
    CorruptRecordError, CorruptIndexError,        500     channel-damaged      logged with
      CorruptStateError                                                        its traceback
    ChannelExistsError                            409     channel-exists       path
    Refused (appliance.manage_channels)           400     invalid-setting      field
                                                  409     channel-conflict     field, if one
                                                  409     channel-exists       field, path
                                                  503     channel-cannot-open
    EventError (appliance.event_parsing)          400     invalid-event        index, field
    BrokerUnavailable (appliance.exports)         503     broker-unavailable   retry_after

A handle whose channel went or was made again under it (ChannelGoneError, or a
LogDirectoryError with files missing now) is let go of here, before the answer
(channels.let_go_if_gone): the next request opens the channel afresh. One whose directory
is all there (read-only, permissions) is kept: reopening cannot help it.

Anything else (a bug, or an engine error with no documented answer) returns None: Django's
handler500 logs it with its traceback and answers a 500 problem naming the request id
(appliance/request_id.py). A 5xx problem gets its `request_id` from the middleware too.

Why not drf-standardized-errors: its answer is {"type": "validation_error" |
"client_error" | "server_error", "errors": [{"code", "detail", "attr"}]} as application/json
— not RFC 9457 (no URI type, no title or status, a list where RFC 9457 has one problem).
Bending it to RFC 9457 means replacing its formatter and its OpenAPI schema hooks, which
are most of it; the engine's and the appliance's errors need this table anyway.
"""
from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpResponse
from rest_framework import exceptions
from rest_framework.views import set_rollback

from appliance import channels
from appliance.api.problems import Problem, retry_later
from appliance.event_parsing import EventError
from appliance.exports import BrokerUnavailable
from appliance.manage_channels import Refused
from appliance.models import Channel
from channel_engine import (
    BatchTooLargeError,
    ChannelClosedError,
    ChannelEngineError,
    ChannelExistsError,
    ChannelFullError,
    ChannelGoneError,
    ChannelLockedError,
    CorruptIndexError,
    CorruptRecordError,
    CorruptStateError,
    DiskFullError,
    DiskSpaceError,
    InvalidEventError,
    LogDirectoryError,
    LogOfflineError,
    OffsetOutOfRangeError,
    OwnerLostError,
    StorageError,
    SubscriptionBusyError,
    SubscriptionExistsError,
    TakeCommittedError,
    TakeExpiredError,
    TransactionCapacityError,
    UnknownSubscriptionError,
)

log = logging.getLogger(__name__)
NON_FIELD = "non_field_errors"  # DRF's key for errors of no one field
REFUSED = {400: "invalid-setting", 409: "channel-conflict", 503: "channel-cannot-open"}


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """The API's answer to an exception a view raised (None: Django's handler500)."""
    headers: dict[str, str] = {}
    auth_header = getattr(exc, "auth_header", None)  # DRF's, on a 401
    if auth_header:
        headers["WWW-Authenticate"] = str(auth_header)
    view = context.get("view")
    row = getattr(view, "row", None)
    if isinstance(row, Channel):  # a stale handle goes before the answer (to_problem)
        channels.let_go_if_gone(row, exc)
    problem = to_problem(exc, view)
    if problem is None:
        return None
    set_rollback()  # as DRF's own handler: an atomic request is rolled back
    return problem.response(headers)


def to_problem(exc: Exception, view: Any = None) -> Problem | None:
    """The problem an exception is (None: no documented answer)."""
    if isinstance(exc, Problem):
        return exc
    # an engine error, or the OSError of a file path a delete just renamed away
    if isinstance(exc, (ChannelEngineError, OSError)) and _channel_gone(exc, view):
        return Problem(404, "channel-not-found", f"no such channel (deleted): {exc}")
    row = getattr(view, "row", None)
    if isinstance(exc, (ChannelGoneError, LogDirectoryError)) and isinstance(row, Channel):
        missing = channels.missing_now(row)  # its row is there: did its files go under
        if missing:  # an open handle?
            return _storage_missing(channels.StorageMissing(row.name, missing))
        if isinstance(exc, ChannelGoneError):  # all there: made again by another process
            return _OWNER_CHANGING(exc)
    for kind, convert in _CONVERTERS:
        if isinstance(exc, kind):
            return convert(exc)
    return None


def _channel_gone(exc: Exception, view: Any) -> bool:
    """Was the channel of the request deleted (or recreated) under it? Then any engine
    error is answered as for a channel there is not."""
    row = getattr(view, "row", None)
    if isinstance(row, Channel):
        return channels.deleted(row)
    name = getattr(view, "kwargs", {}).get("name")
    if isinstance(name, str):
        return not Channel.objects.filter(name=name).exists()
    return isinstance(exc, ChannelGoneError)


def _storage_missing(exc: channels.StorageMissing) -> Problem:
    log.warning("%s", exc)
    return Problem(503, "channel-storage-missing", str(exc), paths=exc.paths)


def _validation(exc: exceptions.ValidationError) -> Problem:
    errors = _flatten(exc.detail)
    fields = [name for name in errors if name != NON_FIELD]
    detail = "; ".join(f"{name}: {' '.join(errors[name])}" if name != NON_FIELD
                       else " ".join(errors[name]) for name in errors) or "invalid request"
    return Problem(400, "validation-error", detail, field=fields[0] if fields else None,
                   errors=errors)


def _flatten(detail: Any) -> dict[str, list[str]]:
    """DRF's error detail (a string, a list, or fields -> messages) as fields -> messages."""
    if isinstance(detail, dict):
        return {str(name): [str(m) for m in (value if isinstance(value, list) else [value])]
                for name, value in detail.items()}
    return {NON_FIELD: [str(m) for m in (detail if isinstance(detail, list) else [detail])]}


def _api_exception(exc: exceptions.APIException) -> Problem:
    slug = str(exc.default_code).replace("_", "-")
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed) and \
            exc.status_code == 403:  # no authenticate header to send: DRF makes it 403
        slug = "permission-denied"
    wait = getattr(exc, "wait", None)
    retry = max(1, math.ceil(wait)) if isinstance(exc, exceptions.Throttled) and wait else None
    return Problem(exc.status_code, slug, str(exc.detail), retry_after=retry)


def _engine_busy(status: int, slug: str, what: str, loud: bool = False) -> Any:
    """A converter to a retryable problem; `loud`: logged (not routine backpressure)."""
    def convert(exc: Exception) -> Problem:
        if loud:
            log.warning("%s: %s", slug, exc)
        return retry_later(status, slug, f"{what}{exc}")
    return convert


_OWNER_CHANGING = _engine_busy(503, "channel-owner-changing",
                               "the channel is changing owner, try again: ", loud=True)


def _damaged(exc: Exception) -> Problem:
    log.error("channel damaged: %s", exc, exc_info=exc)
    return Problem(500, "channel-damaged", f"the channel's files fail a check: {exc}")


def _refused(exc: Refused) -> Problem:
    """A create, change or delete refused: "error" (or Django's "__all__") is what concerns
    no one field."""
    fields = {k: v for k, v in exc.errors.items() if k not in ("error", "__all__")}
    detail = "; ".join(f"{name}: {' '.join(messages)}" if name in fields
                       else " ".join(messages) for name, messages in exc.errors.items())
    return Problem(exc.status, exc.slug or REFUSED.get(exc.status, "channel-conflict"),
                   detail, field=next(iter(fields), None), errors=fields or None, **exc.extra)


_CONVERTERS: list[tuple[type[Exception] | tuple[type[Exception], ...], Any]] = [
    (exceptions.ValidationError, _validation),
    (Http404, lambda exc: Problem(404, "not-found", str(exc) or "not found")),
    (DjangoPermissionDenied, lambda exc: Problem(403, "permission-denied",
                                                 str(exc) or "permission denied")),
    (exceptions.APIException, _api_exception),
    (InvalidEventError, lambda exc: Problem(400, "invalid-event", str(exc), index=exc.index,
                                            field=exc.field)),
    (BatchTooLargeError, lambda exc: Problem(
        413, "batch-too-large", f"the events of one partition encode to {exc.size} bytes, "
        f"over this channel's {exc.setting}={exc.limit}: send fewer", field=exc.setting)),
    (TransactionCapacityError, lambda exc: Problem(413, "too-many-events", str(exc))),
    (OffsetOutOfRangeError, lambda exc: Problem(
        416, "offset-out-of-range", str(exc), field="offset",
        log_start_offset=exc.log_start_offset, log_end_offset=exc.log_end_offset)),
    (TakeExpiredError, lambda exc: Problem(409, "take-expired", str(exc))),
    (TakeCommittedError, lambda exc: Problem(409, "take-committed", str(exc))),
    (UnknownSubscriptionError, lambda exc: Problem(404, "subscription-not-found", str(exc),
                                                   field="subscription")),
    (SubscriptionExistsError, lambda exc: Problem(409, "subscription-exists", str(exc),
                                                  field="name")),
    (SubscriptionBusyError, lambda exc: Problem(409, "subscription-busy", str(exc))),
    (ChannelExistsError, lambda exc: Problem(409, "channel-exists", str(exc), path=exc.path)),
    (ChannelFullError, _engine_busy(503, "channel-full", "")),
    (DiskSpaceError, _engine_busy(503, "disk-space-low", "")),
    (DiskFullError, _engine_busy(507, "disk-full", "the disk is full, nothing was written: ")),
    ((StorageError, LogOfflineError), _engine_busy(
        503, "channel-write-failed", "the channel could not write, nothing was "
                                     "acknowledged: ", loud=True)),
    ((ChannelLockedError, ChannelClosedError, OwnerLostError), _OWNER_CHANGING),
    ((CorruptRecordError, CorruptIndexError, CorruptStateError), _damaged),
    (Refused, _refused),
    (channels.StorageMissing, _storage_missing),
    (EventError, lambda exc: Problem(400, "invalid-event", str(exc), index=exc.index,
                                     field=exc.field)),
    (BrokerUnavailable, lambda exc: retry_later(
        503, "broker-unavailable", f"{exc.what} not queued: the broker is unreachable ({exc})")),
]

"""Per-process cache of the rows every produce and consume request reads: its API token
(with the channels it may use) and its channel.

Read from the database they cost three ORM queries, about 1.5 ms of a 1000-event
request's CPU. A cached row is used only while the shared generation is the one it
was read under: a random value in Redis that every save or delete of a token, a
channel or a token's channel list replaces (Django signals, once at once and once
when the transaction commits). So a revoked token, a paused channel or a changed
setting takes effect in every worker at its next request, as without the cache. A
random value, not a counter: a Redis restart or flush that loses the key cannot bring
an old generation back. The generation costs one Redis GET per request
(request_started clears the thread's copy; outside requests it is read at every
lookup). Without Redis nothing is cached; if a change cannot reach Redis, rows are
read again after MAX_AGE_S anyway (as they are after changes made behind Django's
back: QuerySet.update sends no signals). Only rows that exist are cached, and a new
generation empties the cache, so unknown keys cannot grow it.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from django.core import signals
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from redis.exceptions import RedisError

from appliance.models import ApiToken, Channel
from appliance.shared_redis import shared_redis

MAX_AGE_S = 10.0
GENERATION_KEY = "row-generation"
log = logging.getLogger(__name__)
_rows: dict[tuple[str, str], tuple[float, Any]] = {}  # (kind, key) -> (read at, row)
_rows_generation: list[str | None] = [None]  # the generation _rows were read under
_lock = threading.Lock()
_request = threading.local()  # the generation this thread's request runs under


def _generation() -> str | None:
    """The shared generation, read once per request (the request sees one state of the
    tables) and at every call outside requests; None when Redis cannot say, and then
    nothing is cached."""
    known = getattr(_request, "generation", None)
    if known is not None:
        return known  # type: ignore[no-any-return]
    try:
        client, key = shared_redis(), cache.make_key(GENERATION_KEY)
        value = client.get(key)
        if value is None:  # first use, or Redis lost it: a new one (whoever sets it first)
            client.set(key, secrets.token_hex(8), nx=True)
            value = client.get(key)
    except RedisError as exc:
        log.warning("row cache off: the cache at REDIS_URL is unreachable (%s)", exc)
        return None
    generation = value.decode() if isinstance(value, bytes) else str(value)
    if getattr(_request, "active", False):
        _request.generation = generation
    return generation


def current_generation() -> str | None:
    """The shared generation as Redis has it now (not the request's copy); None when Redis
    cannot say."""
    try:
        value = shared_redis().get(cache.make_key(GENERATION_KEY))
    except RedisError:
        return None
    return None if value is None else value.decode()


def request_started(**_: Any) -> None:
    """A new request reads the generation afresh, once."""
    _request.generation = None
    _request.active = True


def request_finished(**_: Any) -> None:
    """Between requests nothing is remembered."""
    _request.generation = None
    _request.active = False


def _bump() -> None:
    _request.generation = None
    with _lock:
        _rows.clear()
    try:
        shared_redis().set(cache.make_key(GENERATION_KEY), secrets.token_hex(8))
    except RedisError as exc:  # nothing is cached while Redis is away; MAX_AGE_S bounds it
        log.warning("row cache: could not announce a change (%s)", exc)


def changed(**_: Any) -> None:
    """A token or channel row changed: every process must read rows again."""
    _bump()
    transaction.on_commit(_bump)  # readers in between may have cached the old row


def _cached(kind: str, ident: str, load: Any) -> Any:
    generation = _generation()
    if generation is None:
        return load()
    now = time.monotonic()
    with _lock:
        if _rows_generation[0] != generation:
            _rows.clear()
            _rows_generation[0] = generation
        hit = _rows.get((kind, ident))
    if hit is not None and now - hit[0] < MAX_AGE_S:
        return hit[1]
    row = load()
    if row is not None:
        with _lock:
            if _rows_generation[0] == generation:
                _rows[(kind, ident)] = (now, row)
    return row


def token(key_hash: str) -> ApiToken | None:
    """The live (not revoked) token with this key hash, with its channel ids loaded."""
    def load() -> ApiToken | None:
        row = ApiToken.objects.filter(key_hash=key_hash, revoked_at=None).first()
        if row is not None and not row.all_channels:
            row.channel_ids = frozenset(row.channels.values_list("pk", flat=True))
        return row
    return _cached("token", key_hash, load)  # type: ignore[no-any-return]


def channel(name: str) -> Channel | None:
    """The channel row of this name."""
    return _cached("channel", name,  # type: ignore[no-any-return]
                   lambda: Channel.objects.filter(name=name).first())


for model in (ApiToken, Channel):
    post_save.connect(changed, sender=model, dispatch_uid=f"row_cache_save_{model.__name__}")
    post_delete.connect(changed, sender=model,
                        dispatch_uid=f"row_cache_delete_{model.__name__}")
m2m_changed.connect(changed, sender=ApiToken.channels.through, dispatch_uid="row_cache_m2m")
signals.request_started.connect(request_started, dispatch_uid="row_cache_started")
signals.request_finished.connect(request_finished, dispatch_uid="row_cache_finished")

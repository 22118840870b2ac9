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
lookup). Only rows that exist are cached, and a new generation empties the cache, so
unknown keys cannot grow it.

Redis away (stopped, or hung): the generation is read through shared_redis.fast() (a
50 ms timeout, then not tried for a second), and when it cannot be read nothing is
cached: every row comes from the database, so a token revoked meanwhile is refused
from the next request, in every worker. The cache is emptied too, so that after Redis
comes back no row read before a change made during the outage is used. A change this
process could not announce is announced at its next read of the generation (the next
request, or the generation watch's next tick). A change that is never announced (made
by a process that exits, like manage.py revoke_token, while Redis was away) still
reaches every process: each process that holds cached rows or open channels runs the
generation watch, so an idle worker notices the outage too and empties its cache
before Redis is back. Rows are also read again after MAX_AGE_S, as after changes made
behind Django's back (QuerySet.update sends no signals).

The generation watch is one thread per process (started by watch(): by the first cached
row, and by appliance/channels.py at its first open; a forked child starts its own)
that reads the generation every WEIR_CHANNEL_WATCH_S (0 turns it off) and hands each
reading, None while Redis cannot say, to every subscribe()d callback, in that thread
(the channel watcher of appliance/channels.py): one Redis read a tick per process,
however many consumers it has. A callback that raises is logged; the others are still
called.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from redis.exceptions import RedisError

from appliance.models import ApiToken, Channel
from appliance.shared_redis import RedisSkipped, fast

MAX_AGE_S = 10.0
GENERATION_KEY = "row-generation"
log = logging.getLogger(__name__)
_rows: dict[tuple[str, str], tuple[float, Any]] = {}  # (kind, key) -> (read at, row)
_rows_generation: list[str | None] = [None]  # the generation _rows were read under
_lock = threading.Lock()
_request = threading.local()  # the generation this thread's request runs under
_bump_pending = [False]  # a change this process could not announce yet
_watching = [0]  # the pid whose generation watch runs
_subscribers: list[Callable[[str | None], None]] = []  # told every tick's generation


def _generation() -> str | None:
    """The shared generation, read once per request (the request sees one state of the
    tables) and at every call outside requests; None when Redis cannot say, and then
    nothing is cached."""
    known = getattr(_request, "generation", None)
    if known is not None:
        return known  # type: ignore[no-any-return]
    try:
        value = fast(_read_generation)
    except RedisError as exc:
        _forget()
        if not isinstance(exc, RedisSkipped):
            log.warning("row cache off: the cache at REDIS_URL is unreachable (%s)", exc)
        return None
    if getattr(_request, "active", False):
        _request.generation = value
    return value


def _read_generation(client: Any) -> str:
    key = cache.make_key(GENERATION_KEY)
    if _bump_pending[0]:  # a change made here while Redis was away: announce it first
        client.set(key, secrets.token_hex(8))
        _bump_pending[0] = False
    value = client.get(key)
    if value is None:  # first use, or Redis lost it: a new one (whoever sets it first)
        client.set(key, secrets.token_hex(8), nx=True)
        value = client.get(key)
    return value.decode() if isinstance(value, bytes) else str(value)


def _forget() -> None:
    """Redis cannot say: drop every cached row, so that none read before a change made
    meanwhile (whose announcement may never reach Redis) is used once Redis is back."""
    with _lock:
        _rows.clear()
        _rows_generation[0] = None


def current_generation() -> str | None:
    """The shared generation as Redis has it now (not the request's copy), announcing this
    process's pending change first; None when Redis cannot say (and the cache is emptied:
    the generation watch asks every tick, so an idle process notices an outage too)."""
    try:
        return fast(_read_generation)
    except RedisError:
        _forget()
        return None


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
        fast(lambda client: client.set(cache.make_key(GENERATION_KEY), secrets.token_hex(8)))
    except RedisError as exc:  # announced at this process's next read of the generation
        _bump_pending[0] = True
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
        watch()
    return row


def subscribe(callback: Callable[[str | None], None]) -> None:
    """Have the generation watch hand every tick's generation (None while Redis cannot
    say) to `callback`, in its thread; once, however often subscribed."""
    with _lock:
        if callback not in _subscribers:
            _subscribers.append(callback)


def watch() -> None:
    """Start this process's generation watch (module doc), once per process: a thread
    does not survive fork."""
    with _lock:
        if _watching[0] == os.getpid() or not settings.WEIR_CHANNEL_WATCH_S:
            return
        _watching[0] = os.getpid()
    threading.Thread(target=_watch, name="weir-generation-watch", daemon=True).start()


def _watch() -> None:
    while settings.WEIR_CHANNEL_WATCH_S:
        time.sleep(settings.WEIR_CHANNEL_WATCH_S)
        generation = current_generation()  # empties the cache when Redis cannot say
        for callback in tuple(_subscribers):
            try:
                callback(generation)
            except Exception:  # one consumer's failure must not stop the others' ticks
                log.warning("generation watch: %r failed", callback, exc_info=True)
    _watching[0] = 0  # turned off (tests): the next cached row or open starts it again


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

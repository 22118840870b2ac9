"""Per-process cache of the rows every produce and consume request reads: its API token
(with the channels it may use) and its channel.

Read from the database they cost three ORM queries, about 1.5 ms of a 1000-event
request's CPU. A cached row is used only while the shared generation is the one it
was read under: a random value in the var dir's generation file
(appliance/generation_file.py) that every save or delete of a token, a channel or a
token's channel list replaces (Django signals, once before the write and once when the
transaction commits). So a revoked token, a paused channel or a changed setting takes
effect in every process of the appliance at its next request, as without the cache. Reading the
generation is a pread from the page cache (about a microsecond), once per request
(request_started clears the thread's copy; outside requests it is read at every lookup):
no network round trip, and Redis being away changes nothing here. Only rows that exist
are cached, and a new generation empties the cache, so unknown keys cannot grow it.

When the generation file cannot be read (a var dir gone read-only, say) nothing is
cached: every row comes from the database, and the cache is emptied so that no row read
before is used once the file is back. A change whose new generation cannot be written
fails: the first announcement is made before the write (pre_save, pre_delete), which
ChangeNotAnnounced stops, as unannounced other processes would go on using the old row;
the second, at commit, raises it from the commit (the change is made; other processes read
the row again within MAX_AGE_S). A file removed or replaced under a running
process (a restored var dir) is opened again at the generation watch's next tick. Rows
are also read again after MAX_AGE_S, as after changes made behind Django's back
(QuerySet.update sends no signals).

The generation watch is one thread per process (started by watch(): by the first cached
row, and by appliance/channels.py at its first open; a forked child starts its own)
that reads the generation every WEIR_CHANNEL_WATCH_S (0 turns it off) and hands each
reading, None while the file cannot be read, to every subscribe()d callback, in that
thread (the channel watcher of appliance/channels.py). A callback that raises is logged;
the others are still called.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signals
from django.db import transaction
from django.db.models.signals import (
    m2m_changed,
    post_delete,
    post_save,
    pre_delete,
    pre_save,
)

from appliance.generation_file import GenerationFile
from appliance.models import ApiToken, Channel

MAX_AGE_S = 10.0
GENERATION_FILE = "row-generation"  # in settings.VAR_DIR
log = logging.getLogger(__name__)
_rows: dict[tuple[str, str], tuple[float, Any]] = {}  # (kind, key) -> (read at, row)
_rows_generation: list[bytes | None] = [None]  # the generation _rows were read under
_lock = threading.Lock()
_request = threading.local()  # the generation this thread's request runs under
_files: dict[Path, GenerationFile] = {}  # by path: tests change the var dir
_last_file: list[Any] = []  # [settings.VAR_DIR, its GenerationFile] of the last lookup
_watching = [0]  # the pid whose generation watch runs
_subscribers: list[Callable[[bytes | None], None]] = []  # told every tick's generation


def _file() -> GenerationFile:
    var_dir = settings.VAR_DIR
    last = _last_file
    if last and last[0] is var_dir:  # the common case, without building a path per request
        return last[1]
    path = Path(var_dir) / GENERATION_FILE
    with _lock:
        found = _files.setdefault(path, GenerationFile(path))
    _last_file[:] = [var_dir, found]
    return found


def _generation() -> bytes | None:
    """The shared generation, read once per request (the request sees one state of the
    tables) and at every call outside requests; None when it cannot be read, and then
    nothing is cached."""
    known = getattr(_request, "generation", None)
    if known is not None:
        return known  # type: ignore[no-any-return]
    value = current_generation()
    if getattr(_request, "active", False):
        _request.generation = value
    return value


def _forget() -> None:
    """The generation cannot be read: drop every cached row, so that none read before a
    change made meanwhile is used once it can be read again."""
    with _lock:
        _rows.clear()
        _rows_generation[0] = None


def current_generation() -> bytes | None:
    """The shared generation as the file has it now (not the request's copy); None when it
    cannot be read (and the cache is emptied)."""
    value = _file().read()
    if value is None:
        _forget()
    return value


def request_started(**_: Any) -> None:
    """A new request reads the generation afresh, once."""
    _request.generation = None
    _request.active = True


def request_finished(**_: Any) -> None:
    """Between requests nothing is remembered."""
    _request.generation = None
    _request.active = False


class ChangeNotAnnounced(RuntimeError):
    """A token or channel change whose new generation could not be written: raised inside
    the change's transaction, so the change does not happen unannounced."""


def _bump() -> None:
    _request.generation = None
    with _lock:
        _rows.clear()
    if _file().replace() is None:
        raise ChangeNotAnnounced(
            f"the row generation file {_file().path} cannot be written: other processes "
            "would go on using the old token or channel; the change is refused")


def changed(**_: Any) -> None:
    """A token or channel row changed behind the signals' back (QuerySet.update): every
    process must read rows again; announced at once, and again when the transaction
    commits."""
    _bump()
    transaction.on_commit(_bump)


def _before_write(**_: Any) -> None:
    """pre_save, pre_delete, a channel list's pre_*: announced before the write, so that a
    change that cannot be announced (ChangeNotAnnounced) is not made."""
    _bump()


def _after_write(**_: Any) -> None:
    """post_save, post_delete, a channel list's post_*: announced again once the transaction
    commits (at once outside one), as readers in between may have cached the old row under
    the first announcement."""
    transaction.on_commit(_bump)


def _channel_list_changed(action: str, **_: Any) -> None:
    (_before_write if action.startswith("pre_") else _after_write)()


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


def subscribe(callback: Callable[[bytes | None], None]) -> None:
    """Have the generation watch hand every tick's generation (None while it cannot be
    read) to `callback`, in its thread; once, however often subscribed."""
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
        _file().reopen_if_replaced()
        generation = current_generation()  # empties the cache when it cannot be read
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
    for kind, signal, when in (("pre_save", pre_save, _before_write),
                               ("save", post_save, _after_write),
                               ("pre_delete", pre_delete, _before_write),
                               ("delete", post_delete, _after_write)):
        signal.connect(when, sender=model, dispatch_uid=f"row_cache_{kind}_{model.__name__}")
m2m_changed.connect(_channel_list_changed, sender=ApiToken.channels.through,
                    dispatch_uid="row_cache_m2m")
signals.request_started.connect(request_started, dispatch_uid="row_cache_started")
signals.request_finished.connect(request_finished, dispatch_uid="row_cache_finished")

"""The row cache (appliance/row_cache.py) and its generation file: a cached row costs no
query and no Redis round trip, and a change is seen at the next lookup (across processes:
tests/appliance/test_gunicorn.py revokes with manage.py under a real gunicorn); a
generation file that cannot be read turns the cache off rather than serve rows it cannot
vouch for. And the generation watch is the process's one background reader, for the row
cache and the channel watcher (appliance/channels.py) alike."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row
from django.db import connection
from django.test.utils import CaptureQueriesContext
from polling import wait_for

from appliance import channels, generation_file, row_cache, shared_redis
from appliance.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cached_token_costs_no_query_and_no_redis_and_a_change_is_seen_at_once(
        settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path  # a generation file no other test process replaces
    row, _ = ApiToken.issue("hot", ["produce"], None)
    key_hash = ApiToken.objects.get(pk=row.pk).key_hash
    assert row_cache.token(key_hash) is not None

    def no_redis(*_: Any, **__: Any) -> Any:
        raise AssertionError("Redis must not be on the request path")
    monkeypatch.setattr(shared_redis, "_client", no_redis)  # what every Redis use goes through
    with CaptureQueriesContext(connection) as queries:
        assert row_cache.token(key_hash) is not None
    assert not queries.captured_queries, "a cached row is read without a query"
    ApiToken.objects.filter(pk=row.pk).update(name="renamed")  # behind the cache's back
    assert row_cache.token(key_hash).name == "hot"  # type: ignore[union-attr]
    row_cache.changed()  # what any process's save does: a new generation in the file
    assert row_cache.token(key_hash).name == "renamed"  # type: ignore[union-attr]


def test_an_unreadable_generation_file_turns_the_cache_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    row, _ = ApiToken.issue("t", ["produce"], None)
    key_hash = ApiToken.objects.get(pk=row.pk).key_hash
    assert row_cache.token(key_hash) is not None and row_cache._rows
    real_pread = os.pread

    def failing(fd: int, size: int, offset: int) -> bytes:
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(generation_file.os, "pread", failing)
    ApiToken.objects.filter(pk=row.pk).update(revoked_at=row.created_at)  # unannounced
    assert row_cache.token(key_hash) is None, "read from the database"
    assert not row_cache._rows
    monkeypatch.setattr(generation_file.os, "pread", real_pread)


@pytest.mark.parametrize("content", [b"", b"WRG1abc", b"XXXX" + b"0" * 16])
def test_a_missing_short_or_foreign_generation_file_is_a_new_generation(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "row-generation"
    if content:
        path.write_bytes(content)
    file = generation_file.GenerationFile(path)
    first = file.read()
    assert first is not None and first.startswith(b"WRG1") and len(first) == 20
    assert file.read() == first, "stable until replaced"
    assert generation_file.GenerationFile(path).read() == first, "one value for everyone"
    assert file.replace() != first


def test_it_reads_the_generation_in_one_thread_for_the_row_cache_and_the_channels(
        settings: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    readers: list[int] = []  # the thread of every read of the generation but the test's
    checks: list[bytes | None] = []  # the generation each run of close_stale() came after
    real_read, real_close_stale = generation_file.GenerationFile.read, channels.close_stale
    away = [False]

    def counted(self: generation_file.GenerationFile) -> bytes | None:
        if threading.current_thread() is not threading.main_thread():
            readers.append(threading.get_ident())
        return None if away[0] else real_read(self)

    def close_stale() -> list[str]:
        checks.append(real_read(row_cache._file()))
        return real_close_stale()
    monkeypatch.setattr(generation_file.GenerationFile, "read", counted)
    monkeypatch.setattr(channels, "close_stale", close_stale)
    row, _ = ApiToken.issue("idle", ["produce"], None)
    assert row_cache.token(ApiToken.objects.get(pk=row.pk).key_hash) is not None
    channels.open_channel(channel_row(root))  # both consumers: a row cached, a channel open
    wait_for(lambda: len(readers) >= 6 and checks, 5, "the watch's ticks")
    assert len(set(readers)) == 1, "one watch thread per process"
    row_cache.changed()  # a new generation: the channel watcher checks its handles again
    wait_for(lambda: len(set(checks)) >= 2, 5, "a check under the new generation")
    ticks = len(readers)
    row_cache._rows[("token", "x")] = (time.monotonic(), object())
    before = len(checks)
    away[0] = True
    wait_for(lambda: not row_cache._rows and len(checks) >= before + 2, 5,
             "an emptied cache and a check every tick while the generation cannot be read")
    assert len(set(readers)) == 1 and len(readers) > ticks
    settings.WEIR_CHANNEL_WATCH_S = 0
    wait_for(lambda: not row_cache._watching[0], 2, "the watch's end")


def test_a_change_that_cannot_be_announced_does_not_happen(
        settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    row, _ = ApiToken.issue("t", ["produce"], None)
    monkeypatch.setattr(generation_file.GenerationFile, "replace", lambda self: None)
    with pytest.raises(row_cache.ChangeNotAnnounced):
        ApiToken.objects.get(pk=row.pk).revoke()
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None, "rolled back, not half-done"


def test_a_generation_file_replaced_under_a_process_is_opened_again(tmp_path: Path) -> None:
    path = tmp_path / "row-generation"
    mine, theirs = generation_file.GenerationFile(path), generation_file.GenerationFile(path)
    first = mine.read()
    path.unlink()  # a restored var dir, say: another process makes and bumps a new file
    bumped = theirs.replace()
    assert mine.read() == first, "the old file is still held"
    mine.reopen_if_replaced()  # the generation watch's tick
    assert mine.read() == bumped
    mine.reopen_if_replaced()
    assert mine.read() == bumped, "kept when it is the same file"


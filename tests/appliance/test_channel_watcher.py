"""The channel watcher (appliance/channels.py) closes handles whose row is gone, never
one opened inside a transaction that has not committed yet: its thread reads on a
database connection of its own, where such a row does not exist yet."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from polling import wait_for

from appliance import channels, row_cache
from appliance.models import Channel

pytestmark = pytest.mark.django_db(transaction=True)


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    checks: list[list[str]] = []
    real = channels.close_stale

    def close_stale() -> list[str]:
        checks.append(real())
        return checks[-1]
    monkeypatch.setattr(channels, "close_stale", close_stale)
    return checks


def _checked(checks: list[list[str]], count: int) -> bool:
    """Whether the watcher checked `count` times; a new generation makes it check again."""
    row_cache.changed()
    return len(checks) >= count


def test_it_keeps_a_handle_whose_row_is_not_committed_yet(
        settings: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    checks = _count_checks(monkeypatch)
    with transaction.atomic():  # as create_channel: save, open, then commit
        row = channel_row(root)
        opened = channels.open_channel(row, create=True)
        wait_for(lambda: _checked(checks, 3), 10, "the watcher's checks")
        assert channels.open_channel(row) is opened, "closed while its row was uncommitted"
        with opened.put() as tx:
            tx.put(b"kept")
    before = len(checks)
    wait_for(lambda: _checked(checks, before + 2), 10, "checks after the commit")
    assert channels.open_channel(row) is opened and opened.status()["events_untaken"] == 1
    settings.WEIR_CHANNEL_WATCH_S = 0
    channels.close_all()


def test_it_keeps_a_handle_whose_row_is_being_committed(
        settings: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0  # no watch thread: the test runs the watcher's check
    connection = connections[DEFAULT_DB_ALIAS]
    real_commit = connection.commit
    closed: list[list[str]] = []

    def commit() -> None:
        # Django has left the atomic block and not committed yet: the watcher's check now,
        # in a thread of its own (its own connection, where the row is not there yet)
        def check() -> None:
            try:
                closed.append(channels.close_stale())
            finally:
                connections[DEFAULT_DB_ALIAS].close()
        watcher = threading.Thread(target=check)
        watcher.start()
        watcher.join(30)
        real_commit()

    with transaction.atomic():  # as create_channel: save, open, then commit
        row = channel_row(root)
        opened = channels.open_channel(row, create=True)
        monkeypatch.setattr(connection, "commit", commit)
    monkeypatch.undo()
    assert closed == [[]], "closed while its row was being committed"
    assert channels.open_channel(row) is opened
    assert channels.close_stale() == []  # committed: an ordinary handle from now on
    channels.close_all()


def test_it_closes_a_handle_whose_row_was_deleted_or_rolled_back(
        settings: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    settings.WEIR_CHANNEL_WATCH_S = 0.05
    checks = _count_checks(monkeypatch)
    row = channel_row(root)
    channels.open_channel(row)
    Channel.objects.filter(pk=row.pk).delete()  # by another process: no close here
    row_cache.changed()
    wait_for(lambda: ["orders"] in checks, 10, "the deleted channel's handle closed")
    with pytest.raises(RuntimeError), transaction.atomic():
        other = channel_row(root, name="rolled")
        channels.open_channel(other, create=True)
        raise RuntimeError("the create fails after the open: the row never commits")
    row_cache.changed()
    wait_for(lambda: ["rolled"] in checks, 10, "the rolled-back channel's handle closed")
    settings.WEIR_CHANNEL_WATCH_S = 0
    channels.close_all()

"""Engine errors a view leaves uncaught get their documented answer, not a 500: a channel
deleted under the request is a 404 as for any channel there is not ({"detail": ...}), an
owner no process can become nor reach for now a 503 with Retry-After ({"error": ...})."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.test import override_settings

from appliance import channels
from channel_engine import ChannelClosedError, ChannelGoneError, ChannelLockedError

pytestmark = pytest.mark.django_db


def failing_open(exc: Exception) -> Callable[..., object]:
    def open_channel(*args: object, **kwargs: object) -> object:
        raise exc
    return open_channel


def test_it_answers_404_for_a_channel_deleted_under_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        monkeypatch.setattr(channels, "open_channel",
                            failing_open(ChannelGoneError("channel 'orders' was deleted")))
        response = token_client("admin").get("/api/v1/channels/orders")
    assert response.status_code == 404
    assert "deleted" in response.json()["detail"]


def test_it_answers_503_with_retry_after_when_no_owner_can_be_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        monkeypatch.setattr(channels, "open_channel", failing_open(ChannelLockedError(
            tmp_path / "orders", "pid 1, which does not answer on owner.sock after 30000 ms")))
        response = token_client("admin").get("/api/v1/channels/orders")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "try again" in response.json()["error"]


def test_it_answers_503_when_the_handle_was_closed_under_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        channel_row(tmp_path)
        monkeypatch.setattr(channels, "open_channel", failing_open(
            ChannelClosedError("channel 'orders' is closed")))
        response = token_client("admin").get("/api/v1/channels/orders")
    assert response.status_code == 503 and response["Retry-After"] == "1"

"""Helpers shared by the appliance tests: a channel record under a data root, an API
client holding a fresh token."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from appliance import channel_dirs, channels
from appliance.models import ApiToken, Channel
from channel_engine import Channel as EngineChannel


def channel_row(root: Path, name: str = "orders", files: bool = True,
                **settings: object) -> Channel:
    """Create a channel record with its dirs under `root` (the disk guard off), and its
    files as manage_channels' create makes them (unless not `files`); the directories are
    its own."""
    settings.setdefault("minimum_required_space", 0)
    row = Channel(name=name, data_dirs=[str(root / "data")], checkpoint_dir=str(root / name),
                  **settings)
    row.owned_dirs = channel_dirs.missing(row)
    row.save()
    if files:
        make_files(row)
    return row


def two_volume_channel(root: Path, events: int, name: str = "orders") -> Channel:
    """A two-partition channel over two data dirs (two volumes) holding `events` keyed
    events put through the API, closed as a restart leaves it."""
    row = Channel(name=name, data_dirs=[str(root / "a"), str(root / "b")],
                  checkpoint_dir=str(root / name), partitions=2, minimum_required_space=0)
    row.owned_dirs = channel_dirs.missing(row)
    row.save()
    make_files(row)
    produced = token_client("produce").post(
        f"/api/v1/channels/{name}/events",
        {"events": [{"body": f"e{i}", "key": str(i)} for i in range(events)]}, format="json")
    assert produced.status_code == 200, produced.content
    channels.close_all()  # a restart: the next request opens the channel afresh
    return row


def make_files(row: Channel) -> None:
    """A saved row's channel files, made as manage_channels' create makes them (a new
    channel: Channel.create), when its settings are allowed here (a row only a refusal is
    tested with has none; its first open makes them as for a wiped channel)."""
    try:
        config = channels.to_config(row)
    except ValidationError:
        return
    EngineChannel.create(config).close()


def token_client(*roles: str, channels: list[Channel] | None = None) -> APIClient:
    """An API client with a new token of these roles (on these channels, else all)."""
    _, key = ApiToken.issue("test", list(roles), channels)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def problem(response: Any, status: int, slug: str, **members: object) -> dict[str, Any]:
    """Assert the response is an RFC 9457 problem of this status and type (and these
    members); return its body."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"] == "application/problem+json", response["Content-Type"]
    body: dict[str, Any] = response.json()
    assert body["type"] == f"https://weir.dev/problems/{slug}", body
    assert body["status"] == status and body["title"] and body["detail"], body
    for name, value in members.items():
        assert body.get(name) == value, (name, body)
    if "retry_after" in body:
        assert response["Retry-After"] == str(body["retry_after"])
    return body

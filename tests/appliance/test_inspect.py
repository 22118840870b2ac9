"""Inspection over the API: channel list and detail with the engine's figures, events by
offset and by time; reading never moves the queue."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import Channel

pytestmark = pytest.mark.django_db


@pytest.fixture()
def orders(tmp_path: Path) -> Iterator[Channel]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path)
        with channels.open_channel(row).put() as tx:
            for i in range(10):
                tx.put(f"<script>{i}</script>".encode(), timestamp=1_000 + i * 10)
        yield row
    channels.close_all()


def admin() -> APIClient:
    return token_client("admin")


def test_list_and_detail_show_the_engine_figures(orders: Channel) -> None:
    client = admin()
    listed = client.get("/api/v1/channels").json()["channels"]
    assert listed[0]["name"] == "orders" and listed[0]["events_untaken"] == 10
    detail = client.get("/api/v1/channels/orders").json()
    assert detail["settings"]["name"] == "orders"
    part = detail["status"]["partitions"][0]
    assert part["log_end_offset"] == 10 and part["segment_table"][0]["records"] == 10
    assert detail["status"]["checkpoint"]["sequence"] >= 1
    assert client.get("/api/v1/channels/nope").status_code == 404


def test_events_by_offset_and_by_time_page_without_taking(orders: Channel) -> None:
    client = admin()
    page = client.get("/api/v1/channels/orders/partitions/0/events?offset=2&limit=3").json()
    assert [e["offset"] for e in page["events"]] == [2, 3, 4] and page["next_offset"] == 5
    assert page["events"][0]["body"] == "<script>2</script>"  # data: escaping is the UI's job
    by_time = client.get("/api/v1/channels/orders/partitions/0/events?timestamp=1055").json()
    assert by_time["events"][0]["offset"] == 6
    late = client.get("/api/v1/channels/orders/partitions/0/events?timestamp=99999").json()
    assert late == {"events": [], "next_offset": None}
    assert channels.open_channel(orders).status()["events_untaken"] == 10


@pytest.mark.parametrize(("query", "status"), [
    ("", 400), ("offset=1&timestamp=1", 400), ("offset=-1", 400), ("offset=0&limit=0", 400),
    ("offset=999", 416),
])
def test_bad_event_queries(orders: Channel, query: str, status: int) -> None:
    response = admin().get(f"/api/v1/channels/orders/partitions/0/events?{query}")
    assert response.status_code == status
    assert admin().get("/api/v1/channels/orders/partitions/3/events?offset=0"
                       ).status_code == 400


def test_inspection_needs_the_admin_role(orders: Channel) -> None:
    client = token_client("produce", "consume")
    assert client.get("/api/v1/channels/orders").status_code == 403
    assert APIClient().get("/api/v1/channels").status_code == 401

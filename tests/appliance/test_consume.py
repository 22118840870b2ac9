"""Take transactions over HTTP against the real engine: leased, committed or rolled back by
receipt (only by the caller that took), returned by themselves when the lease runs out."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import channel_row, problem, token_client
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import Channel

pytestmark = pytest.mark.django_db


@pytest.fixture()
def orders(tmp_path: Path) -> Iterator[Channel]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, transaction_capacity=50)
        channel = channels.open_channel(row)
        with channel.put() as tx:
            for i in range(5):
                tx.put(f"e{i}".encode(), key=b"k", headers={"h": b"v"})
            tx.put(b"\xff\xfe", key=None)
        yield row
    channels.close_all()


def consumer(channel: Channel, *roles: str) -> APIClient:
    return token_client(*(roles or ("consume",)), channels=[channel])


def take(client: APIClient, **body: object) -> object:
    return client.post("/api/v1/channels/orders/takes", body, format="json")


def untaken(row: Channel) -> int:
    return int(channels.open_channel(row).status()["events_untaken"])


def test_take_then_commit(orders: Channel) -> None:
    client = consumer(orders)
    response = take(client, max_events=3, lease_seconds=30)
    assert response.status_code == 200, response.content
    result = response.json()
    assert [e["body"] for e in result["events"]] == ["e0", "e1", "e2"]
    first = result["events"][0]
    assert (first["key"], first["headers"], first["body_base64"]) == ("k", {"h": "v"}, "ZTA=")
    assert result["lease_expires_at_ms"] > time.time() * 1000
    commit = client.post(f"/api/v1/channels/orders/takes/{result['take_id']}/commit")
    assert commit.status_code == 200 and untaken(orders) == 3
    assert commit.json() == {"committed": True, "already_committed": False}


def test_it_answers_a_repeated_commit_already_committed_and_a_late_rollback_409(
        orders: Channel) -> None:
    client = consumer(orders)
    receipt = take(client, max_events=3).json()["take_id"]
    url = f"/api/v1/channels/orders/takes/{receipt}"
    assert client.post(f"{url}/commit").status_code == 200
    again = client.post(f"{url}/commit")  # a retry whose first answer was lost
    assert again.status_code == 200 and again.json() == {"committed": True,
                                                         "already_committed": True}
    late = client.post(f"{url}/rollback")
    assert "already committed" in problem(late, 409, "take-committed")["detail"]
    assert untaken(orders) == 3  # nothing came back


def test_it_answers_a_commit_after_rollback_409_saying_so(orders: Channel) -> None:
    client = consumer(orders)
    receipt = take(client, max_events=3).json()["take_id"]
    url = f"/api/v1/channels/orders/takes/{receipt}"
    assert client.post(f"{url}/rollback").status_code == 200
    assert client.post(f"{url}/rollback").status_code == 200  # idempotent
    refused = client.post(f"{url}/commit")
    assert "was rolled back" in problem(refused, 409, "take-expired")["detail"]
    assert untaken(orders) == 6


def test_only_the_caller_that_took_can_commit_or_roll_back(orders: Channel) -> None:
    mine, other = consumer(orders), consumer(orders)
    receipt = take(mine, max_events=2).json()["take_id"]
    engine_id, _, signature = receipt.partition(".")
    forged = [f"{engine_id}.{'0' * 20}", f"{int(engine_id) + 1}.{signature}", engine_id,
              f"x.{signature}", f"\u00b2.{signature}", f"{'9' * 5000}.{signature}"]
    for bad in forged:
        for action in ("commit", "rollback"):
            problem(mine.post(f"/api/v1/channels/orders/takes/{bad}/{action}"), 404,
                    "not-found", field="take_id")
    for action in ("commit", "rollback"):
        problem(other.post(f"/api/v1/channels/orders/takes/{receipt}/{action}"), 404,
                "not-found", field="take_id")
    assert untaken(orders) == 6
    assert mine.post(f"/api/v1/channels/orders/takes/{receipt}/commit").status_code == 200
    assert untaken(orders) == 4


def test_a_receipt_does_not_outlive_its_channel(orders: Channel, tmp_path: Path) -> None:
    admin = token_client("admin")
    old = take(admin, max_events=1).json()["take_id"]
    assert admin.delete("/api/v1/channels/orders?force=true").status_code == 204
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        again = channel_row(tmp_path)  # another channel of the same name
        with channels.open_channel(again).put() as tx:
            tx.put(b"new")
        new = take(admin, max_events=1).json()
        assert old.split(".")[0] == new["take_id"].split(".")[0]  # the engine's ids repeat
        assert admin.post(f"/api/v1/channels/orders/takes/{old}/commit").status_code == 404
        assert admin.post(f"/api/v1/channels/orders/takes/{new['take_id']}/commit"
                          ).status_code == 200


def test_rollback_returns_events_in_order_and_binary_bodies_come_as_base64(
        orders: Channel) -> None:
    client = consumer(orders)
    result = take(client, max_events=2).json()
    client.post(f"/api/v1/channels/orders/takes/{result['take_id']}/rollback")
    events = take(client, max_events=50).json()["events"]
    assert [e["body"] for e in events] == ["e0", "e1", "e2", "e3", "e4", None]
    assert events[-1]["body_base64"] == "//4="


def test_a_lapsed_lease_returns_the_events(orders: Channel) -> None:
    client = consumer(orders)
    result = take(client, max_events=6, lease_seconds=1).json()
    time.sleep(1.1)
    assert len(take(client, max_events=6).json()["events"]) == 6
    late = client.post(f"/api/v1/channels/orders/takes/{result['take_id']}/commit")
    assert "its lease expired" in problem(late, 409, "take-expired")["detail"]


def test_an_empty_channel_answers_at_once(orders: Channel) -> None:
    client = consumer(orders)
    result = take(client, max_events=50).json()
    client.post(f"/api/v1/channels/orders/takes/{result['take_id']}/commit")
    empty = take(client, max_events=50).json()
    assert empty == {"take_id": None, "lease_expires_at_ms": None, "events": []}


@pytest.mark.parametrize(("body", "field"), [
    ({}, "max_events"), ({"max_events": 0}, "max_events"), ({"max_events": 51}, "max_events"),
    ({"max_events": 1, "lease_seconds": 0}, "lease_seconds"),
    ({"max_events": 1, "lease_seconds": 7200}, "lease_seconds"),
])
def test_bad_take_requests_name_the_field(orders: Channel, body: dict[str, object],
                                          field: str) -> None:
    response = take(consumer(orders), **body)
    refused = problem(response, 400, "validation-error", field=field)
    assert list(refused["errors"]) == [field]
    assert channels.open_channel(orders).status()["events_in_flight"] == 0


def test_who_may_consume(orders: Channel) -> None:
    problem(take(APIClient(), max_events=1), 401, "not-authenticated")
    problem(take(consumer(orders, "produce"), max_events=1), 403, "permission-denied")
    assert take(consumer(orders, "admin"), max_events=1).status_code == 200

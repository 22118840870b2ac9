"""The produce endpoint against the real engine: one request is one put transaction, and
every refusal writes nothing (the channel is checked after each)."""
from __future__ import annotations

import json
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
        row = channel_row(tmp_path, partitions=2, transaction_capacity=100, capacity=150,
                          keep_alive_ms=0)
        yield row
    channels.close_all()


def client_for(*roles: str, channel: Channel | None = None) -> APIClient:
    return token_client(*roles, channels=[channel] if channel else None)


def untaken(row: Channel) -> int:
    return int(channels.open_channel(row).status()["events_untaken"])


def post(client: APIClient, body: object, content_type: str = "application/json",
         name: str = "orders") -> object:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(f"/api/v1/channels/{name}/events", data=data,
                       content_type=content_type)


def test_a_request_is_one_transaction_and_says_where_events_went(orders: Channel) -> None:
    client = client_for("produce", channel=orders)
    response = post(client, {"events": [{"body": f"e{i}", "key": f"k{i}"} for i in range(10)]})
    assert response.status_code == 200, response.content
    result = response.json()
    assert result["events"] == 10
    assert sum(c["last_offset"] - c["first_offset"] + 1 for c in result["committed"]) == 10
    assert untaken(orders) == 10


def test_flume_and_ndjson_clients_work_unchanged(orders: Channel) -> None:
    client = client_for("produce", channel=orders)
    flume = [{"headers": {"host": "web1"}, "body": "from flume"}]
    assert post(client, flume).status_code == 200
    assert post(client, b'{"body": "a"}\n{"body": "b"}\n', "application/x-ndjson"
                ).status_code == 200
    assert untaken(orders) == 3


def test_null_header_values_are_stored_empty_and_read_back_as_bytes(orders: Channel) -> None:
    client = client_for("produce", channel=orders)
    flume = [{"headers": {"host": "web1", "gone": None}, "body": "from flume"}]
    weir = {"events": [{"body": "from weir", "key": "k", "headers": {"h": None}}]}
    assert post(client, flume).status_code == 200
    assert post(client, weir).status_code == 200
    assert post(client, b'{"body": "nd", "headers": {"n": null}}\n', "application/x-ndjson"
                ).status_code == 200
    with channels.open_channel(orders).take() as take:
        headers = {event.body: event.headers for event in take.take(10)}
    assert headers == {b"from flume": {"host": b"web1", "gone": b""},
                       b"from weir": {"h": b""}, b"nd": {"n": b""}}


@pytest.mark.parametrize(("body", "status", "slug", "members"), [
    ({"events": [{"body": "ok"}, {"body": 1}]}, 400, "invalid-event",
     {"field": "body", "index": 1}),
    ({"events": [{"body": "ok", "timestamp": "yesterday"}]}, 400, "invalid-event",
     {"field": "timestamp", "index": 0}),
    ({"events": [{"body": "ok"}, {"body": "late", "timestamp": 2**63 - 1}]}, 400,
     "invalid-event", {"field": "timestamp", "index": 1}),
    (b"{not json", 400, "invalid-event", {"field": "json", "index": None}),
    ({"events": [{"body": "x"}] * 101}, 413, "too-many-events",
     {"field": "transaction_capacity"}),
])
def test_bad_input_is_refused_and_nothing_is_written(orders: Channel, body: object, status: int,
                                                     slug: str, members: dict[str, object]
                                                     ) -> None:
    response = post(client_for("produce", channel=orders), body)
    problem(response, status, slug, **members)
    assert untaken(orders) == 0


def test_a_batch_over_the_channels_segment_size_is_413_and_nothing_is_written(
        tmp_path: Path) -> None:
    setting = "segment_bytes"
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, "small", segment_bytes=4096)
        client = client_for("produce", channel=row)
        response = post(client, {"events": [{"body": "x" * 100}] * 60}, name="small")
        refused = problem(response, 413, "batch-too-large", field=setting)
        assert f"{setting}=4096" in refused["detail"]
        assert untaken(row) == 0
        assert post(client, {"events": [{"body": "x" * 100}] * 10}, name="small"
                    ).status_code == 200
    channels.close_all()


def test_a_full_channel_answers_503_with_retry_after(orders: Channel) -> None:
    client = client_for("produce", channel=orders)
    assert post(client, {"events": [{"body": "x"}] * 100}).status_code == 200
    response = post(client, {"events": [{"body": "y"}] * 60})
    refused = problem(response, 503, "channel-full", retry_after=1)
    assert "full" in refused["detail"] and untaken(orders) == 100


def test_paused_puts_answer_503(orders: Channel) -> None:
    Channel.objects.filter(pk=orders.pk).update(puts_paused=True)
    response = post(client_for("produce", channel=orders), {"events": [{"body": "x"}]})
    refused = problem(response, 503, "puts-paused", retry_after=1)
    assert "paused" in refused["detail"] and untaken(orders) == 0


def test_who_may_produce(orders: Channel, tmp_path: Path) -> None:
    body = {"events": [{"body": "x"}]}
    problem(post(APIClient(), body), 401, "not-authenticated")
    problem(post(client_for("consume", channel=orders), body), 403, "permission-denied")
    other = channel_row(tmp_path, "other")
    problem(post(client_for("produce", channel=other), body), 403, "permission-denied")
    problem(post(client_for("produce"), body, name="nope"), 404, "channel-not-found")
    assert post(client_for("admin"), body).status_code == 200
    assert untaken(orders) == 1

"""Inspection over the API: channel list and detail with the engine's figures, events by
offset and by time; reading never moves the queue."""
from __future__ import annotations

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
    problem(client.get("/api/v1/channels/nope"), 404, "channel-not-found")


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


@pytest.mark.parametrize(("query", "status", "field"), [
    ("", 400, None), ("offset=1&timestamp=1", 400, None), ("offset=-1", 400, "offset"),
    ("offset=0&limit=0", 400, "limit"), ("offset=999", 416, "offset"),
    ("offset=99999999999999999999999", 400, "offset"),  # out of int64: named, never a 500
    ("offset=9223372036854775808", 400, "offset"),
    ("timestamp=99999999999999999999999", 400, "timestamp"),
])
def test_bad_event_queries(orders: Channel, query: str, status: int, field: str | None
                           ) -> None:
    response = admin().get(f"/api/v1/channels/orders/partitions/0/events?{query}")
    slug = "offset-out-of-range" if status == 416 else "validation-error"
    refused = problem(response, status, slug, field=field)
    if status == 416:
        assert (refused["log_start_offset"], refused["log_end_offset"]) == (0, 10)
    problem(admin().get("/api/v1/channels/orders/partitions/3/events?offset=0"), 400,
            "validation-error", field="partition")


def test_inspection_needs_the_admin_role(orders: Channel) -> None:
    client = token_client("produce", "consume")
    problem(client.get("/api/v1/channels/orders"), 403, "permission-denied")
    problem(APIClient().get("/api/v1/channels"), 401, "not-authenticated")


def test_task_runs_are_listed_newest_first_filtered_and_paged(tmp_path: Path) -> None:
    from django.utils import timezone

    from appliance.models import TaskRun

    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        mine = channel_row(tmp_path, name="mine")
        channel_row(tmp_path, name="theirs")
    for i in range(5):
        for name in ("mine", "theirs"):
            TaskRun.objects.create(task="weir.checkpoint_channel", channel=name,
                                   started_at=timezone.now(), duration_ms=i,
                                   outcome=TaskRun.OK if i % 2 else TaskRun.FAILED)
    admin = token_client("admin")
    page = admin.get("/api/v1/runs?channel=mine&limit=2").json()
    assert [r["duration_ms"] for r in page["runs"]] == [4, 3]
    rest = admin.get(f"/api/v1/runs?channel=mine&limit=10&before={page['next_before']}").json()
    assert [r["duration_ms"] for r in rest["runs"]] == [2, 1, 0] and rest["next_before"] is None
    every = admin.get("/api/v1/runs?channel=&task=&outcome=&limit=500").json()["runs"]
    assert len(every) == 10  # an empty filter matches every run (the schema says so too)
    problem(admin.get("/api/v1/runs?channel=a%00b"), 400, "validation-error", field="channel")
    failed = admin.get("/api/v1/runs?outcome=failed").json()["runs"]
    assert len(failed) == 6 and {r["outcome"] for r in failed} == {"failed"}
    scoped = token_client("admin", channels=[mine]).get("/api/v1/runs").json()["runs"]
    assert {r["channel"] for r in scoped} == {"mine"}
    problem(admin.get("/api/v1/runs?outcome=maybe"), 400, "validation-error", field="outcome")
    huge = admin.get("/api/v1/runs?before=99999999999999999999999")  # past int64: 400, named
    assert list(problem(huge, 400, "validation-error", field="before")["errors"]) == ["before"]
    problem(token_client("consume").get("/api/v1/runs"), 403, "permission-denied")
    channels.close_all()


def test_raw_batches_of_a_range_stream_for_remote_readers(tmp_path: Path) -> None:
    from channel_engine.log import record_batch

    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, name="raw")
        channel = channels.open_channel(row)
        for first in range(0, 100, 10):
            with channel.put() as tx:
                for i in range(first, first + 10):
                    tx.put(f"e{i}".encode(), headers={"i": str(i).encode()})
        client = token_client("consume", channels=[row])
        response = client.get("/api/v1/channels/raw/partitions/0/batches?start=15&end=42")
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == "application/vnd.weir.batches"
        assert response["X-Weir-Range"] == "15-50"  # whole batches: through offset 49
        data = b"".join(response.streaming_content)
        offsets, position = [], 0
        while position < len(data):
            header = record_batch.check_batch(data, position, len(data), None, True)
            batch = data[position:position + header.size]
            offsets += [o for o, _, _, _, _ in record_batch.records(batch)]
            position += header.size
        assert offsets[0] <= 15 and offsets[-1] >= 41 and set(range(15, 42)) <= set(offsets)
        problem(client.get("/api/v1/channels/raw/partitions/0/batches?start=90&end=101"),
                416, "offset-out-of-range", field="end", log_start_offset=0,
                last_stable_offset=100)
        problem(client.get("/api/v1/channels/raw/partitions/0/batches?start=5&end=5"), 400,
                "validation-error", field="end")
        past = client.get("/api/v1/channels/raw/partitions/0/batches?start=0&end=2%s" % ("0" * 20))
        assert list(problem(past, 400, "validation-error", field="end")["errors"]) == ["end"]
        problem(client.get("/api/v1/channels/raw/partitions/3/batches?start=0&end=1"), 400,
                "validation-error", field="partition")
        problem(token_client("produce").get(
            "/api/v1/channels/raw/partitions/0/batches?start=0&end=1"), 403, "permission-denied")
    channels.close_all()

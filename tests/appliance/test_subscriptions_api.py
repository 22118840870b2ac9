"""Subscriptions over the API, the UI's actions and /metrics, against the real engine: each
subscription takes every event once, its own lag shows, refusals name what is wrong and
change nothing, tokens may be scoped to subscriptions."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, problem, token_client
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from appliance import channels, exports
from appliance.models import ApiToken, Channel

pytestmark = pytest.mark.django_db
URL = "/api/v1/channels/orders/subscriptions"


@pytest.fixture()
def orders(tmp_path: Path) -> Iterator[Channel]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, partitions=2, transaction_capacity=100)
        put(row, [f"e{i}".encode() for i in range(6)])
        yield row
    channels.close_all()


def put(row: Channel, bodies: list[bytes], **kwargs: Any) -> None:
    with channels.open_channel(row).put() as tx:
        for i, body in enumerate(bodies):
            tx.put(body, key=str(i).encode(), **kwargs)


def take(client: APIClient, subscription: str | None = None, n: int = 100) -> Any:
    body: dict[str, Any] = {"max_events": n}
    if subscription is not None:
        body["subscription"] = subscription
    return client.post("/api/v1/channels/orders/takes", body, format="json")


def drain(client: APIClient, subscription: str | None = None, n: int = 100) -> list[str]:
    """Take and commit until the subscription has nothing left; the bodies taken."""
    bodies: list[str] = []
    while True:
        response = take(client, subscription, n)
        assert response.status_code == 200, response.content
        result = response.json()
        if not result["events"]:
            return sorted(bodies)
        bodies += [e["body"] for e in result["events"]]
        commit = client.post(f"/api/v1/channels/orders/takes/{result['take_id']}/commit")
        assert commit.status_code == 200


def subscriptions(client: APIClient) -> dict[str, dict[str, Any]]:
    response = client.get(URL)
    assert response.status_code == 200, response.content
    return {s["name"]: s for s in response.json()["subscriptions"]}


def test_each_subscription_takes_every_event_once(orders: Channel) -> None:
    admin = token_client("admin")
    response = admin.post(URL, {"name": "archive", "start": "earliest"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "archive" and response.json()["events_untaken"] == 6
    every = sorted(f"e{i}" for i in range(6))
    assert drain(admin) == every  # default, named by no take
    assert drain(admin) == []
    listed = subscriptions(admin)
    assert list(listed) == ["default", "archive"]
    assert listed["default"]["events_untaken"] == 0
    assert listed["archive"]["events_untaken"] == 6
    assert listed["archive"]["oldest_untaken_age_ms"] is not None
    assert sum(p["events_untaken"] for p in listed["archive"]["partitions"]) == 6
    assert drain(admin, "archive") == every
    assert subscriptions(admin)["archive"]["counters"]["take_successes"] == 6
    assert channels.open_channel(orders).status()["events_untaken"] == 0


def test_a_rollback_returns_events_to_its_own_subscription_only(orders: Channel) -> None:
    admin = token_client("admin")
    admin.post(URL, {"name": "archive"}, format="json")
    result = take(admin, "archive", n=3).json()
    rollback = admin.post(f"/api/v1/channels/orders/takes/{result['take_id']}/rollback")
    assert rollback.status_code == 200
    assert subscriptions(admin)["archive"]["counters"]["rollbacks"] == 1
    assert drain(admin, "archive") == sorted(f"e{i}" for i in range(6))
    assert subscriptions(admin)["default"]["events_untaken"] == 6


@pytest.mark.parametrize("start, untaken", [
    ("earliest", 6), ("latest", 0), ({"timestamp_ms": 0}, 6),
    ({"timestamp_ms": 2**62}, 0), ({"offsets": {"0": 0, "1": 0}}, 6)])
def test_it_adds_at_every_kind_of_position(orders: Channel, start: Any, untaken: int) -> None:
    admin = token_client("admin")
    response = admin.post(URL, {"name": "live", "start": start}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["events_untaken"] == untaken
    put(orders, [b"later"])
    assert len(drain(admin, "live")) == untaken + 1


@pytest.mark.parametrize("body, field", [
    ({"name": "Bad Name"}, "name"), ({"name": ""}, "name"), ({}, "name"),
    ({"name": "x" * 65}, "name"), ({"name": "ok", "start": "middle"}, "start"),
    ({"name": "ok", "start": {"timestamp_ms": -1}}, "start"),
    ({"name": "ok", "start": {"offsets": {"7": 0}}}, "start"),
    ({"name": "ok", "start": {"offsets": {"0": 10**6}}}, "start"),
    ({"name": "ok", "start": {"offsets": {}}}, "start"),
    ({"name": "ok", "start": {"offsets": {"0": "1"}}}, "start"),
    ({"name": "ok", "extra": 1}, "extra")])
def test_a_bad_add_is_a_400_naming_the_field_and_adds_nothing(
        orders: Channel, body: dict[str, Any], field: str) -> None:
    admin = token_client("admin")
    problem(admin.post(URL, body, format="json"), 400, "validation-error", field=field)
    assert list(subscriptions(admin)) == ["default"]


def test_refusals_of_the_channels_state_say_why(orders: Channel) -> None:
    admin = token_client("admin")
    admin.post(URL, {"name": "archive"}, format="json")
    problem(admin.post(URL, {"name": "archive"}, format="json"), 409, "subscription-exists",
            field="name")
    problem(take(admin, "nope"), 404, "subscription-not-found", field="subscription")
    problem(admin.get(f"{URL}/nope"), 404, "subscription-not-found")
    problem(admin.delete(f"{URL}/nope"), 404, "subscription-not-found")
    problem(admin.post(f"{URL}/nope/reset", {"to": "earliest"}, format="json"), 404,
            "subscription-not-found")
    problem(admin.delete(f"{URL}/default"), 409, "channel-conflict", field="subscription")
    problem(admin.delete(f"{URL}/export"), 404, "subscription-not-found")  # unscheduled
    response = admin.patch("/api/v1/channels/orders", {
        "export_subscription": "archive", "export_interval_ms": 60_000}, format="json")
    assert response.status_code == 200, response.content
    problem(admin.delete(f"{URL}/archive"), 409, "channel-conflict", field="subscription")
    assert list(subscriptions(admin)) == ["default", "archive"]


def test_reset_and_remove_wait_for_open_takes(orders: Channel) -> None:
    admin = token_client("admin")
    admin.post(URL, {"name": "archive"}, format="json")
    assert drain(admin, "archive")
    result = take(admin).json()  # default's take does not hold archive
    reset = admin.post(f"{URL}/archive/reset", {"to": "earliest"}, format="json")
    assert reset.status_code == 200 and reset.json()["events_untaken"] == 6
    problem(admin.post(f"{URL}/default/reset", {"to": "latest"}, format="json"), 409,
            "subscription-busy")
    admin.post(f"/api/v1/channels/orders/takes/{result['take_id']}/rollback")
    assert admin.post(f"{URL}/default/reset", {"to": "latest"},
                      format="json").json()["events_untaken"] == 0
    result = take(admin, "archive").json()
    problem(admin.delete(f"{URL}/archive"), 409, "subscription-busy")
    admin.post(f"/api/v1/channels/orders/takes/{result['take_id']}/commit")
    assert admin.delete(f"{URL}/archive").status_code == 204
    assert list(subscriptions(admin)) == ["default"]
    problem(take(admin, "archive"), 404, "subscription-not-found")


def test_a_reset_by_offsets_moves_the_named_partitions_only(orders: Channel) -> None:
    admin = token_client("admin")
    drain(admin)
    status = channels.open_channel(orders).status()
    ends = [p["log_end_offset"] for p in status["partitions"]]
    partition = 0 if ends[0] else 1
    response = admin.post(f"{URL}/default/reset",
                          {"to": {"offsets": {str(partition): ends[partition] - 1}}},
                          format="json")
    assert response.status_code == 200, response.content
    assert response.json()["events_untaken"] == 1
    problem(admin.post(f"{URL}/default/reset", {"to": {"offsets": {"0": 10**6}}},
                       format="json"), 400, "validation-error", field="to")
    problem(admin.post(f"{URL}/default/reset", {}, format="json"), 400, "validation-error",
            field="to")


def test_consumers_read_subscriptions_and_only_admins_change_them(orders: Channel) -> None:
    consumer = token_client("consume", channels=[orders])
    assert list(subscriptions(consumer)) == ["default"]
    assert consumer.get(f"{URL}/default").status_code == 200
    problem(consumer.post(URL, {"name": "mine"}, format="json"), 403, "permission-denied")
    problem(consumer.post(f"{URL}/default/reset", {"to": "latest"}, format="json"), 403,
            "permission-denied")
    token_client("admin").post(URL, {"name": "mine"}, format="json")
    problem(consumer.delete(f"{URL}/mine"), 403, "permission-denied")
    problem(token_client("produce", channels=[orders]).get(URL), 403, "permission-denied")


def test_a_token_scoped_to_subscriptions_takes_from_those_alone(orders: Channel) -> None:
    token_client("admin").post(URL, {"name": "archive"}, format="json")
    _, key = ApiToken.issue("archiver", ["consume"], [orders], ["archive"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    problem(take(client), 403, "permission-denied", field="subscription")
    problem(take(client, "other"), 403, "permission-denied", field="subscription")
    assert len(drain(client, "archive")) == 6
    assert channels.open_channel(orders).status()["subscriptions"]["default"][
        "events_untaken"] == 6
    with pytest.raises(ValueError):
        ApiToken.issue("bad", ["consume"], [orders], ["Not A Name"])


def test_create_token_scopes_to_subscriptions(orders: Channel, capsys: Any) -> None:
    call_command("create_token", "archiver", "--role", "consume", "--channel", "orders",
                 "--subscription", "archive")
    token = ApiToken.objects.get(name="archiver")
    assert token.subscriptions == ["archive"] and not token.allows_subscription("default")
    assert "subscriptions archive" in capsys.readouterr().out


def test_metrics_give_each_subscriptions_lag_age_and_takes(orders: Channel) -> None:
    admin = token_client("admin")
    admin.post(URL, {"name": "archive"}, format="json")
    drain(admin)
    text = admin.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
             for f in families.values()}

    def of(metric: str, subscription: str) -> float:
        return value[metric][(("channel", "orders"), ("subscription", subscription))]

    assert of("weir_subscription_lag_events", "default") == 0
    assert of("weir_subscription_lag_events", "archive") == 6
    assert of("weir_subscription_take_successes", "default") == 6
    assert of("weir_subscription_take_successes", "archive") == 0
    assert of("weir_subscription_oldest_untaken_age_seconds", "default") == 0
    assert 0 <= of("weir_subscription_oldest_untaken_age_seconds", "archive") < 600
    partition_lag = value["weir_subscription_partition_lag_events"]
    assert sum(v for labels, v in partition_lag.items()
               if ("subscription", "archive") in labels) == 6
    assert value["weir_channel_events"][(("channel", "orders"),)] == 6  # the slowest


def test_the_export_drains_its_own_subscription(orders: Channel) -> None:
    assert orders.export_subscription == "export"  # a channel made since subscriptions
    argv = exports.command(orders)
    assert argv[argv.index("--subscription") + 1] == "export"


def test_a_channel_scheduled_for_export_gets_its_subscription_at_create_and_change(
        tmp_path: Path) -> None:
    admin = token_client("admin")
    settings = {"data_dirs": [str(tmp_path / "data")], "minimum_required_space": 0}
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        response = admin.post("/api/v1/channels", {
            "name": "orders", "checkpoint_dir": str(tmp_path / "orders"),
            "export_interval_ms": 60_000, **settings}, format="json")
        assert response.status_code == 201, response.content
        assert list(response.json()["status"]["subscriptions"]) == ["default", "export"]
        response = admin.post("/api/v1/channels", {
            "name": "audit", "checkpoint_dir": str(tmp_path / "audit"), **settings},
            format="json")
        assert list(response.json()["status"]["subscriptions"]) == ["default"]
        put(Channel.objects.get(name="audit"), [b"a", b"b"])
        response = admin.patch("/api/v1/channels/audit", {
            "export_interval_ms": 60_000, "export_subscription": "hdfs"}, format="json")
        assert response.status_code == 200, response.content
        subs = response.json()["status"]["subscriptions"]
        assert list(subs) == ["default", "hdfs"] and subs["hdfs"]["events_untaken"] == 2
        problem(admin.patch("/api/v1/channels/audit", {"export_subscription": "Bad"},
                            format="json"), 400, "invalid-setting",
                field="export_subscription")
        channels.close_all()


@pytest.mark.django_db(transaction=True)
def test_channels_made_before_subscriptions_keep_exporting_default() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("appliance", "0005_channel_owned_dirs_and_key_names")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old_channel = executor.loader.project_state(before).apps.get_model("appliance", "Channel")
    old_channel.objects.create(name="old", data_dirs=["/data"], checkpoint_dir="/data/old")
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert Channel.objects.get(name="old").export_subscription == "default"
    assert Channel(name="new").export_subscription == "export"
    assert ApiToken.issue("t", ["consume"])[0].subscriptions == []


@pytest.fixture()
def operator() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    return client


def test_the_channel_page_shows_subscriptions_and_adds_resets_and_removes_them(
        orders: Channel, operator: Client) -> None:
    channel = channels.open_channel(orders)
    with channel.take() as tx:
        tx.take(2)
    page = operator.get("/channels/orders/").content.decode()
    assert 'data-subscription="default"' in page and 'id="subscription-table"' in page
    response = operator.post("/channels/orders/subscriptions",
                             {"name": "archive", "start": "earliest"})
    assert response.status_code == 302
    assert channel.status()["subscriptions"]["archive"]["events_untaken"] == 6
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3600))
    operator.post("/channels/orders/subscriptions/archive/reset",
                  {"to": "timestamp", "to_time": when})
    assert channel.status()["subscriptions"]["archive"]["events_untaken"] == 0
    operator.post("/channels/orders/subscriptions/archive/reset",
                  {"to": "offsets", "to_offsets": "0:0, 1:0"})
    assert channel.status()["subscriptions"]["archive"]["events_untaken"] == 6
    page = operator.get("/channels/orders/", follow=True).content.decode()
    assert "Subscription archive reset to partition 0 offset 0" in page
    response = operator.post("/channels/orders/subscriptions/archive/reset",
                             {"to": "offsets", "to_offsets": "nine"}, follow=True)
    assert "Not done: offsets: expected partition:offset pairs" in response.content.decode()
    response = operator.post("/channels/orders/subscriptions", {"name": "archive"},
                             follow=True)
    assert "already" in response.content.decode()
    operator.post("/channels/orders/subscriptions/archive/remove")
    assert channel.subscriptions() == ["default"]
    status = operator.get("/channels/orders/status").content.decode()
    assert 'data-subscription="archive"' not in status


def test_scheduling_the_export_late_never_fills_the_channel(tmp_path: Path) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, capacity=10, transaction_capacity=10)
        admin = token_client("admin")
        for _ in range(3):  # 24 events through a channel of 10, drained by a consumer
            put(row, [b"x"] * 8)
            drain(admin, n=10)
        response = admin.patch("/api/v1/channels/orders", {"export_interval_ms": 60_000},
                               format="json")
        assert response.status_code == 200, response.content
        subs = response.json()["status"]["subscriptions"]
        assert subs["export"]["events_untaken"] == 0  # where default stands, not earliest
        put(row, [b"y"] * 8)  # puts still fit
        channels.close_all()


def test_moving_the_export_to_another_subscription_removes_the_old_one(
        orders: Channel) -> None:
    admin = token_client("admin")
    response = admin.patch("/api/v1/channels/orders", {"export_interval_ms": 60_000},
                           format="json")
    assert list(response.json()["status"]["subscriptions"]) == ["default", "export"]
    response = admin.patch("/api/v1/channels/orders", {"export_subscription": "hdfs"},
                           format="json")
    assert list(response.json()["status"]["subscriptions"]) == ["default", "hdfs"]
    response = admin.patch("/api/v1/channels/orders", {"export_subscription": "default"},
                           format="json")
    assert list(response.json()["status"]["subscriptions"]) == ["default"]
    response = admin.patch("/api/v1/channels/orders", {"export_subscription": "archive",
                                                       "export_interval_ms": None},
                           format="json")
    assert list(response.json()["status"]["subscriptions"]) == ["default"]  # default stays


def test_an_unscheduled_exports_subscription_may_be_removed(orders: Channel) -> None:
    channels.open_channel(orders).add_subscription("export", "slowest")  # an "export now"
    assert token_client("admin").delete(f"{URL}/export").status_code == 204


def test_an_admin_token_is_never_scoped_to_subscriptions(orders: Channel) -> None:
    with pytest.raises(ValueError, match="admin"):
        ApiToken.issue("root", ["admin"], [orders], ["archive"])

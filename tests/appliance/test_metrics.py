"""/metrics parses as Prometheus text, with Flume's counters under Prometheus names."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from appliance import channels
from appliance.api.metrics import COUNTERS, GAUGES, render
from appliance.models import Channel

pytestmark = pytest.mark.django_db


@pytest.fixture()
def orders(tmp_path: Path) -> Iterator[Channel]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, partitions=2, capacity=100, transaction_capacity=100)
        channel = channels.open_channel(row)
        with channel.put() as tx:
            for i in range(10):
                tx.put(b"x", key=str(i).encode())
        with channel.take() as tx:
            tx.take(4)
        yield row
    channels.close_all()


def test_metrics_parse_and_carry_the_channel_figures(orders: Channel) -> None:
    response = token_client("admin").get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    value = {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
             for f in families.values()}
    channel = (("channel", "orders"),)
    assert families["weir_channel_put_successes"].type == "counter"
    assert value["weir_channel_put_successes"][channel] == 10
    assert value["weir_channel_take_successes"][channel] == 4
    assert value["weir_channel_events"][channel] == 6
    assert value["weir_channel_fill_ratio"][channel] == 0.06
    assert value["weir_channel_healthy"][channel] == 1
    lag = value["weir_partition_lag_events"]
    assert sum(lag.values()) == 6 and len(lag) == 2


def test_metrics_need_the_admin_role(orders: Channel) -> None:
    assert APIClient().get("/metrics").status_code == 401


def test_it_escapes_label_values_so_every_channel_stays_parseable() -> None:
    # a name the engine refuses today, as an older version may have stored it
    status = {"name": 'odd\n"\\name', "counters": dict.fromkeys(COUNTERS, 1),
              "checkpoint": {"age_ms": 0}, "losses": {"events_lost": 0,
                                                       "unacknowledged_events": 0},
              "health": "healthy", "partitions": [{"partition": 0, "events_untaken": 2}],
              "subscription_lag": {},
              **{key: 1 for key, _ in GAUGES.values()}}
    text = render([status, {**status, "name": "orders"}])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = {s.labels["channel"] for s in families["weir_partition_lag_events"].samples}
    assert names == {'odd\n"\\name', "orders"}


def _counter_samples(client: APIClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of every counter family in /metrics, by name and labels."""
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(response.content.decode())
            if f.type == "counter" for s in f.samples}


def test_a_settings_change_never_takes_a_counter_backwards(orders: Channel) -> None:
    """A change reopens the channel (its owner closes, writing a final checkpoint, and the
    channel opens again with the new settings): its counters go on from where they were."""
    admin = token_client("admin")
    before = _counter_samples(admin)
    channel = (("channel", "orders"),)
    assert before[("weir_channel_put_successes_total", channel)] == 10
    assert before[("weir_channel_take_successes_total", channel)] == 4
    for capacity in (200, 300):
        changed = admin.patch("/api/v1/channels/orders", {"capacity": capacity},
                              format="json")
        assert changed.status_code == 200, changed.content
        after = _counter_samples(admin)
        assert after == before, {k: (before.get(k), v) for k, v in after.items()
                                 if before.get(k) != v}
    with channels.open_channel(Channel.objects.get(name="orders")).put() as tx:
        tx.put(b"y")
    assert _counter_samples(admin)[("weir_channel_put_successes_total", channel)] == 11

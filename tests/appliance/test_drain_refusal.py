"""A drain's refusal of a recreated partition whose offsets it had sent
(channel_engine/incarnations.py), from the appliance's side, against the run's real Kafka
broker: the run's row is failed with the refusal's words, the channel page shows them
readably, and the API's recreate at a next offset is the way out."""
from __future__ import annotations

import html
import shutil
import sys
from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.contrib.auth.models import User
from django.test import Client

from appliance import channels
from appliance.kafka_sinks import run_sink
from appliance.models import Channel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from kafka_sink_helpers import new_topic, read_topic  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)
WAY_OUT = "manage.py recreate_channel orders --yes --next-offset 0:100"


def put(row: Channel, first: int, count: int) -> None:
    with channels.open_channel(row).put() as tx:
        for i in range(first, first + count):
            tx.put(f"event-{i}".encode(), key=b"k")


def test_a_refused_run_is_failed_with_the_way_out_and_the_api_recreate_takes_it(
        root: Path, kafka_broker) -> None:
    row = channel_row(root, partitions=1, kafka_topic=new_topic(kafka_broker.bootstrap, 1),
                      kafka_bootstrap=kafka_broker.bootstrap)
    put(row, 0, 40)
    assert run_sink(row).events == 40
    channels.close_all()
    shutil.copytree(root / "orders", root / "home-then")  # the checkpoint says 40
    put(row, 40, 60)
    assert run_sink(row).events == 60
    channels.close_all()
    shutil.rmtree(root / "data" / "orders-0")  # vanished; the owner died unrecorded
    shutil.rmtree(root / "orders")
    shutil.move(root / "home-then", root / "orders")
    admin = token_client("admin")
    assert admin.post("/api/v1/channels/orders/recreate").status_code == 200
    put(row, 100, 10)  # at offsets 40..49
    channels.close_all()

    refused = run_sink(row)
    assert refused is not None and refused.outcome == "failed", refused
    assert "partition 0" in refused.error and WAY_OUT in refused.error, refused.error
    assert refused.events == 0 and refused.skipped == 0
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = html.unescape(operator.get("/channels/orders/status").content.decode())
    # the run's row, in words (no repr, no traceback)
    assert "<span class=\"error\">channel 'orders' partition 0: its storage was recreated" \
        in page and f"{WAY_OUT} (or the recreate on the channel's page" in page
    assert "Traceback" not in page and "SinkError" not in page

    channels.close_all()
    shutil.move(root / "data" / "orders-0", root / "orders-0-aside")
    answer = admin.post("/api/v1/channels/orders/recreate", {"next_offsets": {"0": 100}},
                        format="json")
    assert answer.status_code == 200, answer.content
    put(row, 200, 5)
    channels.close_all()
    resumed = run_sink(row)
    assert resumed is not None and resumed.outcome == "ok" and resumed.events == 5, resumed
    assert len(read_topic(kafka_broker.bootstrap, row.kafka_topic)[0]) == 105

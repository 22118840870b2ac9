"""The operator's recreate of vanished storage at a next offset (the way out of a drain's
refusal, channel_engine/incarnations.py): a partition made again goes on at the offset
given, as a new incarnation; a bad value is a 400 naming next_offsets and makes nothing."""
from __future__ import annotations

import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import problem, token_client, two_volume_channel
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.template.loader import render_to_string
from django.test import Client

from appliance import channels
from appliance.models import Channel
from channel_engine import MAX_OFFSET
from channel_engine.incarnations import ORIGINAL

pytestmark = pytest.mark.django_db
EVENTS = "/api/v1/channels/orders/events"
RECREATE = "/api/v1/channels/orders/recreate"


def lost_partition_one(root: Path) -> Channel:
    """A two-partition channel with events in both, whose partition 1 directory vanished."""
    row = two_volume_channel(root, 6)
    shutil.rmtree(root / "b" / "orders-1")
    return row


def partition(status: dict[str, Any], p: int) -> dict[str, Any]:
    return dict(status["partitions"][p])


def test_the_api_recreates_a_partition_at_the_next_offset_given(root: Path) -> None:
    lost_partition_one(root)
    admin = token_client("admin")
    answer = admin.post(RECREATE, {"next_offsets": {"1": 500}}, format="json")
    assert answer.status_code == 200, answer.content
    part = partition(answer.json()["status"], 1)
    assert (part["log_start_offset"], part["log_end_offset"]) == (500, 500)
    assert part["incarnation"] != ORIGINAL and part["incarnation_start_offset"] == 500
    assert partition(answer.json()["status"], 0)["incarnation"] == ORIGINAL
    produced = token_client("produce").post(
        EVENTS, {"events": [{"body": f"n{i}", "key": str(i)} for i in range(6)]},
        format="json").json()
    firsts = [c["first_offset"] for c in produced["committed"] if c["partition"] == 1]
    assert firsts == [500], produced


@pytest.mark.parametrize(("body", "says"), [
    ({"next_offsets": [1, 500]}, "an object of partition number"),
    ({"next_offsets": {"7": 500}}, "partitions 0 to 1"),
    ({"next_offsets": {"x": 500}}, "partitions 0 to 1"),
    ({"next_offsets": {"\u00b2": 500}}, "partitions 0 to 1"),
    ({"next_offsets": {"1": -1}}, "not a whole number"),
    ({"next_offsets": {"1": "500"}}, "not a whole number"),
    ({"next_offsets": {"1": True}}, "not a whole number"),
    ({"next_offsets": {"1": 2**62 + 1}}, "not a whole number from 0 to"),
    ({"next_offsets": {"1": 500, "01": 900}}, "partition 1 is given twice"),
    ({"next_offsets": {"0": 500}}, "partition 0: its directory"),
    ({"next_offset": {"1": 500}}, "unknown field"),
])
def test_a_bad_next_offset_is_a_400_naming_it_and_makes_nothing(
        root: Path, body: dict[str, Any], says: str) -> None:
    lost_partition_one(root)
    answer = token_client("admin").post(RECREATE, body, format="json")
    found = problem(answer, 400, "invalid-setting")
    assert says in found["detail"], found
    assert found["field"] == next(iter(body)), found
    assert not (root / "b" / "orders-1").exists()


def test_manage_py_recreates_at_the_next_offset(root: Path) -> None:
    lost_partition_one(root)
    with pytest.raises(CommandError, match="PARTITION:OFFSET"):
        call_command("recreate_channel", "orders", "--yes", "--next-offset", "1=500",
                     stdout=StringIO())
    assert not (root / "b" / "orders-1").exists()
    with pytest.raises(CommandError, match=r"--next-offset: partition 1 is given twice "
                                           r"\(1:5 and 1:9\)"):
        call_command("recreate_channel", "orders", "--yes", "--next-offset", "1:5",
                     "--next-offset", "1:9", stdout=StringIO())
    assert not (root / "b" / "orders-1").exists()
    call_command("recreate_channel", "orders", "--yes", "--next-offset", "1:700",
                 stdout=StringIO())
    status = channels.open_channel(Channel.objects.get(name="orders")).status()
    assert partition(status, 1)["incarnation_start_offset"] == 700
    assert partition(status, 1)["log_end_offset"] == 700


def test_the_channel_page_recreates_at_the_next_offsets_given(root: Path) -> None:
    lost_partition_one(root)
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = operator.get("/channels/orders/status").content.decode()
    assert 'id="recreate-next-offsets" name="next_offsets"' in page
    for text in ("1=500", "1:\u00b2"):
        bad = operator.post("/channels/orders/recreate", {"next_offsets": text}, follow=True)
        assert ("Not recreated. The next offsets were refused: "
                f"&#x27;{text}&#x27;: give PARTITION:OFFSET, e.g. 1:5000.") in \
            bad.content.decode()
    assert not (root / "b" / "orders-1").exists()
    done = operator.post("/channels/orders/recreate", {"next_offsets": "1:900"}, follow=True)
    assert "recreated empty" in done.content.decode()
    status = channels.open_channel(Channel.objects.get(name="orders")).status()
    assert partition(status, 1)["incarnation_start_offset"] == 900
    page = operator.get("/channels/orders/status").content.decode()
    made = partition(status, 1)["incarnation"]
    assert f'title="Recreated storage (id {made}): offsets below 900 belong to' in page
    assert "incarnation" not in page  # an internal name, never shown


def test_the_api_schema_bounds_next_offsets() -> None:
    schema = token_client("admin").get("/api/schema/?format=json").json()
    body = schema["paths"]["/api/v1/channels/{name}/recreate"]["post"]["requestBody"]
    field = body["content"]["application/json"]["schema"]["properties"]["next_offsets"]
    assert "propertyNames" not in field  # not OpenAPI 3.0: the view checks the keys
    assert "partition number (ASCII digits)" in field["description"]
    assert field["additionalProperties"]["maximum"] == MAX_OFFSET


@pytest.mark.parametrize("pending", [True, False])
def test_a_recreate_cut_short_reads_as_such_in_the_partitions_table(pending: bool) -> None:
    """Its start offset is no fact yet: never shown as 'from offset 0'."""
    part = {"partition": 1, "directory": "/data/orders-1", "incarnation": "ab" * 16,
            "incarnation_start_offset": 0 if pending else 900, "incarnation_pending": pending}
    html = render_to_string("ui/_channel_status.html",
                            {"status": {"partitions": [part]}, "row": {"name": "orders"}})
    cell = html[html.index("<code>/data/orders-1</code>"):].split("</td>")[0]
    if pending:
        assert ">start not recorded: recreate cut short</span>" in cell
        assert "from offset" not in cell and "recreate the channel again" in cell
    else:
        assert ">recreated, from offset 900</span>" in cell
    assert "incarnation" not in cell and "None" not in cell

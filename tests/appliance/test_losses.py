"""Losses the engine found on disk reach the operator: the channel detail, /metrics, the
UI's losses panel, and one acknowledgement (API or UI) that ends the `degraded` health."""
from __future__ import annotations

from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from appliance import channels
from appliance.models import Channel
from appliance.ui import loss_causes
from channel_engine.log import recovery

pytestmark = pytest.mark.django_db(transaction=True)


def damaged_channel(root: Path) -> tuple[Channel, int]:
    """A channel whose middle segment file was deleted while it was closed; returns the row
    and how many untaken events that segment held."""
    row = channel_row(root, partitions=1, segment_bytes=4096)
    channel = channels.open_channel(row)
    for batch in range(12):
        with channel.put() as tx:
            for i in range(10):
                tx.put(f"event {batch}-{i} ".encode() * 8)
    with channel.take() as tx:
        assert len(tx.take(5)) == 5
    channels.close_all()
    partition = Path(channels.to_config(row).partition_dir(0))
    logs = sorted(partition.glob("*.log"))
    assert len(logs) >= 3, logs
    victim = logs[1]
    first = int(victim.stem)
    held = int(logs[2].stem) - first
    victim.unlink()
    return row, held


def test_it_shows_a_loss_in_the_detail_and_degrades_health_until_acknowledged(
        root: Path) -> None:
    row, held = damaged_channel(root)
    client = token_client("admin")
    status = client.get(f"/api/v1/channels/{row.name}").json()["status"]
    losses = status["losses"]
    assert losses["events_lost"] == held and losses["unacknowledged_events"] == held
    assert status["health"] == "degraded" and str(held) in status["health_reason"]
    record = losses["records"][0]
    assert record["partition"] == 0 and record["end"] - record["start"] == held
    answer = client.post(f"/api/v1/channels/{row.name}/losses/acknowledge")
    assert answer.status_code == 200, answer.content
    assert answer.json()["acknowledged"] == 1
    status = client.get(f"/api/v1/channels/{row.name}").json()["status"]
    assert status["health"] == "healthy"
    assert status["losses"]["events_lost"] == held
    assert status["losses"]["unacknowledged_events"] == 0


def test_it_counts_lost_events_in_metrics(root: Path) -> None:
    row, held = damaged_channel(root)
    text = token_client("admin").get("/metrics").content.decode()
    value = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.labels.get("channel") == row.name}
    assert value["weir_channel_lost_events_total"] == held
    assert value["weir_channel_unacknowledged_lost_events"] == held
    assert value["weir_channel_healthy"] == 0


def test_it_needs_the_admin_role_to_acknowledge(root: Path) -> None:
    row, _held = damaged_channel(root)
    for role in ("produce", "consume"):
        assert token_client(role).post(
            f"/api/v1/channels/{row.name}/losses/acknowledge").status_code == 403
    assert token_client("admin").post("/api/v1/channels/nope/losses/acknowledge") \
        .status_code == 404


def test_the_channel_page_lists_losses_and_acknowledges_them(root: Path) -> None:
    row, held = damaged_channel(root)
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get(f"/channels/{row.name}/").content.decode()
    assert 'id="loss-records"' in page and 'id="acknowledge-losses"' in page
    assert f"{held} lost event(s) not acknowledged" in page
    answer = client.post(f"/channels/{row.name}/losses/acknowledge", follow=True)
    page = answer.content.decode()
    assert "1 loss record(s) acknowledged." in page
    assert 'id="acknowledge-losses"' not in page and "all acknowledged" in page


def test_the_loss_table_names_each_cause_in_plain_words(root: Path) -> None:
    """The Cause column shows a label and what was found, never the engine's code (kept in
    the cell's title); a cause of no known code is shown whole."""
    row, _held = damaged_channel(root)
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get(f"/channels/{row.name}/").content.decode()
    table = page.split('id="loss-records"')[1].split("</table>")[0]
    cell = table.split('class="cause"')[1].split("</td>")[0]
    assert cell.startswith(' title="gap">'), cell
    text = cell.split(">", 1)[1]
    assert "<strong>Offsets missing from the log (files gone)</strong>" in text
    assert "gap:" not in text and "offsets" in text  # what was found, without the code


def test_the_codes_of_the_log_layers_losses_have_labels() -> None:
    assert {recovery.TRUNCATED, recovery.DAMAGE_SPLIT, recovery.GAP,
            recovery.LOG_END_MISMATCH} <= set(loss_causes.LABELS)


@pytest.mark.parametrize("cause", sorted(loss_causes.LABELS))
def test_each_label_is_plain_words_and_keeps_what_was_found(cause: str) -> None:
    shown = loss_causes.shown(f"{cause}: what was found")
    assert (shown.code, shown.detail) == (cause, "what was found")
    assert shown.label and "_" not in shown.label and cause not in shown.label


def test_a_cause_of_an_unknown_code_is_shown_whole() -> None:
    shown = loss_causes.shown("newer_code: from a newer engine")
    assert (shown.label, shown.detail, shown.code) == ("newer_code: from a newer engine", "", "")

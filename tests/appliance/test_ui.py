"""The admin UI's pages and actions through Django's test client (the browser tests in
tests/e2e drive the same pages in Chromium): login required, forms refuse with the reason
next to the field and write nothing, actions do what they say, bodies never render as HTML."""
from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone
from django.utils.html import escape
from polling import wait_for

from appliance import channels, exports
from appliance.celery import app
from appliance.models import ApiToken, Channel, ChannelSample, ExportRun, TaskRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture()
def operator(root: Path) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    return client


def put(row: Channel, bodies: list[bytes], **kwargs: object) -> None:
    with channels.open_channel(row).put() as tx:
        for body in bodies:
            tx.put(body, **kwargs)  # type: ignore[arg-type]



# The Spark job replaced at the subprocess boundary (exports.command), as in
# test_exports.py: it prints a progress line, waits until the test creates the file named
# by argv[1], then reports 10 events in 3 files over two partitions.
FAKE_JOB = """
import json, os, sys, time
print("export orders: ~5 of 10 rows (50%)", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
parts = [{"partition": 0, "files": ["a.parquet", "b.parquet"]},
         {"partition": 1, "files": ["c.parquet"]}]
print(json.dumps({"report": {"run_id": "fake-run", "output": "file:///fake/orders",
                             "rows": 10, "bytes": 2048, "partitions": parts}}), flush=True)
"""


@pytest.mark.parametrize("path", ["/", "/channels/new", "/channels/orders/",
                                  "/channels/orders/events", "/ui/status",
                                  "/channels/orders/status", "/channels/orders/delete"])
def test_every_page_needs_a_login(root: Path, path: str) -> None:
    channel_row(root)
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_a_user_who_is_not_staff_is_refused(root: Path) -> None:
    client = Client()
    client.force_login(User.objects.create_user("someone", password="pw"))
    refused = client.get("/")
    assert refused.status_code == 403
    page = refused.content.decode()
    assert "the admin UI is for staff users" in page and "someone" in page
    assert 'href="/static/weir/weir.css"' in page and 'href="/"' in page


def test_a_page_that_does_not_exist_is_a_styled_page_with_a_way_back(root: Path) -> None:
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    missing = client.get("/channels/orders/nope")
    assert missing.status_code == 404
    page = missing.content.decode()
    assert "<h1>Not found</h1>" in page and "<code>/channels/orders/nope</code>" in page
    assert 'href="/static/weir/weir.css"' in page and ">Back to the channels</a>" in page
    icon = client.get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"] == "/static/weir/favicon.svg"


@pytest.mark.parametrize("path", ["/", "/ui/status", "/channels/orders/",
                                  "/channels/orders/status", "/channels/orders/events"])
def test_a_post_to_a_page_is_405_naming_get_not_a_csrf_403(root: Path, path: str) -> None:
    channel_row(root)
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    answer = staff.post(path)
    assert answer.status_code == 405 and "GET" in answer["Allow"]
    assert Client().post(path).status_code == 405  # anonymous: the same, before the login


def _action_paths() -> list[str]:
    """Every UI action's path (the views of appliance/ui/actions.py), for channel orders:
    a new action is in the test below without being named here."""
    from appliance.ui import actions, urls

    paths = []
    for pattern in urls.urlpatterns:
        view = getattr(pattern.callback, "__wrapped__", pattern.callback)
        if getattr(view, "__module__", "") != actions.__name__ or pattern.name == "delete":
            continue  # delete: a page (GET) before its POST, checked by the page tests
        paths.append(str(pattern.pattern).replace("<str:name>", "orders")
                     .replace("<str:sub>", "default").replace("<int:pk>", "1"))
    return paths


ACTIONS = _action_paths()


@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_needs_a_staff_login_a_post_and_csrf(root: Path, action: str) -> None:
    """Nobody anonymous, nobody without staff, no GET and no forged POST does anything (the
    send-to-Kafka and export buttons queue work on a worker: the same rule)."""
    channel_row(root)
    url = f"/{action}"
    anonymous = Client().post(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/?next=")
    someone = Client()
    someone.force_login(User.objects.create_user("someone", password="pw"))
    assert someone.post(url).status_code == 403
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert staff.get(url).status_code == 405
    assert staff.post(url).status_code == 403  # no CSRF token
    row = Channel.objects.get(name="orders")
    assert not row.puts_paused and not TaskRun.objects.exists()


def test_actions_are_posts_with_csrf(root: Path) -> None:
    channel_row(root)
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert client.get("/channels/orders/checkpoint").status_code == 405
    assert client.post("/channels/orders/checkpoint").status_code == 403  # no CSRF token
    assert client.post("/channels/orders/pause").status_code == 403
    assert not Channel.objects.get(name="orders").puts_paused


def test_login_with_a_password_lands_on_the_dashboard(root: Path) -> None:
    User.objects.create_user("ops", password="pw", is_staff=True)
    client = Client()
    response = client.post("/login/", {"username": "ops", "password": "pw"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert b"No channels yet" in client.get("/").content
    bad = Client().post("/login/", {"username": "ops", "password": "wrong"})
    assert bad.status_code == 200 and b"did not match" in bad.content


def test_creating_a_channel_shows_the_error_next_to_the_field_and_writes_nothing(
        operator: Client, root: Path) -> None:
    form = {"name": "Bad Name", "partitions": 2, "capacity": 1000, "transaction_capacity": 100,
            "keep_alive_ms": 3000, "minimum_required_space": 0,
            "checkpoint_interval_ms": 30000, "checkpoint_on_close": "on",
            "durability": "fsync", "segment_bytes": 1 << 20, "segment_ms": 604800000,
            "index_interval_bytes": 4096, "retention_ms": -1, "retention_bytes": -1,
            "retention_check_interval_ms": 300000, "compression": "none",
            "export_format": "parquet", "export_path": "%Y/%m/%d/%H",
            "export_roll_rows": 1000000, "export_roll_bytes": 268435456}
    response = operator.post("/channels/new", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["name"] and "name" in str(errors["name"])
    assert not Channel.objects.exists() and not any(root.iterdir())
    form["data_dirs"] = "/elsewhere/data"
    form["name"] = "orders"
    response = operator.post("/channels/new", form)
    assert response.status_code == 400
    assert "outside WEIR_DATA_ROOT" in str(response.context["form"].errors["data_dirs"])
    assert not Channel.objects.exists()
    form["data_dirs"] = ""
    response = operator.post("/channels/new", form)
    assert response.status_code == 302 and response["Location"] == "/channels/orders/"
    row = Channel.objects.get(name="orders")
    assert row.data_dirs == [str(root / "data")] and row.partitions == 2
    assert (root / "data" / "orders-1").is_dir()
    page = operator.get("/channels/orders/").content.decode()  # a new channel: no problem
    assert "<ul class=\"problems\">" not in page and "checkpoint: missing" not in page
    assert "none: a new channel" in page


def test_a_channel_whose_home_was_wiped_shows_the_lost_state_and_the_recount(
        operator: Client, root: Path) -> None:
    """Its logs are left: their events are queued again and recounted as puts; the loss of
    its queue state is a record to acknowledge."""
    row = channel_row(root, partitions=1)
    put(row, [b"a", b"b", b"c"])
    channels.close_all()
    shutil.rmtree(root / "orders")
    assert 'id="storage-missing"' in operator.get("/channels/orders/").content.decode()
    page = operator.post("/channels/orders/recreate", follow=True).content.decode()
    assert "no valid checkpoint" in page and "queue state (checkpoints gone)" in page
    assert "Counters recounted" in page and "put_successes +3" in page


def test_a_settings_change_applies_live_or_says_why_not(operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2)
    page = operator.get("/channels/orders/")
    form = {name: value for name, value in page.context["form"].initial.items()
            if value is not None and name not in ("name", "data_dirs")}
    form = {k: ("on" if v is True else v) for k, v in form.items() if v is not False}
    form["capacity"] = 50_000
    response = operator.post("/channels/orders/settings", form)
    assert response.status_code == 302, response.context["form"].errors
    assert channels.open_channel(Channel.objects.get(pk=row.pk)).status()["capacity"] == 50_000
    form["partitions"] = 1
    response = operator.post("/channels/orders/settings", form)
    assert response.status_code == 400
    assert "cannot shrink" in str(response.context["form"].errors["partitions"])
    assert Channel.objects.get(pk=row.pk).partitions == 2


def test_the_settings_show_what_differs_from_the_defaults(operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2, export_interval_ms=60_000)
    default_capacity = Channel._meta.get_field("capacity").get_default()

    def differences() -> dict[str, tuple[str, str]]:
        html = operator.get("/channels/orders/").content.decode()
        table = re.search(r'<table class="data" id="settings-diff">(.*?)</table>', html, re.S)
        assert table, "no settings diff on the channel page"
        return {name: (value, default) for name, value, default in re.findall(
            r'<tr><td><a href="#field-(\w+)">\w+</a></td><td>(.*?)</td>'
            r'<td class="muted">(.*?)</td></tr>', table.group(1))}

    assert differences() == {"partitions": ("2", "1"), "minimum_required_space": ("0", str(
        Channel._meta.get_field("minimum_required_space").get_default())),
        "export_interval_ms": ("60000", "not set")}
    Channel.objects.filter(pk=row.pk).update(capacity=50_000, partitions=1,
                                             use_dual_checkpoints=True)
    found = differences()
    assert found["capacity"] == ("50000", str(default_capacity))
    assert found["use_dual_checkpoints"] == ("on", "off") and "partitions" not in found
    html = operator.get("/channels/orders/").content.decode()
    assert re.search(r'class="field changed" id="field-capacity">\s*<label[^>]*>capacity '
                     rf'<span class="default">\(default: {default_capacity}\)</span>', html)
    assert 'class="field" id="field-partitions"' in html  # back at its default: not marked
    assert "Changed from the defaults" in html


def test_the_channel_page_shows_segments_checkpoint_runs_and_tokens(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"x" * 100] * 10)
    channels.open_channel(row).checkpoint()
    TaskRun.objects.create(task="weir.flush_channel", channel="orders",
                           started_at="2026-11-23T10:00:00Z", duration_ms=1.5,
                           outcome=TaskRun.FAILED, error="StorageError: disk gone")
    ApiToken.issue("ingest", ["produce"], [row])
    page = operator.get("/channels/orders/")
    html = page.content.decode()
    assert page.status_code == 200
    for text in ("Segments", "Base offset", "Checkpoint", "checkpoint-sequence",
                 "StorageError: disk gone", "ingest", "Recent task runs", "Exports"):
        assert text in html, text
    part = page.context["status"]["partitions"][0]
    assert part["segment_table"][0]["records"] == 10
    status = operator.get("/channels/orders/status")
    assert status.status_code == 200 and b"<html" not in status.content


def test_checkpoint_flush_and_retention_now_record_their_runs(
        operator: Client, root: Path) -> None:
    row = channel_row(root, durability="policy", flush_ms=3_600_000, flush_messages=None)
    put(row, [b"not yet durable"] * 10)
    before = channels.open_channel(row).status()
    assert before["unflushed_events"] == 10
    for action in ("flush", "checkpoint", "retention"):
        response = operator.post(f"/channels/orders/{action}", follow=True)
        assert response.status_code == 200 and b"failed" not in response.content
        if action == "flush":  # flush now flushes, whatever flush_ms says
            assert channels.open_channel(row).status()["unflushed_events"] == 0
    after = channels.open_channel(row).status()
    assert after["checkpoint"]["sequence"] == before["checkpoint"]["sequence"] + 1
    flushed = TaskRun.objects.get(task="weir.flush_channel", channel="orders")
    assert flushed.outcome == TaskRun.OK
    tasks = set(TaskRun.objects.filter(channel="orders").values_list("task", flat=True))
    assert {"weir.checkpoint_channel", "weir.retention_channel"} <= tasks


def test_pause_refuses_puts_over_the_api_until_resumed(operator: Client, root: Path) -> None:
    channel_row(root)
    _, key = ApiToken.issue("p", ["produce"])
    produce = Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    def send() -> int:
        return produce.post("/api/v1/channels/orders/events", {"events": [{"body": "a"}]},
                            content_type="application/json").status_code

    operator.post("/channels/orders/pause")
    assert send() == 503
    operator.post("/channels/orders/resume")
    assert send() == 200


def test_verify_shows_the_engine_report_and_damage(operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"y" * 50] * 5)
    response = operator.post("/channels/orders/verify")
    assert response.status_code == 200 and response.context["report"]["ok"]
    channels.close_all()
    log = next((root / "data" / "orders-0").glob("*.log"))
    data = bytearray(log.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    log.write_bytes(bytes(data))
    response = operator.post("/channels/orders/verify")
    assert not response.context["report"]["ok"] and b"problem(s)" in response.content


def test_tokens_are_created_with_their_key_shown_once_and_revoked(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    response = operator.post("/channels/orders/tokens", {"name": "loader", "roles": ["consume"]})
    key = response.context["key"]
    token = ApiToken.objects.get(name="loader")
    assert token.roles == ["consume"] and list(token.channels.all()) == [row]
    assert key.encode() in response.content and key.encode() not in \
        operator.get("/channels/orders/").content
    operator.post(f"/channels/orders/tokens/{token.pk}/revoke")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    refused = operator.post("/channels/orders/tokens", {"name": "", "roles": ["root"]},
                            follow=True)
    assert b"Token not created" in refused.content and ApiToken.objects.count() == 1


def test_delete_asks_for_the_name_and_force_while_events_are_untaken(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"z"])
    assert operator.get("/channels/orders/delete").status_code == 200
    assert operator.post("/channels/orders/delete", {"confirm_name": "nope"}).status_code == 409
    refused = operator.post("/channels/orders/delete", {"confirm_name": "orders"})
    assert refused.status_code == 409 and b"untaken events" in refused.content
    assert Channel.objects.filter(pk=row.pk).exists() and (root / "data" / "orders-0").exists()
    done = operator.post("/channels/orders/delete", {"confirm_name": "orders", "force": "on"})
    assert done.status_code == 302 and not Channel.objects.exists()
    assert not (root / "data" / "orders-0").exists() and not (root / "orders").exists()


def test_the_event_browser_reads_by_offset_and_by_time_and_escapes_bodies(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"<script>alert(1)</script>", b"\x00\x01\xffbinary", b"plain text"])
    page = operator.get("/channels/orders/events?partition=0&offset=0")
    html = page.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "00 01 ff 62" in html  # the binary body as hex
    assert [e["event"].offset for e in page.context["events"]] == [0, 1, 2]
    stamp = page.context["events"][1]["event"].timestamp
    by_time = operator.get(f"/channels/orders/events?partition=0&time={stamp}")
    assert by_time.context["found_offset"] in (0, 1, 2)
    assert operator.get("/channels/orders/events?partition=0&offset=x").status_code == 400
    assert operator.get("/channels/orders/events?partition=9&offset=0").status_code == 400
    assert operator.get("/channels/orders/events?partition=0&time=yesterday").status_code == 400
    assert operator.get("/channels/orders/events?partition=0&offset=99").status_code == 416


def test_the_event_browser_opens_on_the_latest_events_of_every_partition(
        operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=3)
    for i in range(9):  # keyless: each transaction goes to the next partition
        put(row, [f"e{i}".encode()], timestamp=1_000 + i)
    page = operator.get("/channels/orders/events")
    assert page.status_code == 200
    shown = [e["event"] for e in page.context["events"]]
    assert [e.body for e in shown] == [f"e{i}".encode() for i in range(8, -1, -1)]
    assert {e.partition for e in shown} == {0, 1, 2}
    html = page.content.decode()
    assert (f'data-partition="{shown[0].partition}" data-offset="{shown[0].offset}"' in html
            and 'id="search-older"' not in html)
    assert page.context["scan"]["done"] == page.context["scan"]["total"] == 9


def count_engine_calls(monkeypatch: pytest.MonkeyPatch, channel: object,
                       *names: str) -> dict[str, int]:
    """Count the calls of the engine channel's methods `names` (still answered)."""
    asked = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(channel, name)

        def counting(*args: object, _name: str = name, _real: Any = real,
                     **kwargs: object) -> object:
            asked[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(channel, name, counting)
    return asked


def test_a_browser_search_and_tail_ask_the_engine_for_offsets_not_its_status(
        operator: Client, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root, partitions=2)
    put(row, [b"e"], timestamp=1_000)
    asked = count_engine_calls(monkeypatch, channels.open_channel(row), "status",
                               "list_offsets")
    assert operator.get("/channels/orders/events?contains=e").status_code == 200
    assert asked == {"status": 0, "list_offsets": 1}
    tail = operator.get("/channels/orders/events/tail?after=0:0,1:0&contains=e")
    assert tail.status_code == 200 and tail["X-Weir-After"]
    assert asked == {"status": 0, "list_offsets": 2}


def test_the_event_browser_pages_older_events_with_a_cursor(
        operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2)
    for i in range(60):
        put(row, [f"e{i}".encode()], timestamp=1_000 + i)
    first = operator.get("/channels/orders/events")
    assert [e["event"].body for e in first.context["events"]][:2] == [b"e59", b"e58"]
    assert len(first.context["events"]) == 50 and first.context["older"]
    older = operator.get(f"/channels/orders/events?{first.context['older']}")
    assert [e["event"].body for e in older.context["events"]] == [
        f"e{i}".encode() for i in range(9, -1, -1)]
    assert older.context["scan"]["done"] == 60 and "older" not in older.context
    bad = operator.get("/channels/orders/events?regex=(&limit=0")
    assert bad.status_code == 400
    assert "not an RE2 regular expression" in bad.context["errors"]["regex"]
    assert "Hits per page: a whole number from 1 to 50" in bad.content.decode()
    assert operator.get("/channels/orders/events?limit=51").status_code == 400
    assert operator.get("/channels/orders/events/tail?after=0:0&limit=51").status_code == 400


def test_a_search_step_answers_its_hits_and_how_far_the_search_is(
        operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2)
    for i in range(30):
        put(row, [f"{'hit' if i in (3, 27) else 'miss'} {i}".encode()], timestamp=1_000 + i)
    step = "/channels/orders/events/step?contains=hit&scan_limit=10&budget_ms=5000"
    first = operator.get(step)
    assert first.status_code == 200
    assert [e["event"].body for e in first.context["events"]] == [b"hit 27"]
    assert (first["X-Weir-Scanned"], first["X-Weir-Total"]) == ("10", "30")
    assert first["X-Weir-Stopped"] == "scan_limit" and first["X-Weir-Cursor"]
    assert first["X-Weir-After"] == "0:15,1:15"  # a tail of the search starts at the ends
    second = operator.get(f"{step}&cursor={first['X-Weir-Cursor']}")
    assert not second.context["events"] and second["X-Weir-Scanned"] == "20"
    last = operator.get(f"{step}&cursor={second['X-Weir-Cursor']}")
    assert [e["event"].body for e in last.context["events"]] == [b"hit 3"]
    assert last["X-Weir-Scanned"] == "30"
    assert (last["X-Weir-Cursor"], last["X-Weir-Stopped"]) == ("", "")
    bad = operator.get("/channels/orders/events/step?regex=(&limit=51")
    assert bad.status_code == 400
    assert "regex: not an RE2 regular expression" in bad.content.decode()
    assert "limit: a whole number from 1 to 50" in bad.content.decode()
    assert operator.get("/channels/nope/events/step").status_code == 404
    assert Client().get(step).status_code == 302  # to the login page, as every UI page
    form = operator.get("/channels/orders/events").content.decode()
    assert 'data-step="/channels/orders/events/step"' in form and 'id="search-live"' in form


def test_an_event_body_downloads_raw_and_a_missing_event_is_a_404(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"\x00\xffraw", b'{"a": [1]}'])
    done = operator.get("/channels/orders/events/0/0")
    assert done.status_code == 200 and done.content == b"\x00\xffraw"
    assert done["Content-Type"] == "application/octet-stream"
    assert done["Content-Disposition"] == 'attachment; filename="orders-0-0.bin"'
    for path in ("/channels/orders/events/0/2", "/channels/orders/events/1/0",
                 "/channels/orders/events/0/99999", "/channels/nope/events/0/0"):
        assert operator.get(path).status_code == 404, path
    html = operator.get("/channels/orders/events").content.decode()
    assert 'data-view="json"' in html and 'data-view="hex"' in html
    assert 'href="/channels/orders/events/0/1" download' in html


def test_the_live_tail_answers_rows_after_the_page_positions(
        operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2)
    put(row, [b"old"])
    page = operator.get("/channels/orders/events?contains=new")
    after = page.context["tail_after"]
    assert page.context["tail_query"] == "contains=new" and "data-tail=" in page.content.decode()
    nothing = operator.get(f"/channels/orders/events/tail?contains=new&after={after}")
    assert nothing.status_code == 200 and not nothing.content.strip()
    assert nothing["X-Weir-After"] == after
    put(row, [b"new 1"])
    put(row, [b"not this"])
    put(row, [b"new 2"])
    tail = operator.get(f"/channels/orders/events/tail?contains=new&after={after}")
    assert [e["event"].body for e in tail.context["events"]] == [b"new 2", b"new 1"]
    moved = tail["X-Weir-After"]
    assert sum(int(p.split(":")[1]) for p in moved.split(",")) == 4
    again = operator.get(f"/channels/orders/events/tail?contains=new&after={moved}")
    assert not again.content.strip()
    assert operator.get("/channels/orders/events/tail").status_code == 400
    assert operator.get("/channels/orders/events/tail?after=x").status_code == 400
    older = operator.get(f"/channels/orders/events?cursor={after}")
    assert "tail_after" not in older.context  # only the newest page tails


def test_a_test_event_is_produced_from_the_ui_through_the_api_path(
        operator: Client, root: Path) -> None:
    row = channel_row(root, partitions=2)
    done = operator.post("/channels/orders/produce", {
        "key": "order-7", "headers": "source:ui\r\n\r\ntrace: a:b \r\n",
        "body": '{"n": 7,\r\n "s": "x"}'})
    assert done.status_code == 302 and done["Location"] == "/channels/orders/events"
    page = operator.get("/channels/orders/events")
    [shown] = page.context["events"]
    assert f"Event produced to partition {shown['event'].partition} at offset 0" in \
        page.content.decode()
    [event] = channels.open_channel(row).read(shown["event"].partition, 0, 10)
    assert (event.key, event.headers, event.body) == (
        b"order-7", {"source": b"ui", "trace": b" a:b "}, b'{"n": 7,\n "s": "x"}')


@pytest.mark.parametrize(("form", "field", "status", "says"), [
    ({"headers": "no colon here", "body": "x"}, "headers", 400, "line 1 is not name:value"),
    ({"headers": f"{'h' * 1025}:v", "body": "x"}, "headers", 400, "1024 bytes"),
    ({"key": "k", "body": "x", "paused": "1"}, "body", 503, "paused by an operator"),
])
def test_a_refused_test_event_writes_nothing_and_says_why_next_to_the_field(
        operator: Client, root: Path, form: dict[str, str], field: str, status: int,
        says: str) -> None:
    row = channel_row(root, puts_paused=bool(form.pop("paused", "")))
    refused = operator.post("/channels/orders/produce", form)
    assert refused.status_code == status
    assert says in refused.context["produce_errors"][field]
    assert f'id="produce-error-{field}"' in refused.content.decode()
    assert refused.context["produce"]["body"] == "x"  # the form comes back filled in
    assert channels.open_channel(row).status()["partitions"][0]["log_end_offset"] == 0


def test_producing_from_the_ui_needs_staff_a_post_and_csrf(root: Path) -> None:
    channel_row(root)
    plain = Client()
    plain.force_login(User.objects.create_user("someone", password="pw"))
    assert plain.post("/channels/orders/produce", {"body": "x"}).status_code == 403
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert staff.post("/channels/orders/produce", {"body": "x"}).status_code == 403
    assert staff.get("/channels/orders/produce").status_code == 405


def test_the_dashboard_shows_counts_rates_and_health(operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"e"] * 7)
    from django.utils import timezone
    now = timezone.now()
    for seconds, puts in ((-20, 0), (-10, 100), (0, 300)):
        ChannelSample.objects.create(channel="orders", at=now + timezone.timedelta(seconds=seconds),
                                     events_untaken=0, events_in_flight=0, put_successes=puts,
                                     take_successes=0, unflushed_events=0, bytes_on_disk=0)
    page = operator.get("/")
    line = page.context["lines"][0]
    assert line["status"]["events_queued"] == 7 and line["charts"]["put_rate"] == 20.0
    assert b"healthy" in page.content and b"<polyline" in page.content
    assert operator.get("/ui/status").status_code == 200


def export_rows(html: str) -> dict[str, str]:
    """The export runs table's rows by their outcome (the first of each)."""
    rows: dict[str, str] = {}
    for row in re.findall(r'<tr class="export-run.*?</tr>', html, re.S):
        rows.setdefault(re.search(r'data-outcome="(\w+)"', row).group(1), row)  # type: ignore[union-attr]
    return rows


def test_export_now_queues_an_export_whose_progress_shows_until_it_is_done(
        worker: None, operator: Client, root: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    row = channel_row(root, partitions=2)
    put(row, [b"e"] * 10)
    gate = tmp_path / "finish"
    monkeypatch.setattr(exports, "command",
                        lambda row: [sys.executable, "-c", FAKE_JOB, str(gate)])
    response = operator.post("/channels/orders/export", follow=True)
    assert b"Export queued; its progress shows under Exports." in response.content
    wait_for(lambda: ExportRun.objects.filter(progress__contains="(50%)").exists(), 30,
             "the worker ran the export and its progress line was recorded")
    running = export_rows(operator.get("/channels/orders/status").content.decode())["running"]
    assert '<progress max="100" value="50"></progress>' in running
    assert "export orders: ~5 of 10 rows (50%)" in running
    gate.touch()
    wait_for(lambda: ExportRun.objects.filter(outcome=ExportRun.OK).exists(), 30,
             "the export finished")
    done = export_rows(operator.get("/channels/orders/").content.decode())
    assert list(done) == ["ok"] and "<progress" not in done["ok"]
    assert '<td class="n rows">10</td>' in done["ok"] and '<td class="n files">3</td>' in done["ok"]
    assert "file:///fake/orders" in done["ok"] and "exported 10 events" in done["ok"]
    run = wait_for(lambda: TaskRun.objects.filter(task="weir.export_channel",
                                                  outcome=TaskRun.OK).first(), 10,
                   "the task recorded its run")
    assert run.channel == "orders" and run.detail["rows"] == 10


def test_export_now_says_so_when_the_broker_is_unreachable(
        operator: Client, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel_row(root)
    # a producer pool on a port nothing listens on: kombu's own connection error
    monkeypatch.setattr(app.conf, "broker_write_url", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(app.amqp, "_producer_pool", None)
    response = operator.post("/channels/orders/export", follow=True)
    assert response.status_code == 200
    message = [str(m) for m in response.context["messages"]]
    assert len(message) == 1 and message[0].startswith(
        "Export not queued: the broker is unreachable (") and "127.0.0.1:1" in message[0]
    assert not ExportRun.objects.exists()


def test_the_exports_table_shows_progress_while_running_and_the_outcome_after(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"e"])
    now = timezone.now()
    ExportRun.objects.create(channel="orders", started_at=now - timezone.timedelta(hours=2),
                             outcome=ExportRun.OK, rows=1234, bytes=4096, duration_s=12.5,
                             output="file:///export/orders", progress="exported 1,234 events",
                             partitions=[{"partition": 0, "files": ["x", "y"]},
                                         {"partition": 1, "files": ["z"]}])
    ExportRun.objects.create(channel="orders", started_at=now - timezone.timedelta(hours=1),
                             outcome=ExportRun.FAILED, duration_s=3.0,
                             error="the export job exited with 1: no space left on device")
    ExportRun.objects.create(channel="orders", started_at=now,
                             progress="export orders: writing 300 events (p0 [0, 300))")
    ExportRun.objects.create(channel="payments", started_at=now, outcome=ExportRun.FAILED,
                             error="not this channel's")
    html = operator.get("/channels/orders/").content.decode()
    rows = export_rows(html)
    assert list(rows) == ["running", "failed", "ok"]  # newest first
    assert "<progress max=\"100\"></progress> export orders: writing 300 events" in \
        rows["running"]  # no share in the line: the bar says work goes on, not how much
    assert '<td class="n rows">1,234</td>' in rows["ok"]
    assert '<td class="n files">3</td>' in rows["ok"] and "4.0 KiB" in rows["ok"]
    assert "file:///export/orders" in rows["ok"] and "12.5 s" in rows["ok"]
    assert "outcome-failed" in rows["failed"] and "<progress" not in rows["failed"]
    assert "no space left on device" in rows["failed"]
    assert "not this channel" not in html


def test_the_dashboard_shows_export_lag(operator: Client, root: Path) -> None:
    row = channel_row(root, export_interval_ms=60_000)
    channels.open_channel(row).add_subscription("export")  # as a create that schedules it
    channel_row(root, name="quiet")  # never exported: no lag to show
    hour_and_half_ago = int(time.time() * 1000) - 90 * 60_000
    put(row, [b"old"] * 4, timestamp=hour_and_half_ago)
    put(row, [b"new"] * 3)
    with channels.open_channel(row).take() as tx:  # an HTTP consumer's, on default
        tx.take(7)
    ExportRun.objects.create(channel="orders", started_at=timezone.now(),
                             progress="starting Spark")
    page = operator.get("/")
    lines = {line["row"].name: line for line in page.context["lines"]}
    assert lines["orders"]["export"]["events"] == 7 and lines["quiet"]["export"] is None
    cells = dict(re.findall(r'<tr data-channel="(\w+)">.*?<td class="export-lag">(.*?)</td>',
                            page.content.decode(), re.S))
    assert cells["orders"].startswith("7 events, oldest 90 min")
    assert '<span class="badge running">exporting</span>' in cells["orders"]
    assert "no export" in cells["quiet"]
    ExportRun.objects.update(outcome=ExportRun.OK)
    cell = re.search(r'<tr data-channel="orders">.*?<td class="export-lag">(.*?)</td>',
                     operator.get("/ui/status").content.decode(), re.S)
    assert cell and "exporting" not in cell.group(1) and "7 events" in cell.group(1)


def test_delete_shows_why_a_channel_cannot_be_opened_and_deletes_it_only_when_forced(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    put(row, [b"z"] * 3)
    channels.close_all()
    partition = root / "data" / "orders-0"
    shutil.rmtree(partition)
    partition.write_text("a file where the partition's directory was")  # the open fails
    page = operator.get("/channels/orders/delete")
    assert page.status_code == 200 and page.context["untaken"] is None
    reason = page.context["unreadable"]
    # not the directory it was: refused as missing storage (appliance/channels.py), naming it
    assert "storage is missing" in reason and str(partition) in reason
    assert escape(reason) in page.content.decode() and b"cannot be counted" in page.content
    refused = operator.post("/channels/orders/delete", {"confirm_name": "orders"})
    assert refused.status_code == 409 and b"tick the box to delete it anyway" in refused.content
    assert Channel.objects.filter(pk=row.pk).exists() and (root / "orders").is_dir()
    done = operator.post("/channels/orders/delete", {"confirm_name": "orders", "force": "on"})
    assert done.status_code == 302 and done["Location"] == "/"
    assert not Channel.objects.exists()
    assert not partition.exists() and not (root / "orders").exists()
    assert b"cannot be opened" not in operator.get("/").content


def test_the_pages_of_a_channel_outside_the_data_roots_say_so(
        operator: Client, root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    row = channel_row(root)
    put(row, [b"z"])
    channels.close_all()
    with override_settings(WEIR_DATA_ROOTS=[tmp_path_factory.mktemp("elsewhere")]):
        assert b"outside WEIR_DATA_ROOT" in operator.get("/").content
        assert b"outside WEIR_DATA_ROOT" in operator.get("/channels/orders/").content
        page = operator.get("/channels/orders/delete")
        assert page.status_code == 200 and "outside WEIR_DATA_ROOT" in page.context["unreadable"]
        forced = operator.post("/channels/orders/delete",
                               {"confirm_name": "orders", "force": "on"})
        assert forced.status_code == 409 and b"not deleted: " in forced.content
    assert Channel.objects.filter(pk=row.pk).exists() and (root / "data" / "orders-0").is_dir()


def segment_cells(html: str, css: str) -> list[str]:
    """The cells of one column of the segment tables, in order."""
    section = html[html.index('<section id="segments">'):html.index('<section id="checkpoint')]
    return re.findall(rf'<td class="{css}">(.*?)</td>', section)


def test_the_segment_table_names_its_timestamps_for_what_they_are(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    start = 1_795_000_000_000  # 2026-11-18 11:06:40 UTC
    put(row, [b"a"], timestamp=start + 5_000)  # the first batch: its max is its only event
    put(row, [b"b"], timestamp=start)  # an earlier timestamp, in a later batch
    put(row, [b"c"], timestamp=start + 60_000)
    html = operator.get("/channels/orders/").content.decode()
    assert ">First batch max ts</th>" in html and ">Max timestamp</th>" in html
    assert "First timestamp" not in html and "Last timestamp" not in html
    assert segment_cells(html, "first-batch-ts") == ["2026-11-18 11:06:45 UTC"]
    assert segment_cells(html, "max-ts") == ["2026-11-18 11:07:40 UTC"]


@pytest.mark.parametrize("preallocate", [False, True])
def test_sealed_segments_read_trimmed_only_when_the_channel_preallocates(
        operator: Client, root: Path, preallocate: bool) -> None:
    row = channel_row(root, segment_bytes=4096, preallocate=preallocate)
    for i in range(60):  # ~200 bytes a batch, ~20 a segment: three segments
        put(row, [b"%03d" % i + b"x" * 120])
    segments = channels.open_channel(row).status(segments=True)["partitions"][0][
        "segment_table"]
    assert len(segments) >= 3
    cells = segment_cells(operator.get("/channels/orders/").content.decode(), "preallocation")
    if preallocate:  # sealed segments are cut to their length, the active one is not yet
        assert cells == ["trimmed"] * (len(segments) - 1) + ["preallocated"]
    else:  # fsync durability keeps zeros written ahead of the active one's appends only
        assert cells == ["—"] * (len(segments) - 1) + ["preallocated"]


# Stored by an older version or the engine's CLI: outside the range produce now accepts.
ODD_TIMESTAMPS = [2**63 - 1, 253_402_300_800_000, 0]


def test_it_renders_every_page_for_events_stored_outside_the_timestamp_range(
        operator: Client, root: Path) -> None:
    row = channel_row(root)
    for stamp in ODD_TIMESTAMPS:
        put(row, [f"at {stamp}".encode()], timestamp=stamp)
    for path in ("/", "/ui/status", "/channels/orders/", "/channels/orders/status",
                 "/channels/orders/events?partition=0&offset=0",
                 "/channels/orders/events?partition=0&time=9999-12-31T23:59:59"):
        page = operator.get(path)
        assert page.status_code == 200, path
    html = operator.get("/channels/orders/events?partition=0&offset=0").content.decode()
    assert f"{2**63 - 1} ms (no date)" in html and "1970-01-01 00:00:00 UTC" in html


@pytest.mark.parametrize("query", [
    "partition=99999999999999999999999", "partition=0&offset=99999999999999999999999",
    "partition=0&offset=9223372036854775808", "partition=0&offset=²",
    "partition=0&time=99999999999999999999999",
    "partition=0&time=1969-12-31T00:00:00"])
def test_it_refuses_out_of_range_integers_in_the_event_browser_with_400(
        operator: Client, root: Path, query: str) -> None:
    channel_row(root)
    assert operator.get(f"/channels/orders/events?{query}").status_code == 400


def test_it_answers_404_for_a_token_id_past_int64(operator: Client, root: Path) -> None:
    channel_row(root)
    assert operator.post(f"/channels/orders/tokens/{2**64}/revoke").status_code == 404


def test_every_channel_tokens_are_listed_on_the_dashboard_and_revocable(root: Path) -> None:
    scoped_row = channel_row(root)
    everywhere, _ = ApiToken.issue("shipper", ["produce"])
    scoped, _ = ApiToken.issue("one", ["consume"], [scoped_row])
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get("/").content.decode()
    assert f'data-token="{everywhere.prefix}"' in page
    assert f'data-token="{scoped.prefix}"' not in page  # on its channel's page
    assert client.post(f"/tokens/{scoped.pk}/revoke").status_code == 404
    done = client.post(f"/tokens/{everywhere.pk}/revoke", follow=True)
    assert b"revoked on every channel" in done.content
    everywhere.refresh_from_db()
    assert everywhere.revoked_at is not None


def test_the_django_admin_shows_channels_and_tokens_and_revokes_tokens(root: Path) -> None:
    channel_row(root)
    token, _ = ApiToken.issue("shipper", ["produce"])
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert b"orders" in client.get("/admin/appliance/channel/").content
    listing = client.get("/admin/appliance/apitoken/")
    assert listing.status_code == 200 and token.prefix.encode() in listing.content
    shown = client.get(f"/admin/appliance/apitoken/{token.pk}/change/").content
    assert b"key_hash" not in shown and token.key_hash.encode() not in shown
    probe = client.get(f"/admin/appliance/apitoken/?key_hash__startswith={token.key_hash[:2]}")
    assert probe.status_code in (302, 400) and token.prefix.encode() not in probe.content
    assert client.get("/admin/appliance/channel/add/").status_code == 403  # not here
    client.post("/admin/appliance/apitoken/", {"action": "revoke",
                                               "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None


@pytest.mark.parametrize("path", ["/", "/channels/new", "/channels/orders/",
                                  "/channels/orders/events", "/channels/orders/status"])
def test_pages_speak_the_operators_language(root: Path, path: str, settings: Any) -> None:
    """No environment variable, Python call, Python None or power expression in what a page
    says (its text and help texts, outside its markup)."""
    settings.WEIR_KAFKA_BOOTSTRAP = "kafka1:9092"
    channel_row(root, kafka_topic="orders")  # the Kafka panel: the default cluster's wording
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    html = client.get(path).content.decode()
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    for internal in (r"\bWEIR_[A-Z_]+", r"\w\(\)", r"\bNone\b", r"\d\*\*\d"):
        assert not re.search(internal, text), (internal, re.search(internal, text))

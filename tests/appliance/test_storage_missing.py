"""Storage that vanished: a channel whose files are missing (a volume not mounted, a
directory removed) is never made again by itself. Every use answers 503
channel-storage-missing naming the paths, nothing is written where its files belong, the
list and the pages say unhealthy and what to do; a volume mounted back brings the channel
back as it was; only the operator's recreate (API, UI, manage.py) makes it again, empty,
recording the loss in the loss ledger."""
from __future__ import annotations

import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import problem, token_client, two_volume_channel
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import Channel
from channel_engine import Channel as EngineChannel
from channel_engine import ChannelEngineError, ChannelGoneError, LogDirectoryError

pytestmark = pytest.mark.django_db
EVENTS = "/api/v1/channels/orders/events"


def two_volumes(root: Path) -> Channel:
    """A channel over two data dirs (two volumes) with 4 events, as a restart leaves it."""
    return two_volume_channel(root, 4)


def unmount(path: Path, aside: Path) -> None:
    """The volume at `path` goes away (its files kept aside, to be mounted back)."""
    shutil.move(path, aside)


def test_missing_storage_refuses_puts_and_takes_and_writes_nothing(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    unmount(root / "a", root / "a-away")
    put = token_client("produce").post(EVENTS, {"events": [{"body": "x"}]}, format="json")
    body = problem(put, 503, "channel-storage-missing")
    assert body["paths"] == [str(root / "orders"), str(root / "a" / "orders-0")]
    assert "mount the volume back" in body["detail"].lower()
    take = token_client("consume").post("/api/v1/channels/orders/takes", {"max_events": 1},
                                        format="json")
    problem(take, 503, "channel-storage-missing")
    search = token_client("admin").get(EVENTS)
    problem(search, 503, "channel-storage-missing")
    # nothing made where the channel's files belong: the volume can come back to its place
    assert not (root / "orders").exists() and not (root / "a").exists()
    assert sorted(p.name for p in (root / "b").iterdir()) == ["orders-1"]


def test_a_change_of_a_channel_whose_files_are_missing_is_refused(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    changed = token_client("admin").patch("/api/v1/channels/orders", {"capacity": 50_000},
                                          format="json")
    assert problem(changed, 503, "channel-storage-missing")["paths"] == [str(root / "orders")]
    assert not (root / "orders").exists()
    assert Channel.objects.get(name="orders").capacity != 50_000


def test_the_list_and_pages_say_unhealthy_and_what_to_do(root: Path) -> None:
    two_volumes(root)
    unmount(root / "b", root / "b-away")  # one of two data dirs: the other is intact
    listed = token_client("admin").get("/api/v1/channels").json()["channels"][0]
    assert listed["health"] == "unhealthy" and listed["events_untaken"] is None
    assert f"storage is missing: {root / 'b' / 'orders-1'}" in listed["health_reason"]
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = operator.get("/channels/orders/").content.decode()
    assert 'id="storage-missing"' in page and str(root / "b" / "orders-1") in page
    assert "Mount the volume back" in page and 'id="recreate-channel"' in page
    assert "data-confirm=" in page.split('id="storage-missing"')[1]
    dashboard = operator.get("/").content.decode()
    assert "its storage is missing:" in dashboard and str(root / "b" / "orders-1") in dashboard
    assert not (root / "b").exists()


def test_a_volume_mounted_back_brings_the_channel_back_as_it_was(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    unmount(root / "a", root / "a-away")
    admin = token_client("admin")
    problem(admin.get("/api/v1/channels/orders"), 503, "channel-storage-missing")
    shutil.move(root / "home-away", root / "orders")
    shutil.move(root / "a-away", root / "a")
    status = admin.get("/api/v1/channels/orders").json()["status"]
    assert (status["health"], status["events_untaken"]) == ("healthy", 4)
    assert status["losses"]["records"] == []


def recreate_and_check(admin: APIClient, root: Path) -> None:
    recreated = admin.post("/api/v1/channels/orders/recreate")
    assert recreated.status_code == 200, recreated.content
    body = recreated.json()
    assert body["recreated"] == [str(root / "orders"), str(root / "a" / "orders-0")]
    status = body["status"]
    assert status["health"] == "degraded", status  # the loss is recorded, not hidden
    assert [r["partition"] for r in status["losses"]["records"]] == [-3]
    assert (root / "orders" / "channel.json").is_file() and (root / "a" / "orders-0").is_dir()


def test_the_operators_recreate_makes_it_empty_and_records_the_loss(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    unmount(root / "a", root / "a-away")
    admin = token_client("admin")
    problem(token_client("produce").post("/api/v1/channels/orders/recreate"), 403,
            "permission-denied")
    recreate_and_check(admin, root)
    put = token_client("produce").post(EVENTS, {"events": [{"body": "x"}]}, format="json")
    assert put.status_code == 200, put.content
    again = admin.post("/api/v1/channels/orders/recreate")
    assert "nothing to recreate" in problem(again, 409, "channel-conflict")["detail"]
    channels.close_all()  # the record outlives a restart
    assert admin.get("/api/v1/channels/orders").json()["status"]["health"] == "degraded"


def test_an_emptied_partition_directory_is_missing_until_the_operators_recreate(
        root: Path) -> None:
    """The directory made again empty by someone (or a volume's mount point with the
    volume not mounted) is no partition: never taken for the original one going on."""
    two_volumes(root)
    partition = root / "a" / "orders-0"
    unmount(partition, root / "a-away")
    partition.mkdir()
    put = token_client("produce").post(EVENTS, {"events": [{"body": "x"}]}, format="json")
    assert problem(put, 503, "channel-storage-missing")["paths"] == [str(partition)]
    assert list(partition.iterdir()) == []  # nothing written into it
    admin = token_client("admin")
    recreated = admin.post("/api/v1/channels/orders/recreate")
    assert recreated.status_code == 200, recreated.content
    assert recreated.json()["recreated"] == [str(partition)]
    assert (partition / "incarnation").is_file()  # a new incarnation, not the original
    put = token_client("produce").post(EVENTS, {"events": [{"body": "x"}]}, format="json")
    assert put.status_code == 200, put.content


def test_the_ui_recreates_it_on_the_operators_word(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert operator.get("/channels/orders/recreate").status_code == 405
    done = operator.post("/channels/orders/recreate", follow=True)
    page = done.content.decode()
    assert "recreated empty" in page and "queue state (checkpoints gone)" in page
    assert 'id="storage-missing"' not in page
    again = operator.post("/channels/orders/recreate", follow=True).content.decode()
    assert "nothing to recreate" in again


def test_manage_py_recreate_channel_tells_then_recreates_on_yes(root: Path) -> None:
    two_volumes(root)
    unmount(root / "orders", root / "home-away")
    unmount(root / "a", root / "a-away")
    out = StringIO()
    call_command("recreate_channel", "orders", stdout=out)
    assert str(root / "orders") in out.getvalue() and "--yes" in out.getvalue()
    assert not (root / "orders").exists()  # only told
    call_command("recreate_channel", "orders", "--yes", stdout=out)
    assert "loss is recorded" in out.getvalue()
    recreate_and_check_status(root)
    with pytest.raises(CommandError, match="nothing to recreate"):
        call_command("recreate_channel", "orders", "--yes", stdout=StringIO())
    with pytest.raises(CommandError, match="no channel 'nope'"):
        call_command("recreate_channel", "nope")


def recreate_and_check_status(root: Path) -> None:
    status = token_client("admin").get("/api/v1/channels/orders").json()["status"]
    assert status["health"] == "degraded"
    assert [r["partition"] for r in status["losses"]["records"]] == [-3]


def test_storage_that_goes_under_an_open_channel_is_refused_the_same_way(root: Path) -> None:
    two_volumes(root)
    produce = token_client("produce")
    assert produce.post(EVENTS, {"events": [{"body": "x"}]}, format="json").status_code == 200
    unmount(root / "orders", root / "home-away")  # while this process owns the channel
    unmount(root / "a", root / "a-away")
    events = {"events": [{"body": "y", "key": str(i)} for i in range(4)]}  # both partitions
    answers = [produce.post(EVENTS, events, format="json") for _ in range(3)]
    for answer in answers:
        assert problem(answer, 503, "channel-storage-missing")["paths"] == [
            str(root / "orders"), str(root / "a" / "orders-0")]
    assert not (root / "orders").exists() and not (root / "a").exists()


def test_recreating_a_lost_data_dir_counts_the_events_it_held_as_lost(root: Path) -> None:
    two_volumes(root)
    admin = token_client("admin")
    held = {p["partition"]: p["log_end_offset"]
            for p in admin.get("/api/v1/channels/orders").json()["status"]["partitions"]}
    assert held[1] > 0, held
    channels.close_all()
    unmount(root / "b", root / "b-away")  # partition 1's volume; the home is intact
    recreated = admin.post("/api/v1/channels/orders/recreate").json()
    assert recreated["recreated"] == [str(root / "b" / "orders-1")]
    status = recreated["status"]
    assert status["health"] == "degraded", status
    assert status["losses"]["events_lost"] == held[1]
    assert {r["partition"] for r in status["losses"]["records"]} == {1}
    assert status["events_untaken"] == 4 - held[1]  # partition 0's, intact, all still there


# -- an engine error on this process's handle ------------------------------------------------
def _take_fails_with(monkeypatch: pytest.MonkeyPatch, error: Exception) -> Any:
    """The channel's handle in this process, whose takes now raise `error`; the answer."""
    row = Channel.objects.get(name="orders")
    handle = channels.open_channel(row)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(EngineChannel, "take", failing)
    answer = token_client("consume").post("/api/v1/channels/orders/takes",
                                          {"max_events": 1}, format="json")
    monkeypatch.undo()
    return handle, answer


def test_a_channel_made_again_by_another_process_answers_retry_not_404(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row and files there, the handle's channel replaced (recreated by another process):
    503 channel-owner-changing with retry_after, the stale handle let go of."""
    two_volumes(root)
    handle, answer = _take_fails_with(monkeypatch, ChannelGoneError(
        f"{root / 'orders'}: the channel was replaced by a new one"))
    body = problem(answer, 503, "channel-owner-changing")
    assert body["retry_after"] > 0
    again = channels.open_channel(Channel.objects.get(name="orders"))
    assert again is not handle  # the next request opens the channel afresh
    assert again.status()["events_untaken"] == 4


def test_a_read_only_data_dir_keeps_the_handle(root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A LogDirectoryError where nothing is missing (EROFS, EACCES): reopening cannot help,
    so the handle is kept; the answer is the write failure, not storage missing."""
    two_volumes(root)
    handle, answer = _take_fails_with(monkeypatch, LogDirectoryError(
        root / "a" / "orders-0", "[Errno 30] Read-only file system"))
    problem(answer, 503, "channel-write-failed")
    assert channels.open_channel(Channel.objects.get(name="orders")) is handle


def test_a_data_dir_gone_under_the_handle_lets_it_go(root: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    two_volumes(root)
    opened = channels.open_channel(Channel.objects.get(name="orders"))
    unmount(root / "b", root / "b-away")  # under the open handle
    handle, answer = _take_fails_with(monkeypatch, LogDirectoryError(
        root / "b" / "orders-1", "the directory was deleted"))
    assert problem(answer, 503, "channel-storage-missing")["paths"] == [
        str(root / "b" / "orders-1")]
    assert handle is opened
    shutil.move(root / "b-away", root / "b")
    assert channels.open_channel(Channel.objects.get(name="orders")) is not handle


# -- a background task and a recreate blocked by another owner -------------------------------
def test_a_task_lets_go_of_a_channel_whose_files_vanished(root: Path) -> None:
    """A Celery worker's handle on a channel whose home went under it is let go of at the
    task's error, so it does not keep the channel open and block the recreate."""
    from appliance import tasks

    two_volumes(root)
    row = Channel.objects.get(name="orders")
    handle = channels.open_channel(row)  # the worker's handle, from an earlier task
    unmount(root / "orders", root / "home-away")
    result = tasks.checkpoint_channel.apply(args=("orders",), kwargs={"force": True})
    assert isinstance(result.result, ChannelGoneError), result.result
    with pytest.raises(channels.StorageMissing):
        channels.open_channel(row)  # not the stale handle (kept, it is returned): refused
    with pytest.raises(ChannelEngineError):
        handle.status()  # closed
    recreated = token_client("admin").post("/api/v1/channels/orders/recreate")
    assert recreated.json()["recreated"] == [str(root / "orders")], recreated.content


def test_a_recreate_blocked_by_another_owner_says_so(root: Path) -> None:
    """Another process owns the channel (here a handle outside the appliance's): the
    recreate makes nothing and says who holds it and what to do, not 'recreate'."""
    two_volumes(root)
    row = Channel.objects.get(name="orders")
    with EngineChannel.open(channels.to_config(row), create=False) as other:
        unmount(root / "b", root / "b-away")
        answer = token_client("admin").post("/api/v1/channels/orders/recreate")
        body = problem(answer, 503, "channel-storage-missing")
        assert body["paths"] == [str(root / "b" / "orders-1")]
        assert f"pid {other.status()['owner_pid']}" in body["detail"]
        assert "still has channel 'orders' open" in body["detail"]
        assert "must let go of the channel first" in body["detail"]
        assert "recreate the channel empty" not in body["detail"]
    assert not (root / "b").exists()


def test_a_delete_removes_what_a_recreate_cut_short_left(root: Path) -> None:
    """The temp directory a recreate was making the partition under when it was killed
    (before its rename into place) goes with the channel, and so can its data dir."""
    two_volumes(root)
    partition = root / "a" / "orders-0"
    unmount(partition, root / "a-away")
    left = root / "a" / "orders-0.tmp"
    left.mkdir()
    (left / "incarnation").write_bytes(b"as a recreate leaves it")
    deleted = token_client("admin").delete("/api/v1/channels/orders?force=true")
    assert deleted.status_code == 204, deleted.content
    assert not left.exists() and not (root / "a").exists()
    assert not (root / "b").exists()

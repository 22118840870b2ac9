"""Creating, changing and deleting channels over the API: files follow the record, live
changes apply, stranding changes are refused with the reason, untaken events protect a
channel from deletion unless forced."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
from appliance_helpers import problem, token_client
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from appliance import channels
from appliance.manage_channels import delete_channel
from appliance.models import Channel
from channel_engine import Channel as EngineChannel
from channel_engine import ChannelGoneError

pytestmark = pytest.mark.django_db


def admin() -> APIClient:
    return token_client("admin")


def create(client: APIClient, root: Path, **settings: object) -> object:
    body = {"name": "orders", "data_dirs": [str(root / "data")],
            "checkpoint_dir": str(root / "orders"), "minimum_required_space": 0, **settings}
    return client.post("/api/v1/channels", body, format="json")


def test_create_makes_the_files_and_refuses_bad_settings(root: Path) -> None:
    client = admin()
    bad = create(client, root, capacity=0)
    problem(bad, 400, "invalid-setting", field="capacity")
    assert not Channel.objects.exists() and not (root / "orders").exists()
    unknown = problem(create(client, root, colour="red"), 400, "invalid-setting", field="colour")
    assert unknown["errors"] == {"colour": ["unknown setting"]}
    made = create(client, root, partitions=2)
    assert made.status_code == 201, made.content
    assert (root / "orders" / "channel.json").is_file()
    assert (root / "data" / "orders-1").is_dir()
    problem(create(client, root), 409, "channel-conflict", field="name")


def test_live_changes_apply_and_stranding_ones_are_refused(root: Path) -> None:
    client = admin()
    create(client, root, partitions=2)
    changed = client.patch("/api/v1/channels/orders", {"capacity": 5_000_000}, format="json")
    assert changed.status_code == 200 and changed.json()["status"]["capacity"] == 5_000_000
    for body, field in (({"partitions": 1}, "partitions"),
                        ({"data_dirs": [str(root / "elsewhere")]}, "data_dirs"),
                        ({"transaction_capacity": 0}, "transaction_capacity")):
        response = client.patch("/api/v1/channels/orders", body, format="json")
        problem(response, 400, "invalid-setting", field=field)
    assert Channel.objects.get(name="orders").partitions == 2


def test_delete_is_refused_while_events_are_untaken_unless_forced(root: Path) -> None:
    client = admin()
    create(client, root)
    with channels.open_channel(Channel.objects.get(name="orders")).put() as tx:
        tx.put(b"still here")
    refused = client.delete("/api/v1/channels/orders")
    assert "1 untaken" in problem(refused, 409, "channel-conflict")["detail"]
    assert client.delete("/api/v1/channels/orders?force=true").status_code == 204
    assert not Channel.objects.exists()
    assert not (root / "orders").exists() and not (root / "data" / "orders-0").exists()


def test_it_answers_404_to_a_put_in_flight_across_a_delete_and_recreates_nothing(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another web worker's request has its handle, a client of this process's owner, when
    the delete closes the owner: its put must not make a new channel in the deleted one's
    place (and answer 200 for an event nobody can take)."""
    client = admin()
    assert create(client, root, partitions=2).status_code == 201
    row = Channel.objects.get(name="orders")
    assert channels.open_channel(row).role == "owner"
    in_flight = EngineChannel.open(channels.to_config(row))
    assert in_flight.role == "client"
    real_open = channels.open_channel

    def open_then_delete(opened: Channel) -> EngineChannel:
        monkeypatch.setattr(channels, "open_channel", real_open)
        delete_channel(Channel.objects.get(pk=opened.pk), force=True)
        return in_flight

    monkeypatch.setattr(channels, "open_channel", open_then_delete)
    try:
        response = token_client("produce").post(
            "/api/v1/channels/orders/events", data='{"events": [{"body": "late"}]}',
            content_type="application/json")
    finally:
        in_flight.close()
    assert "deleted" in problem(response, 404, "channel-not-found")["detail"]
    assert not Channel.objects.exists()
    assert [p for p in ("orders", "data/orders-0", "data/orders-1") if (root / p).exists()] == []


def test_a_write_racing_the_removal_leaves_nothing_that_blocks_a_re_create(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another web worker owns the deleted channel until its watcher closes it, and writes
    by path meanwhile (here: its checkpoint at close) while the delete removes the tree,
    after the removal listed the directory: nothing may be left under the channel's name,
    whose re-create would be refused as "exists and is not empty" with no row to delete."""
    client = admin()
    assert create(client, root, partitions=2).status_code == 201
    row = Channel.objects.get(name="orders")
    channels.close_channel("orders")
    other_worker = EngineChannel.open(channels.to_config(row))
    assert other_worker.role == "owner"
    with other_worker.put() as tx:
        tx.put(b"dropped by the forced delete")
    real_rmtree, written = shutil.rmtree, []

    def listed_then_written(path: str, ignore_errors: bool = False) -> None:
        listed = list(os.scandir(path))  # what rmtree saw before the write
        if not written and "channel.json" in [entry.name for entry in listed]:  # the home
            written.append(path)
            other_worker.close()  # checkpoints into the home if it is still there
        for entry in listed:
            if entry.is_dir(follow_symlinks=False):
                real_rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with contextlib.suppress(OSError):
            os.rmdir(path)

    monkeypatch.setattr(shutil, "rmtree", listed_then_written)
    assert client.delete("/api/v1/channels/orders?force=true").status_code == 204
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert written, "the home's removal was not seen"
    assert [p for p in ("orders", "data/orders-0", "data/orders-1") if (root / p).exists()] \
        == []
    assert [*root.glob(".*"), *(root / "data").glob(".*")] == []  # nothing left aside
    assert create(client, root, partitions=2).status_code == 201


def test_it_makes_no_files_for_a_channel_deleted_while_a_worker_opens_it(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker read the row and checked it exists; the delete (row and files) completes
    before its open: the open raises ChannelGoneError and makes nothing."""
    client = admin()
    assert create(client, root).status_code == 201
    row = Channel.objects.get(name="orders")
    channels.close_channel("orders")  # this worker has no handle yet
    real_deleted = channels.deleted
    checks: list[Channel] = []

    def deleted_after_check(checked: Channel) -> bool:
        if not checks:  # the check ran just before another process deleted the channel
            checks.append(checked)
            Channel.objects.filter(pk=checked.pk).delete()
            for place in ("orders", "data/orders-0"):
                shutil.rmtree(root / place)
            return False
        return real_deleted(checked)

    monkeypatch.setattr(channels, "deleted", deleted_after_check)
    with pytest.raises(ChannelGoneError, match="deleted"):
        channels.open_channel(row)
    assert not (root / "orders").exists() and not (root / "data" / "orders-0").exists()


def test_only_admins_manage_channels(root: Path) -> None:
    client = token_client("produce", "consume")
    problem(create(client, root), 403, "permission-denied")


def test_a_create_the_disk_cannot_hold_leaves_nothing_behind(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    response = create(admin(), root, preallocate=True, partitions=3)
    assert "cannot be opened" in problem(response, 503, "channel-cannot-open")["detail"]
    assert not Channel.objects.exists()
    assert not (root / "orders").exists() and not any((root / "data").glob("orders-*"))


@pytest.mark.parametrize("name", ["orders\n", "orders\r\n", "\norders", "Orders", "or ders"])
def test_it_refuses_a_name_that_matches_only_in_part(root: Path, name: str) -> None:
    refused = create(admin(), root, name=name)
    problem(refused, 400, "invalid-setting", field="name")
    assert not Channel.objects.exists()


@pytest.mark.parametrize("path", ["--conf=spark.x", "-x/%Y", "%Y/-d", "a\x00b", "a\nb",
                                  "%Y\n", "a//b", "./a", ".hidden/%Y", "a b", "s3://x/%Y",
                                  "%Q/%Y", "/abs"])
def test_it_refuses_export_paths_that_are_not_plain_relative_paths(root: Path,
                                                                  path: str) -> None:
    client = admin()
    assert create(client, root).status_code == 201
    refused = client.patch("/api/v1/channels/orders", {"export_path": path}, format="json")
    problem(refused, 400, "invalid-setting", field="export_path")
    assert Channel.objects.get().export_path == "%Y/%m/%d/%H"  # nothing saved
    problem(create(client, root, name="other", checkpoint_dir=str(root / "other"),
                   export_path=path), 400, "invalid-setting", field="export_path")


@pytest.mark.parametrize("path", ["%Y/%m/%d/%H", "year=%Y/month=%m", "events_v2.%y%j/", "a"])
def test_it_accepts_plain_export_paths(root: Path, path: str) -> None:
    client = admin()
    assert create(client, root).status_code == 201
    assert client.patch("/api/v1/channels/orders", {"export_path": path}, format="json"
                        ).status_code == 200


def test_a_new_channel_shows_no_recovery_problem_and_a_wiped_one_is_not_healthy(
        root: Path) -> None:
    """The create is the creator's word (Channel.create): the new channel has a checkpoint at
    once and nothing to report. A channel whose home and data are wiped (its volume lost)
    is made again by the next use, and reports the loss of its state until acknowledged."""
    client = admin()
    assert create(client, root, partitions=2).status_code == 201
    status = client.get("/api/v1/channels/orders").json()["status"]
    assert status["recovery"]["problems"] == [] and status["recovery"]["created"]
    assert (status["health"], status["losses"]["records"]) == ("healthy", [])
    assert (root / "orders" / "checkpoint").is_file()
    channels.close_all()  # a restart: the next open finds the checkpoint
    status = client.get("/api/v1/channels/orders").json()["status"]
    assert (status["recovery"]["problems"], status["health"]) == ([], "healthy")
    produced = client.post("/api/v1/channels/orders/events",
                           {"events": [{"body": "a"}, {"body": "b"}]}, format="json")
    assert produced.status_code == 200, produced.content
    channels.close_all()
    shutil.rmtree(root / "orders")
    shutil.rmtree(root / "data")
    # never made again by itself (test_storage_missing.py): the operator's recreate
    problem(client.get("/api/v1/channels/orders"), 503, "channel-storage-missing")
    assert client.post("/api/v1/channels/orders/recreate").status_code == 200
    status = client.get("/api/v1/channels/orders").json()["status"]
    assert any("no valid checkpoint" in p for p in status["recovery"]["problems"]), status
    assert [r["partition"] for r in status["losses"]["records"]] == [-3]
    assert status["health"] == "degraded"
    channels.close_all()  # not forgotten by a restart
    assert client.get("/api/v1/channels/orders").json()["status"]["health"] == "degraded"
    operator = Client()  # the channel page names what was lost
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = operator.get("/channels/orders/")
    assert page.status_code == 200 and "queue state (checkpoints gone)" in page.content.decode()


def test_a_settings_change_that_finds_the_files_wiped_is_refused_until_recreated(
        root: Path) -> None:
    """A change's open makes missing files: it must not make a wiped channel again (nor
    look new: its first checkpoint would hide the wipe for good). Refused until the
    operator's recreate, which reports the lost state."""
    client = admin()
    assert create(client, root).status_code == 201
    produced = client.post("/api/v1/channels/orders/events", {"events": [{"body": "a"}]},
                           format="json")
    assert produced.status_code == 200, produced.content
    channels.close_all()
    shutil.rmtree(root / "orders")
    shutil.rmtree(root / "data")
    refused = client.patch("/api/v1/channels/orders", {"capacity": 5_000_000}, format="json")
    problem(refused, 503, "channel-storage-missing")
    assert not (root / "orders").exists() and not (root / "data").exists()
    assert client.post("/api/v1/channels/orders/recreate").status_code == 200
    changed = client.patch("/api/v1/channels/orders", {"capacity": 5_000_000}, format="json")
    assert changed.status_code == 200, changed.content
    status = client.get("/api/v1/channels/orders").json()["status"]
    assert [r["partition"] for r in status["losses"]["records"]] == [-3], status
    assert status["health"] == "degraded"


def _files_appear_after_the_check(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """Another writer puts a channel's checkpoint in the new channel's home between the
    directory check and the engine's create (the race Channel.create guards against)."""
    from appliance import channel_dirs

    real_missing = channel_dirs.missing
    home = root / "orders"

    def missing_then_raced(row: Channel) -> list[str]:
        missing = real_missing(row)  # the home among them: the create would make it
        home.mkdir(parents=True, exist_ok=True)
        (home / "checkpoint").write_bytes(b"someone else's")
        return missing

    monkeypatch.setattr(channel_dirs, "missing", missing_then_raced)
    return home / "checkpoint"


def test_a_create_finding_a_channels_files_is_a_409_naming_the_path(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _files_appear_after_the_check(monkeypatch, root)
    body = problem(create(admin(), root), 409, "channel-exists", field="checkpoint_dir")
    assert body["path"] == str(found) and str(found) in body["detail"]
    assert not Channel.objects.exists()
    assert found.read_bytes() == b"someone else's"  # what was there is left alone


def test_create_channel_command_exits_non_zero_naming_the_files_found(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management import CommandError, call_command

    found = _files_appear_after_the_check(monkeypatch, root)
    with pytest.raises(CommandError, match=f"checkpoint_dir: a channel's files are already "
                                           f"at {found}"):
        call_command("create_channel", "orders", "--set", f"checkpoint_dir={root / 'orders'}",
                     "--set", f"data_dirs={json_list(root / 'data')}",
                     "--set", "minimum_required_space=0")
    assert not Channel.objects.exists() and found.read_bytes() == b"someone else's"


def test_the_new_channel_form_shows_files_found_as_a_form_error(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    User.objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    ui = Client()
    ui.login(username="ops", password="pw")
    found = _files_appear_after_the_check(monkeypatch, root)
    response = ui.post("/channels/new", {**ui_form(), "name": "orders",
                                         "checkpoint_dir": str(root / "orders"),
                                         "data_dirs": str(root / "data")})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert f"a channel's files are already at {found}" in " ".join(errors["checkpoint_dir"])
    assert not Channel.objects.exists()


def json_list(path: Path) -> str:
    return f'["{path}"]'


def ui_form() -> dict[str, object]:
    return {"partitions": 1, "capacity": 1000, "transaction_capacity": 100,
            "keep_alive_ms": 3000, "minimum_required_space": 0,
            "checkpoint_interval_ms": 30000, "checkpoint_on_close": "on",
            "durability": "fsync", "segment_bytes": 1 << 20, "segment_ms": 604800000,
            "index_interval_bytes": 4096, "retention_ms": -1, "retention_bytes": -1,
            "retention_check_interval_ms": 300000, "compression": "none",
            "export_format": "parquet", "export_path": "%Y/%m/%d/%H",
            "export_roll_rows": 1000000, "export_roll_bytes": 268435456}

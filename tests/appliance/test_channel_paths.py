"""Channel directories (appliance/channel_dirs.py, through the API and manage_channels): no
setting names the data root, the appliance's files, a path outside the roots or another
channel's directory (symlinks and `..` resolved), on create and on every change; a delete
removes only the directories its channel created and no other channel uses. Each attack
ends by reopening the other channel and taking every one of its events."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from appliance_helpers import problem, token_client
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channel_dirs, channels
from appliance.manage_channels import Refused, create_channel
from appliance.models import Channel

pytestmark = pytest.mark.django_db
AUDIT_EVENTS = 150


@dataclass
class Scene:
    root: Path
    admin: APIClient  # an admin token for all channels
    scoped: APIClient  # an admin token for orders only
    orders: Channel
    audit: Channel


def create(client: APIClient, root: Path, name: str, **settings: object) -> object:
    body = {"name": name, "data_dirs": [str(root / "data")], "partitions": 2,
            "checkpoint_dir": str(root / "homes" / name), "minimum_required_space": 0,
            **settings}
    return client.post("/api/v1/channels", body, format="json")


def put(row: Channel, count: int, tag: str) -> None:
    with channels.open_channel(row).put() as tx:
        for i in range(count):
            tx.put(f"{tag}-{i}".encode(), key=str(i).encode())


@pytest.fixture()
def scene(root: Path) -> Scene:
    admin = token_client("admin")
    for name, extra in (("orders", {}), ("audit", {
            "use_dual_checkpoints": True,
            "backup_checkpoint_dir": str(root / "backups" / "audit")})):
        assert create(admin, root, name, **extra).status_code == 201
    orders, audit = Channel.objects.get(name="orders"), Channel.objects.get(name="audit")
    put(orders, 10, "orders")
    put(audit, AUDIT_EVENTS, "audit")
    channels.open_channel(audit).checkpoint()  # the backup dir holds a checkpoint too
    channels.close_all()  # audit's files stay as they are until the end
    return Scene(root, admin, token_client("admin", channels=[orders]), orders, audit)


def files_of(row: Channel) -> dict[str, str]:
    """Every file of a channel's directories, by path, with its SHA-256."""
    found = {}
    for _, directory in channel_dirs.dirs_of(row).own:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def take_all(row: Channel) -> list[bytes]:
    channel = channels.open_channel(Channel.objects.get(pk=row.pk))
    with channel.take() as tx:
        bodies = [event.body for event in tx.take(AUDIT_EVENTS + 10)]
    return bodies


def assert_audit_intact(scene: Scene, before: dict[str, str]) -> None:
    assert files_of(scene.audit) == before
    bodies = take_all(scene.audit)
    assert sorted(bodies) == sorted(f"audit-{i}".encode() for i in range(AUDIT_EVENTS))


ATTACKS = [  # (setting changed, settings) — {root} is the data root
    ("checkpoint_dir", {"checkpoint_dir": "{root}"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/homes/audit"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/homes/audit/inner"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/homes"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/data/audit-0"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/data"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/data/a-home"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/backups"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/x/../../outside"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/homes/x/../audit"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/link-to-audit"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/link-out/home"}),
    ("checkpoint_dir", {"checkpoint_dir": "{root}/junk"}),
    ("data_dirs", {"data_dirs": ["{root}"]}),
    ("data_dirs", {"data_dirs": ["{root}/homes/audit"]}),
    ("data_dirs", {"data_dirs": ["{root}/data/audit-1"]}),
    ("data_dirs", {"data_dirs": ["{root}/data/sub"]}),
    ("data_dirs", {"data_dirs": ["{root}/backups"]}),
    ("data_dirs", {"data_dirs": ["{root}/link-to-audit"]}),
    ("data_dirs", {"data_dirs": ["{root}/link-out"]}),
    ("data_dirs", {"data_dirs": ["{root}/data", "{root}/homes/audit/x"]}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/homes/audit"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/backups/audit"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/data/audit-0"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/data"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/homes"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/data/orders-0"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/../outside"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/link-to-audit/x"}),
    ("backup_checkpoint_dir", {"backup_checkpoint_dir": "{root}/junk"}),
]


def formatted(settings: dict[str, object], root: Path) -> dict[str, object]:
    def one(value: object) -> object:
        if isinstance(value, list):
            return [one(v) for v in value]
        return value.replace("{root}", str(root)) if isinstance(value, str) else value
    out = {key: one(value) for key, value in settings.items()}
    if "backup_checkpoint_dir" in out:
        out["use_dual_checkpoints"] = True
    return out


def traps(root: Path, outside: Path) -> None:
    """A symlink to audit's home, one out of the root and a directory holding a file."""
    (root / "link-to-audit").symlink_to(root / "homes" / "audit")
    (root / "link-out").symlink_to(outside)
    (root / "junk").mkdir()
    (root / "junk" / "someone-elses.txt").write_text("not a channel's")


def test_it_refuses_every_trick_on_create_and_change_and_the_other_channel_keeps_its_events(
        scene: Scene, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    traps(scene.root, outside)
    audit_files, before = files_of(scene.audit), tree(scene.root)
    kept = Channel.objects.filter(pk=scene.orders.pk).values().get()
    for field, settings in ATTACKS:
        body = formatted(settings, scene.root)
        made = create(scene.admin, scene.root, "evil", **body)
        assert field in problem(made, 400, "invalid-setting")["errors"], body
        problem(create(scene.scoped, scene.root, "evil", **body), 403, "permission-denied")
        for client in (scene.scoped, scene.admin):
            changed = client.patch("/api/v1/channels/orders", body, format="json")
            assert field in problem(changed, 400, "invalid-setting")["errors"], body
        assert tree(scene.root) == before and not any(outside.iterdir()), body
    assert Channel.objects.filter(pk=scene.orders.pk).values().get() == kept
    assert not Channel.objects.filter(name="evil").exists()
    deleted = scene.scoped.delete("/api/v1/channels/orders?force=true")
    assert deleted.status_code == 204
    assert not (scene.root / "homes" / "orders").exists()
    assert not any((scene.root / "data").glob("orders-*"))
    assert scene.root.is_dir() and (scene.root / "junk" / "someone-elses.txt").is_file()
    assert_audit_intact(scene, audit_files)


def test_a_scoped_admin_may_not_touch_another_channel_nor_create_one(scene: Scene) -> None:
    problem(scene.scoped.patch("/api/v1/channels/audit", {"capacity": 5}, format="json"), 403,
            "permission-denied")
    problem(scene.scoped.delete("/api/v1/channels/audit?force=true"), 403, "permission-denied")
    problem(create(scene.scoped, scene.root, "fresh"), 403, "permission-denied")
    assert not (scene.root / "homes" / "fresh").exists()
    assert create(scene.admin, scene.root, "fresh").status_code == 201


def test_patching_checkpoint_dir_is_a_400_that_writes_nothing(scene: Scene) -> None:
    before = tree(scene.root)
    moved = scene.scoped.patch("/api/v1/channels/orders",
                               {"checkpoint_dir": str(scene.root / "homes" / "moved")},
                               format="json")
    errors = problem(moved, 400, "invalid-setting", field="checkpoint_dir")["errors"]
    assert "cannot change" in errors["checkpoint_dir"][0]
    assert tree(scene.root) == before and not (scene.root / "homes" / "moved").exists()
    same = scene.scoped.patch("/api/v1/channels/orders",
                              {"checkpoint_dir": scene.orders.checkpoint_dir}, format="json")
    assert same.status_code == 200


def test_a_change_records_the_directories_it_makes_and_delete_removes_them(
        scene: Scene) -> None:
    backup = scene.root / "backups" / "orders"
    changed = scene.scoped.patch("/api/v1/channels/orders", {
        "partitions": 3, "use_dual_checkpoints": True, "backup_checkpoint_dir": str(backup)},
        format="json")
    assert changed.status_code == 200, changed.content
    owned = Channel.objects.get(name="orders").owned_dirs
    assert str(backup) in owned and str(scene.root / "data" / "orders-2") in owned
    audit_files = files_of(scene.audit)
    assert scene.scoped.delete("/api/v1/channels/orders?force=true").status_code == 204
    assert not backup.exists() and not (scene.root / "data" / "orders-2").exists()
    assert (scene.root / "backups" / "audit").is_dir()  # made by audit: not orders' to remove
    assert_audit_intact(scene, audit_files)


def test_delete_never_removes_a_directory_another_channel_uses_even_if_recorded(
        scene: Scene, settings: object) -> None:
    """A record claiming too much (an old row, a hand edit) removes only what is its own."""
    audit = channel_dirs.dirs_of(scene.audit)
    claimed = [str(scene.root), str(scene.root / "data"), str(scene.root / "homes"),
               *(str(path) for _, path in audit.own)]
    Channel.objects.filter(pk=scene.orders.pk).update(
        owned_dirs=[*scene.orders.owned_dirs, *claimed])
    audit_files = files_of(scene.audit)
    assert scene.admin.delete("/api/v1/channels/orders?force=true").status_code == 204
    assert not (scene.root / "homes" / "orders").exists()
    assert_audit_intact(scene, audit_files)


def test_delete_keeps_a_directory_that_existed_before_the_channel(root: Path) -> None:
    home = root / "mounted-home"
    home.mkdir()  # an operator's empty mount point, say
    admin = token_client("admin")
    made = create(admin, root, "orders", checkpoint_dir=str(home))
    assert made.status_code == 201, made.content
    assert str(home) not in Channel.objects.get(name="orders").owned_dirs
    assert admin.delete("/api/v1/channels/orders").status_code == 204
    assert home.is_dir() and not (root / "data" / "orders-0").exists()
    again = create(admin, root, "orders", checkpoint_dir=str(home))  # its old files are there
    errors = problem(again, 400, "invalid-setting", field="checkpoint_dir")["errors"]
    assert "not empty" in errors["checkpoint_dir"][0]


def test_a_shared_data_dir_stays_while_another_channel_uses_it(root: Path) -> None:
    admin = token_client("admin")
    for name in ("orders", "audit"):
        assert create(admin, root, name, data_dirs=[str(root / "shared")]).status_code == 201
    put(Channel.objects.get(name="audit"), AUDIT_EVENTS, "audit")
    channels.close_all()
    assert str(root / "shared") in Channel.objects.get(name="orders").owned_dirs
    assert admin.delete("/api/v1/channels/orders?force=true").status_code == 204
    assert (root / "shared" / "audit-0").is_dir() and not (root / "shared" / "orders-0").exists()
    assert len(take_all(Channel.objects.get(name="audit"))) == AUDIT_EVENTS
    channels.close_all()
    assert admin.delete("/api/v1/channels/audit?force=true").status_code == 204
    # made by orders (gone), used by audit: audit never owned it, so it stays, empty
    assert (root / "shared").is_dir() and not any((root / "shared").iterdir())


def test_a_data_dir_the_channel_made_goes_with_it_when_empty(root: Path) -> None:
    admin = token_client("admin")
    made = create(admin, root, "orders", data_dirs=[str(root / "orders" / "data")],
                  checkpoint_dir=str(root / "orders" / "home"))
    assert made.status_code == 201
    assert admin.delete("/api/v1/channels/orders").status_code == 204
    assert not (root / "orders").exists() and root.is_dir()


def test_it_refuses_the_appliance_files_even_inside_a_data_root(
        tmp_path: Path, settings: object) -> None:
    var = tmp_path / "var"
    for place in ("keys", "log", "export"):
        (var / place).mkdir(parents=True)
    settings.VAR_DIR = var  # type: ignore[attr-defined]
    settings.WEIR_KEY_DIR = var / "keys"  # type: ignore[attr-defined]
    settings.WEIR_EXPORT_URI = (var / "export").as_uri()  # type: ignore[attr-defined]
    settings.WEIR_DATA_ROOTS = [tmp_path]  # type: ignore[attr-defined]
    for directory in (var, var / "keys", var / "keys" / "x", var / "log", var / "export" / "x",
                      tmp_path / "elsewhere" / ".." / "var"):
        row = Channel(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(directory), minimum_required_space=0)
        with pytest.raises(ValidationError) as info:
            channels.to_config(row)
        assert "checkpoint_dir" in info.value.message_dict, directory
    settings.WEIR_DATA_ROOTS = [var / "channels"]  # type: ignore[attr-defined]
    inside = Channel(name="orders", data_dirs=[str(var / "channels" / "data")],
                     checkpoint_dir=str(var / "channels" / "orders"))
    channels.to_config(inside)  # the default layout: a root inside WEIR_VAR_DIR


def test_it_refuses_the_database_file_and_the_code(tmp_path: Path, settings: object) -> None:
    settings.WEIR_DATA_ROOTS = ["/"]  # type: ignore[attr-defined]
    base = Path(settings.BASE_DIR)  # type: ignore[attr-defined]
    for directory in (base, base / "appliance", base.parent):
        row = Channel(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(directory))
        with pytest.raises(ValidationError) as info:
            channels.to_config(row)
        assert "checkpoint_dir" in info.value.message_dict, directory


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_never_share_a_home(root: Path) -> None:
    results: list[object] = []

    def attempt(i: int) -> None:
        try:
            with override_settings(WEIR_DATA_ROOTS=[root]):
                create_channel({"name": f"c{i}", "data_dirs": [str(root / "data")],
                                "checkpoint_dir": str(root / "same-home"),
                                "minimum_required_space": 0})
            results.append("created")
        except Refused as refused:
            results.append(refused.status)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count("created") == 1, results
    assert Channel.objects.count() == 1


def test_channels_made_before_the_migration_own_their_places_and_key_paths_become_names(
        root: Path, settings: object) -> None:
    from importlib import import_module

    from django.apps import apps

    migration = import_module("appliance.migrations.0005_channel_owned_dirs_and_key_names")
    keys = root.parent / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    settings.WEIR_KEY_DIR = keys  # type: ignore[attr-defined]
    Channel.objects.create(name="orders", data_dirs=[str(root / "data")], partitions=2,
                           checkpoint_dir=str(root / "orders"),
                           encryption_key_file=str(keys / "orders.keys"),
                           encryption_active_key="k1")
    Channel.objects.create(name="audit", data_dirs=[str(root / "data")],
                           checkpoint_dir=str(root / "audit"),
                           encryption_key_file="/somewhere/else.keys",
                           encryption_active_key="k1")
    migration.forwards(apps, None)
    orders, audit = Channel.objects.get(name="orders"), Channel.objects.get(name="audit")
    assert sorted(orders.owned_dirs) == sorted(
        str(p) for p in (root / "orders", root / "data" / "orders-0", root / "data" / "orders-1"))
    assert orders.encryption_key_file == "orders.keys"
    assert audit.encryption_key_file == "/somewhere/else.keys"  # refused at open, named
    with pytest.raises(ValidationError) as info:
        channels.to_config(audit)
    assert "encryption_key_file" in info.value.message_dict


def test_nested_data_roots_each_hold_directories_but_are_none(tmp_path: Path,
                                                             settings: object) -> None:
    settings.WEIR_DATA_ROOTS = [tmp_path, tmp_path / "b"]  # type: ignore[attr-defined]
    row = Channel(name="orders", data_dirs=[str(tmp_path / "b" / "data")],
                  checkpoint_dir=str(tmp_path / "b" / "orders"))
    channels.to_config(row)
    row.checkpoint_dir = str(tmp_path / "b")
    with pytest.raises(ValidationError, match="data root itself"):
        channels.to_config(row)


UI_FORM = {"partitions": 1, "capacity": 1000, "transaction_capacity": 100,
           "keep_alive_ms": 3000, "minimum_required_space": 0, "checkpoint_interval_ms": 30000,
           "checkpoint_on_close": "on", "durability": "fsync", "segment_bytes": 1 << 20,
           "segment_ms": 604800000, "index_interval_bytes": 4096, "retention_ms": -1,
           "retention_bytes": -1, "retention_check_interval_ms": 300000,
           "compression": "none", "export_format": "parquet", "export_path": "%Y/%m/%d/%H",
           "export_roll_rows": 1000000, "export_roll_bytes": 268435456}


def test_the_ui_keeps_the_same_rules_for_create_change_and_delete(scene: Scene) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = operator.get("/channels/orders/")  # opens orders: its files as they now are
    audit_home, before = str(scene.root / "homes" / "audit"), tree(scene.root)
    made = operator.post("/channels/new", {**UI_FORM, "name": "evil",
                                           "checkpoint_dir": audit_home})
    assert made.status_code == 400 and "checkpoint_dir" in made.context["form"].errors
    form = {k: ("on" if v is True else v) for k, v in page.context["form"].initial.items()
            if v is not None and v is not False and k not in ("name", "data_dirs")}
    changed = operator.post("/channels/orders/settings", {
        **form, "use_dual_checkpoints": "on", "backup_checkpoint_dir": audit_home})
    assert changed.status_code == 400
    assert "backup_checkpoint_dir" in changed.context["form"].errors
    assert tree(scene.root) == before and not Channel.objects.filter(name="evil").exists()
    audit_files = files_of(scene.audit)
    done = operator.post("/channels/orders/delete", {"confirm_name": "orders", "force": "on"})
    assert done.status_code == 302 and not Channel.objects.filter(name="orders").exists()
    assert_audit_intact(scene, audit_files)

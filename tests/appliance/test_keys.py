"""Key files (appliance/keys.py): a channel names a regular file in WEIR_KEY_DIR (0700, the
appliance's own); anything else — a path, a device, a FIFO, a symlink out, a huge file, a
missing file, an open directory — is a 400 naming the setting, on create and on change,
with nothing saved, and the channel, the list and /metrics keep answering."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from appliance_helpers import problem, token_client
from django.core.exceptions import ImproperlyConfigured

from appliance import channels
from appliance.env import private_dir
from appliance.models import Channel
from channel_engine.encryption import MAX_KEY_FILE_BYTES, KeyRing

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def key_dir(tmp_path_factory: pytest.TempPathFactory, settings: object) -> Path:
    """WEIR_KEY_DIR with a good key file (orders.keys) and every kind of bad one."""
    tmp_path = tmp_path_factory.mktemp("var")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    settings.WEIR_KEY_DIR = keys  # type: ignore[attr-defined]
    KeyRing.write_new(keys / "orders.keys", ["k1"])
    outside = tmp_path / "outside.keys"
    KeyRing.write_new(outside, ["k1"])
    (keys / "escape").symlink_to(outside)
    (keys / "zero").symlink_to("/dev/zero")
    (keys / "current").symlink_to("orders.keys")  # within the dir: allowed
    os.mkfifo(keys / "fifo", 0o600)
    (keys / "huge").write_bytes(b" " * (MAX_KEY_FILE_BYTES + 1))
    (keys / "huge").chmod(0o600)
    (keys / "sub").mkdir(mode=0o700)
    KeyRing.write_new(keys / "sub" / "orders.keys", ["k1"])
    KeyRing.write_new(keys / "open.keys", ["k1"])
    (keys / "open.keys").chmod(0o644)
    (keys / "garbage").write_text("not json")
    (keys / "garbage").chmod(0o600)
    return keys


def create(root: Path, key: str | None, active: str | None = "k1") -> object:
    return token_client("admin").post("/api/v1/channels", {
        "name": "orders", "data_dirs": [str(root / "data")],
        "checkpoint_dir": str(root / "orders"), "minimum_required_space": 0,
        "encryption_key_file": key, "encryption_active_key": active}, format="json")


BAD_NAMES = ["/dev/zero", "../orders.keys", "sub/orders.keys", "..", "missing.keys", "fifo",
             "zero", "escape", "huge", "sub", "open.keys", "garbage", ""]


def test_it_encrypts_with_a_key_file_named_in_the_key_dir(root: Path, key_dir: Path) -> None:
    made = create(root, "orders.keys")
    assert made.status_code == 201, made.content
    assert made.json()["settings"]["encryption_key_file"] == "orders.keys"
    channel = channels.open_channel(Channel.objects.get(name="orders"))
    assert channel.config.encryption_key_file == str(key_dir / "orders.keys")
    with channel.put() as tx:
        tx.put(b"secret body")
    segment = next((root / "data" / "orders-0").glob("*.log"))
    assert b"secret body" not in segment.read_bytes()


def test_a_symlink_to_a_key_file_in_the_same_directory_is_followed(
        root: Path, key_dir: Path) -> None:
    made = create(root, "current")
    assert made.status_code == 201, made.content


@pytest.mark.parametrize("name", BAD_NAMES)
def test_it_refuses_a_key_file_that_is_not_a_plain_file_in_the_key_dir(
        root: Path, key_dir: Path, name: str) -> None:
    started = time.monotonic()
    refused = create(root, name)
    assert time.monotonic() - started < 5  # a FIFO or a device is never read
    assert "encryption_key_file" in problem(refused, 400, "invalid-setting")["errors"]
    assert not Channel.objects.exists() and not any(root.iterdir())


def test_a_missing_key_id_is_named(root: Path, key_dir: Path) -> None:
    refused = create(root, "orders.keys", active="nope")
    problem(refused, 400, "invalid-setting", field="encryption_active_key")


@pytest.mark.parametrize("name", ["zero", "fifo", "huge", "missing.keys", "/dev/zero",
                                  "escape", "garbage"])
def test_a_change_to_an_unusable_key_file_is_a_400_that_saves_nothing(
        root: Path, key_dir: Path, name: str) -> None:
    assert create(root, "orders.keys").status_code == 201
    row = Channel.objects.get(name="orders")
    scoped = token_client("admin", channels=[row])
    before = Channel.objects.filter(pk=row.pk).values().get()
    refused = scoped.patch("/api/v1/channels/orders", {"encryption_key_file": name},
                           format="json")
    problem(refused, 400, "invalid-setting", field="encryption_key_file")
    assert Channel.objects.filter(pk=row.pk).values().get() == before
    admin = token_client("admin")
    for url in ("/api/v1/channels/orders", "/api/v1/channels", "/metrics"):
        assert admin.get(url).status_code == 200, url


def test_a_change_may_turn_encryption_on_with_a_good_key_file(root: Path,
                                                               key_dir: Path) -> None:
    assert create(root, None, active=None).status_code == 201
    changed = token_client("admin").patch("/api/v1/channels/orders", {
        "encryption_key_file": "orders.keys", "encryption_active_key": "k1"}, format="json")
    assert changed.status_code == 200, changed.content


@pytest.mark.parametrize("flaw", ["group-readable", "other-owner"])
def test_no_key_is_read_from_a_key_dir_others_may_use(root: Path, key_dir: Path,
                                                      flaw: str) -> None:
    if flaw == "group-readable":
        key_dir.chmod(0o750)
    else:
        os.chown(key_dir, 65534, 65534)
    refused = create(root, "orders.keys")
    errors = problem(refused, 400, "invalid-setting", field="encryption_key_file")["errors"]
    assert "WEIR_KEY_DIR" in errors["encryption_key_file"][0]
    assert not Channel.objects.exists()


def test_the_key_dir_is_made_private_and_refused_when_it_is_not(tmp_path: Path) -> None:
    made = private_dir("WEIR_KEY_DIR", tmp_path / "var" / "keys")
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o755)
    with pytest.raises(ImproperlyConfigured, match="group or others may access it"):
        private_dir("WEIR_KEY_DIR", made)
    made.chmod(0o700)
    os.chown(made, 65534, 65534)
    with pytest.raises(ImproperlyConfigured, match="owned by uid 65534"):
        private_dir("WEIR_KEY_DIR", made)


def test_the_appliance_refuses_to_start_with_an_open_key_dir(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o755)
    keys.chmod(0o755)
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"), "WEIR_KEY_DIR": str(keys),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "check"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"WEIR_KEY_DIR {keys}: group or others may access it" in done.stderr


def test_a_channel_whose_key_file_is_gone_is_deleted_only_when_forced(
        root: Path, key_dir: Path) -> None:
    assert create(root, "orders.keys").status_code == 201
    channels.close_all()
    (key_dir / "orders.keys").unlink()
    admin = token_client("admin")
    refused = admin.delete("/api/v1/channels/orders")
    assert "no key file" in problem(refused, 409, "channel-conflict")["detail"]
    assert admin.delete("/api/v1/channels/orders?force=true").status_code == 204
    assert not Channel.objects.exists() and not (root / "orders").exists()

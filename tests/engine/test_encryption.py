"""Encryption at rest: sealed units open only with the right key, place and bytes."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine import Channel, ConfigError
from channel_engine.encryption import KeyRing, key_check_value
from channel_engine.errors import DecryptionError
from channel_engine.tools.recover import repair
from channel_engine.tools.verify import verify_channel


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    KeyRing.write_new(path, ["2026-11", "2026-12"])
    return path


def test_it_seals_and_opens_with_the_active_key(key_file: Path) -> None:
    ring = KeyRing.load(key_file, "2026-12")
    unit = ring.seal(b"records of a batch", b"p0:100")
    assert b"records of a batch" not in unit and b"2026-12" in unit
    assert ring.open(unit, b"p0:100") == b"records of a batch"


def test_it_never_reuses_a_nonce(key_file: Path) -> None:
    ring = KeyRing.load(key_file, "2026-11")
    units = {ring.seal(b"same", b"ad") for _ in range(200)}
    assert len(units) == 200


def test_rotation_keeps_older_units_readable(key_file: Path) -> None:
    old = KeyRing.load(key_file, "2026-11").seal(b"old", b"ad")
    rotated = KeyRing.load(key_file, "2026-12")
    assert rotated.open(old, b"ad") == b"old"
    assert rotated.open(rotated.seal(b"new", b"ad"), b"ad") == b"new"


def test_a_flipped_bit_moved_unit_or_wrong_key_is_a_clear_error(key_file: Path,
                                                                 tmp_path: Path) -> None:
    ring = KeyRing.load(key_file, "2026-11")
    unit = bytearray(ring.seal(b"secret", b"p0:100"))
    with pytest.raises(DecryptionError, match="authentication failed"):
        ring.open(unit, b"p0:200")  # the same bytes at another offset
    unit[-3] ^= 1
    with pytest.raises(DecryptionError, match="authentication failed"):
        ring.open(bytes(unit), b"p0:100")
    other_file = tmp_path / "other.json"
    KeyRing.write_new(other_file, ["2026-11"])
    good = ring.seal(b"secret", b"ad")
    with pytest.raises(DecryptionError, match="wrong key"):
        KeyRing.load(other_file, "2026-11").open(good, b"ad")


def test_a_missing_key_id_is_named(key_file: Path, tmp_path: Path) -> None:
    unit = KeyRing.load(key_file, "2026-12").seal(b"x", b"ad")
    only_old = tmp_path / "old.json"
    document = json.loads(key_file.read_text())
    del document["keys"]["2026-12"]
    only_old.write_text(json.dumps(document))
    only_old.chmod(0o600)
    with pytest.raises(DecryptionError, match="'2026-12' is not in the key file"):
        KeyRing.load(only_old, "2026-11").open(unit, b"ad")


def test_it_refuses_bad_key_files(tmp_path: Path, key_file: Path) -> None:
    with pytest.raises(ConfigError, match="no such key file"):
        KeyRing.load(tmp_path / "nope.json", "k")
    with pytest.raises(ConfigError, match="not in the key file"):
        KeyRing.load(key_file, "2027-01")
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        KeyRing.load(key_file, "2026-11")
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"format": "weir-keys", "version": 1,
                                 "keys": {"k": base64.b64encode(os.urandom(16)).decode()}}))
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="AES-256 needs 32"):
        KeyRing.load(short, "k")
    with pytest.raises(FileExistsError):
        KeyRing.write_new(key_file, ["again"])


def test_it_writes_a_check_value_per_key_and_refuses_a_key_that_does_not_match(
        key_file: Path) -> None:
    document = json.loads(key_file.read_text())
    assert document["version"] == 2 and set(document["checks"]) == {"2026-11", "2026-12"}
    key = bytearray(base64.b64decode(document["keys"]["2026-12"]))
    assert document["checks"]["2026-12"] == key_check_value(bytes(key))
    key[5] ^= 0x10  # one flipped bit in a key: still 32 bytes of valid base64
    document["keys"]["2026-12"] = base64.b64encode(bytes(key)).decode()
    key_file.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="'2026-12' does not match its check value") as caught:
        KeyRing.load(key_file, "2026-11")
    assert str(key_file) in str(caught.value)


def test_a_version_2_key_file_needs_a_check_per_key(key_file: Path) -> None:
    document = json.loads(key_file.read_text())
    del document["checks"]["2026-11"]
    key_file.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=f"{key_file}: key '2026-11' has no check value"):
        KeyRing.load(key_file, "2026-12")


def test_it_still_reads_a_version_1_key_file_without_checks(key_file: Path) -> None:
    document = json.loads(key_file.read_text())
    sealed = KeyRing.load(key_file, "2026-11").seal(b"old", b"ad")
    document["version"] = 1
    del document["checks"]
    key_file.write_text(json.dumps(document))
    assert KeyRing.load(key_file, "2026-11").open(sealed, b"ad") == b"old"


def test_a_directory_in_place_of_the_key_file_is_a_config_error_naming_it(
        tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.mkdir()
    with pytest.raises(ConfigError, match=f"{path}: the key file cannot be read") as caught:
        KeyRing.load(path, "k")
    assert caught.value.field == "encryption_key_file"


def test_a_decryption_error_names_the_key_file(key_file: Path, tmp_path: Path) -> None:
    unit = KeyRing.load(key_file, "2026-11").seal(b"x", b"ad")
    other = tmp_path / "other.json"
    KeyRing.write_new(other, ["2026-11"])
    with pytest.raises(DecryptionError, match=f"key '2026-11' of the key file {other}: "):
        KeyRing.load(other, "2026-11").open(unit, b"ad")
    with pytest.raises(DecryptionError, match=f"'2026-12' is not in the key file {other}"):
        KeyRing.load(other, "2026-11").open(KeyRing.load(key_file, "2026-12").seal(b"x", b"ad"),
                                            b"ad")


def test_a_damaged_key_file_is_named_by_verify_open_and_recover(tmp_path: Path) -> None:
    keys = tmp_path / "keys" / "weir.keys"
    keys.parent.mkdir()
    KeyRing.write_new(keys, ["k1"])
    config = make_config(tmp_path, encryption_key_file=str(keys), encryption_active_key="k1")
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"sealed")
    good = keys.read_bytes()
    document = json.loads(good)
    key = bytearray(base64.b64decode(document["keys"]["k1"]))
    key[0] ^= 1
    document["keys"]["k1"] = base64.b64encode(bytes(key)).decode()
    keys.write_text(json.dumps(document))
    found = verify_channel(config.home)
    assert not found["ok"] and [d["path"] for d in found["damages"]] == [str(keys)]
    with pytest.raises(ConfigError, match=f"{keys}: key 'k1' does not match its check value"):
        Channel.open(config.home)
    with pytest.raises(ConfigError, match=str(keys)):
        repair(config.home)
    keys.write_bytes(good)  # the operator's copy: the data was never touched
    with Channel.open(config.home) as channel:
        assert [e.body for e in channel.take().take(5)] == [b"sealed"]


def test_verify_finds_a_wrong_key_in_a_key_file_without_check_values(tmp_path: Path) -> None:
    keys = tmp_path / "keys" / "weir.keys"
    keys.parent.mkdir()
    KeyRing.write_new(keys, ["k1"])
    config = make_config(tmp_path, partitions=2, encryption_key_file=str(keys),
                         encryption_active_key="k1")
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"sealed", key=b"a")
    document = json.loads(keys.read_text())
    document["version"] = 1
    del document["checks"]
    keys.write_text(json.dumps(document))
    assert verify_channel(config.home)["ok"]  # a version 1 file with the right key
    key = bytearray(base64.b64decode(document["keys"]["k1"]))
    key[31] ^= 0x80
    document["keys"]["k1"] = base64.b64encode(bytes(key)).decode()
    keys.write_text(json.dumps(document))
    found = verify_channel(config.home)
    assert not found["ok"] and {d["path"] for d in found["damages"]} == {str(keys)}
    assert "newest sealed batch does not open: authentication failed" in found["problems"][0]


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_it_reads_no_device_fifo_or_huge_file_as_a_key_file(tmp_path: Path, kind: str) -> None:
    """/dev/zero once grew a web worker to 23 GB: only a regular file of at most
    MAX_KEY_FILE_BYTES is read, and a FIFO without a writer does not block."""
    from channel_engine.encryption import MAX_KEY_FILE_BYTES

    path = tmp_path / "keys.json"
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_bytes(b" " * (MAX_KEY_FILE_BYTES + 1))
        path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a regular file|too large") as caught:
        KeyRing.load(path, "k")
    assert caught.value.field == "encryption_key_file" and str(path) in str(caught.value)

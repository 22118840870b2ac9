"""Encryption at rest: sealed units open only with the right key, place and bytes."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from channel_engine import ConfigError
from channel_engine.encryption import DecryptionError, KeyRing


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

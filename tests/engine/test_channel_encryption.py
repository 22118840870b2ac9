"""Encryption at rest through a channel: sealed batches on disk, readable with the key,
key rotation, and a clear error — never garbage — for a missing or wrong key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from channel_helpers import crash, make_config

from channel_engine import Channel, ConfigError
from channel_engine.encryption import KeyRing
from channel_engine.errors import DecryptionError, EncryptedBatchError
from channel_engine.filenames import LOG_SUFFIX
from channel_engine.log import record_batch as rb
from channel_engine.tools import verify


def key_file(tmp_path: Path, name: str, *ids: str) -> Path:
    path = tmp_path / name
    KeyRing.write_new(path, list(ids))
    return path


def encrypted(tmp_path: Path, keys: Path, active: str, **settings: object) -> object:
    return make_config(tmp_path, encryption_key_file=str(keys), encryption_active_key=active,
                       **settings)


def put_secret(channel: Channel, body: bytes) -> None:
    with channel.put() as tx:
        tx.put(body, key=b"secret-key", headers={"secret-header": b"secret-value"})


def log_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.rglob(f"*{LOG_SUFFIX}"))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_batches_are_sealed_on_disk_and_read_back(tmp_path: Path, compression: str) -> None:
    keys = key_file(tmp_path, "keys.json", "k1")
    config = encrypted(tmp_path, keys, "k1", compression=compression)
    with Channel.open(config) as channel:
        put_secret(channel, b"top secret body")
        raw = log_bytes(tmp_path)
        for secret in (b"top secret body", b"secret-key", b"secret-header", b"secret-value"):
            assert secret not in raw
        with channel.take() as tx:
            [event] = tx.take(10)
        assert (event.body, event.key, event.headers) == (
            b"top secret body", b"secret-key", {"secret-header": b"secret-value"})
    report = verify.verify_partition(config.partition_dir(0))
    assert report.ok and report.records == 1  # CRC-checked without the key


def test_rotation_keeps_old_batches_readable(tmp_path: Path) -> None:
    keys = key_file(tmp_path, "keys.json", "2026-11", "2026-12")
    config = encrypted(tmp_path, keys, "2026-11")
    with Channel.open(config) as channel:
        put_secret(channel, b"under the old key")
    with Channel.open(config.replace(encryption_active_key="2026-12")) as channel:
        put_secret(channel, b"under the new key")
        with channel.take() as tx:
            assert [e.body for e in tx.take(10)] == [b"under the old key", b"under the new key"]


def test_a_wrong_key_fails_at_open_with_a_clear_error(tmp_path: Path) -> None:
    keys = key_file(tmp_path, "keys.json", "k1")
    config = encrypted(tmp_path, keys, "k1")
    channel = Channel.open(config)
    put_secret(channel, b"body")
    crash(channel)
    other = key_file(tmp_path, "other.json", "k1")  # same id, different key
    with pytest.raises(DecryptionError, match="authentication failed with key 'k1'"):
        Channel.open(config.replace(encryption_key_file=str(other)))
    without = config.replace(encryption_key_file=None, encryption_active_key=None)
    with pytest.raises(EncryptedBatchError, match="encryption_key_file"):
        Channel.open(without)
    missing_id = tmp_path / "missing-id.json"
    KeyRing.write_new(missing_id, ["k2"])
    with pytest.raises(DecryptionError, match="'k1' is not in the key file"):
        Channel.open(config.replace(encryption_key_file=str(missing_id),
                                    encryption_active_key="k2"))
    with Channel.open(config) as reopened, reopened.take() as tx:
        assert [e.body for e in tx.take(10)] == [b"body"]


def test_a_damaged_sealed_batch_is_detected(tmp_path: Path) -> None:
    keys = key_file(tmp_path, "keys.json", "k1")
    config = encrypted(tmp_path, keys, "k1")
    with Channel.open(config) as channel:
        put_secret(channel, b"x" * 100)
    log = next(config.partition_dir(0).glob(f"*{LOG_SUFFIX}"))
    data = bytearray(log.read_bytes())
    data[rb.HEADER_SIZE + 40] ^= 0x01
    header = rb.read_header(data)
    data[17:21] = rb.compute_crc(data[: header.size]).to_bytes(4, "big")  # CRC made to match
    log.write_bytes(bytes(data))
    with pytest.raises(DecryptionError, match="authentication failed"):
        Channel.open(config)


def test_a_world_readable_key_file_is_refused(tmp_path: Path) -> None:
    keys = key_file(tmp_path, "keys.json", "k1")
    keys.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        Channel.open(encrypted(tmp_path, keys, "k1"))
    assert json.loads(keys.read_text())["format"] == "weir-keys"

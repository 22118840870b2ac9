"""Encryption at rest: AES-256-GCM per sealed unit, with key ids and rotation.

Flume's FileChannel encrypts with AES-CTR and reuses the keystream, and has no
authentication; Weir seals each unit (a batch's records) with AES-256-GCM under
a fresh random 96-bit nonce, binds it to its place with associated data (the
caller passes e.g. partition and base offset, so a sealed unit moved elsewhere
fails), and names the key by id so keys can rotate: new units use the active
key, older ones stay readable while their key is in the file. A missing key,
a wrong key or any flipped bit is a clear error, never garbage.

Key file (JSON, readable by the owner only; a regular file of at most 64 KiB,
MAX_KEY_FILE_BYTES; a device or FIFO is refused before anything is read):

    {"format": "weir-keys", "version": 2,
     "keys": {"2026-11": "<base64 of 32 random bytes>", "2026-12": "..."},
     "checks": {"2026-11": "<hex of the first 8 bytes of SHA-256 of the key>", ...}}

    field    meaning
    -------  -------------------------------------------------------------------
    format   "weir-keys"
    version  2 (write_new writes it); 1 is still read: "checks" optional there
    keys     key id -> base64 of the 32-byte AES-256 key
    checks   key id -> key check value (KCV): hex of SHA-256(key)[:8]; version 2
             needs one per key. A key that does not match its check (a flipped
             bit) is a ConfigError naming the file and the key id, at load. A key
             added by hand (rotation) needs its check: key_check_value(key).

The key file cannot be rebuilt (keys are random): a damaged or missing one is a
ConfigError naming it, and open and recover refuse until the operator restores
their copy. Every error of a loaded KeyRing, DecryptionError included, names
the key file.

Sealed unit layout:

    offset  size  field
    ------  ----  ------------------------------------------------------------
         0     1  version    1
         1     1  key id length K (1..255)
         2     K  key id     UTF-8
       2+K    12  nonce      random
      14+K     -  ciphertext + 16-byte GCM tag
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import ConfigError, DecryptionError

FORMAT = "weir-keys"
VERSION = 2
VERSIONS = (1, 2)  # 1: no "checks"
CHECK_SIZE = 8  # bytes of SHA-256 in a key check value
SEAL_VERSION = 1
NONCE_SIZE = 12
KEY_SIZE = 32
MAX_KEY_FILE_BYTES = 64 << 10  # hundreds of keys; never read more (a device, a log)


class KeyRing:
    """The keys of a key file, by id, and the active one used for new data."""

    def __init__(self, keys: dict[str, bytes], active: str,
                 path: str | Path | None = None) -> None:
        where = f"{path}: " if path is not None else ""
        if active not in keys:
            raise ConfigError("encryption_active_key", f"{where}key id {active!r} is not in "
                                                       f"the key file (ids: "
                                                       f"{', '.join(sorted(keys))})")
        for key_id, key in keys.items():
            if not 1 <= len(key_id.encode()) <= 255:
                raise ConfigError("encryption_key_file", f"{where}key id {key_id!r} must be "
                                                         "1..255 bytes of UTF-8")
            if len(key) != KEY_SIZE:
                raise ConfigError("encryption_key_file", f"{where}key {key_id!r} has "
                                                         f"{len(key)} bytes; AES-256 needs "
                                                         f"{KEY_SIZE}")
        self.active = active
        self.path = None if path is None else Path(path)
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @classmethod
    def load(cls, path: str | Path, active: str) -> KeyRing:
        """Read a key file; refuse one that others may read, that is malformed or whose key
        does not match its check value (ConfigError naming the file)."""
        path = Path(path)
        document = _read_key_file(path)
        keys = {}
        for key_id, encoded in document["keys"].items():
            try:
                keys[key_id] = base64.b64decode(encoded, validate=True)
            except (ValueError, TypeError) as exc:
                raise ConfigError("encryption_key_file",
                                  f"{path}: key {key_id!r} is not base64") from exc
        _check_keys(path, keys, document.get("checks"), document["version"])
        return cls(keys, active, path)

    @staticmethod
    def document(keys: dict[str, bytes]) -> dict[str, object]:
        """The key file document (current version, check values included) of `keys`."""
        return {"format": FORMAT, "version": VERSION,
                "keys": {key_id: base64.b64encode(key).decode() for key_id, key in keys.items()},
                "checks": {key_id: key_check_value(key) for key_id, key in keys.items()}}

    @staticmethod
    def write_new(path: str | Path, key_ids: list[str]) -> None:
        """Create a key file with fresh random keys (mode 600), durably (file and directory
        fsynced: losing it loses every batch sealed with it); refuses to overwrite one."""
        document = KeyRing.document({key_id: os.urandom(KEY_SIZE) for key_id in key_ids})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_directory(Path(path).parent)

    def seal(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Encrypt and authenticate with the active key (layout in the module doc)."""
        key_id = self.active.encode()
        nonce = os.urandom(NONCE_SIZE)
        sealed = self._ciphers[self.active].encrypt(nonce, plaintext, associated_data)
        return bytes([SEAL_VERSION, len(key_id)]) + key_id + nonce + sealed

    def open(self, unit: bytes, associated_data: bytes) -> bytes:
        """Check and decrypt a sealed unit; raise DecryptionError naming what is wrong."""
        if len(unit) < 2 or unit[0] != SEAL_VERSION:
            raise DecryptionError(f"not a sealed unit of version {SEAL_VERSION}")
        end = 2 + unit[1]
        key_id = unit[2:end].decode("utf-8", "replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(f"key id {key_id!r} is not in the key file{self._named()}")
        nonce = unit[end:end + NONCE_SIZE]
        try:
            return cipher.decrypt(nonce, unit[end + NONCE_SIZE:], associated_data)
        except InvalidTag:
            raise DecryptionError(f"authentication failed with key {key_id!r} of the key "
                                  f"file{self._named()}: wrong key, damaged bytes, or data "
                                  "moved from elsewhere") from None

    def _named(self) -> str:
        return "" if self.path is None else f" {self.path}"


def key_check_value(key: bytes) -> str:
    """A key's check value (KCV): hex of the first 8 bytes of its SHA-256."""
    return hashlib.sha256(key).digest()[:CHECK_SIZE].hex()


def _read_key_file(path: Path) -> dict[str, Any]:
    """The parsed key file: a Weir key file of a supported version, else ConfigError."""
    try:
        mode, data = _read_bounded(path)
        document = json.loads(data.decode("utf-8"))
    except ConfigError:  # not a regular file, too large (a ValueError: let it through)
        raise
    except FileNotFoundError:
        raise ConfigError("encryption_key_file", f"{path}: no such key file") from None
    except OSError as exc:  # a directory in its place, an I/O error
        raise ConfigError("encryption_key_file",
                          f"{path}: the key file cannot be read ({exc.strerror or exc})") from exc
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON
        raise ConfigError("encryption_key_file", f"{path}: not valid JSON ({exc})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError("encryption_key_file",
                          f"{path}: group or others may access it (chmod 600)")
    if not isinstance(document, dict) or document.get("format") != FORMAT \
            or document.get("version") not in VERSIONS \
            or not isinstance(document.get("keys"), dict) \
            or not isinstance(document.get("checks", {}), dict):
        raise ConfigError("encryption_key_file",
                          f"{path}: not a Weir key file (format {FORMAT} v{VERSION})")
    return document


def _read_bounded(path: Path) -> tuple[int, bytes]:
    """The mode and bytes of a regular file of at most MAX_KEY_FILE_BYTES; ConfigError for
    anything else (a device such as /dev/zero, a FIFO, a directory), opened without blocking."""
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("encryption_key_file", f"{path}: not a regular file")
        data = f.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError("encryption_key_file", f"{path}: more than {MAX_KEY_FILE_BYTES} "
                                                 "bytes, too large for a key file")
    return info.st_mode, data


def _check_keys(path: Path, keys: dict[str, bytes], checks: dict[str, Any] | None,
                version: int) -> None:
    """Each key against its check value: all of them in version 2, those given in 1."""
    checks = checks or {}
    for key_id, key in keys.items():
        if key_id not in checks and version < 2:
            continue
        if key_id not in checks:
            raise ConfigError("encryption_key_file", f"{path}: key {key_id!r} has no check "
                                                     "value (damaged key file)")
        if checks[key_id] != key_check_value(key):
            raise ConfigError("encryption_key_file",
                              f"{path}: key {key_id!r} does not match its check value "
                              f"{checks[key_id]!r} (a damaged key: restore the key file "
                              "from your copy)")


class BatchSealer:
    """Seals the records of one partition's batches: AES-256-GCM with the key ring's active
    key, the associated data being the channel name, the partition and the batch header
    fields — so a batch copied into another channel or partition fails to open."""

    def __init__(self, keys: KeyRing, channel: str, partition: int) -> None:
        self.keys = keys
        self._context = f"weir-batch/{channel}/{partition}/".encode()

    def seal(self, records: bytes, header_fields: bytes) -> bytes:
        """Encrypt a batch's records."""
        return self.keys.seal(records, self._context + header_fields)

    def open(self, unit: bytes, header_fields: bytes) -> bytes:
        """Decrypt a batch's records; DecryptionError on a wrong key or damage."""
        return self.keys.open(unit, self._context + header_fields)

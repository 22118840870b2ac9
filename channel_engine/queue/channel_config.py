"""ChannelConfig: every setting of a channel, defined once with its default, check and doc.

A channel (Flume's FileChannel) is 1..N partition logs spread round-robin over its
data_dirs (Flume dataDirs, Kafka log.dirs), with its queue checkpoints in
checkpoint_dir (its *home*, where this config is saved as channel.json) and, with
use_dual_checkpoints, a backup copy in backup_checkpoint_dir. Defaults follow
Flume's FileChannel where Flume has the setting (capacity 1,000,000,
transactionCapacity 10,000, keep-alive 3 s, minimumRequiredSpace 500 MB,
checkpointInterval 30 s) and Kafka's log settings for the log layer, except
retention: a channel never drops untaken events unless retention_ms or
retention_bytes opts in (a Flume user expects a queue, not a log with expiry).

channel.json (the home's copy of the config):

    field      type     meaning
    ---------  -------  ------------------------------------------------------
    format     string   "weir-channel-config"
    version    int      2 (save writes it); version 1 (no crc32c) is still read
    name       string   the channel name
    data_dirs  [string] absolute directories holding the partition logs
    ...        ...      every other setting of this class, by name
    crc32c     int      CRC-32C of the canonical JSON of the settings (every field
                        but format, version and crc32c; sorted keys, no spaces);
                        version 2 needs it

A channel.json whose settings do not match its crc32c (a flipped bit that would
silently change a setting: a data dir, a partition count) is a ConfigError naming
the file: open refuses it, and `recover HOME --config FILE` (or `manage.py
channel_tool recover NAME`) rewrites it from the supplied settings. A version 1
file opens unchanged and gets its crc32c at the next save (every writable open).

Partition i lives in data_dirs[i % len(data_dirs)] / "<name>-<i>", Kafka's
"<topic>-<partition>" directory name.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import ConfigError
from channel_engine.log.config import LogConfig, check_int, require

CONFIG_FILE = "channel.json"
FORMAT = "weir-channel-config"
VERSION = 2
VERSIONS = (1, 2)  # 1: no crc32c
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,199}")  # whole name: fullmatch ("$" passes "a\n")
# The settings that ChannelConfig hands straight to each partition's LogConfig.
LOG_SETTINGS = ("durability", "flush_messages", "flush_ms", "segment_bytes", "segment_ms",
                "index_interval_bytes", "preallocate", "retention_ms", "retention_bytes",
                "compression")


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


def _log_setting(name: str) -> Any:
    """A setting ChannelConfig passes on to LogConfig unchanged: its default and doc are
    LogConfig's, written there once."""
    owner = LogConfig.__dataclass_fields__[name]
    return field(default=owner.default, metadata=owner.metadata)


@dataclass(frozen=True)
class ChannelConfig:
    """Settings of one channel. Frozen: build a new one with `replace()`."""

    name: str = field(metadata=_doc("Channel name: [a-z0-9][a-z0-9_-]*, at most 200 characters."))
    data_dirs: tuple[str, ...] = field(metadata=_doc(
        "Absolute directories for the partition logs, used round-robin (Flume dataDirs)."))
    checkpoint_dir: str = field(metadata=_doc(
        "Absolute directory for the queue checkpoint and channel.json: the channel's home."))
    partitions: int = field(default=1, metadata=_doc(
        "Number of partition logs. A keyed event goes by its key's hash; a put's keyless "
        "events go together to one partition, taken in turn (in fsync durability, often the "
        "one whose fsync other puts are waiting for, as Kafka's sticky partitioner does)."))
    capacity: int = field(default=1_000_000, metadata=_doc(
        "Most committed, untaken events the channel holds (Flume capacity). Changing it "
        "needs no rebuild."))
    transaction_capacity: int = field(default=10_000, metadata=_doc(
        "Most events one put or take transaction may hold (Flume transactionCapacity)."))
    keep_alive_ms: int = field(default=3_000, metadata=_doc(
        "How long a put waits for room in a full channel before failing (Flume keep-alive)."))
    minimum_required_space: int = field(default=524_288_000, metadata=_doc(
        "Puts fail, writing nothing, when a data or checkpoint dir has less free space than "
        "this many bytes (Flume minimumRequiredSpace)."))
    checkpoint_interval_ms: int = field(default=30_000, metadata=_doc(
        "Time between queue checkpoints (Flume checkpointInterval)."))
    checkpoint_on_close: bool = field(default=True, metadata=_doc(
        "Write a checkpoint when the channel closes (Flume checkpointOnClose)."))
    use_dual_checkpoints: bool = field(default=False, metadata=_doc(
        "Copy each checkpoint to backup_checkpoint_dir (Flume useDualCheckpoints)."))
    backup_checkpoint_dir: str | None = field(default=None, metadata=_doc(
        "Absolute directory for the backup checkpoint; required with use_dual_checkpoints and "
        "different from checkpoint_dir (Flume backupCheckpointDir)."))
    durability: str = _log_setting("durability")
    flush_messages: int | None = _log_setting("flush_messages")
    flush_ms: int | None = _log_setting("flush_ms")
    segment_bytes: int = _log_setting("segment_bytes")
    segment_ms: int = _log_setting("segment_ms")
    index_interval_bytes: int = _log_setting("index_interval_bytes")
    preallocate: bool = _log_setting("preallocate")
    retention_ms: int = field(default=-1, metadata=_doc(
        "Opt in to dropping untaken events older than this (-1: never; taken segments are "
        "deleted anyway). Every dropped event is counted."))
    retention_bytes: int = field(default=-1, metadata=_doc(
        "Opt in to dropping the oldest untaken events while a partition is larger than this "
        "(-1: never). Every dropped event is counted."))
    compression: str = _log_setting("compression")
    encryption_key_file: str | None = field(default=None, metadata=_doc(
        "Absolute path of the key file (key id -> AES-256 key) for encryption at rest; "
        "None: no encryption."))
    encryption_active_key: str | None = field(default=None, metadata=_doc(
        "Key id used for new batches; older keys in the file stay readable (key rotation)."))

    def __post_init__(self) -> None:
        if isinstance(self.data_dirs, (list, str)):
            dirs = [self.data_dirs] if isinstance(self.data_dirs, str) else self.data_dirs
            object.__setattr__(self, "data_dirs", tuple(str(d) for d in dirs))
        _check(self)
        self.log_config()  # the log layer checks its own settings, naming the field

    def replace(self, **changes: Any) -> ChannelConfig:
        """Return a copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def log_config(self) -> LogConfig:
        """The LogConfig every partition of this channel uses."""
        return LogConfig(**{name: getattr(self, name) for name in LOG_SETTINGS})

    def partition_dir(self, partition: int) -> Path:
        """Directory of one partition log: round-robin over data_dirs."""
        return Path(self.data_dirs[partition % len(self.data_dirs)]) / f"{self.name}-{partition}"

    @property
    def home(self) -> Path:
        """The channel's home: its checkpoint_dir, where channel.json lives."""
        return Path(self.checkpoint_dir)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable settings."""
        out = dataclasses.asdict(self)
        out["data_dirs"] = list(self.data_dirs)
        return out

    def save(self, create: bool = True) -> Path:
        """Write channel.json into the home, atomically (creating the home only if `create`:
        else FileNotFoundError if it is gone); return its path."""
        if create:
            self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / CONFIG_FILE
        settings = self.to_dict()
        document = {"format": FORMAT, "version": VERSION, **settings,
                    "crc32c": settings_crc(settings)}
        write_atomically(path, (json.dumps(document, indent=2) + "\n").encode())
        return path

    @classmethod
    def load(cls, home: str | Path) -> ChannelConfig:
        """Read channel.json from a channel's home (or the file itself); ConfigError naming
        the file (and the byte, for bad JSON) if it is missing or damaged."""
        path = Path(home)
        if path.is_dir():
            path = path / CONFIG_FILE
        return cls.from_document(_read_document(path), path)

    @classmethod
    def from_document(cls, document: Any, path: str | Path) -> ChannelConfig:
        """The config of a channel.json document (format and version included), or of a
        plain JSON object of settings; ConfigError naming `path` and the setting."""
        if not isinstance(document, dict):
            raise ConfigError("home", f"{path}: not a Weir channel config (not a JSON object)")
        document = dict(document)
        if "format" in document and document.pop("format") != FORMAT:
            raise ConfigError("home", f"{path}: not a Weir channel config")
        version = document.pop("version", None)
        if version is not None and version not in VERSIONS:
            raise ConfigError("version", f"{path}: version {version!r} is not supported")
        stored_crc = document.pop("crc32c", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(document) - known)
        if unknown:
            raise ConfigError(unknown[0], f"{path}: unknown setting")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in document and f.default is dataclasses.MISSING)
        if missing:
            raise ConfigError(missing[0], f"{path}: required setting missing")
        try:
            config = cls(**document)
        except ConfigError as exc:
            raise ConfigError(exc.field, f"{path}: {exc.reason}") from exc
        except (TypeError, ValueError, AttributeError) as exc:  # a value of the wrong JSON type
            raise ConfigError("home", f"{path}: not a valid channel config ({exc})") from exc
        _check_crc(document, stored_crc, version, path)  # last: a valid value may be wrong
        return config

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Return each setting's documentation, by name."""
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}


def settings_crc(settings: dict[str, Any]) -> int:
    """CRC-32C of the canonical JSON (sorted keys, no spaces) of a channel's settings."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return crc32c.crc32c(canonical.encode())


def _check_crc(settings: dict[str, Any], stored: Any, version: int | None,
               path: str | Path) -> None:
    """Check the crc32c of a channel.json's settings (version 2 needs one; a plain settings
    object, without a version, may omit it)."""
    if stored is None:
        if version is not None and version >= 2:
            raise ConfigError("crc32c", f"{path}: no crc32c in a version {version} channel "
                                        "config (damaged)")
        return
    try:
        actual = settings_crc(settings)
    except (TypeError, ValueError) as exc:  # not JSON-serialisable cannot come from JSON
        raise ConfigError("crc32c", f"{path}: settings cannot be checked ({exc})") from exc
    if stored != actual:
        raise ConfigError("crc32c", f"{path}: settings do not match the stored crc32c "
                                    f"{stored!r} (computed {actual}): the file is damaged; "
                                    "supply the channel's settings to rewrite it")


def _read_document(path: Path) -> Any:
    """The parsed JSON of a channel.json, or ConfigError naming the file and the byte."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("home", f"{path}: no channel config here") from None
    except OSError as exc:  # a directory in its place, an I/O error
        raise ConfigError("home", f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("home", f"{path}: not valid JSON (byte {exc.start} is not "
                                  "UTF-8)") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        byte = len(text[:exc.pos].encode())
        raise ConfigError("home", f"{path}: not valid JSON (byte {byte}: {exc.msg})") from exc
    except (ValueError, RecursionError) as exc:  # nesting too deep, a huge number
        raise ConfigError("home", f"{path}: not valid JSON ({exc})") from exc


def _check_dir(name: str, value: object) -> None:
    require(isinstance(value, str) and Path(value).is_absolute(), name,
             f"must be an absolute path, not {value!r}")


def _check(c: ChannelConfig) -> None:
    require(isinstance(c.name, str) and bool(NAME.fullmatch(c.name)), "name",
             f"must match [a-z0-9][a-z0-9_-]* (at most 200 characters), not {c.name!r}")
    require(len(c.data_dirs) >= 1, "data_dirs", "needs at least one directory")
    for d in c.data_dirs:
        _check_dir("data_dirs", d)
    require(len(set(c.data_dirs)) == len(c.data_dirs), "data_dirs", "lists a directory twice")
    _check_dir("checkpoint_dir", c.checkpoint_dir)
    check_int(c, "partitions", 1, 10_000)
    check_int(c, "capacity", 1)
    check_int(c, "transaction_capacity", 1)
    require(c.transaction_capacity <= c.capacity, "transaction_capacity",
             f"{c.transaction_capacity} must not exceed capacity={c.capacity}")
    check_int(c, "keep_alive_ms", 0)
    check_int(c, "minimum_required_space", 0)
    check_int(c, "checkpoint_interval_ms", 1_000)
    for name in ("checkpoint_on_close", "use_dual_checkpoints"):
        require(isinstance(getattr(c, name), bool), name, "must be true or false")
    if c.use_dual_checkpoints:
        _check_dir("backup_checkpoint_dir", c.backup_checkpoint_dir)
        require(Path(str(c.backup_checkpoint_dir)) != Path(c.checkpoint_dir),
                 "backup_checkpoint_dir", "must differ from checkpoint_dir")
    elif c.backup_checkpoint_dir is not None:
        _check_dir("backup_checkpoint_dir", c.backup_checkpoint_dir)
    if c.encryption_key_file is not None:
        _check_dir("encryption_key_file", c.encryption_key_file)
        require(isinstance(c.encryption_active_key, str) and bool(c.encryption_active_key),
                 "encryption_active_key", "is required with encryption_key_file")
    else:
        require(c.encryption_active_key is None, "encryption_active_key",
                 "needs encryption_key_file")

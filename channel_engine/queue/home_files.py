"""The files of a channel's home, and what a home may hold that the engine did not write.

A home (the channel's checkpoint_dir) holds `channel.json`, the checkpoint, the commit
journals, `losses.json`, the owner's `.lock` and `owner.sock`, the drains' id (channel_id.py)
and the locks of the export and the Kafka sink (written by spark/export_lock.py,
kafka_sink/job.py, appliance/exports.py and appliance/kafka_sinks.py, named here so the
engine need not import Spark, aiokafka or Django). It may also hold the channel's
partition, backup or key directories when the settings put them there.

Anything else is a stranger: a writable open and `recover` move it aside by renaming it
`<name>.stray` (never deleting it) and report it; `verify` reports it. So is anything
but a regular file (a directory, a socket, a dangling symlink) under the name of an
engine file the engine rewrites — `channel.json`, `checkpoint` and `losses.json` in
the home, `checkpoint` in backup_checkpoint_dir (`not_regular`): a writable open and
`recover` move it to `<name>.stray` too, and the engine then writes the proper file;
`verify` reports the file as unreadable. Originals kept aside
(`.damaged`, `.damaged-<tag>`, `.stray`) and `.tmp` files of our own interrupted writes
are noted, never moved again. A directory the engine did not make is noted and left
alone (it may be an operator's mount point).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from channel_engine.channel_id import is_temp_name
from channel_engine.errors import ChannelEngineError
from channel_engine.filenames import LOCK_FILE, SOCKET_NAME, TMP_SUFFIX, is_kept_aside
from channel_engine.log.incarnation import cut_short, made_again
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig

LOSSES_FILE = "losses.json"
HOME_FILES = frozenset({CONFIG_FILE, checkpoint_file.FILE_NAME, LOCK_FILE, SOCKET_NAME,
                        LOSSES_FILE, "export.id", "export.lock", "export-run.lock",
                        "kafka-sink.lock", "kafka-sink-run.lock"})


@dataclass
class HomeStrays:
    """What a look at a home found besides the engine's own files."""

    strays: list[Path] = field(default_factory=list)  # files to move aside
    notes: list[str] = field(default_factory=list)  # kept-aside files, our .tmp, foreign dirs


def is_ours(name: str) -> bool:
    """Is `name` a file the engine writes in a home (or keeps aside)?"""
    return name in HOME_FILES or commit_journal.is_journal_name(name) or is_kept_aside(name)


def find_strays(home: Path, config: ChannelConfig | None) -> HomeStrays:
    """The strangers in `home` (see the module doc); reads the directory, changes nothing."""
    found = HomeStrays()
    ours = _our_directories(config)
    for name in sorted(os.listdir(home)):
        path = home / name
        if name in HOME_FILES or commit_journal.is_journal_name(name) or path.resolve() in ours:
            continue
        if is_kept_aside(name):
            found.notes.append(f"{path}: kept aside by an earlier recover or open")
        elif name.endswith(TMP_SUFFIX) and is_ours(name[: -len(TMP_SUFFIX)]):
            found.notes.append(f"{path}: left by an interrupted write (replaced by the next)")
        elif is_temp_name(name):
            found.notes.append(f"{path}: a drain's id being made, or left by a drain killed "
                               "while making it (export.id holds the id; delete it then)")
        elif path.is_dir():
            found.notes.append(f"{path}: a directory the engine did not make (left alone)")
        else:
            found.strays.append(path)
    return found


REWRITTEN_FILES = (CONFIG_FILE, checkpoint_file.FILE_NAME, LOSSES_FILE)


def not_regular(config: ChannelConfig) -> list[Path]:
    """Engine files the engine rewrites that are there but no regular file (see the module
    doc): a directory in place of channel.json, say. Reads, changes nothing."""
    places = [config.home / name for name in REWRITTEN_FILES]
    if config.use_dual_checkpoints and config.backup_checkpoint_dir:
        places.append(Path(config.backup_checkpoint_dir) / checkpoint_file.FILE_NAME)
    return [p for p in places if os.path.lexists(p) and not p.is_file()]


def missing_places(config: ChannelConfig) -> list[Path]:
    """What a channel that exists must have and has not: its home (or the home's
    channel.json) and each partition directory — one of a recreate cut short, or an empty
    one of a partition a checkpoint records (existed_partitions), counts as missing
    (log/incarnation.py: the vanished directory made again by someone, or a volume not
    mounted; recreated only by the operator's word, with its next offsets). A backup
    checkpoint directory is not among them (the primary checkpoint is the channel's; the
    backup is rewritten at each checkpoint). Reads, changes nothing."""
    home = config.home
    missing = [home] if not home.is_dir() else \
        [home / CONFIG_FILE] if not (home / CONFIG_FILE).is_file() else []
    existed: int | None = None  # read only when a directory is found empty
    for partition in range(config.partitions):
        directory = config.partition_dir(partition)
        if not directory.is_dir() or cut_short(directory):
            missing.append(directory)
        elif made_again(directory):
            if existed is None:
                existed = existed_partitions(config, config.partitions)
            if partition < existed:
                missing.append(directory)
    return missing


def existed_partitions(config: ChannelConfig, saved: int) -> int:
    """How many partitions of the channel existed with their files: the count its newest
    readable checkpoint copy (primary or backup) records, as a checkpoint is written only
    once every partition directory of its open has its files; `saved` (the partitions its
    channel.json had) when copies are there but none can be read (which existed cannot be
    told: each is taken to have existed); 0 with no copy (a channel never opened to its
    end). Reads, changes nothing."""
    backup = config.backup_checkpoint_dir
    backup_dir = Path(backup) if config.use_dual_checkpoints and backup else None
    found = checkpoint_file.read_newest(config.home, backup_dir)
    if found.checkpoint is not None:
        return min(len(found.checkpoint.partitions), saved)
    copies = [d / checkpoint_file.FILE_NAME for d in (config.home, backup_dir) if d]
    return saved if any(os.path.lexists(p) for p in copies) else 0


def missing_saved_places(config: ChannelConfig) -> list[Path]:
    """missing_places, of the partitions the home's channel.json says were made: an open
    that grows the channel makes the new ones. Reads, changes nothing."""
    missing = missing_places(config)
    if missing[:1] in ([config.home], [config.home / CONFIG_FILE]):
        return missing
    try:
        saved = ChannelConfig.load(config.home).partitions
    except (ChannelEngineError, OSError):  # the open says what is wrong with it
        return missing
    made = {config.partition_dir(p) for p in range(min(saved, config.partitions))}
    return [d for d in missing if d in made]


def _our_directories(config: ChannelConfig | None) -> set[Path]:
    if config is None:
        return set()
    places = [config.partition_dir(i) for i in range(config.partitions)]
    places += [Path(p) for p in (config.backup_checkpoint_dir, config.encryption_key_file) if p]
    found = set()
    for place in places:  # the place itself, or the directory of the home that holds it
        resolved = place.resolve()
        found |= {resolved, *resolved.parents}
    return found

"""Preparing a channel's home for an owner's open: the lock, channel.json, strays.

Only an open with create=True (a new channel; Channel.open's first election)
makes a missing home; create=False (every re-election) raises ChannelGoneError
when the home holds no channel.json — the channel was deleted — and creates
nothing. A writable open, under the lock: moves anything but a regular file in
place of channel.json, the checkpoints or losses.json to `<name>.stray`
(home_files.not_regular); refuses a config that would strand events (another
name or data dirs, fewer partitions: ConfigError); keeps a channel.json that
fails to load (its crc32c, say) aside as `channel.json.damaged` and saves the
given config; moves strays aside. Each move is a line for the recovery report;
nothing is ever deleted. A read-only open only checks that the home exists.

A new channel (Channel.create: the creator's word, `new`) is checked to be one, under the
lock and before anything is written: no channel.json, checkpoint (either copy), commit
journal or losses.json in its home, and nothing in its partition directories; else
ChannelExistsError. Only then does its open report no missing checkpoint: an open cannot
tell a channel made now from one whose home and data were wiped together. A create that
fails after this check removes what it wrote (new_channel.py), so a retry is not refused.

Concurrency: runs once per open, before any other thread can use the owner;
the home lock (home_lock.py) keeps a second owner out.
"""
from __future__ import annotations

from pathlib import Path

from channel_engine.atomic_file import move_aside
from channel_engine.errors import ChannelExistsError, ConfigError, UnusableFileError
from channel_engine.filenames import DAMAGED_SUFFIX, STRAY_SUFFIX
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.home_files import LOSSES_FILE, find_strays, not_regular
from channel_engine.queue.home_lock import HomeLock
from channel_engine.queue.new_channel import NewChannel


def prepare_home(config: ChannelConfig, home_lock: HomeLock, read_only: bool,
                 create: bool, new: NewChannel | None = None) -> tuple[list[str], int]:
    """Make (with `create`), lock and tidy the home (with `new`, check that no channel is
    there first, and mark the create as one whose files a failure may remove); return the
    recovery report's lines and how many partitions were saved before (their directories
    must exist)."""
    home = config.home
    strays: list[str] = []
    saved_partitions = config.partitions  # partitions whose directory must exist
    if read_only:
        if not home.is_dir():
            raise FileNotFoundError(f"{home}: no channel home here")
    elif create:
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in its place, say
            raise UnusableFileError(home, "the channel's home directory", exc) from exc
        strays = home_lock.take()
        if new is not None:
            _check_new(config)
            new.checked = True  # from here on, what is written in these places is ours
    else:
        home_lock.check_not_deleted()
        try:
            strays = home_lock.take()
        except UnusableFileError:
            home_lock.check_not_deleted()  # the home went meanwhile
            raise
        home_lock.check_not_deleted()  # deleted while the lock was taken: let go of it
    if not read_only:
        strays += _move_not_regular(config)
        saved_strays, saved_partitions = _check_against_saved(config)
        strays += saved_strays
        try:
            config.save(create=create)
        except FileNotFoundError:
            home_lock.check_not_deleted()
            raise
        strays += _move_home_strays(config)
    return strays, saved_partitions


def _check_new(config: ChannelConfig) -> None:
    """ChannelExistsError naming the first file of a channel found where a new one goes."""
    home = config.home
    names = [CONFIG_FILE, checkpoint_file.FILE_NAME, LOSSES_FILE]
    found = [home / name for name in names if (home / name).exists()]
    found += [commit_journal.journal_path(home, g) for g in commit_journal.generations(home)]
    backup = config.backup_checkpoint_dir
    if config.use_dual_checkpoints and backup:
        found += [p for p in [Path(backup) / checkpoint_file.FILE_NAME] if p.exists()]
    for partition in range(config.partitions):
        directory = config.partition_dir(partition)
        if directory.is_dir() and any(directory.iterdir()):
            found.append(directory)
    if found:
        raise ChannelExistsError(found[0], "a channel's files are there")


def _check_against_saved(config: ChannelConfig) -> tuple[list[str], int]:
    """Refuse changes that would strand events: another name or other data dirs (the
    partitions live where they are), fewer partitions (keys would move). Everything
    else may change between opens, capacity included. A damaged channel.json is kept
    aside (`channel.json.damaged`) for the save of the given config; return a line
    for the recovery report then, and the saved partition count (the given one if
    none was saved)."""
    path = config.home / CONFIG_FILE
    try:
        saved = ChannelConfig.load(path)
    except ConfigError as exc:
        if not path.is_file():
            return [], config.partitions
        target = move_aside(path, DAMAGED_SUFFIX)
        return [f"{path}: damaged ({exc.reason}); kept aside as {target}, rewritten from "
                "the given config"], config.partitions
    for name in ("name", "data_dirs"):
        if getattr(saved, name) != getattr(config, name):
            raise ConfigError(name, f"channel in {config.home} has {name}="
                                    f"{getattr(saved, name)!r}; it cannot change (its "
                                    "partition logs live there)")
    if saved.partitions > config.partitions:
        raise ConfigError("partitions", f"channel {config.name!r} has {saved.partitions} "
                                        f"partitions; it cannot shrink to "
                                        f"{config.partitions}")
    return [], saved.partitions


def _move_not_regular(config: ChannelConfig) -> list[str]:
    """Move a directory (or anything but a regular file) in place of an engine file the
    open rewrites to `<name>.stray` (never deleting it); one line per file moved."""
    moved = []
    for path in not_regular(config):
        target = move_aside(path, STRAY_SUFFIX)
        moved.append(f"{path}: not a regular file, moved aside to {target}; the engine "
                     "writes a new one")
    return moved


def _move_home_strays(config: ChannelConfig) -> list[str]:
    """Move files the engine did not write out of the home's way (never deleting them);
    return one line per file for the recovery report (home_files.py has the rule)."""
    moved = []
    for path in find_strays(config.home, config).strays:
        target = move_aside(path, STRAY_SUFFIX)
        moved.append(f"{path}: a stray file the engine did not write, moved aside to {target}")
    return moved

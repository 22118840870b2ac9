"""NewChannel: undoing a Channel.create that failed, so that a retry is not refused.

A create (ChannelOwner.open with new=True) writes, in this order: the home and `.lock`,
channel.json, the partition directories and their first segments, the first checkpoint
(primary, then backup), losses.json and the first commit journal. Any of these may fail
(ENOSPC, EIO, a key file that cannot be read). Left behind, channel.json or a segment file
would make every retry a ChannelExistsError (home_setup.py checks a new channel's places hold
no channel's files), for a channel that never was.

So a failed create removes what it wrote, under the home's lock (no other process can be
using the place meanwhile), before it lets go of the lock:

    place                      removed                                    when
    -------------------------  -----------------------------------------  ----------------
    the home                   channel.json, checkpoint, losses.json,     always
                               commit journals, owner.sock, their .tmp,
                               then .lock
    backup_checkpoint_dir      checkpoint and its .tmp                    dual checkpoints
    each partition directory   everything in it                           always
    any of these directories   the directory itself, if empty             it was missing
                                                                          before the create

Only a create whose check passed undoes anything (`checked`): the home and partition
directories held no channel's files then (home_setup._check_new), so everything named
above is the create's own. A create refused because a channel is there (ChannelExistsError)
removes nothing. Files the open moved aside as strays (`<name>.stray`) stay where they are:
they are kept, never deleted. Directories that existed before (an operator's mount point)
are kept, empty. What cannot be removed (an I/O error) is returned, for the caller to add to
its error: the undo never hides the error that made the create fail.

Concurrency: called by the owner's open, in one thread, holding the home lock.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from channel_engine.filenames import LOCK_FILE, SOCKET_NAME, TMP_SUFFIX
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.home_files import LOSSES_FILE

HOME_WRITES = (CONFIG_FILE, checkpoint_file.FILE_NAME, LOSSES_FILE, SOCKET_NAME)


class NewChannel:
    """A create in progress: the directories it will make, and whether its check passed."""

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self.missing = _missing_dirs(self.places())  # before anything is made
        self.checked = False  # set by home_setup once no channel's files were found

    def places(self) -> list[Path]:
        """The directories a create writes in: home, backup dir, partition directories."""
        config = self.config
        places = [config.home]
        if config.use_dual_checkpoints and config.backup_checkpoint_dir:
            places.append(Path(config.backup_checkpoint_dir))
        return places + [config.partition_dir(p) for p in range(config.partitions)]

    def undo(self) -> list[str]:
        """Remove what the create wrote (module doc); return what could not be removed."""
        if not self.checked:
            return []
        failed: list[str] = []
        config = self.config
        for partition in range(config.partitions):
            directory = config.partition_dir(partition)
            if directory.is_dir() and not directory.is_symlink():
                for entry in os.listdir(directory):
                    _remove(directory / entry, failed)
        if config.use_dual_checkpoints and config.backup_checkpoint_dir:
            backup = Path(config.backup_checkpoint_dir)
            for name in (checkpoint_file.FILE_NAME, checkpoint_file.FILE_NAME + TMP_SUFFIX):
                _remove(backup / name, failed)
        home = config.home
        if home.is_dir():
            names = [*HOME_WRITES, *(n for n in os.listdir(home)
                                     if commit_journal.is_journal_name(n))]
            for name in names:
                for path in (home / name, home / (name + TMP_SUFFIX)):
                    _remove(path, failed)
            _remove(home / LOCK_FILE, failed)  # held by us: no one else is in the home
        for directory in self.missing:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{directory}: {exc.strerror or exc}")
        return failed


def _remove(path: Path, failed: list[str]) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        failed.append(f"{path}: {exc.strerror or exc}")


def _missing_dirs(places: list[Path]) -> list[Path]:
    """The directories (parents included) that do not exist yet, deepest first."""
    missing: set[Path] = set()
    for path in places:
        while not os.path.lexists(path) and path != path.parent:
            missing.add(path)
            path = path.parent
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)

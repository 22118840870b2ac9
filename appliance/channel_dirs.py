"""Where a channel's directories may be, which of them are its own, and what delete removes.

Every directory setting — data_dirs, checkpoint_dir (the home), backup_checkpoint_dir,
and a partition directory that is a symlink — is judged with symlinks and `..`
resolved (a `..` part is refused outright). check_paths() (no database) wants each:

- strictly inside a data root (WEIR_DATA_ROOT), never a root itself;
- clear of the appliance's own files: its code (BASE_DIR), WEIR_VAR_DIR, the SQLite
  database, the secret key, the logs, WEIR_KEY_DIR and a local WEIR_EXPORT_URI. It may
  not be or hold one of these, nor lie inside one unless the data root does too (the
  default root, var/channels, lies in WEIR_VAR_DIR).

A channel's *own* directories are its home, its backup checkpoint dir, its partition
directories (`<data dir>/<name>-<i>`) and every directory it recorded as its own; its
data dirs are containers that channels may share exactly, as topics share Kafka's
log.dirs. check_others() wants, between two channels: no own directory of one equal to,
holding or inside any directory of the other — except a partition directory directly in
a data dir both channels name — and data dirs equal or apart. So two channels never share
a home, and no channel's directory reaches into another's. Within a channel, the home and
backup dir are no partition directory and lie in none (a home may hold partition dirs).

Ownership: a channel owns the directories it created, recorded in Channel.owned_dirs
(resolved paths) at create and when a change makes more (new partitions, a new backup
dir). An own directory that exists before the channel must be empty (fresh()) and is
used, never owned: delete leaves it. removable() is what a delete may remove: an owned
directory still where it was recorded (no symlink on the way), inside a data root, clear
of the appliance's files and of every other channel's directories; one the channel made
only to hold others (a data dir, a parent) goes only if empty; the temp directory a
recreate cut short left beside an owned partition directory (`<name>-<i>.tmp`,
channel_engine.recreate_temp_dir) goes with it, so the data dir can go too. remove() first renames
each tree aside (`.<name>.deleted-<hex>` in its parent, one atomic rename) and then
removes it: processes of other workers may still hold the deleted channel open until
their channel watcher closes it, and work by path — an owner checkpointing at close, a
client electing a new owner, a segment rolling. Renamed, the path is gone at once for
them all (they fail, nothing is made again, see channel_engine/channel.py), so no file
lands in a tree while it is removed, and no half-removed directory is left under the
channel's name to refuse its re-create ("exists and is not empty") with no row to delete
it. A tree that still cannot be removed is logged and left aside, under its hidden name.

Concurrency: lock() updates the one DirectoryLock row — a row lock in PostgreSQL, the
write lock in SQLite — held until the transaction ends. appliance.manage_channels runs
lock, checks, save, the engine's open (which makes the directories) and a delete's
removal in one transaction.atomic(), so checks against all channels never race.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from appliance.models import Channel, DirectoryLock
from channel_engine import ChannelConfig, recreate_temp_dir

OVERLAP = "overlaps a directory of another channel"
log = logging.getLogger(__name__)


def lock() -> None:
    """Serialise directory checks with every other create, change and delete (module doc);
    call inside transaction.atomic()."""
    if not DirectoryLock.objects.filter(pk=1).update(changes=F("changes") + 1):
        with transaction.atomic():  # a savepoint: a racing insert's IntegrityError stays here
            DirectoryLock.objects.get_or_create(pk=1)
        DirectoryLock.objects.filter(pk=1).update(changes=F("changes") + 1)


def data_roots() -> list[Path]:
    """WEIR_DATA_ROOTS, resolved."""
    return [Path(root).resolve() for root in settings.WEIR_DATA_ROOTS]


def appliance_paths() -> list[tuple[str, Path]]:
    """The appliance's own files and directories (resolved), each with what it is."""
    var = Path(settings.VAR_DIR)
    places = [("the appliance's code", Path(settings.BASE_DIR)), ("WEIR_VAR_DIR", var),
              ("the secret key", var / "secret_key"), ("the logs", var / "log"),
              ("WEIR_KEY_DIR", Path(settings.WEIR_KEY_DIR))]
    database = settings.DATABASES["default"]
    if database.get("ENGINE") == "django.db.backends.sqlite3" and database.get("NAME"):
        places.append(("the database", Path(str(database["NAME"]))))
    export = urlsplit(str(settings.WEIR_EXPORT_URI))
    if export.scheme == "file":
        places.append(("WEIR_EXPORT_URI", Path(export.path)))
    return [(what, path.resolve()) for what, path in places]


def _path_settings(config: ChannelConfig) -> list[tuple[str, str]]:
    places = [("data_dirs", d) for d in config.data_dirs]
    places.append(("checkpoint_dir", config.checkpoint_dir))
    if config.backup_checkpoint_dir:
        places.append(("backup_checkpoint_dir", config.backup_checkpoint_dir))
    for partition in range(config.partitions):  # one lstat each: only symlinks are judged
        directory = config.partition_dir(partition)
        if directory.is_symlink():
            places.append(("data_dirs", str(directory)))
    return places


def check_paths(config: ChannelConfig) -> None:
    """Every directory of `config` inside a data root and clear of the appliance's files;
    ValidationError naming the setting otherwise."""
    roots, appliance = data_roots(), appliance_paths()
    for setting, directory in _path_settings(config):
        if ".." in Path(directory).parts:
            raise ValidationError({setting: f"{directory}: '..' is not allowed in a path"})
        resolved = Path(directory).resolve()
        if resolved in roots:
            raise ValidationError({setting: f"{directory} is a data root itself (WEIR_DATA_"
                                            "ROOT): name a directory inside it"})
        root = _root_of(resolved, roots)
        if root is None:
            allowed = ", ".join(str(r) for r in roots)
            raise ValidationError({setting: f"{directory} is outside WEIR_DATA_ROOT "
                                            f"({allowed})"})
        for what, place in appliance + [("a data root", r) for r in roots if r != root]:
            if _collides(resolved, place, root):
                raise ValidationError({setting: f"{directory} overlaps {what} ({place})"})


def _root_of(path: Path, roots: list[Path]) -> Path | None:
    """The data root `path` lies strictly inside (the nearest, should roots nest)."""
    return max((r for r in roots if r in path.parents), default=None, key=lambda r: len(r.parts))


def _collides(directory: Path, place: Path, root: Path) -> bool:
    """Is `directory` `place`, does it hold it, or lie in it while its data root does not?"""
    if directory == place or place.is_relative_to(directory):
        return True
    return directory.is_relative_to(place) and not root.is_relative_to(place)


@dataclass
class Dirs:
    """A channel's directories, resolved: its own ones (by setting) and its data dirs."""

    own: list[tuple[str, Path]] = field(default_factory=list)
    data: list[Path] = field(default_factory=list)
    partitions: set[Path] = field(default_factory=set)
    containers: set[Path] = field(default_factory=set)  # owned, made to hold the others


def dirs_of(row: Channel) -> Dirs:
    """A row's directories from its raw fields (a row the engine refuses has them too)."""
    data = [Path(d).resolve() for d in (row.data_dirs or []) if isinstance(d, str)]
    found = Dirs(data=data, partitions=set(_partition_dirs(row, data)))
    found.own = [("checkpoint_dir", Path(str(row.checkpoint_dir)).resolve())]
    if row.backup_checkpoint_dir:
        found.own.append(("backup_checkpoint_dir", Path(row.backup_checkpoint_dir).resolve()))
    found.own += [("partitions", p) for p in sorted(found.partitions)]
    owned = [Path(text) for text in row.owned_dirs or []]
    places = [p for _, p in found.own] + owned
    for path in owned:
        if any(path == d or d.is_relative_to(path) for d in data) or any(
                p != path and p.is_relative_to(path) for p in places):
            found.containers.add(path)  # made to hold the others: removed only if empty
        elif path not in places[:len(found.own)]:
            found.own.append(("owned_dirs", path))  # a former backup dir, say
    return found


def _partition_dirs(row: Channel, data: list[Path]) -> list[Path]:
    count = row.partitions if isinstance(row.partitions, int) and row.partitions > 0 else 0
    if not data:
        return []
    paths = [data[i % len(data)] / f"{row.name}-{i}" for i in range(count)]
    return [p.resolve() if p.is_symlink() else p for p in paths]


class _Others:
    """Every directory of the other channels, indexed for the checks of one channel."""

    def __init__(self, rows: Iterable[Channel]) -> None:
        self.exact: dict[Path, str] = {}  # path -> "own" or "data"
        self.holds: dict[Path, bool] = {}  # strict ancestor -> holds only shared partitions
        for row in rows:
            theirs = dirs_of(row)
            for path in theirs.data:
                self.exact.setdefault(path, "data")
            for _, path in theirs.own:
                self.exact[path] = "own"
            for path in [*theirs.data, *(p for _, p in theirs.own)]:
                shared = path in theirs.partitions
                for parent in path.parents:
                    only = shared and parent == path.parent and parent in theirs.data
                    self.holds[parent] = self.holds.get(parent, True) and only

    def own_dir_collides(self, path: Path, in_data: set[Path]) -> bool:
        """Does one of this channel's own directories meet another channel's directory?"""
        if path in self.exact or path in self.holds:
            return True
        for parent in path.parents:
            kind = self.exact.get(parent)
            if kind == "own" or (kind == "data" and not (parent == path.parent
                                                         and parent in in_data)):
                return True
        return False

    def data_dir_collides(self, path: Path) -> bool:
        """Does one of this channel's data dirs meet another channel's directory?"""
        if self.exact.get(path) == "own" or not self.holds.get(path, True):
            return True
        return any(parent in self.exact for parent in path.parents)


def check_others(row: Channel) -> None:
    """`row`'s directories apart from every other channel's (module doc); ValidationError
    naming the setting. Call under lock()."""
    mine = dirs_of(row)
    _check_own(mine)
    others = _Others(Channel.objects.exclude(pk=row.pk))
    partitions_in = {p.parent for p in mine.partitions}
    for setting, path in mine.own:
        in_data = partitions_in if path in mine.partitions else set()
        if others.own_dir_collides(path, in_data):
            setting = "data_dirs" if setting == "partitions" else setting
            raise ValidationError({setting: f"{path} {OVERLAP}"})
    for path in mine.data:
        if others.data_dir_collides(path):
            raise ValidationError({"data_dirs": f"{path} {OVERLAP}"})


def _check_own(mine: Dirs) -> None:
    """A home or backup dir is neither a partition directory nor inside one (a partition
    log moves files it did not write aside; a home may hold partition dirs, not the
    reverse)."""
    for setting, path in mine.own:
        if setting not in ("checkpoint_dir", "backup_checkpoint_dir"):
            continue
        inside = next((p for p in mine.partitions if path.is_relative_to(p)), None)
        if inside is not None:
            raise ValidationError({setting: f"{path} is or lies in the channel's partition "
                                            f"directory {inside}"})


def fresh(row: Channel, before: Channel | None = None) -> None:
    """Own directories new to `row` (all at create; those `before` had not, at a change)
    are missing or empty: a channel never adopts files it did not write."""
    had = {p for _, p in dirs_of(before).own} if before is not None else set()
    for setting, path in dirs_of(row).own:
        if path in had or not os.path.lexists(path):
            continue
        if not path.is_dir() or any(path.iterdir()):
            setting = "data_dirs" if setting == "partitions" else setting
            raise ValidationError({setting: f"{path} exists and is not empty: a channel's "
                                            "directories must be new or empty"})


def missing(row: Channel) -> list[str]:
    """The directories `row`'s files need that do not exist yet (parents included, up to
    the data root), resolved, deepest first: what opening it will create."""
    roots = set(data_roots())
    mine = dirs_of(row)
    made: set[Path] = set()
    for path in [*mine.data, *(p for _, p in mine.own)]:
        while path not in roots and not os.path.lexists(path) and path != path.parent:
            made.add(path)
            path = path.parent
    return [str(p) for p in sorted(made, key=lambda p: len(p.parts), reverse=True)]


def removable(row: Channel) -> tuple[list[Path], list[Path]]:
    """What a delete of `row` removes (module doc): (trees, empty dirs), deepest first but
    the home first of the trees (renamed aside, it tells every owner the channel is gone).
    Call under lock(); `row` may be deleted already (its pk None: no row is excluded)."""
    others = _Others(Channel.objects.exclude(pk=row.pk))
    roots, appliance = data_roots(), appliance_paths()
    mine = dirs_of(row)
    trees, empties = [], []
    for text in sorted(row.owned_dirs or [], key=lambda t: len(Path(t).parts), reverse=True):
        path = Path(text)
        if path in mine.partitions:  # whether or not the partition directory is there
            trees += _recreate_leftover(path, others, mine)
        if not os.path.lexists(path) or path.resolve() != path:  # a symlink on the way
            continue
        root = _root_of(path, roots)
        if root is None or any(_collides(path, place, root) for _, place in appliance):
            continue
        if path in mine.containers:
            if path not in others.exact and path not in others.holds:
                empties.append(path)
        elif not others.own_dir_collides(path, {p.parent for p in mine.partitions}):
            trees.append(path)
    trees.sort(key=lambda path: path != mine.own[0][1])
    return trees, empties


def _recreate_leftover(partition: Path, others: _Others, mine: Dirs) -> list[Path]:
    """The temp directory a recreate of an owned partition directory cut short left beside
    it (channel_engine.recreate_temp_dir), as a tree to remove with it."""
    left = recreate_temp_dir(partition)
    if not left.is_dir() or left.is_symlink() or left.resolve() != left:
        return []
    root = _root_of(left, data_roots())
    if root is None or any(_collides(left, place, root) for _, place in appliance_paths()):
        return []
    return [] if others.own_dir_collides(left, {p.parent for p in mine.partitions}) \
        else [left]


def remove(trees: list[Path], empties: list[Path]) -> None:
    """Remove what removable() found: trees whole (each renamed aside first, module doc;
    never following a symlink), the others only if empty."""
    aside = []
    for path in trees:
        if not os.path.lexists(path):
            continue  # moved aside with the home it lies in
        if path.is_dir() and not path.is_symlink():
            aside.append(_set_aside(path))
        else:  # a file where a directory belongs (damage that can stop an open)
            path.unlink(missing_ok=True)
    for path in aside:
        _remove_tree(path)
    for path in empties:
        try:
            path.rmdir()
        except OSError:
            pass  # not empty: something else lives there now


def _set_aside(path: Path) -> Path:
    """The tree renamed to a hidden name in its parent (or left where it is if it cannot
    be: then removed in place)."""
    hidden = path.with_name(f".{path.name}.deleted-{secrets.token_hex(4)}")
    try:
        os.rename(path, hidden)
    except OSError:
        log.warning("cannot rename %s aside before removing it", path, exc_info=True)
        return path
    return hidden


def _remove_tree(path: Path) -> None:
    for _ in range(3):  # a file a closing process made at its old path in flight
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
    log.warning("a deleted channel's directory %s could not be removed; remove it by hand",
                path)

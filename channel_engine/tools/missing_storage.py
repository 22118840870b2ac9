"""A channel's missing partition storage, in the operator's words: what verify reports for
it and why recover refuses to run while any is there.

Missing storage is no damage a repair can fix: a partition directory that is gone, one
found empty where a checkpoint says the partition existed (a volume not mounted, the tree
made again by someone: log/incarnation.py), or one of a recreate cut short (its
incarnation still pending: the operator's next offsets are applied only when a recreate
finishes it). Opening such a channel as `recover` does would write a new incarnation and
segments there without the operator's word and without counting the lost events, or
settle a pending incarnation at the checkpoint's end, losing the operator's next offsets.
So verify names each with the operator's way (mount the volume, put the directory back,
or recreate), and recover refuses before changing anything.

Reads only.
"""
from __future__ import annotations

from pathlib import Path

from channel_engine.errors import RepairRefusedError
from channel_engine.log.incarnation import cut_short
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.home_files import missing_places


def missing_partitions(config: ChannelConfig) -> list[tuple[int, Path]]:
    """(partition, directory) of each partition directory home_files.missing_places lists."""
    missing = set(missing_places(config))
    return [(p, config.partition_dir(p)) for p in range(config.partitions)
            if config.partition_dir(p) in missing]


def why_missing(config: ChannelConfig, directory: Path) -> str:
    """What is wrong with a missing partition directory and the operator's way out."""
    recreate = _recreate(config.name)
    if cut_short(directory):
        return (f"recreate cut short: recreate again with the same next offsets "
                f"({recreate} with the --next-offset values given before, if any)")
    if directory.is_dir():
        return (f"missing (empty): recreate ({recreate}); if it is the mount point of a "
                f"volume not mounted, mount the volume instead")
    return (f"missing: mount its volume or put the directory back; else recreate "
            f"({recreate})")


def missing_storage_error(config: ChannelConfig,
                          missing: list[tuple[int, Path]]) -> RepairRefusedError:
    """recover's refusal (module doc): each missing path, why, and the way out."""
    lines = "; ".join(f"partition {p}: {directory}: {why_missing(config, directory)}"
                      for p, directory in missing)
    return RepairRefusedError(
        f"channel {config.name!r}: recover repairs damage, not missing storage, and "
        f"changed nothing. {lines}. Then run recover again if verify still reports damage",
        [str(directory) for _, directory in missing])


def _recreate(name: str) -> str:
    return f"manage.py recreate_channel {name} --yes"

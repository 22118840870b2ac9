"""Partition incarnations as the drains see them: what a drain recorded as sent, checked
against the partition the channel has now, before a run takes anything.

A partition's incarnation (Kafka's topic ID, KIP-516, brought down to one partition) says
which storage its offsets belong to. A partition as first made is the ORIGINAL
incarnation; a partition directory made again by the operator's recreate of vanished
storage is a new incarnation, with an id of its own and the offset it starts at
(log/incarnation.py has the file). The recreated partition goes on at the end its
channel's checkpoint knew; when its owner died before a checkpoint recorded the real end,
that end lies below offsets already handed out, and maybe sent by a drain. A drain that
took its records of those offsets for the new events at the same offsets would skip them
as "already sent": a silent loss downstream. So each drain records, beside the ranges it
sent, the incarnation of each partition they belong to (the export's commit records, the
Kafka sink's offsets record; a record without it: the original incarnation), and at each
run, before its take, conflicts() compares:

    recorded under          ranges reaching                    verdict
    ----------------------  ---------------------------------  -----------------------
    another incarnation     below the current start offset     fine: events really sent
    another incarnation     at or above the current start      conflict: refused
    the current one         beyond the partition's log end     conflict: refused (a log
                                                               gone back, no recreate)

The last row is defence in depth: a log restored from an older copy (no recreate, so no
new incarnation) is caught only while it has not grown back past what was sent; a
recreate is caught whatever was put since.

A refused run takes and writes nothing; its error names the channel, the partition, the
start offset, the end the drain had sent and the operator's way out: recreate the
partition starting above what was sent (`manage.py recreate_channel NAME --yes
--next-offset P:N`, the API's and the UI's recreate with the same field).

A run checks once more after each take's reserve, before it plans what to send: an owner
that died during the run, and an operator's recreate that made a partition again before
the run's channel handle elected the next owner, would otherwise have the run subtract
the older incarnation's ranges from the new one's events (changed_since: the take is
rolled back, the run fails; the next run's check says what to do).

Pure functions, no I/O: the drains pass what Channel.incarnations() and their records
say.
"""
from __future__ import annotations

from dataclasses import dataclass

from channel_engine.offset_ranges import Range

ORIGINAL = "original"  # the incarnation of a partition never made again


@dataclass(frozen=True)
class PartitionIncarnation:
    """A partition's current incarnation and log end, as its channel reports them."""

    partition: int
    incarnation: str  # ORIGINAL or the recreate's id (32 hex digits)
    start_offset: int  # the first offset of this incarnation (0 for ORIGINAL)
    log_end_offset: int
    directory: str = ""  # where its files are (for the way out)


Recorded = dict[int, dict[str, list[Range]]]  # partition -> incarnation -> ranges sent


def conflicts(channel: str, current: list[PartitionIncarnation], recorded: Recorded,
              drain: str) -> list[str]:
    """One sentence per partition whose recorded ranges conflict with its incarnation now
    (the module doc's table), naming what the operator can do; [] when none does."""
    found = []
    for part in current:
        for incarnation, ranges in sorted(recorded.get(part.partition, {}).items()):
            sent_end = max((end for _, end in ranges), default=0)
            if incarnation != part.incarnation and sent_end > part.start_offset:
                found.append(_recreated(channel, part, sent_end, drain))
            elif incarnation == part.incarnation and sent_end > part.log_end_offset:
                found.append(_went_back(channel, part, sent_end, drain))
    return found


def _recreated(channel: str, part: PartitionIncarnation, sent_end: int, drain: str) -> str:
    return (f"channel {channel!r} partition {part.partition}: its storage was recreated, "
            f"starting at offset {part.start_offset}, but the {drain} had already sent "
            f"offsets up to {sent_end - 1} of the storage that vanished (the channel's last "
            f"checkpoint was older than what it sent). New events at offsets "
            f"{part.start_offset} to {sent_end - 1} would be taken for ones already sent, so "
            f"nothing was taken or written. To go on: stop producing to the channel, move "
            f"the partition directory {part.directory or '(its data directory)'} aside "
            f"(keep it: its events since the recreate can be read with the operator's dump "
            f"tool, `python -m channel_engine dump` on the moved directory; they are "
            f"recorded as lost), then "
            + _way_out(channel, part.partition, sent_end))


def _went_back(channel: str, part: PartitionIncarnation, sent_end: int, drain: str) -> str:
    return (f"channel {channel!r} partition {part.partition}: the {drain} had sent offsets "
            f"up to {sent_end - 1}, but the partition's log now ends at offset "
            f"{part.log_end_offset} (its files went back without a recreate: restored "
            f"from an older copy, or its owner crashed with the channel in flush-policy "
            f"durability, losing events not yet flushed that had been sent). New events at "
            f"offsets {part.log_end_offset} to {sent_end - 1} would be taken for ones "
            f"already sent, so nothing was taken or written. Put the partition's files back "
            f"as they were, or move its directory {part.directory or '(its data directory)'}"
            f" aside and " + _way_out(channel, part.partition, sent_end))


def _way_out(channel: str, partition: int, sent_end: int) -> str:
    """The operator's way out of a refusal: recreate the partition above what was sent."""
    return (f"recreate the channel starting partition {partition} above what was sent: "
            f"manage.py recreate_channel {channel} --yes --next-offset "
            f"{partition}:{sent_end} (or the recreate on the channel's page, or the API's, "
            f"with that next offset). That is the least next offset this drain needs; when "
            f"another drain of this channel refuses too, use the highest offset any of them "
            f"names")


def changed_since(channel: str, checked: list[PartitionIncarnation],
                  now: list[PartitionIncarnation], drain: str) -> str | None:
    """A sentence when a partition's incarnation now is not the one the run checked at its
    start (made again during the run), else None."""
    before = labels(checked)
    moved = [p for p in now if before.get(p.partition, p.incarnation) != p.incarnation]
    if not moved:
        return None
    names = ", ".join(f"{p.partition} (now starting at offset {p.start_offset})"
                      for p in moved)
    return (f"channel {channel!r}: partition {names} was recreated while the {drain} run "
            "was going on, so what it took was given back and nothing of it was sent; the "
            "next run checks the partition against what was sent and says what to do")


def labels(current: list[PartitionIncarnation]) -> dict[int, str]:
    """Partition -> its incarnation."""
    return {part.partition: part.incarnation for part in current}


def record_incarnations(current: list[PartitionIncarnation],
                        partitions: list[int]) -> dict[str, str]:
    """The `incarnations` key of a drain's record: each of `partitions`' incarnation, the
    original ones left out (a record without one says original)."""
    by_partition = {part.partition: part.incarnation for part in current}
    return {str(p): by_partition[p] for p in sorted(partitions)
            if by_partition.get(p, ORIGINAL) != ORIGINAL}

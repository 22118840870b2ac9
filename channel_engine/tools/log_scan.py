"""The walk of one `.log` file batch by batch, over damage, for the dump and verify tools.

scan_log_file walks a `.log` as kafka-dump-log does, read-only, from byte 0: each
batch's length, magic, CRC-32C (record_batch.check_batch; the layout is
record_batch.py's) and offsets contiguous from the expected base. With resync it
goes on past damage with the rule recovery uses (damage.find_next_batch), listing
each damaged region (DamagedRegion: bytes, reason, offsets it loses) and a batch
whose base offset field alone is wrong (damage.fixable_base_offset); a batch at or
past `bound` (the next segment's base) after damage is a copy a crashed repair left
(superseded_at). Damage is a finding (Damage: file, byte, reason), never raised.

Concurrency: reads a snapshot of the file (an mmap of its size at the start); safe
beside a writer, which may append after that size. Failures: OSError of opening
or mapping the file propagates.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from channel_engine.errors import (
    InvalidBatch,
)
from channel_engine.filenames import (
    parse_segment_file,
    segment_file,
)
from channel_engine.log import record_batch
from channel_engine.log.damage import find_next_batch, fixable_base_offset
from channel_engine.log.record_batch import BatchHeader


@dataclass(frozen=True)
class Damage:
    """One thing wrong with one file."""

    path: str
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: byte {self.position}: {self.reason}"


@dataclass(frozen=True)
class DamagedRegion:
    """Bytes [position, end) of a .log that hold no intact batch, followed by intact ones."""

    position: int
    end: int
    problem: InvalidBatch
    first_offset: int   # the offset expected at `position`
    resume_offset: int  # base offset of the intact batch at `end`


@dataclass
class LogFileScan:
    """The valid batches of one .log file and what follows them. With resync, damaged
    regions followed by intact batches are listed and the walk goes on after them;
    `problem` and `valid_bytes` then describe the end of the last walk."""

    path: Path
    batches: list[tuple[int, BatchHeader]]
    valid_bytes: int
    file_size: int
    problem: InvalidBatch | None
    damaged: list[DamagedRegion] = field(default_factory=list)
    superseded_at: int | None = None  # intact copies of a later segment's batches from here
    base_offsets_fixable: list[tuple[int, int, int]] = field(default_factory=list)


def scan_log_file(path: Path, expected_base: int | None, verify_crc: bool = True,
                  resync: bool = False, bound: int | None = None) -> LogFileScan:
    """Walk a .log file batch by batch until the end or the first invalid batch (with
    resync: to the end, over damaged regions followed by intact batches below `bound`)."""
    size = os.path.getsize(path)
    scan = LogFileScan(path, [], 0, size, None)
    if size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as buf:
            position = 0
            while True:
                position, expected_base = _walk(buf, scan, position, expected_base,
                                                verify_crc)
                problem = scan.problem
                if not resync or problem is None or problem.kind == "zero_tail" \
                        or expected_base is None:
                    break
                was = fixable_base_offset(buf, position, size, expected_base)
                if was is not None:  # only the base offset field is wrong: go on past it
                    header = record_batch.read_header(buf, position)._replace(
                        base_offset=expected_base)
                    scan.batches.append((position, header))
                    scan.base_offsets_fixable.append((position, was, expected_base))
                    position, expected_base = position + header.size, header.next_offset
                    scan.problem = None
                    continue
                found = find_next_batch(buf, position + 1, size, expected_base)
                if found is None:
                    break
                if bound is not None and found[1].base_offset >= bound:
                    scan.superseded_at = found[0]
                    break
                scan.damaged.append(DamagedRegion(position, found[0], problem, expected_base,
                                                  found[1].base_offset))
                position, expected_base, scan.problem = found[0], found[1].base_offset, None
    return scan


def _walk(buf: mmap.mmap, scan: LogFileScan, position: int, expected_base: int | None,
          verify_crc: bool) -> tuple[int, int | None]:
    size = scan.file_size
    while position < size:
        try:
            header = record_batch.check_batch(buf, position, size, expected_base, verify_crc)
        except InvalidBatch as exc:
            scan.problem = InvalidBatch(exc.kind, exc.reason)
            break
        scan.batches.append((position, header))
        position += header.size
        expected_base = header.next_offset
    scan.valid_bytes = position
    return position, expected_base


def read_batch(path: Path, position: int, header: BatchHeader) -> bytes:
    """Read one batch's bytes."""
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(header.size)


def segment_files(directory: Path) -> list[tuple[int, str]]:
    """(base offset, suffix) of each segment file (.log, .index, .timeindex) in `directory`."""
    return [p for p in map(parse_segment_file, os.listdir(directory))
            if p is not None and os.path.isfile(segment_file(directory, p[0], p[1]))]

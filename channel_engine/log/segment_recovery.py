"""SegmentRecovery: opening a segment after a clean close or a crash, and repairing its damage.

A collaborator of LogSegment (segment.py) over the segment's SegmentFile
(segment_file.py); it checks the time index with the reader's verified lookup
(SegmentReader.find_position, handed in).

Three ways to open a segment (loader.py picks):
  * load_clean(): after a clean shutdown, trust the file length, load the
    indexes, check them against the log (last entries point at real batches,
    the tail ends on a batch boundary) and say what is wrong, if anything;
    check_crcs() then CRC-checks every batch below that length;
  * rebuild_indexes(): walk the batch headers (no CRC) and rewrite both indexes;
  * recover(verify_from): walk every batch, checking CRC-32C from the given
    offset on, and rebuild the indexes up to the first invalid batch. A zero
    tail after the last batch is cut (preallocation: no data). Other damage is
    left in place and described: where it starts, and where intact batches
    resume after it (damage.find_next_batch), so the loader can keep them. A
    batch whose base offset field alone is damaged (the field lies outside the
    CRC) gets the field rewritten in place in a writable segment.

A read-only open repairs nothing: view_past_damage takes the intact batches after
a damaged region into its view of the file (reads skip the damage); catch_up takes
in what the writer process appended since.

Damage (repair_damage, called by the loader of a writable log): the valid prefix
stays in this file; the intact batches after the damaged region move to a new
segment named by the first one's base offset; the damaged bytes are copied aside
into `<this .log>.damaged-<position>` (damage.damaged_file), a file the engine
never loads and never deletes, holding the damaged bytes exactly. Steps, each
durable before the next (file fsync, rename, directory fsync): (1) the damaged
copy, (2) the new segment via a `.tmp` name, (3) the cut of this file. A crash
after any step leaves a state the next open repairs the same way: after (1) the
copy is made again (same name, same bytes); after (2) the walk of this file meets,
after the damage, a batch whose base offset is at or above the next segment's base
(its copy lives there), so only the damaged region is copied aside and the file is
cut; nothing is lost twice and no batch is kept twice.

Concurrency: called by the loader while it opens the log, before any other thread
sees the segment (catch_up: under the reader's partition log lock).

Failures: what is wrong is returned (load_clean, check_crcs, ScanResult.problem),
never raised; OSError from the repairs propagates (the open fails, nothing is
acknowledged); a split that would replace an existing segment raises
FileExistsError.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import CorruptIndexError, CorruptRecordError, InvalidBatch
from channel_engine.filenames import DAMAGED_SUFFIX, LOG_SUFFIX, TMP_SUFFIX, segment_file
from channel_engine.log.damage import (
    damaged_batches_end,
    damaged_file,
    data_end_of,
    end_of_batches,
    find_next_batch,
    fixable_base_offset,
)
from channel_engine.log.record_batch import BatchHeader, check_batch
from channel_engine.log.segment_file import (
    READ_CHUNK,
    ScanResult,
    SegmentFile,
    pwrite_all,
    same_bytes,
)


class SegmentRecovery:
    """Opening and repairing one segment (see the module doc)."""

    def __init__(self, file: SegmentFile,
                 find_position: Callable[[int, int], int | None]) -> None:
        self.file = file  # the state: descriptor, counters, indexes (segment_file.py)
        self.find_position = find_position  # the reader's verified lookup (segment_reader.py)

    # -- opening after a clean close ------------------------------------------------
    def load_clean(self) -> tuple[str, str] | None:
        """Open as left by a clean close; return (what, why) is wrong (index or log), or None."""
        file = self.file
        file.size = file.durable_size = file.file_size
        try:
            file.offset_index.load()
            file.time_index.load()
        except CorruptIndexError as exc:
            return "index", exc.reason
        if file.size == 0:
            if len(file.offset_index) or len(file.time_index):
                return "index", "entries in the index of an empty segment"
            return None
        try:
            self._find_end_from_index()
            return self._check_time_index()
        except InvalidBatch as exc:
            return "log", exc.reason
        except CorruptRecordError as exc:  # a header walk from an index entry met damage
            return "log", exc.reason
        except CorruptIndexError as exc:
            return "index", exc.reason

    def check_crcs(self) -> str | None:
        """After load_clean: CRC-32C-check every batch below the valid size (headers are
        walked from byte 0); say where the first failing one is, or None."""
        file = self.file
        if file.size == 0:
            return None
        position, expected = 0, file.base_offset
        with mmap.mmap(file.fd, file.size, access=mmap.ACCESS_READ) as buf:
            while position < file.size:
                try:
                    header = check_batch(buf, position, file.size, expected, True)
                except InvalidBatch as exc:
                    return f"byte {position}: {exc.kind}: {exc.reason}"
                position, expected = position + header.size, header.next_offset
        return None

    def _find_end_from_index(self) -> None:
        """Walk from the last offset index entry to the end of the file to find next_offset."""
        file = self.file
        offset, position = file.offset_index.last_entry()
        if position >= file.size:
            raise CorruptIndexError(file.offset_index.path,
                                    f"last entry points at byte {position} >= log size {file.size}")
        header = file.header_at(position, None)
        if len(file.offset_index) and header.last_offset != offset:
            raise CorruptIndexError(
                file.offset_index.path,
                f"last entry says offset {offset} ends the batch at byte {position}, "
                f"the log says {header.last_offset}",
            )
        if not len(file.offset_index) and header.base_offset != file.base_offset:
            raise InvalidBatch("corrupt", f"first batch has base offset {header.base_offset}, "
                                          f"expected {file.base_offset}")
        file.first_batch_timestamp = file.header_at(0, file.base_offset).max_timestamp
        while True:
            position += header.size
            file.next_offset = header.next_offset
            if position == file.size:
                return
            header = file.header_at(position, file.next_offset)

    def _check_time_index(self) -> tuple[str, str] | None:
        file = self.file
        last = file.time_index.last_entry()
        if last is None:
            return "index", "time index is empty for a non-empty segment"
        timestamp, offset = last
        if not file.base_offset <= offset < file.next_offset:
            return "index", f"time index points at offset {offset} outside the segment"
        position = self.find_position(offset, file.size)
        if position is None or file.header_at(position, None).max_timestamp != timestamp:
            return "index", f"time index entry ({timestamp}, {offset}) disagrees with the log"
        file.max_timestamp, file.offset_of_max_timestamp = timestamp, offset
        return None

    # -- recovering after a crash ---------------------------------------------------
    def rebuild_indexes(self) -> ScanResult:
        """Rewrite both indexes from the batch headers up to the current size (no CRC check)."""
        file = self.file
        return file.scan(file.size or file.file_size, verify_from=None)

    def recover(self, verify_from: int) -> ScanResult:
        """Check every batch (CRC-32C from offset `verify_from` on) and rebuild the indexes up
        to the first invalid one; cut a zero tail (writable). On damage, say where intact
        batches resume (no cut: see repair_damage)."""
        file = self.file
        result = file.scan(file.file_size, verify_from=verify_from)
        fixed: list[tuple[int, int, int]] = []
        while file.writable and result.problem is not None and self._fix_base_offset(fixed):
            more = file.walk(file.file_size, verify_from)  # on from the repaired batch
            result = replace(more, batches=result.batches + more.batches)
        return replace(self._describe_end(result), base_offsets_fixed=tuple(fixed))

    def _fix_base_offset(self, fixed: list[tuple[int, int, int]]) -> bool:
        """Writable: rewrite the base offset field of the batch at the valid end when only
        that field is wrong (fixable_base_offset); made durable by the next flush."""
        file = self.file
        with mmap.mmap(file.fd, file.file_size, access=mmap.ACCESS_READ) as buf:
            was = fixable_base_offset(buf, file.size, file.file_size, file.next_offset)
        if was is None:
            return False
        os.pwrite(file.fd, file.next_offset.to_bytes(8, "big", signed=True), file.size)
        file.length_dirty = True  # bytes changed: the next flush_data must fdatasync
        fixed.append((file.size, was, file.next_offset))
        return True

    def view_past_damage(self, result: ScanResult) -> ScanResult:
        """Read-only: take the intact batches after the damaged region `result` found into
        this view (the file is left as it is: reads skip the damage, log.read_batches),
        walking on from there; return how that walk ended, described as by recover."""
        file = self.file
        assert result.resume_at is not None and result.resume_header is not None
        file.size, file.next_offset = result.resume_at, result.resume_header.base_offset
        file.bytes_since_last_index_entry = file.index_interval_bytes + 1  # index it
        more = file.walk(file.file_size, verify_from=file.next_offset)
        return self._describe_end(replace(more, batches=result.batches + more.batches))

    def _describe_end(self, result: ScanResult) -> ScanResult:
        """Cut a zero tail; for damage, find where intact batches resume (recover)."""
        file = self.file
        problem = result.problem
        if problem is None or problem.kind == "zero_tail":
            file.cut(result.valid_bytes)
            return replace(result, data_end=result.valid_bytes)
        with mmap.mmap(file.fd, file.file_size, access=mmap.ACCESS_READ) as buf:
            found = find_next_batch(buf, result.valid_bytes + 1, file.file_size, file.next_offset)
            if found is None:
                return replace(result, data_end=data_end_of(buf, result.valid_bytes,
                                                            file.file_size))
            data_end = end_of_batches(buf, found[0], file.file_size)
        return replace(result, resume_at=found[0], resume_header=found[1], data_end=data_end)

    # -- repairing damage (writable) ------------------------------------------------
    def damaged_tail_end(self, data_end: int) -> int | None:
        """After damage at the valid end with no intact batch after it: one past the last
        offset of the complete, damaged batches found there (damaged_batches_end), or None
        when the bytes look like a torn write (see damage.py)."""
        file = self.file
        if data_end <= file.size:
            return None
        with mmap.mmap(file.fd, file.file_size, access=mmap.ACCESS_READ) as buf:
            return damaged_batches_end(buf, file.size, data_end, file.next_offset)

    def repair_damage(self, damaged_end: int, data_end: int, keep_damaged: bool,
                      split_base: int | None) -> list[Path]:
        """Repair the damage that starts at the valid end (file.size), crash-safely (see the
        module doc): copy bytes [size, damaged_end) aside when keep_damaged, move
        [damaged_end, data_end) into a new segment named split_base when given, then cut
        this file at its valid end. Returns the files written."""
        file = self.file
        position = file.size
        written = []
        if keep_damaged and damaged_end > position:
            written.append(self._copy_out(position, damaged_end, damaged_file(file.log_path,
                                                                               position)))
        if split_base is not None and data_end > damaged_end:
            target = segment_file(file.directory, split_base, LOG_SUFFIX)
            written.append(self._copy_out(damaged_end, data_end, target))
        file.cut(position)
        os.fsync(file.fd)
        file.length_dirty = False
        return written

    def _copy_out(self, start: int, end: int, target: Path) -> Path:
        """Write bytes [start, end) of this file to `target` durably (temp name, fsync,
        rename, directory fsync); a damaged copy never replaces a different older one."""
        file = self.file
        if target.name.startswith(f"{file.log_path.name}{DAMAGED_SUFFIX}-"):
            first, n = target, 1
            while target.exists():
                if same_bytes(target, file.fd, start, end):
                    return target  # made by an earlier try of this repair that crashed
                target, n = first.with_name(f"{first.name}.{n}"), n + 1  # never replace one
        elif target.exists():  # the loader's bound rule keeps a split off existing segments
            raise FileExistsError(f"{target}: a split of {file.log_path} would replace it")
        tmp = target.with_name(target.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for chunk_start in range(start, end, READ_CHUNK):
                data = os.pread(file.fd, min(READ_CHUNK, end - chunk_start), chunk_start)
                pwrite_all(fd, data, chunk_start - start)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        fsync_directory(file.directory)
        return target

    # -- a reader following the writer ----------------------------------------------
    def catch_up(self) -> ScanResult:
        """Read-only: take in the batches another process appended after our valid end
        (CRC-checked; a batch still being written is left for the next call). A file that
        shrank (the writer truncated it) is walked again from the start."""
        file = self.file
        file_size = os.fstat(file.fd).st_size
        if file_size < file.size:
            return file.scan(file_size, verify_from=None)
        file.file_size = file_size
        return file.walk(file_size, verify_from=file.next_offset)

    def resume_after(self, position: int, size_bound: int,
                     expected: int) -> tuple[int, BatchHeader] | None:
        """The next intact batch after damage at `position`, below size_bound, whose base
        offset is above `expected` (find_next_batch), or None."""
        if size_bound <= position + 1:
            return None
        with mmap.mmap(self.file.fd, size_bound, access=mmap.ACCESS_READ) as buf:
            return find_next_batch(buf, position + 1, size_bound, expected)

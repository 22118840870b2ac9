"""LogReader: a partition log's reads (events, raw batches, headers, offsets for a time).

Readers see offsets from the log start offset up to the high watermark. A read
that meets a damaged batch (CRC, header) never fails and never skips silently: it
resumes at the next intact batch (damage.find_next_batch), records the lost
offsets once in take_new_losses() and stats()["read_damage"], and (writer only)
leaves a `<base>.repair` marker so the next writable open repairs the segment
(loader.py). A read-only log follows its writer process with refresh().

Owns no bytes: batches are decoded by record_batch.py (decrypted by the log's
sealer when sealed).

A part of PartitionLog over its PartitionState (partition_state.py); the lost
offsets it finds go to the state's new_losses, the places it met damage to its
read_damage (for stats, log_status.py).

Concurrency: readers take no lock: they work on a snapshot of the segment list
and, in each segment, on a size and an offset bound taken before they start, so
they run beside one appender. The loss bookkeeping of damage takes the log's lock
briefly; refresh takes it.

Failures: OffsetOutOfRangeError outside [log start, high watermark]; a batch
whose records do not decode raises CorruptRecordError naming the file and byte.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from channel_engine.errors import (
    ChannelEngineError,
    CorruptRecordError,
    EncryptedBatchError,
    InvalidBatch,
    OffsetOutOfRangeError,
)
from channel_engine.event import Event
from channel_engine.filenames import (
    LOG_STATE_FILE,
    LOG_SUFFIX,
    segment_file,
)
from channel_engine.log import loader as log_loader
from channel_engine.log import record_batch, strays
from channel_engine.log import state as log_state
from channel_engine.log.partition_state import PartitionState
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.recovery import LostRange
from channel_engine.log.segment import LogSegment

DEFAULT_READ_BYTES = 1 << 20
_new_tuple = tuple.__new__


class LogReader:
    """Reading a partition log (see the module doc)."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.repair_marked: set[int] = set()  # segments with a .repair marker written

    def refresh(self) -> None:
        """Read-only: catch up with the writer process — batches it appended, segments it
        rolled, and segments retention removed (those stay readable by iterators already
        holding them until close). A writer's own view is always current: no-op there."""
        state = self.state
        if not state.read_only:
            return
        with state.lock:
            try:
                saved = log_state.read(state.directory / LOG_STATE_FILE)
            except ChannelEngineError:
                saved = None  # being replaced right now, or damaged: keep the old log start
            present = set(log_loader.log_bases(state.directory))
            kept = [s for s in state.segments if s.base_offset in present]
            state.pending_deletes += [s for s in state.segments if s.base_offset not in present]
            if kept:
                kept[-1].catch_up()  # the segment that was active when we last looked
            known = {s.base_offset for s in kept}
            for base in sorted(present - known):
                if kept and base < kept[-1].base_offset:
                    continue  # a truncated-and-rewritten history is for a reopen to sort out
                if kept and base != kept[-1].next_offset and strays.is_empty_segment(
                        segment_file(state.directory, base, LOG_SUFFIX)):
                    continue  # not where the writer rolls: a stray, until it holds batches
                segment = LogSegment.open(state.directory, base, state.segment_config,
                                          writable=False)
                segment.scan(segment.file_size, verify_from=None)
                kept.append(segment)
            if kept:
                state.set_segments(kept)
                state.log_end_offset = state.recovery_point = kept[-1].next_offset
            if saved is not None:
                state.log_start_offset = max(state.log_start_offset, saved.log_start_offset)

    # -- events and batches ---------------------------------------------------------
    def read(
        self,
        start_offset: int,
        max_events: int | None = None,
        max_bytes: int = DEFAULT_READ_BYTES,
        end_offset: int | None = None,
    ) -> list[Event]:
        """Events from start_offset up to the high watermark (and end_offset), at most
        max_events, from batches totalling about max_bytes (always at least one batch)."""
        events: list[Event] = []
        limit = max_events if max_events is not None else 1 << 62
        for segment, header, data in self.read_batches(start_offset, end_offset, max_bytes):
            self._decode(segment, header, data, start_offset, end_offset, events, limit)
            if len(events) >= limit:
                break
        return events

    def iter_events(self, start_offset: int, end_offset: int | None = None) -> Iterator[Event]:
        """Yield every event from start_offset to end_offset (default: the high watermark)."""
        state = self.state
        end = state.high_watermark if end_offset is None else min(end_offset, state.high_watermark)
        for segment, header, data in self.read_batches(start_offset, end, 1 << 62):
            events: list[Event] = []
            self._decode(segment, header, data, start_offset, end, events, 1 << 62)
            yield from events

    def decode_batch(self, segment: LogSegment, header: BatchHeader, data: bytes) -> list[Event]:
        """Every event of one batch from read_batches (decrypted when sealed)."""
        events: list[Event] = []
        self._decode(segment, header, data, header.base_offset, None, events, 1 << 62)
        return events

    def _decode(self, segment: LogSegment, header: BatchHeader, data: bytes, start: int,
                end: int | None, out: list[Event], limit: int) -> None:
        state = self.state
        stop = header.next_offset if end is None else min(end, header.next_offset)
        partition = state.partition
        append = out.append
        try:
            plain = record_batch.unseal(data, state.sealer)
            try:
                if record_batch.decode_events(plain, partition, start, stop, limit, out):
                    return  # the compiled codec's loop: this one's, check for check
                # the codec's records read in place (records() without its tuples), and
                # tuple.__new__ (Event's own __new__ is a Python frame): the take path's loop;
                # a compressed batch decompresses here, so its codec's errors are caught
                for record in record_batch.record_objects(plain):
                    offset = record.offset
                    if offset < start:
                        continue
                    if offset >= stop or len(out) >= limit:
                        return
                    headers, value = record.headers, record.value
                    append(_new_tuple(Event, (partition, offset, record.timestamp, record.key,
                                              dict(headers) if headers else {},
                                              value if value is not None else b"")))
            except (InvalidBatch, EncryptedBatchError):
                raise  # already the engine's, as record_batch.records passes them on
            except Exception as exc:  # the codec is third-party: see record_batch.records
                raise record_batch.undecodable(exc) from exc
        except InvalidBatch as exc:
            position = segment.find_position(header.base_offset, segment.size) or 0
            raise CorruptRecordError(segment.log_path, position, exc.reason) from exc

    def read_batches(
        self, start_offset: int, end_offset: int | None = None, max_bytes: int = DEFAULT_READ_BYTES
    ) -> Iterator[tuple[LogSegment, BatchHeader, bytes]]:
        """Yield (segment, header, raw bytes) of the CRC-checked batches holding offsets from
        start_offset up to the high watermark (and end_offset); the first batch may begin
        before start_offset. Raises OffsetOutOfRangeError outside [log start, high watermark].
        A damaged batch is skipped, never silently: its offsets go to take_new_losses()."""
        state = self.state
        bound = state.high_watermark
        if end_offset is not None:
            bound = min(bound, end_offset)
        if not state.log_start_offset <= start_offset <= state.high_watermark:
            raise OffsetOutOfRangeError(start_offset, state.log_start_offset, state.high_watermark)
        segments = state.segments
        i = max(bisect_right([s.base_offset for s in segments], start_offset) - 1, 0)
        total = 0
        for segment in segments[i:]:
            if start_offset >= bound or segment.base_offset >= bound:
                return
            next_offset, size = segment.next_offset, segment.size  # an appender sets size first
            position, start_offset, first = self._position_of(segment, start_offset, size,
                                                              next_offset)
            while position is not None and start_offset < bound:
                checked = first
                try:
                    for _, header, data in segment.read_batches(position, size, bound, 1 << 62,
                                                                first_base=first):
                        checked = (header.next_offset, header.next_offset)
                        if header.next_offset <= start_offset:
                            continue  # resumed after damage before the offsets asked for
                        if total and total + header.size > max_bytes:
                            return  # one budget for the whole read, across segments
                        total += header.size
                        yield segment, header, data
                        start_offset = header.next_offset
                    position = None
                except CorruptRecordError as exc:
                    position, start_offset, first = self._skip_damage(
                        segment, exc, checked[0], start_offset, size, next_offset)
            if segment.misplaced_bases:  # delivered with the offsets their place holds
                self._mark_for_repair(segment)

    # -- damage met by a read -------------------------------------------------------
    def _position_of(self, segment: LogSegment, offset: int, size: int, next_offset: int
                     ) -> tuple[int | None, int, tuple[int, int]]:
        """(byte position of the batch holding `offset` or None, the offset to read from, the
        range its base offset must lie in)."""
        try:
            position = segment.find_position(offset, size)
        except CorruptRecordError as exc:  # a header met on the way holds offsets <= offset
            return self._skip_damage(segment, exc, segment.base_offset, offset, size, next_offset)
        return position, offset, (segment.base_offset, max(offset, segment.base_offset))

    def _skip_damage(self, segment: LogSegment, exc: CorruptRecordError, expected: int,
                     start_offset: int, size: int, next_offset: int
                     ) -> tuple[int | None, int, tuple[int, int]]:
        """Damage at use: record the lost offsets once (take_new_losses, stats), ask the next
        writable open to repair the segment, and return where intact batches resume: (byte
        position or None for the segment's end, offset to read from, its base offset)."""
        state = self.state
        found = segment.resume_after(exc.position, size, expected)
        resume_at = found[0] if found is not None else size
        end = found[1].base_offset if found is not None else next_offset
        key = (segment.base_offset, exc.position)
        with state.lock:  # each lost offset of a damaged place is reported once
            reported = state.read_damage.get(key)
            top = end if reported is None else reported.start
            if start_offset < top:
                loss = LostRange(start_offset, top, str(segment.log_path), exc.position,
                                 resume_at - exc.position, f"corrupt at read: {exc.reason}")
                state.new_losses.append(loss)
                state.read_damage[key] = LostRange(start_offset, max(end, top), loss.path,
                                                   loss.position, loss.length, loss.cause)
        self._mark_for_repair(segment)
        return (resume_at if resume_at < size else None), max(start_offset, end), (end, end)

    def _mark_for_repair(self, segment: LogSegment) -> None:
        state = self.state
        if state.read_only or state.closed or segment.base_offset in self.repair_marked:
            return
        self.repair_marked.add(segment.base_offset)
        try:
            log_loader.mark_for_repair(state.directory, segment.base_offset)
        except OSError:  # best effort: `recover` (force_recovery) finds the damage too
            pass

    # -- scans by header and by time ------------------------------------------------
    def batch_headers(self, start_offset: int) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """(segment, position, header) of the batches from the one holding start_offset up
        to the high watermark, records unread (CRCs unchecked); a damaged header is skipped
        and counted as by read_batches."""
        state = self.state
        bound = state.high_watermark
        for segment in state.segments:
            if segment.next_offset <= start_offset or segment.base_offset >= bound:
                continue
            next_offset, size = segment.next_offset, segment.size
            offset = max(start_offset, segment.base_offset)
            position, offset, first = self._position_of(segment, offset, size, next_offset)
            while position is not None:
                checked = first
                try:
                    for at, header in segment.headers_at(position, size, first):
                        checked = (header.next_offset, header.next_offset)
                        if header.base_offset >= bound:
                            return
                        if header.next_offset > offset:
                            yield segment, at, header
                            offset = header.next_offset
                    position = None
                except CorruptRecordError as exc:  # skipped and counted, as by a read
                    position, offset, first = self._skip_damage(
                        segment, exc, checked[0], offset, size, next_offset)
            if segment.misplaced_bases:
                self._mark_for_repair(segment)

    def offsets_for_time(self, timestamp: int) -> int | None:
        """Earliest offset whose timestamp is >= `timestamp`, or None (Kafka offsetsForTimes).
        A damaged batch is skipped and counted as by read_batches: the answer is the earliest
        such offset that a read can deliver."""
        state = self.state
        bound = state.high_watermark
        for segment in state.segments:
            if segment.max_timestamp < timestamp or segment.base_offset >= bound:
                continue
            start = max(state.log_start_offset, segment.start_for_time(timestamp))
            end = min(bound, segment.next_offset)
            if start >= end:
                continue
            for batch_segment, header, data in self.read_batches(start, end, 1 << 62):
                if header.max_timestamp < timestamp:
                    continue
                for event in self.decode_batch(batch_segment, header, data):
                    if start <= event.offset < end and event.timestamp >= timestamp:
                        return event.offset
        return None

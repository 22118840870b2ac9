"""LogSegment: one `.log` of record batches with its `.index` and `.timeindex`."""
from __future__ import annotations

import os
import struct

import pytest

from channel_engine.errors import CorruptRecordError
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch as rb
from channel_engine.log.segment import LogSegment, SegmentConfig

BASE = 100
INTERVAL = 150  # bytes between index entries: every second or third batch is indexed


def create(directory, base=BASE, preallocate=0, interval=INTERVAL):
    return LogSegment.create(directory, base, SegmentConfig(4096, interval, preallocate))


def reopen(directory, base=BASE, writable=True, interval=INTERVAL):
    return LogSegment.open(directory, base, SegmentConfig(4096, interval), writable=writable)


def append(seg, count=1, timestamp=1_000, body=b"x" * 40):
    events = [PendingEvent(body + b"%d" % i, timestamp=timestamp + i) for i in range(count)]
    batch = rb.build(events)
    rb.set_base_offset(batch, seg.next_offset)
    header = rb.read_header(batch)
    return seg.append(batch, header), header


def fill(seg, batches=10):
    """Append batches of 1..3 events with timestamps that go up and down; return headers."""
    headers = []
    for i in range(batches):
        timestamp = 10_000 + (i * 37 % 11) * 100
        _, header = append(seg, count=i % 3 + 1, timestamp=timestamp)
        headers.append(header)
    return headers


def index_entries(seg):
    return ([seg.offset_index.entry(i) for i in range(len(seg.offset_index))],
            [seg.time_index.entry(i) for i in range(len(seg.time_index))])


def offsets_read(seg, position=0, max_bytes=1 << 30):
    out = []
    for _, _, data in seg.read_batches(position, seg.size, 1 << 62, max_bytes):
        out += [offset for offset, *_ in rb.records(data)]
    return out


def test_it_creates_an_empty_segment_with_its_three_files(tmp_path):
    seg = create(tmp_path)
    assert [p.name for p in seg.paths()] == [
        "00000000000000000100.log", "00000000000000000100.index",
        "00000000000000000100.timeindex"]
    assert all(p.exists() and p.stat().st_size == 0 for p in seg.paths())
    assert (seg.size, seg.next_offset) == (0, BASE)


def test_it_refuses_to_create_over_an_existing_segment(tmp_path):
    create(tmp_path).close()
    with pytest.raises(FileExistsError):
        create(tmp_path)


def test_it_appends_batches_back_to_back(tmp_path):
    seg = create(tmp_path)
    pos1, h1 = append(seg, count=3)
    pos2, h2 = append(seg, count=2)
    assert (pos1, pos2) == (0, h1.size)
    assert (h1.base_offset, h2.base_offset) == (100, 103)
    assert seg.next_offset == 105
    assert seg.size == h1.size + h2.size == seg.log_path.stat().st_size
    assert seg.max_timestamp == 1_002 and seg.offset_of_max_timestamp == 102
    assert seg.first_batch_timestamp == 1_002


def test_it_finds_the_position_of_the_batch_holding_every_offset(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=12)
    assert len(seg.offset_index) >= 2  # lookups start from index entries, not only byte 0
    position = 0
    for header in headers:
        for offset in range(header.base_offset, header.next_offset):
            assert seg.find_position(offset, seg.size) == position
        position += header.size
    assert seg.find_position(seg.next_offset, seg.size) is None
    assert seg.find_position(headers[-1].base_offset, seg.size - headers[-1].size) is None


def test_it_indexes_after_more_than_the_interval_bytes(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=12)
    expected, since, position = [], 0, 0
    for header in headers:
        if since > INTERVAL:
            expected.append((header.last_offset, position))
            since = 0
        since += header.size
        position += header.size
    offsets, times = index_entries(seg)
    assert offsets == expected
    assert times  # one time entry goes with an offset entry whenever the max timestamp rose


def test_it_reads_crc_checked_batches(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=6)
    read = list(seg.read_batches(0, seg.size, 1 << 62, 1 << 30))
    assert [h for _, h, _ in read] == headers
    assert [len(data) for _, _, data in read] == [h.size for h in headers]
    assert offsets_read(seg) == list(range(BASE, seg.next_offset))


def test_it_stops_reading_at_the_offset_bound_and_the_size_bound(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=6)
    bound = headers[3].base_offset
    assert [h for _, h, _ in seg.read_batches(0, seg.size, bound, 1 << 30)] == headers[:3]
    size_bound = sum(h.size for h in headers[:2])
    assert [h for _, h, _ in seg.read_batches(0, size_bound, 1 << 62, 1 << 30)] == headers[:2]


def test_it_reads_at_least_one_batch_then_stays_within_max_bytes(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=6)
    assert [h for _, h, _ in seg.read_batches(0, seg.size, 1 << 62, 1)] == headers[:1]
    two = headers[0].size + headers[1].size
    assert [h for _, h, _ in seg.read_batches(0, seg.size, 1 << 62, two)] == headers[:2]
    assert [h for _, h, _ in seg.read_batches(0, seg.size, 1 << 62, two - 1)] == headers[:1]


def test_it_raises_corrupt_record_on_a_flipped_byte_when_reading(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=3)
    damaged_at = headers[0].size
    with open(seg.log_path, "r+b") as f:
        f.seek(damaged_at + headers[1].size - 1)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    reader = seg.read_batches(0, seg.size, 1 << 62, 1 << 30)
    assert next(reader)[1] == headers[0]
    with pytest.raises(CorruptRecordError) as info:
        next(reader)
    assert info.value.position == damaged_at
    assert info.value.path == str(seg.log_path)


def test_it_loads_a_cleanly_closed_segment_as_it_was(tmp_path):
    seg = create(tmp_path)
    fill(seg, batches=10)
    seg.on_become_inactive()
    seg.flush()
    before = (seg.size, seg.next_offset, seg.max_timestamp, seg.offset_of_max_timestamp,
              seg.first_batch_timestamp, index_entries(seg))
    seg.close()
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None
    assert (loaded.size, loaded.next_offset, loaded.max_timestamp,
            loaded.offset_of_max_timestamp, loaded.first_batch_timestamp,
            index_entries(loaded)) == before
    assert offsets_read(loaded) == list(range(BASE, loaded.next_offset))


def test_it_loads_an_empty_segment(tmp_path):
    create(tmp_path).close()
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None
    assert (loaded.size, loaded.next_offset) == (0, BASE)


def test_it_reports_a_missing_final_time_entry_as_an_index_problem(tmp_path):
    seg = create(tmp_path)
    fill(seg, batches=2)  # no index entry yet, and no final time entry: not closed cleanly
    seg.close()
    assert reopen(tmp_path).load_clean()[0] == "index"


def test_it_reports_a_torn_index_file_as_an_index_problem(tmp_path):
    seg = create(tmp_path)
    fill(seg, batches=10)
    seg.on_become_inactive()
    seg.close()
    with open(seg.offset_index.path, "ab") as f:
        f.write(b"\x01\x02\x03")
    what, why = reopen(tmp_path).load_clean()
    assert what == "index"
    assert "multiple" in why


def test_it_reports_an_index_entry_past_the_log_as_an_index_problem(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=10)
    seg.on_become_inactive()
    seg.close()
    last = headers[-1]
    os.truncate(seg.log_path, seg.size - last.size)  # the index now points past the log end
    assert seg.offset_index.path.stat().st_size > 0
    assert reopen(tmp_path).load_clean()[0] == "index"


def test_it_reports_a_log_that_does_not_end_on_a_batch_boundary(tmp_path):
    seg = create(tmp_path)
    fill(seg, batches=4)
    seg.on_become_inactive()
    seg.close()
    with open(seg.log_path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x01\x00" + b"\x07" * 60)
    assert reopen(tmp_path).load_clean()[0] == "log"


def test_it_rebuilds_indexes_identical_to_the_ones_it_wrote(tmp_path):
    seg = create(tmp_path)
    fill(seg, batches=15)
    seg.on_become_inactive()
    written = index_entries(seg)
    files = [seg.offset_index.path.read_bytes(), seg.time_index.path.read_bytes()]
    seg.close()
    seg.offset_index.path.write_bytes(b"garbage")
    seg.time_index.path.unlink()
    loaded = reopen(tmp_path)
    assert loaded.load_clean()[0] == "index"
    result = loaded.rebuild_indexes()
    loaded.add_final_time_entry()
    assert result.problem is None and result.batches == 15
    assert index_entries(loaded) == written
    assert [loaded.offset_index.path.read_bytes(),
            loaded.time_index.path.read_bytes()] == files


def test_it_recovers_a_torn_last_batch_by_repairing_it(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=5)
    seg.close()
    good = sum(h.size for h in headers[:4])
    os.truncate(seg.log_path, good + 30)
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=BASE)
    assert result.problem.kind == "partial" and result.resume_at is None
    data_end = good + 30 - trailing_zeros(seg.log_path)
    assert (result.valid_bytes, result.batches, result.data_end) == (good, 4, data_end)
    assert loaded.log_path.stat().st_size == good + 30  # recover reports; the repair cuts
    assert loaded.repair_damage(result.data_end, result.data_end, False, None) == []
    assert loaded.log_path.stat().st_size == good
    assert loaded.next_offset == headers[3].next_offset
    assert offsets_read(loaded) == list(range(BASE, headers[3].next_offset))


def trailing_zeros(path):
    data = path.read_bytes()
    return len(data) - len(data.rstrip(b"\0"))


def flip(path, position):
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_it_finds_where_intact_batches_resume_after_a_flipped_byte(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=5)
    seg.close()
    position = sum(h.size for h in headers[:2])
    flip(seg.log_path, position + 70)
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=BASE)
    assert result.problem.kind == "corrupt" and "CRC" in result.problem.reason
    assert result.valid_bytes == position
    assert result.resume_at == position + headers[2].size
    assert result.resume_header.base_offset == headers[3].base_offset
    assert loaded.next_offset == headers[2].base_offset


def test_it_splits_the_intact_batches_off_and_keeps_the_damaged_bytes(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=5)
    seg.close()
    original = seg.log_path.read_bytes()
    position = sum(h.size for h in headers[:2])
    resume = position + headers[2].size
    flip(seg.log_path, position + 70)
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=BASE)
    new_base = result.resume_header.base_offset
    written = loaded.repair_damage(result.resume_at, result.data_end, True, new_base)
    assert [p.name for p in written] == [f"00000000000000000100.log.damaged-{position}",
                                        f"{new_base:020d}.log"]
    assert written[0].read_bytes()[70:71] != original[position + 70:position + 71]
    assert len(written[0].read_bytes()) == headers[2].size
    assert written[1].read_bytes() == original[resume:]
    assert loaded.log_path.read_bytes() == original[:position]
    assert not list(tmp_path.glob("*.tmp"))
    split = reopen(tmp_path, base=new_base)
    assert split.recover(verify_from=new_base).problem is None
    assert offsets_read(split) == list(range(new_base, headers[-1].next_offset))


def test_it_rewrites_a_damaged_base_offset_field_in_place(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=5)
    seg.close()
    position = sum(h.size for h in headers[:2])
    with open(seg.log_path, "r+b") as f:  # base offset of batch 2 (outside the CRC) damaged
        f.seek(position)
        f.write((10**9).to_bytes(8, "big"))
    reader = reopen(tmp_path, writable=False)  # a reader cannot: the batch is skipped, and
    result = reader.recover(verify_from=BASE)  # not resumed at (the next batch contradicts)
    assert result.valid_bytes == position and not result.base_offsets_fixed
    assert result.resume_header.base_offset == headers[3].base_offset
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=BASE)
    assert result.problem is None and result.valid_bytes == sum(h.size for h in headers)
    assert result.base_offsets_fixed == ((position, 10**9, headers[2].base_offset),)
    assert offsets_read(loaded) == list(range(BASE, headers[-1].next_offset))


def test_it_trusts_crcs_below_the_verify_offset(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=5)
    seg.close()
    flip(seg.log_path, 70)
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=headers[1].base_offset)
    assert result.problem is None
    assert loaded.next_offset == headers[-1].next_offset


def test_it_recovers_a_preallocated_zero_tail_as_no_data_lost(tmp_path):
    seg = create(tmp_path, preallocate=8192)
    headers = fill(seg, batches=3)
    seg.close()  # not trimmed: a crash before roll or close
    assert seg.log_path.stat().st_size == 8192
    loaded = reopen(tmp_path)
    result = loaded.recover(verify_from=BASE)
    assert result.problem.kind == "zero_tail"
    assert result.valid_bytes == sum(h.size for h in headers)
    assert loaded.log_path.stat().st_size == result.valid_bytes


def test_it_recovers_without_writing_when_read_only(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=3)
    seg.close()
    os.truncate(seg.log_path, seg.size - 5)
    size = seg.log_path.stat().st_size
    loaded = reopen(tmp_path, writable=False)
    result = loaded.recover(verify_from=BASE)
    assert result.problem.kind == "partial"
    assert loaded.next_offset == headers[1].next_offset
    assert loaded.log_path.stat().st_size == size


def test_it_preallocates_and_trims_on_becoming_inactive(tmp_path):
    seg = create(tmp_path, preallocate=16384)
    assert seg.log_path.stat().st_size == 16384
    assert seg.file_size == 16384 and seg.size == 0
    fill(seg, batches=4)
    assert seg.log_path.stat().st_size == 16384
    assert offsets_read(seg) == list(range(BASE, seg.next_offset))
    seg.on_become_inactive()
    assert seg.log_path.stat().st_size == seg.size == seg.file_size
    assert seg.time_index.last_entry() == (seg.max_timestamp, seg.offset_of_max_timestamp)


def test_it_trims_only_the_zero_tail(tmp_path):
    seg = create(tmp_path, preallocate=4096)
    fill(seg, batches=2)
    size = seg.size
    seg.trim()
    seg.trim()
    assert seg.log_path.stat().st_size == size
    seg.close()
    loaded = reopen(tmp_path)
    assert loaded.recover(verify_from=BASE).problem is None
    assert loaded.size == size


def test_it_is_clean_after_a_flush(tmp_path):
    seg = create(tmp_path)
    assert seg.dirty  # the new file itself must reach the disk
    fill(seg, batches=2)
    assert seg.dirty
    seg.flush()
    assert not seg.dirty


def test_it_keeps_an_open_reader_working_after_rename_to_deleted(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=8)
    names = [p.name for p in seg.paths()]
    seg.rename_to_deleted()
    assert seg.deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n + ".deleted" for n in names)
    assert seg.find_position(headers[5].base_offset, seg.size) == sum(
        h.size for h in headers[:5])
    assert offsets_read(seg) == list(range(BASE, seg.next_offset))
    seg.delete_files()
    assert list(tmp_path.iterdir()) == []


def test_it_truncates_the_file_at_a_batch_boundary_and_rebuilds_its_indexes(tmp_path):
    seg = create(tmp_path)
    headers = fill(seg, batches=12)
    cut = sum(h.size for h in headers[:7])
    seg.truncate_file(cut)
    assert (seg.size, seg.next_offset) == (cut, headers[6].next_offset)
    assert seg.log_path.stat().st_size == cut
    assert all(pos < cut for _, pos in index_entries(seg)[0])
    assert offsets_read(seg) == list(range(BASE, headers[6].next_offset))
    _, header = append(seg)
    assert header.base_offset == headers[6].next_offset


# -- indexes checked at use -------------------------------------------------------------------


def sealed_segment(directory, batches=15):
    """A closed, cleanly sealed segment and the byte position of each of its batches."""
    seg = create(directory)
    headers = fill(seg, batches=batches)
    seg.on_become_inactive()
    seg.close()
    positions, at = [], 0
    for header in headers:
        positions.append(at)
        at += header.size
    return seg, headers, positions


def write_offset_entries(path, pairs):
    path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))


def check_positions(seg, headers, positions):
    for header, position in zip(headers, positions, strict=True):
        for offset in range(header.base_offset, header.next_offset):
            assert seg.find_position(offset, seg.size) == position, offset


def test_it_repairs_an_index_entry_pointing_at_the_wrong_batch_when_a_lookup_lands_on_it(
        tmp_path):
    seg, headers, positions = sealed_segment(tmp_path)
    original = seg.offset_index.path.read_bytes()
    pairs = list(struct.iter_unpack(">ii", original))
    for middle in range(1, len(pairs) - 1):  # an entry with another batch between neighbours
        others = [p for p in positions if pairs[middle - 1][1] < p < pairs[middle + 1][1]
                  and p != pairs[middle][1]]
        if others:
            break
    pairs[middle] = (pairs[middle][0], others[0])  # a real batch, not its own
    write_offset_entries(seg.offset_index.path, pairs)
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None  # the open-time checks cannot see it
    check_positions(loaded, headers, positions)
    assert loaded.index_rebuilds == 1
    assert loaded.offset_index.path.read_bytes() == original


def test_it_repairs_in_memory_only_when_read_only(tmp_path):
    seg, headers, positions = sealed_segment(tmp_path)
    pairs = list(struct.iter_unpack(">ii", seg.offset_index.path.read_bytes()))
    pairs[1] = (pairs[1][0], pairs[1][1] + 1)  # inside a batch
    write_offset_entries(seg.offset_index.path, pairs)
    damaged = seg.offset_index.path.read_bytes()
    loaded = reopen(tmp_path, writable=False)
    assert loaded.load_clean() is None
    check_positions(loaded, headers, positions)
    assert loaded.index_rebuilds == 1
    assert loaded.offset_index.path.read_bytes() == damaged  # a reader never writes


def test_it_never_fails_a_lookup_when_the_rebuilt_index_cannot_be_written(
        tmp_path, monkeypatch):
    seg, headers, positions = sealed_segment(tmp_path)
    pairs = list(struct.iter_unpack(">ii", seg.offset_index.path.read_bytes()))
    pairs[2] = (pairs[2][0], pairs[2][1] + 1)  # inside its batch
    write_offset_entries(seg.offset_index.path, pairs)
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None

    def read_only(*args):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "ftruncate", read_only)
    check_positions(loaded, headers, positions)
    assert loaded.index_rebuilds == 1


def test_it_verifies_a_time_index_entry_against_its_batch(tmp_path):
    seg, headers, positions = sealed_segment(tmp_path)
    path = seg.time_index.path
    original = path.read_bytes()
    entries = list(struct.iter_unpack(">qi", original))
    assert len(entries) >= 3
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None
    timestamp, relative = entries[1]
    assert loaded.start_for_time(timestamp + 1) == BASE + relative + 1  # a true entry
    entries[1] = (timestamp, relative + 1)  # not the last offset of a batch any more
    path.write_bytes(b"".join(struct.pack(">qi", *e) for e in entries))
    loaded = reopen(tmp_path)
    assert loaded.load_clean() is None
    assert loaded.start_for_time(timestamp + 1) == BASE + relative + 1  # after the repair
    assert loaded.index_rebuilds == 1 and path.read_bytes() == original


def test_it_keeps_the_entries_past_a_damaged_batch_when_repairing(tmp_path):
    # log damage is the loader's and the reader's business: an index repair must not drop
    # the entries that still lead to intact batches after it
    seg, headers, positions = sealed_segment(tmp_path, batches=20)
    pairs = list(struct.iter_unpack(">ii", seg.offset_index.path.read_bytes()))
    damaged = positions[3]
    with open(seg.log_path, "r+b") as f:
        f.seek(damaged + 16)  # the magic byte of batch 3
        f.write(b"\x07")
    pairs[0] = (pairs[0][0], pairs[0][1] + 1)
    write_offset_entries(seg.offset_index.path, pairs)
    loaded = reopen(tmp_path)
    loaded.load_clean()
    loaded.file.size = loaded.file_size  # as a load that kept the damaged region would
    loaded.repair_indexes("test")
    kept = [loaded.offset_index.entry(i) for i in range(len(loaded.offset_index))]
    assert [e for e in pairs if e[1] > damaged] == [
        (o - BASE, p) for o, p in kept if p > damaged]


def test_it_repairs_while_a_writer_appends_without_losing_or_doubling_entries(tmp_path):
    import threading

    seg = create(tmp_path)
    fill(seg, batches=5)
    stop = threading.Event()
    errors = []

    def repairer():
        while not stop.is_set():
            try:
                size = seg.size
                seg.repair_indexes("test")
                for offset in range(BASE, BASE + 5):
                    assert seg.find_position(offset, size) is not None
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    thread = threading.Thread(target=repairer)
    thread.start()
    try:
        fill(seg, batches=300)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    offsets, _ = index_entries(seg)
    seg.repair_indexes("final")
    assert index_entries(seg)[0] == offsets  # what the appender built is what a rebuild gives


def pread_sizes(monkeypatch):
    """Record the size of every pread from here on."""
    sizes = []
    real = os.pread

    def recording(fd, size, position):
        sizes.append(size)
        return real(fd, size, position)
    monkeypatch.setattr(os, "pread", recording)
    return sizes


def test_it_reads_only_the_batch_a_lookup_found_when_only_that_batch_is_wanted(
        tmp_path, monkeypatch):
    seg = create(tmp_path)
    headers = [append(seg, count=20, body=b"y" * 200)[1] for _ in range(30)]
    wanted = headers[10]
    sizes = pread_sizes(monkeypatch)
    position = seg.find_position(wanted.base_offset, seg.size)
    sizes.clear()  # the lookup's own reads are not the read of the batch
    got = list(seg.read_batches(position, seg.size, wanted.next_offset, 1 << 30))
    assert [h for _, h, _ in got] == [wanted]
    assert sizes == [wanted.size]  # one read, not a 64 KiB chunk holding the batches after it
    assert got[0][2] == os.pread(seg.file.fd, wanted.size, position)
    # wanting more than that batch reads ahead in chunks, as before
    sizes.clear()
    more = list(seg.read_batches(position, seg.size, headers[13].next_offset, 1 << 30))
    assert [h for _, h, _ in more] == headers[10:14] and len(sizes) == 1 and sizes[0] > \
        4 * wanted.size


def test_it_reads_a_whole_batch_when_the_size_found_is_stale(tmp_path):
    seg = create(tmp_path)
    headers = [append(seg, count=5)[1] for _ in range(4)]
    position = seg.find_position(headers[2].base_offset, seg.size)
    stale = headers[0]._replace(batch_length=20, base_offset=headers[2].base_offset,
                                last_offset_delta=headers[2].last_offset_delta)
    seg.reader._found = (position, stale)  # a hint smaller than the batch now there
    got = list(seg.read_batches(position, seg.size, headers[2].next_offset, 1 << 30))
    assert [h for _, h, _ in got] == [headers[2]] and len(got[0][2]) == headers[2].size

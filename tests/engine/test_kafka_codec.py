"""The Kafka cross-check: an independent codec (kafka-python) reads what PartitionLog wrote.

Weir writes through aiokafka's codec; these tests decode every `.log` file with
kafka-python's DefaultRecordBatch, walking the file by baseOffset/batchLength
ourselves, and parse `.index` / `.timeindex` with plain struct, so a
disagreement with Kafka's format shows up here and not in a Kafka tool.

kafka-python decompresses with its own choice of libraries (gzip from the
standard library; python-snappy, lz4 and zstandard, test dependencies), not with
the cramjam codecs Weir writes through.
"""
from __future__ import annotations

import struct
import warnings

import pytest

from channel_engine.event import PendingEvent
from channel_engine.filenames import parse_segment_file
from channel_engine.log.config import LogConfig
from channel_engine.log.partition_log import PartitionLog

with warnings.catch_warnings():  # kafka-python's protocol schemas use deprecated importlib APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def batches_for(seed: int, count: int) -> list[list[PendingEvent]]:
    """Deterministic batches of 1..5 events: keys None or bytes, 0..2 headers, empty and
    compressible bodies, timestamps that sometimes go back."""
    out = []
    n = seed * 1000
    for b in range(count):
        batch = []
        for _ in range(b % 5 + 1):
            n += 1
            key = None if n % 3 == 0 else b"key-%d" % (n % 7)
            headers = {f"h{j}": b"v%d" % (n + j) for j in range(n % 3)}
            body = b"" if n % 11 == 0 else (b"event %d " % n) * (n % 9 + 1)
            timestamp = 1_700_000_000_000 + n * 10 - (500 if n % 4 == 0 else 0)
            batch.append(PendingEvent(body, key=key, headers=headers or None,
                                      timestamp=timestamp))
        out.append(batch)
    return out


def append_all(log: PartitionLog, batches, expected: list) -> None:
    for batch in batches:
        result = log.append(batch)
        for i, event in enumerate(batch):
            expected.append((result.first_offset + i, event.timestamp, event.key,
                             list((event.headers or {}).items()), event.body))


def kafka_batches(log_file):
    """Yield (position, kafka-python DefaultRecordBatch) for every batch of a .log file."""
    data = log_file.read_bytes()
    position = 0
    while position < len(data):
        _base_offset, length = struct.unpack_from(">qi", data, position)
        size = 12 + length
        assert position + size <= len(data), f"{log_file}: batch at {position} runs past the end"
        yield position, DefaultRecordBatch(data[position:position + size])
        position += size


def segment_bases(directory):
    return sorted(base for base, suffix in
                  (parse_segment_file(p.name) or (None, None) for p in directory.iterdir())
                  if suffix == ".log")


def decode_directory(directory, codecs_seen: set | None = None):
    """Decode every segment with kafka-python; return the events and per-segment facts."""
    events, segments = [], {}
    expected_next = None
    for base in segment_bases(directory):
        log_file = directory / f"{base:020d}.log"
        starts = {}
        for position, batch in kafka_batches(log_file):
            assert batch.validate_crc(), f"{log_file}: CRC of the batch at {position}"
            assert batch.magic == 2
            assert batch.timestamp_type == 0  # CreateTime
            assert not batch.is_transactional and not batch.is_control_batch
            if expected_next is not None:
                assert batch.base_offset == expected_next
            if not starts:
                assert batch.base_offset == base, f"{log_file}: first batch vs file name"
            if codecs_seen is not None:
                codecs_seen.add(batch.compression_type)
            starts[position] = (batch.base_offset, batch.last_offset, batch.max_timestamp)
            records = list(batch)
            assert len(records) == batch.records_count
            assert max(r.timestamp for r in records) == batch.max_timestamp
            assert records[-1].offset == batch.last_offset
            for record in records:
                events.append((record.offset, record.timestamp, record.key,
                               list(record.headers), record.value))
            expected_next = batch.next_offset
        segments[base] = starts
    return events, segments


def check_offset_index(directory, base, starts):
    data = (directory / f"{base:020d}.index").read_bytes()
    assert len(data) % 8 == 0
    entries = list(struct.iter_unpack(">ii", data))
    for relative, position in entries:
        assert position in starts, f"index entry ({relative}, {position}): no batch starts there"
        assert starts[position][1] == base + relative
    assert entries == sorted(set(entries))
    return entries


def check_time_index(directory, base, starts):
    data = (directory / f"{base:020d}.timeindex").read_bytes()
    assert len(data) % 12 == 0
    entries = list(struct.iter_unpack(">qi", data))
    timestamps = [t for t, _ in entries]
    offsets = [base + r for _, r in entries]
    assert timestamps == sorted(set(timestamps)), "time index timestamps must increase"
    assert offsets == sorted(set(offsets)), "time index offsets must increase"
    for timestamp, offset in zip(timestamps, offsets, strict=True):
        holding = [b for b in starts.values() if b[0] <= offset <= b[1]]
        assert len(holding) == 1, f"time index offset {offset} is in no batch"
        assert holding[0][2] == timestamp, f"time index ({timestamp}, {offset})"
    if starts:  # after a clean close the last entry is the segment's largest timestamp
        assert entries and timestamps[-1] == max(b[2] for b in starts.values())
    return entries


def check_indexes(directory, segments):
    offset_entries = time_entries = 0
    for base, starts in segments.items():
        offset_entries += len(check_offset_index(directory, base, starts))
        time_entries += len(check_time_index(directory, base, starts))
    return offset_entries, time_entries


CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=200)


@pytest.mark.parametrize("codec", CODECS)
def test_it_writes_segments_kafka_python_decodes_exactly(tmp_path, codec):
    expected: list = []
    with PartitionLog.open(tmp_path, CONFIG.replace(compression=codec)) as log:
        append_all(log, batches_for(seed=CODEC_IDS[codec], count=40), expected)
    seen: set = set()
    events, segments = decode_directory(tmp_path, seen)
    assert events == expected
    assert seen == {CODEC_IDS[codec]}
    assert len(segments) >= 3
    offset_entries, _ = check_indexes(tmp_path, segments)
    assert offset_entries > 0


def test_it_writes_a_log_of_mixed_codecs_kafka_python_decodes_exactly(tmp_path):
    expected: list = []
    for round_ in range(2):
        for codec in CODECS:
            with PartitionLog.open(tmp_path, CONFIG.replace(compression=codec)) as log:
                append_all(log, batches_for(seed=10 * round_ + CODEC_IDS[codec], count=8),
                           expected)
    seen: set = set()
    events, segments = decode_directory(tmp_path, seen)
    assert events == expected
    assert [e[0] for e in events] == list(range(len(expected)))
    assert seen == set(CODEC_IDS.values())
    assert len(segments) >= 3
    offset_entries, time_entries = check_indexes(tmp_path, segments)
    assert offset_entries > 0 and time_entries >= len(segments)


def test_it_writes_index_entries_kafka_layout_after_rolls_by_time(tmp_path):
    config = CONFIG.replace(segment_bytes=1 << 20, segment_ms=1_000, index_interval_bytes=0)
    expected: list = []
    with PartitionLog.open(tmp_path, config) as log:
        for i in range(30):
            batch = [PendingEvent(b"e%d" % i, timestamp=1_000_000 + i * 300 - (i % 3) * 50)]
            append_all(log, [batch], expected)
    events, segments = decode_directory(tmp_path)
    assert events == expected
    assert len(segments) >= 5
    offset_entries, _ = check_indexes(tmp_path, segments)
    assert offset_entries == 30 - len(segments)  # every batch but each segment's first

"""Damaged derived files are never trusted at use: a flipped bit in an offset or time index
entry that passes the open-time checks is caught by the lookup that lands on it, the
segment's indexes are rebuilt from the log (counted in stats()["index_rebuilds"]), and every
event still comes back exactly once, by offset, by range and by time."""
from __future__ import annotations

import random
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

from channel_engine.event import Event, PendingEvent
from channel_engine.log.config import LogConfig
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.recovery import INDEX_REBUILT

T0 = 1_700_000_000_000
EVENTS = 90
CONFIG = LogConfig(segment_bytes=1_200, index_interval_bytes=0, durability="policy",
                   flush_messages=10**6, retention_ms=-1)
OFFSET_ENTRY, TIME_ENTRY = 8, 12


def timestamps() -> list[int]:
    """Mostly rising, some going back (so a batch's max is not always its last record's)."""
    rng = random.Random(12)
    return [T0 + i * 10 + rng.randint(-15, 15) for i in range(EVENTS)]


def build_template(directory: Path) -> list[Event]:
    """A closed log of several segments, every batch but the first of each indexed."""
    stamps, expected = timestamps(), []
    rng = random.Random(7)
    with PartitionLog.open(directory, CONFIG) as log:
        i = 0
        while i < EVENTS:
            n = min(rng.randint(1, 3), EVENTS - i)
            batch = [PendingEvent(b"body-%03d" % (i + k) * 3, None, {"n": b"%d" % (i + k)},
                                  stamps[i + k]) for k in range(n)]
            log.append(batch)
            expected += [Event(0, i + k, e.timestamp, e.key, dict(e.headers or {}), e.body)
                         for k, e in enumerate(batch)]
            i += n
        assert len(log.segments) >= 3
    return expected


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event]]:
    directory = tmp_path_factory.mktemp("template")
    return directory, build_template(directory)


def entries(path: Path, size: int) -> int:
    return path.stat().st_size // size


def damage_cases(directory: Path) -> list[tuple[str, int, int]]:
    """(file name, entry, bit) for every bit of every middle entry of every index file."""
    cases = []
    for path in sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex")):
        size = OFFSET_ENTRY if path.suffix == ".index" else TIME_ENTRY
        for entry in range(1, entries(path, size) - 1):
            cases += [(path.name, entry, bit) for bit in range(size * 8)]
    return cases


def flip(path: Path, entry: int, bit: int) -> None:
    size = OFFSET_ENTRY if path.suffix == ".index" else TIME_ENTRY
    data = bytearray(path.read_bytes())
    data[entry * size + bit // 8] ^= 0x80 >> (bit % 8)
    path.write_bytes(bytes(data))


def expected_for_time(expected: list[Event], timestamp: int) -> int | None:
    return min((e.offset for e in expected if e.timestamp >= timestamp), default=None)


def check_every_event_once(directory: Path, expected: list[Event]) -> PartitionLog:
    """Open the damaged copy and read everything every way; return the (open) log."""
    log = PartitionLog.open(directory, CONFIG)
    for event in expected:  # one by one
        assert log.read(event.offset, max_events=1) == [event], event.offset
    assert list(log.iter_events(0)) == expected  # by range
    paged, offset = [], 0
    while offset < len(expected):
        page = log.read(offset, max_bytes=200)
        paged += page
        offset = page[-1].offset + 1
    assert paged == expected
    starts = [header.base_offset for _, _, header in log.batch_headers(0)]
    assert starts == sorted(set(starts)) and starts[0] == 0
    for stamp in sorted({e.timestamp for e in expected} | {e.timestamp + 1 for e in expected}):
        assert log.offsets_for_time(stamp) == expected_for_time(expected, stamp), stamp
    return log


def run_case(template: tuple[Path, list[Event]], tmp_path: Path,
             case: tuple[str, int, int]) -> dict:
    source, expected = template
    directory = tmp_path / "log"
    shutil.copytree(source, directory)
    name, entry, bit = case
    flip(directory / name, entry, bit)
    log = check_every_event_once(directory, expected)
    stats = log.stats()
    log.close()
    return stats


def sample(cases: list[tuple[str, int, int]], count: int) -> list[tuple[str, int, int]]:
    """Every bit of the first middle entry of the first .index and .timeindex, then a seeded
    random sample of the other middle entries' bits."""
    first = {}
    for name, entry, _bit in cases:
        first.setdefault(name.rsplit(".", 1)[1], (name, entry))
    whole = [c for c in cases if (c[0], c[1]) in first.values()]
    rest = [c for c in cases if c not in whole]
    return whole + random.Random(3).sample(rest, max(0, min(len(rest), count - len(whole))))


def all_cases() -> list[tuple[str, int, int]]:
    """The cases, from a template built the same way as the fixture's (deterministic)."""
    with tempfile.TemporaryDirectory() as scratch:
        build_template(Path(scratch))
        return damage_cases(Path(scratch))


ALL_CASES = all_cases()
DEFAULT_CASES = sample(ALL_CASES, 320)


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=lambda c: f"{c[0]}-e{c[1]}-b{c[2]}")
def test_it_delivers_every_event_once_whatever_bit_of_a_middle_index_entry_flips(
        template, tmp_path, case):
    run_case(template, tmp_path, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c not in DEFAULT_CASES],
                         ids=lambda c: f"{c[0]}-e{c[1]}-b{c[2]}")
def test_it_delivers_every_event_once_whatever_bit_of_any_middle_entry_flips(
        template, tmp_path, case):
    run_case(template, tmp_path, case)


def test_the_sample_covers_both_index_kinds_and_hundreds_of_cases():
    kinds = {name.rsplit(".", 1)[1] for name, _, _ in DEFAULT_CASES}
    assert kinds == {"index", "timeindex"} and len(DEFAULT_CASES) >= 300
    assert len(ALL_CASES) > 2 * len(DEFAULT_CASES)


def offset_entries(path: Path) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">ii", path.read_bytes()))


def time_entries(path: Path) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">qi", path.read_bytes()))


def test_it_rebuilds_an_offset_index_whose_middle_entry_points_at_the_next_batch(
        template, tmp_path):
    # passes every open-time check (entries still increase, the last one is right), so only
    # the lookup can see it: before, reads of the entry's offsets skipped a batch
    source, expected = template
    directory = tmp_path / "log"
    shutil.copytree(source, directory)
    path = sorted(directory.glob("*.index"))[0]
    original = path.read_bytes()
    pairs = offset_entries(path)
    middle = len(pairs) // 2
    pairs[middle] = (pairs[middle][0], pairs[middle + 1][1] - 1)  # between two batches
    path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))
    log = check_every_event_once(directory, expected)
    assert not [a for a in log.last_recovery.actions if a.kind == INDEX_REBUILT]
    assert log.stats()["index_rebuilds"] == 1
    assert path.read_bytes() == original  # rewritten from the log, as it was written
    log.close()


def test_it_rebuilds_a_time_index_whose_middle_entry_names_a_smaller_timestamp(
        template, tmp_path):
    # a smaller timestamp in a middle entry made offsets_for_time start after records that
    # hold the answer
    source, expected = template
    directory = tmp_path / "log"
    shutil.copytree(source, directory)
    path = sorted(directory.glob("*.timeindex"))[0]
    original = path.read_bytes()
    pairs = time_entries(path)
    middle = len(pairs) // 2
    pairs[middle] = (pairs[middle - 1][0] + 1, pairs[middle][1])
    path.write_bytes(b"".join(struct.pack(">qi", *p) for p in pairs))
    log = check_every_event_once(directory, expected)
    assert not [a for a in log.last_recovery.actions if a.kind == INDEX_REBUILT]
    assert log.stats()["index_rebuilds"] == 1
    assert path.read_bytes() == original
    log.close()


def test_it_counts_rebuilds_of_segments_that_retention_deleted_since(template, tmp_path):
    source, expected = template
    directory = tmp_path / "log"
    shutil.copytree(source, directory)
    path = sorted(directory.glob("*.index"))[0]
    pairs = offset_entries(path)
    pairs[1] = (pairs[1][0], pairs[2][1] - 1)
    path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))
    with PartitionLog.open(directory, CONFIG) as log:
        assert log.read(pairs[1][0], max_events=1)[0] == expected[pairs[1][0]]
        assert log.stats()["index_rebuilds"] == 1
        log.delete_records_before(log.segments[1].base_offset)
        assert log.stats()["index_rebuilds"] == 1


def test_readers_racing_an_appender_over_a_damaged_index_each_get_every_event(
        template, tmp_path):
    import threading

    source, expected = template
    directory = tmp_path / "log"
    shutil.copytree(source, directory)
    damaged = sorted(directory.glob("*.index"))[:-1]  # every sealed segment's index
    for path in damaged:
        pairs = offset_entries(path)
        middle = len(pairs) // 2
        pairs[middle] = (pairs[middle][0], pairs[middle][1] + 5)  # inside its batch
        path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))
    problems: list[str] = []
    with PartitionLog.open(directory, CONFIG) as log:
        def reader() -> None:
            for event in expected:
                got = log.read(event.offset, max_events=1)
                if got != [event]:
                    problems.append(f"offset {event.offset}: {got}")

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for thread in threads:
            thread.start()
        for i in range(200):
            log.append([PendingEvent(b"late-%d" % i, timestamp=T0 + 10_000 + i)])
        for thread in threads:
            thread.join()
        assert problems == []
        assert list(log.iter_events(0))[:EVENTS] == expected
        assert log.stats()["index_rebuilds"] == len(damaged)  # one each, however many saw it


def batch_starts(log_path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, last offset) of each batch in a .log file."""
    data, out, position = log_path.read_bytes(), [], 0
    while position + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, position)
        last_delta = struct.unpack_from(">i", data, position + 23)[0]
        out.append((position, base, base + last_delta))
        position += length + 12
    return out


def test_takes_deliver_every_event_once_over_a_damaged_middle_index_entry(tmp_path):
    # the report: a middle offset index entry pointing at a later batch made takes
    # skip events and mark them taken without delivering them
    from channel_helpers import make_config

    from channel_engine import Channel

    config = make_config(tmp_path, partitions=1, segment_bytes=4_000, index_interval_bytes=300)
    sent = [b"event-%04d" % i for i in range(120)]
    with Channel.open(config) as channel:
        for start in range(0, len(sent), 3):
            with channel.put() as tx:
                for body in sent[start:start + 3]:
                    tx.put(body)
    path = sorted(Path(config.data_dirs[0]).rglob("*.index"))[0]
    batches = batch_starts(path.with_suffix(".log"))
    pairs = offset_entries(path)
    for m in range(1, len(pairs) - 1):  # an entry a take start lands on, a batch to skip to
        holding = [b for b in batches if b[1] <= (pairs[m][0] // 7 + 1) * 7 <= b[2]]
        later = [b for b in batches if holding and holding[0][0] < b[0] < pairs[m + 1][1]]
        if holding and later and (pairs[m][0] // 7 + 1) * 7 < pairs[m + 1][0]:
            break
    else:
        pytest.fail("no entry to damage: change the layout")
    pairs[m] = (pairs[m][0], later[0][0])
    path.write_bytes(b"".join(struct.pack(">ii", *p) for p in pairs))
    taken: list[bytes] = []
    with Channel.open(config) as channel:
        while True:
            with channel.take() as tx:
                got = [e.body for e in tx.take(7)]
            if not got:
                break
            taken += got
        assert channel.status()["events_untaken"] == 0
    assert taken == sent

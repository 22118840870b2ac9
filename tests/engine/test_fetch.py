"""Fetch (log/fetch.py, Channel.fetch): the committed batches of a range as a reader carries
them away — a slice of one segment file for a plain log, the opened batches of an
encrypted one; never past the last stable offset; out of range refused."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from channel_helpers import appends_refused, make_config

from channel_engine import Channel, ChannelEngineError, FetchData, FileSlice, PartitionLog
from channel_engine.encryption import KeyRing
from channel_engine.errors import DiskFullError, OffsetOutOfRangeError
from channel_engine.event import PendingEvent
from channel_engine.log import record_batch
from channel_engine.log.config import LogConfig
from channel_engine.log.fetch import fetch
from channel_engine.log.record_batch import BatchHeader
from channel_engine.log.segment import LogSegment
from channel_engine.queue.channel_state import UnresolvedPut

pytestmark = pytest.mark.usefixtures("each_codec")  # conftest.py: both codecs

PUTS, PER_PUT = 30, 10  # 300 events, 30 batches of about 560 bytes: 7 to a 4 KiB segment


def body(offset: int) -> bytes:
    return b"event-%05d-" % offset + b"x" * 30


def filled(config: object) -> Channel:
    """The channel of `config`, open as owner, holding PUTS puts of PER_PUT events."""
    channel = Channel.open(config)  # type: ignore[arg-type]
    for first in range(0, PUTS * PER_PUT, PER_PUT):
        with channel.put() as tx:
            for offset in range(first, first + PER_PUT):
                tx.put(body(offset), headers={"n": b"%d" % offset})
    return channel


def parsed(data: bytes) -> list[BatchHeader]:
    """The headers of whole, CRC-valid batches back to back filling `data` (else fails)."""
    headers, position = [], 0
    while position < len(data):
        header = record_batch.check_batch(data, position, len(data), None, True)
        headers.append(header)
        position += header.size
    assert position == len(data)
    return headers


def records(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record of the batches in `data`."""
    out, position = [], 0
    for header in parsed(data):
        batch = data[position:position + header.size]
        out += [(offset, value) for offset, _, _, value, _ in record_batch.records(batch)]
        position += header.size
    return out


def holding(channel: Channel, offset: int) -> LogSegment:
    owner = channel.owner
    assert owner is not None
    [segment] = [s for s in owner.logs[0].segments if s.base_offset <= offset < s.next_offset]
    return segment


def read_all(answer: FetchData) -> bytes:
    if isinstance(answer.records, bytes):
        return answer.records
    return answer.records.read()


@pytest.mark.parametrize("preallocate", [False, True])
@pytest.mark.parametrize("start", [0, 15, 73, 140, 299])
def test_it_slices_the_whole_batches_of_one_segment_from_the_one_holding_start(
        tmp_path: Path, preallocate: bool, start: int) -> None:
    config = make_config(tmp_path, segment_bytes=4096, preallocate=preallocate)
    with filled(config) as channel:
        segment = holding(channel, start)
        with channel.fetch(0, start, PUTS * PER_PUT) as answer:
            assert isinstance(answer.records, FileSlice)
            piece = answer.records
            assert os.fstat(piece.fileno()).st_ino == os.stat(segment.log_path).st_ino
            assert os.lseek(piece.fileno(), 0, os.SEEK_CUR) == piece.start  # for sendfile
            data = piece.read()
            assert data == segment.log_path.read_bytes()[piece.start:piece.end]
            assert answer.length == len(data) == piece.end - piece.start
            headers = parsed(data)
            assert headers[0].base_offset <= start < headers[0].next_offset
            # to the segment's end, not into the next one (nor its preallocated zeros)
            assert answer.next_offset == headers[-1].next_offset == segment.next_offset
            assert piece.end == segment.size
            assert answer.start_offset == start


def test_it_stops_with_the_batch_holding_the_last_offset_wanted(tmp_path: Path) -> None:
    with filled(make_config(tmp_path)) as channel, channel.fetch(0, 12, 25) as answer:
        headers = parsed(read_all(answer))  # one big segment
        assert [h.base_offset for h in headers] == [10, 20]
        assert answer.next_offset == 30


def test_a_reader_asking_again_from_next_offset_gets_each_event_once(tmp_path: Path) -> None:
    with filled(make_config(tmp_path, segment_bytes=4096)) as channel:
        got, offset, answers = [], 7, 0
        while offset < 293:
            with channel.fetch(0, offset, 293) as answer:
                got += [(o, v) for o, v in records(read_all(answer)) if offset <= o < 293]
                assert answer.next_offset > offset
                offset = answer.next_offset
                answers += 1
        assert got == [(o, body(o)) for o in range(7, 293)]
        owner = channel.owner
        assert owner is not None and answers == len(owner.logs[0].segments) > 3


def test_max_bytes_bounds_an_answer_but_never_below_one_batch(tmp_path: Path) -> None:
    with filled(make_config(tmp_path)) as channel:
        with channel.fetch(0, 0, 300, max_bytes=1) as answer:
            assert len(parsed(read_all(answer))) == 1 and answer.next_offset == 10
        with channel.fetch(0, 0, 300, max_bytes=2000) as answer:
            data = read_all(answer)
            assert len(parsed(data)) > 1 and len(data) <= 2000
            assert answer.next_offset == 10 * len(parsed(data))


def test_it_never_passes_the_last_stable_offset(tmp_path: Path) -> None:
    with filled(make_config(tmp_path)) as channel:
        with channel.fetch(0, 295, 10_000) as answer:
            assert answer.next_offset == 300  # the log end: every put resolved
        owner = channel.owner
        assert owner is not None
        # the put of offsets 200..209 not resolved yet (its commit in doubt)
        owner.state.unresolved[0][7] = UnresolvedPut(200, 210, 7, 0, 0)
        with channel.fetch(0, 150, 300) as answer:
            assert answer.next_offset == 200
            assert parsed(read_all(answer))[-1].next_offset == 200
        with pytest.raises(OffsetOutOfRangeError, match="offset 200 is out of range"):
            channel.fetch(0, 200, 300)
        del owner.state.unresolved[0][7]


def test_offsets_outside_the_log_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "p0"
    with PartitionLog.open(directory, LogConfig(segment_bytes=4096)) as log:
        for first in range(0, 100, 10):
            log.append([PendingEvent(body(o), None, None, 1) for o in range(first, first + 10)])
        log.delete_records_before(50)
        low = log.log_start_offset
        assert 0 < low <= 50
        for start, end in ((low - 1, 60), (100, 101), (250, 300)):
            with pytest.raises(OffsetOutOfRangeError):
                fetch(log, start, end)
        with pytest.raises(ValueError, match="start < end"):
            fetch(log, 60, 60)
        with fetch(log, low, 100) as answer:
            first = parsed(read_all(answer))[0]
            assert first.base_offset <= low < first.next_offset


def test_a_segment_file_moved_away_is_served_as_bytes_from_the_open_segment(
        tmp_path: Path) -> None:
    directory = tmp_path / "p0"
    with PartitionLog.open(directory, LogConfig()) as log:
        for first in range(0, 50, 10):
            log.append([PendingEvent(body(o), None, None, 1) for o in range(first, first + 10)])
        with fetch(log, 0, 50) as as_slice:
            expected = read_all(as_slice)
        [segment] = log.segments
        os.rename(segment.log_path, str(segment.log_path) + ".deleted")  # as retention does
        with fetch(log, 0, 50) as answer:
            assert answer.records == expected and answer.next_offset == 50
        os.rename(str(segment.log_path) + ".deleted", segment.log_path)


def test_a_file_slice_reads_seeks_and_closes_within_its_bounds(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    piece = FileSlice(os.open(path, os.O_RDONLY), 10, 20)
    assert piece.tell() == 10 and piece.read(5) == bytes(range(10, 15))
    assert piece.read() == bytes(range(15, 30)) and piece.read() == b""
    assert piece.seek(0, io.SEEK_END) == 30 and piece.seek(0) == 10  # kept within [10, 30]
    assert piece.seek(-3, io.SEEK_END) == 27 and piece.read(100) == bytes(range(27, 30))
    piece.close()
    with pytest.raises(ValueError):
        piece.fileno()


def test_an_encrypted_log_answers_opened_batches_with_their_own_crc(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    KeyRing.write_new(keys, ["k1"])
    config = make_config(tmp_path, segment_bytes=4096, encryption_key_file=str(keys),
                         encryption_active_key="k1")
    with filled(config) as channel:
        segment = holding(channel, 35)
        assert body(35) not in segment.log_path.read_bytes()  # sealed on disk
        with channel.fetch(0, 35, 300) as answer:
            assert isinstance(answer.records, bytes)
            headers = parsed(answer.records)  # plain batches, each CRC right
            assert not any(h.attributes & record_batch.ENCRYPTED_MASK for h in headers)
            assert answer.next_offset == segment.next_offset  # one segment's batches
            got = records(answer.records)
            assert got == [(o, body(o)) for o in range(headers[0].base_offset,
                                                       answer.next_offset)]


def test_a_read_only_channel_fetches_and_a_client_is_told_to_open_read_only(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with filled(config) as owner:
        owner.checkpoint()
        with Channel.open(config.home, read_only=True) as snapshot:
            answer = snapshot.fetch(0, 100, 120)
        with answer:  # the answer outlives the snapshot that made it
            assert [o for o, _ in records(read_all(answer))] == list(range(100, 120))
        with Channel.open(config) as client:
            assert client.role == "client"
            with pytest.raises(ChannelEngineError, match="read_only=True"):
                client.fetch(0, 0, 10)


def test_an_aborted_put_is_never_in_an_answer(tmp_path: Path) -> None:
    """Its batch stays in the log between committed ones: an answer ends before it, and one
    asked from inside it begins after it (as Kafka's read_committed fetch leaves it out)."""
    def put_on_partition_0(count: int) -> None:
        for _ in range(count):
            with channel.put() as tx:
                for _ in range(10):
                    tx.put(b"committed", key=b"key-1")  # murmur2: partition 0 of 2

    with Channel.open(make_config(tmp_path, partitions=2)) as channel:
        put_on_partition_0(10)
        with appends_refused(1), pytest.raises(DiskFullError), channel.put() as tx:
            for i in range(20):
                tx.put(b"aborted", key=b"key-%d" % i)
        put_on_partition_0(3)
        assert channel.owner is not None
        aborted = channel.owner.state.aborted[0]
        assert len(aborted) == 1 and aborted[0][0] == 100
        end = aborted[0][1]
        got, offset = [], 95
        while offset < end + 20:
            with channel.fetch(0, offset, end + 20) as answer:
                assert answer.start_offset == offset
                found = [(o, v) for o, v in records(read_all(answer)) if offset <= o < end + 20]
                assert all(v == b"committed" for _, v in found), found
                got += [o for o, _ in found]
                offset = answer.next_offset
        assert got == list(range(95, 100)) + list(range(end, end + 20))
        with channel.fetch(0, 101, end) as answer:  # nothing but the aborted put asked
            assert (read_all(answer), answer.next_offset) == (b"", end)
        with channel.fetch(0, 101, end + 5) as answer:
            assert records(read_all(answer))[0][0] == end

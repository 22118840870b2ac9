"""Checkpoint files: round trip, newest valid of primary and backup, damage reported, and a
process killed while writing one never leaves an unreadable checkpoint."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from channel_engine import CorruptStateError
from channel_engine.queue import checkpoint as cp

GOLDEN = Path(__file__).parent / "golden" / "checkpoint-v1"
GOLDEN_V2 = Path(__file__).parent / "golden" / "checkpoint-v2"
GOLDEN_V4 = Path(__file__).parent / "golden" / "checkpoint-v4"

ranges = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=5)
partitions = st.builds(
    cp.PartitionCheckpoint, st.integers(0, 2**62), st.integers(0, 2**62),
    st.integers(0, 2**62), st.integers(0, 2**62), ranges.map(tuple), ranges.map(tuple),
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**40),
                       st.integers(0, 2**40)), max_size=3).map(tuple))


def sample_v2() -> cp.Checkpoint:
    """Version 2 adds pending puts: (transaction id, start, end) per partition."""
    return cp.Checkpoint(9, 1_700_000_000_500, (
        cp.PartitionCheckpoint(0, 100, 130, 40, ((50, 60),), ((40, 50),),
                               ((2**62 + 5, 120, 130),)),
        cp.PartitionCheckpoint(0, 12, 12, 10, (), (), ((2**62 + 5, 10, 12), (77, 11, 12))),
    ))


def sample(sequence: int = 7) -> cp.Checkpoint:
    return cp.Checkpoint(sequence, 1_700_000_000_000, (
        cp.PartitionCheckpoint(0, 100, 120, 40, ((50, 60),), ((40, 50), (60, 70))),
        cp.PartitionCheckpoint(10, 30, 30, 30, (), ()),
    ))


queue = st.builds(cp.QueueCheckpoint, st.integers(0, 2**62), ranges.map(tuple),
                  ranges.map(tuple))
counter_names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                        max_size=cp.COUNTER_NAME)
counter_sets = st.dictionaries(counter_names, st.integers(0, 2**63 - 1), max_size=6).map(
    lambda found: tuple(found.items()))
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1,
                max_size=20).filter(lambda n: n != cp.DEFAULT_SUBSCRIPTION)


@st.composite
def checkpoints(draw: st.DrawFn) -> cp.Checkpoint:
    """Any checkpoint: partitions, and subscriptions besides `default` with unique ids and
    names, each with a queue per partition."""
    parts = draw(st.lists(partitions, max_size=6))
    chosen = draw(st.lists(names, max_size=4, unique=True))
    ids = draw(st.lists(st.integers(1, 2**20), min_size=len(chosen), max_size=len(chosen),
                        unique=True))
    subs = tuple(cp.SubscriptionCheckpoint(i, name, tuple(draw(queue) for _ in parts))
                 for i, name in zip(ids, chosen, strict=True))
    next_id = max(ids, default=0) + 1 + draw(st.integers(0, 5))
    aborted = tuple(draw(ranges.map(tuple)) for _ in parts)
    counted = draw(st.lists(st.sampled_from([0, *ids]), unique=True)) if draw(st.booleans()) \
        else []
    return cp.Checkpoint(draw(st.integers(0, cp.MAX_SEQUENCE)), draw(st.integers(0, 2**62)),
                         tuple(parts), subscriptions=subs, next_subscription_id=next_id,
                         aborted=aborted if any(aborted) else (),
                         counters=draw(counter_sets),
                         subscription_counters=tuple((i, draw(counter_sets)) for i in counted))


@given(checkpoints())
def test_it_round_trips_any_checkpoint(checkpoint: cp.Checkpoint) -> None:
    assert cp.decode(cp.encode(checkpoint)) == checkpoint


def with_subscriptions() -> cp.Checkpoint:
    base = sample()
    return cp.Checkpoint(base.sequence, base.written_at_ms, base.partitions, subscriptions=(
        cp.SubscriptionCheckpoint(2, "archive", (cp.QueueCheckpoint(45, ((50, 52),), ()),
                                                 cp.QueueCheckpoint(30))),
        cp.SubscriptionCheckpoint(3, "live-01", (cp.QueueCheckpoint(120), cp.QueueCheckpoint(12)))),
        next_subscription_id=4)


def test_it_lists_every_subscriptions_queues_default_first() -> None:
    queues = with_subscriptions().queues()
    assert list(queues) == [(0, "default"), (2, "archive"), (3, "live-01")]
    assert queues[(0, "default")][0] == cp.QueueCheckpoint(40, ((50, 60),), ((40, 50), (60, 70)))
    assert queues[(2, "archive")][0].committed == ((50, 52),)


@pytest.mark.parametrize(("change", "why"), [
    (lambda b: b.replace(b"\x00\x00\x00\x03\x07live-01", b"\x00\x00\x00\x02\x07live-01"),
     "subscription record 1: id 2"),  # an id twice
    (lambda b: b.replace(b"\x07live-01", b"\x07archive"), "name 'archive' twice"),
    (lambda b: b.replace(b"\x00\x00\x00\x04\x00\x00\x00\x02", b"\x00\x00\x00\x03"
                         b"\x00\x00\x00\x02"), "subscription record 1: id 3"),  # id >= next
    (lambda b: b.replace(b"\x07live-01", b"\x3flive-01"), "subscription"),  # past the end
    (lambda b: b.replace(b"\x07archive", b"\x07arch\xffve"), "name is not UTF-8"),
    (lambda b: b.replace(b"\x07archive", b"\x07default"), "name 'default' twice"),
])
def test_it_refuses_a_subscription_record_that_cannot_be_true_even_with_a_valid_crc(
        change: object, why: str) -> None:
    body = cp.encode(with_subscriptions())[:-4]
    damaged = change(body)  # type: ignore[operator]
    assert damaged != body
    with pytest.raises(CorruptStateError, match=why):
        cp.decode(damaged + cp.CRC.pack(__import__("crc32c").crc32c(damaged)))


@pytest.mark.parametrize("sequence", [-1, cp.MAX_SEQUENCE + 1, 2**56 + 2])
def test_it_refuses_a_sequence_no_channel_reaches_even_with_a_valid_crc(sequence: int) -> None:
    # a larger sequence made the owner's take ids overflow the journal's int64 at first take
    with pytest.raises(CorruptStateError, match=f"sequence {sequence} outside"):
        cp.decode(cp.encode(sample(sequence)))


def test_it_reads_the_golden_file_of_version_1() -> None:
    """A released format stays readable: this file was written by version 1."""
    decoded = cp.decode((GOLDEN / cp.FILE_NAME).read_bytes())
    assert decoded == sample() and decoded.version == 1


def test_it_writes_primary_and_backup_and_reads_the_newest(tmp_path: Path) -> None:
    primary, backup = tmp_path / "cp", tmp_path / "backup"
    cp.write(sample(1), primary, backup)
    cp.write(sample(2), primary, None)  # the backup lags behind
    found = cp.read_newest(primary, backup)
    assert found.checkpoint == sample(2) and found.source == "primary" and not found.problems


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "missing", "magic"])
def test_it_falls_back_to_the_backup_when_the_primary_is_damaged(tmp_path: Path,
                                                                   damage: str) -> None:
    primary, backup = tmp_path / "cp", tmp_path / "backup"
    cp.write(sample(5), primary, backup)
    path = primary / cp.FILE_NAME
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[40] ^= 0x10
    elif damage == "truncate":
        data = data[:-9]
    elif damage == "empty":
        data = bytearray()
    elif damage == "magic":
        data[0:4] = b"XXXX"
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(bytes(data))
    found = cp.read_newest(primary, backup)
    assert found.checkpoint == sample(5) and found.source == "backup"
    assert len(found.problems) == 1 and str(path) in found.problems[0]


def test_it_reports_every_problem_when_no_checkpoint_is_valid(tmp_path: Path) -> None:
    primary, backup = tmp_path / "cp", tmp_path / "backup"
    cp.write(sample(), primary, backup)
    for directory in (primary, backup):
        (directory / cp.FILE_NAME).write_bytes(b"WCKP\x01garbage")
    found = cp.read_newest(primary, backup)
    assert found.checkpoint is None and found.source is None and len(found.problems) == 2


def test_decode_names_the_problem(tmp_path: Path) -> None:
    data = cp.encode(sample())
    with pytest.raises(CorruptStateError, match="CRC-32C"):
        cp.decode(data[:-1] + bytes([data[-1] ^ 1]))
    bad_version = bytearray(data[:-4])
    bad_version[4] = 9
    import crc32c
    with pytest.raises(CorruptStateError, match="version 9"):
        cp.decode(bytes(bad_version) + crc32c.crc32c(bytes(bad_version)).to_bytes(4, "big"))


def test_decode_names_the_byte_of_the_problem() -> None:
    data = cp.encode(sample())
    with pytest.raises(CorruptStateError, match=f"byte {len(data) - 4}: CRC-32C") as caught:
        cp.decode(data[:-1] + bytes([data[-1] ^ 1]), "the-file")
    assert caught.value.path == "the-file" and caught.value.position == len(data) - 4


@given(st.data())
def test_decode_of_mutated_bytes_raises_only_engine_errors(data: st.DataObject) -> None:
    original = cp.encode(sample())
    mutated = bytearray(original)
    at = data.draw(st.integers(0, len(mutated) - 1))
    mutated[at:at + 4] = data.draw(st.binary(min_size=0, max_size=8))
    try:
        decoded = cp.decode(bytes(mutated), "ckpt")
    except CorruptStateError as exc:
        assert str(exc).startswith("ckpt: ")
        return
    assert cp.encode(decoded) == bytes(mutated)  # accepted only when it is a whole checkpoint


def test_it_reports_a_directory_in_place_of_the_primary_and_reads_the_backup(
        tmp_path: Path) -> None:
    cp.write(sample(), tmp_path / "p", tmp_path / "b")
    (tmp_path / "p" / cp.FILE_NAME).unlink()
    (tmp_path / "p" / cp.FILE_NAME).mkdir()
    found = cp.read_newest(tmp_path / "p", tmp_path / "b")
    assert found.source == "backup" and found.checkpoint == sample()
    assert len(found.problems) == 1 and "cannot be read" in found.problems[0]


WRITER = """
import sys, time
from pathlib import Path
from channel_engine.queue import checkpoint as cp
primary, backup = Path(sys.argv[1]), Path(sys.argv[2])
parts = tuple(cp.PartitionCheckpoint(0, n, n, n // 2, ((n, n + 1),) * 50, ((n + 2, n + 3),) * 50)
              for n in range(64))
sequence = 0
while True:
    sequence += 1
    cp.write(cp.Checkpoint(sequence, int(time.time() * 1000), parts), primary, backup)
    print(sequence, flush=True)
"""


@pytest.mark.parametrize("trial", range(4))
def test_a_writer_killed_mid_checkpoint_leaves_a_valid_one(tmp_path: Path, trial: int) -> None:
    primary, backup = tmp_path / "cp", tmp_path / "backup"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(primary), str(backup)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        done = int(writer.stdout.readline())
        time.sleep(0.005 + trial * 0.013)
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    found = cp.read_newest(primary, backup)
    assert found.checkpoint is not None and found.checkpoint.sequence >= done
    assert len(found.checkpoint.partitions) == 64


def test_a_released_version_2_checkpoint_stays_readable() -> None:
    golden = (GOLDEN_V2 / cp.FILE_NAME).read_bytes()
    decoded = cp.decode(golden)
    assert decoded == sample_v2() and decoded.version == 2
    # version 3 has version 2's layout; version 4 adds the subscription records after it
    # (next id 1, none besides `default`, whose queues are in the partition records), then
    # each partition's aborted ranges (none)
    # version 5 then the counters (none: 0 channel counters, 0 subscription sets)
    written = cp.encode(sample_v2())
    assert written[4] == 5 and written[:4] == golden[:4]
    assert written[5:-4] == golden[5:-4] + struct.pack(">ii", 1, 0) + struct.pack(">ii", 0, 0) \
        + struct.pack(">ii", 0, 0)


def sample_v4() -> cp.Checkpoint:
    """Version 4 adds subscriptions and aborted ranges; it has no counters."""
    base = with_subscriptions()
    return cp.Checkpoint(base.sequence, base.written_at_ms, base.partitions,
                         subscriptions=base.subscriptions, next_subscription_id=4,
                         aborted=(((100, 104),), ()))


def test_a_released_version_4_checkpoint_stays_readable_and_has_no_counters() -> None:
    golden = (GOLDEN_V4 / cp.FILE_NAME).read_bytes()
    decoded = cp.decode(golden)
    assert decoded == sample_v4() and decoded.version == 4
    assert decoded.counters == () and decoded.subscription_counters == ()
    # version 5 is version 4 and then the counters
    written = cp.encode(replace(sample_v4(), counters=(("put_successes", 7),),
                                subscription_counters=((0, (("take_successes", 3),)),)))
    assert written[4] == 5 and written[5:len(golden) - 4] == golden[5:-4]
    assert written[len(golden) - 4:-4] == struct.pack(">i", 1) + b"\x0dput_successes" \
        + struct.pack(">qi", 7, 1) + struct.pack(">ii", 0, 1) + b"\x0etake_successes" \
        + struct.pack(">q", 3)


@pytest.mark.parametrize(("change", "why"), [
    (lambda b: b.replace(b"\x0dput_successes", b"\x00put_successes"), "counter record 0"),
    (lambda b: b.replace(b"\x0dput_successes", b"\x0dput_successe\xff"), "counter record 0"),
    (lambda b: b.replace(struct.pack(">q", 777), struct.pack(">q", -777)), "value -777"),
    (lambda b: b.replace(b"\x0etake_successes", b"\x0dput_successes"), "name b'put_"),
    (lambda b: b.replace(struct.pack(">ii", 0, 1) + b"\x0etake",
                         struct.pack(">ii", 9, 1) + b"\x0etake"), "subscription id 9"),
    (lambda b: b.replace(struct.pack(">qi", 2, 1) + struct.pack(">i", 0),
                         struct.pack(">qi", 2, 9) + struct.pack(">i", 0)), "9 subscription"),
])
def test_it_refuses_counters_that_cannot_be_true_even_with_a_valid_crc(change: object,
                                                                       why: str) -> None:
    checkpoint = replace(sample(), counters=(("put_successes", 777), ("take_successes", 2)),
                         subscription_counters=((0, (("take_successes", 3),)),))
    body = cp.encode(checkpoint)[:-4]
    damaged = change(body)  # type: ignore[operator]
    assert damaged != body
    with pytest.raises(CorruptStateError, match=why):
        cp.decode(damaged + cp.CRC.pack(__import__("crc32c").crc32c(damaged)))


def test_a_counter_past_its_field_saturates_rather_than_make_the_checkpoint_unwritable(
        ) -> None:
    checkpoint = replace(sample(), counters=(("take_attempts", 1 << 70),),
                         subscription_counters=((0, (("take_attempts", (1 << 63) + 5),)),))
    read = cp.decode(cp.encode(checkpoint))
    assert read.counters == (("take_attempts", cp.MAX_COUNTER),)
    assert read.subscription_counters == ((0, (("take_attempts", cp.MAX_COUNTER),)),)


def test_it_writes_version_5_a_version_that_keeps_a_loss_ledger(tmp_path: Path) -> None:
    cp.write(sample(), tmp_path, None)
    assert (tmp_path / cp.FILE_NAME).read_bytes()[4] == 5
    assert cp.read(tmp_path / cp.FILE_NAME).version >= cp.LEDGER_VERSION == 3

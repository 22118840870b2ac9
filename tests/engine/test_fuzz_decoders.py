"""Fuzzing every on-disk decoder with mutated REAL files (issue 12, "Fuzzing").

A real channel is built once per variant — three partitions, several segments,
multi-partition puts and takes (commit journal with put and take commits), a
checkpoint and its backup copy, log.state; the "sealed" variant is encrypted
(lz4 inside the sealed units), left by a crash (unclean log.state, journal as
written), the "plain" one closed cleanly. Each decoder is then fed mutations of
its real file: bit flips, byte overwrites, extreme int32/int64 values written
over length fields, truncations, insertions, splices of other real files, and
for JSON files values swapped for arbitrary JSON; with a drawn flag the
checksums are recomputed after the mutation so the structural checks behind
the CRC are reached too.

What must hold: a decoder returns, or raises one of the engine's own errors
(ChannelEngineError and subclasses) — never struct.error, ValueError, KeyError,
UnicodeDecodeError, a codec's error, MemoryError... — and never allocates by an
unchecked length field (the peak Python allocation of a decode is bounded by the
input's size). Opening a whole partition log, or a whole channel, with one
mutated file either succeeds (and every read, put and take then also raises only
engine errors) or raises an engine error; `verify` of a channel with one mutated
file reports or raises an engine error, nothing else.

The default run is derandomized (the same examples in every CI run); the
`slow` variants run many more random examples.
"""
from __future__ import annotations

import json
import shutil
import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import pytest
from channel_helpers import crash, make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from channel_engine import Channel, ChannelConfig, ChannelEngineError, PendingEvent
from channel_engine.encryption import BatchSealer, KeyRing
from channel_engine.log import record_batch as rb
from channel_engine.log import state as log_state
from channel_engine.log.offset_index import OffsetIndex
from channel_engine.log.partition_log import PartitionLog
from channel_engine.log.segment import LogSegment, SegmentConfig
from channel_engine.log.time_index import TimeIndex
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.tools import verify

DEFAULT = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=1000, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
OPEN_DEFAULT = settings(DEFAULT, max_examples=40)
CHANNEL_OPEN_DEFAULT = settings(DEFAULT, max_examples=20)
OPEN_SLOW = settings(SLOW, max_examples=1000)
CHANNEL_OPEN_SLOW = settings(SLOW, max_examples=300)
KEY_ID = "k2"
INDEX_MAX_BYTES = 10 * 1024 * 1024
# a decode may hold a few copies of its input and the objects it decodes, never what an
# unchecked length field asks for
ALLOCATION_LIMIT = 16 << 20
ALLOCATION_PER_INPUT_BYTE = 200


# -- the real channel ----------------------------------------------------------------------
@dataclass(repr=False)
class Real:
    """A real channel's files: `work` is where it lives (channel.json names it), `pristine`
    a copy restored before each whole-open example."""

    variant: str
    work: Path
    pristine: Path
    scratch: Path
    config: ChannelConfig
    files: dict[str, bytes]  # path relative to work -> bytes

    def __repr__(self) -> str:
        return f"Real({self.variant!r}, {self.work})"

    def paths(self, suffix: str) -> list[str]:
        """Relative paths of the files whose name ends with `suffix`, sorted."""
        return sorted(p for p in self.files if p.endswith(suffix))

    def sealer(self, partition: int) -> BatchSealer | None:
        """The partition's sealer in the sealed variant."""
        if self.config.encryption_key_file is None:
            return None
        keys = KeyRing.load(self.config.encryption_key_file, KEY_ID)
        return BatchSealer(keys, self.config.name, partition)

    def restore(self) -> None:
        """Put the pristine files back where the channel lives."""
        shutil.rmtree(self.work)
        shutil.copytree(self.pristine, self.work, symlinks=True)

    def scratch_file(self, name: str, data: bytes) -> Path:
        """Write `data` to a scratch file named like the real one."""
        path = self.scratch / Path(name).name
        path.write_bytes(data)
        return path


def build(base: Path, variant: str) -> Real:
    """Build a real channel in base/work (see the module doc) and snapshot it."""
    work = base / "work"
    work.mkdir(parents=True)
    settings_: dict[str, Any] = dict(
        partitions=3, segment_bytes=1500, index_interval_bytes=100, use_dual_checkpoints=True,
        backup_checkpoint_dir=str(work / "backup"), checkpoint_on_close=False)
    if variant == "sealed":
        KeyRing.write_new(work / "keys.json", ["k1", KEY_ID])
        settings_.update(encryption_key_file=str(work / "keys.json"),
                         encryption_active_key=KEY_ID, compression="lz4")
    config = make_config(work, **settings_)
    channel = Channel.open(config)
    _put(channel, range(20))
    with channel.take() as tx:
        tx.take(15)
    channel.checkpoint()
    _put(channel, range(20, 30))
    with channel.take() as tx:
        tx.take(7)
    channel.take().take(4)  # in flight when the channel goes down
    if variant == "sealed":
        crash(channel)
    else:
        channel.close()
    files = {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*"))
             if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".deleted")}
    shutil.copytree(work, base / "pristine", symlinks=True,
                    ignore=shutil.ignore_patterns("owner.sock"))
    (base / "scratch").mkdir()
    return Real(variant, work, base / "pristine", base / "scratch", config, files)


def _put(channel: Channel, transactions: range) -> None:
    for i in transactions:
        with channel.put() as tx:
            for j in range(3):
                tx.put(b"body-%d-%d " % (i, j) * 3, key=b"k%d" % (3 * i + j) if i % 2 else None,
                       headers={"src": "web", "n": str(j), "none": None},
                       timestamp=1_700_000_000_000 + 10 * i + j)


@pytest.fixture(scope="module", params=["plain", "sealed"])
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Real:
    return build(tmp_path_factory.mktemp(f"fuzz-{request.param}"), request.param)


# -- mutations -----------------------------------------------------------------------------
EXTREMES = [0, -1, 1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 1 << 20, 1 << 30, 61, 49]


@st.composite
def mutations(draw: st.DrawFn, original: bytes, donors: list[bytes]) -> bytes:
    """One to three mutations of `original` (see the module doc)."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "overwrite", "extreme", "truncate", "insert",
                                     "splice", "append"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[at:at + len(chunk)] = chunk
        elif kind == "extreme":
            value = draw(st.sampled_from(EXTREMES))
            fmt = ">q" if not -(2**31) <= value < 2**31 or draw(st.booleans()) else ">i"
            data[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "splice":
            donor = draw(st.sampled_from(donors))
            start = draw(st.integers(0, max(len(donor) - 1, 0)))
            chunk = donor[start:start + draw(st.integers(1, 200))]
            if draw(st.booleans()):
                data[at:at + len(chunk)] = chunk
            else:
                data[at:at] = chunk
        elif kind == "append":
            data += draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


def _json_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    _json_containers, max_leaves=6)


@st.composite
def json_mutations(draw: st.DrawFn, original: bytes, donors: list[bytes]) -> bytes:
    """Byte mutations, or the document with values swapped, added or removed (nested one
    level into objects, so the key file's keys are reached)."""
    if draw(st.booleans()):
        return draw(mutations(original, donors))
    document = json.loads(original)
    target = document
    if draw(st.booleans()):
        nested = [k for k, v in document.items() if isinstance(v, dict)]
        if nested:
            target = document[draw(st.sampled_from(nested))]
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(target)) if target and draw(st.booleans())
                   else st.text(max_size=8))
        if draw(st.integers(0, 3)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(JSON_VALUES)
    return json.dumps(document).encode()


# -- checksums recomputed after a mutation, to reach the checks behind them ---------------
def fix_batch_crcs(data: bytearray) -> None:
    """Recompute the CRC of every batch whose length field fits the bytes."""
    position = 0
    while position + rb.HEADER_SIZE <= len(data):
        (length,) = struct.unpack_from(">i", data, position + 8)
        end = position + rb.LOG_OVERHEAD + length
        if length < rb.MIN_BATCH_LENGTH or end > len(data):
            return
        struct.pack_into(">I", data, position + 17,
                         rb.compute_crc(memoryview(data)[position:end]))
        position = end


def fix_log_state_crc(data: bytearray) -> None:
    """Recompute log.state's CRCs (the header's, and the committed-end record's) when the
    size is right."""
    if len(data) in log_state.SIZES.values():
        struct.pack_into(">I", data, log_state.BODY.size, crc32c.crc32c(data[:log_state.BODY.size]))
    if len(data) == log_state.SIZE:
        at = log_state.COMMITTED_END_AT
        data[at:] = log_state.encode_committed_end(struct.unpack_from(">q", data, at)[0])


def fix_checkpoint_crc(data: bytearray) -> None:
    """Recompute the checkpoint's trailing CRC."""
    if len(data) >= 4:
        data[-4:] = struct.pack(">I", crc32c.crc32c(bytes(data[:-4])))


def fix_journal_crcs(data: bytearray) -> None:
    """Recompute the CRC of every journal record whose length fits the bytes."""
    position = commit_journal.HEADER.size
    while position + commit_journal.RECORD_HEAD.size <= len(data):
        (length,) = struct.unpack_from(">i", data, position)
        start = position + commit_journal.RECORD_HEAD.size
        if length < 0 or start + length > len(data):
            return
        struct.pack_into(">I", data, position + 4, crc32c.crc32c(bytes(data[start:start + length])))
        position = start + length


def no_fix(data: bytearray) -> None:
    """Leave the checksums as mutated."""


@st.composite
def damaged(draw: st.DrawFn, real: Real, name: str) -> bytes:
    """A mutation of the real file `name`, checksums recomputed or not (drawn)."""
    original = real.files[name]
    donors = list(real.files.values())
    if name.endswith(".json"):
        return draw(json_mutations(original, donors))
    data = bytearray(draw(mutations(original, donors)))
    if draw(st.booleans()):
        fixer_for(name)(data)
    return bytes(data)


def fixer_for(name: str) -> Callable[[bytearray], None]:
    """The checksum fixer of a file kind."""
    base = Path(name).name
    if base.endswith(".log"):
        return fix_batch_crcs
    if base == "log.state":
        return fix_log_state_crc
    if base == "checkpoint":
        return fix_checkpoint_crc
    if base.endswith(".journal"):
        return fix_journal_crcs
    return no_fix


# -- the check -----------------------------------------------------------------------------
def event(outcome: str) -> None:
    """Count an outcome in the statistics (--hypothesis-show-statistics)."""
    if currently_in_test_context():
        hypothesis_event(outcome)


def engine_errors_only(decode: Callable[[], object], input_size: int) -> None:
    """Run a decode: it returns or raises a ChannelEngineError (anything else propagates
    and fails the example), within the allocation bound."""
    tracemalloc.start()
    try:
        decode()
        event("decoded")
    except ChannelEngineError as exc:
        event(f"refused: {type(exc).__name__}")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    limit = ALLOCATION_LIMIT + ALLOCATION_PER_INPUT_BYTE * input_size
    assert peak <= limit, f"a decode of {input_size} bytes allocated {peak} bytes at its peak"


def partition_of(name: str) -> int:
    """The partition number of a file under data-*/ch-<p>/."""
    return int(Path(name).parent.name.rsplit("-", 1)[1])


# -- decoders ------------------------------------------------------------------------------
def decode_batches(data: bytes, sealer: BatchSealer | None) -> None:
    """Walk a segment's bytes as the loader and the readers do: check each batch, unseal
    it and decode its records (both record decoders)."""
    position = 0
    while position < len(data):
        if rb.is_zero(data, position, len(data)):
            return  # the zeros an fsync channel keeps ahead of its appends (after a crash)
        header = rb.check_batch(data, position, len(data), None, True)
        batch = data[position:position + header.size]
        plain = rb.unseal(batch, sealer)
        list(rb.records(plain))
        rb.record_columns(plain)
        position += header.size


def check_segment_batches(real: Real, data_: st.DataObject) -> None:
    name = data_.draw(st.sampled_from(real.paths(".log")))
    data = data_.draw(damaged(real, name))
    sealer = real.sealer(partition_of(name))
    engine_errors_only(lambda: decode_batches(data, sealer), len(data))


def check_records(real: Real, data_: st.DataObject) -> None:
    """The record decoder behind a valid CRC: a real batch (built with every codec) with
    its records section mutated and its CRC recomputed."""
    codec = data_.draw(st.sampled_from(sorted(rb.COMPRESSION_CODECS.values())))
    events = [PendingEvent(b"body-%d" % i * 4, b"k%d" % i, {"h": "v", "n": None}, 1000 + i)
              for i in range(4)]
    original = bytes(rb.build(events, codec))
    data = bytearray(data_.draw(mutations(original, list(real.files.values()))))
    if len(data) >= rb.HEADER_SIZE:
        struct.pack_into(">i", data, 8, len(data) - rb.LOG_OVERHEAD)
    fix_batch_crcs(data)
    engine_errors_only(lambda: decode_batches(bytes(data), None), len(data))


def segment_with(real: Real, name: str, suffix: str, data: bytes) -> LogSegment:
    """A read-only segment in scratch/<partition>: the real .log and indexes, the file with
    `suffix` replaced by `data`."""
    directory = real.scratch / f"segment-{partition_of(name)}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    stem = Path(name).name.rsplit(".", 1)[0]
    for kind in (".log", ".index", ".timeindex"):
        sibling = str(Path(name).with_name(stem + kind))
        (directory / (stem + kind)).write_bytes(data if kind == suffix
                                                else real.files.get(sibling, b""))
    return LogSegment.open(directory, int(stem), SegmentConfig(INDEX_MAX_BYTES, 100),
                           writable=False)


def use_segment(segment: LogSegment) -> None:
    """Open the segment as after a clean shutdown and look every offset up."""
    try:
        if segment.load_clean() is not None:
            segment.rebuild_indexes()
        for offset in range(segment.base_offset - 1, segment.next_offset + 2):
            position = segment.find_position(offset, segment.size)
            if position is not None:
                list(segment.read_batches(position, segment.size, segment.next_offset, 1 << 20))
        for timestamp in (0, 1_700_000_000_000, 1_700_000_000_150, 2**63 - 1):
            segment.time_index.lookup_before(timestamp)
    finally:
        segment.close()


def check_index(real: Real, data_: st.DataObject, suffix: str) -> None:
    name = data_.draw(st.sampled_from(real.paths(suffix)))
    data = data_.draw(damaged(real, name))
    base = int(Path(name).name.split(".")[0])
    index_type = OffsetIndex if suffix == ".index" else TimeIndex
    index = index_type(real.scratch_file(name, data), base, INDEX_MAX_BYTES, False)
    engine_errors_only(index.load, len(data))
    for target in (base - 1, base, base + 5, base + 1000, 2**62):
        if suffix == ".index":
            index.lookup(target)  # type: ignore[union-attr]
        else:
            index.lookup_before(target * 1000)  # type: ignore[union-attr]
    engine_errors_only(lambda: use_segment(segment_with(real, name, suffix, data)), len(data))


def check_log_state(real: Real, data_: st.DataObject) -> None:
    name = data_.draw(st.sampled_from(real.paths("log.state")))
    data = data_.draw(damaged(real, name))
    path = real.scratch_file(name, data)
    engine_errors_only(lambda: log_state.read(path), len(data))


def check_checkpoint(real: Real, data_: st.DataObject) -> None:
    """Both copies: a damaged primary, backup or both; read_newest then decodes each."""
    which = data_.draw(st.sampled_from(["home", "backup", "both"]))
    directories = {"home": real.scratch / "home", "backup": real.scratch / "backup"}
    total = 0
    for copy, directory in directories.items():
        directory.mkdir(exist_ok=True)
        name = f"{copy}/checkpoint"
        data = data_.draw(damaged(real, name)) if which in (copy, "both") else real.files[name]
        (directory / "checkpoint").write_bytes(data)
        total += len(data)
        engine_errors_only(lambda d=data: checkpoint_file.decode(d), len(data))  # type: ignore[misc]
    engine_errors_only(lambda: checkpoint_file.read_newest(directories["home"],
                                                           directories["backup"]), total)


def check_journal(real: Real, data_: st.DataObject) -> None:
    name = data_.draw(st.sampled_from(real.paths(".journal")))
    data = data_.draw(damaged(real, name))
    path = real.scratch_file(name, data)
    engine_errors_only(lambda: commit_journal.replay(path), len(data))


def check_channel_json(real: Real, data_: st.DataObject) -> None:
    data = data_.draw(damaged(real, "home/channel.json"))
    path = real.scratch_file("channel.json", data)
    engine_errors_only(lambda: ChannelConfig.load(path), len(data))


def check_key_file(real: Real, data_: st.DataObject) -> None:
    if "keys.json" in real.files:
        data = data_.draw(damaged(real, "keys.json"))
    else:  # the plain channel has none: mutate a key file made here, with its files as donors
        fresh = real.scratch_file("fresh-keys.json", b"")
        fresh.unlink()
        KeyRing.write_new(fresh, [KEY_ID])
        original = fresh.read_bytes()
        data = data_.draw(json_mutations(original, [original, *real.files.values()]))
    path = real.scratch_file("keys.json", data)
    path.chmod(0o600)
    engine_errors_only(lambda: KeyRing.load(path, KEY_ID), len(data))


DECODERS: dict[str, Callable[[Real, st.DataObject], None]] = {
    "record-batches": check_segment_batches,
    "records-behind-a-valid-crc": check_records,
    "offset-index": lambda real, data_: check_index(real, data_, ".index"),
    "time-index": lambda real, data_: check_index(real, data_, ".timeindex"),
    "log-state": check_log_state,
    "checkpoint": check_checkpoint,
    "commit-journal": check_journal,
    "channel-json": check_channel_json,
    "key-file": check_key_file,
}


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@DEFAULT
@given(data_=st.data())
def test_it_raises_only_engine_errors_decoding_mutated_files(real: Real, decoder: str,
                                                             data_: st.DataObject) -> None:
    DECODERS[decoder](real, data_)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", sorted(DECODERS))
@SLOW
@given(data_=st.data())
def test_it_raises_only_engine_errors_decoding_mutated_files_many(real: Real, decoder: str,
                                                                  data_: st.DataObject) -> None:
    DECODERS[decoder](real, data_)


# -- whole opens ---------------------------------------------------------------------------
def mutate_one_file(real: Real, data_: st.DataObject, under: str | tuple[str, ...] = "") -> str:
    """Restore the pristine channel and damage one of its files (under `under`)."""
    real.restore()
    name = data_.draw(st.sampled_from(sorted(p for p in real.files if p.startswith(under))))
    path = real.work / name
    mode = path.stat().st_mode
    path.write_bytes(data_.draw(damaged(real, name)))
    path.chmod(mode)
    return name


def read_whole_log(log: PartitionLog) -> None:
    """Every read a consumer may make of an opened log."""
    try:
        list(log.iter_events(log.log_start_offset))
        for timestamp in (0, 1_700_000_000_100, 2**62):
            log.offsets_for_time(timestamp)
        list(log.batch_headers(log.log_start_offset))
    finally:
        log.close()


def open_partition(real: Real, partition: int, read_only: bool) -> None:
    log = PartitionLog.open(real.config.partition_dir(partition), real.config.log_config(),
                            partition=partition, read_only=read_only,
                            sealer=real.sealer(partition))
    read_whole_log(log)


def check_partition_open(real: Real, data_: st.DataObject) -> None:
    name = mutate_one_file(real, data_, under="data-")
    read_only = data_.draw(st.booleans())
    try:
        open_partition(real, partition_of(name), read_only)
        event("opened and read")
    except ChannelEngineError as exc:
        event(f"refused: {type(exc).__name__}")


def take_everything(channel: Channel) -> None:
    """status(), a put to every partition, then take and commit until nothing is left (or
    an engine error)."""
    try:
        channel.status()
        with channel.put() as tx:
            for key in (b"a", b"b", b"c", b"d"):
                tx.put(b"after the damage", key=key)
        for _ in range(50):
            with channel.take() as tx:
                if not tx.take(100):
                    break
        channel.status()
    finally:
        channel.close()


def check_channel_open(real: Real, data_: st.DataObject,
                       under: str | tuple[str, ...] = "") -> None:
    mutate_one_file(real, data_, under)
    read_only = data_.draw(st.booleans())
    config: ChannelConfig | Path = real.config
    if data_.draw(st.booleans()):
        config = real.config.home  # as the tools open it: channel.json decides
    try:
        channel = Channel.open(config, read_only=read_only, owner_wait_ms=0)
    except ChannelEngineError as exc:
        event(f"open refused: {type(exc).__name__}")
        return
    try:
        take_everything(channel) if not read_only else _read_everything(channel)
        event("opened and drained")
    except ChannelEngineError as exc:
        event(f"opened, then refused: {type(exc).__name__}")


def _read_everything(channel: Channel) -> None:
    try:
        for partition in channel.status()["partitions"]:
            offset, end = partition["log_start_offset"], partition["log_end_offset"]
            while offset < end:
                events = channel.read(partition["partition"], offset, 1000)
                if not events:
                    break
                offset = events[-1].offset + 1
    finally:
        channel.close()


@OPEN_DEFAULT
@given(data_=st.data())
def test_it_opens_a_partition_log_with_one_mutated_file_or_raises_an_engine_error(
        real: Real, data_: st.DataObject) -> None:
    check_partition_open(real, data_)


@CHANNEL_OPEN_DEFAULT
@given(data_=st.data())
def test_it_opens_a_channel_with_one_mutated_file_or_raises_an_engine_error(
        real: Real, data_: st.DataObject) -> None:
    check_channel_open(real, data_)


@CHANNEL_OPEN_DEFAULT
@given(data_=st.data())
def test_it_opens_a_channel_with_a_mutated_checkpoint_journal_or_config_or_raises_an_engine_error(
        real: Real, data_: st.DataObject) -> None:
    check_channel_open(real, data_, under=("home/", "backup/", "keys.json"))


def check_verify(real: Real, data_: st.DataObject) -> None:
    """verify reads every file of the channel: it reports damage, it does not crash on it."""
    mutate_one_file(real, data_)
    try:
        verify.verify_channel(real.config)
        event("verified")
    except ChannelEngineError as exc:
        event(f"refused: {type(exc).__name__}")


@CHANNEL_OPEN_DEFAULT
@given(data_=st.data())
def test_verify_reads_a_channel_with_one_mutated_file_or_raises_an_engine_error(
        real: Real, data_: st.DataObject) -> None:
    check_verify(real, data_)


@pytest.mark.slow
@CHANNEL_OPEN_SLOW
@given(data_=st.data())
def test_verify_reads_a_channel_with_one_mutated_file_many(real: Real,
                                                           data_: st.DataObject) -> None:
    check_verify(real, data_)


@pytest.mark.slow
@OPEN_SLOW
@given(data_=st.data())
def test_it_opens_a_partition_log_with_one_mutated_file_many(real: Real,
                                                             data_: st.DataObject) -> None:
    check_partition_open(real, data_)


@pytest.mark.slow
@CHANNEL_OPEN_SLOW
@given(data_=st.data())
def test_it_opens_a_channel_with_one_mutated_file_many(real: Real,
                                                       data_: st.DataObject) -> None:
    check_channel_open(real, data_)


@pytest.mark.slow
@CHANNEL_OPEN_SLOW
@given(data_=st.data())
def test_it_opens_a_channel_with_a_mutated_checkpoint_journal_or_config_many(
        real: Real, data_: st.DataObject) -> None:
    check_channel_open(real, data_, under=("home/", "backup/", "keys.json"))


def test_the_real_channel_has_every_file_kind(real: Real) -> None:
    """The fuzz inputs are what they claim: several segments per partition, both indexes,
    log.state per partition, both checkpoint copies, a journal with take and put commits."""
    assert len(real.paths(".log")) >= 6
    assert len(real.paths(".index")) == len(real.paths(".timeindex")) == len(real.paths(".log"))
    assert len(real.paths("log.state")) == 3
    assert {"home/checkpoint", "backup/checkpoint", "home/channel.json"} <= set(real.files)
    [journal] = real.paths(".journal")
    commits, ignored = commit_journal.replay(real.scratch_file(journal, real.files[journal]))
    assert {commit.kind for commit in commits} == {commit_journal.TAKE, commit_journal.PUT}
    assert ignored == 0
    assert ("keys.json" in real.files) == (real.variant == "sealed")
    for name in real.paths(".log"):
        decode_batches(real.files[name], real.sealer(partition_of(name)))


def test_the_check_fails_on_a_foreign_error_and_on_an_allocation_by_a_length_field() -> None:
    """The fuzz check can fail: what a broken decoder would do is caught."""
    with pytest.raises(struct.error):
        engine_errors_only(lambda: struct.unpack_from(">i", b"\x00"), 1)
    claimed = ALLOCATION_LIMIT + 1000 * ALLOCATION_PER_INPUT_BYTE + 1
    with pytest.raises(AssertionError, match="allocated"):
        engine_errors_only(lambda: bytearray(claimed), 1000)
    engine_errors_only(lambda: rb.check_header(b"\x00" * 61, 0, 0), 61)  # InvalidBatch: fine

"""WeirSource: a Spark Python Data Source ("weir") over fixed offset ranges of a channel.

    from channel_engine.spark import register

    register(spark)
    frame = (spark.read.format("weir").option("home", "/data/orders/checkpoint")
             .option("ranges", '{"0": [0, 5000], "2": [100, 900]}').load())

Options (strings, as Spark passes them; names are case-insensitive):

    option              required  meaning
    ------------------  --------  ------------------------------------------------------
    home                yes       the channel's home: the directory holding channel.json
    ranges              yes       JSON {"<partition>": [start, end], ...}: the offsets to
                                  read per partition, end exclusive; or several
                                  ranges of a partition, {"<partition>": [[start,
                                  end], ...]}, sorted and not overlapping
    max_rows_per_split  no        a range longer than this (default 200000) is cut into
                                  equal splits, each read by its own Spark task
    split_align         no        cut splits at offsets that are multiples of this
                                  instead (each split at most this long): the exporter
                                  makes one split per output file this way
    url                 no        read over the appliance's HTTP API at this base URL
                                  (GET …/partitions/{p}/batches, asked again from where
                                  each answer stops) instead of from files: for
                                  executors that do not share the appliance's disks
    token               with url  an API token with the consume role on the channel
    columns             no        "events" (default): the schema below; "readable":
                                  READABLE_SCHEMA, each key, header value and body as
                                  text when it is UTF-8 and as bytes when not (the
                                  export's schema version 2, file_formats.py). A
                                  schema given (.schema()) must be that one.

Schema, one row per event:

    column     type                meaning
    ---------  ------------------  ---------------------------------------------------
    channel    string              the channel's name
    partition  int                 the partition
    offset     long                the event's offset in its partition
    timestamp  long                milliseconds since the epoch, as stored
    key        binary              null when the event has none
    headers    map<string,binary>  empty when the event has none
    body       binary              the body

READABLE_SCHEMA (option columns=readable) has the same first four columns, then key
(string), key_bytes (binary), headers (map<string,string>), headers_bytes
(map<string,binary>), body (string), body_bytes (binary): arrow_decode.py says which
holds what.

Every split is a fixed [start, end), so a retried task reads exactly the same rows (never
"to the end of the log", which moves). A split opens its partition log read-only, which
takes no lock: the channel's owner may be appending in another process meanwhile. It
raises RangeUnavailableError, never returns fewer rows, when the log does not hold the
whole range: events below the log start offset were deleted, or end is past the log end.
Damage (a batch whose CRC or header fails, in a segment file) inside a split fails the
split with DamagedRangeError naming the segment, the byte position and the offsets, before
a row past the damage is handed over — never a garbled or partial batch, never a silent
skip. As a Kafka Connect task with errors.tolerance=none, the export stops and its run
commits nothing (the export stays exactly-once); the offsets are not counted lost here (a
read-only reader cannot write the loss ledger): `recover` on the channel, or the owner's
own reads, count them, and the next take no longer hands them out.
Encrypted channels are decrypted with the key file channel.json names, as the owner does.
Events are read as stored: take the ranges from the channel (a take's reserve(), as the
exporter does), which never hands out the events of an aborted multi-partition put.

read() yields pyarrow RecordBatches, never a tuple or an Event per row: each record
batch's records go straight into Arrow buffers (the compiled codec's ColumnBuffers; the
pure path and compressed batches: record_batch.record_columns lists), gathered into
RecordBatches of Spark's Arrow schema (arrow_decode.py) of at least ARROW_BATCH_ROWS rows,
cut before a column would pass the 2 GiB Arrow's int32 offsets address.

Spark pickles these classes by reference: its Python workers must be able to import
channel_engine (install it, or put the repository on PYTHONPATH) and need pyarrow. They
open the partition directories and the key file by path, so they must run on the host
that holds them (local mode, or executors on the appliance's machine).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from channel_engine import ChannelConfig, ConfigError, LogConfig, LostRange
from channel_engine.errors import (
    DamagedRangeError,
    InvalidBatch,
    OffsetGap,
    RangeUnavailableError,
)

SCHEMA = StructType([
    StructField("channel", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", LongType()),
    StructField("key", BinaryType()),
    StructField("headers", MapType(StringType(), BinaryType())),
    StructField("body", BinaryType()),
])
READABLE_SCHEMA = StructType([
    *SCHEMA.fields[:4],
    StructField("key", StringType()),
    StructField("key_bytes", BinaryType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("headers_bytes", MapType(StringType(), BinaryType())),
    StructField("body", StringType()),
    StructField("body_bytes", BinaryType()),
])
SCHEMAS = {"events": SCHEMA, "readable": READABLE_SCHEMA}  # by the option columns
DEFAULT_MAX_ROWS_PER_SPLIT = 200_000
# Rows per RecordBatch handed to Spark, at least (whole record batches are added, one at
# a time, until this many are gathered).
ARROW_BATCH_ROWS = 10_000
_PARTITION = re.compile(r"0|[1-9][0-9]{0,4}")
# A record batch as read, with the error to raise for InvalidBatch from its records.
Chunk = tuple[bytes, Callable[[InvalidBatch], Exception]]


@dataclass(frozen=True)
class WeirSplit(InputPartition):
    """One Spark input partition: offsets [start, end) of one partition log, with all a
    worker needs to open it (no channel.json read on the executors)."""

    channel: str
    partition: int
    start: int
    end: int
    directory: str
    log_config: LogConfig
    key_file: str | None
    active_key: str | None
    url: str | None = None  # read over HTTP from the appliance at this base URL
    token: str | None = None
    columns: str = "events"  # the option columns: a key of SCHEMAS


class WeirSource(DataSource):
    """Spark data source "weir": fixed offset ranges of a channel's partitions."""

    @classmethod
    def name(cls) -> str:
        """The short name for spark.read.format()."""
        return "weir"

    def schema(self) -> StructType:
        """The schema of the option columns; checks the options first, so bad ones fail at
        load()."""
        plan(self.options)
        return SCHEMAS[_columns(self.options)]

    def reader(self, schema: StructType) -> WeirReader:
        """A reader over the splits of the requested ranges, in the schema given (the
        option columns' own: ConfigError otherwise)."""
        splits = plan(self.options)
        name = _columns(self.options)
        if schema != SCHEMAS[name]:
            raise ConfigError("schema", f"a schema given must be the one of option columns="
                              f"{name} ({SCHEMAS[name].simpleString()}), not "
                              f"{schema.simpleString()}")
        return WeirReader(splits)


class WeirReader(DataSourceReader):
    """Reads planned splits; see the module doc for the guarantees."""

    def __init__(self, splits: list[WeirSplit]) -> None:
        self.splits = splits

    def partitions(self) -> Sequence[InputPartition]:
        """The splits, planned once per query: a retried task gets the same split."""
        return list(self.splits)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Yield the split's events as pyarrow RecordBatches (runs on an executor)."""
        if not isinstance(partition, WeirSplit):
            raise TypeError(f"not a split of this reader: {partition!r}")
        return read_split(partition)


def register(spark: Any) -> None:
    """Register WeirSource with a SparkSession as format "weir"."""
    spark.dataSource.register(WeirSource)


def plan(options: Mapping[str, str]) -> list[WeirSplit]:
    """Check the options and cut the requested ranges into splits; ConfigError naming the
    option otherwise."""
    home = options.get("home")
    if not home:
        raise ConfigError("option home", "is required: the channel's home (holding channel.json)")
    config = ChannelConfig.load(home)
    ranges = _ranges(options.get("ranges"), config)
    max_rows = _positive_int(options.get("max_rows_per_split"), "max_rows_per_split",
                             DEFAULT_MAX_ROWS_PER_SPLIT)
    log_config = config.log_config()
    url, token = options.get("url"), options.get("token")
    if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise ConfigError("option url", f"must be the appliance's http(s):// URL, not {url!r}")
    if url is not None and not token:
        raise ConfigError("option token", "is required with url: a token that may consume")
    columns = _columns(options)
    splits = []
    align = _positive_int(options.get("split_align"), "split_align", 0) \
        if options.get("split_align") is not None else None
    for partition, start, end in ranges:
        if align is not None:  # cut at multiples of align
            bounds = [start, *range(start - start % align + align, end, align), end]
        else:
            # Equal pieces (no tiny tail); an empty range keeps one split, which still
            # checks that the log holds its start.
            pieces = max(1, -(-(end - start) // max_rows))
            bounds = [start + (end - start) * i // pieces for i in range(pieces + 1)]
        splits += [WeirSplit(config.name, partition, lo, hi, str(config.partition_dir(partition)),
                             log_config, config.encryption_key_file, config.encryption_active_key,
                             url.rstrip("/") if url else None, token, columns)
                   for lo, hi in zip(bounds, bounds[1:], strict=False)]
    return splits


def _ranges(text: str | None, config: ChannelConfig) -> list[tuple[int, int, int]]:
    """(partition, start, end) of the ranges option, by partition and start."""
    shape = 'JSON {"<partition>": [start, end] or [[start, end], ...], ...}'
    if text is None:
        raise ConfigError("option ranges", f"is required: {shape}, end exclusive")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError("option ranges", f"not valid JSON ({exc})") from None
    if not isinstance(document, dict) or not document:
        raise ConfigError("option ranges", f"must be a non-empty {shape}, not {text!r}")
    ranges = []
    for name, value in document.items():
        if not _PARTITION.fullmatch(name) or int(name) >= config.partitions:
            raise ConfigError("option ranges", f"partition {name!r} does not exist: channel "
                              f"{config.name!r} has partitions 0..{config.partitions - 1}")
        several = isinstance(value, list) and bool(value) and isinstance(value[0], list)
        previous_end = -1
        for bounds in value if several else [value]:
            if not (isinstance(bounds, list) and len(bounds) == 2
                    and all(type(b) is int for b in bounds) and 0 <= bounds[0] <= bounds[1]):
                raise ConfigError("option ranges", f"partition {name}: {bounds!r} is not "
                                  "[start, end] with 0 <= start <= end")
            if bounds[0] < previous_end:
                raise ConfigError("option ranges", f"partition {name}: {bounds!r} overlaps "
                                  "or precedes the range before it")
            previous_end = bounds[1]
            ranges.append((int(name), bounds[0], bounds[1]))
    return sorted(ranges)


def _columns(options: Mapping[str, str]) -> str:
    """The option columns: a key of SCHEMAS (default "events"; any case)."""
    name = options.get("columns", "events").lower()
    if name not in SCHEMAS:
        raise ConfigError("option columns", f"must be one of {', '.join(SCHEMAS)}, "
                          f"not {name!r}")
    return name


def _positive_int(text: str | None, option: str, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option {option}", f"must be a positive integer, not {text!r}")
    return value


def read_split(split: WeirSplit) -> Iterator[Any]:
    """Yield the events [start, end) of a split as RecordBatches; RangeUnavailableError
    unless the log holds all of them."""
    # Imported here: this runs in Spark's Python workers (the tutorial's rule).
    from pyspark.sql.pandas.types import to_arrow_schema

    from channel_engine.spark.arrow_decode import EventColumns

    # Spark compares the first batch's schema with its own rendering of the schema.
    columns = EventColumns(split.channel, split.partition,
                           to_arrow_schema(SCHEMAS[split.columns], timezone="UTC"),
                           readable=split.columns == "readable")
    expected = split.start  # the next offset due
    chunks = _remote_chunks(split) if split.url is not None else _local_chunks(split)
    for batch, damaged in chunks:
        # The first and last record batches may hold offsets outside the split.
        try:
            expected += columns.add(batch, expected, split.end)
        except InvalidBatch as exc:
            raise damaged(exc) from exc
        except OffsetGap as gap:
            raise _gap(split, expected, gap) from None
        yield from columns.ready()
        if len(columns) >= ARROW_BATCH_ROWS:
            yield columns.to_batch()
    if expected != split.end:
        raise _unavailable(split, f"{_batches_url(split)} served offsets up to {expected} only"
                           if split.url else f"the log has no contiguous events at {expected}")
    if len(columns):
        yield columns.to_batch()


def _gap(split: WeirSplit, expected: int, gap: OffsetGap) -> RangeUnavailableError:
    """The error for records that do not continue the split at `expected`."""
    if not split.url:
        return _unavailable(split, f"the log has no contiguous events at {expected}")
    return _unavailable(split, f"{_batches_url(split)}: offset {gap.got} where {gap.due} "
                        "was due")


def _local_chunks(split: WeirSplit) -> Iterator[Chunk]:
    """The log's batches that hold the split's offsets, one by one, decrypted, each with
    the CorruptRecordError naming the segment for records that do not decode."""
    from channel_engine import PartitionLog
    from channel_engine.encryption import BatchSealer, KeyRing
    from channel_engine.log import record_batch

    sealer = None
    if split.key_file is not None:  # the sealer the owner builds (queue/channel_owner.py)
        keys = KeyRing.load(split.key_file, str(split.active_key))
        sealer = BatchSealer(keys, split.channel, split.partition)
    with PartitionLog.open(split.directory, split.log_config, partition=split.partition,
                           read_only=True, sealer=sealer) as log:
        _check_damage(split, log.take_new_losses())  # damage the open found
        first, last = log.log_start_offset, log.high_watermark
        if split.start < first or split.end > last:
            raise _unavailable(split, f"the log holds [{first}, {last})")
        for segment, header, data in log.read_batches(split.start, split.end, 1 << 62):
            _check_damage(split, log.take_new_losses())  # damage the read skipped
            damaged = partial(_segment_damage, segment, header.base_offset)
            try:
                plain = record_batch.unseal(data, sealer)
            except InvalidBatch as exc:
                raise damaged(exc) from exc
            yield plain, damaged
        _check_damage(split, log.take_new_losses())  # after the last intact batch


def _segment_damage(segment: Any, base_offset: int, exc: InvalidBatch) -> Exception:
    """The CorruptRecordError for the batch at base_offset in a segment, naming its byte."""
    from channel_engine import CorruptRecordError

    position = segment.find_position(base_offset, segment.size) or 0
    return CorruptRecordError(segment.log_path, position, exc.reason)


def _served_damage(split: WeirSplit, url: str, position: int, exc: InvalidBatch) -> Exception:
    """The error for a bad batch at byte `position` of the batches endpoint's answer."""
    return _unavailable(split, f"{url}: bad batch at byte {position}: {exc}")


def _check_damage(split: WeirSplit, losses: list[LostRange]) -> None:
    """DamagedRangeError for the first lost range that overlaps the split."""
    for lost in sorted(losses, key=lambda r: r.start):
        if lost.start < split.end and split.start < lost.end:
            raise DamagedRangeError(split.channel, split.partition, split.start, split.end,
                                    lost)


def _remote_chunks(split: WeirSplit) -> Iterator[Chunk]:
    """The appliance's batches endpoint's batches, one by one, each with the error for
    records that do not decode: it answers whole batches of one segment at a time (the
    first may start before the offset asked for, the last end after the split), so ask
    again from the offset its X-Weir-Range ends at until the split is covered. The same
    batches as _local_chunks gives; each batch's CRC is checked here (the appliance sends
    them as stored)."""
    from channel_engine.log import record_batch

    next_offset = split.start
    while next_offset < split.end:
        url = _batches_url(split, next_offset)
        data, served = _get_batches(split, url, next_offset)
        position = 0
        while position < len(data):
            damaged = partial(_served_damage, split, url, position)
            try:
                header = record_batch.check_batch(data, position, len(data), None, True)
            except InvalidBatch as exc:
                raise damaged(exc) from exc
            yield data[position:position + header.size], damaged
            position += header.size
        next_offset = served


def _get_batches(split: WeirSplit, url: str, start: int) -> tuple[bytes, int]:
    """(body, N) of one answer of the batches endpoint for offsets from `start`: it covers
    [start, N) (its X-Weir-Range header), N > start."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {split.token}"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            data = response.read()
            covered = response.headers.get("X-Weir-Range", "")
    except urllib.error.HTTPError as exc:
        raise _unavailable(split, f"{url} answered {exc.code}: {exc.read()[:300]!r}") from exc
    found = re.fullmatch(r"([0-9]+)-([0-9]+)", covered)
    if found is None or int(found[1]) != start or int(found[2]) <= start:
        raise _unavailable(split, f"{url} answered X-Weir-Range {covered!r}, not {start}-N "
                           f"with N > {start}")
    return data, int(found[2])


def _batches_url(split: WeirSplit, start: int | None = None) -> str:
    return (f"{split.url}/api/v1/channels/{split.channel}/partitions/{split.partition}"
            f"/batches?start={split.start if start is None else start}&end={split.end}")


def _unavailable(split: WeirSplit, reason: str) -> RangeUnavailableError:
    return RangeUnavailableError(split.channel, split.partition, split.start, split.end, reason)

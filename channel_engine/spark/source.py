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
                                  read per partition, end exclusive
    max_rows_per_split  no        a range longer than this (default 200000) is cut into
                                  equal splits, each read by its own Spark task
    split_align         no        cut splits at offsets that are multiples of this
                                  instead (each split at most this long): the exporter
                                  makes one split per output file this way
    url                 no        read over the appliance's HTTP API at this base URL
                                  (GET …/partitions/{p}/batches) instead of from files:
                                  for executors that do not share the appliance's disks
    token               with url  an API token with the consume role on the channel

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

Every split is a fixed [start, end), so a retried task reads exactly the same rows (never
"to the end of the log", which moves). A split opens its partition log read-only, which
takes no lock: the channel's owner may be appending in another process meanwhile. It
raises RangeUnavailableError, never returns fewer rows, when the log does not hold the
whole range: events below the log start offset were deleted, or end is past the log end.
Encrypted channels are decrypted with the key file channel.json names, as the owner does.
Events are read as stored: take the ranges from the channel (a take's reserve(), as the
exporter does), which never hands out the events of an aborted multi-partition put.

Spark pickles these classes by reference: its Python workers must be able to import
channel_engine (install it, or put the repository on PYTHONPATH) and need pyarrow. They
open the partition directories and the key file by path, so they must run on the host
that holds them (local mode, or executors on the appliance's machine).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
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

from channel_engine.channel_config import ChannelConfig
from channel_engine.config import LogConfig
from channel_engine.errors import ChannelEngineError, ConfigError
from channel_engine.event import Event

SCHEMA = StructType([
    StructField("channel", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", LongType()),
    StructField("key", BinaryType()),
    StructField("headers", MapType(StringType(), BinaryType())),
    StructField("body", BinaryType()),
])
DEFAULT_MAX_ROWS_PER_SPLIT = 200_000
ARROW_BATCH_ROWS = 10_000  # rows per RecordBatch handed to Spark
# Bytes of record batches per log read. read() stops between whole batches when it is
# bounded by bytes only, so no batch is decoded twice (a row limit would cut one).
READ_BYTES = 4 << 20
_PARTITION = re.compile(r"0|[1-9][0-9]{0,4}")


class RangeUnavailableError(ChannelEngineError, LookupError):
    """The partition log cannot supply a whole requested range."""

    def __init__(self, channel: str, partition: int, start: int, end: int, reason: str) -> None:
        super().__init__(f"channel {channel!r} partition {partition}: cannot read offsets "
                         f"[{start}, {end}): {reason}")
        self.partition = partition
        self.start = start
        self.end = end


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


class WeirSource(DataSource):
    """Spark data source "weir": fixed offset ranges of a channel's partitions."""

    @classmethod
    def name(cls) -> str:
        """The short name for spark.read.format()."""
        return "weir"

    def schema(self) -> StructType:
        """The fixed schema; checks the options first, so bad ones fail at load()."""
        plan(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> WeirReader:
        """A reader over the splits of the requested ranges."""
        return WeirReader(plan(self.options))


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
    splits = []
    align = _positive_int(options.get("split_align"), "split_align", 0) \
        if options.get("split_align") is not None else None
    for partition, (start, end) in sorted(ranges.items()):
        if align is not None:  # cut at multiples of align
            bounds = [start, *range(start - start % align + align, end, align), end]
        else:
            # Equal pieces (no tiny tail); an empty range keeps one split, which still
            # checks that the log holds its start.
            pieces = max(1, -(-(end - start) // max_rows))
            bounds = [start + (end - start) * i // pieces for i in range(pieces + 1)]
        splits += [WeirSplit(config.name, partition, lo, hi, str(config.partition_dir(partition)),
                             log_config, config.encryption_key_file, config.encryption_active_key,
                             url.rstrip("/") if url else None, token)
                   for lo, hi in zip(bounds, bounds[1:], strict=False)]
    return splits


def _ranges(text: str | None, config: ChannelConfig) -> dict[int, tuple[int, int]]:
    shape = 'JSON {"<partition>": [start, end], ...}'
    if text is None:
        raise ConfigError("option ranges", f"is required: {shape}, end exclusive")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError("option ranges", f"not valid JSON ({exc})") from None
    if not isinstance(document, dict) or not document:
        raise ConfigError("option ranges", f"must be a non-empty {shape}, not {text!r}")
    ranges = {}
    for name, bounds in document.items():
        if not _PARTITION.fullmatch(name) or int(name) >= config.partitions:
            raise ConfigError("option ranges", f"partition {name!r} does not exist: channel "
                              f"{config.name!r} has partitions 0..{config.partitions - 1}")
        if not (isinstance(bounds, list) and len(bounds) == 2
                and all(type(b) is int for b in bounds) and 0 <= bounds[0] <= bounds[1]):
            raise ConfigError("option ranges", f"partition {name}: {bounds!r} is not "
                              "[start, end] with 0 <= start <= end")
        ranges[int(name)] = (bounds[0], bounds[1])
    return ranges


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

    from channel_engine.encryption import BatchSealer, KeyRing
    from channel_engine.log import PartitionLog

    # Spark compares the first batch's schema with its own rendering of SCHEMA.
    arrow_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    if split.url is not None:
        events = list(_read_remote(split))
        for i in range(0, len(events), ARROW_BATCH_ROWS):
            yield _record_batch(split, events[i:i + ARROW_BATCH_ROWS], arrow_schema)
        return
    sealer = None
    if split.key_file is not None:  # the sealer the owner builds (channel_owner.py)
        keys = KeyRing.load(split.key_file, str(split.active_key))
        sealer = BatchSealer(keys, split.channel, split.partition)
    with PartitionLog.open(split.directory, split.log_config, partition=split.partition,
                           read_only=True, sealer=sealer) as log:
        first, last = log.log_start_offset, log.high_watermark
        if split.start < first or split.end > last:
            raise _unavailable(split, f"the log holds [{first}, {last})")
        offset = split.start
        while offset < split.end:
            events = log.read(offset, max_bytes=READ_BYTES, end_offset=split.end)
            if not events or events[0].offset != offset \
                    or events[-1].offset != offset + len(events) - 1:
                raise _unavailable(split, f"the log has no contiguous events at {offset}")
            for i in range(0, len(events), ARROW_BATCH_ROWS):
                yield _record_batch(split, events[i:i + ARROW_BATCH_ROWS], arrow_schema)
            offset += len(events)


def _read_remote(split: WeirSplit) -> Iterator[Event]:
    """The split's events from the appliance's batches endpoint (plain batches back to
    back; the first may start before the split, the last end after it)."""
    import urllib.error
    import urllib.request

    from channel_engine import record_batch

    url = (f"{split.url}/api/v1/channels/{split.channel}/partitions/{split.partition}"
           f"/batches?start={split.start}&end={split.end}")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {split.token}"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        raise _unavailable(split, f"{url} answered {exc.code}: {exc.read()[:300]!r}") from exc
    expected, position = split.start, 0
    while position < len(data) and expected < split.end:
        try:
            header = record_batch.check_batch(data, position, len(data), None, True)
        except record_batch.InvalidBatch as exc:
            raise _unavailable(split, f"{url}: bad batch at byte {position}: {exc}") from exc
        batch = data[position:position + header.size]
        for offset, timestamp, key, value, headers in record_batch.records(batch):
            if expected <= offset < split.end:
                if offset != expected:
                    raise _unavailable(split, f"{url}: offset {offset} where {expected} was due")
                yield Event(split.partition, offset, timestamp, key,
                            {name: v or b"" for name, v in headers}, value or b"")
                expected += 1
        position += header.size
    if expected != split.end:
        raise _unavailable(split, f"{url} served offsets up to {expected} only")


def _unavailable(split: WeirSplit, reason: str) -> RangeUnavailableError:
    return RangeUnavailableError(split.channel, split.partition, split.start, split.end, reason)


def _record_batch(split: WeirSplit, events: list[Event], arrow_schema: Any) -> Any:
    """Events as one RecordBatch of exactly arrow_schema (column by column: far faster
    than handing Spark tuples)."""
    import pyarrow as pa

    _, offsets, timestamps, keys, headers, bodies = zip(*events, strict=True)
    count = len(events)
    if any(headers):
        names = [name for h in headers for name in h]
        values = [value for h in headers for value in h.values()]
        ends = pa.array(list(accumulate(map(len, headers), initial=0)), pa.int32())
    else:  # the common case: every map empty, nothing to flatten
        names, values = [], []
        ends = pa.repeat(pa.scalar(0, pa.int32()), count + 1)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(split.channel, pa.string()), count),
        pa.repeat(pa.scalar(split.partition, pa.int32()), count),
        pa.array(offsets, pa.int64()),
        pa.array(timestamps, pa.int64()),
        pa.array(keys, pa.binary()),
        pa.MapArray.from_arrays(ends, pa.array(names, pa.string()),
                                pa.array(values, pa.binary())),
        pa.array(bodies, pa.binary()),
    ], schema=arrow_schema)

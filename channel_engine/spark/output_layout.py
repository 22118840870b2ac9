"""The export's output layout: where each event of a run goes, and the names of the files.

Under <output>/<channel>/ (kafka-connect-hdfs style names; offsets zero-padded to 20
digits, both ends inclusive):

    path                                             what
    -----------------------------------------------  --------------------------------------
    <time path>/<channel>+<p>+<first>+<last>.<ext>   committed data: events of
                                                     partition p whose event time falls
                                                     in <time path> (Flume's escapes),
                                                     first and last the lowest and
                                                     highest offset the file holds
    _weir/commits/<run id>.json                      commit record of one run: the ranges
                                                     it exported and its temp -> final moves
    _weir/commits/<run id>.summary.json              the ranges of the records it replaced
                                                     (compaction; no moves)
    _weir/tmp/<run id>/                              Spark's output before it is moved

Readers (Spark, Hive, pyarrow) skip `_`-prefixed paths, so they see committed files only.
The records' format is commit_records.py's; the files' formats are file_formats.py's.

Files. The reserved ranges of a partition are joined where they touch (a rolled-back
take's events come back beside the newer ones) and cut into pieces at multiples of the
piece size (roll_rows, fewer when roll_bytes comes first; at most PIECE_ROWS so that big
ranges are written by several tasks at once). A piece is one Spark task and one file per
time bucket. A file is named by the first and last offset it holds (as Kafka Connect's
HDFS connector names its files): a piece whose events fall in two hours makes two files,
each named by its own offsets, e.g. for offsets 0-99 whose times alternate between
hours 14 and 15:

    2026/11/27/14/orders+0+00000000000000000000+00000000000000000098.parquet  0, 2, … 98
    2026/11/27/15/orders+0+00000000000000000001+00000000000000000099.parquet  1, 3, … 99

Every offset is in one file only and each file holds the first offset of its name, so no
two files of a channel share a name, in any folder. A name the output holds already (a
file of a deleted namesake of the channel: channel_id.py) gets "+<first 8 of the
channel's export id>" before the extension; one that exists even so stops the run before
anything moves. Recovery never reads a name: the commit records list every move
(commit_records.py).

Spark writes a run's files to _weir/tmp/<run id>/_p=<p>/_chunk=<first>/_bucket=<time
path>/part-…: Pieces.placed adds those columns, file_formats.writer partitions by them,
held_offsets reads back the offsets each file holds (the offset column alone: one more
Spark job, cheap on Parquet's columns, a parse of the file on JSON and Avro), and
OutputLayout.data_files gives each file its final name.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from channel_engine.errors import ExportError
from channel_engine.offset_ranges import Range

if TYPE_CHECKING:
    from channel_engine.spark.dfs import Dfs
    from channel_engine.spark.export_settings import ExportSettings

ESCAPES = {"Y": "yyyy", "m": "MM", "d": "dd", "H": "HH", "M": "mm", "S": "ss",
           "y": "yy", "j": "DDD"}
# At most this many events per Spark task (and per file): enough tasks to use every core
PIECE_ROWS = 200_000
# A data file Spark wrote under the temp dir: its partition, piece and time bucket
_TEMP_FILE = re.compile(r"/_p=(\d+)/_chunk=(\d+)/_bucket=([^/]+)/(part-[^/]+)$")


def spark_pattern(path: str) -> str:
    """Flume's time escapes (%Y/%m/%d/%H...) as a Spark date_format pattern."""
    out, literal = [], []
    for match in re.finditer(r"%(.)|([^%]+)", path):
        if match.group(2) is not None:
            literal.append(match.group(2))
            continue
        code = match.group(1)
        if code not in ESCAPES:
            raise ValueError(f"path: unknown escape %{code} (known: "
                             f"{' '.join('%' + c for c in ESCAPES)})")
        if literal:
            out.append("'" + "".join(literal).replace("'", "''") + "'")
            literal = []
        out.append(ESCAPES[code])
    if literal:
        out.append("'" + "".join(literal).replace("'", "''") + "'")
    return "".join(out)


def piece_rows(settings: ExportSettings, status: dict[str, Any]) -> int:
    """Events per piece (one Spark task, one file per time bucket): roll_rows, fewer
    when roll_bytes is reached first at the largest partition's log bytes per event
    (rounded up), and at most PIECE_ROWS so that a large range is written by several
    tasks at once. `status` is the channel's (Channel.status())."""
    per_event = max((-(-p["size_bytes"] // events) for p in status["partitions"]
                     if (events := p["log_end_offset"] - p["log_start_offset"]) > 0),
                    default=1)
    return max(1, min(settings.roll_rows, PIECE_ROWS, settings.roll_bytes // per_event))


@dataclass(frozen=True)
class Pieces:
    """The (partition, range) pairs a run writes, cut into pieces at multiples of `rows`.
    A piece is the part of a range between two multiples, so pieces of different ranges
    never share a first offset (their _chunk), and each is one Spark task."""

    rows: int
    ranges: list[tuple[int, Range]]

    def placed(self, frame: Any, path: str) -> Any:
        """`frame` (the events of self.ranges) with the columns that place them in files:
        _p (the partition), _chunk (the first offset of the event's piece) and _bucket
        (the time path `path`, Flume's escapes, in the session's time zone: UTC)."""
        from pyspark.sql import functions as F

        offset = F.col("offset")
        aligned = offset - offset % F.lit(self.rows)
        chunk: Any = None  # one flat CASE: a branch per range whose first piece is short
        for p, (start, end) in self.ranges:
            if start % self.rows:  # a range's first piece starts at the range, not a multiple
                head = (F.col("partition") == p) & (offset >= start) \
                    & (offset < min(end, start - start % self.rows + self.rows))
                chunk = F.when(head, F.lit(start)) if chunk is None \
                    else chunk.when(head, F.lit(start))
        chunk = aligned if chunk is None else chunk.otherwise(aligned)
        return (frame.withColumn("_p", F.col("partition"))
                .withColumn("_chunk", chunk)
                .withColumn("_bucket", F.date_format(F.timestamp_millis(F.col("timestamp")),
                                                     spark_pattern(path))))

    def bounds(self, partition: int, chunk: int) -> tuple[int, int]:
        """First and last offset of the piece that starts at `chunk` (see placed)."""
        for p, (start, end) in self.ranges:
            if p == partition and start <= chunk < end:
                return chunk, min(end, chunk - chunk % self.rows + self.rows) - 1
        raise ExportError(f"partition {partition}: chunk {chunk} lies in no range written")


# The first and last offset, and the number of events, of a file Spark wrote
Held = tuple[int, int, int]


def held_offsets(spark: Any, temp: str, file_format: str) -> dict[tuple[int, int, str], Held]:
    """What each file Spark wrote under `temp` holds, by its (partition, piece, bucket):
    its first and last offset and its number of events, read back from the files."""
    from pyspark.sql import functions as F

    from channel_engine.spark.file_formats import FORMATS

    # The partition columns typed here: inferred, a bucket like "2026" would be an int
    frame = (spark.read.format(FORMATS[file_format])
             .schema("offset LONG, _p INT, _chunk LONG, _bucket STRING").load(temp))
    found = frame.groupBy("_p", "_chunk", "_bucket").agg(
        F.min("offset"), F.max("offset"), F.count("offset")).collect()
    return {(int(p), int(chunk), str(bucket)): (int(first), int(last), int(count))
            for p, chunk, bucket, first, last, count in found}


@dataclass(frozen=True)
class DataFile:
    """A file Spark wrote for a run (`temp`) and the committed name it moves to."""

    temp: str
    final: str
    partition: int
    size: int


class OutputLayout:
    """The paths of one channel's output (the table above) on one Hadoop filesystem."""

    def __init__(self, dfs: Dfs, channel: str) -> None:
        self.dfs = dfs
        self.channel = channel
        self.root = dfs.join(channel)
        self.commits = dfs.join(channel, "_weir", "commits")
        self.temp_root = dfs.join(channel, "_weir", "tmp")

    def temp(self, run_id: str) -> str:
        """The temp dir Spark writes run `run_id`'s files to."""
        return self.dfs.join(self.channel, "_weir", "tmp", run_id)

    def data_files(self, temp: str, pieces: Pieces, file_format: str, channel_id: str,
                   held: dict[tuple[int, int, str], Held]) -> Iterator[DataFile]:
        """Final names for Spark's files in `temp`, one by one: one file per (partition,
        piece, bucket), named by the offsets it holds (`held`: held_offsets). An
        unexpected file or name is an ExportError (nothing moved yet)."""
        seen: set[tuple[int, int, str]] = set()
        for uri, size in self.dfs.list_files(temp):
            name = uri.rsplit("/", 1)[-1]
            if name.startswith((".", "_")):
                continue  # _SUCCESS, .crc sidecars
            match = _TEMP_FILE.search(uri)
            if match is None:
                raise ExportError(f"unexpected file in the export's temp dir: {uri}")
            partition, chunk = int(match.group(1)), int(match.group(2))
            bucket = unquote(match.group(3))
            key = (partition, chunk, bucket)
            if key in seen:
                raise ExportError(f"Spark wrote two files for {key}: cannot name both")
            seen.add(key)
            low, high = pieces.bounds(partition, chunk)
            first, last, _ = held.get(key, (-1, -1, 0))
            if not low <= first <= last <= high:
                raise ExportError(f"{uri} holds offsets {first} to {last}, not in its "
                                  f"piece [{low}, {high}] of partition {partition}")
            yield DataFile(uri, self._final(partition, first, last, bucket, file_format,
                                            channel_id), partition, size)

    def _final(self, partition: int, first: int, last: int, bucket: str,
               file_format: str, channel_id: str) -> str:
        """The committed name of a piece's file; never one the output holds already."""
        name = f"{self.channel}+{partition}+{first:020d}+{last:020d}"
        final = self.dfs.join(self.channel, bucket, f"{name}.{file_format}")
        if self.dfs.exists(final):  # a deleted namesake's file: never overwrite it
            final = self.dfs.join(self.channel, bucket, f"{name}+{channel_id[:8]}.{file_format}")
            if self.dfs.exists(final):
                raise ExportError(f"{final} exists already: the output holds this range")
        return final

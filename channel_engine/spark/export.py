"""The export job: drain a channel into a Hadoop filesystem, exactly once.

    spark-submit channel_engine/spark/export.py --home /data/orders/checkpoint \\
        --output hdfs://namenode:8020/weir [--format parquet|json|avro] \\
        [--path %Y/%m/%d/%H] [--roll-rows 1000000] [--roll-bytes 268435456] \\
        [--max-events 10000000] [--master local[*]|spark://…|yarn] [--read-url URL]
    (or: python -m channel_engine.spark.export …; manage.py export_channel NAME)

It prints progress lines ("export orders: ~120,000 of 300,000 rows (40%)"), then one JSON
report line on stdout: `{"report": …}`, or `{"report": null, "error": …, "run": …}`
when it failed (exit status 1; "run" holds what the failed run had reserved).

Cluster settings: the master comes from --master (WEIR_SPARK_MASTER); Hadoop's from
HADOOP_CONF_DIR (core-site.xml, hdfs-site.xml), which spark-submit puts on the JVM's
classpath, so an --output without a scheme resolves against its fs.defaultFS. The job
ships channel_engine to the executors itself (package_zip); they need its dependencies.

Formats: all three are Spark's own writers (writer()). Avro is the class the `avro` short
name resolves to for writes, org.apache.spark.sql.avro.AvroFileFormat, named in full: Spark
4 ships it inside spark-sql, so neither this job nor a spark-submit of it needs the
spark-avro jar (`--packages org.apache.spark:spark-avro_2.13:<Spark version>` only adds
the short name and from_avro/to_avro, for other jobs). Avro files carry AVRO_SCHEMA
(record weir.Event: timestamp a timestamp-millis long, key a union with null, headers a
map of bytes), deflate-compressed, as Weir's earlier fastavro writer wrote them.

Output layout under <output>/<channel>/ (kafka-connect-hdfs style names; offsets
zero-padded to 20 digits, both ends inclusive):

    path                                             what
    -----------------------------------------------  --------------------------------------
    <time path>/<channel>+<p>+<first>+<last>.<ext>   committed data: the events of
                                                     partition p with offsets in
                                                     [first, last] whose event time falls
                                                     in <time path> (Flume's escapes)
    _weir/commits/<run id>.json                      commit record of one run: the ranges
                                                     it exported and its temp -> final moves
    _weir/commits/<run id>.summary.json              the ranges of the records it replaced
                                                     (compaction; no moves)
    _weir/tmp/<run id>/                              Spark's output before it is moved

Readers (Spark, Hive, pyarrow) skip `_`-prefixed paths, so they see committed files only.

A record is JSON: {"run_id", "channel_id", "moves": [[temp, final], ...], "ranges":
{"<partition>": [[start, end], ...]}} (end exclusive). channel_id is the channel's export
id, kept in its home as `export.id` (JSON {"format": "weir-export-id", "version": 1,
"id": <uuid hex>}, made by the first export): a channel deleted and created again under
its name starts at offset 0 with a new id, so the ranges of its namesake's records are
not skipped, and a file name its namesake holds gets "+<first 8 of the id>" before the
extension. A record without a channel_id (older runs) counts for the channel.

Files. The reserved ranges of a partition are joined where they touch (a rolled-back
take's events come back beside the newer ones) and cut into pieces at multiples of the
piece size (roll_rows, fewer when roll_bytes comes first; at most PIECE_ROWS so that big
ranges are written by several tasks at once). A piece is one Spark task and one file per
time bucket; its file is named by the piece's first and last offset, so no two files
share a name, and a name that exists already stops the run before anything moves.

The protocol (each step survives a crash at any point; the output is the source of truth):

    step  what                                           after a crash here, the next run
    ----  ---------------------------------------------  --------------------------------------
    1     recover: redo the moves of every commit        finishes the moves; the range counts
          record, delete every temp dir and cut-short    as exported
          record; fold > COMPACT_AFTER records into one
    2     take: reserve the next ranges of each          the take rolled back (its process
          partition (a take transaction, no lease)       died): the same ranges come again
    3     skip what a commit record already holds        -
    4     write the rest with Spark to _weir/tmp/<run>   temp files deleted by step 1
    5     sync the temp files; write the commit record   step 1 applies it
          (temp name, sync, rename, sync the dir)
    6     move each temp file to its final name; sync    step 1 finishes the moves
          the directories
    7     commit the take                                the take returns; step 3 skips it
    8     delete the temp dir                            step 1 deletes it

A committed file that is gone when step 1 redoes its record (an operator pruned old
output) is reported ("missing_files" in the report), not recreated, and stops nothing.
Durability (dfs.py): a power loss after step 7 must find every file the take's events
went to. On file://, Spark's writers and a rename reach no disk by themselves, so the
job fsyncs the temp files, the record and the directories (steps 5, 6). On HDFS the
commit record is written through one FSDataOutputStream and hsync()ed before close:
when step 5 returns, every DataNode of its pipeline has fsynced it (hflush would only
make it visible to readers, close only completes the block); a rename is a NameNode
transaction, in its synced edit log before it returns. The data files a record names
are only closed (Spark's writers close them, and HDFS cannot hsync a closed file): each
is whole on every DataNode of its pipeline, but in their page cache until written back,
so a power loss of all the DataNodes of one of its blocks at once may lose it. Run the
DataNodes with dfs.datanode.synconclose=true (they fsync each block as it closes) where
that must hold as on file://; replication across racks covers the rest. Avro files,
which the driver writes itself, are hsynced like the record.

A killed run leaves files open on HDFS under its dead client's lease (a temp file Spark
was writing, a record cut short) until the NameNode recovers it (the 1 h hard limit).
No run waits for that, and none needs DistributedFileSystem.recoverLease: every path a
run writes is its own (_weir/tmp/<run id>/, _weir/commits/.<run id>.json.tmp), the next
run only deletes another run's leftovers (a delete needs no lease), and the only files
it renames were closed before (the temp files a record names; a record after its close).

So every event reaches the output exactly once: written files count only once a commit
record names them, and a range a record names is never written again. Two exports of one
channel must not run at once: the job holds `export.lock` (flock) in the channel's home
from before Spark starts until it exits (export_lock.py), and refuses to start while
another process holds it: exit status 75 and the report line
`{"report": null, "error": "an export of channel 'orders' is already running …"}`, nothing
written. The kernel releases the lock of a killed job, so none is ever stale. (The
appliance also holds `export-run.lock` around its ExportRun row: appliance/exports.py.)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from channel_engine.errors import ExportError

# The Spark data source of each format. Avro is Spark's own writer, by its class name:
# since Spark 4.0 it lives in spark-sql (pyspark's jars), and the short name "avro" only
# resolves to it when the spark-avro jar (its data source registration) is on the
# classpath too. Spark writes with the "avro" short name through this same class.
FORMATS = {"parquet": "parquet", "json": "json",
           "avro": "org.apache.spark.sql.avro.AvroFileFormat"}
# Avro files carry this schema (the writer's avroSchema option; without it Spark would
# name the record "topLevelRecord", make every field a union with null and drop the
# timestamp's logical type) and deflate, the codec every Avro reader must support.
AVRO_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": "channel", "type": "string"}, {"name": "partition", "type": "int"},
               {"name": "offset", "type": "long"},
               {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "key", "type": ["null", "bytes"]},
               {"name": "headers", "type": {"type": "map", "values": "bytes"}},
               {"name": "body", "type": "bytes"}]}
WRITER_OPTIONS: dict[str, dict[str, str]] = {
    "avro": {"avroSchema": json.dumps(AVRO_SCHEMA), "compression": "deflate"}}
ESCAPES = {"Y": "yyyy", "m": "MM", "d": "dd", "H": "HH", "M": "mm", "S": "ss",
           "y": "yy", "j": "DDD"}
Range = tuple[int, int]  # [start, end): end exclusive
# At most this many events per Spark task (and per file): enough tasks to use every core
PIECE_ROWS = 200_000
# recover() folds the commit records into one summary once there are more than this many
COMPACT_AFTER = 32
EXPORT_ID_FILE = "export.id"  # in the channel's home: see channel_id()
EXPORT_ID_FORMAT = "weir-export-id"


@dataclass
class ExportSettings:
    """What one export run does (from the CLI, or from the appliance's channel row)."""

    home: str
    output: str
    format: str = "parquet"
    path: str = "%Y/%m/%d/%H"
    roll_rows: int = 1_000_000  # the most events in one file
    max_events: int = 10_000_000
    read_url: str | None = None  # executors read over the appliance's HTTP API
    read_token: str | None = None
    roll_bytes: int = 256 << 20  # the most log bytes of events in one file (estimated)
    progress_s: float = 2.0  # a progress line this often while Spark writes

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if not 1 <= self.roll_rows <= 2**31 - 1:
            raise ValueError(f"roll_rows must be from 1 to 2**31-1, not {self.roll_rows}")
        if not 1 << 10 <= self.roll_bytes <= 1 << 40:
            raise ValueError(f"roll_bytes must be from 1 KiB to 1 TiB, not {self.roll_bytes}")
        if not 0.05 <= self.progress_s <= 3600:
            raise ValueError(f"progress_s must be from 0.05 to 3600, not {self.progress_s}")
        if not 1 <= self.max_events <= 2**40:
            raise ValueError(f"max_events must be positive, not {self.max_events}")
        spark_pattern(self.path)  # raises on an unknown escape


@dataclass
class PartitionReport:
    """What one run did for one channel partition."""

    partition: int
    ranges: list[Range] = field(default_factory=list)
    skipped: list[Range] = field(default_factory=list)  # already in the output
    files: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    # The partitions of a run are written by one Spark job and committed by one take, so
    # they share the run's outcome ("ok" or "failed"), error and duration.
    outcome: str = "running"
    error: str | None = None
    duration_s: float = 0.0


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


def crash_point(step: str) -> None:
    """Die here (SIGKILL) when WEIR_EXPORT_CRASH_AT names this step: the crash tests.
    Stop here once (SIGSTOP to the job's process group: Spark's JVM and workers too)
    when WEIR_EXPORT_STOP_AT names it: the HDFS fault tests start the job in a session
    of its own, break the cluster, then SIGCONT it."""
    if os.environ.get("WEIR_EXPORT_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("WEIR_EXPORT_STOP_AT") == step:
        del os.environ["WEIR_EXPORT_STOP_AT"]
        os.killpg(os.getpgrp(), signal.SIGSTOP)


def describe(exc: BaseException) -> str:
    """A failure in one line for the report: "Type: message"; a Java exception raised
    through py4j as its class and message and those of its causes (HDFS's own words:
    "Permission denied: user=…", "could only be written to 0 of the 1 minReplication
    nodes…"), without the Java stack trace py4j puts in its message."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return f"{type(exc).__name__}: {exc}"
    try:
        causes: list[str] = []
        while java is not None and len(causes) < 8:
            line = str(java.toString()).strip().splitlines()
            if line and line[0] not in causes:
                causes.append(line[0])
            java = java.getCause()
    except Exception:  # noqa: BLE001 -- the JVM is gone: the message is all there is
        return f"{type(exc).__name__}: {' '.join(str(exc).strip().splitlines()[:2])}"
    return f"{type(exc).__name__}: {'; caused by '.join(causes)}"


def merge(ranges: list[Range]) -> list[Range]:
    """The ranges sorted, with touching or overlapping ones joined."""
    merged: list[Range] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def subtract(wanted: Range, done: list[Range]) -> list[Range]:
    """The parts of `wanted` no range in `done` covers."""
    pieces = [wanted]
    for start, end in done:
        pieces = [piece for s, e in pieces
                  for piece in ((s, min(e, start)), (max(s, end), e)) if piece[0] < piece[1]]
    return pieces


def export_lock(home: str) -> Any:
    """Hold `export.lock` in the channel's home: one export of a channel at a time
    (export_lock.py; main() holds it already, so this is a no-op there)."""
    from channel_engine.spark.export_lock import hold

    return hold(home)


def channel_id(home: str | Path) -> str:
    """The channel's export id (EXPORT_ID_FILE in its home), made on first use: records
    of a channel once deleted and then created again under the same name carry another
    id, so its new offsets are not taken for the old channel's. Call under export_lock."""
    from channel_engine.atomic_file import write_atomically

    path = Path(home) / EXPORT_ID_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        document = {"format": EXPORT_ID_FORMAT, "version": 1, "id": uuid.uuid4().hex}
        write_atomically(path, json.dumps(document).encode())
    except ValueError as exc:
        raise ExportError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != EXPORT_ID_FORMAT \
            or document.get("version") != 1 or not isinstance(document.get("id"), str):
        raise ExportError(f"{path}: not a Weir export id (format {EXPORT_ID_FORMAT}, v1)")
    return str(document["id"])


def writer(frame: Any, file_format: str) -> Any:
    """The export's DataFrameWriter for `file_format`: a file per (_p, _chunk, _bucket)."""
    out = (frame.write.partitionBy("_p", "_chunk", "_bucket")
           # one file per piece and bucket, whatever spark-defaults.conf says
           .option("maxRecordsPerFile", 0).format(FORMATS[file_format]))
    return out.options(**WRITER_OPTIONS.get(file_format, {}))


class Exporter:
    """One run of the protocol above for one channel."""

    def __init__(self, spark: Any, settings: ExportSettings,
                 progress: Callable[[str], None] = print) -> None:
        from channel_engine import ChannelConfig
        from channel_engine.spark.dfs import Dfs

        self.spark = spark
        self.settings = settings
        self.progress = progress
        self.config = ChannelConfig.load(settings.home)
        self.dfs = Dfs(spark, settings.output)
        self.root = self.dfs.join(self.config.name)
        self.commits = self.dfs.join(self.config.name, "_weir", "commits")
        self.run_id = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
        self.reports: dict[int, PartitionReport] = {}
        self.missing: list[str] = []  # committed files gone from the output (pruned?)
        self.piece = min(settings.roll_rows, PIECE_ROWS)
        self.started = time.time()
        self.channel_id = ""  # set under the export lock (run)
        self.recorded = False  # this run's commit record is written

    # -- step 1 -----------------------------------------------------------------------------
    def recover(self) -> dict[int, list[Range]]:
        """Finish every recorded run's moves, drop temp dirs and half-written records,
        compact the records; return this channel's exported ranges by partition."""
        exported: dict[int, list[Range]] = {}
        records = []
        for uri, _ in self.dfs.list_files(self.commits):
            name = uri.rsplit("/", 1)[-1]
            if name.startswith("."):  # a record whose write was cut short: never a commit
                self.dfs.delete(uri)
                continue
            if not name.endswith(".json"):
                continue
            record = json.loads(self.dfs.read_bytes(uri))
            records.append(uri)
            for temp, final in record["moves"]:
                self._finish_move(temp, final)
            if record.get("channel_id", self.channel_id) != self.channel_id:
                continue  # a channel of this name that was deleted: its offsets are not ours
            for partition, ranges in record["ranges"].items():
                exported.setdefault(int(partition), []).extend(
                    (int(start), int(end)) for start, end in ranges)
        exported = {p: merge(ranges) for p, ranges in exported.items()}
        if self.missing:
            self.progress(f"export {self.config.name}: {len(self.missing)} committed files "
                          f"are gone from the output (pruned by hand?), e.g. {self.missing[0]}")
        if len(records) > COMPACT_AFTER:
            self._compact(records, exported)
        self.dfs.delete(self.dfs.join(self.config.name, "_weir", "tmp"), recursive=True)
        return exported

    def _finish_move(self, temp: str, final: str) -> None:
        """Redo a recorded move that a crash cut short."""
        if self.dfs.exists(final):
            return
        if not self.dfs.exists(temp):
            # The move happened (the record is written after every temp file) and the
            # file was removed since: not ours to recreate, but reported.
            self.missing.append(final)
            return
        self.dfs.rename(temp, final)
        self.dfs.sync_dirs_up_to([final], self.root)

    def _compact(self, records: list[str], exported: dict[int, list[Range]]) -> None:
        """Replace the records (their moves all done) by one summary of this channel's
        ranges (records of a deleted namesake go): the next run reads one file instead of
        one per run since the last compaction."""
        summary = {"run_id": self.run_id, "channel_id": self.channel_id, "moves": [],
                   "ranges": {str(p): [list(r) for r in ranges]
                              for p, ranges in sorted(exported.items())}}
        self._write_record(f"{self.run_id}.summary.json", summary)
        for uri in records:  # a crash here leaves ranges recorded twice: harmless
            self.dfs.delete(uri)

    def _write_record(self, name: str, record: dict[str, Any]) -> None:
        """Write a record under _weir/commits atomically: temp name, sync, rename."""
        self.dfs.mkdirs(self.commits)
        pending = f"{self.commits}/.{name}.tmp"
        self.dfs.write_bytes(pending, json.dumps(record).encode())
        self.dfs.sync_file(pending)
        self.dfs.rename(pending, f"{self.commits}/{name}")
        self.dfs.sync_dirs_up_to([f"{self.commits}/{name}"], self.root)

    # -- steps 2-8 --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Export the next ranges of every partition; return the run's report."""
        from channel_engine import Channel

        with export_lock(str(self.config.home)):
            self.channel_id = channel_id(self.config.home)
            exported = self.recover()
            with Channel.open(self.config.home) as channel:
                take = channel.take()
                try:
                    reserved = take.reserve(self.settings.max_events)
                    crash_point("reserved")
                    to_write = self._plan(reserved, exported)
                    if to_write:
                        self.piece = self._piece_rows(channel.status())
                        self._write(to_write)
                    take.commit()
                except BaseException as exc:
                    if take.state == "open":
                        take.rollback()
                    error = describe(exc)
                    if self.recorded:  # the output holds the events: the next run skips them
                        error += " (after its commit record: the next run completes it)"
                    self._finish("failed", error)
                    raise
            try:
                self.dfs.delete(self.dfs.join(self.config.name, "_weir", "tmp", self.run_id),
                                recursive=True)
            except Exception as exc:  # noqa: BLE001 -- committed; the next run's step 1 retries
                self.progress(f"export {self.config.name}: temp dir not deleted ({exc})")
        return self._finish("ok")

    def _plan(self, reserved: list[tuple[int, int, int]],
              exported: dict[int, list[Range]]) -> list[tuple[int, Range]]:
        """(partition, range) to write: the reserved ranges, joined where they touch (a
        rolled-back take's events come back beside newer ones), less what is exported."""
        by_partition: dict[int, list[Range]] = {}
        for partition, start, end in reserved:
            by_partition.setdefault(partition, []).append((start, end))
        to_write: list[tuple[int, Range]] = []
        for partition, ranges in sorted(by_partition.items()):
            report = self.reports.setdefault(partition, PartitionReport(partition))
            for wanted in merge(ranges):
                pieces = subtract(wanted, exported.get(partition, []))
                report.skipped += subtract(wanted, pieces)
                report.ranges += pieces
                to_write += [(partition, piece) for piece in pieces]
        return to_write

    def _finish(self, outcome: str, error: str | None = None) -> dict[str, Any]:
        """The run's report (also of a failed run: what it had reserved, and why)."""
        duration = round(time.time() - self.started, 3)
        for report in self.reports.values():
            report.outcome, report.error, report.duration_s = outcome, error, duration
        self.report = {
            "channel": self.config.name, "run_id": self.run_id, "output": self.root,
            "format": self.settings.format, "outcome": outcome, "error": error,
            "spark_master": self.spark.sparkContext.master,
            "rows": sum(r.rows for r in self.reports.values()),
            "bytes": sum(r.bytes for r in self.reports.values()),
            "duration_s": duration, "recorded": self.recorded,
            "missing_files": self.missing[:100],
            "partitions": [asdict(r) for _, r in sorted(self.reports.items())]}
        return self.report

    def _piece_rows(self, status: dict[str, Any]) -> int:
        """Events per piece (one Spark task, one file per time bucket): roll_rows, fewer
        when roll_bytes is reached first at the largest partition's log bytes per event
        (rounded up), and at most PIECE_ROWS so that a large range is written by several
        tasks at once."""
        per_event = max((-(-p["size_bytes"] // events) for p in status["partitions"]
                         if (events := p["log_end_offset"] - p["log_start_offset"]) > 0),
                        default=1)
        return max(1, min(self.settings.roll_rows, PIECE_ROWS,
                          self.settings.roll_bytes // per_event))

    def _write(self, to_write: list[tuple[int, Range]]) -> None:
        temp = self.dfs.join(self.config.name, "_weir", "tmp", self.run_id)
        total = sum(end - start for _, (start, end) in to_write)
        self.progress(f"export {self.config.name}: writing {total:,} events "
                      f"({', '.join(f'p{p} [{s}, {e})' for p, (s, e) in to_write)})")
        frame = self._frame(to_write)
        with self._report_progress(total), self._crash_mid_write(temp):
            # each Spark task reads one piece (see _frame): its files are that piece's,
            # one per time bucket, with no shuffle
            writer(frame, self.settings.format).mode("errorifexists").save(temp)
        crash_point("written")
        moves = self._plan_moves(temp, to_write)
        for source, _ in moves:  # on disk before a record names them (file:// only)
            self.dfs.sync_file(source)
        self.dfs.sync_dirs_up_to([source for source, _ in moves], self.root)
        record = {"run_id": self.run_id, "channel_id": self.channel_id, "moves": moves,
                  "ranges": {str(p): [list(r) for r in report.ranges]
                             for p, report in self.reports.items()}}
        self._write_record(f"{self.run_id}.json", record)  # the commit point
        self.recorded = True
        crash_point("recorded")
        for source, target in moves:
            self.dfs.rename(source, target)
            crash_point("moving")  # the crash tests: one file moved, the others not yet
        self.dfs.sync_dirs_up_to([target for _, target in moves], self.root)
        crash_point("moved")
        for report in self.reports.values():
            report.rows = sum(end - start for start, end in report.ranges)
        self.progress(f"export {self.config.name}: {total:,} events in "
                      f"{sum(len(r.files) for r in self.reports.values())} files")

    def _frame(self, to_write: list[tuple[int, Range]]) -> Any:
        """The events to write, with the columns that place them in files: _p (the
        partition), _chunk (the first offset of the event's piece) and _bucket (the time
        path). A piece is the part of a range between multiples of self.piece, so pieces
        of different ranges never share a _chunk, and each is one Spark task."""
        from pyspark.sql import functions as F

        from channel_engine.spark.source import register

        register(self.spark)
        self.spark.conf.set("spark.sql.session.timeZone", "UTC")  # time paths are in UTC
        remote = {"url": self.settings.read_url, "token": self.settings.read_token or ""} \
            if self.settings.read_url else {}
        piece = self.piece
        ranges: dict[str, list[list[int]]] = {}
        for p, (start, end) in to_write:
            ranges.setdefault(str(p), []).append([start, end])
        frame = (self.spark.read.format("weir").option("home", str(self.config.home))
                 .option("ranges", json.dumps(ranges)).option("split_align", str(piece))
                 .options(**remote).load())
        offset = F.col("offset")
        aligned = offset - offset % F.lit(piece)
        chunk: Any = None  # one flat CASE: a branch per range whose first piece is short
        for p, (start, end) in to_write:
            if start % piece:  # a range's first piece starts at the range, not a multiple
                head = (F.col("partition") == p) & (offset >= start) \
                    & (offset < min(end, start - start % piece + piece))
                chunk = F.when(head, F.lit(start)) if chunk is None \
                    else chunk.when(head, F.lit(start))
        chunk = aligned if chunk is None else chunk.otherwise(aligned)
        return (frame.withColumn("_p", F.col("partition"))
                .withColumn("_chunk", chunk)
                .withColumn("_bucket", F.date_format(F.timestamp_millis(F.col("timestamp")),
                                                     spark_pattern(self.settings.path))))

    def _plan_moves(self, temp: str, to_write: list[tuple[int, Range]]) -> list[list[str]]:
        """Final names for Spark's temp files: one file per (partition, chunk, bucket)."""
        moves, seen = [], set()
        ext = self.settings.format
        pattern = re.compile(r"/_p=(\d+)/_chunk=(\d+)/_bucket=([^/]+)/(part-[^/]+)$")
        for uri, size in self.dfs.list_files(temp):
            name = uri.rsplit("/", 1)[-1]
            if name.startswith((".", "_")):
                continue  # _SUCCESS, .crc sidecars
            match = pattern.search(uri)
            if match is None:
                raise ExportError(f"unexpected file in the export's temp dir: {uri}")
            partition, chunk = int(match.group(1)), int(match.group(2))
            bucket = unquote(match.group(3))
            first, last = self._piece_bounds(partition, chunk, to_write)
            key = (partition, chunk, bucket)
            if key in seen:
                raise ExportError(f"Spark wrote two files for {key}: cannot name both")
            seen.add(key)
            name = f"{self.config.name}+{partition}+{first:020d}+{last:020d}"
            final = self.dfs.join(self.config.name, bucket, f"{name}.{ext}")
            if self.dfs.exists(final):  # a deleted namesake's file: never overwrite it
                final = self.dfs.join(self.config.name, bucket,
                                      f"{name}+{self.channel_id[:8]}.{ext}")
                if self.dfs.exists(final):
                    raise ExportError(f"{final} exists already: the output holds this range")
            moves.append([uri, final])
            self.reports[partition].files.append(final)
            self.reports[partition].bytes += size
        return moves

    def _piece_bounds(self, partition: int, chunk: int,
                      to_write: list[tuple[int, Range]]) -> tuple[int, int]:
        """First and last offset of the piece that starts at `chunk` (see _frame)."""
        for p, (start, end) in to_write:
            if p == partition and start <= chunk < end:
                return chunk, min(end, chunk - chunk % self.piece + self.piece) - 1
        raise ExportError(f"partition {partition}: chunk {chunk} lies in no range written")

    @contextmanager
    def _crash_mid_write(self, temp: str) -> Iterator[None]:
        """For the crash and fault tests: die (or stop: crash_point) once Spark has written
        its first data file (at the latest when the write ends: a small write may finish
        between two looks)."""
        def armed() -> bool:  # a stop happens once: then the watch is over
            return "writing" in (os.environ.get("WEIR_EXPORT_CRASH_AT"),
                                 os.environ.get("WEIR_EXPORT_STOP_AT"))

        if not armed():
            yield
            return

        def watch() -> None:
            if armed() and any("/part-" in uri and not uri.endswith(".crc")
                               for uri, _ in self.dfs.list_files(temp)):
                crash_point("writing")

        with _every(0.01, watch):
            yield
        crash_point("writing")

    def _report_progress(self, total: int) -> Any:
        """Log rows and % while Spark writes (from its task counts), every progress_s."""
        tracker = self.spark.sparkContext.statusTracker()

        def report() -> None:
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            tasks = sum(s.numTasks for s in stages if s)
            finished = sum(s.numCompletedTasks for s in stages if s)
            if tasks:
                share = finished / tasks
                self.progress(f"export {self.config.name}: ~{int(total * share):,} of "
                              f"{total:,} rows ({share:.0%})")

        return _every(self.settings.progress_s, report)


@contextmanager
def _every(seconds: float, action: Callable[[], None]) -> Iterator[None]:
    """Run `action` every `seconds` on a thread while the block runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(seconds):
            action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# HDFS's client retries a NameNode that does not answer (a restart: an upgrade, a config
# change) for up to 10 x 2 s instead of failing the run at its first call; without it, a
# connection the restart cut answers EOFException once. To change it, set them as
# spark.hadoop.<key> (spark-defaults.conf, --conf): they win over these (and these over
# hdfs-site.xml).
HDFS_CLIENT_RETRY = {"dfs.client.retry.policy.enabled": "true",
                     "dfs.client.retry.policy.spec": "2000,10"}


def spark_session(master: str | None = "local[*]") -> Any:
    """A SparkSession for the export (UTC, no UI), with channel_engine shipped to its
    executors. Without a master: spark-submit's --master when spark-submit started this
    process, else local[*]. Only a local master gets this interpreter for its workers and
    a loopback address: a cluster's executors reach the driver, and run the Python, of
    their own hosts (spark.driver.host, spark.pyspark.python in spark-defaults.conf).
    spark.pyspark.python is honoured here too: pyspark reads it only under spark-submit,
    and without it a `python -m` job's executors would run PATH's python3."""
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not spark-submit
        master = "local[*]"
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        root = str(Path(__file__).resolve().parents[2])
        paths = os.environ.get("PYTHONPATH", "")
        if root not in paths.split(os.pathsep):  # local workers import channel_engine too
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, paths) if p)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("weir-export")
    if master is not None:
        builder = builder.master(master)
    builder = (builder.config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")  # it prints its own progress
             .config("spark.sql.session.timeZone", "UTC"))
    spark = builder.getOrCreate()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in HDFS_CLIENT_RETRY.items():  # before the first HDFS client is made
        if not spark.sparkContext.getConf().contains(f"spark.hadoop.{key}"):
            hadoop.set(key, value)
    python = spark.sparkContext.getConf().get("spark.pyspark.python", None)
    if python:  # before any Python function (the weir source) is made with it
        spark.sparkContext.pythonExec = python
    spark.sparkContext.addPyFile(package_zip())
    return spark


def package_zip() -> str:
    """channel_engine's Python files zipped for SparkContext.addPyFile: executors on other
    hosts (spark://, yarn) then run the driver's version of Weir's code. They still need
    its dependencies installed (pyproject.toml: aiokafka, crc32c, cryptography, msgpack,
    pyarrow). The zip is named by its content in the temp dir, so every run of one
    version shares one file (written atomically) instead of leaving one behind each."""
    import hashlib
    import io
    import tempfile
    import zipfile

    package = Path(__file__).resolve().parents[1]
    sources = sorted(package.rglob("*.py"))
    content = io.BytesIO()
    with zipfile.ZipFile(content, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sources:
            # a fixed date: the same sources give the same bytes, so the same name
            info = zipfile.ZipInfo(source.relative_to(package.parent).as_posix(),
                                   (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, source.read_bytes())
    data = content.getvalue()
    path = Path(tempfile.gettempdir()) / \
        f"weir-channel-engine-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        handle, temp = tempfile.mkstemp(prefix=".weir-channel-engine-", dir=path.parent)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    """The spark-submit / python -m entry point."""
    parser = argparse.ArgumentParser(description="Export a Weir channel exactly once.")
    parser.add_argument("--home", required=True, help="the channel's home (checkpoint_dir)")
    parser.add_argument("--output", required=True, help="base URI: hdfs://… or file://…")
    parser.add_argument("--format", default="parquet", choices=sorted(FORMATS))
    parser.add_argument("--path", default="%Y/%m/%d/%H", help="time path (Flume escapes)")
    parser.add_argument("--roll-rows", type=int, default=1_000_000,
                        help="the most events in one file")
    parser.add_argument("--roll-bytes", type=int, default=256 << 20,
                        help="the most bytes of events (as stored in the log) in one file")
    parser.add_argument("--progress-every", type=float, default=2.0, metavar="SECONDS",
                        help="a progress line this often while Spark writes")
    parser.add_argument("--max-events", type=int, default=10_000_000)
    parser.add_argument("--master", default=os.environ.get("WEIR_SPARK_MASTER"),
                        help="local[*], spark://host:7077, yarn (default: WEIR_SPARK_MASTER, "
                             "else spark-submit's --master, else local[*])")
    parser.add_argument("--read-url", help="executors read over this appliance URL (token "
                                           "in WEIR_EXPORT_READ_TOKEN) instead of from files")
    args = parser.parse_args(argv)
    try:
        settings = ExportSettings(args.home, args.output, args.format, args.path,
                                  args.roll_rows, args.max_events, args.read_url,
                                  os.environ.get("WEIR_EXPORT_READ_TOKEN"), args.roll_bytes,
                                  args.progress_every)
    except ValueError as exc:
        parser.error(str(exc))
    if not (Path(args.home) / "channel.json").is_file():
        parser.error(f"--home: no channel.json in {args.home}")
    from channel_engine.errors import ExportRunningError
    from channel_engine.spark.export_lock import EXIT_BUSY, hold

    try:
        name = json.loads((Path(args.home) / "channel.json").read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None  # the run itself reports a bad channel.json
    try:
        with hold(args.home, name):  # for the whole run, before Spark starts
            return _export(settings, args.master)
    except ExportRunningError as exc:
        print(json.dumps({"report": None, "error": str(exc)}), flush=True)
        return EXIT_BUSY


def _export(settings: ExportSettings, master: str | None) -> int:
    """Run the export; print its report line: {"report": …} or, when it failed,
    {"report": null, "error": …, "run": what the failed run had reserved, or null}."""
    spark = spark_session(master)
    exporter = None
    try:
        exporter = Exporter(spark, settings, progress=lambda line: print(line, flush=True))
        report = exporter.run()
    except Exception as exc:  # noqa: BLE001 -- the report says what failed, for the appliance
        failed = getattr(exporter, "report", None)
        print(json.dumps({"report": None, "error": describe(exc),
                          "run": failed}), flush=True)
        return 1
    finally:
        spark.stop()
    print(json.dumps({"report": report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

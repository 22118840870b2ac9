"""The export job: drain a channel into a Hadoop filesystem, exactly once.

    spark-submit channel_engine/spark/export.py --home /data/orders/checkpoint \\
        --output hdfs://namenode:8020/weir [--format parquet|json] [--path %Y/%m/%d/%H] \\
        [--roll-rows 1000000] [--max-events 10000000]
    (or: python -m channel_engine.spark.export …; manage.py export_channel NAME)

It prints progress lines, then one JSON report line (`{"report": …}`) on stdout.

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
    _weir/tmp/<run id>/                              Spark's output before it is moved

Readers (Spark, Hive, pyarrow) skip `_`-prefixed paths, so they see committed files only.

The protocol (each step survives a crash at any point; the output is the source of truth):

    step  what                                           after a crash here, the next run
    ----  ---------------------------------------------  --------------------------------------
    1     recover: redo the moves of every commit        finishes the moves; the range counts
          record, delete every temp dir                  as exported
    2     take: reserve the next ranges of each          the take rolled back (its process
          partition (a take transaction, no lease)       died): the same ranges come again
    3     skip what a commit record already holds        -
    4     write the rest with Spark to _weir/tmp/<run>   temp files deleted by step 1
    5     write the commit record (temp name, rename)    step 1 applies it
    6     move each temp file to its final name          step 1 finishes the moves
    7     commit the take                                the take returns; step 3 skips it
    8     delete the temp dir                            step 1 deletes it

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
from functools import reduce
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

FORMATS = {"parquet": "parquet", "json": "json", "avro": "avro"}
# Avro files carry this schema (Spark has no Avro writer without the spark-avro jar, so
# fastavro encodes them in the executors and the driver writes them).
AVRO_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": "channel", "type": "string"}, {"name": "partition", "type": "int"},
               {"name": "offset", "type": "long"},
               {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "key", "type": ["null", "bytes"]},
               {"name": "headers", "type": {"type": "map", "values": "bytes"}},
               {"name": "body", "type": "bytes"}]}
ESCAPES = {"Y": "yyyy", "m": "MM", "d": "dd", "H": "HH", "M": "mm", "S": "ss",
           "y": "yy", "j": "DDD"}
Range = tuple[int, int]  # [start, end): end exclusive
# At most this many events per Spark task (and per file): enough tasks to use every core
PIECE_ROWS = 200_000


@dataclass
class ExportSettings:
    """What one export run does (from the CLI, or from the appliance's channel row)."""

    home: str
    output: str
    format: str = "parquet"
    path: str = "%Y/%m/%d/%H"
    roll_rows: int = 1_000_000
    max_events: int = 10_000_000
    read_url: str | None = None  # executors read over the appliance's HTTP API
    read_token: str | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if not 1 <= self.roll_rows <= 2**31 - 1:
            raise ValueError(f"roll_rows must be from 1 to 2**31-1, not {self.roll_rows}")
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
    """Die here (SIGKILL) when WEIR_EXPORT_CRASH_AT names this step: the crash tests."""
    if os.environ.get("WEIR_EXPORT_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


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
        self.run_id = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"

    # -- step 1 -----------------------------------------------------------------------------
    def recover(self) -> dict[int, list[Range]]:
        """Finish every recorded run's moves, drop temp dirs; return exported ranges."""
        exported: dict[int, list[Range]] = {}
        for uri, _ in self.dfs.list_files(self.dfs.join(self.config.name, "_weir", "commits")):
            if not uri.endswith(".json"):
                continue
            record = json.loads(self.dfs.read_bytes(uri))
            for temp, final in record["moves"]:
                if not self.dfs.exists(final):
                    if not self.dfs.exists(temp):
                        raise RuntimeError(f"commit record {uri}: {final} and its temp file "
                                           "are both missing (was the output edited?)")
                    self.dfs.rename(temp, final)
            for partition, ranges in record["ranges"].items():
                exported.setdefault(int(partition), []).extend(
                    (int(start), int(end)) for start, end in ranges)
        self.dfs.delete(self.dfs.join(self.config.name, "_weir", "tmp"), recursive=True)
        return exported

    # -- steps 2-8 --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Export the next ranges of every partition; return the run's report."""
        from channel_engine import Channel

        started = time.time()
        reports: dict[int, PartitionReport] = {}
        with export_lock(str(self.config.home)):
            exported = self.recover()
            with Channel.open(self.config.home) as channel:
                take = channel.take()
                try:
                    reserved = take.reserve(self.settings.max_events)
                    crash_point("reserved")
                    to_write: list[tuple[int, Range]] = []
                    for partition, start, end in reserved:
                        report = reports.setdefault(partition, PartitionReport(partition))
                        pieces = subtract((start, end), exported.get(partition, []))
                        report.skipped += subtract((start, end), pieces)
                        report.ranges += pieces
                        to_write += [(partition, piece) for piece in pieces]
                    if to_write:
                        self._write(to_write, reports)
                    take.commit()
                except BaseException:
                    if take.state == "open":
                        take.rollback()
                    raise
            self.dfs.delete(self.dfs.join(self.config.name, "_weir", "tmp", self.run_id),
                            recursive=True)
        rows = sum(r.rows for r in reports.values())
        return {"channel": self.config.name, "run_id": self.run_id, "output": self.root,
                "format": self.settings.format, "rows": rows,
                "bytes": sum(r.bytes for r in reports.values()),
                "duration_s": round(time.time() - started, 3),
                "partitions": [asdict(r) for _, r in sorted(reports.items())]}

    def _write(self, to_write: list[tuple[int, Range]],
               reports: dict[int, PartitionReport]) -> None:
        temp = self.dfs.join(self.config.name, "_weir", "tmp", self.run_id)
        total = sum(end - start for _, (start, end) in to_write)
        self.progress(f"export {self.config.name}: writing {total:,} events "
                      f"({', '.join(f'p{p} [{s}, {e})' for p, (s, e) in to_write)})")
        frame = self._frame(to_write)
        with self._report_progress(total), self._crash_mid_write(temp):
            if self.settings.format == "avro":
                self._write_avro(frame, temp)
            else:
                # each Spark task reads one piece (see _frame): its files are that piece's,
                # one per time bucket, with no shuffle
                (frame.write.partitionBy("_p", "_chunk", "_bucket")
                 .format(FORMATS[self.settings.format]).mode("errorifexists").save(temp))
        crash_point("written")
        moves = self._plan_moves(temp, to_write, reports)
        record = {"run_id": self.run_id, "moves": moves,
                  "ranges": {str(p): [list(r) for r in reports[p].ranges] for p in reports}}
        commits = self.dfs.join(self.config.name, "_weir", "commits")
        self.dfs.mkdirs(commits)
        pending = f"{commits}/.{self.run_id}.json.tmp"
        self.dfs.write_bytes(pending, json.dumps(record).encode())
        self.dfs.rename(pending, f"{commits}/{self.run_id}.json")  # the commit point
        crash_point("recorded")
        for source, target in moves:
            self.dfs.rename(source, target)
        crash_point("moved")
        for report in reports.values():
            report.rows = sum(end - start for start, end in report.ranges)
        self.progress(f"export {self.config.name}: {total:,} events in "
                      f"{sum(len(r.files) for r in reports.values())} files")

    def _write_avro(self, frame: Any, temp: str) -> None:
        """One Avro container file per (partition, chunk, bucket), encoded where the rows
        are and written by the driver into the same layout Spark's writers use."""
        encoded = (frame.groupBy("_p", "_chunk", "_bucket")
                   .applyInPandas(_avro_file, "_p int, _chunk long, _bucket string, "
                                              "data binary"))
        for row in encoded.toLocalIterator():
            bucket = quote(row["_bucket"], safe="")
            self.dfs.write_bytes(f"{temp}/_p={row['_p']}/_chunk={row['_chunk']}/"
                                 f"_bucket={bucket}/part-00000.avro", bytes(row["data"]))

    def _frame(self, to_write: list[tuple[int, Range]]) -> Any:
        """The events to write, with the columns that place them in files."""
        from pyspark.sql import functions as F

        from channel_engine.spark.source import register

        register(self.spark)
        self.spark.conf.set("spark.sql.session.timeZone", "UTC")  # time paths are in UTC
        remote = {"url": self.settings.read_url, "token": self.settings.read_token or ""} \
            if self.settings.read_url else {}
        piece = self.piece_rows
        loads: list[dict[str, list[int]]] = []  # each load: at most one range a partition
        for p, (start, end) in to_write:
            free = next((load for load in loads if str(p) not in load), None)
            if free is None:
                free = {}
                loads.append(free)
            free[str(p)] = [start, end]
        # One load per set of ranges (planning a Python source costs a worker start), its
        # splits cut at multiples of piece: one Spark task, and one file per bucket, each
        frames = [self.spark.read.format("weir").option("home", str(self.config.home))
                  .option("ranges", json.dumps(load)).option("split_align", str(piece))
                  .options(**remote).load() for load in loads]
        frame = reduce(lambda a, b: a.unionByName(b), frames)
        return (frame.withColumn("_p", F.col("partition"))
                .withColumn("_chunk", F.col("offset") - F.col("offset") % F.lit(piece))
                .withColumn("_bucket", F.date_format(F.timestamp_millis(F.col("timestamp")),
                                                     spark_pattern(self.settings.path))))

    def _plan_moves(self, temp: str, to_write: list[tuple[int, Range]],
                    reports: dict[int, PartitionReport]) -> list[list[str]]:
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
                raise RuntimeError(f"unexpected file in the export's temp dir: {uri}")
            partition, chunk = int(match.group(1)), int(match.group(2))
            bucket = unquote(match.group(3))
            first, last = self._chunk_bounds(partition, chunk, to_write)
            key = (partition, chunk, bucket)
            if key in seen:
                raise RuntimeError(f"Spark wrote two files for {key}: cannot name both")
            seen.add(key)
            final = self.dfs.join(self.config.name, bucket,
                                  f"{self.config.name}+{partition}+{first:020d}+{last:020d}.{ext}")
            moves.append([uri, final])
            reports[partition].files.append(final)
            reports[partition].bytes += size
        return moves

    @property
    def piece_rows(self) -> int:
        """Events per piece: one Spark task each, and the offset span of its files."""
        return min(self.settings.roll_rows, PIECE_ROWS)

    def _chunk_bounds(self, partition: int, chunk: int,
                      to_write: list[tuple[int, Range]]) -> tuple[int, int]:
        roll = self.piece_rows
        for p, (start, end) in to_write:
            if p == partition and start < chunk + roll and chunk < end:
                return max(start, chunk), min(end, chunk + roll) - 1
        raise RuntimeError(f"partition {partition}: chunk {chunk} lies in no range written")

    @contextmanager
    def _crash_mid_write(self, temp: str) -> Iterator[None]:
        """For the crash tests: die once Spark has written its first data file."""
        if os.environ.get("WEIR_EXPORT_CRASH_AT") != "writing":
            yield
            return

        def watch() -> None:
            if any("/part-" in uri and not uri.endswith(".crc")
                   for uri, _ in self.dfs.list_files(temp)):
                crash_point("writing")

        with _every(0.02, watch):
            yield

    def _report_progress(self, total: int) -> Any:
        """Log rows and % while Spark writes (from its task counts), every 2 s."""
        tracker = self.spark.sparkContext.statusTracker()

        def report() -> None:
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            tasks = sum(s.numTasks for s in stages if s)
            finished = sum(s.numCompletedTasks for s in stages if s)
            if tasks:
                share = finished / tasks
                self.progress(f"export {self.config.name}: ~{int(total * share):,} of "
                              f"{total:,} rows ({share:.0%})")

        return _every(2.0, report)


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


def _avro_file(group: Any) -> Any:
    """Executor side: a pandas group of events -> one Avro container file."""
    import io

    import fastavro
    import pandas as pd

    group = group.sort_values("offset")
    out = io.BytesIO()
    records = ({"channel": r.channel, "partition": int(r.partition), "offset": int(r.offset),
                "timestamp": int(r.timestamp), "key": r.key,
                "headers": dict(r.headers) if r.headers is not None else {}, "body": r.body}
               for r in group.itertuples(index=False))
    fastavro.writer(out, fastavro.parse_schema(AVRO_SCHEMA), records, codec="deflate")
    first = group.iloc[0]
    return pd.DataFrame({"_p": [int(first["_p"])], "_chunk": [int(first["_chunk"])],
                         "_bucket": [first["_bucket"]], "data": [out.getvalue()]})


def spark_session(master: str = "local[*]") -> Any:
    """A SparkSession for the export (UTC, no UI, workers on this interpreter)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = str(Path(__file__).resolve().parents[2])
    paths = os.environ.get("PYTHONPATH", "")
    if root not in paths.split(os.pathsep):  # the workers import channel_engine too
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, paths) if p)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.appName("weir-export").master(master)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def main(argv: list[str] | None = None) -> int:
    """The spark-submit / python -m entry point."""
    parser = argparse.ArgumentParser(description="Export a Weir channel exactly once.")
    parser.add_argument("--home", required=True, help="the channel's home (checkpoint_dir)")
    parser.add_argument("--output", required=True, help="base URI: hdfs://… or file://…")
    parser.add_argument("--format", default="parquet", choices=sorted(FORMATS))
    parser.add_argument("--path", default="%Y/%m/%d/%H", help="time path (Flume escapes)")
    parser.add_argument("--roll-rows", type=int, default=1_000_000)
    parser.add_argument("--max-events", type=int, default=10_000_000)
    parser.add_argument("--master", default=os.environ.get("WEIR_SPARK_MASTER", "local[*]"))
    parser.add_argument("--read-url", help="executors read over this appliance URL (token "
                                           "in WEIR_EXPORT_READ_TOKEN) instead of from files")
    args = parser.parse_args(argv)
    try:
        settings = ExportSettings(args.home, args.output, args.format, args.path,
                                  args.roll_rows, args.max_events, args.read_url,
                                  os.environ.get("WEIR_EXPORT_READ_TOKEN"))
    except ValueError as exc:
        parser.error(str(exc))
    if not (Path(args.home) / "channel.json").is_file():
        parser.error(f"--home: no channel.json in {args.home}")
    from channel_engine.spark.export_lock import EXIT_BUSY, ExportRunningError, hold

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


def _export(settings: ExportSettings, master: str) -> int:
    spark = spark_session(master)
    try:
        report = Exporter(spark, settings, progress=lambda line: print(line, flush=True)).run()
    except Exception as exc:  # noqa: BLE001 -- the report says what failed, for the appliance
        print(json.dumps({"report": None, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    finally:
        spark.stop()
    print(json.dumps({"report": report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

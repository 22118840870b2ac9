"""The export protocol: one run of the exactly-once export of a channel (Exporter).

The output's layout is output_layout.py's, the commit records' format commit_records.py's,
the files' formats file_formats.py's; the job around a run (command line, SparkSession,
report line) is export.py's.

The protocol (each step survives a crash at any point; the output is the source of truth):

    step  what                                           after a crash here, the next run
    ----  ---------------------------------------------  --------------------------------------
    1     recover: redo the moves of every commit        finishes the moves; the range counts
          record, delete every temp dir and cut-short    as exported
          record; tell the runs they name (the job's
          recovered line); refuse a schema version
          the records hold another of under the path;
          check the ranges against each partition's
          incarnation (a conflict fails the run:
          ExportError, nothing taken or written:
          channel_engine/incarnations.py);
          fold > COMPACT_AFTER records into one
    2     take: reserve the next ranges of each          the take rolled back (its process
          partition (a take transaction, no lease);      died): the same ranges come again
          a partition made again since step 1 rolls
          it back and fails the run (ExportError)
    3     skip what a commit record already holds        -
    4     write the rest with Spark to _weir/tmp/<run>   temp files deleted by step 1
    5     sync the temp files; write the commit record   step 1 applies it
          (temp name, sync, rename, sync the dir),
          between two commit lines (export.py)
    6     move each temp file to its final name; sync    step 1 finishes the moves
          the directories
    7     commit the take                                the take returns; step 3 skips it
    8     delete the temp dir                            step 1 deletes it

One folder never holds files of two schema versions (file_formats.py; a reader takes a
folder's files, and those below it, for one table). Step 1 knows from the commit records
what each export path holds (commit_records.py: each record keeps the path its run was
told; a summary, what it folds; a summary from before the paths, the output's folders,
listed once); when a path that overlaps the run's (path_overlap.py: folder by folder)
holds files of another version than the run is told, the run stops there with an
ExportError naming the folder, both versions and what to change: nothing taken, nothing
written, the records not compacted (crashed runs' temp dirs are deleted first). The
appliance refuses such settings already (appliance/export_schema.py); this catches a job
run by hand, or an output the appliance's rows do not know. A run told no version writes
the one the overlapping paths hold, else that of the newest record, else the latest.

Before step 1 the run opens the channel without ever making it (create=False): a channel
whose files are missing (a volume not mounted) fails the run with StorageMissingError,
before the output is touched, instead of an empty channel made in their place.

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
that must hold as on file://; replication across racks covers the rest. (Avro files are
Spark's too, since Spark's own Avro writer replaced the driver's: only closed, like the
others.)

A killed run leaves files open on HDFS under its dead client's lease (a temp file Spark
was writing, a record cut short) until the NameNode recovers it (the 1 h hard limit).
No run waits for that, and none needs DistributedFileSystem.recoverLease: every path a
run writes is its own (_weir/tmp/<run id>/, _weir/commits/.<run id>.json.tmp), the next
run only deletes another run's leftovers (a delete needs no lease), and the only files
it renames were closed before (the temp files a record names; a record after its close).

So every event reaches the output exactly once: written files count only once a commit
record names them, and a range a record names is never written again. Two exports of one
channel must not run at once: a run holds `export.lock` in the channel's home
(export_lock.py; the job holds it already from before Spark starts, export.py).

Concurrency contract: an Exporter is one run, on the driver, in one thread; the crash
and stop points (crash_point) are the crash and fault tests' hooks.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from channel_engine import Channel, ChannelConfig, SubscriptionExistsError, TakeTransaction
from channel_engine.channel_id import channel_id
from channel_engine.errors import ExportError
from channel_engine.incarnations import (
    PartitionIncarnation,
    changed_since,
    conflicts,
    record_incarnations,
)
from channel_engine.offset_ranges import Range, merge, subtract
from channel_engine.spark.commit_records import CommitRecords
from channel_engine.spark.dfs import Dfs
from channel_engine.spark.export_lock import hold
from channel_engine.spark.export_report import PartitionReport, describe
from channel_engine.spark.export_settings import ExportSettings
from channel_engine.spark.file_formats import (
    LATEST_SCHEMA,
    SESSION_CONF,
    columns,
    source_columns,
    writer,
)
from channel_engine.spark.output_layout import OutputLayout, Pieces, held_offsets, piece_rows
from channel_engine.spark.path_overlap import (
    UNKNOWN_PATH,
    folder,
    own_path,
    versions_overlapping,
)
from channel_engine.spark.write_progress import rows_written, write_conf

SHOWN_PATHS = 3  # an error names this many paths of each version, then "and N more"


def _drained() -> None:
    """Wait (up to 2 s) until the job's output has left its stdout pipe: in a warm driver
    (export_driver.py) the pipe's reader is a thread of the process the crash kills, so
    a line printed just before it could be lost (a fresh process's reader, the worker,
    outlives it). The crash tests mean a kill after the line was out."""
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + 2
    try:
        while struct.unpack("i", fcntl.ioctl(1, termios.FIONREAD, b"\0" * 4))[0] and \
                time.monotonic() < deadline:
            time.sleep(0.01)
    except OSError:  # not a pipe
        return
    time.sleep(0.05)  # what the reader took, sent on


def crash_point(step: str) -> None:
    """Die here (SIGKILL) when WEIR_EXPORT_CRASH_AT names this step: the crash tests.
    Stop here once (SIGSTOP to the job's process group: Spark's JVM and workers too)
    when WEIR_EXPORT_STOP_AT names it: the HDFS fault tests start the job in a session
    of its own, break the cluster, then SIGCONT it."""
    if os.environ.get("WEIR_EXPORT_CRASH_AT") == step:
        _drained()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("WEIR_EXPORT_STOP_AT") == step:
        del os.environ["WEIR_EXPORT_STOP_AT"]
        os.killpg(os.getpgrp(), signal.SIGSTOP)


class Exporter:
    """One run of the protocol above for one channel."""

    def __init__(self, spark: Any, settings: ExportSettings,
                 progress: Callable[[str], None] = print,
                 on_commit: Callable[[dict[str, Any]], None] = lambda report: None,
                 on_recover: Callable[[dict[str, Any]], None] = lambda found: None) -> None:
        self.spark = spark
        self.settings = settings
        self.progress = progress
        # Told the run's report just before its commit point (outcome "committing") and
        # just after (outcome "committed"): the appliance's record of a job killed before
        # it could report (export_report.py)
        self.on_commit = on_commit
        # Told what step 1 found once it read the commit records, before it compacts them
        # (which drops their run ids): {"run_id", "committed_runs"} (export_report.py)
        self.on_recover = on_recover
        self.config = ChannelConfig.load(settings.home)
        self.dfs = Dfs(spark, settings.output)
        self.layout = OutputLayout(self.dfs, self.config.name)
        self.root = self.layout.root
        self.records = CommitRecords(self.layout)
        self.run_id = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
        self.reports: dict[int, PartitionReport] = {}
        self.started = time.time()
        self.channel_id = ""  # set under the export lock (run)
        self.recorded = False  # this run's commit record is written
        self.schema_version = settings.schema_version  # resolved by recover() when None
        self.incarnations: list[PartitionIncarnation] = []  # the channel's, at the run's start

    # -- step 1 -----------------------------------------------------------------------------
    def recover(self) -> dict[int, list[Range]]:
        """Finish every recorded run's moves, drop temp dirs and half-written records, tell
        on_recover the runs the records name, refuse a schema version other than the
        folders of the run's path hold and ranges another incarnation of a partition
        reused (ExportError), then compact the records; return this channel's exported
        ranges by partition."""
        exported = self.records.recover(self.channel_id)
        held = versions_overlapping(self.records.paths, self.settings.path)
        if self.schema_version is None:  # a job told none keeps the folders' layout
            self.schema_version = next(iter(held)) if len(held) == 1 else \
                self.records.schema_version or LATEST_SCHEMA
        self.on_recover({"run_id": self.run_id, "committed_runs": self.records.runs})
        crash_point("recovered")  # the appliance tests: its recovered line out, nothing more
        # crashed runs' temp dirs (their moves redone above) go even when the run is refused
        self.dfs.delete(self.layout.temp_root, recursive=True)
        self._refuse_mixed_versions(held)
        missing = self.records.missing
        if missing:
            self.progress(f"export {self.config.name}: {len(missing)} committed files "
                          f"are gone from the output (pruned by hand?), e.g. {missing[0]}")
        found = conflicts(self.config.name, self.incarnations, self.records.by_incarnation,
                          "export")
        if found:  # before anything is compacted, taken or written (incarnations.py)
            raise ExportError(" ".join(found))
        self.records.compact(self.run_id, self.channel_id, exported,
                             incarnations=record_incarnations(self.incarnations,
                                                              list(exported)))
        return exported

    def _refuse_mixed_versions(self, held: dict[int, list[str]]) -> None:
        """An ExportError when the paths overlapping the run's hold files of another schema
        version than it writes (`held`: versions_overlapping), saying what to do."""
        version = self._version()
        others = {v: paths for v, paths in held.items() if v != version}
        if not others:
            return
        raise ExportError(
            f"export of channel {self.config.name!r}: the folders of export path "
            f"'{folder(self.settings.path)}' under {self.root} hold committed files of "
            f"another schema version, or folders above or below them do "
            f"({self._where(others)}: the commit records in {self.layout.commits}); this "
            f"run is told to write version {version}, and two versions in one folder would "
            f"mix two layouts of columns for a reader. To export, {self._advice(held)}; "
            f"nothing was taken or written")

    @staticmethod
    def _where(others: dict[int, list[str]]) -> str:
        """Which paths hold which other versions, at most SHOWN_PATHS of each."""
        def named(path: str) -> str:
            return f"'{path}'" if path != UNKNOWN_PATH else "the channel's root folder"

        return "; ".join(
            f"version {v} under " + ", ".join(map(named, paths[:SHOWN_PATHS]))
            + (f" and {len(paths) - SHOWN_PATHS} more" if len(paths) > SHOWN_PATHS else "")
            for v, paths in sorted(others.items()))

    def _advice(self, held: dict[int, list[str]]) -> str:
        """What to change: the export path (to one of its own, checked against the records,
        when there is one to suggest), or the schema version when the overlapping folders
        hold one other version only (another version would mix them just as well)."""
        own = own_path(self.settings.path, self._version(), self.records.paths)
        change_path = f"change the export path to one of its own (say '{own}')" if own \
            else "change the export path to folders apart from those"
        if len(held) > 1:  # they hold the told version too, or both
            return change_path
        return f"{change_path}, or the schema version to {next(iter(held))}"

    # -- steps 2-8 --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Export the next ranges of every partition; return the run's report."""
        with hold(str(self.config.home)):  # a no-op under main(), which holds it already
            # a drain never makes a channel: files missing fail it (StorageMissingError)
            # before the output is touched
            with Channel.open(self.config.home, create=False) as channel:
                self.channel_id = channel_id(self.config.home)
                self.incarnations = channel.incarnations()
                try:
                    exported = self.recover()
                except BaseException as exc:  # nothing taken: the report says why
                    self._finish("failed", describe(exc))
                    raise
                take = self._take(channel)
                try:
                    reserved = take.reserve(self.settings.max_events)
                    crash_point("reserved")
                    self._recheck_incarnations(channel)
                    to_write = self._plan(reserved, exported)
                    if to_write:
                        self._write(Pieces(piece_rows(self.settings, channel.status()),
                                           to_write))
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
                self.dfs.delete(self.layout.temp(self.run_id), recursive=True)
            except Exception as exc:  # noqa: BLE001 -- committed; the next run's step 1 retries
                self.progress(f"export {self.config.name}: temp dir not deleted ({exc})")
        return self._finish("ok")

    def _take(self, channel: Channel) -> TakeTransaction:
        """Step 2's take, of the run's subscription: one the channel lacks is added first,
        where the subscription most behind stands ("slowest": never a fuller channel;
        commit records skip whatever an earlier run of another subscription exported)."""
        name = self.settings.subscription
        if name not in channel.subscriptions():
            try:
                channel.add_subscription(name, "slowest")
                self.progress(f"export {self.config.name}: added subscription {name!r} "
                              "where the slowest subscription stands")
            except SubscriptionExistsError:  # added meanwhile (by an operator): use it
                pass
        return channel.take(subscription=name)

    def _recheck_incarnations(self, channel: Channel) -> None:
        """After the reserve, before step 3: ExportError (the take is rolled back) when a
        partition was made again since step 1's check (incarnations.changed_since)."""
        changed = changed_since(self.config.name, self.incarnations, channel.incarnations(),
                                "export")
        if changed:
            raise ExportError(changed)

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
            "format": self.settings.format, "schema_version": self.schema_version,
            "outcome": outcome, "error": error,
            "spark_master": self.spark.sparkContext.master,
            "rows": sum(r.rows for r in self.reports.values()),
            "bytes": sum(r.bytes for r in self.reports.values()),
            "duration_s": duration, "recorded": self.recorded,
            "committed_runs": self.records.runs,
            "missing_files": self.records.missing[:100],
            "partitions": [asdict(r) for _, r in sorted(self.reports.items())]}
        return self.report

    def _write(self, pieces: Pieces) -> None:
        """Steps 4-6: write the pieces to the temp dir, record them, move them."""
        temp = self.layout.temp(self.run_id)
        total = sum(end - start for _, (start, end) in pieces.ranges)
        self.progress(f"export {self.config.name}: writing {total:,} events "
                      f"({', '.join(f'p{p} [{s}, {e})' for p, (s, e) in pieces.ranges)})")
        frame = self.frame(pieces)
        with self._report_progress(total), self._crash_mid_write(temp):
            write_files(self.spark, frame, self.settings, self._version(), temp)
        crash_point("written")
        moves = self._plan_moves(temp, pieces)
        for source, _ in moves:  # on disk before a record names them (file:// only)
            self.dfs.sync_file(source)
        self.dfs.sync_dirs_up_to([source for source, _ in moves], self.root)
        for report in self.reports.values():
            report.rows = sum(end - start for start, end in report.ranges)
        self.on_commit(self._finish("committing"))
        self.records.commit(self.run_id, self.channel_id, moves,  # the commit point
                            {p: report.ranges for p, report in self.reports.items()},
                            self._version(), self.settings.path,
                            incarnations=record_incarnations(self.incarnations,
                                                             list(self.reports)))
        self.recorded = True
        crash_point("recorded")  # committed, and nobody told yet
        self.on_commit(self._finish("committed"))
        crash_point("announced")  # the appliance tests: committed, and its commit line out
        for source, target in moves:
            self.dfs.rename(source, target)
            crash_point("moving")  # the crash tests: one file moved, the others not yet
        self.dfs.sync_dirs_up_to([target for _, target in moves], self.root)
        crash_point("moved")
        self.progress(f"export {self.config.name}: {total:,} events in "
                      f"{sum(len(r.files) for r in self.reports.values())} files")

    def frame(self, pieces: Pieces) -> Any:
        """The events of the pieces, read through the "weir" source (source.py), in the
        columns of the run's schema version (file_formats.columns), with the columns that
        place them in files (Pieces.placed)."""
        from channel_engine.spark.source import SCHEMAS, register

        register(self.spark)
        self.spark.conf.set("spark.sql.session.timeZone", "UTC")  # time paths are in UTC
        remote = {"url": self.settings.read_url, "token": self.settings.read_token or ""} \
            if self.settings.read_url else {}
        ranges: dict[str, list[list[int]]] = {}
        for p, (start, end) in pieces.ranges:
            ranges.setdefault(str(p), []).append([start, end])
        # The schema given: Spark then skips the source's schema() call, a Python planner
        # process of its own (about 3 s of a job's start on 2 CPUs); the options are still
        # checked (source.plan) when Spark makes the reader, before any task runs.
        layout = source_columns(self._version())
        frame = (self.spark.read.format("weir").schema(SCHEMAS[layout])
                 .option("columns", layout).option("home", str(self.config.home))
                 .option("ranges", json.dumps(ranges)).option("split_align", str(pieces.rows))
                 .options(**remote).load())
        return columns(pieces.placed(frame, self.settings.path), self._version())

    def _version(self) -> int:
        """The schema version this run writes (known once recover() ran)."""
        if self.schema_version is None:
            raise ExportError("the schema version is not known before step 1 (recover)")
        return self.schema_version

    def _plan_moves(self, temp: str, pieces: Pieces) -> list[list[str]]:
        """[temp, final] for each of Spark's files, counted in its partition's report."""
        held = held_offsets(self.spark, temp, self.settings.format)
        written = sum(count for _, _, count in held.values())
        expected = sum(end - start for _, (start, end) in pieces.ranges)
        if written != expected:  # never commit a write that lost or doubled events
            raise ExportError(f"Spark wrote {written} events to {temp}, not {expected}")
        moves = []
        for file in self.layout.data_files(temp, pieces, self.settings.format,
                                           self.channel_id, held):
            moves.append([file.temp, file.final])
            self.reports[file.partition].files.append(file.final)
            self.reports[file.partition].bytes += file.size
        return moves

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
        """Log the rows written and % while Spark writes, every progress_s
        (write_progress.py)."""
        def report() -> None:
            written = rows_written(self.spark)
            if written is None:
                self.progress(f"export {self.config.name}: writing {total:,} rows")
            else:
                written = min(written, total)
                self.progress(f"export {self.config.name}: {written:,} of {total:,} rows "
                              f"written ({written / max(total, 1):.0%})")

        return _every(self.settings.progress_s, report)


def write_files(spark: Any, frame: Any, settings: ExportSettings, version: int,
                target: str) -> None:
    """Step 4's write: `frame` (Exporter.frame) to `target`, a directory that must not
    exist, with Spark's writer of the format in schema `version`, under the write's
    session settings (write_progress.write_conf, file_formats.SESSION_CONF). Each Spark
    task reads one piece (see Pieces): its files are that piece's, one per time bucket,
    with no shuffle. (bench/export.py times Spark writing through this too.)"""
    with _session_conf(spark, {**write_conf(settings.open_files), **SESSION_CONF}):
        writer(frame, settings.format, version).mode("errorifexists").save(target)


@contextmanager
def _session_conf(spark: Any, conf: dict[str, str]) -> Iterator[None]:
    """`conf` set in the session while the block runs, then as it was."""
    before = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


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

"""The export's commit records: `_weir/commits/*.json` under <output>/<channel>/, the
output's own account of what it holds (the source of truth of the protocol, exporter.py).

    file                                 what
    -----------------------------------  ------------------------------------------------
    _weir/commits/<run id>.json          commit record of one run: its ranges and moves
    _weir/commits/<run id>.summary.json  the ranges of the records a compaction replaced
                                         (no moves)
    _weir/commits/.<name>.tmp            a record being written; one left behind was cut
                                         short by a crash: never a commit, deleted

A record is a JSON object:

    key         value
    ----------  ------------------------------------------------------------------------
    format      "weir-export-commit" (RECORD_FORMAT)
    version     2 (RECORD_VERSION): 1 before `path`/`paths` and `incarnations`; a reader
                reads 1 and 2 (READ_VERSIONS) and refuses a version it does not know
    run_id      the run that wrote it (<start ms>-<8 hex>)
    channel_id  the channel's export id (channel_id.py: its "weir-export-id" file in the
                channel's home): records of a deleted namesake carry another id and
                their ranges are not skipped
    moves       [[temp, final], ...]: the run's temp -> final renames
    ranges      {"<partition>": [[start, end], ...]}: what it exported (end exclusive)
    schema_version
                the schema version of the columns its files hold (file_formats.py: 1
                bytes, 2 readable); a summary's is that of the newest record it folds
    path        a run's record: the export path it was told (Flume's escapes, as given:
                "%Y/%m/%d/%H"), under which its files are; none in a summary
    paths       a summary's: {path: [schema versions]} of every record it folds (of any
                channel of the name), so that compaction never forgets what a folder
                holds; none in a run's record
    incarnations
                {"<partition>": "<incarnation id>"}: the incarnation of each partition
                whose ranges it holds (channel_engine/incarnations.py), when not the
                original one; optional: a partition it does not name is the original

Records of runs from before the marker have no format and version (read as version 1)
and may have no channel_id (they count for the channel). Records written before the
schema versions have no schema_version: their files are of version 1 or, written from
the readable exports (3c37d9c) on, of version 2, in records of the same shape; the first
of its files that tells (file_schema.py reads its footer, header or first line) gives
the version (a summary, which names no file, leaves it to the record before), else 1.
Records are read oldest first: by name (a run id starts with its start time), a summary
before the record of its own run (written at step 1, before that run's record).
Records written before the paths have no path (nor paths). What a run's record holds is
in the folders of its files that are still there (its moves' final names, URL-decoded,
below <output>/<channel>/: "2026/11/27/14"; a file gone or outside the root counts
nothing), in the record's version as above. A summary from then (named *.summary.json)
folded records of any path and version, so what it holds is rebuilt once from the output
itself: its files are listed (not those under `_`- or `.`-names: _weir/, Spark's temp
dirs, sidecars; nor any in the root itself), grouped by folder, and one file of each
folder tells the folder's version (file_schema.py; else the summary's). Each concrete
folder then compares with export paths as path_overlap.py says. That run compacts even at
or below COMPACT_AFTER records, so its summary stores the map in `paths` and the listing
never runs again (a run refused at step 1 compacts nothing: the next lists again).
Records written before incarnations have no incarnations key: every range of theirs is
of the original incarnation. A summary names each partition's incarnation at its
compaction, which runs only after the run's incarnation checks passed (exporter.py): the
ranges it folds of an older incarnation all lie below the current one's start.
Records that carry path, paths or incarnations are of version 2: an older Weir (a job
hand-run from an older install) ignores keys it does not know, and its compaction would
write a summary without `paths` or `incarnations`, forgetting what each folder holds and
relabelling a recreated partition's ranges as the original's; it refuses a version 2
record instead ("a newer Weir wrote it?").
Keys a reader does not know are ignored. A record that does not parse or has another
shape, or names a schema version this code does not know, is damage: the run
stops with an ExportError naming it (read_record), since skipping it would export its
ranges again and trusting it is impossible. Example:

    {"format": "weir-export-commit", "version": 2, "schema_version": 2,
     "path": "%Y/%m/%d/%H",
     "run_id": "1795788300000-1a2b3c4d", "channel_id": "5f0c9e…", "moves": [[
      "hdfs://nn:8020/weir/orders/_weir/tmp/1795788300000-1a2b3c4d/_p=0/_chunk=0/
       _bucket=2026%2F11%2F27%2F14/part-00000-….parquet",
      "hdfs://nn:8020/weir/orders/2026/11/27/14/
       orders+0+00000000000000000000+00000000000000000099.parquet"]],
     "ranges": {"0": [[0, 100]]}}

(each path one string, broken here to fit): partition 0's offsets 0 to 99, all in hour
14 of 2026-11-27, in one file. A summary of it and a version 1 run's record under
"v1/%Y/%m/%d/%H" would have "moves": [] and "paths": {"%Y/%m/%d/%H": [2],
"v1/%Y/%m/%d/%H": [1]}.

Writing one (CommitRecords.commit, step 5 of the protocol) is atomic: a temp name, its
bytes synced (hsync on HDFS: dfs.py), a rename, the directories synced. The rename is
the run's commit point: from then on its files count, and recover() finishes its moves.

Reading them (recover, step 1) redoes the moves of every record (a crash may have cut
them short), deletes the records cut short and returns the ranges this channel's records
hold, the schema version of the newest record (`schema_version`; of any channel of
the name, whose files share the folders: a run told no version writes that one, so a job
run again by hand after an upgrade keeps the folders' layout), and what each path holds
(`paths`, {path: versions}, of every record: the run refuses to write another version
into a folder one of them overlaps, exporter.py step 1). A committed file gone
when its record is redone (an operator pruned old output) is counted in `missing`, not
recreated, and stops nothing. Once there are more than COMPACT_AFTER records, compact()
folds them into one summary.

Concurrency contract: not thread-safe; the caller holds the channel's export lock
(export_lock.py), so no other run writes records meanwhile.
"""
from __future__ import annotations

import json
from functools import partial
from typing import Any
from urllib.parse import unquote, urlparse

from channel_engine.errors import ExportError
from channel_engine.incarnations import ORIGINAL, Recorded
from channel_engine.offset_ranges import Range, merge
from channel_engine.spark.file_formats import check_schema_version
from channel_engine.spark.file_schema import schema_version_of
from channel_engine.spark.output_layout import OutputLayout
from channel_engine.spark.path_overlap import folder

# recover() folds the commit records into one summary once there are more than this many
COMPACT_AFTER = 32
RECORD_FORMAT = "weir-export-commit"
RECORD_VERSION = 2
# The record versions this code reads: 1 (before `path`/`paths`), 2
READ_VERSIONS = (1, RECORD_VERSION)
# The schema version of the files of a record without one (written before the versions)
UNVERSIONED_SCHEMA = 1


def commit_record(run_id: str, channel_id: str, moves: list[list[str]],
                  ranges: dict[int, list[Range]], schema_version: int, *,
                  incarnations: dict[str, str], path: str | None = None,
                  paths: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """A commit record (the format above), its partitions in the order of `ranges`, of the
    partitions' `incarnations` (incarnations.record_incarnations: always given, so that
    no record relabels a recreated partition's ranges as the original's): a run's with
    the export `path` it was told, a summary's with the `paths` it folds."""
    record = {"format": RECORD_FORMAT, "version": RECORD_VERSION,
              "schema_version": schema_version, "run_id": run_id,
              "channel_id": channel_id, "moves": moves,
              "ranges": {str(p): [list(r) for r in parts] for p, parts in ranges.items()}}
    if path is not None:
        record["path"] = path
    if paths is not None:
        record["paths"] = paths
    if incarnations:
        record["incarnations"] = incarnations
    return record


def schema_version(record: dict[str, Any]) -> int:
    """The schema version of the files a checked record names (the format above)."""
    return int(record.get("schema_version", UNVERSIONED_SCHEMA))


def read_record(uri: str, data: bytes) -> dict[str, Any]:
    """The commit record `data` read from `uri`, checked (the format above): an
    ExportError naming it when it is damaged or of a format or version this code does not
    know, so that the run stops before it trusts or skips what the record holds."""
    advice = ("the run stops: check what the record held, then move it aside (its ranges "
              "are exported again) or restore it")
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise ExportError(f"{uri}: a damaged commit record, not JSON ({exc}); {advice}") \
            from exc
    if not isinstance(record, dict) or record.get("format", RECORD_FORMAT) != RECORD_FORMAT:
        raise ExportError(f"{uri}: not a Weir commit record ({RECORD_FORMAT}); {advice}")
    told = record.get("version", 1)
    if type(told) is not int or told not in READ_VERSIONS:
        raise ExportError(f"{uri}: commit record version {record.get('version')!r}, this "
                          f"export reads versions {' and '.join(map(str, READ_VERSIONS))} "
                          f"only (a newer Weir wrote it?); {advice}")
    if not _well_formed(record):
        raise ExportError(f"{uri}: a damaged commit record (moves or ranges malformed); "
                          f"{advice}")
    if not _well_placed(record):
        raise ExportError(f"{uri}: a damaged commit record (path or paths malformed); "
                          f"{advice}")
    try:
        for version in [record.get("schema_version", UNVERSIONED_SCHEMA),
                        *(v for vs in record.get("paths", {}).values() for v in vs)]:
            check_schema_version(version)
    except ValueError as exc:
        raise ExportError(f"{uri}: {exc} (a newer Weir wrote it?); {advice}") from exc
    return record


def _well_formed(record: dict[str, Any]) -> bool:
    """Moves are [temp, final] strings; ranges map partition numbers to [start, end)."""
    moves, ranges = record.get("moves"), record.get("ranges")
    if not isinstance(moves, list) or not isinstance(ranges, dict):
        return False
    if not all(isinstance(m, list) and len(m) == 2 and all(isinstance(u, str) for u in m)
               for m in moves):
        return False
    incarnations = record.get("incarnations", {})
    if not isinstance(incarnations, dict) or not all(
            isinstance(i, str) and i for i in incarnations.values()):
        return False
    return all(isinstance(p, str) and p.isdigit() and isinstance(rs, list) and all(
        isinstance(r, list) and len(r) == 2 and all(type(o) is int for o in r)
        and 0 <= r[0] < r[1] for r in rs) for p, rs in ranges.items())


def _well_placed(record: dict[str, Any]) -> bool:
    """A path is a string; paths map strings to non-empty lists (of schema versions:
    read_record checks those)."""
    if not isinstance(record.get("path", ""), str):
        return False
    paths = record.get("paths", {})
    return isinstance(paths, dict) and all(
        isinstance(versions, list) and versions for versions in paths.values())


def _oldest_first(listed: tuple[str, int]) -> tuple[str, bool]:
    """The sort key of a listed record: its run id, then a summary before a run's record."""
    name = listed[0].rsplit("/", 1)[-1]
    return name.split(".", 1)[0], not name.endswith(".summary.json")


class CommitRecords:
    """The commit records of one channel's output (the table above)."""

    def __init__(self, layout: OutputLayout) -> None:
        self.layout = layout
        self.dfs = layout.dfs
        self.dir = layout.commits
        self.read: list[str] = []  # the records recover() read, by URI
        self.missing: list[str] = []  # committed files gone from the output (pruned?)
        self.runs: list[str] = []  # the runs whose records recover() read: they committed
        # the schema version of the newest record (recover()); None: there is none
        self.schema_version: int | None = None
        # {path: schema versions of the files under it} of every record (recover())
        self.paths: dict[str, set[int]] = {}
        # {folder: schema version its files tell, None: none tells} of the output's files,
        # listed for a summary from before the paths (_listed); None: not listed
        self.listed: dict[str, int | None] | None = None
        self.rebuilt = False  # `paths` rebuilt from a listing: compact() stores them
        # partition -> incarnation -> ranges this channel's records hold (recover())
        self.by_incarnation: Recorded = {}

    def recover(self, channel_id: str) -> dict[int, list[Range]]:
        """Finish every record's moves and drop half-written records; return the ranges
        the records of `channel_id` hold, by partition, merged."""
        exported: dict[int, list[Range]] = {}
        records: list[tuple[str, dict[str, Any]]] = []  # (name, record), oldest first
        # by name: run ids start with their start time, so the newest record comes last; a
        # run's summary (step 1's compaction) before its own record (step 5), which is newer
        for uri, _ in sorted(self.dfs.list_files(self.dir), key=_oldest_first):
            name = uri.rsplit("/", 1)[-1]
            if name.startswith("."):  # a record whose write was cut short: never a commit
                self.dfs.delete(uri)
                continue
            if not name.endswith(".json"):
                continue
            record = read_record(uri, self.dfs.read_bytes(uri))
            self.read.append(uri)
            for temp, final in record["moves"]:
                self._finish_move(temp, final)
            records.append((name, record))  # a deleted namesake's files share the folders
            if record.get("channel_id", channel_id) != channel_id:
                continue  # a channel of this name that was deleted: its offsets are not ours
            if not name.endswith(".summary.json"):  # a summary is no run of its own
                self.runs.append(str(record.get("run_id", "")))
            incarnations = record.get("incarnations", {})
            for partition, ranges in record["ranges"].items():
                held = [(int(start), int(end)) for start, end in ranges]
                exported.setdefault(int(partition), []).extend(held)
                self.by_incarnation.setdefault(int(partition), {}).setdefault(
                    incarnations.get(partition, ORIGINAL), []).extend(held)
        version = UNVERSIONED_SCHEMA  # of a record that does not tell: the one's before
        for name, record in records:
            version = self._schema_version(record) or version
            for path, versions in self._held(name, record, version).items():
                self.paths.setdefault(path, set()).update(versions)
        if records:
            self.schema_version = version
        return {p: merge(ranges) for p, ranges in exported.items()}

    def _schema_version(self, record: dict[str, Any]) -> int | None:
        """The schema version of a record's files: its own, else (written before the
        versions) what the first of its files that tells says (file_schema.py); None when
        none tells (a summary names none: the caller takes the version of the record
        before, which it folded)."""
        if "schema_version" in record:
            return schema_version(record)
        for _, final in record["moves"]:
            if self.dfs.exists(final):
                told = self._version_of(final)
                if told is not None:
                    return told
        return None

    def _held(self, name: str, record: dict[str, Any], version: int) -> dict[str, set[int]]:
        """{path: schema versions} of what record `name` (of schema `version`) holds: a
        summary's paths, a run's path, else (written before the paths) the folders of a
        run's files, or for a summary what the output's folders hold (the format above)."""
        if "paths" in record:
            return {folder(path): set(versions) for path, versions in record["paths"].items()}
        if "path" in record:
            return {folder(record["path"]): {version}}
        if name.endswith(".summary.json"):  # as recover() tells one: its moves prove nothing
            return self._listed(version)
        gone = set(self.missing)
        return {place: {version} for place in (
            self._folder_of(final) for _, final in record["moves"] if final not in gone)
            if place is not None}

    def _folder_of(self, final: str) -> str | None:
        """The folder of a committed file below <output>/<channel>/ ("2026/11/27/14"), or
        None for a file elsewhere."""
        # None, not UNKNOWN_PATH (which would refuse every path, for good): a file outside
        # the root is in none of this output's folders (the output was copied from another
        # place; its own files there are found where they are), and a file gone (pruned:
        # the caller leaves those out) holds nothing a new file could be mixed with
        relative = self._relative(final)
        return None if relative is None else folder(relative.rpartition("/")[0])

    def _relative(self, uri: str) -> str | None:
        """`uri`'s path below <output>/<channel>/, URL-decoded; None outside it."""
        root = unquote(urlparse(self.layout.root).path).rstrip("/") + "/"
        path = unquote(urlparse(uri).path)
        return path[len(root):] if path.startswith(root) else None

    def _listed(self, version: int) -> dict[str, set[int]]:
        """What the output's folders hold, from its files (listed once: a summary from
        before the paths names none): one file per folder tells the folder's schema version
        (file_schema.py), else `version`. Marks the records for compaction (`rebuilt`), so
        that the next summary stores this map and the listing never runs again."""
        if self.listed is None:
            by_folder: dict[str, str] = {}
            for uri in sorted(self.dfs.data_files(self.layout.root)):
                relative = self._relative(uri)
                # _weir/ (records, temp dirs), Spark's _temporary, .crc sidecars: no data
                # (data_files skips them already); nor a file in the root itself, where
                # Weir writes none
                if relative is None or "/" not in relative or any(
                        part.startswith(("_", ".")) for part in relative.split("/")):
                    continue
                by_folder.setdefault(folder(relative.rpartition("/")[0]), uri)
            self.listed = {place: self._version_of(uri) for place, uri in by_folder.items()}
        self.rebuilt = True
        return {place: {told or version} for place, told in self.listed.items()}

    def _version_of(self, uri: str) -> int | None:
        """The schema version an export file says it holds (file_schema.py), or None."""
        return schema_version_of(uri, self.dfs.length(uri), partial(self.dfs.read_range, uri))

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
        self.dfs.sync_dirs_up_to([final], self.layout.root)

    def compact(self, run_id: str, channel_id: str, exported: dict[int, list[Range]], *,
                incarnations: dict[str, str]) -> None:
        """When recover() read more than COMPACT_AFTER records (their moves all done), or
        rebuilt what a summary from before the paths holds (the format above), replace
        them by one summary of this channel's ranges `exported`, of the partitions'
        `incarnations` now, and every path's versions (records of a deleted namesake go):
        the next run reads one file instead of one per run since the last compaction."""
        if len(self.read) <= COMPACT_AFTER and not self.rebuilt:
            return
        summary = commit_record(run_id, channel_id, [], dict(sorted(exported.items())),
                                self.schema_version or UNVERSIONED_SCHEMA,
                                incarnations=incarnations,
                                paths={p: sorted(v) for p, v in sorted(self.paths.items())})
        self._write(f"{run_id}.summary.json", summary)
        for uri in self.read:  # a crash here leaves ranges recorded twice: harmless
            self.dfs.delete(uri)

    def commit(self, run_id: str, channel_id: str, moves: list[list[str]],
               ranges: dict[int, list[Range]], schema_version: int, path: str, *,
               incarnations: dict[str, str]) -> None:
        """Write run `run_id`'s commit record (its files of `schema_version`, under export
        path `path`, its ranges of the partitions' `incarnations`): the commit point of
        the run."""
        self._write(f"{run_id}.json", commit_record(run_id, channel_id, moves, ranges,
                                                    schema_version, path=path,
                                                    incarnations=incarnations))

    def _write(self, name: str, record: dict[str, Any]) -> None:
        """Write a record under _weir/commits atomically: temp name, sync, rename."""
        self.dfs.mkdirs(self.dir)
        pending = f"{self.dir}/.{name}.tmp"
        self.dfs.write_bytes(pending, json.dumps(record).encode())
        self.dfs.sync_file(pending)
        self.dfs.rename(pending, f"{self.dir}/{name}")
        self.dfs.sync_dirs_up_to([f"{self.dir}/{name}"], self.layout.root)

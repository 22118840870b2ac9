"""An export's folders never mix two schema versions of the columns
(channel_engine/spark/file_formats.py: 1 bytes, 2 readable).

A downstream reader takes a folder's files for one table: Parquet INT64 next to
TIMESTAMP, Avro bytes next to string, and in JSON a base64 `body` next to a text one,
which a decoder would mangle silently when the text happens to be valid base64. So a
create or change of a channel whose export path already holds committed files of
another schema version is refused (400 naming the field), unless the export path
changes too (to one that holds none of another version). Paths are compared folder by
folder (overlap()): files of a version in a folder below or above one of another
version's (%Y/%m/%d/%H/v2, %Y/%m/%d beside %Y/%m/%d/%H) are read together too. The
comparison is channel_engine/spark/path_overlap.py's, which the export job itself uses
too, on what its commit records say a path holds (exporter.py): it refuses what a run
started by hand, outside these checks, would mix.

What a path holds is known from the channel's ExportRun rows: each keeps the schema
version and the export path it was told (rows from before the versions: version 1, and
the channel's export path at the upgrade, migration 0009; a channel deleted before the
upgrade has no export path to tell, so its runs keep path "", which covers every path).
A run that committed events,
one running now (it may be at its commit point) or one that failed after a commit line
(its commit record may be written) counts; the rows stay when a channel
is deleted, as its files do, so a channel made again under the name is checked too.
"""
from __future__ import annotations

from django.core.exceptions import ValidationError

from appliance.models import Channel, ExportRun
from channel_engine.spark.path_overlap import folder, own_path, versions_overlapping


def commit_stage(run: ExportRun) -> str:
    """How far a run's job had come by its commit lines: "committed" (its commit record
    was written), "committing" (it was being written), or "" (no commit line)."""
    return str(run.partitions[0].get("outcome", "")) if run.partitions else ""


def may_hold_files(run: ExportRun) -> bool:
    """Whether a run may have committed files: it is running (it may be at its commit
    point), it committed events, or it failed after a commit line (killed once its commit
    record was written or being written: recorded failed until the next run confirms it)."""
    if run.outcome == ExportRun.FAILED:
        return commit_stage(run) in ("committing", "committed")
    return run.outcome == ExportRun.RUNNING or run.rows > 0


def paths_held(channel: str) -> dict[str, set[int]]:
    """{export path: schema versions} of the files the exports of `channel` committed (or
    may be committing), by its ExportRun rows."""
    # path "" (path_overlap.UNKNOWN_PATH): a run of a channel deleted before the upgrade
    # (migration 0009 knew no path for it): its files may be under any path
    held: dict[str, set[int]] = {}
    for run in ExportRun.objects.filter(channel=channel).only(
            "path", "outcome", "rows", "partitions", "schema_version"):
        if may_hold_files(run):
            held.setdefault(run.path, set()).add(run.schema_version)
    return held


def refuse_mixed_versions(row: Channel, was: Channel | None) -> None:
    """ValidationError naming the field when `row` (`was` before the change; None for a
    create) would export files of another schema version into a folder of its export
    path that holds files of a version already (the module doc)."""
    version, path = row.export_schema_version, row.export_path
    if was is not None and (version, folder(path)) == \
            (was.export_schema_version, folder(was.export_path)):
        return
    runs = paths_held(row.name)
    held = sorted(set(versions_overlapping(runs, path)) - {version})
    if not held:
        return
    there = ", ".join(map(str, held))
    own = own_path(path, version, runs)
    if was is not None and version != was.export_schema_version:
        field, advice = "export_schema_version", (
            f"keep version {was.export_schema_version}, or change export_path with it"
            + (f" (say to '{own}')" if own else " to folders apart from those"))
    else:
        field, advice = ("export_path" if was is not None else "export_schema_version",
                         f"set export_schema_version to {held[-1]}, or another export_path")
    raise ValidationError({field: (
        f"the export path '{folder(path)}' holds files of schema version {there} already "
        f"(in its folders, or in folders above or below them); "
        f"files of version {version} there would mix two layouts in one folder: {advice}")})

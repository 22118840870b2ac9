"""An export's folders never mix two schema versions of the columns
(channel_engine/spark/file_formats.py: 1 bytes, 2 readable).

A downstream reader takes a folder's files for one table: Parquet INT64 next to
TIMESTAMP, Avro bytes next to string, and in JSON a base64 `body` next to a text one,
which a decoder would mangle silently when the text happens to be valid base64. So a
create or change of a channel whose export path already holds committed files of
another schema version is refused (400 naming the field), unless the export path
changes too (to one that holds none of another version). Paths are compared folder by
folder (overlap()): files of a version in a folder below or above one of another
version's (%Y/%m/%d/%H/v2, %Y/%m/%d beside %Y/%m/%d/%H) are read together too.

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

import re

from django.core.exceptions import ValidationError

from appliance.models import Channel, ExportRun
from channel_engine.spark.output_layout import ESCAPES

UNKNOWN_PATH = ""  # an ExportRun's path when nobody knows it (module doc)


def folder(path: str) -> str:
    """An export path as the folder it names (a trailing slash names the same one)."""
    return path.rstrip("/")


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


def _folder_shape(name: str) -> list[str | None] | None:
    """A folder name of an export path as the characters it makes, None for each digit a
    time escape writes (%Y four, %j three, the others two); None for a name of an escape
    this module does not know (it may be any name)."""
    shape: list[str | None] = []
    for match in re.finditer(r"%(.)|([^%]+)", name):
        if match.group(2) is not None:
            shape.extend(match.group(2))
        elif match.group(1) in ESCAPES:
            shape.extend([None] * len(ESCAPES[match.group(1)]))
        else:
            return None
    return shape


def _may_be_one_folder(a: str, b: str) -> bool:
    """Whether folder names `a` and `b` of two export paths can name one folder."""
    x, y = _folder_shape(a), _folder_shape(b)
    if x is None or y is None:
        return True
    return len(x) == len(y) and all(
        i == j or (i is None and (j is None or j.isdigit())) or (j is None and i.isdigit())
        for i, j in zip(x, y, strict=True))


def overlap(path: str, other: str) -> bool:
    """Whether export paths `path` and `other` can put files in one folder, or one's files
    in a folder above the other's (%Y/%m/%d/%H and %Y/%m/%d/%H/v2, or %Y/%m/%d): a
    reader of a folder reads those below it. Compared folder by folder, each time escape
    standing for the digits it writes."""
    parts, others = folder(path).split("/"), folder(other).split("/")
    return all(_may_be_one_folder(a, b) for a, b in zip(
        [p for p in parts if p], [p for p in others if p], strict=False))


def versions_under(channel: str, path: str) -> set[int]:
    """The schema versions of the files the exports of `channel` committed (or may be
    committing) in the folders of export path `path`, or above or below them."""
    # path "": a run of a channel deleted before the upgrade (migration 0009 knew no path
    # for it): its files may be under any path (and overlap() says so of "")
    runs = ExportRun.objects.filter(channel=channel).only(
        "path", "outcome", "rows", "partitions", "schema_version")
    return {run.schema_version for run in runs
            if overlap(path, run.path) and may_hold_files(run)}


def refuse_mixed_versions(row: Channel, was: Channel | None) -> None:
    """ValidationError naming the field when `row` (`was` before the change; None for a
    create) would export files of another schema version into a folder of its export
    path that holds files of a version already (the module doc)."""
    version, path = row.export_schema_version, row.export_path
    if was is not None and (version, folder(path)) == \
            (was.export_schema_version, folder(was.export_path)):
        return
    held = sorted(versions_under(row.name, path) - {version})
    if not held:
        return
    there = ", ".join(map(str, held))
    if was is not None and version != was.export_schema_version:
        field, advice = "export_schema_version", (
            f"keep version {was.export_schema_version}, or change export_path with it "
            f"(say to 'v{version}/{folder(path)}')")
    else:
        field, advice = ("export_path" if was is not None else "export_schema_version",
                         f"set export_schema_version to {held[-1]}, or another export_path")
    raise ValidationError({field: (
        f"the export path '{folder(path)}' holds files of schema version {there} already "
        f"(in its folders, or in folders above or below them); "
        f"files of version {version} there would mix two layouts in one folder: {advice}")})

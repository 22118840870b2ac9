"""An export's folders never mix two schema versions of the columns
(channel_engine/spark/file_formats.py: 1 bytes, 2 readable).

A downstream reader takes a folder's files for one table: Parquet INT64 next to
TIMESTAMP, Avro bytes next to string, and in JSON a base64 `body` next to a text one,
which a decoder would mangle silently when the text happens to be valid base64. So a
create or change of a channel whose export path already holds committed files of
another schema version is refused (400 naming the field), unless the export path
changes too (to one that holds none of another version).

What a path holds is known from the channel's ExportRun rows: each keeps the schema
version and the export path it was told (rows from before the versions: version 1, and
the channel's export path at the upgrade, migration 0009; a channel deleted before the
upgrade has no export path to tell, so its runs keep path "", which covers every path).
A run that committed events,
or one running now (it may be at its commit point), counts; the rows stay when a channel
is deleted, as its files do, so a channel made again under the name is checked too.
"""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import Q

from appliance.models import Channel, ExportRun

UNKNOWN_PATH = ""  # an ExportRun's path when nobody knows it (module doc)


def folder(path: str) -> str:
    """An export path as the folder it names (a trailing slash names the same one)."""
    return path.rstrip("/")


def versions_under(channel: str, path: str) -> set[int]:
    """The schema versions of the files the exports of `channel` committed (or may be
    committing) under export path `path`."""
    # path "": a run of a channel deleted before the upgrade (migration 0009 knew no path
    # for it): its files may be under any path
    runs = ExportRun.objects.filter(channel=channel).filter(
        Q(path=folder(path)) | Q(path=UNKNOWN_PATH)).filter(
        Q(outcome=ExportRun.OK, rows__gt=0) | Q(outcome=ExportRun.RUNNING))
    return set(runs.values_list("schema_version", flat=True))


def check_schema_version(row: Channel, was: Channel | None) -> None:
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
        f"the export path '{folder(path)}' holds files of schema version {there} already; "
        f"files of version {version} there would mix two layouts in one folder: {advice}")})

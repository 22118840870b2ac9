"""The export's schema version (channel_engine/spark/file_formats.py): a new export writes
version 2 (readable columns); an export that exists at the upgrade keeps the layout its
folders hold, so that they never get files of a second schema.

An export exists when the channel has export runs, or commit records in the export's
output (looked for on a file:// WEIR_EXPORT_URI; an HDFS output needs Spark to be read,
and a channel exported there has its runs). Its version: that of the output's newest
commit record, or, for a record from before the versions, what one of its files says
(Weir wrote version 2 from the readable exports on, before it wrote the version in its
records: channel_engine/spark/file_schema.py); else 1. Runs from before the upgrade wrote
that version under the channel's export path as it is now, as far as anyone knows (the
check of a change: appliance/export_schema.py). Reversed, the fields go (the files stay).
"""
import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.db import migrations, models

from channel_engine.spark.dfs import local_path
from channel_engine.spark.file_schema import local_reader, schema_version_of


def _output_version(name: str) -> int | None:
    """The schema version of the files in a file:// export output of channel `name`: its
    newest commit record's, or (a record from before the versions) what one of its files
    says (channel_engine/spark/file_schema.py; a summary names none: the record before
    it tells); 1 when nothing tells. None when there is no commit record. An unreadable output (a permission, a damaged record) counts as
    exported, of version 1: the upgrade goes on and the folders keep what they likely hold."""
    uri = urlparse(str(settings.WEIR_EXPORT_URI))
    if uri.scheme != "file":
        return None
    commits = Path(unquote(uri.path)) / name / "_weir" / "commits"
    try:
        if not commits.is_dir():
            return None
        records = sorted(p for p in commits.glob("*.json") if not p.name.startswith("."))
        if not records:
            return None
        for found in reversed(records):  # by name: the newest comes last
            record = json.loads(found.read_bytes())
            if "schema_version" in record:
                return int(record["schema_version"])
            for _, final in record.get("moves", []):  # a summary has none: the one before
                path = local_path(final)
                if path is not None and os.path.isfile(path):
                    told = schema_version_of(path, *local_reader(path))
                    if told is not None:
                        return told
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return 1


def keep_version_1(apps, schema_editor):  # noqa: ANN001 -- Django's RunPython signature
    channels = apps.get_model("appliance", "Channel")
    runs = apps.get_model("appliance", "ExportRun")
    exported = set(runs.objects.order_by().values_list("channel", flat=True).distinct())
    for row in channels.objects.all():
        version = _output_version(row.name)
        if version is None and row.name in exported:
            version = 1
        if version is not None:
            channels.objects.filter(pk=row.pk).update(export_schema_version=version)
            runs.objects.filter(channel=row.name).update(schema_version=version)
        runs.objects.filter(channel=row.name).update(path=row.export_path.rstrip("/"))


class Migration(migrations.Migration):

    dependencies = [
        ('appliance', '0008_operator_help_texts'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='export_schema_version',
            field=models.PositiveSmallIntegerField(choices=[(1, "1: bytes: key, headers and body as bytes (base64 in JSON), the time a number of milliseconds (Weir's layout before the versions)"), (2, '2: readable: text as strings (raw bytes only where not UTF-8), the time a timestamp')], default=2, help_text="Layout of the exported files' columns. Channels exported before this upgrade keep 1, so that their folders never mix two layouts; to change it once files are exported, change the export path with it."),
        ),
        migrations.AddField(
            model_name='exportrun',
            name='path',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='exportrun',
            name='schema_version',
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.RunPython(keep_version_1, migrations.RunPython.noop),
    ]

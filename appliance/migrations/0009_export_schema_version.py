"""The export's schema version (channel_engine/spark/file_formats.py): a new export writes
version 2 (readable columns); an export that exists at the upgrade keeps version 1, the
layout its folders hold, so that they never get files of a second schema.

An export exists when the channel has export runs, or commit records in the export's
output (looked for on a file:// WEIR_EXPORT_URI; an HDFS output needs Spark to be read,
and a channel exported there has its runs). Runs from before the upgrade wrote version
1 under the channel's export path as it is now, as far as anyone knows (the check of a
change: appliance/export_schema.py). Reversed, the fields go (the files stay).
"""
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.db import migrations, models


def _has_commit_records(name: str) -> bool:
    """Whether a file:// export output holds commit records of channel `name`."""
    uri = urlparse(str(settings.WEIR_EXPORT_URI))
    if uri.scheme != "file":
        return False
    commits = Path(unquote(uri.path)) / name / "_weir" / "commits"
    return commits.is_dir() and any(commits.glob("*.json"))


def keep_version_1(apps, schema_editor):  # noqa: ANN001 -- Django's RunPython signature
    channels = apps.get_model("appliance", "Channel")
    runs = apps.get_model("appliance", "ExportRun")
    exported = set(runs.objects.values_list("channel", flat=True).distinct())
    for row in channels.objects.all():
        if row.name in exported or _has_commit_records(row.name):
            channels.objects.filter(pk=row.pk).update(export_schema_version=1)
        runs.objects.filter(channel=row.name).update(path=row.export_path.rstrip("/"))


class Migration(migrations.Migration):

    dependencies = [
        ('appliance', '0008_operator_help_texts'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='export_schema_version',
            field=models.PositiveSmallIntegerField(choices=[(1, "1: bytes: key, headers and body as bytes (base64 in JSON), the time a number of milliseconds (Weir's layout before the versions)"), (2, '2: readable: text as strings (raw bytes only where not UTF-8), the time a timestamp')], default=2, help_text="Layout of the exported files' columns. Exports made before the versions keep 1, so that their folders never mix two layouts; to change it once files are exported, change the export path with it."),
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

"""Exports from the appliance's side: run the Spark export job for a channel row and keep
an ExportRun row of it (progress while it runs, then the report or the error).

The job (channel_engine/spark/export.py) needs no database: it gets the channel's home
and export settings on its command line and runs in its own process (its own JVM), so
a crash of the job is a crash of that process only — the protocol makes the rerun
exact. WEIR_EXPORT_URI and WEIR_SPARK_MASTER come from settings.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import deque

from django.conf import settings
from django.utils import timezone

from appliance import channels
from appliance.models import Channel, ExportRun

JOB = "channel_engine.spark.export"


def command(row: Channel) -> list[str]:
    """The job's command line for a channel row."""
    config = channels.to_config(row)
    return [sys.executable, "-m", JOB, "--home", str(config.home),
            "--output", settings.WEIR_EXPORT_URI, "--format", row.export_format,
            "--path", row.export_path, "--roll-rows", str(row.export_roll_rows),
            "--master", settings.WEIR_SPARK_MASTER]


def run_export(row: Channel, timeout_s: float = 3600) -> ExportRun:
    """Run one export of the channel now; return its finished ExportRun."""
    run = ExportRun.objects.create(channel=row.name, started_at=timezone.now(),
                                   progress="starting Spark")
    tail: deque[str] = deque(maxlen=20)
    report = None
    with subprocess.Popen(command(row), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as job:
        assert job.stdout is not None
        for line in job.stdout:
            line = line.rstrip("\n")
            if line.startswith('{"report"'):
                report = json.loads(line)
            elif line.startswith("export "):
                ExportRun.objects.filter(pk=run.pk).update(progress=line[:300])
            else:
                tail.append(line)
        code = job.wait(timeout=timeout_s)
    run.refresh_from_db()
    run.duration_s = (timezone.now() - run.started_at).total_seconds()
    if code == 0 and report and report.get("report"):
        done = report["report"]
        run.outcome, run.run_id, run.output = ExportRun.OK, done["run_id"], done["output"]
        run.rows, run.bytes, run.partitions = done["rows"], done["bytes"], done["partitions"]
        run.progress = f"exported {done['rows']:,} events"
    else:
        run.outcome = ExportRun.FAILED
        run.error = (report or {}).get("error") or f"the export job exited with {code}: " + \
            "\n".join(list(tail)[-8:])
    run.save()
    return run

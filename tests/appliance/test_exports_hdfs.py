"""The Celery export task writing to a real HDFS end to end: a real worker runs
weir.export_channel, which runs the real Spark job (in the worker's warm export driver,
appliance/export_driver.py) into the run's HDFS
(`hdfs_url`, tests/conftest.py); Hadoop's own shell (FsShell, from pyspark's Hadoop
jars) copies the output back, and pyarrow reads every committed file."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from appliance_helpers import channel_row
from django.test import override_settings

from appliance import channels, tasks
from appliance.models import ExportRun, TaskRun

# Run once per test command, in its PostgreSQL pass (scripts/test.sh): the job, HDFS and
# the worker are the same whichever database records the run.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hdfs,
              pytest.mark.postgres_pass]


def hdfs_get(uri: str, local: Path) -> Path:
    """Copy an HDFS directory to `local` with Hadoop's own FsShell (`hadoop fs -get`)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    conf = local.parent / "hadoop-conf"  # Hadoop's shell insists on a core-site.xml
    conf.mkdir(exist_ok=True)
    (conf / "core-site.xml").write_text('<?xml version="1.0"?><configuration/>\n')
    done = subprocess.run(["java", "-cp", f"{conf}:{jars}/*", "org.apache.hadoop.fs.FsShell",
                           "-get", uri, str(local)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return local


def committed_rows(local: Path) -> list[dict[str, object]]:
    """The rows of every committed file (readers skip `_`-prefixed paths, as Hive does)."""
    return [row for path in sorted(local.rglob("*.parquet"))
            if not any(part.startswith(("_", ".")) for part in path.relative_to(local).parts)
            for row in pq.read_table(path).to_pylist()]


def test_the_export_task_writes_every_event_to_hdfs_exactly_once(
        worker: None, root: Path, hdfs_url: str) -> None:
    output = f"{hdfs_url}/{uuid.uuid4().hex}"
    with override_settings(WEIR_EXPORT_URI=output, WEIR_SPARK_MASTER="local[1]"):
        row = channel_row(root, partitions=1, export_path="%Y-%m-%d")
        with channels.open_channel(row).put() as tx:
            for i in range(40):
                tx.put(f"e{i}".encode(), key=f"k{i % 3}".encode())
        assert tasks.export_channel.delay("orders").get(timeout=600) == TaskRun.OK
        task = TaskRun.objects.get(task="weir.export_channel", channel="orders")
        run = ExportRun.objects.get()
        assert task.outcome == TaskRun.OK and task.detail["export_run"] == run.pk
        assert run.outcome == ExportRun.OK and run.rows == 40 and run.error == ""
        assert run.output == f"{output}/orders" and run.progress == "exported 40 events"
        assert [p["ranges"] for p in run.partitions] == [[[0, 40]]]
        files = [f for p in run.partitions for f in p["files"]]
        assert files and all(f.startswith(f"{output}/orders/") for f in files)
        rows = committed_rows(hdfs_get(f"{output}/orders", root / "copy"))
        assert sorted(r["body"] for r in rows) == sorted(f"e{i}" for i in range(40))
        assert sorted(r["offset"] for r in rows) == list(range(40))  # each exactly once
        subscriptions = channels.open_channel(row).status()["subscriptions"]
        assert subscriptions["export"]["events_untaken"] == 0  # its own queue:
        assert subscriptions["default"]["events_untaken"] == 40  # HTTP consumers' stays

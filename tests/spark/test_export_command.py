"""manage.py export_channel: the appliance runs the Spark job for a channel row, keeps an
ExportRun of it, and the channel detail shows it; on file:// and end to end into the
run's real HDFS (marked `hdfs`)."""
from __future__ import annotations

import io
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import ApiToken, Channel, ExportRun
from channel_engine import Channel as EngineChannel
from channel_engine.spark.dfs import Dfs

pytestmark = pytest.mark.django_db


def created(**settings: Any) -> Channel:
    """A channel record and its files, as manage_channels' create makes them."""
    row = Channel.objects.create(**settings)
    EngineChannel.create(channels.to_config(row)).close()
    return row


def test_export_channel_runs_the_job_and_records_it(tmp_path: Path) -> None:
    output = tmp_path / "export"
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_EXPORT_URI=output.as_uri(),
                           WEIR_SPARK_MASTER="local[1]"):
        row = created(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(tmp_path / "home"),
                      minimum_required_space=0, export_path="%Y-%m-%d")
        with channels.open_channel(row).put() as tx:
            for i in range(25):
                tx.put(f"e{i}".encode())
        out = StringIO()
        call_command("export_channel", "orders", stdout=out)
        assert "exported 25 events" in out.getvalue()
        run = ExportRun.objects.get()
        assert run.outcome == "ok" and run.rows == 25 and run.duration_s > 0
        assert run.partitions[0]["ranges"] == [[0, 25]]
        files = [Path(f.removeprefix("file://")) for f in run.partitions[0]["files"]]
        assert sum(pq.read_table(f).num_rows for f in files) == 25
        subscriptions = channels.open_channel(row).status()["subscriptions"]
        assert subscriptions["export"]["events_untaken"] == 0  # its own queue:
        assert subscriptions["default"]["events_untaken"] == 25  # HTTP consumers' stays
        _, key = ApiToken.issue("ops", ["admin"])
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        shown = client.get("/api/v1/channels/orders").json()["recent_exports"]
        assert shown[0]["outcome"] == "ok" and shown[0]["rows"] == 25
        with override_settings(WEIR_EXPORT_URI="nosuchfs://x"), \
                pytest.raises(CommandError, match="nosuchfs"):
            call_command("export_channel", "orders")
        failed = ExportRun.objects.filter(outcome="failed").get()
        assert "nosuchfs" in failed.error
        with pytest.raises(CommandError, match="no channel"):
            call_command("export_channel", "nope")
    channels.close_all()


@pytest.mark.hdfs
def test_export_channel_writes_every_event_to_hdfs_exactly_once(
        tmp_path: Path, spark: Any, hdfs_url: str) -> None:
    output = f"{hdfs_url}/{uuid.uuid4().hex}"
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_EXPORT_URI=output,
                           WEIR_SPARK_MASTER="local[1]"):
        row = created(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(tmp_path / "home"), partitions=2,
                      minimum_required_space=0, export_roll_rows=10)
        with channels.open_channel(row).put() as tx:
            for i in range(45):
                tx.put(f"e{i}".encode(), key=f"k{i}".encode())
        out = StringIO()
        call_command("export_channel", "orders", stdout=out)
        assert "exported 45 events" in out.getvalue()
        run = ExportRun.objects.get()
        assert run.outcome == "ok" and run.rows == 45 and run.output == f"{output}/orders"
        files = [f for p in run.partitions for f in p["files"]]
        assert len(files) >= 5 and all(f.startswith(f"{output}/orders/") for f in files)
        dfs = Dfs(spark, output)  # read back over HDFS: every committed file, each whole
        assert sorted(u for u, _ in dfs.list_files(run.output) if "/_weir/" not in u) \
            == sorted(files)
        rows = [r for f in files for r in pq.read_table(io.BytesIO(dfs.read_bytes(f)))
                .to_pylist()]
        assert sorted(r["body"] for r in rows) == sorted(f"e{i}" for i in range(45))  # text
        ranges = {p["partition"]: p["ranges"] for p in run.partitions}
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
            (p, o) for p, spans in ranges.items() for s, e in spans for o in range(s, e))
        subscriptions = channels.open_channel(row).status()["subscriptions"]
        assert subscriptions["export"]["events_untaken"] == 0  # its own queue:
        assert subscriptions["default"]["events_untaken"] == 45  # HTTP consumers' stays
    channels.close_all()


def test_a_job_killed_after_its_commit_point_is_recorded_as_what_it_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Killed once its commit line is out: its row says committed at once. Killed between
    # its commit point and that line: failed until the next job finds its commit record
    # (its recovered line says so, though that job is killed too).
    from appliance import exports

    output = tmp_path / "export"
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_EXPORT_URI=output.as_uri(),
                           WEIR_SPARK_MASTER="local[1]"):
        row = created(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(tmp_path / "home"),
                      minimum_required_space=0, export_path="%Y-%m-%d")
        channel = channels.open_channel(row)
        for first in (0, 20):
            with channel.put() as tx:
                for i in range(first, first + 20):
                    tx.put(f"e{i}".encode())
            monkeypatch.setenv("WEIR_EXPORT_CRASH_AT", "announced" if first else "recorded")
            exports.run_export(row, warm=False)  # test_export_driver.py: in the driver
        monkeypatch.delenv("WEIR_EXPORT_CRASH_AT")
        unknown, told = ExportRun.objects.order_by("started_at")
        assert unknown.outcome == "ok" and unknown.rows == 20 and unknown.error == ""
        assert f"run {told.run_id} found its commit record" in unknown.progress
        assert told.outcome == "ok" and told.rows == 20 and told.error == ""
        assert told.progress.startswith("committed 20 events; its job then ended"), told
        # [0, 20) came back with the take of the killed job: skipped by its commit record
        assert [(p["ranges"], p["skipped"]) for p in told.partitions] == [([[20, 40]],
                                                                          [[0, 20]])]
        last = exports.run_export(row, warm=False)
        assert last.outcome == "ok" and last.rows == 0  # both were committed: nothing again
        files = [Path(f.removeprefix("file://")) for run in (unknown, told)
                 for p in run.partitions for f in p["files"]]
        bodies = sorted(b for f in files for b in pq.read_table(f).column("body").to_pylist())
        assert bodies == sorted(f"e{i}" for i in range(40))  # each exactly once
        assert channel.status()["subscriptions"]["export"]["events_untaken"] == 0
    channels.close_all()


def test_a_run_killed_in_its_commit_is_confirmed_by_the_next_jobs_recovered_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real job, killed once its commit record is written but before its "committed"
    # line; the next job killed right after its recovered line (before any compaction,
    # commit line or report): the first row is confirmed by that line alone.
    with override_settings(WEIR_DATA_ROOTS=[tmp_path],
                           WEIR_EXPORT_URI=(tmp_path / "export").as_uri(),
                           WEIR_SPARK_MASTER="local[1]"):
        row = created(name="orders", data_dirs=[str(tmp_path / "data")],
                      checkpoint_dir=str(tmp_path / "home"), minimum_required_space=0)
        with channels.open_channel(row).put() as tx:
            for i in range(25):
                tx.put(f"e{i}".encode())
        channels.close_all()  # the job owns the channel, as in production's worker
        monkeypatch.setenv("WEIR_EXPORT_CRASH_AT", "recorded")
        with pytest.raises(CommandError):
            call_command("export_channel", "orders", stdout=StringIO())
        killed = ExportRun.objects.get()
        assert killed.outcome == "failed" and "while it wrote its commit record" in killed.error
        monkeypatch.setenv("WEIR_EXPORT_CRASH_AT", "recovered")
        with pytest.raises(CommandError):
            call_command("export_channel", "orders", stdout=StringIO())
        killed.refresh_from_db()
        assert (killed.outcome, killed.rows, killed.error) == ("ok", 25, "")
        assert "found its commit record" in killed.progress
        assert ExportRun.objects.latest("started_at").outcome == "failed"  # the next one
    channels.close_all()

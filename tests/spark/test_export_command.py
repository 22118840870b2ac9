"""manage.py export_channel: the appliance runs the Spark job for a channel row, keeps an
ExportRun of it, and the channel detail shows it."""
from __future__ import annotations

from io import StringIO
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import ApiToken, Channel, ExportRun

pytestmark = pytest.mark.django_db


def test_export_channel_runs_the_job_and_records_it(tmp_path: Path) -> None:
    output = tmp_path / "export"
    with override_settings(WEIR_DATA_ROOTS=[tmp_path], WEIR_EXPORT_URI=output.as_uri(),
                           WEIR_SPARK_MASTER="local[1]"):
        row = Channel.objects.create(name="orders", data_dirs=[str(tmp_path / "data")],
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
        assert channels.open_channel(row).status()["events_untaken"] == 0
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

"""A truly full disk under produce: a tiny real filesystem (tmpfs, mounted when this
process may mount; skipped otherwise — tests/engine/test_channel.py injects ENOSPC at the
segment instead). Produce answers 507 in the API's error shape with Retry-After and
writes nothing, /metrics counts it, the channel is degraded until space returns."""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import make_files, problem, token_client
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from appliance import channels
from appliance.models import Channel

pytestmark = pytest.mark.django_db


@pytest.fixture()
def tiny(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs under the data root."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
            yield mount
    finally:
        try:
            channels.close_all()
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def produce(row: Channel, events: int) -> object:
    body = json.dumps({"events": [{"body": "x" * 1000}] * events})
    return token_client("produce", channels=[row]).post(
        f"/api/v1/channels/{row.name}/events", data=body, content_type="application/json")


def test_it_answers_507_counts_it_and_is_degraded_until_space_returns(tiny: Path) -> None:
    row = Channel.objects.create(name="tiny", data_dirs=[str(tiny / "data")],
                                 checkpoint_dir=str(tiny / "home"), minimum_required_space=0,
                                 preallocate=False, segment_bytes=1 << 20)
    make_files(row)
    assert produce(row, 10).status_code == 200
    filler = tiny / "filler"
    stats = os.statvfs(tiny)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # leave less room than one more put needs (100 events of 1 kB)
        os.posix_fallocate(fd, 0, stats.f_bavail * stats.f_frsize - 40_000)
    finally:
        os.close(fd)
    accepted = 10
    for _ in range(20):  # the zeros an fsync segment keeps written ahead (1 MiB) fit puts
        refused = produce(row, 100)
        if refused.status_code != 200:
            break
        accepted += 100
    assert accepted < 10 + 100 * 12, "no put beyond the space written ahead"
    assert "disk is full" in problem(refused, 507, "disk-full", retry_after=1)["detail"]
    status = channels.open_channel(row).status()
    assert status["events_untaken"] == accepted  # nothing of the refused put written
    assert (status["health"], status["health_reason"][:17]) == ("degraded", "the disk is full:")
    text = token_client("admin").get("/metrics").content.decode()
    samples = {s.labels["channel"]: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "weir_channel_disk_full_errors_total"}
    assert samples == {"tiny": 1}
    filler.unlink()  # space returns
    assert channels.open_channel(row).status()["health"] == "healthy"
    assert produce(row, 100).status_code == 200


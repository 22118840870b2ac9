"""The metrics sampler (one ChannelSample per channel, the figures its status shows; a
channel that fails to open is skipped) and the history pruning (runs and samples older
than WEIR_TASK_RUNS_KEEP_HOURS go, newer ones stay), run in process with .apply()."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from appliance_helpers import channel_row
from django.test import override_settings
from django.utils import timezone

from appliance import channels, tasks
from appliance.models import Channel, ChannelSample, TaskRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_sampler_writes_each_channels_figures_and_skips_a_broken_one(root: Path) -> None:
    channel_row(root, name="idle")
    channel = channels.open_channel(channel_row(root, name="busy"))
    with channel.put() as tx:
        for i in range(10):
            tx.put(b"event %d" % i)
    with channel.take() as tx:
        assert len(tx.take(4)) == 4
    (root / "not-a-dir").write_text("a file where a data dir should be")
    Channel.objects.create(name="broken", data_dirs=[str(root / "not-a-dir")],
                           checkpoint_dir=str(root / "broken"), minimum_required_space=0)
    before = timezone.now()

    assert tasks.sample_metrics.apply().get() == 2
    samples = {s.channel: s for s in ChannelSample.objects.all()}
    assert set(samples) == {"busy", "idle"}
    status = channel.status()
    sample = samples["busy"]
    assert (sample.events_untaken, sample.events_in_flight) == (6, 0)
    assert (sample.put_successes, sample.take_successes) == (10, 4)  # events, as Flume counts
    assert sample.unflushed_events == status["unflushed_events"]
    assert sample.bytes_on_disk == status["bytes_on_disk"] > 0
    assert sample.at >= before and samples["idle"].at == sample.at
    assert (samples["idle"].events_untaken, samples["idle"].put_successes) == (0, 0)


def run(task: str, hours_ago: float) -> TaskRun:
    return TaskRun.objects.create(task=task, channel="orders", outcome=TaskRun.OK,
                                  duration_ms=1.0,
                                  started_at=timezone.now() - timedelta(hours=hours_ago))


def sample(hours_ago: float) -> ChannelSample:
    return ChannelSample.objects.create(
        channel="orders", at=timezone.now() - timedelta(hours=hours_ago), events_untaken=0,
        events_in_flight=0, put_successes=0, take_successes=0, unflushed_events=0,
        bytes_on_disk=0, checkpoint_age_ms=None)


def test_pruning_deletes_runs_and_samples_older_than_the_keep_hours_and_nothing_else() -> None:
    old = [run("weir.flush_channel", 3), run("weir.checkpoint_channel", 2.1)]
    kept_runs = [run("weir.flush_channel", 1.9), run("weir.retention_channel", 0)]
    old_sample, kept_sample = sample(5), sample(1)
    with override_settings(WEIR_TASK_RUNS_KEEP_HOURS=2):
        assert tasks.prune_history.apply().get() == 3
    assert set(TaskRun.objects.values_list("pk", flat=True)) == {r.pk for r in kept_runs}
    assert list(ChannelSample.objects.values_list("pk", flat=True)) == [kept_sample.pk]
    assert not TaskRun.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert not ChannelSample.objects.filter(pk=old_sample.pk).exists()

"""A partition made again while a drain's run is going on (its owner died mid-run and the
operator's recreate became the next owner): the run checks each partition's incarnation
after every reserve, before it plans what to send, so the take is given back and the run
fails instead of subtracting the older incarnation's ranges from the new events
(channel_engine/incarnations.changed_since). Unit level: the channel's incarnations are
made to change between the run's start check and its reserve; no broker, no Spark."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kafka_sink_helpers import new_channel, put_events, run_async

from channel_engine import Channel, ChannelConfig
from channel_engine.errors import ExportError, SinkError
from channel_engine.incarnations import PartitionIncarnation, changed_since
from channel_engine.kafka_sink.settings import SinkSettings
from channel_engine.kafka_sink.sink import KafkaSink
from channel_engine.spark import exporter as exporter_module
from channel_engine.spark.export_settings import ExportSettings

NEW = "ab" * 16


def _recreate_after_first_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """Channel.incarnations() says what the disk says the first time, then partition 0
    made again at offset 3 (what a recreate during the run leaves)."""
    real = Channel.incarnations
    looks = []

    def incarnations(channel: Channel) -> list[PartitionIncarnation]:
        found = real(channel)
        looks.append(found)
        if len(looks) == 1:
            return found
        return [replace(p, incarnation=NEW, start_offset=3) if p.partition == 0 else p
                for p in found]
    monkeypatch.setattr(Channel, "incarnations", incarnations)


def _untaken(config: ChannelConfig, subscription: str) -> int:
    with Channel.open(config) as channel:
        return int(channel.status()["subscriptions"][subscription]["events_untaken"])


def test_it_names_a_partition_made_again_during_the_run() -> None:
    checked = [PartitionIncarnation(0, "original", 0, 10), PartitionIncarnation(1, NEW, 5, 9)]
    assert changed_since("orders", checked, checked, "export") is None
    now = [checked[0], PartitionIncarnation(1, "cd" * 16, 9, 9)]
    told = changed_since("orders", checked, now, "export")
    assert told is not None
    assert "channel 'orders': partition 1 (now starting at offset 9) was recreated" in told
    assert "nothing of it was sent" in told


def test_the_kafka_sink_gives_its_take_back_when_a_partition_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = new_channel(tmp_path)
    put_events(config, 0, 20)
    sink = KafkaSink(SinkSettings(home=str(config.home), bootstrap="127.0.0.1:9",
                                  topic="orders"), lambda line, data: None)
    _recreate_after_first_look(monkeypatch)
    with Channel.open(config) as channel:
        sink._ensure_subscription(channel)
        sink._check_incarnations(channel)  # step 3: fine, nothing recorded
        with pytest.raises(SinkError, match="partition 0 .now starting at offset 3. was "
                                            "recreated while the Kafka sink run"):
            run_async(lambda: sink._transaction(channel))  # a browser test's loop may run
    assert sink.counts["skipped"] == 0
    assert _untaken(config, sink.settings.subscription) == 20  # the take was given back


class _NoDfs:
    """Stands in for HDFS: the run must fail before it reads or writes the output."""

    def __init__(self, spark: Any, base_uri: str) -> None:
        self.base_uri = base_uri

    def join(self, *parts: str) -> str:
        return "/".join((self.base_uri, *parts))


def test_the_export_gives_its_take_back_when_a_partition_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = new_channel(tmp_path)
    put_events(config, 0, 20)
    monkeypatch.setattr(exporter_module, "Dfs", _NoDfs)
    monkeypatch.setattr(exporter_module.Exporter, "recover", lambda self: {})
    spark = SimpleNamespace(sparkContext=SimpleNamespace(master="local[1]"))
    settings = ExportSettings(home=str(config.home), output=f"file://{tmp_path}/out")
    export = exporter_module.Exporter(spark, settings, progress=lambda line: None)
    _recreate_after_first_look(monkeypatch)
    with pytest.raises(ExportError, match="partition 0 .now starting at offset 3. was "
                                          "recreated while the export run"):
        export.run()
    assert export.report["outcome"] == "failed"
    assert _untaken(config, settings.subscription) == 20

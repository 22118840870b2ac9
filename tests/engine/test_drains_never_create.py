"""The drains (HDFS export, Kafka sink) and `channel_engine produce` never make a channel:
their open (create=False) of a channel whose files are missing fails with
StorageMissingError naming the paths, and makes nothing where the files belong (a volume
not mounted would get an empty channel on the root filesystem, hidden once it is back)."""
from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka_sink_helpers import new_channel, put_events, run_async

from channel_engine import Channel, ChannelConfig, ChannelGoneError, StorageMissingError
from channel_engine.tools import cli


def _lose_partition(tmp_path: Path) -> tuple[ChannelConfig, Path]:
    """A channel with events whose partition 1 directory is gone (its volume, say)."""
    config = new_channel(tmp_path)
    put_events(config, 0, 10)
    lost = config.partition_dir(1)
    shutil.rmtree(lost)
    return config, lost


def test_it_refuses_an_open_without_create_naming_what_is_missing(tmp_path: Path) -> None:
    config, lost = _lose_partition(tmp_path)
    with pytest.raises(StorageMissingError) as caught:
        Channel.open(config.home, create=False)
    assert caught.value.paths == [str(lost)]
    assert isinstance(caught.value, ChannelGoneError)  # callers that knew that one still do
    assert str(lost) in str(caught.value) and "storage is missing" in str(caught.value)
    assert not lost.exists()


def test_the_kafka_sink_fails_and_makes_nothing(tmp_path: Path) -> None:
    from channel_engine.kafka_sink.job import parse
    from channel_engine.kafka_sink.sink import KafkaSink

    config, lost = _lose_partition(tmp_path)
    sink = KafkaSink(parse(["--home", str(config.home), "--bootstrap", "127.0.0.1:9",
                            "--topic", "orders"]), lambda line, committed: None)
    with pytest.raises(StorageMissingError):
        run_async(sink.run)
    assert str(lost) in sink.error
    assert not lost.exists()


class _Untouched:
    """The export's output: this test's export must fail before it is touched."""

    root = "file:///untouched"  # what the exporter keeps of the layout when made

    def __init__(self, *args: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the output was touched ({name}) by an export of a channel "
                             "whose files are missing")


def test_the_hdfs_export_fails_before_touching_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from channel_engine.spark import exporter
    from channel_engine.spark.export_settings import ExportSettings

    config, lost = _lose_partition(tmp_path)
    for name in ("Dfs", "OutputLayout", "CommitRecords"):  # no Spark: the open comes first
        monkeypatch.setattr(exporter, name, _Untouched)
    job = exporter.Exporter(None, ExportSettings(str(config.home), str(tmp_path / "out")))
    with pytest.raises(StorageMissingError):
        job.run()
    assert not lost.exists()


def test_channel_engine_produce_makes_no_channel(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config, lost = _lose_partition(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["produce", str(config.home)]) != 0
    assert "storage is missing" in err.getvalue()
    assert not lost.exists()

"""The export never skips events because a recreated partition reused offsets it had sent
(channel_engine/incarnations.py): a partition directory that vanished after the export
sent its events, while the channel's checkpoint is older, is recreated at the checkpoint's
end; the next run refuses, taking and writing nothing, and names the way out, which
works."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_export import event, export_here, exported, output_uri, put_events, untaken

from channel_engine import Channel, ChannelConfig
from channel_engine.errors import ExportError
from channel_engine.spark import commit_records


def sent_beyond_an_old_checkpoint(tmp_path: Path, spark: Any, output: str) -> ChannelConfig:
    """A one-partition channel: 40 events exported, the home copied then (its checkpoint at
    40), 60 more exported; then its partition directory vanishes and the home comes back
    as copied (the owner died before a checkpoint recorded the end, 100)."""
    config = ChannelConfig("orders", [str(tmp_path / "data")], str(tmp_path / "home"),
                           partitions=1, minimum_required_space=0)
    with Channel.open(config) as channel:
        put_events(channel, 0, 40)
    assert export_here(spark, config, output)["rows"] == 40
    shutil.copytree(tmp_path / "home", tmp_path / "home-then")
    with Channel.open(config) as channel:
        put_events(channel, 40, 100)
    assert export_here(spark, config, output)["rows"] == 60
    shutil.rmtree(config.partition_dir(0))
    shutil.rmtree(tmp_path / "home")
    shutil.move(tmp_path / "home-then", tmp_path / "home")
    return config


def test_a_recreated_partition_whose_offsets_were_exported_is_refused_then_resumed(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_records, "COMPACT_AFTER", 2)  # the last runs compact
    output = output_uri(tmp_path)
    config = sent_beyond_an_old_checkpoint(tmp_path, spark, output)
    with Channel.open(config, existed=True) as channel:  # the operator's recreate
        assert channel.incarnations()[0].start_offset == 40  # the checkpoint's end
        put_events(channel, 100, 110)  # new events at offsets 40..49, already "sent"
    with pytest.raises(ExportError) as refused:
        export_here(spark, config, output)
    message = str(refused.value)
    for told in ("channel 'orders' partition 0", "starting at offset 40",
                 "offsets up to 99", "nothing was taken or written",
                 "manage.py recreate_channel orders --yes --next-offset 0:100"):
        assert told in message, message
    assert untaken(config) == 10  # nothing taken: none skipped as "already sent"
    assert len(exported(spark, output)) == 100

    # the way out the message names: the directory aside, recreated above what was sent
    # (a recreate without the next offset would go on at 50, the checkpoint's end now)
    shutil.move(config.partition_dir(0), tmp_path / "orders-0-aside")
    with Channel.open(config, existed=True, next_offsets={0: 100}) as channel:
        assert channel.incarnations()[0].start_offset == 100
        put_events(channel, 200, 230)
    report = export_here(spark, config, output)
    assert report["rows"] == 30 and report["partitions"][0]["skipped"] == []
    rows = exported(spark, output)
    assert sorted(r[1] for r in rows) == list(range(100)) + list(range(100, 130))
    assert sorted(r[5] for r in rows if r[1] >= 100) == sorted(
        event(i)[3] for i in range(200, 230))
    with Channel.open(config) as channel:
        new = channel.incarnations()[0].incarnation
        put_events(channel, 300, 305)
    assert export_here(spark, config, output)["rows"] == 5  # and the next runs go on
    # the records, folded into one summary, keep the partition's incarnation
    commits = tmp_path / "out" / "orders" / "_weir" / "commits"
    [summary] = [json.loads(p.read_text()) for p in commits.glob("*.summary.json")]
    assert summary["ranges"] == {"0": [[0, 130]]} and summary["incarnations"] == {"0": new}
    with Channel.open(config) as channel:
        put_events(channel, 305, 310)
    assert export_here(spark, config, output)["rows"] == 5

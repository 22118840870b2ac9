"""The Kafka sink never skips events because a recreated partition reused offsets it had
sent (channel_engine/incarnations.py), against the run's real Kafka broker: a partition
directory that vanished after the sink sent its events, while the channel's checkpoint is
older, is recreated at the checkpoint's end; the next run refuses, taking and sending
nothing, and names the way out, which works."""
from __future__ import annotations

import shutil
from pathlib import Path

from kafka_sink_helpers import event_fields, new_topic, put_events, read_topic, run_sink

from channel_engine import Channel, ChannelConfig


def untaken(config: ChannelConfig) -> int:
    with Channel.open(config) as channel:
        return int(channel.status()["subscriptions"]["kafka"]["events_untaken"])


def test_a_recreated_partition_whose_offsets_were_sent_is_refused_then_resumed(
        tmp_path: Path, kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap
    config = ChannelConfig(name="orders", checkpoint_dir=str(tmp_path / "home"),
                           data_dirs=[str(tmp_path / "data")], partitions=1)
    topic = new_topic(bootstrap, partitions=1)
    put_events(config, 0, 40)
    assert run_sink(config, bootstrap, topic).report["events"] == 40
    shutil.copytree(tmp_path / "home", tmp_path / "home-then")  # its checkpoint at 40
    put_events(config, 40, 60)
    assert run_sink(config, bootstrap, topic).report["events"] == 60
    # the partition's directory vanishes; the owner had died before a checkpoint said 100
    shutil.rmtree(config.partition_dir(0))
    shutil.rmtree(tmp_path / "home")
    shutil.move(tmp_path / "home-then", tmp_path / "home")
    with Channel.open(config, existed=True) as channel:  # the operator's recreate
        assert channel.incarnations()[0].start_offset == 40
    put_events(config, 100, 10)  # new events at offsets 40..49, already "sent"

    refused = run_sink(config, bootstrap, topic)
    assert refused.returncode == 1, refused.output
    for told in ("channel 'orders' partition 0", "starting at offset 40",
                 "offsets up to 99", "nothing was taken or written",
                 "manage.py recreate_channel orders --yes --next-offset 0:100"):
        assert told in refused.error, refused.error
    assert untaken(config) == 10  # nothing taken: none skipped as "already sent"
    assert len(read_topic(bootstrap, topic)[0]) == 100

    # the way out the message names: the directory aside, recreated above what was sent
    shutil.move(config.partition_dir(0), tmp_path / "orders-0-aside")
    with Channel.open(config, existed=True, next_offsets={0: 100}) as channel:
        assert channel.incarnations()[0].start_offset == 100
    put_events(config, 200, 30)
    resumed = run_sink(config, bootstrap, topic)
    assert resumed.returncode == 0, resumed.output
    assert resumed.report["events"] == 30 and resumed.report["skipped"] == 0
    records = read_topic(bootstrap, topic)[0]
    assert len(records) == 130
    assert [r[1] for r in records[100:]] == [event_fields(i)["body"] for i in range(200, 230)]


def test_a_channel_restored_from_an_older_copy_is_refused(tmp_path: Path, kafka_broker) -> None:
    """No recreate, the same (original) storage, but its files went back: a copy taken
    when the log ended at 40 is restored after the sink sent up to 100."""
    bootstrap = kafka_broker.bootstrap
    config = ChannelConfig(name="orders", checkpoint_dir=str(tmp_path / "home"),
                           data_dirs=[str(tmp_path / "data")], partitions=1)
    topic = new_topic(bootstrap, partitions=1)
    put_events(config, 0, 40)
    assert run_sink(config, bootstrap, topic).report["events"] == 40
    for place in ("home", "data"):
        shutil.copytree(tmp_path / place, tmp_path / f"{place}-then")
    put_events(config, 40, 60)
    assert run_sink(config, bootstrap, topic).report["events"] == 60
    for place in ("home", "data"):  # the operator restores the older backup
        shutil.rmtree(tmp_path / place)
        shutil.move(tmp_path / f"{place}-then", tmp_path / place)
    put_events(config, 100, 10)  # at offsets 40..49 again

    refused = run_sink(config, bootstrap, topic)
    assert refused.returncode == 1, refused.output
    for told in ("the Kafka sink had sent offsets up to 99", "now ends at offset 50",
                 "--next-offset 0:100"):
        assert told in refused.error, refused.error
    assert untaken(config) == 10
    assert len(read_topic(bootstrap, topic)[0]) == 100

"""The "weir" Spark data source against real Spark (local mode): every field of every event
comes back exactly, ranges are fixed and repeatable, the owner may be writing meanwhile,
encrypted channels read back plain, and a range the log cannot supply fails the job."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from channel_engine import Channel, ChannelConfig, ConfigError, PartitionLog, PendingEvent
from channel_engine.encryption import KeyRing
from channel_engine.spark.source import plan

BASE_MS = 1_790_000_000_000
Row = tuple[str, int, int, int, bytes | None, dict[str, bytes], bytes]


def make_config(tmp_path: Path, **settings: Any) -> ChannelConfig:
    settings.setdefault("partitions", 3)
    return ChannelConfig("t", (str(tmp_path / "data"),), str(tmp_path / "home"),
                         minimum_required_space=0, segment_bytes=4096, **settings)


def event(i: int) -> PendingEvent:
    """Event i: some without a key or with an empty one, some without headers, bodies of
    varied length."""
    key = None if i % 5 == 0 else b"" if i % 5 == 1 else f"key-{i % 13}".encode()
    headers = [{}, {"n": str(i).encode()}, {"n": str(i).encode(), "empty": b"", "é": b"\x00"}]
    return PendingEvent(f"body-{i}:".encode() + bytes([i % 256]) * (i % 90), key,
                        headers[i % 3], BASE_MS + i * 7)


def put(channel: Channel, events: list[PendingEvent], per_put: int = 25) -> None:
    for first in range(0, len(events), per_put):
        with channel.put() as tx:
            for e in events[first:first + per_put]:
                tx.put(e.body, key=e.key, headers=e.headers, timestamp=e.timestamp)


def log_bounds(config: ChannelConfig) -> list[tuple[int, int]]:
    """(log start, log end) of each partition, as a reader sees them now."""
    bounds = []
    for p in range(config.partitions):
        with PartitionLog.open(config.partition_dir(p), config.log_config(), partition=p,
                               read_only=True) as log:
            bounds.append((log.log_start_offset, log.log_end_offset))
    return bounds


def load(spark: Any, config: ChannelConfig, ranges: dict[str, list[int]],
         **options: str) -> Any:
    reader = spark.read.format("weir").option("home", str(config.home))
    for name, value in {"ranges": json.dumps(ranges), **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def rows(frame: Any) -> list[Row]:
    """A DataFrame's (or collected) rows as plain tuples, sorted."""
    collected = frame if isinstance(frame, list) else frame.collect()
    return sorted((r.channel, r.partition, r.offset, r.timestamp,
                   None if r.key is None else bytes(r.key),
                   {k: bytes(v) for k, v in r.headers.items()}, bytes(r.body))
                  for r in collected)


def whole(config: ChannelConfig) -> dict[str, list[int]]:
    return {str(p): [start, end] for p, (start, end) in enumerate(log_bounds(config))}


def test_it_returns_every_field_of_every_event_over_many_segments_and_splits(
        spark: Any, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    put_events = [event(i) for i in range(600)]
    with Channel.open(config) as channel:
        put(channel, put_events)
    for p in range(3):
        assert len(list(config.partition_dir(p).glob("*.log"))) > 3  # many small segments
    ranges = whole(config)
    assert all(end > 100 for _, end in ranges.values())
    frame = load(spark, config, ranges, max_rows_per_split="70")

    collected = frame.selectExpr("*", "spark_partition_id() AS task").collect()
    got = rows(collected)
    by_body = {e.body: e for e in put_events}
    assert len(got) == len(put_events) == len(by_body)
    for channel_name, _partition, _offset, timestamp, key, headers, body in got:
        sent = by_body.pop(body)
        assert (channel_name, timestamp, key, headers) == (
            "t", sent.timestamp, sent.key, sent.headers)
    for name, (start, end) in ranges.items():
        assert [r[2] for r in got if r[1] == int(name)] == list(range(start, end))
    splits = plan({"home": str(config.home), "ranges": json.dumps(ranges),
                   "max_rows_per_split": "70"})
    assert len(splits) >= 3 * 3 and all(s.end - s.start <= 70 for s in splits)
    assert len({r.task for r in collected}) == len(splits)  # one Spark task per split


def test_a_range_returns_exactly_that_range_and_again_on_a_reread(
        spark: Any, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel:
        put(channel, [event(i) for i in range(300)])
    ranges = {"0": [5, 17], "1": [4, 4], "2": [0, 3]}
    frame = load(spark, config, ranges, max_rows_per_split="5")

    first = rows(frame)
    assert [(r[1], r[2]) for r in first] == [(0, o) for o in range(5, 17)] + [
        (2, o) for o in range(0, 3)]
    assert rows(frame) == first
    assert rows(load(spark, config, ranges)) == first  # however it is split


def test_it_reads_while_the_owner_has_the_channel_open_and_appends(
        spark: Any, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel:
        put(channel, [event(i) for i in range(150)])
        ranges = whole(config)
        stop = threading.Event()

        def keep_putting() -> None:
            i = 1000
            while not stop.is_set():
                put(channel, [event(i)], per_put=1)
                i += 1

        writer = threading.Thread(target=keep_putting)
        writer.start()
        try:
            got = rows(load(spark, config, ranges, max_rows_per_split="20"))
        finally:
            stop.set()
            writer.join()
        assert len(got) == 150
        assert rows(load(spark, config, ranges)) == got  # the appends do not leak in
        later = {p: [end, log_bounds(config)[int(p)][1]] for p, (_, end) in ranges.items()}
        assert sum(end - start for start, end in later.values()) > 0
        new = rows(load(spark, config, later))
        assert len(new) == sum(end - start for start, end in later.values())


def test_an_encrypted_channel_reads_back_plain(spark: Any, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    KeyRing.write_new(keys, ["k1"])
    config = make_config(tmp_path, encryption_key_file=str(keys), encryption_active_key="k1")
    put_events = [event(i) for i in range(60)]
    with Channel.open(config) as channel:
        put(channel, put_events)
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*.log"))
    assert b"body-7:" not in on_disk

    got = rows(load(spark, config, whole(config)))
    assert sorted((r[6], r[4], r[5], r[3]) for r in got) == sorted(
        (e.body, e.key, e.headers, e.timestamp) for e in put_events)


def test_a_range_past_the_log_end_fails_the_job_naming_it(spark: Any, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with Channel.open(config) as channel:
        put(channel, [event(i) for i in range(90)])
    end = log_bounds(config)[1][1]
    frame = load(spark, config, {"0": [0, 2], "1": [0, end + 1]})
    with pytest.raises(Exception, match=rf"partition 1: cannot read offsets \[0, {end + 1}\): "
                                        rf"the log holds \[0, {end}\)"):
        frame.collect()


def test_a_range_below_the_log_start_fails_the_job_naming_it(
        spark: Any, tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        put(channel, [event(i) for i in range(300)])
        while True:
            with channel.take() as tx:
                if not tx.take(100):
                    break
        assert channel.checkpoint().segments_deleted > 0
        put(channel, [event(i) for i in range(300, 310)])
    [(start, end)] = log_bounds(config)
    assert start > 0

    with pytest.raises(Exception, match=rf"partition 0: cannot read offsets "
                                        rf"\[{start - 1}, {end}\): the log holds \[{start}, "):
        load(spark, config, {"0": [start - 1, end]}).collect()
    assert len(rows(load(spark, config, {"0": [start, end]}))) == end - start


BAD_OPTIONS = [
    ({"ranges": '{"0": [0, 1]}'}, "option home: is required"),
    ({"home": "/nonexistent/weir", "ranges": '{"0": [0, 1]}'}, "no channel config here"),
    ({"home": "{home}"}, "option ranges: is required"),
    ({"home": "{home}", "ranges": '{"0": [0, 1]'}, "option ranges: not valid JSON"),
    ({"home": "{home}", "ranges": "[[0, 1]]"}, "option ranges: must be a non-empty JSON"),
    ({"home": "{home}", "ranges": "{}"}, "option ranges: must be a non-empty JSON"),
    ({"home": "{home}", "ranges": '{"0": [2, 1]}'}, r"partition 0: \[2, 1\] is not \[start"),
    ({"home": "{home}", "ranges": '{"0": [0, 1.5]}'}, r"partition 0: \[0, 1.5\] is not"),
    ({"home": "{home}", "ranges": '{"01": [0, 1]}'}, "partition '01' does not exist"),
    ({"home": "{home}", "ranges": '{"3": [0, 1]}'},
     r"partition '3' does not exist: channel 't' has partitions 0\.\.2"),
    ({"home": "{home}", "ranges": '{"0": [0, 1]}', "max_rows_per_split": "0"},
     "option max_rows_per_split: must be a positive integer"),
    ({"home": "{home}", "ranges": '{"0": [0, 1]}', "max_rows_per_split": "many"},
     "option max_rows_per_split: must be a positive integer"),
    ({"home": "{home}", "ranges": '{"0": [0, 1]}', "columns": "text"},
     "option columns: must be one of events, readable, not 'text'"),
]


def with_home(options: dict[str, str], config: ChannelConfig) -> dict[str, str]:
    return {name: value.replace("{home}", str(config.home)) for name, value in options.items()}


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_bad_options_are_refused_naming_the_option(tmp_path: Path, options: dict[str, str],
                                                   message: str) -> None:
    config = make_config(tmp_path)
    config.save()
    with pytest.raises(ConfigError, match=message):
        plan(with_home(options, config))


@pytest.mark.parametrize(("options", "message"), [BAD_OPTIONS[0], BAD_OPTIONS[3], BAD_OPTIONS[9]])
def test_bad_options_fail_the_spark_load_with_that_message(
        spark: Any, tmp_path: Path, options: dict[str, str], message: str) -> None:
    config = make_config(tmp_path)
    config.save()
    reader = spark.read.format("weir")
    for name, value in with_home(options, config).items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=message):
        reader.load()


def test_ranges_are_cut_into_equal_contiguous_splits(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config.save()
    splits = plan({"home": str(config.home), "max_rows_per_split": "4",
                   "ranges": '{"2": [10, 20], "0": [3, 3]}'})
    assert [(s.partition, s.start, s.end) for s in splits] == [
        (0, 3, 3), (2, 10, 13), (2, 13, 16), (2, 16, 20)]
    assert splits[1].directory == str(config.partition_dir(2))


def tricky_event(i: int) -> PendingEvent:
    """Event i: keys, header values and bodies that are text (ASCII or not), bytes that are
    not UTF-8 (at UTF-8's edges too), empty, or absent."""
    values = [b"text", "é日本𝄞".encode(), b"\xff\xfe", b"", b"\xed\xa0\x80", b"\xf4\x8f\xbf\xbf",
              b"ascii then \xc3", b"\xc0\x80"]
    key = None if i % 9 == 0 else values[i % len(values)]
    headers = [{}, {"t": values[i % 8], "n": None},
               {"a": values[(i + 1) % 8], "b": values[(i + 2) % 8]}]
    return PendingEvent(values[(i + 3) % len(values)] * (1 + i % 3), key, headers[i % 3],
                        BASE_MS + i)


def test_the_readable_columns_split_as_the_sql_split_of_the_events_columns(
        spark: Any, tmp_path: Path) -> None:
    from channel_engine.spark.file_formats import columns, readable

    config = make_config(tmp_path)
    with Channel.open(config) as channel:
        put(channel, [tricky_event(i) for i in range(400)])
    ranges = whole(config)
    sql_frame = readable(load(spark, config, ranges))
    read_frame = columns(load(spark, config, ranges, columns="readable"), 2)
    assert read_frame.schema == sql_frame.schema  # nullability too: the files' schema
    by_sql, as_read = sql_frame.collect(), read_frame.collect()
    assert len(as_read) == 400
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(as_read, key=key) == sorted(by_sql, key=key)
    assert any(r.body_bytes is not None for r in as_read)
    assert any(r.headers_bytes for r in as_read) and any(r.key is not None for r in as_read)


def test_a_schema_given_that_is_not_the_columns_own_is_refused(
        spark: Any, tmp_path: Path) -> None:
    from channel_engine.spark.source import SCHEMA

    config = make_config(tmp_path)
    config.save()
    reader = spark.read.format("weir").schema(SCHEMA).option("home", str(config.home)) \
        .option("ranges", '{"0": [0, 0]}').option("columns", "readable")
    with pytest.raises(Exception, match="schema: a schema given must be the one of option "
                                         "columns=readable"):
        reader.load().collect()

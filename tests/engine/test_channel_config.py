"""ChannelConfig: defaults, checks naming the field, the partition layout, channel.json."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channel_engine import Channel, ConfigError, LogConfig
from channel_engine.queue.channel_config import (
    CONFIG_FILE,
    LOG_SETTINGS,
    ChannelConfig,
    settings_crc,
)


def config(tmp_path: Path, **settings: Any) -> ChannelConfig:
    return ChannelConfig("orders", [str(tmp_path / "d1"), str(tmp_path / "d2")],
                         str(tmp_path / "home"), **settings)


def test_it_has_flume_defaults_and_keeps_untaken_events(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert (c.capacity, c.transaction_capacity, c.keep_alive_ms) == (1_000_000, 10_000, 3_000)
    assert (c.minimum_required_space, c.checkpoint_interval_ms) == (524_288_000, 30_000)
    assert c.durability == "fsync" and c.retention_ms == -1 and c.retention_bytes == -1
    assert c.log_config().retention_ms == -1


@pytest.mark.parametrize(("field", "value"), [
    ("name", "Orders"), ("name", "-x"), ("name", ""), ("name", "a/b"), ("name", "orders\n"),
    ("data_dirs", []), ("data_dirs", ["relative/dir"]), ("data_dirs", ["/a", "/a"]),
    ("checkpoint_dir", "cp"),
    ("partitions", 0), ("partitions", "2"), ("partitions", True),
    ("capacity", 0), ("transaction_capacity", 0), ("transaction_capacity", 2_000_000),
    ("keep_alive_ms", -1), ("minimum_required_space", -5), ("checkpoint_interval_ms", 10),
    ("checkpoint_on_close", "yes"), ("use_dual_checkpoints", 1),
    ("durability", "sometimes"), ("segment_bytes", 10), ("compression", "brotli"),
    ("retention_ms", -2), ("encryption_active_key", "k1"), ("encryption_key_file", "keys"),
])
def test_it_refuses_a_bad_value_naming_the_field(tmp_path: Path, field: str,
                                                 value: object) -> None:
    base = config(tmp_path).to_dict()
    base[field] = value
    with pytest.raises(ConfigError) as caught:
        ChannelConfig(**base)
    assert caught.value.field == field


def test_it_needs_a_distinct_backup_dir_for_dual_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="backup_checkpoint_dir"):
        config(tmp_path, use_dual_checkpoints=True)
    with pytest.raises(ConfigError, match="must differ"):
        config(tmp_path, use_dual_checkpoints=True, backup_checkpoint_dir=str(tmp_path / "home"))
    assert config(tmp_path, use_dual_checkpoints=True,
                  backup_checkpoint_dir=str(tmp_path / "backup")).use_dual_checkpoints


def test_policy_durability_needs_a_flush_policy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, durability="policy")
    assert caught.value.field == "durability"
    assert config(tmp_path, durability="policy", flush_ms=100).log_config().flush_ms == 100


def test_it_spreads_partitions_round_robin_over_data_dirs(tmp_path: Path) -> None:
    c = config(tmp_path, partitions=3)
    assert [c.partition_dir(i) for i in range(3)] == [
        tmp_path / "d1" / "orders-0", tmp_path / "d2" / "orders-1", tmp_path / "d1" / "orders-2"]


def test_it_hands_the_log_settings_to_each_partition(tmp_path: Path) -> None:
    c = config(tmp_path, segment_bytes=1 << 20, compression="zstd", preallocate=True,
               durability="policy", flush_messages=500)
    log = c.log_config()
    assert (log.segment_bytes, log.compression, log.preallocate) == (1 << 20, "zstd", True)
    assert (log.durability, log.flush_messages) == ("policy", 500)


def test_it_saves_and_loads_channel_json(tmp_path: Path) -> None:
    c = config(tmp_path, partitions=4, capacity=5_000, transaction_capacity=100)
    path = c.save()
    assert path == tmp_path / "home" / CONFIG_FILE
    document = json.loads(path.read_text())
    assert document["format"] == "weir-channel-config" and document["version"] == 2
    assert ChannelConfig.load(tmp_path / "home") == c
    assert ChannelConfig.load(path) == c


@pytest.mark.parametrize(("content", "field", "words"), [
    (None, "home", "no channel config"),
    ("{not json", "home", "not valid JSON"),
    ('{"format": "other"}', "home", "not a Weir channel config"),
    ('{"format": "weir-channel-config", "version": 9}', "version", "not supported"),
])
def test_it_refuses_a_bad_channel_json(tmp_path: Path, content: str | None, field: str,
                                       words: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if content is not None:
        (home / CONFIG_FILE).write_text(content)
    with pytest.raises(ConfigError, match=words) as caught:
        ChannelConfig.load(home)
    assert caught.value.field == field


@pytest.mark.parametrize(("damage", "words"), [
    (lambda data: data[:40], r"not valid JSON \(byte 39: Unterminated string"),
    (lambda data: data[:10] + b"\xff" + data[11:], "byte 10 is not UTF-8"),
    (lambda data: data.replace(b'"name"', b'"nome"'), "unknown setting"),
    (lambda data: data.replace(b'"partitions": 1', b'"partitions": "x"'), "partitions"),
    (lambda data: data.replace(b'"data_dirs": [', b'"data_dirs": [7, '), "data_dirs"),
    (lambda data: b"[" * 100_000, "not valid JSON"),
])
def test_it_refuses_a_damaged_channel_json_naming_the_file(
        tmp_path: Path, damage: Any, words: str) -> None:
    path = config(tmp_path).save()
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ConfigError, match=words) as caught:
        ChannelConfig.load(path.parent)
    assert str(path) in str(caught.value)


def test_it_refuses_a_directory_in_place_of_channel_json(tmp_path: Path) -> None:
    (tmp_path / "home" / CONFIG_FILE).mkdir(parents=True)
    with pytest.raises(ConfigError, match="cannot be read"):
        ChannelConfig.load(tmp_path / "home")


def test_it_builds_a_config_from_a_plain_object_of_settings(tmp_path: Path) -> None:
    c = config(tmp_path, capacity=10, transaction_capacity=5)
    settings = c.to_dict()
    assert ChannelConfig.from_document(settings, "supplied.json") == c
    del settings["checkpoint_dir"]
    with pytest.raises(ConfigError, match="supplied.json: required setting missing") as caught:
        ChannelConfig.from_document(settings, "supplied.json")
    assert caught.value.field == "checkpoint_dir"


def test_it_refuses_an_unknown_setting_in_channel_json(tmp_path: Path) -> None:
    path = config(tmp_path).save()
    document = json.loads(path.read_text())
    document["capacityy"] = 5
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as caught:
        ChannelConfig.load(path)
    assert caught.value.field == "capacityy"


@pytest.mark.parametrize(("change", "words"), [
    ({"checkpoint_dir": None}, "required setting missing"),  # None: the setting is removed
    ({"data_dirs": 5}, "not a valid channel config"),
    ({"data_dirs": [5]}, "must be an absolute path"),
])
def test_it_refuses_a_channel_json_with_a_setting_missing_or_mistyped(
        tmp_path: Path, change: dict[str, Any], words: str) -> None:
    path = config(tmp_path).save()
    document = json.loads(path.read_text())
    for name, value in change.items():
        if value is None:
            del document[name]
        else:
            document[name] = value
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=words):
        ChannelConfig.load(path)


def test_every_setting_has_a_doc() -> None:
    docs = ChannelConfig.docs()
    assert set(docs) == {f.name for f in dataclasses.fields(ChannelConfig)}
    assert all(len(text) > 20 for text in docs.values())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.binary(min_size=0, max_size=6))
def test_load_of_a_mutated_channel_json_raises_only_config_errors(at: int,
                                                                  patch: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = config(Path(directory), partitions=3).save()
        data = path.read_bytes()
        path.write_bytes(data[:at] + patch + data[at + len(patch):])
        try:
            ChannelConfig.load(path)
        except ConfigError as exc:
            assert str(path) in str(exc)


def test_it_saves_a_crc32c_of_the_settings_and_refuses_a_changed_setting(
        tmp_path: Path) -> None:
    path = config(tmp_path, partitions=4).save()
    document = json.loads(path.read_text())
    assert document["crc32c"] == settings_crc(config(tmp_path, partitions=4).to_dict())
    # one flipped bit in a data dir: still a valid config, silently another directory
    data = path.read_bytes()
    at = data.index(b'/d1"') + 2
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x02]) + data[at + 1:])
    assert json.loads(path.read_text())["data_dirs"][0].endswith("/d3")
    with pytest.raises(ConfigError, match="do not match the stored crc32c") as caught:
        ChannelConfig.load(path.parent)
    assert str(path) in str(caught.value) and caught.value.field == "crc32c"


def test_a_version_2_channel_json_needs_its_crc32c(tmp_path: Path) -> None:
    path = config(tmp_path).save()
    document = json.loads(path.read_text())
    del document["crc32c"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=f"{path}: no crc32c"):
        ChannelConfig.load(path)


def test_a_version_1_channel_json_without_crc32c_opens_and_gets_one_at_its_next_save(
        tmp_path: Path) -> None:
    c = config(tmp_path, capacity=500, transaction_capacity=50)
    path = c.save()
    document = json.loads(path.read_text())
    document["version"] = 1
    del document["crc32c"]
    path.write_text(json.dumps(document))
    assert ChannelConfig.load(path) == c
    Channel.open(path.parent).close()  # a writable open saves it again
    document = json.loads(path.read_text())
    assert document["version"] == 2 and document["crc32c"] == settings_crc(c.to_dict())


def test_a_plain_object_of_settings_needs_no_crc32c_but_a_wrong_one_is_refused(
        tmp_path: Path) -> None:
    settings = config(tmp_path).to_dict()
    assert ChannelConfig.from_document(settings, "supplied.json") == config(tmp_path)
    with pytest.raises(ConfigError, match="supplied.json: settings do not match"):
        ChannelConfig.from_document({**settings, "crc32c": 7}, "supplied.json")


def test_it_takes_the_log_settings_defaults_and_docs_from_log_config() -> None:
    log_fields = {f.name: f for f in dataclasses.fields(LogConfig)}
    for f in dataclasses.fields(ChannelConfig):
        if f.name in LOG_SETTINGS and not f.name.startswith("retention_"):  # a queue keeps
            assert f.default == log_fields[f.name].default, f.name       # events by default
            assert f.metadata["doc"] == log_fields[f.name].metadata["doc"], f.name

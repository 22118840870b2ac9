"""LogConfig: every setting defined once, with its default, its check and its doc."""
from __future__ import annotations

import dataclasses

import pytest

from channel_engine.errors import ConfigError
from channel_engine.log.config import LogConfig

INT_FIELDS = [
    "segment_bytes", "segment_ms", "segment_index_bytes", "index_interval_bytes",
    "max_batch_bytes", "retention_ms", "retention_bytes", "file_delete_delay_ms",
    "recovery_point_checkpoint_ms", "flush_messages", "flush_ms",
]


def refused(**settings):
    with pytest.raises(ConfigError) as info:
        LogConfig(**settings)
    return info.value


def test_it_has_valid_defaults():
    config = LogConfig()
    assert config.durability == "fsync"
    assert config.compression == "none"
    assert config.segment_bytes == 1024**3
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.preallocate is False


def test_it_accepts_a_policy_with_either_trigger():
    assert LogConfig(durability="policy", flush_messages=10).flush_ms is None
    assert LogConfig(durability="policy", flush_ms=1000).flush_messages is None


def test_it_accepts_the_boundaries():
    LogConfig(segment_bytes=4 * 61, retention_ms=-1, retention_bytes=-1,
              index_interval_bytes=0, file_delete_delay_ms=0, max_batch_bytes=61)
    LogConfig(segment_bytes=2**31 - 1)


@pytest.mark.parametrize("value", ["sync", "FSYNC", "", None, 1])
def test_it_refuses_an_unknown_durability(value):
    error = refused(durability=value)
    assert error.field == "durability"
    assert str(error).startswith("durability: ")


def test_it_refuses_a_policy_without_a_flush_trigger():
    error = refused(durability="policy")
    assert error.field == "durability"
    assert "flush_messages or flush_ms" in error.reason


@pytest.mark.parametrize("field", ["flush_messages", "flush_ms"])
@pytest.mark.parametrize("value", [0, -1])
def test_it_refuses_a_flush_trigger_below_one(field, value):
    assert refused(durability="policy", **{field: value}).field == field


@pytest.mark.parametrize("value", [0, 243, 2**31])
def test_it_refuses_a_segment_size_out_of_range(value):
    error = refused(segment_bytes=value)
    assert error.field == "segment_bytes"
    assert str(value) in error.reason


@pytest.mark.parametrize("value", ["lzma", "GZIP", "", None])
def test_it_refuses_an_unknown_compression(value):
    error = refused(compression=value)
    assert error.field == "compression"
    assert "none, gzip, snappy, lz4, zstd" in error.reason


@pytest.mark.parametrize("field", ["retention_ms", "retention_bytes"])
def test_it_refuses_a_retention_below_minus_one(field):
    assert refused(**{field: -2}).field == field


@pytest.mark.parametrize(
    "field, value",
    [("segment_ms", 0), ("segment_index_bytes", 47), ("index_interval_bytes", -1),
     ("max_batch_bytes", 60), ("max_batch_bytes", 2**31), ("file_delete_delay_ms", -1),
     ("recovery_point_checkpoint_ms", -1), ("segment_index_bytes", 2**31)],
)
def test_it_refuses_other_values_out_of_range(field, value):
    assert refused(**{field: value}).field == field


NON_INTEGERS = [
    (field, value)
    for field in INT_FIELDS
    for value in (True, False, "4096", 4096.0, None)
    # None is the documented "no trigger" value of the two flush settings
    if not (value is None and field in ("flush_messages", "flush_ms"))
]


@pytest.mark.parametrize("field, value", NON_INTEGERS)
def test_it_refuses_a_non_integer_in_an_integer_field(field, value):
    error = refused(**{field: value})
    assert error.field == field
    assert "integer" in error.reason


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_it_refuses_a_non_bool_preallocate(value):
    assert refused(preallocate=value).field == "preallocate"


def test_it_documents_every_field():
    docs = LogConfig.docs()
    names = [f.name for f in dataclasses.fields(LogConfig)]
    assert sorted(docs) == sorted(names)
    for name in names:
        assert isinstance(docs[name], str) and len(docs[name]) > 20, name


def test_it_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_bytes = 10  # type: ignore[misc]


def test_it_validates_a_replacement():
    config = LogConfig().replace(segment_bytes=4096, compression="zstd")
    assert (config.segment_bytes, config.compression) == (4096, "zstd")
    with pytest.raises(ConfigError) as info:
        config.replace(compression="brotli")
    assert info.value.field == "compression"


def test_it_serialises_to_a_plain_dict():
    config = LogConfig(durability="policy", flush_ms=500)
    data = config.to_dict()
    assert data["durability"] == "policy" and data["flush_ms"] == 500
    assert LogConfig(**data) == config

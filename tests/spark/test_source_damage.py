"""The "weir" source's reader on a damaged segment, without Spark: a split that holds a
damaged batch fails with DamagedRangeError naming the segment, the byte position and the
offsets, before any row past the damage is handed over (the export stays exactly-once:
never a garbled or partial batch, never a silent skip); splits beside it read whole."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from channel_engine import Channel, ChannelConfig
from channel_engine.errors import DamagedRangeError
from channel_engine.spark import source
from channel_engine.spark.source import plan, read_split
from channel_engine.tools.verify import scan_log_file

BATCHES, PER_BATCH = 12, 10


def damaged_channel(tmp_path: Path, batch: int, at: int = 80) -> tuple[ChannelConfig, Path,
                                                                        list[Any]]:
    """One partition of 12 batches of 10 events; flip a byte of batch `batch`; return the
    config, the segment and its (position, header) list."""
    config = ChannelConfig("t", (str(tmp_path / "data"),), str(tmp_path / "home"),
                           partitions=1, minimum_required_space=0)
    with Channel.open(config) as channel:
        for b in range(BATCHES):
            with channel.put() as tx:
                for i in range(PER_BATCH):
                    tx.put(f"batch {b} event {i} ".encode() * 3)
    [segment] = sorted(config.partition_dir(0).glob("*.log"))
    batches = scan_log_file(segment, None).batches
    data = bytearray(segment.read_bytes())
    data[batches[batch][0] + at] ^= 0x40
    segment.write_bytes(bytes(data))
    return config, segment, batches


def splits(config: ChannelConfig, start: int, end: int, **options: str) -> list[Any]:
    return plan({"home": str(config.home), "ranges": json.dumps({"0": [start, end]}),
                 **options})


def offsets_read(split: Any) -> list[int]:
    return [o for batch in read_split(split) for o in batch.column("offset").to_pylist()]


@pytest.mark.parametrize("seen", ["at open", "by the read"])
@pytest.mark.parametrize("where", ["records", "header"])
def test_a_split_over_a_damaged_batch_fails_naming_the_segment_and_byte(
    tmp_path: Path, where: str, seen: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, segment, batches = damaged_channel(tmp_path, 5, 80 if where == "records" else 16)
    monkeypatch.setattr(source, "ARROW_BATCH_ROWS", 1)  # hand over each batch at once
    [split] = splits(config, 0, BATCHES * PER_BATCH)
    if seen == "by the read":  # the open trusts the clean log's bytes (Kafka's way)
        split = replace(split, log_config=split.log_config.replace(verify_on_open=False))
    handed: list[int] = []
    with pytest.raises(DamagedRangeError) as info:
        for batch in read_split(split):
            handed += batch.column("offset").to_pylist()
    error = info.value
    assert (error.path, error.position) == (str(segment), batches[5][0])
    assert (error.lost.start, error.lost.end) == (50, 60)
    assert f"offsets 50..59 are in a damaged region of {segment} at byte {batches[5][0]}" \
        in str(error)
    # the intact batches before it, none past it (none at all when the open met it)
    assert handed == (list(range(50)) if seen == "by the read" else [])


def test_damage_in_the_last_batch_of_a_split_fails_it_too(tmp_path: Path) -> None:
    config, segment, batches = damaged_channel(tmp_path, BATCHES - 1)
    [split] = splits(config, 100, BATCHES * PER_BATCH)
    with pytest.raises(DamagedRangeError, match=f"offsets 110..119 are in a damaged region "
                                                f"of {segment} at byte {batches[-1][0]}"):
        offsets_read(split)


def test_the_splits_beside_a_damaged_batch_read_whole(tmp_path: Path) -> None:
    config, _segment, _batches = damaged_channel(tmp_path, 5)
    parts = splits(config, 0, BATCHES * PER_BATCH, split_align="50")
    assert [(s.start, s.end) for s in parts] == [(0, 50), (50, 100), (100, 120)]
    assert offsets_read(parts[0]) == list(range(50))
    assert offsets_read(parts[2]) == list(range(100, 120))
    with pytest.raises(DamagedRangeError):
        offsets_read(parts[1])

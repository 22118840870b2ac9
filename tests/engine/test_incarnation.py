"""A partition's incarnation (log/incarnation.py): the file's format, and a partition
directory made again by the operator's recreate getting a new one, starting where its
checkpoint's queue knew it ended, or at the operator's next offset."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
from channel_helpers import crash, make_config

from channel_engine import Channel, ChannelConfig
from channel_engine.errors import CorruptStateError
from channel_engine.filenames import INCARNATION_FILE
from channel_engine.incarnations import ORIGINAL
from channel_engine.log import incarnation as incarnation_file
from channel_engine.log.incarnation import Incarnation
from channel_engine.tools.verify import verify_partition

GOLDEN = Path(__file__).parent / "golden" / "incarnation-v1"


def test_it_reads_the_golden_file_of_version_1() -> None:
    found = incarnation_file.decode(GOLDEN.read_bytes(), GOLDEN)
    assert found == Incarnation("0123456789abcdef0123456789abcdef", 1234, False,
                                1795788300000)


def test_it_round_trips_a_pending_incarnation(tmp_path: Path) -> None:
    made = incarnation_file.begin(tmp_path)
    assert incarnation_file.read(tmp_path) == made and made.pending
    settled = incarnation_file.settle(tmp_path, made, 77)
    assert incarnation_file.read(tmp_path) == settled == Incarnation(made.id, 77, False,
                                                                        made.made_at_ms)


def test_a_directory_without_the_file_is_the_original_incarnation(tmp_path: Path) -> None:
    assert incarnation_file.read(tmp_path).id == ORIGINAL


@pytest.mark.parametrize("damage", ["crc", "magic", "version", "size"])
def test_a_damaged_file_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    data = bytearray(GOLDEN.read_bytes())
    if damage == "crc":
        data[20] ^= 1
    elif damage == "magic":
        data[0:4] = b"XXXX"
    elif damage == "version":
        data[4] = 9
    else:
        data = data[:-1]
    (tmp_path / INCARNATION_FILE).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match=INCARNATION_FILE):
        incarnation_file.read(tmp_path)


def test_a_file_with_an_unknown_flag_is_refused(tmp_path: Path) -> None:
    """Only bit 0 has a meaning: another set is a newer format, never read as this one."""
    data = bytearray(GOLDEN.read_bytes())
    data[5] |= 0x04
    body = bytes(data[:incarnation_file.BODY.size])
    crc = incarnation_file.CRC.pack(crc32c.crc32c(body))
    (tmp_path / INCARNATION_FILE).write_bytes(body + crc)
    with pytest.raises(CorruptStateError, match="unknown flags 0x0"):
        incarnation_file.read(tmp_path)


def _put(channel: Channel, count: int, tag: str) -> None:
    with channel.put() as tx:
        for i in range(count):
            tx.put(f"{tag}-{i}".encode(), key=str(i).encode())


def _partition(channel: Channel, p: int) -> dict[str, object]:
    return dict(channel.status()["partitions"][p])


def _vanished_after_old_checkpoint(tmp_path: Path) -> tuple[ChannelConfig, int, int]:
    """A channel whose partition 1 held events past its last checkpoint when its directory
    vanished and its owner died: (config, the checkpoint's end of p1, the real end)."""
    config = make_config(tmp_path, partitions=2)
    channel = Channel.open(config)
    _put(channel, 10, "old")
    channel.checkpoint()
    checkpointed = _partition(channel, 1)["log_end_offset"]
    _put(channel, 10, "later")
    real_end = _partition(channel, 1)["log_end_offset"]
    crash(channel)
    shutil.rmtree(config.partition_dir(1))
    assert isinstance(checkpointed, int) and isinstance(real_end, int)
    assert 0 < checkpointed < real_end
    return config, checkpointed, real_end


def test_original_partitions_have_no_file_and_report_original(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel:
        _put(channel, 4, "e")
        assert [(p.incarnation, p.start_offset) for p in channel.incarnations()] == [
            (ORIGINAL, 0), (ORIGINAL, 0)]
    with Channel.open(config) as channel:  # a reopen makes nothing either
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}
    assert not any((config.partition_dir(p) / INCARNATION_FILE).exists() for p in range(2))


def test_a_recreated_partition_is_a_new_incarnation_where_the_checkpoint_ended(
        tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as channel:  # the operator's recreate
        parts = channel.incarnations()
        assert parts[0].incarnation == ORIGINAL
        assert parts[1].incarnation != ORIGINAL and len(parts[1].incarnation) == 32
        assert parts[1].start_offset == checkpointed == parts[1].log_end_offset
        made = parts[1].incarnation
    saved = incarnation_file.read(config.partition_dir(1))
    assert (saved.id, saved.start_offset, saved.pending) == (made, checkpointed, False)
    with Channel.open(config) as channel:  # kept across opens
        assert channel.incarnations()[1].incarnation == made


def test_a_recreate_goes_on_at_the_operators_next_offset(tmp_path: Path) -> None:
    config, checkpointed, real_end = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True, next_offsets={1: real_end}) as channel:
        part = channel.incarnations()[1]
        assert part.start_offset == part.log_end_offset == real_end
        _put(channel, 10, "new")
        with channel.take() as tx:  # the queue holds the new events, none of the gap
            events = tx.take(1_000)
        offsets = sorted(e.offset for e in events if e.partition == 1)
        assert offsets and offsets[0] == real_end
        assert all(e.body.startswith(b"new-") for e in events if e.partition == 1)
        assert channel.status()["partitions"][1]["events_queued"] == 0
    with Channel.open(config) as channel:
        assert channel.incarnations()[1].start_offset == real_end
    assert checkpointed < real_end


def test_a_next_offset_below_the_checkpoint_end_changes_nothing(tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True, next_offsets={1: 1}) as channel:
        assert channel.incarnations()[1].start_offset == checkpointed


def test_a_recreate_cut_short_before_its_start_was_recorded_settles_at_the_next_open(
        tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    directory.mkdir(parents=True)
    pending = incarnation_file.begin(directory)  # as a crash right after it leaves it
    with Channel.open(config, existed=True) as channel:
        part = channel.incarnations()[1]
        assert (part.incarnation, part.start_offset) == (pending.id, checkpointed)


def test_a_grown_channels_new_partition_is_original(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        _put(channel, 3, "e")
    grown = make_config(tmp_path, partitions=2)
    with Channel.open(grown) as channel:
        assert {p.incarnation for p in channel.incarnations()} == {ORIGINAL}


def test_an_older_owner_without_incarnations_in_its_status_is_read_from_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as channel:
        made = channel.incarnations()[1].incarnation
        status = channel.status()
        for part in status["partitions"]:
            del part["incarnation"], part["incarnation_start_offset"]
        monkeypatch.setattr(channel, "status", lambda segments=False: status)
        parts = channel.incarnations()
        assert [(p.incarnation, p.start_offset) for p in parts] == [
            (ORIGINAL, 0), (made, checkpointed)]


def test_verify_notes_a_recreated_partition_and_reports_a_damaged_file(
        tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as channel:
        made = channel.incarnations()[1].incarnation
    directory = config.partition_dir(1)
    report = verify_partition(directory)
    assert report.ok, report.damages
    assert any(f"incarnation {made} starting at offset {checkpointed}" in note
               for note in report.notes), report.notes
    assert not any("incarnation" in note for note in verify_partition(
        config.partition_dir(0)).notes)
    path = directory / INCARNATION_FILE
    data = bytearray(path.read_bytes())
    data[30] ^= 0xFF
    path.write_bytes(bytes(data))
    damaged = verify_partition(directory)
    assert [(d.path, d.position) for d in damaged.damages] == [(str(path), 40)]
    with pytest.raises(CorruptStateError, match="CRC-32C mismatch"):
        Channel.open(config)  # never taken for the original storage


def test_a_recreate_cut_short_before_its_directory_was_in_place_is_made_again(
        tmp_path: Path) -> None:
    """The directory is made under a temp name with its file, then renamed: a crash
    before the rename leaves the temp one, which the next recreate uses."""
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    directory = config.partition_dir(1)
    left = directory.with_name(directory.name + ".tmp")
    left.mkdir(parents=True)
    with Channel.open(config, existed=True) as channel:
        part = channel.incarnations()[1]
        assert part.incarnation != ORIGINAL and part.start_offset == checkpointed
    assert not left.exists() and (directory / INCARNATION_FILE).is_file()


def test_a_client_of_the_owner_gets_the_incarnations_over_the_socket(tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as owner, Channel.open(config) as client:
        assert client.role == "client"
        assert client.incarnations() == owner.incarnations()
        assert client.incarnations()[1].start_offset == checkpointed


def test_stat_shows_a_recreated_partition_as_the_ui_does(tmp_path: Path) -> None:
    config, checkpointed, _ = _vanished_after_old_checkpoint(tmp_path)
    with Channel.open(config, existed=True) as channel:
        made = channel.incarnations()[1].incarnation
    told = f"recreated storage (id {made}), from offset {checkpointed}"
    for path in (config.home, config.partition_dir(1)):
        done = subprocess.run([sys.executable, "-m", "channel_engine", "stat", str(path)],
                              capture_output=True, text=True, check=True)
        assert told in done.stdout, done.stdout
    assert "recreated storage" not in subprocess.run(
        [sys.executable, "-m", "channel_engine", "stat", str(config.partition_dir(0))],
        capture_output=True, text=True, check=True).stdout

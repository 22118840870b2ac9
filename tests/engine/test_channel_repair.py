"""Damage to a channel's home files: verify reports each (file and byte) without failing,
open refuses what it cannot trust, and recover repairs it, keeps the damaged original
aside, says exactly what it cost, and leaves a channel that verifies clean and opens."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from channel_helpers import crashed_channel, make_config

from channel_engine import Channel, ChannelConfig, CorruptRecordError
from channel_engine.errors import ConfigError
from channel_engine.queue import commit_journal as cj
from channel_engine.tools.cli import main
from channel_engine.tools.recover import repair
from channel_engine.tools.verify import scan_log_file, verify_channel


def run(*argv: str, config: ChannelConfig | None = None) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out, config=config), out.getvalue()


def journal(config: ChannelConfig) -> Path:
    return cj.journal_path(config.home, cj.generations(config.home)[-1])


def record_position(path: Path, index: int) -> int:
    found = cj.scan(path)
    return cj.HEADER.size + sum(cj.RECORD_HEAD.size + cj.RECORD_BODY.size
                                + len(c.entries) * cj.ENTRY.size for c in found.commits[:index])


def damage(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def verified_after_ack(config: ChannelConfig, cut: Path) -> None:
    """A cut journal is an unacknowledged loss record until an operator acknowledges it."""
    status, out = run("verify", str(config.home))
    assert status == 1 and "unacknowledged loss records" in out and cut.name in out, out
    assert run("recover", str(config.home), "--ack")[0] == 0
    assert run("verify", str(config.home))[0] == 0


def all_events(config: ChannelConfig) -> list[bytes]:
    with Channel.open(config) as channel, channel.take() as tx:
        return sorted(event.body for event in tx.take(100))


def test_it_refuses_to_open_a_journal_damaged_in_the_middle_and_verify_names_the_byte(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = journal(config)
    where = record_position(path, 2)  # the second take commit
    damage(path, where + 12)
    with pytest.raises(CorruptRecordError, match=f"corrupt at byte {where}"):
        Channel.open(config)
    status, out = run("verify", str(config.home))
    assert status == 1 and f"DAMAGE {path}: byte {where}: record CRC-32C mismatch" in out
    status, out = run("verify", str(config.home), "--json")
    damages = json.loads(out)["damages"]
    assert status == 1 and {"path": str(path), "position": where} == {
        k: damages[0][k] for k in ("path", "position")}


def test_recover_cuts_a_journal_at_its_first_bad_record_and_counts_takes_that_come_back(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = journal(config)
    original = path.read_bytes()
    first_take_cut = cj.scan(path).commits[2]
    intact_after = cj.scan(path).commits[3]
    where = record_position(path, 2)
    damage(path, where + 12)
    damaged = path.read_bytes()
    report = repair(config.home)
    assert Path(str(path) + ".damaged").read_bytes() == damaged != original
    assert report.journals_cut[0]["position"] == where
    assert not path.exists()  # cut, replayed, then covered by the new checkpoint
    assert [c["id"] for c in report.take_commits_back] == [intact_after.commit_id]
    assert report.take_commits_back[0]["ranges"] == [list(e) for e in intact_after.entries]
    assert report.unreadable_journal_bytes == cj.RECORD_HEAD.size + cj.RECORD_BODY.size + \
        len(first_take_cut.entries) * cj.ENTRY.size
    assert report.events_lost == 0 and report.events_untaken == 14  # 2 takes come back
    [record] = report.losses["records"]  # type: ignore[index]
    assert (record["partition"], record["position"], record["events"]) == (-2, where, 0)
    assert record["cause"].startswith(f"journal_cut: {path} cut by recover at byte {where}")
    assert "1 take commits (2 events) after it may come back" in record["cause"]
    verified_after_ack(config, path)
    assert len(all_events(config)) == 14


def test_recover_counts_a_cut_put_commit_with_its_offsets(tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = journal(config)
    put = cj.scan(path).commits[4]
    assert put.kind == cj.PUT
    damage(path, record_position(path, 1) + 12)
    report = repair(config.home)
    assert [c["id"] for c in report.put_commits_cut] == [put.commit_id]
    assert report.put_commits_cut[0]["events"] == 4
    assert report.put_commits_cut[0]["ranges"] == [list(e) for e in put.entries]
    assert report.take_commits_may_come_back == 2
    # the put's batches were stamped committed after its record: kept; every take back
    assert report.events_aborted == 0 and report.events_untaken == 16
    verified_after_ack(config, path)



def unstamp(config: ChannelConfig, transaction_id: int) -> int:
    """Clear the committed stamp of the put's batches (as if the owner died before it
    stamped them); return their events."""
    events = 0
    for i in range(config.partitions):
        for log_file in config.partition_dir(i).glob("*.log"):
            for position, header in scan_log_file(log_file, None).batches:
                if header.transaction_id == transaction_id:
                    with open(log_file, "r+b") as f:
                        f.seek(position + 12)
                        f.write(b"\xff\xff\xff\xff")
                    events += header.record_count
    return events


def test_recover_records_the_events_of_a_cut_put_commit_the_open_aborts_as_lost(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = journal(config)
    put = cj.scan(path).commits[4]
    assert put.kind == cj.PUT and unstamp(config, put.commit_id) == 4
    where = record_position(path, 1)
    damage(path, where + 12)
    report = repair(config.home)
    assert report.events_aborted == 4 and report.events_lost == 4
    records = report.losses["records"]  # type: ignore[index]
    lost = sorted((r["partition"], r["start"], r["end"], r["events"]) for r in records
                  if r["partition"] >= 0)
    assert lost == sorted((p, a, b, b - a) for p, a, b in put.entries) and \
        sum(r[3] for r in lost) == 4
    assert all(r["path"] == str(path) and r["position"] == where and "journal_cut" in
               r["cause"] for r in records)
    assert report.losses["unacknowledged_events"] == 4  # type: ignore[index]
    status, out = run("stat", str(config.home))
    assert "health degraded (4 events lost" in out
    verified_after_ack(config, path)
    assert b"late0" not in all_events(config)

def test_recover_rewrites_a_journal_with_a_damaged_header_keeping_the_original(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = journal(config)
    damage(path, 1)
    assert run("verify", str(config.home))[0] == 1
    report = repair(config.home)
    assert report.take_commits_may_come_back == 3 and len(report.put_commits_cut) == 2
    assert Path(str(path) + ".damaged").exists()
    verified_after_ack(config, path)


def five_put_two_taken(config: ChannelConfig) -> None:
    """Five events put into the channel, two of them taken and committed; closed cleanly."""
    with Channel.open(config) as channel:
        with channel.put() as tx:
            for i in range(5):
                tx.put(f"e{i}".encode())
        with channel.take() as tx:
            tx.take(2)


@pytest.mark.parametrize("copy", ["primary", "backup"])
def test_recover_rewrites_a_damaged_checkpoint_copy_from_the_valid_one(
        tmp_path: Path, copy: str) -> None:
    config = make_config(tmp_path, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(tmp_path / "backup"))
    five_put_two_taken(config)
    path = (config.home if copy == "primary" else tmp_path / "backup") / "checkpoint"
    damage(path, 8)
    status, out = run("verify", str(config.home))
    assert status == 1 and f"DAMAGE {path}: byte {path.stat().st_size - 4}: CRC-32C" in out
    report = repair(config.home)
    assert Path(str(path) + ".damaged").exists()
    assert report.moved_aside[0]["kept_as"] == str(path) + ".damaged"
    assert not report.no_checkpoint and report.events_untaken == 3
    assert run("verify", str(config.home))[0] == 0


def test_recover_without_any_checkpoint_queues_the_logs_again_and_says_so(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    five_put_two_taken(config)
    (config.home / "checkpoint").write_bytes(b"WCKP broken")
    status, out = run("recover", str(config.home))
    assert status == 0 and "no valid checkpoint: every event still in the logs" in out
    assert "after recovery: 5 events untaken" in out  # the 2 taken come back
    assert run("verify", str(config.home))[0] == 0


def test_recover_moves_home_strays_aside_and_verify_names_them(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "00000000000000000000.log").write_bytes(b"")
    (config.home / "notes.txt").write_text("an operator's")
    (config.home / "losses.json").write_text("{}")  # the loss ledger's name: not a stray
    status, out = run("verify", str(config.home))
    assert status == 1 and "notes.txt: byte 0: a stray file" in out
    assert "losses.json: byte 0: a stray" not in out and "the loss ledger" in out
    report = repair(config.home)
    assert sorted(Path(m["kept_as"]).name for m in report.moved_aside) == [
        "00000000000000000000.log.stray", "notes.txt.stray"]
    status, out = run("verify", str(config.home))  # the damaged ledger is a loss to ack
    assert status == 1 and "the loss ledger" in out and "acknowledge with" in out
    assert run("recover", str(config.home), "--ack")[0] == 0
    status, out = run("verify", str(config.home))
    assert status == 0 and "note: " in out and "kept aside by an earlier recover" in out


def test_recover_repairs_a_log_state_that_is_damaged_or_a_directory(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(6):
            tx.put(f"e{i}".encode(), key=str(i).encode())
    damage(config.partition_dir(0) / "log.state", 20)
    (config.partition_dir(1) / "log.state").unlink()
    (config.partition_dir(1) / "log.state").mkdir()
    result = verify_channel(config.home)
    assert not result["ok"] and len({d["path"] for d in result["damages"]
                                     if d["path"].endswith("log.state")}) == 2
    report = repair(config.home)
    assert any(m["kept_as"].endswith("log.state.stray") for m in report.moved_aside)
    assert report.events_lost == 0 and report.events_untaken == 6
    assert verify_channel(config.home)["ok"]


def test_verify_reports_a_damaged_channel_json_and_still_checks_the_rest(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    path = config.home / "channel.json"
    path.write_bytes(path.read_bytes()[:30])
    (config.home / "checkpoint").write_bytes(b"")
    status, out = run("verify", str(config.home))
    assert status == 1 and f"DAMAGE {path}: byte " in out and "not valid JSON" in out
    assert f"DAMAGE {config.home / 'checkpoint'}: byte 0: size 0" in out
    path.unlink()
    status, out = run("verify", str(config.home))
    assert status == 1 and f"DAMAGE {path}: byte 0: " in out and "no channel config" in out


def test_recover_refuses_a_damaged_channel_json_without_a_config_saying_how(
        tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    (config.home / "channel.json").write_bytes(b"{garbage")
    with pytest.raises(ConfigError, match="channel.json: byte 1: .*--config FILE"):
        repair(config.home)
    assert (config.home / "channel.json").read_bytes() == b"{garbage"


def test_recover_with_a_supplied_config_rewrites_channel_json(tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(4):
            tx.put(f"e{i}".encode(), key=str(i).encode())
    (config.home / "channel.json").write_bytes(b"\x00" * 40)
    supplied = tmp_path / "settings.json"
    supplied.write_text(json.dumps(config.to_dict()))
    status, out = run("recover", str(config.home), "--config", str(supplied))
    assert status == 0, out
    assert f"moved aside: {config.home / 'channel.json'} -> " in out
    assert (config.home / "channel.json.damaged").read_bytes() == b"\x00" * 40
    assert ChannelConfig.load(config.home) == config
    assert run("verify", str(config.home))[0] == 0
    assert len(all_events(config)) == 4


def test_recover_refuses_a_channel_json_failing_its_crc32c_then_rewrites_it_when_supplied(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=2)
    with Channel.open(config) as channel, channel.put() as tx:
        tx.put(b"kept")
    path = config.home / "channel.json"
    damaged = path.read_text().replace('"partitions": 2', '"partitions": 3')
    path.write_text(damaged)  # a valid setting, silently another channel
    assert [d["path"] for d in verify_channel(config.home)["damages"]] == [str(path)]
    with pytest.raises(ConfigError, match=f"{path}: settings do not match the stored crc32c"):
        Channel.open(config.home)
    with pytest.raises(ConfigError, match="crc32c.*--config FILE.*channel_tool recover NAME"):
        repair(config.home)
    report = repair(config.home, config)
    assert [m["kept_as"] for m in report.moved_aside] == [f"{path}.damaged"]
    assert path.with_name("channel.json.damaged").read_text() == damaged
    assert ChannelConfig.load(config.home) == config and all_events(config) == [b"kept"]
    assert verify_channel(config.home)["ok"]


def test_recover_refuses_a_supplied_config_of_another_home(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    Channel.open(config).close()
    other = config.replace(checkpoint_dir=str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match="is not"):
        repair(config.home, other)


def test_a_second_recover_keeps_both_damaged_originals(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    for attempt in range(2):
        Channel.open(config).close()
        (config.home / "checkpoint").write_bytes(b"WCKP broken " + bytes([attempt]))
        repair(config.home)
    assert (config.home / "checkpoint.damaged").read_bytes() == b"WCKP broken \x00"
    assert (config.home / "checkpoint.1.damaged").read_bytes() == b"WCKP broken \x01"
    (config.home / "checkpoint.tmp").write_bytes(b"a write cut short")
    result = verify_channel(config.home)
    assert result["ok"] and len(result["notes"]) == 3


def test_verify_reports_a_damaged_key_file_it_cannot_repair(tmp_path: Path) -> None:
    from channel_engine.encryption import KeyRing

    keys = tmp_path / "keys.json"
    KeyRing.write_new(keys, ["k1"])
    config = make_config(tmp_path, encryption_key_file=str(keys), encryption_active_key="k1")
    Channel.open(config).close()
    assert verify_channel(config.home)["ok"]
    keys.write_text("{")
    result = verify_channel(config.home)
    assert not result["ok"] and result["damages"][0]["path"] == str(keys)
    assert "restore the key file from a backup" in result["damages"][0]["reason"]


def test_salvage_after_damage_at_the_head_of_a_large_journal_stays_fast(
        tmp_path: Path) -> None:
    import time

    journal = cj.CommitJournal(tmp_path, 0)
    for take in range(50_000):  # ~2 MB of take commits
        journal.append(cj.TAKE, take, [(0, take, take + 1)])
    journal.close()
    path = cj.journal_path(tmp_path, 0)
    damage(path, cj.HEADER.size + 10)
    started = time.monotonic()
    found = cj.scan(path)
    assert len(found.after) == 49_999 and found.damaged
    assert time.monotonic() - started < 10

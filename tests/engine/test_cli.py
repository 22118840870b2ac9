"""The operator tools, run as an operator runs them: `python -m channel_engine ...`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from channel_helpers import small_channel

from channel_engine import Channel, LogConfig, PartitionLog


def tool(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "channel_engine", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_produce_appends_stdin_lines_in_batches(tmp_path: Path) -> None:
    lines = "".join(f"line {i}\n" for i in range(250))
    done = tool("produce", str(tmp_path), "--batch", "100", "--key", "k",
                "--header", "src=test", "--header", "env=ci", stdin=lines)
    assert done.returncode == 0, done.stderr
    assert "appended 250 events in 3 batches, offsets 0..249" in done.stdout
    with PartitionLog.open(tmp_path, read_only=True) as log:
        events = list(log.iter_events(0))
    assert [e.body for e in events] == [f"line {i}".encode() for i in range(250)]
    assert events[0].key == b"k" and events[0].headers == {"src": b"test", "env": b"ci"}


def test_produce_refuses_a_bad_header_without_writing(tmp_path: Path) -> None:
    done = tool("produce", str(tmp_path / "p"), "--header", "novalue", stdin="x\n")
    assert done.returncode == 2 and "--header 'novalue': expected K=V" in done.stderr
    assert not (tmp_path / "p").exists()


def test_dump_prints_batches_records_and_index_entries(tmp_path: Path) -> None:
    tool("produce", str(tmp_path), "--batch", "2", "--segment-bytes", "6000",
         stdin="".join(f"{'x' * 40} {i}\n" for i in range(60)))
    text = tool("dump", str(tmp_path), "--print-data").stdout
    assert "Dumping " in text and "baseOffset: 0 lastOffset: 1 count: 2" in text
    assert "| offset: 1 CreateTime:" in text and f"payload: {'x' * 40} 1" in text
    index = max(tmp_path.glob("*.index"), key=lambda p: p.stat().st_size)
    assert "offset: " in tool("dump", str(index)).stdout
    rows = [json.loads(line) for line in tool("dump", str(tmp_path), "--json",
                                              "--print-data").stdout.splitlines()]
    batches = [r for r in rows if "baseOffset" in r]
    assert sum(b["count"] for b in batches) == 60
    assert batches[0]["records"][0]["payload"] == f"{'x' * 40} 0"


def test_dump_reports_invalid_bytes_at_the_end(tmp_path: Path) -> None:
    tool("produce", str(tmp_path), stdin="a\nb\n")
    log_file = next(tmp_path.glob("*.log"))
    with open(log_file, "ab") as f:
        f.write(b"\x01" * 7)
    done = tool("dump", str(log_file))
    assert done.returncode == 1
    assert f"Found 7 invalid bytes at the end of {log_file.name}" in done.stdout


def _damage_batch(tmp_path: Path, index: int, at: int) -> tuple[Path, list[tuple[int, int]]]:
    """Ten batches of ten events; flip the byte `at` of batch `index`; (file, batch spans)."""
    from channel_engine.tools.verify import scan_log_file
    tool("produce", str(tmp_path), "--batch", "10", stdin="".join(f"{i}\n" for i in range(100)))
    log_file = next(tmp_path.glob("*.log"))
    spans = [(p, p + h.size) for p, h in scan_log_file(log_file, None).batches]
    data = bytearray(log_file.read_bytes())
    data[spans[index][0] + at] ^= 0x55
    log_file.write_bytes(bytes(data))
    return log_file, spans


def test_dump_reports_a_damaged_batch_and_goes_on_with_the_next_intact_one(
    tmp_path: Path,
) -> None:
    log_file, spans = _damage_batch(tmp_path, 3, 80)  # inside the records: the CRC fails
    done = tool("dump", str(tmp_path), "--print-data")
    assert done.returncode == 1, done.stderr
    assert f"Damaged region at byte {spans[3][0]} of {log_file.name}: " \
           f"{spans[3][1] - spans[3][0]} bytes (" in done.stdout and "CRC-32C" in done.stdout
    assert "offsets 30..39 unreadable" in done.stdout
    assert "baseOffset: 40 lastOffset: 49" in done.stdout and "payload: 99" in done.stdout
    assert "baseOffset: 30 " not in done.stdout and "payload: 30" not in done.stdout
    lines = tool("dump", str(log_file), "--json").stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["baseOffset"] for r in rows if "baseOffset" in r] == \
        [0, 10, 20, 40, 50, 60, 70, 80, 90]
    [region] = [r for r in rows if "damaged_bytes" in r]
    assert (region["position"], region["damaged_bytes"]) == (spans[3][0],
                                                              spans[3][1] - spans[3][0])
    assert (region["first_offset"], region["resume_offset"]) == (30, 40)
    assert "CRC-32C" in region["reason"]


def test_dump_goes_on_past_a_damaged_first_header(tmp_path: Path) -> None:
    log_file, spans = _damage_batch(tmp_path, 0, 16)  # the magic byte of the first batch
    done = tool("dump", str(log_file))
    assert done.returncode == 1, done.stderr
    assert f"Damaged region at byte 0 of {log_file.name}: {spans[0][1]} bytes (" \
        in done.stdout and "offsets 0..9 unreadable" in done.stdout
    assert done.stdout.count("baseOffset: ") == 9


def test_verify_exits_zero_when_sound_and_one_with_file_and_position(tmp_path: Path) -> None:
    tool("produce", str(tmp_path), "--batch", "10", stdin="".join(f"{i}\n" for i in range(100)))
    done = tool("verify", str(tmp_path))
    assert done.returncode == 0 and "100 records" in done.stdout and "sound" in done.stdout
    log_file = next(tmp_path.glob("*.log"))
    data = bytearray(log_file.read_bytes())
    data[len(data) - 3] ^= 0x55
    log_file.write_bytes(bytes(data))
    done = tool("verify", str(tmp_path), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"]
    damage = report["damages"][0]
    assert damage["path"] == str(log_file) and "CRC-32C" in damage["reason"]


def test_stat_prints_the_segments_table(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path, LogConfig(segment_bytes=2048)) as log:
        for i in range(40):
            log.append([_event(i)])
    done = tool("stat", str(tmp_path))
    assert done.returncode == 0
    assert "base_offset" in done.stdout and "log end 40" in done.stdout
    stats = json.loads(tool("stat", str(tmp_path), "--json").stdout)
    table = stats["segment_table"]
    assert len(table) > 1 and table[-1]["active"] and not table[0]["active"]
    assert sum(row["records"] for row in table) == 40


def test_tools_refuse_a_missing_directory(tmp_path: Path) -> None:
    for name in ("verify", "stat", "recover"):
        done = tool(name, str(tmp_path / "nope"))
        assert done.returncode == 2 and "no such partition directory" in done.stderr


def _event(i: int):  # type: ignore[no-untyped-def]
    from channel_engine import PendingEvent
    return PendingEvent(b"%03d" % i * 30, timestamp=1_000 + i)


# -- on a channel home ---------------------------------------------------------------------
def test_channel_tools_stat_dump_verify_recover(tmp_path: Path) -> None:
    home = small_channel(tmp_path).home
    done = tool("stat", str(home))
    assert done.returncode == 0 and "channel 'ch': 4 events untaken" in done.stdout
    assert "partition 1:" in done.stdout
    status = json.loads(tool("stat", str(home), "--json").stdout)
    assert status["events_untaken"] == 4 and "segment_table" in status["partitions"][0]
    done = tool("dump", str(home))
    assert done.returncode == 0 and "primary checkpoint" in done.stdout
    assert "partition 0: " in done.stdout
    done = tool("verify", str(home))
    assert done.returncode == 0 and "sound" in done.stdout
    done = tool("recover", str(home), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["checkpoint_source"] == "primary"
    (home / "checkpoint").write_bytes(b"WCKP garbage")
    done = tool("verify", str(home))
    assert done.returncode == 1 and "DAMAGE" in done.stdout and "checkpoint" in done.stdout


def test_produce_into_a_channel_while_another_process_owns_it(tmp_path: Path) -> None:
    home = small_channel(tmp_path).home
    with Channel.open(home) as owner:
        done = tool("produce", str(home), "--batch", "2", stdin="a\nb\nc\n")
        assert done.returncode == 0, done.stderr
        assert "put 3 events in 2 transactions" in done.stdout
        assert owner.status()["events_untaken"] == 7
        done = tool("recover", str(home))
        assert done.returncode == 1 and "another process owns" in done.stderr


def test_recover_repairs_a_damaged_home_and_prints_what_it_cost(tmp_path: Path) -> None:
    from test_channel_repair import crashed_channel, damage, journal, record_position

    config = crashed_channel(tmp_path)
    path = journal(config)
    where = record_position(path, 2)
    damage(path, where + 12)
    (config.home / "stray.bin").write_bytes(b"?")
    done = tool("dump", str(config.home))
    assert done.returncode == 1 and f"byte {where}: record CRC-32C mismatch; damage" in done.stdout
    done = tool("verify", str(config.home))
    assert done.returncode == 1 and f"DAMAGE {path}: byte {where}" in done.stdout
    assert f"DAMAGE {config.home / 'stray.bin'}: byte 0: a stray file" in done.stdout
    done = tool("recover", str(config.home))
    assert done.returncode == 0, done.stderr
    assert f"journal cut: {path} at byte {where}: record CRC-32C mismatch" in done.stdout
    assert "events lost: 0" in done.stdout
    assert "take commits that may come back (at-least-once): 1, " in done.stdout
    assert "files moved aside: 2" in done.stdout
    assert f"{config.home / 'stray.bin'} -> {config.home / 'stray.bin.stray'}" in done.stdout
    assert "loss ledger: 0 events lost, 0 not yet acknowledged (1 unacknowledged records" \
        in done.stdout
    done = tool("verify", str(config.home), "--json")  # the cut is a loss record, until seen
    assert done.returncode == 1 and "unacknowledged loss records" in done.stdout
    assert tool("recover", str(config.home), "--ack").returncode == 0
    done = tool("verify", str(config.home), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"]


def test_recover_names_a_damaged_channel_json_and_how_to_supply_the_config(
        tmp_path: Path) -> None:
    home = small_channel(tmp_path).home
    settings = json.loads((home / "channel.json").read_text())
    (home / "channel.json").write_text('{"format": ')
    done = tool("recover", str(home))
    assert done.returncode == 1 and f"{home / 'channel.json'}: byte " in done.stderr
    assert "--config FILE" in done.stderr and "channel_tool recover NAME" in done.stderr
    supplied = tmp_path / "settings.json"
    supplied.write_text(json.dumps(settings))
    done = tool("verify", str(home), "--config", str(supplied), "--json")
    assert done.returncode == 1
    assert [d["path"] for d in json.loads(done.stdout)["damages"]] == [str(home / "channel.json")]
    done = tool("recover", str(home), "--config", str(supplied), "--json")
    assert done.returncode == 0, done.stderr
    repair = json.loads(done.stdout)["repair"]
    assert repair["files_moved_aside"] == 1 and repair["events_untaken"] == 4
    assert tool("verify", str(home)).returncode == 0

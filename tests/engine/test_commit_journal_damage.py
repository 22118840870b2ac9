"""A commit journal whose content is unknown (issue 12, point 6: recover "prints exactly what
it cost: ... take commits that may come back"): the checkpoint's own journal deleted,
emptied, headless or cut. verify reports it naming the file; open and recover report it
and bound the events that may come back; open records a missing journal in the loss
ledger (health degraded until acknowledged). An intact journal, and the legitimate states
a crash or a checkpoint leaves, report nothing of the kind."""
from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from channel_helpers import crashed_channel, make_config

from channel_engine import Channel, ChannelConfig
from channel_engine.queue import commit_journal as cj
from channel_engine.queue.loss_ledger import JOURNAL_PARTITION
from channel_engine.tools.cli import main
from channel_engine.tools.recover import repair

PUT = 16  # events put by crashed_channel
TAKEN = 6  # of them taken and committed (journalled after the last checkpoint)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def checkpoint_journal(config: ChannelConfig) -> Path:
    """The journal of the newest checkpoint (the open's, sequence 1 here)."""
    with Channel.open(config, read_only=True) as channel:
        sequence = channel.status()["checkpoint"]["sequence"]
    path = cj.journal_path(config.home, sequence)
    assert path.is_file() and cj.scan(path).commits, "setup: the journal holds the takes"
    return path


def _dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGES: dict[str, Callable[[Path], None]] = {
    "deleted": Path.unlink,
    "emptied": lambda p: p.write_bytes(b""),
    "shorter than its header": lambda p: p.write_bytes(p.read_bytes()[:7]),
    "zeros": lambda p: p.write_bytes(bytes(p.stat().st_size)),
}


def drain(channel: Channel) -> list[bytes]:
    with channel.take() as tx:
        return [bytes(e.body) for e in tx.take(100)]


@pytest.mark.parametrize("what", sorted(DAMAGES))
def test_it_counts_a_missing_checkpoint_journal_as_takes_that_may_come_back(
        tmp_path: Path, what: str) -> None:
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    DAMAGES[what](path)
    status, out = run("verify", str(config.home))
    assert status == 1 and f"DAMAGE {path}: byte 0: " in out
    with Channel.open(config) as channel:
        found = channel.status()
        recovery, losses = found["recovery"], found["losses"]
        assert [j["path"] for j in recovery["journals_unknown"]] == [str(path)]
        assert any(str(path) in problem for problem in recovery["problems"])
        assert recovery["events_may_come_back_at_most"] == found["events_untaken"] == PUT
        record, = losses["records"]
        assert (record["partition"], record["events"], record["path"]) == (
            JOURNAL_PARTITION, 0, str(path))
        assert f"up to {PUT} events may come back" in record["cause"]
        assert losses["events_lost"] == 0 and losses["unacknowledged"] == 1
        assert found["health"] == "degraded" and path.name in found["health_reason"]
        assert len(drain(channel)) == PUT  # the 6 taken come back: at least once
        assert channel.acknowledge_losses() == 1
        assert channel.status()["health"] == "healthy"
    with Channel.open(config) as channel:  # the open's checkpoint wrote a new journal
        found = channel.status()
        assert found["recovery"]["journals_unknown"] == []
        assert found["recovery"]["events_may_come_back_at_most"] == 0
        assert len(found["losses"]["records"]) == 1


def test_a_read_only_open_reports_a_missing_journal_without_writing(tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    path.unlink()
    with Channel.open(config, read_only=True) as channel:
        found = channel.status()
        assert found["recovery"]["events_may_come_back_at_most"] == PUT
        assert found["health"] != "healthy"
    assert not path.exists() and not cj.generations(config.home)


def test_it_reports_no_bound_for_an_intact_journal(tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    status, out = run("verify", str(config.home))
    assert status == 0, out
    with Channel.open(config) as channel:
        found = channel.status()
        assert found["recovery"]["journals_unknown"] == []
        assert found["recovery"]["events_may_come_back_at_most"] == 0
        assert found["losses"]["records"] == [] and found["health"] == "healthy"
        assert len(drain(channel)) == PUT - TAKEN
    config = crashed_channel(tmp_path / "again")
    report = repair(config.home)
    assert report.events_may_come_back_at_most == 0 and report.journals_unknown == []
    assert report.to_dict()["events_may_come_back_at_most"] == 0


def test_it_bounds_a_journal_cut_after_its_header_without_a_loss_record(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    found = cj.scan(path)
    last = found.commits[-1]
    path.write_bytes(path.read_bytes()[:found.valid_bytes - len(last.entries) * cj.ENTRY.size])
    assert run("verify", str(config.home))[0] == 1
    with Channel.open(config) as channel:
        status = channel.status()
        unknown, = status["recovery"]["journals_unknown"]
        assert unknown["path"] == str(path) and not unknown["missing"]
        assert status["recovery"]["events_may_come_back_at_most"] == status["events_untaken"]
        assert status["losses"]["records"] == []  # a torn append after a power loss looks so


def test_recover_bounds_a_journal_replaced_by_a_directory_and_prints_it(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    _dir(path)
    status, out = run("verify", str(config.home))
    assert status == 1 and str(path) in out
    status, out = run("recover", str(config.home), "--ack")
    assert status == 0, out
    assert f"up to {PUT} events may come back in all" in out and str(path) in out
    assert "acknowledged 1 loss records" in out
    assert run("verify", str(config.home))[0] == 0
    with Channel.open(config) as channel:
        assert len(drain(channel)) == PUT


def test_recover_bounds_a_journal_with_unreadable_bytes_beyond_the_listed_takes(
        tmp_path: Path) -> None:
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    found = cj.scan(path)
    first = found.commits[0]
    where = cj.HEADER.size + cj.RECORD_HEAD.size + cj.RECORD_BODY.size \
        + len(first.entries) * cj.ENTRY.size + 12  # inside the second record
    data = bytearray(path.read_bytes())
    data[where] ^= 0x5A
    path.write_bytes(bytes(data))
    report = repair(config.home)
    assert report.take_commits_may_come_back == 2  # listed: their records are intact
    assert [j["path"] for j in report.journals_unknown] == [str(path)]
    assert report.events_may_come_back_at_most == report.events_untaken >= \
        report.events_may_come_back
    assert report.to_dict()["events_may_come_back_at_most"] == report.events_untaken


def test_it_does_not_flag_a_newer_journal_whose_header_never_reached_the_disk(
        tmp_path: Path) -> None:
    """The owner died after creating the next journal, before its header was synced and
    before the checkpoint that would follow it: no commit is in it."""
    config = crashed_channel(tmp_path)
    path = checkpoint_journal(config)
    newer = cj.journal_path(config.home, cj.journal_generation(path) + 1)
    newer.write_bytes(bytes(7))
    with Channel.open(config) as channel:
        found = channel.status()
        assert found["recovery"]["journals_unknown"] == []
        assert found["losses"]["records"] == [] and found["health"] == "healthy"


def test_it_does_not_flag_a_fresh_channel_or_an_older_backups_removed_journal(
        tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    config = make_config(tmp_path, partitions=2, use_dual_checkpoints=True,
                         backup_checkpoint_dir=str(backup))
    with Channel.open(config) as channel:
        assert channel.status()["recovery"]["journals_unknown"] == []
        old_backup = (backup / "checkpoint").read_bytes()
        with channel.put() as tx:
            tx.put(b"a")
        channel.checkpoint()
        channel.checkpoint()  # both copies newer: the older journals are removed
    (backup / "checkpoint").write_bytes(old_backup)  # a backup left behind (its write failed)
    status, out = run("verify", str(config.home))
    assert status == 0, out
    with Channel.open(config) as channel:
        found = channel.status()
        assert found["recovery"]["journals_unknown"] == [] and found["health"] == "healthy"
        assert drain(channel) == [b"a"]

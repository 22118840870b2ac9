"""Repairing a channel's home: `python -m channel_engine recover HOME` repairs every
damage verify_channel reports, and says exactly what it cost; missing partition storage
(step 0) it refuses, changing nothing.

Steps, in order; a file is kept aside before it changes, never deleted:

  0. Missing partition storage is no damage: a partition directory gone, one found
     empty where a checkpoint says the partition existed, or one of a recreate cut short
     (home_files.missing_places) makes recover refuse before it changes anything
     (RepairRefusedError, a non-zero exit naming each path and the recreate command:
     tools/missing_storage.py). Its open would otherwise write a new incarnation there
     without the operator's word, not counting the lost events, or settle a recreate cut
     short at the checkpoint's end, losing the operator's next offsets.

  1. The config: channel.json, or one the caller supplies (`--config FILE`, or the
     appliance's database) when channel.json is damaged or missing; the damaged file
     is kept as `channel.json.damaged` and the owner's open rewrites it. Without
     either, ConfigError naming the file and how to supply the settings.
  2. The channel lock (`.lock`, flock) is held while files are repaired: a channel
     another process owns is refused (that owner has recovered it already); anything
     but a regular file in place of `.lock` is moved aside first. Anything
     but a regular file in place of channel.json, the checkpoints or losses.json (a
     directory, say) is renamed `<name>.stray` (home_files.not_regular); the open
     writes the proper file.
  3. Checkpoints: a damaged copy (primary or backup) is renamed `checkpoint.damaged`;
     the open in step 6 writes both copies fresh from the replayed state — from the
     valid copy, or, with none, from the logs (every event still in them is queued
     again: takes committed before the lost checkpoint come back, at least once).
  4. Commit journals with damage that is no torn tail (commit_journal's rule): the
     original is copied to `commits-<G>.journal.damaged`, then the journal is
     replaced (atomically) by its valid prefix — cut at the first bad record. The
     commits cut off count only in a journal the open replays (G >= the checkpoint's
     sequence): take commits may come back (their events are delivered again: at
     least once), put commits are aborted (their batches, unless already stamped
     committed, leave the queue undelivered: counted in events_aborted); their
     offsets are listed when the records after the damage are intact, and the bytes
     that are no intact record are counted (they may have held more commits).
     Before a replayed journal is cut (or an unreadable one moved aside), the cut is
     recorded durably in the loss ledger (partition -2, cause "journal_cut: ..." with
     the byte, the take commits that may come back and the unreadable bytes): health
     stays degraded until an operator acknowledges it. The batches of put commits cut
     that the open then aborts (their commits had returned) are lost: recorded by
     partition (their offsets, the journal and byte) and counted in events_lost.
     A torn tail is left to the open, which ignores it (no commit there returned,
     or the journal was cut: the open reports its content unknown).
     When the content of a replayed journal is unknown — bytes after the cut that
     are no intact record, a journal that is not a file, or (found by the open)
     the checkpoint's own journal missing or headless — the exact take commits
     cannot be listed: events_may_come_back_at_most bounds them, in all, by every
     event the repaired queue holds untaken (any may have been taken since the
     checkpoint). An intact journal sets no bound.
  5. Strays: files in the home the engine did not write are renamed `<name>.stray`;
     a log.state that is not a regular file is renamed `log.state.stray` (the log
     writes a new one). A recreated partition's incarnation file (log/incarnation.py)
     that verify reports damaged (fails its checks, or is no regular file) is renamed
     `incarnation.damaged`, and a new incarnation is written in its place, settled at
     the partition's log start (log.state's, or its first segment's base offset when
     lower or log.state is unreadable; 0 without either): which storage the offsets
     belong to is unknown, so every offset the log holds counts as of the new one, and
     a drain that sent any of them refuses loudly, naming the way out
     (channel_engine/incarnations.py), never skips them; an intact older Weir's
     `incarnation.stray` is not put back over a damaged file (that file may have been a
     newer incarnation: the copy stays, reported). An older Weir's
     `incarnation[.<n>].stray` with no `incarnation` is renamed back when it reads intact —
     the newest copy by made_at_ms when there are several (ChannelEngineError, the copies
     left as they are, when the newest ones name different incarnations); else the same
     new incarnation is written (the copy stays). Both are reported (moved
     aside, rewritten with the new id and start); a crash between the rename and the
     write leaves `incarnation.damaged` alone, which the open refuses: recover again.
  6. Open as the owner with force_recovery: every batch of every partition is
     CRC-checked and the log layer repairs what is damaged (offsets it can no longer
     deliver are reported as LostRange and go to the channel's loss ledger), log.state
     and the indexes are rewritten, the queue is replayed and a fresh checkpoint
     written (its rotation removes the cut journals; their `.damaged` copies stay).

A crash during repair is safe: each step is a rename or an atomic write, and running
recover again redoes what is left (a second copy is named `<name>.1.damaged`).
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import (
    fsync_directory,
    move_aside,
    open_lock_file,
    write_atomically,
)
from channel_engine.errors import ChannelEngineError, ConfigError, CorruptStateError
from channel_engine.filenames import (
    DAMAGED_SUFFIX,
    INCARNATION_FILE,
    LOCK_FILE,
    LOG_STATE_FILE,
    LOG_SUFFIX,
    STRAY_SUFFIX,
    aside_path,
    parse_segment_file,
)
from channel_engine.log import incarnation as incarnation_file
from channel_engine.log import state as log_state
from channel_engine.log.recovery import TRUNCATED, LostRange
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.home_files import not_regular
from channel_engine.queue.loss_ledger import LossLedger
from channel_engine.tools.missing_storage import missing_partitions, missing_storage_error
from channel_engine.tools.verify_home import HomeReport, check_config_file
from channel_engine.tools.verify_home import verify_home as _verify_home


@dataclass
class RepairReport:
    """What recover did to a channel's home and what it cost (JSON via to_dict)."""

    home: str
    channel: str = ""
    moved_aside: list[dict[str, str]] = field(default_factory=list)  # path, kept_as, why
    rewritten: list[dict[str, str]] = field(default_factory=list)  # path, why
    journals_cut: list[dict[str, Any]] = field(default_factory=list)
    take_commits_back: list[dict[str, Any]] = field(default_factory=list)  # id, ranges
    put_commits_cut: list[dict[str, Any]] = field(default_factory=list)  # id, ranges
    unreadable_journal_bytes: int = 0  # after a cut, no intact record: may hold commits
    journals_unknown: list[dict[str, Any]] = field(default_factory=list)  # path, why
    events_may_come_back_at_most: int = 0  # in all (see the module doc); 0: exact
    lost_ranges: list[dict[str, Any]] = field(default_factory=list)  # partition + LostRange
    cut_at: list[dict[str, Any]] = field(default_factory=list)  # partition, offset, path
    events_lost: int = 0  # offsets the logs can no longer deliver + queued beyond the end
    # + the events of put commits cut from a journal that the open aborted
    events_aborted: int = 0
    no_checkpoint: bool = False  # every event still in the logs was queued again
    events_untaken: int = 0
    recovery: dict[str, Any] = field(default_factory=dict)  # the channel's ChannelRecovery
    losses: dict[str, Any] | None = None  # status()["losses"] where the channel keeps one

    @property
    def take_commits_may_come_back(self) -> int:
        """Take commits cut from a replayed journal (counted when their record is intact)."""
        return len(self.take_commits_back)

    @property
    def events_may_come_back(self) -> int:
        """Events of those take commits: delivered again (at least once), not lost."""
        return sum(end - start for commit in self.take_commits_back
                   for _partition, start, end in commit["ranges"])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form."""
        out = asdict(self)
        out["take_commits_may_come_back"] = self.take_commits_may_come_back
        out["events_may_come_back"] = self.events_may_come_back
        out["files_moved_aside"] = len(self.moved_aside)
        return out


def load_config(home: Path, supplied: ChannelConfig | None) -> ChannelConfig:
    """The config to repair with: `supplied`, else channel.json; ConfigError saying how
    to supply one when channel.json is damaged."""
    if supplied is not None:
        if Path(supplied.checkpoint_dir).resolve() != home.resolve():
            raise ConfigError("checkpoint_dir", f"the supplied config's checkpoint_dir "
                                                f"{supplied.checkpoint_dir} is not {home}")
        return supplied
    report = HomeReport(str(home))
    config = check_config_file(home, report)
    if config is None:
        damage = report.damages[0]
        raise ConfigError("home", f"{damage}; supply the channel's settings: `python -m "
                                  f"channel_engine recover {home} --config FILE` (a JSON object "
                                  "of the settings, as channel.json holds them) or `manage.py "
                                  "channel_tool recover NAME` (from the database)")
    return config


def repair(home: Path, supplied: ChannelConfig | None = None,
           on_open: Callable[[ChannelOwner], None] | None = None) -> RepairReport:
    """Repair every damage of a channel (see the module doc) and report its cost.
    on_open runs while the repaired channel is open (to acknowledge losses, say)."""
    if not home.is_dir():
        raise FileNotFoundError(f"{home}: no channel home here")
    config = load_config(home, supplied)
    missing = missing_partitions(config)
    if missing:  # step 0: before anything changes
        raise missing_storage_error(config, missing)
    report = RepairReport(str(home), config.name)
    found = HomeReport(str(home))
    check_config_file(home, found)
    with _channel_lock(home, report):
        for path in not_regular(config):
            _move_aside(path, STRAY_SUFFIX, "not a regular file (the engine writes a new one)",
                        report)
        if found.damages and supplied is not None:
            _keep_config_aside(home, report)
        _verify_home(home, config, found)
        sequence = _repair_checkpoints(home, config, report)
        ledger = _CutLedger(home, config)
        for generation in commit_journal.generations(home):
            _repair_journal(commit_journal.journal_path(home, generation), sequence, report,
                            ledger)
        for stray in found.strays:
            _move_aside(Path(stray), STRAY_SUFFIX, "a stray file the engine did not write",
                        report)
        _repair_log_states(config, report)
        for partition in range(config.partitions):
            _repair_incarnation(config.partition_dir(partition), report)
        fsync_directory(home)
    _open_and_replay(config, report, on_open)
    return report


class _channel_lock:  # noqa: N801 - used as a context manager, like open()
    """Hold the home's `.lock` while files are repaired; refuse an owned channel."""

    def __init__(self, home: Path, report: RepairReport) -> None:
        self.home = home
        self.report = report
        self.fd = -1

    def __enter__(self) -> None:
        path = self.home / LOCK_FILE
        self.fd, moved = open_lock_file(path, "the channel's lock file")
        if moved is not None:
            self.report.moved_aside.append({"path": str(path), "kept_as": str(moved),
                                            "why": "not a regular file (the engine writes a "
                                                   "new one)"})
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise ChannelEngineError(f"{self.home}: another process owns this channel "
                                     f"({holder}) and has already recovered it") from None

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # the owner's open takes it again: flock is per open file


def _move_aside(path: Path, suffix: str, why: str, report: RepairReport) -> None:
    target = move_aside(path, suffix)
    report.moved_aside.append({"path": str(path), "kept_as": str(target), "why": why})


def _keep_config_aside(home: Path, report: RepairReport) -> None:
    path = home / CONFIG_FILE
    if path.exists() or path.is_symlink():
        _move_aside(path, DAMAGED_SUFFIX, "damaged channel.json", report)
    report.rewritten.append({"path": str(path), "why": "from the supplied config"})


def _repair_checkpoints(home: Path, config: ChannelConfig, report: RepairReport) -> int:
    """Step 3; return the sequence of the checkpoint the open will use (0: none)."""
    backup = (Path(config.backup_checkpoint_dir)
              if config.use_dual_checkpoints and config.backup_checkpoint_dir else None)
    for directory in (home, backup):
        if directory is None:
            continue
        path = directory / checkpoint_file.FILE_NAME
        try:
            checkpoint_file.read(path)
            continue
        except FileNotFoundError:
            why = "was missing"
        except CorruptStateError as exc:
            _move_aside(path, DAMAGED_SUFFIX, f"damaged checkpoint: {exc.reason}", report)
            why = "was damaged"
        report.rewritten.append({"path": str(path), "why": f"{why}; written from the "
                                                           "replayed state"})
    newest = checkpoint_file.read_newest(home, backup if backup and backup.is_dir() else None)
    report.no_checkpoint = newest.checkpoint is None
    return newest.checkpoint.sequence if newest.checkpoint else 0


class _CutLedger:
    """The channel's loss ledger, loaded when recover first cuts a replayed journal: the
    cut is recorded durably before it is made (a crash between leaves the record)."""

    def __init__(self, home: Path, config: ChannelConfig) -> None:
        self.home, self.config = home, config
        self.ledger: LossLedger | None = None

    def record(self, path: Path, position: int, length: int, cause: str) -> None:
        now_ms = int(time.time() * 1000)
        if self.ledger is None:  # as the owner's open loads it (expect_file: its rule)
            backup = self.config.backup_checkpoint_dir if self.config.use_dual_checkpoints \
                else None
            newest = checkpoint_file.read_newest(self.home, Path(backup) if backup and
                                                 Path(backup).is_dir() else None).checkpoint
            expect = newest is not None and newest.version >= checkpoint_file.LEDGER_VERSION
            self.ledger = LossLedger.load(self.home, True, expect, now_ms)
        self.ledger.record_journal(str(path), commit_journal.journal_generation(path), cause,
                                   now_ms, position, length)
        self.ledger.save()


def _cut_cause(path: Path, found: commit_journal.JournalScan) -> str:
    takes = [c for c in found.after if c.kind == commit_journal.TAKE]
    puts = [c for c in found.after if c.kind != commit_journal.TAKE]
    events = sum(end - start for c in takes for _p, start, end in c.entries)
    return (f"journal_cut: {path} cut by recover at byte {found.valid_bytes} "
            f"({found.problem}): {len(takes)} take commits ({events} events) after it may "
            f"come back (delivered again, at least once); {len(puts)} put commits after it "
            "were cut (events the open aborts are recorded by partition); "
            f"{found.unreadable_bytes} unreadable bytes may have held more commits")


def _repair_journal(path: Path, sequence: int, report: RepairReport,
                    ledger: _CutLedger) -> None:
    """Step 4 for one journal."""
    generation = commit_journal.journal_generation(path)
    try:
        found = commit_journal.scan(path)
    except CorruptStateError as exc:  # not a file at all: nothing in it can be read
        if generation >= sequence:
            ledger.record(path, 0, 0, f"journal_unreadable: {path}: {exc.reason}; its take "
                                      "commits may come back and its put commits are aborted")
        _move_aside(path, DAMAGED_SUFFIX, f"unreadable commit journal: {exc.reason}", report)
        if generation >= sequence:
            report.journals_unknown.append({"path": str(path), "why": exc.reason})
        return
    if not found.damaged:
        return
    replayed = generation >= sequence
    if replayed:  # before the cut: a crash after it leaves the record
        ledger.record(path, found.valid_bytes, found.unreadable_bytes, _cut_cause(path, found))
    data = path.read_bytes()
    kept = aside_path(path, DAMAGED_SUFFIX)
    write_atomically(kept, data)
    prefix = data[:found.valid_bytes] if not found.header_damaged else \
        commit_journal.HEADER.pack(commit_journal.MAGIC, commit_journal.VERSION, 0, generation)
    write_atomically(path, prefix)
    report.moved_aside.append({"path": str(path), "kept_as": str(kept),
                               "why": f"damaged commit journal (a copy; the journal was cut "
                                      f"at byte {found.valid_bytes})"})
    report.journals_cut.append({"path": str(path), "position": found.valid_bytes,
                                "reason": found.problem, "kept_as": str(kept),
                                "replayed": replayed, "intact_after": len(found.after),
                                "unreadable_bytes": found.unreadable_bytes})
    if not replayed:  # the checkpoint covers every commit of it
        return
    report.unreadable_journal_bytes += found.unreadable_bytes
    if found.unreadable_bytes:
        report.journals_unknown.append({"path": str(path), "why": f"{found.unreadable_bytes} "
                                        f"unreadable bytes after byte {found.valid_bytes}"})
    for commit in found.after:
        row = {"id": commit.commit_id, "journal": str(path),
               "ranges": [list(entry) for entry in commit.entries],
               "events": sum(end - start for _, start, end in commit.entries)}
        if commit.kind == commit_journal.TAKE:
            report.take_commits_back.append(row)
        else:
            report.put_commits_cut.append({**row, "position": found.valid_bytes})


def _repair_log_states(config: ChannelConfig, report: RepairReport) -> None:
    """A log.state that is not a regular file blocks the log's rewrite of it: move it."""
    for i in range(config.partitions):
        path = config.partition_dir(i) / LOG_STATE_FILE
        if path.is_symlink() or (path.exists() and not path.is_file()):
            _move_aside(path, STRAY_SUFFIX, "log.state is not a regular file", report)


def _repair_incarnation(directory: Path, report: RepairReport) -> None:
    """Step 5's incarnation file (module doc): put an older Weir's copy back, or keep a
    damaged one aside and start a new incarnation at the log start."""
    if not directory.is_dir():
        return  # a vanished directory: the operator's recreate, not a repair
    try:
        incarnation_file.read(directory)
        return
    except CorruptStateError as exc:
        damage = exc.reason
    path = directory / INCARNATION_FILE
    left = ""
    if os.path.lexists(path):
        _move_aside(path, DAMAGED_SUFFIX, f"damaged incarnation file: {damage}", report)
        intact = [kept.name for kept, _ in _intact_strays(directory)]
        if intact:  # the damaged file may be a newer incarnation than they are
            left = (f"; the intact {', '.join(intact)} left aside, not put back: the "
                    "damaged file may have been a newer incarnation than they are")
    else:
        kept = _newest_stray(directory)
        if kept is not None:
            os.rename(kept, path)
            fsync_directory(directory)
            report.rewritten.append({"path": str(path), "why": f"put back from "
                                     f"{kept.name}, moved aside by an older Weir (the "
                                     "newest intact copy by the time it was made)"})
            return
    start = _log_start(directory)
    made = incarnation_file.restart(directory, start)
    report.rewritten.append({"path": str(path), "why": (
        f"a new incarnation {made.id} starting at the log start, offset {start}: which "
        "storage the offsets belong to could not be told, so a drain that sent offsets "
        f"at or above {start} refuses (naming the way out) instead of skipping them{left}")})


def _intact_strays(directory: Path) -> list[tuple[Path, incarnation_file.Incarnation]]:
    """An older Weir's `incarnation[.<n>].stray` copies that read intact."""
    found = []
    for kept in incarnation_file.kept_copies(directory):
        if kept.name.endswith(STRAY_SUFFIX):
            try:
                found.append((kept, incarnation_file.decode(kept.read_bytes(), kept)))
            except (CorruptStateError, OSError):
                continue
    return found


def _newest_stray(directory: Path) -> Path | None:
    """The intact stray copy to put back: the newest by made_at_ms (a settled one before
    its own pending copy), never the first by name; ChannelEngineError, leaving them as they are,
    when the newest copies name different incarnations (which is the partition's cannot
    be told)."""
    copies = _intact_strays(directory)
    if not copies:
        return None
    newest = max((i.made_at_ms, not i.pending) for _, i in copies)
    top = [(kept, i) for kept, i in copies if (i.made_at_ms, not i.pending) == newest]
    if len({(i.id, i.start_offset) for _, i in top}) > 1:
        names = ", ".join(str(kept) for kept, _ in top)
        raise ChannelEngineError(f"{directory}: copies of the partition's incarnation file "
                                 f"disagree ({names}: made at the same time, naming other "
                                 "storage): which to put back cannot be told. Rename the "
                                 f"right one to {INCARNATION_FILE} (or remove the others) "
                                 "and run recover again")
    return top[0][0]


def _log_start(directory: Path) -> int:
    """The lowest offset the partition may hold: log.state's start, or its first
    segment's base offset when lower or log.state is unreadable; 0 without either."""
    starts = [base for base, suffix in filter(None, map(parse_segment_file,
                                                        os.listdir(directory)))
              if suffix == LOG_SUFFIX]
    try:
        state = log_state.read(directory / LOG_STATE_FILE)
    except CorruptStateError:
        state = None
    if state is not None:
        starts.append(state.log_start_offset)
    return min(starts, default=0)


def _open_and_replay(config: ChannelConfig, report: RepairReport,
                     on_open: Callable[[ChannelOwner], None] | None) -> None:
    """Step 6: open as the owner, checking every batch; collect what it cost."""
    with ChannelOwner.open(config, force_recovery=True) as owner:
        for partition, log in enumerate(owner.logs):
            recovered = log.last_recovery
            for lost in recovered.lost_ranges:
                report.lost_ranges.append({"partition": partition, **asdict(lost)})
                report.events_lost += lost.offsets
            for action in recovered.actions:
                if action.kind == TRUNCATED and action.next_offset_kept is None:
                    report.cut_at.append({"partition": partition, "path": action.path,
                                          "offset": action.first_offset_lost,
                                          "position": action.position})
            if recovered.state_problem or recovered.actions:
                report.rewritten.append({"path": str(log.directory / LOG_STATE_FILE),
                                         "why": recovered.summary()})
        report.events_lost += _record_aborted_puts(owner, report)
        if on_open is not None:
            on_open(owner)
        status = owner.status()
    report.recovery = dict(status["recovery"])
    report.events_lost += int(report.recovery.get("lost_events", 0))
    report.events_aborted = int(report.recovery.get("aborted_events", 0))
    report.events_untaken = int(status["events_untaken"])
    if report.journals_unknown or report.recovery.get("events_may_come_back_at_most"):
        report.events_may_come_back_at_most = report.events_untaken
    report.losses = status.get("losses")


def _record_aborted_puts(owner: ChannelOwner, report: RepairReport) -> int:
    """The batches of put commits cut from a journal that the open aborted: their commits
    had returned, so their events are lost; record them by partition. Return the events."""
    cut = {c["id"]: c for c in report.put_commits_cut}
    lost = [(partition, LostRange(start, end, cut[txn]["journal"], cut[txn]["position"], 0,
                                  f"journal_cut: put commit {txn} was cut from "
                                  f"{cut[txn]['journal']} by recover; its batch was not "
                                  "stamped committed, so the open aborted it"), events)
            for txn, partition, start, end, events in owner.recovery.aborted_puts
            if txn in cut]
    if lost:
        owner.record_lost(lost)
    return sum(events for _p, _r, events in lost)

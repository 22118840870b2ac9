"""Verify of a channel's home: channel.json, checkpoints, commit journals, key file, strays.

What verify_channel (verify.py) checks besides the partitions, and what `recover`
(recover.py) reads to decide its repairs (HomeReport: damages, notes, the strays
it moves aside, the newest valid checkpoint):
  * channel.json: present, JSON, every setting valid, naming this home;
  * the checkpoint and, with dual checkpoints, its backup: present and valid;
  * every commit journal: header, then every record up to the file's end (a torn
    tail and damage in the middle both reported at the byte the valid records end);
  * the key file, with encryption: it loads and opens the newest sealed batch of
    each partition;
  * the newest valid checkpoint's own journal: missing, not a regular file or
    without a whole header is damage;
  * `.lock`: anything but a regular file there is damage;
  * strays: files the engine (or the appliance) did not write; files kept aside
    earlier and temp files of an interrupted atomic write are notes.
The formats are those modules' own (channel_config, checkpoint, commit_journal,
loss_ledger, encryption); this module reads them through their readers.

Read-only: never repairs, takes no lock. Failures: what is wrong is recorded in
the report, never raised (OSError of listing the home propagates).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from channel_engine.encryption import BatchSealer, KeyRing
from channel_engine.errors import (
    ChannelEngineError,
    CorruptStateError,
    DecryptionError,
)
from channel_engine.filenames import (
    LOCK_FILE,
    LOG_SUFFIX,
    STRAY_SUFFIX,
    segment_file,
)
from channel_engine.log import record_batch
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal, home_files
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig
from channel_engine.queue.loss_ledger import LossLedger
from channel_engine.tools.log_scan import Damage, scan_log_file, segment_files


@dataclass
class HomeReport:
    """What is wrong with the files of a channel's home (not its partitions)."""

    home: str
    damages: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)  # paths recover moves aside
    checkpoint_source: str | None = None
    checkpoint_sequence: int = 0


def check_config_file(home: Path, report: HomeReport) -> ChannelConfig | None:
    """channel.json of a home: its config, or None with the damage reported."""
    path = home / CONFIG_FILE
    try:
        config = ChannelConfig.load(path)
    except ChannelEngineError as exc:
        report.damages.append(Damage(str(path), _json_byte(str(exc)), _config_reason(exc)))
        return None
    if Path(config.checkpoint_dir).resolve() != home.resolve():
        report.damages.append(Damage(str(path), 0, f"checkpoint_dir {config.checkpoint_dir} "
                                                   f"is not this home"))
        return None
    return config


def _json_byte(message: str) -> int:
    marker = message.rfind("(byte ")
    digits = message[marker + 6:].split(":")[0].split(" ")[0] if marker >= 0 else ""
    return int(digits) if digits.isdigit() else 0


def _config_reason(exc: ChannelEngineError) -> str:
    reason = str(getattr(exc, "reason", exc))
    path_end = reason.find(": ")
    return reason[path_end + 2:] if reason.startswith("/") and path_end > 0 else reason


def verify_home(home: Path, config: ChannelConfig | None, report: HomeReport) -> None:
    """Check the checkpoints, commit journals and strays of a home into `report`."""
    backup = (Path(config.backup_checkpoint_dir) if config and config.use_dual_checkpoints
              and config.backup_checkpoint_dir else None)
    for directory in (home, backup):
        if directory is not None:
            _verify_checkpoint(directory / checkpoint_file.FILE_NAME, report)
    found = checkpoint_file.read_newest(home, backup)
    report.checkpoint_source = found.source
    report.checkpoint_sequence = found.checkpoint.sequence if found.checkpoint else 0
    sequence, why = report.checkpoint_sequence, None
    if sequence > 0:
        why = commit_journal.checkpoint_journal_problem(home, sequence)
        if why is not None:
            report.damages.append(Damage(
                str(commit_journal.journal_path(home, sequence)), 0,
                f"{why}, though checkpoint {sequence} ({found.source}) was written after its "
                "header was synced: the take commits since are unknown (open and recover "
                "report how many events may come back at most)"))
    for generation in commit_journal.generations(home):
        if generation != sequence or why is None:
            _verify_journal(commit_journal.journal_path(home, generation), report)
    if config is not None and config.encryption_key_file is not None:
        _verify_key_file(config, report)
    _verify_losses(home, report)
    lock = home / LOCK_FILE
    if os.path.lexists(lock) and not lock.is_file():
        report.damages.append(Damage(str(lock), 0, "not a regular file: the channel cannot be "
                                                   "locked (open and recover move it to "
                                                   f"{LOCK_FILE}{STRAY_SUFFIX})"))
    _find_strays(home, config, report)


def _verify_losses(home: Path, report: HomeReport) -> None:
    """Losses the channel recorded and no operator acknowledged are not sound: verify agrees
    with the channel's health (`recover --ack` acknowledges them)."""
    ledger = LossLedger.load(home, writable=False, expect_file=False, now_ms=0)
    reason = ledger.health_reason()
    if reason is not None:
        report.damages.append(Damage(str(ledger.path), 0, reason))


def _verify_key_file(config: ChannelConfig, report: HomeReport) -> None:
    """The key file cannot be rebuilt (restore it from a backup): report, never repair.
    It must load (its check values hold) and open the newest sealed batch of each
    partition (a key file without check values, or another channel's)."""
    path = str(config.encryption_key_file)
    why = "(restore the key file from a backup: without it, sealed batches are unreadable)"
    try:
        keys = KeyRing.load(path, str(config.encryption_active_key))
    except (ChannelEngineError, OSError, ValueError, RecursionError) as exc:
        report.damages.append(Damage(path, 0, f"{getattr(exc, 'reason', exc)} {why}"))
        return
    for partition in range(config.partitions):
        try:
            _open_newest_sealed_batch(config.partition_dir(partition),
                                      BatchSealer(keys, config.name, partition))
        except DecryptionError as exc:
            report.damages.append(Damage(path, 0, f"partition {partition}'s newest sealed "
                                                  f"batch does not open: {exc} {why}"))


def _open_newest_sealed_batch(directory: Path, sealer: BatchSealer) -> None:
    """Unseal the newest encrypted batch of a partition's newest non-empty segment, if any;
    DecryptionError if its key does not open it (damage is the partition check's)."""
    if not directory.is_dir():
        return
    for base in sorted((b for b, suffix in segment_files(directory) if suffix == LOG_SUFFIX),
                       reverse=True):
        path = segment_file(directory, base, LOG_SUFFIX)
        scan = scan_log_file(path, base)
        sealed = [(position, header) for position, header in scan.batches
                  if header.attributes & record_batch.ENCRYPTED_MASK]
        if sealed:
            position, header = sealed[-1]
            with open(path, "rb") as f:
                f.seek(position)
                record_batch.unseal(f.read(header.size), sealer)
            return
        if scan.batches:
            return


def _verify_checkpoint(path: Path, report: HomeReport) -> None:
    try:
        checkpoint_file.read(path)
    except FileNotFoundError:
        report.damages.append(Damage(str(path), 0, "missing"))
    except CorruptStateError as exc:
        report.damages.append(Damage(str(path), exc.position, exc.reason))


def _verify_journal(path: Path, report: HomeReport) -> None:
    try:
        found = commit_journal.scan(path)
    except (FileNotFoundError, CorruptStateError) as exc:
        report.damages.append(Damage(str(path), 0, str(getattr(exc, "reason", exc))))
        return
    if not found.ignored:
        return
    if found.torn_tail:
        why = (f"{found.problem}: {found.ignored} bytes after the last valid record (a torn "
               "append: a commit that never returned)")
    else:
        why = (f"{found.problem}; {found.unreadable_bytes} unreadable bytes, then "
               f"{len(found.after)} intact record(s) (commits that returned are unreadable)")
    report.damages.append(Damage(str(path), found.valid_bytes, why))


def _find_strays(home: Path, config: ChannelConfig | None, report: HomeReport) -> None:
    """Files in the home the engine did not write (home_files.py has the rule)."""
    found = home_files.find_strays(home, config)
    report.notes += found.notes
    for path in found.strays:
        report.strays.append(str(path))
        report.damages.append(Damage(str(path), 0, "a stray file the engine did not write "
                                                   f"(open and recover move it to "
                                                   f"{path.name}{STRAY_SUFFIX})"))

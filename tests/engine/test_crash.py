"""Real crashes: a writer process (crash_writer.py) appends, the test kills it with SIGKILL,
reopens the log and checks the contract.

After every kill:
  * every acknowledged batch (its ACK line reached the pipe before the kill) is in the log
    exactly once, at the offsets its append() returned, byte for byte;
  * offsets run from 0 to the log end with no gap, and the log is made of whole batches,
    each equal to a batch the writer attempted; unacknowledged batches may be there (they
    were written, the kill came before the ACK), but at most one per writer thread;
  * the recovery report says what happened: a cut region of zeros is a zero_tail_cut
    (preallocation, no data lost), a cut region holding bytes is `truncated` and only ever
    drops unacknowledged offsets, a deleted segment lay wholly below the log start (a
    retention the kill interrupted), every other segment file is left untouched.

Some writers also run retention (delete_records_before every few ms): then the log start
never goes back behind a returned call, and the checks apply from the log start on.

Policy durability gets the same checks: a process crash keeps the page cache, so every
event whose append() returned survives even though it was never fsynced. Since a kill
cannot tell an fsynced batch from one in the page cache, fsync-mode writers also audit
themselves (crash_writer.py --audit): no append() may return before an fsync that began
after its batch was written and, for a new segment, a directory fsync after its creation.

Kill moments: before or during the open, right after the open, after N ACKs, after a
random delay, and at instants pinned by stop hooks inside the writer (in the middle of a
roll, in the middle of a batch write, just before an fsync, in the middle of a retention).

The default run has a handful of trials; `-m slow` runs several hundred. Every trial is
derived from its number, so a failing one reruns alone, e.g.
`-m slow -k "test_it_keeps_every_acked_batch_over_many_kills[37]"`.
"""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from child_lines import ChildLines, load_script

from channel_engine import Event, LogConfig, PartitionLog, PendingEvent
from channel_engine.errors import InvalidBatch
from channel_engine.log import record_batch
from channel_engine.log.recovery import (
    SEGMENT_DELETED,
    STRAY_FILE_DELETED,
    TRUNCATED,
    ZERO_TAIL_CUT,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WRITER_SCRIPT = HERE / "crash_writer.py"
CODECS = ["none", "gzip", "lz4", "zstd"]
ROUND_STRIDE = 1_000_000  # batch numbers of crash-loop round r start at r * ROUND_STRIDE
WAIT_S = 20.0  # longest wait for a writer's line; it writes ~5 MB/s meanwhile


writer = load_script(WRITER_SCRIPT, "weir_crash_writer")


@dataclass(frozen=True)
class Trial:
    """One writer run and where it gets killed."""

    seed: int
    durability: str = "fsync"
    flush_messages: int | None = None
    preallocate: bool = False
    threads: int = 1
    compression: str = "none"
    kill: str = "acks"  # start | open | acks | delay | stop
    acks: int = 20  # kill == "acks": after this many ACK lines
    delay: float = 0.3  # kill == "start": seconds after spawning; "delay": after OPEN
    stop_phase: str = "after_create"  # kill == "stop": the writer's stop hook
    stop_at: int = 1
    retention: bool = False  # a thread raises the log start (delete_records_before)

    def config(self) -> LogConfig:
        return writer.make_config(self.durability, self.flush_messages, self.preallocate,
                                  compression=self.compression)

    def argv(self, directory: Path, first_batch: int) -> list[str]:
        args = [sys.executable, str(WRITER_SCRIPT), str(directory), "--seed", str(self.seed),
                "--durability", self.durability, "--threads", str(self.threads),
                "--compression", self.compression, "--first-batch", str(first_batch)]
        if self.flush_messages is not None:
            args += ["--flush-messages", str(self.flush_messages)]
        if self.preallocate:
            args.append("--preallocate")
        if self.retention:
            args.append("--retention")
        if self.durability == "fsync":
            args.append("--audit")
        if self.kill == "stop":
            args += ["--stop-phase", self.stop_phase, "--stop-at", str(self.stop_at)]
        return args


def random_trial(number: int, durability: str = "fsync") -> Trial:
    rng = random.Random(number)
    kill = rng.choice(["start", "open", "acks", "acks", "delay", "stop", "stop", "stop"])
    stop_phase = rng.choice(writer.STOP_PHASES)
    flush_messages = None
    if durability == "policy":  # 10**9: never fsynced; else fsyncs now and then
        flush_messages = rng.choice([10**9, rng.randint(50, 2000)])
        if stop_phase == "before_sync":  # needs an fsync to stop at
            flush_messages = rng.randint(50, 2000)
    return Trial(
        seed=number, durability=durability, flush_messages=flush_messages,
        preallocate=rng.random() < 0.5, threads=rng.choice([1, 1, 2, 4]),
        compression=rng.choice(CODECS), kill=kill, acks=rng.randint(1, 80),
        delay=rng.uniform(0.0, 0.4) if kill == "start" else rng.uniform(0.0, 1.0),
        stop_phase=stop_phase, stop_at=rng.randint(1, 4),
        retention=stop_phase == "mid_retention" or rng.random() < 0.25,
    )


# -- running and killing the writer ---------------------------------------------------------
@dataclass
class Outcome:
    """What one writer run printed before it died."""

    trial: Trial
    first_batch: int
    opened: bool = False
    stopped: str | None = None
    acks: dict[int, tuple[int, int]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""

    def may_tear(self) -> bool:
        """Could the kill have landed in the middle of a batch write?"""
        if not self.opened:  # appends start after OPEN is printed
            return False
        if self.trial.kill != "stop":
            return True
        # frozen by a hook under the log lock, the others wait; beside an fsync they write
        return self.trial.stop_phase == "torn" or (self.trial.stop_phase == "before_sync"
                                                   and self.trial.threads > 1)

    def describe(self) -> str:
        return (f"{self.trial} first_batch={self.first_batch} opened={self.opened} "
                f"stopped={self.stopped} acks={len(self.acks)} starts={self.starts[-1:]} "
                f"rc={self.returncode}\n"
                f"{self.stderr[-2000:]}")


class WriterProcess(ChildLines):
    """A crash_writer.py child; its stdout is read line by line on a thread."""

    def __init__(self, argv: list[str], stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "w+")  # noqa: SIM115 - closed in kill()
        self._start_reading(subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE,
                                             stderr=self._stderr, text=True), WAIT_S)
        self.result: tuple[int, str] | None = None

    def kill(self) -> tuple[int, str]:
        """SIGKILL (if still running), reap, read what was left in the pipe."""
        if self.result is not None:
            return self.result
        returncode = self._kill()
        self._stderr.seek(0)
        self.result = returncode, self._stderr.read()
        self._stderr.close()
        return self.result


@contextmanager
def writer_process(argv: list[str], stderr_path: Path) -> Iterator[WriterProcess]:
    process = WriterProcess(argv, stderr_path)
    try:
        yield process
    finally:
        process.kill()  # never leave a writer behind, whatever happened


def count(prefix: str) -> Callable[[list[str]], int]:
    return lambda lines: sum(1 for line in lines if line.startswith(prefix))


def run_and_kill(directory: Path, trial: Trial, first_batch: int = 0) -> Outcome:
    """Start a writer on `directory`, kill it as the trial says, return what it printed."""
    outcome = Outcome(trial, first_batch)
    stderr_path = directory.parent / f"{directory.name}-writer-{first_batch}.stderr"
    with writer_process(trial.argv(directory, first_batch), stderr_path) as proc:
        opens, acks, stops = count("OPEN"), count("ACK"), count("STOP")
        if trial.kill == "start":
            time.sleep(trial.delay)
        elif trial.kill == "acks":
            proc.wait_for(lambda lines: acks(lines) >= trial.acks)
        elif trial.kill == "stop":
            proc.wait_for(lambda lines: stops(lines) > 0)
        else:
            proc.wait_for(lambda lines: opens(lines) > 0)
            if trial.kill == "delay":
                time.sleep(trial.delay)
        outcome.returncode, outcome.stderr = proc.kill()
        lines = list(proc.lines)
    for line in lines:
        word, *rest = line.split(" ", 1)
        if word == "OPEN":
            outcome.opened = True
        elif word == "STOP":
            outcome.stopped = rest[0]
        elif word == "ACK":
            first, last, batch_no = map(int, rest[0].split())
            assert batch_no not in outcome.acks, f"batch {batch_no} acked twice"
            outcome.acks[batch_no] = (first, last)
        elif word == "START":
            outcome.starts.append(int(rest[0]))
        else:
            outcome.errors.append(line)
    assert not outcome.errors, outcome.describe()
    assert outcome.returncode == -signal.SIGKILL, outcome.describe()
    if trial.kill == "stop":
        assert outcome.stopped == trial.stop_phase, f"the stop hook never fired: " \
                                                    f"{outcome.describe()}"
    return outcome


# -- checking the log -----------------------------------------------------------------------
def expected_events(seed: int, batch_no: int, base_offset: int) -> list[Event]:
    return [Event(0, base_offset + i, e.timestamp, e.key, dict(e.headers or {}), e.body)
            for i, e in enumerate(writer.batch_events(seed, batch_no))]


def check_contents(log: PartitionLog, seed: int, runs: list[Outcome]) -> list[int]:
    """Check the log against the writers' runs; return the numbers of its batches in order."""
    acks = {n: span for run in runs for n, span in run.acks.items()}
    where = "\n".join(run.describe() for run in runs)
    start = log.log_start_offset
    assert start == 0 or any(run.trial.retention for run in runs), where
    assert start >= max((o for run in runs for o in run.starts), default=0), \
        f"the log start went back to {start}\n{where}"
    assert start <= log.log_end_offset == log.high_watermark, where
    numbers: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    expected: list[Event] = []
    next_offset = None
    for _, header, data in log.read_batches(start, None, 1 << 62):
        if next_offset is None:  # the first batch holds the log start
            assert header.base_offset <= start < header.next_offset, where
        else:
            assert header.base_offset == next_offset, f"gap before {header.base_offset}\n{where}"
        records = list(record_batch.records(bytes(data)))
        batch_no = int(dict(records[0][4])["batch"])
        assert batch_no not in spans, f"batch {batch_no} appears twice\n{where}"
        events = writer.batch_events(seed, batch_no)
        assert len(records) == len(events) == header.record_count, \
            f"batch {batch_no} at {header.base_offset} is not whole\n{where}"
        for i, ((offset, ts, key, value, headers), event) in enumerate(zip(records, events,
                                                                          strict=True)):
            assert (offset, ts, key, value or b"", [tuple(h) for h in headers]) == (
                header.base_offset + i, event.timestamp, event.key, event.body,
                list((event.headers or {}).items())), \
                f"batch {batch_no} event {i} differs\n{where}"
        numbers.append(batch_no)
        spans[batch_no] = (header.base_offset, header.last_offset)
        expected += [e for e in expected_events(seed, batch_no, header.base_offset)
                     if e.offset >= start]
        next_offset = header.next_offset
    assert (start if next_offset is None else next_offset) == log.log_end_offset, where
    assert list(log.iter_events(start)) == expected, f"the read path disagrees\n{where}"

    for batch_no, span in acks.items():
        if span[1] >= start:  # not deleted by the writer's own retention
            assert spans.get(batch_no) == span, \
                f"acked batch {batch_no} at {span} is {spans.get(batch_no, 'missing')}\n{where}"
    for r, run in enumerate(runs):
        stop = runs[r + 1].first_batch if r + 1 < len(runs) else 1 << 62
        mine = [n for n in numbers if run.first_batch <= n < stop]
        unacked = [n for n in mine if n not in acks]
        assert len(unacked) <= run.trial.threads, f"unacked batches {unacked}\n{where}"
        if run.trial.threads == 1 and mine:  # one thread: batch n + 1 starts after n returned
            assert mine == list(range(mine[0], mine[0] + len(mine))), where
            assert mine[0] == run.first_batch or start > 0, where
    rounds = [n // ROUND_STRIDE for n in numbers]
    assert rounds == sorted(rounds), f"rounds out of order in the log\n{where}"
    return numbers


def end_offset(data: bytes, base_offset: int) -> int:
    """The offset after the last valid batch of a segment file's bytes."""
    position, offset = 0, base_offset
    while True:
        try:
            header = record_batch.check_batch(data, position, len(data), offset, True)
        except InvalidBatch:
            return offset
        position += header.size
        offset = header.next_offset


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.glob("*.log")} if directory.exists() \
        else {}


def check_recovery(log: PartitionLog, before: dict[str, bytes], runs: list[Outcome]) -> None:
    """The report of a writable open after a crash says exactly what recovery did."""
    report = log.last_recovery
    where = f"{report.summary()}\n{report.actions}\n" + "\n".join(r.describe() for r in runs)
    assert not report.clean_shutdown, where
    assert report.recovery_point == log.log_end_offset, where
    kinds = [a.kind for a in report.actions]
    allowed = {ZERO_TAIL_CUT, TRUNCATED, STRAY_FILE_DELETED}
    if any(run.trial.retention for run in runs):
        allowed.add(SEGMENT_DELETED)  # finishing a retention the kill interrupted
    assert set(kinds) <= allowed, where
    assert report.lost_data == (TRUNCATED in kinds), where
    assert report.bytes_dropped == sum(a.bytes_dropped for a in report.actions
                                       if a.kind == TRUNCATED), where
    max_acked = max((last for run in runs for _, last in run.acks.values()), default=-1)
    segments = {seg.log_path.name: seg for seg in log.segments}
    changed = set()
    for action in report.actions:
        name = Path(action.path).name
        if action.kind == STRAY_FILE_DELETED:
            # leftovers of an interrupted write or retention; an index whose .log a
            # retention already renamed to .deleted when the kill came
            orphan_index = name.endswith((".index", ".timeindex")) and \
                name.rsplit(".", 1)[0] + ".log" not in before
            assert name.endswith((".deleted", ".tmp")) or orphan_index, where
            continue
        old = before[name]
        changed.add(name)
        if action.kind == SEGMENT_DELETED:
            assert name not in segments and not Path(action.path).exists(), where
            base = int(name.split(".")[0])
            assert end_offset(old, base) <= log.log_start_offset, f"{name} held data\n{where}"
            continue
        seg = segments[name]
        assert action.position + action.bytes_dropped == len(old), where
        assert seg.log_path.read_bytes() == old[: action.position], where
        assert seg.size == seg.file_size == action.position, where
        dropped = old[action.position:]
        if action.kind == ZERO_TAIL_CUT:
            assert dropped == bytes(len(dropped)), where
            # only preallocation leaves zeros: Kafka's, or fsync durability's zero-fill
            assert any(run.trial.preallocate or run.trial.durability == "fsync"
                       for run in runs), where
        else:
            assert dropped != bytes(len(dropped)), f"zeros reported as lost data\n{where}"
            assert any(run.may_tear() for run in runs), where
            assert action.first_offset_lost == seg.next_offset > max_acked, where
    for name, old in before.items():
        if name not in changed:
            assert (log.directory / name).read_bytes() == old, f"{name} changed\n{where}"
    for name in set(segments) - set(before):  # only a first segment, where the log starts
        assert segments[name].size == 0, where
        assert segments[name].base_offset == log.log_start_offset, where
    assert set(before) - changed <= set(segments), where


def reopen_and_check(directory: Path, config: LogConfig, seed: int,
                     runs: list[Outcome]) -> list[int]:
    """Writable open after the kill: check report and contents, then that the recovered log
    takes a new batch and opens cleanly."""
    before = snapshot(directory)
    log = PartitionLog.open(directory, config)
    try:
        check_recovery(log, before, runs)
        numbers = check_contents(log, seed, runs)
        end = log.log_end_offset
        extra = writer.batch_events(seed, 999_999_999)
        result = log.append(extra)
        assert (result.first_offset, result.last_offset) == (end, end + len(extra) - 1)
    finally:
        log.close()
    with PartitionLog.open(directory, config) as log:
        assert log.last_recovery.clean_shutdown and not log.last_recovery.actions
        assert log.read(end, len(extra)) == expected_events(seed, 999_999_999, end)
    return numbers


def one_crash(tmp_path: Path, trial: Trial) -> None:
    directory = tmp_path / "p0"
    outcome = run_and_kill(directory, trial)
    reopen_and_check(directory, trial.config(), trial.seed, [outcome])


def crash_loop(tmp_path: Path, trials: list[Trial]) -> None:
    """Kill, reopen and write on, kill again...; after each round a read-only look, at the
    end a writable open with the full check."""
    directory = tmp_path / "p0"
    runs: list[Outcome] = []
    seed = trials[0].seed
    for r, trial in enumerate(trials):
        assert trial.seed == seed and trial.config() == trials[0].config()
        runs.append(run_and_kill(directory, trial, first_batch=r * ROUND_STRIDE))
        if directory.exists() and any(directory.glob("*.log")):
            with PartitionLog.open(directory, trial.config(), read_only=True) as reader:
                check_contents(reader, seed, runs)
    reopen_and_check(directory, trials[0].config(), seed, runs)


# -- the default run: a handful of trials ----------------------------------------------------
@pytest.mark.parametrize("trial", [
    Trial(seed=1, kill="acks", acks=40),
    Trial(seed=2, preallocate=True, threads=4, compression="lz4", kill="delay", delay=0.5),
    Trial(seed=3, preallocate=True, threads=2, kill="stop", stop_phase="after_create",
          stop_at=2),
    Trial(seed=4, preallocate=True, compression="zstd", kill="stop", stop_phase="torn",
          stop_at=7),
    Trial(seed=5, preallocate=True, kill="start", delay=0.15),
], ids=["acks", "threads-preallocated-delay", "mid-roll", "torn-write", "at-start"])
def test_it_keeps_every_acked_batch_after_kill_9(tmp_path: Path, trial: Trial) -> None:
    one_crash(tmp_path, trial)


def test_policy_mode_keeps_every_returned_append_after_a_process_crash(tmp_path: Path) -> None:
    one_crash(tmp_path, Trial(seed=6, durability="policy", flush_messages=10**9, threads=2,
                              preallocate=True, kill="acks", acks=60))


def test_it_survives_a_crash_loop(tmp_path: Path) -> None:
    seed = 7
    crash_loop(tmp_path, [
        Trial(seed, preallocate=True, kill="acks", acks=30),
        Trial(seed, preallocate=True, kill="start", delay=0.1),
        Trial(seed, preallocate=True, threads=3, kill="stop", stop_phase="torn", stop_at=5),
        Trial(seed, preallocate=True, kill="stop", stop_phase="mid_retention", stop_at=2,
              retention=True),
        Trial(seed, preallocate=True, threads=3, kill="delay", delay=0.3, retention=True),
    ])


# -- the slow run: hundreds of kills ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("number", range(200))
def test_it_keeps_every_acked_batch_over_many_kills(tmp_path: Path, number: int) -> None:
    one_crash(tmp_path, random_trial(number))


@pytest.mark.slow
@pytest.mark.parametrize("number", range(40))
def test_policy_mode_keeps_returned_appends_over_many_kills(tmp_path: Path,
                                                             number: int) -> None:
    one_crash(tmp_path, random_trial(10_000 + number, durability="policy"))


@pytest.mark.slow
@pytest.mark.parametrize("number", range(20))
def test_it_survives_many_crash_loops(tmp_path: Path, number: int) -> None:
    rng = random.Random(20_000 + number)
    first = random_trial(20_000 + number, durability=rng.choice(["fsync", "fsync", "policy"]))
    rounds = [first]
    for _ in range(1, rng.randint(4, 8)):
        other = random_trial(rng.randrange(1 << 30), durability=first.durability)
        stop_phase = other.stop_phase
        if stop_phase == "before_sync" and first.flush_messages == 10**9:
            stop_phase = "torn"  # this run never fsyncs
        rounds.append(Trial(first.seed, first.durability, first.flush_messages,
                            first.preallocate, other.threads, first.compression, other.kill,
                            other.acks, other.delay, stop_phase, other.stop_at,
                            other.retention))
    crash_loop(tmp_path, rounds)


def test_the_writers_largest_batch_fits_a_segment() -> None:
    """Keeps crash_writer.py's batches within the engine's limits (else appends raise)."""
    events = [PendingEvent(bytes(200), b"key-999", {"batch": b"999999999", "i": b"199"},
                           writer.BASE_TIMESTAMP)] * writer.MAX_EVENTS
    assert len(record_batch.build(events)) < writer.make_config().segment_bytes

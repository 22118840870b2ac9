"""The damage matrix of issue 12: every file kind the engine writes x every kind of on-disk
damage x both durability modes x a clean close or a SIGKILL, each cell checked by one oracle.
A helper module of test_damage_matrix.py, and a script:

    python tests/engine/damage.py --table [--full] [--match TEXT]   # markdown results
    python tests/engine/damage.py child ROOT SEED DURABILITY ENC    # the kill -9 target

A cell (Cell) names its file kind, damage, durability and ending; its seed is derived from
that name only, so a cell is the same on every run (`-k <cell id>` reruns one).

Per cell:
  1. setup (build()): a real 2-partition channel with small segments (several per
     partition) and small index intervals (the indexes have entries), dual checkpoints,
     checkpoint_on_close off (so a commit journal written after the last checkpoint is on
     disk in both endings) and, in the `enc` variants, encryption with a key file. Puts
     (keyed: one partition; keyless: a multi-partition put with a journal record), takes
     committed before the checkpoint, the checkpoint, more puts, takes committed after it
     (journalled), a take rolled back, and one take left in flight. Then the channel is
     closed, or the child process that did all this is killed with SIGKILL.
     The ledger (what was put where, what was taken and committed) is the test's own:
     every event's id and contents are derived from the seed, each event's place comes
     from the take that returned it or from reading the log before the damage, and every
     id must be placed exactly once.
  2. the damage (apply_damage()), checked to have really changed the file system;
  3. the oracle (run_cell()): `verify` before the open; the open by the home (as workers
     and the CLI open, reading channel.json); if it refuses, the error must be a
     ChannelEngineError naming the damaged file, and `python -m channel_engine recover
     HOME` must repair the channel so that it opens by the home again. Two files have
     another repair path (issue 12, point 6): a channel.json that recover cannot read is
     supplied by the appliance (manage.py channel_tool) from its database, so there recover
     must refuse naming channel.json and an open with the appliance's config must work;
     a destroyed key file cannot be repaired at all, so there the open and recover must
     refuse naming it, and the untouched data must pass the whole oracle once the
     operator's copy of the key file is put back. Then every event is taken and
     committed, and:
       * every committed, untaken event is delivered exactly once (same place, same
         contents) or counted lost (inside a record of status()["losses"]), never both,
         never neither; events_lost is at least the number of such events missing;
       * nothing taken and committed before the damage is delivered again, except as many
         as the tools report may come back (a recovery-report or status key naming
         "come_back" and "events"): exactly that many, or, where a report gives a bound
         (a key naming "at_most" too: a journal's content was unknown), at least the exact
         ones and at most the bound;
       * events_untaken before the takes equals what the takes deliver, and is 0 after;
       * new puts get offsets above every offset the ledger ever saw in their partition;
       * health is never "healthy" while a loss is unacknowledged (nor while events are
         missing); `verify` after the run exits non-zero iff an unacknowledged loss is
         reported, and 0 once acknowledge_losses() acknowledged it; `verify` before the
         open exits non-zero when the damage cost anything;
       * a stray file is never deleted (kept in place or moved aside).
Every failed check is one Problem (a short code for the table, and the details); a cell
passes when there is none.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from child_lines import ChildLines  # noqa: E402

from channel_engine import Channel, ChannelConfig, ChannelEngineError, Event  # noqa: E402
from channel_engine.encryption import FORMAT as KEY_FORMAT  # noqa: E402
from channel_engine.encryption import KEY_SIZE, KeyRing  # noqa: E402
from channel_engine.encryption import VERSION as KEY_VERSION  # noqa: E402
from channel_engine.tools import cli as engine_cli  # noqa: E402

FILE_KINDS = ("seg_first", "seg_middle", "seg_active", "index", "timeindex", "log_state",
              "checkpoint", "checkpoint_backup", "journal", "channel_json", "key_file")
DAMAGES = ("bitflip", "overwrite_head", "overwrite_middle", "overwrite_tail",
           "truncate_random", "truncate_zero", "append_garbage", "delete", "replace_dir",
           "stray_empty", "stray_odd")
DURABILITIES = ("fsync", "policy")
ENDINGS = ("clean", "killed")
PARTITION_KINDS = ("seg_first", "seg_middle", "seg_active", "index", "timeindex", "log_state")
STRAYS = ("stray_empty", "stray_odd")
KEY_ID = "k1"
KEYS = (b"k0", b"k1", b"k2", b"k3")
WAIT_S = 60.0
BASE_TIMESTAMP = 1_700_000_000_000


# -- cells ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One cell of the matrix; everything random in it comes from its name."""

    kind: str
    damage: str
    durability: str
    ending: str

    @property
    def base_id(self) -> str:
        return f"{self.kind}-{self.damage}-{self.durability}-{self.ending}"

    @property
    def seed(self) -> int:
        return int(hashlib.sha256(self.base_id.encode()).hexdigest()[:12], 16)

    @property
    def encrypted(self) -> bool:
        """Encryption on for the key file's cells, and for about half of the others."""
        return self.kind == "key_file" or self.seed % 2 == 0

    @property
    def id(self) -> str:
        return self.base_id + ("-enc" if self.encrypted else "")


def full_matrix() -> list[Cell]:
    """Every cell: 11 file kinds x 11 damages x 2 durabilities x 2 endings."""
    return [Cell(k, d, dur, end) for k in FILE_KINDS for d in DAMAGES for dur in DURABILITIES
            for end in ENDINGS]


def sample_matrix(rounds: int = 4) -> list[Cell]:
    """The default suite's sample: each file kind with `rounds` different damages, each
    damage with `rounds` different file kinds, durability and ending spread evenly."""
    cells = []
    for r in range(rounds):
        for k, kind in enumerate(FILE_KINDS):
            damage = DAMAGES[(k + 3 * r) % len(DAMAGES)]
            variant = (k + r) % 4
            cells.append(Cell(kind, damage, DURABILITIES[variant % 2], ENDINGS[variant // 2]))
    return cells


# -- the channel under test -----------------------------------------------------------------
def cell_config(root: Path, durability: str, encrypted: bool) -> ChannelConfig:
    """The channel of every cell (the appliance's copy of its config)."""
    settings: dict[str, Any] = {
        "partitions": 2, "segment_bytes": 1000, "index_interval_bytes": 100,
        "durability": durability, "use_dual_checkpoints": True,
        "backup_checkpoint_dir": str(root / "backup"), "checkpoint_on_close": False,
        "minimum_required_space": 0, "checkpoint_interval_ms": 3_600_000,
    }
    if durability == "policy":
        settings["flush_messages"] = 10**6  # nothing flushed by the policy during the setup
    if encrypted:
        settings.update(encryption_key_file=str(root / "keys" / "weir.keys"),
                        encryption_active_key=KEY_ID)
    return ChannelConfig("dm", [str(root / "data-a"), str(root / "data-b")],
                         str(root / "home"), **settings)


def event_body(seed: int, event_id: int) -> bytes:
    """The body of event `event_id` of a cell: its id, then bytes derived from (seed, id)."""
    rng = random.Random(f"damage-body:{seed}:{event_id}")
    return f"{event_id}:".encode() + rng.randbytes(rng.randint(20, 90))


def event_key(seed: int, event_id: int) -> bytes | None:
    rng = random.Random(f"damage-key:{seed}:{event_id}")
    return None if rng.random() < 0.5 else rng.choice(KEYS)


def event_id_of(event: Event) -> int:
    return int(bytes(event.body).split(b":", 1)[0])


@dataclass
class Ledger:
    """What the setup did, by the test's own accounting: event id -> (partition, offset),
    the ids taken and committed before the damage, and the number of events put."""

    seed: int
    puts: int = 0
    place: dict[int, tuple[int, int]] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    @property
    def untaken(self) -> set[int]:
        return set(range(self.puts)) - self.taken

    def max_offset(self, partition: int) -> int:
        return max((o for p, o in self.place.values() if p == partition), default=-1)

    def to_json(self) -> str:
        return json.dumps({"seed": self.seed, "puts": self.puts, "taken": sorted(self.taken),
                           "place": {str(i): list(p) for i, p in self.place.items()}})

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        data = json.loads(text)
        return cls(data["seed"], data["puts"],
                   {int(i): (p[0], p[1]) for i, p in data["place"].items()}, set(data["taken"]))


class _Builder:
    """Runs the setup of one cell on an open channel and keeps the ledger."""

    def __init__(self, channel: Channel, seed: int) -> None:
        self.channel = channel
        self.rng = random.Random(f"damage-setup:{seed}")
        self.ledger = Ledger(seed)

    def place(self, events: list[Event]) -> None:
        for e in events:
            i = event_id_of(e)
            assert bytes(e.body) == event_body(self.ledger.seed, i), f"setup: event {i} body"
            known = self.ledger.place.setdefault(i, (e.partition, e.offset))
            assert known == (e.partition, e.offset), f"setup: event {i} at two places"

    def puts(self, count: int) -> None:
        seed = self.ledger.seed
        for _ in range(count):
            with self.channel.put() as tx:
                for _ in range(self.rng.randint(3, 6)):
                    i = self.ledger.puts
                    tx.put(event_body(seed, i), key=event_key(seed, i),
                           headers={"id": str(i).encode()}, timestamp=BASE_TIMESTAMP + i)
                    self.ledger.puts += 1

    def takes(self, count: int, commit: bool) -> None:
        for _ in range(count):
            tx = self.channel.take()
            events = tx.take(self.rng.randint(3, 8))
            assert events, "setup: nothing to take"
            self.place(events)
            if commit:
                tx.commit()
                self.ledger.taken.update(event_id_of(e) for e in events)
            else:
                tx.rollback()

    def read_everything(self) -> None:
        for part in self.channel.status()["partitions"]:
            p, offset = part["partition"], part["log_start_offset"]
            while True:
                events = self.channel.read(p, offset, 500)
                if not events:
                    break
                self.place(events)
                offset = events[-1].offset + 1
        missing = set(range(self.ledger.puts)) - set(self.ledger.place)
        assert not missing, f"setup: events put but not found in the log: {sorted(missing)}"


def write_key_file(path: Path, seed: int) -> None:
    """A key file as KeyRing.write_new writes it (mode 600), its key derived from the seed
    so that a damaged key file is the same file on every run."""
    key = random.Random(f"damage-key-file:{seed}").randbytes(KEY_SIZE)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = KeyRing.document({KEY_ID: key})
    assert document["format"] == KEY_FORMAT and document["version"] == KEY_VERSION
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f, indent=2)
    KeyRing.load(path, KEY_ID)  # the engine reads it


def build(root: Path, seed: int, durability: str, encrypted: bool) -> tuple[Channel, Ledger]:
    """The setup of a cell (see the module doc); returns the channel still open, with one
    take in flight, and the ledger."""
    config = cell_config(root, durability, encrypted)
    if encrypted:
        write_key_file(root / "keys" / "weir.keys", seed)
    channel = Channel.open(config)
    b = _Builder(channel, seed)
    b.puts(12)
    b.takes(3, commit=True)
    channel.checkpoint()
    b.puts(12)
    b.takes(2, commit=True)  # journalled after the checkpoint
    b.takes(1, commit=False)
    b.read_everything()
    in_flight = channel.take()
    b.place(in_flight.take(4))  # still in flight at the close or the kill: returns
    return channel, b.ledger


def build_clean(root: Path, cell: Cell) -> Ledger:
    channel, ledger = build(root, cell.seed, cell.durability, cell.encrypted)
    channel.close()
    return ledger


class Child(ChildLines):
    """The setup in a child process (`damage.py child ...`), killed with SIGKILL."""

    def __init__(self, root: Path, cell: Cell) -> None:
        self.stderr_path = root / "child.stderr"
        self._stderr = open(self.stderr_path, "w+")  # noqa: SIM115 - closed in kill()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._start_reading(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "child", str(root), str(cell.seed),
             cell.durability, "1" if cell.encrypted else "0"], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True), WAIT_S)

    def kill(self) -> int:
        try:
            return self._kill()
        finally:
            self._stderr.close()


def build_killed(root: Path, cell: Cell) -> Ledger:
    child = Child(root, cell)
    try:
        ready = child.wait_for(lambda lines: "ready" in lines)
        if not ready:
            raise AssertionError(f"setup child never got ready: {child.lines[-3:]}\n"
                                 f"{child.stderr_path.read_text()[-3000:]}")
    finally:
        rc = child.kill()
    assert rc == -signal.SIGKILL, f"setup child exited {rc}, not by SIGKILL"
    return Ledger.from_json(next(line[len("ledger "):] for line in child.lines
                                 if line.startswith("ledger ")))


def child_main(root: str, seed: str, durability: str, enc: str) -> None:
    """The kill -9 target: the setup, the ledger on stdout, then wait for the SIGKILL."""
    _channel, ledger = build(Path(root), int(seed), durability, enc == "1")
    sys.stdout.write(f"ledger {ledger.to_json()}\nready\n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


# -- damage ---------------------------------------------------------------------------------
def _segments(directory: Path, suffix: str) -> list[Path]:
    return sorted(p for p in directory.iterdir() if re.fullmatch(r"\d{20}" + re.escape(suffix),
                                                                 p.name))


def target_file(root: Path, cell: Cell, rng: random.Random) -> Path:
    """The file of `cell.kind` to damage (a partition chosen by the seed)."""
    config = cell_config(root, cell.durability, cell.encrypted)
    home = config.home
    partition = config.partition_dir(rng.randrange(2))
    if cell.kind in ("seg_first", "seg_middle", "seg_active") and \
            len(_segments(partition, ".log")) < 3:  # the other partition has more
        partition = config.partition_dir(1 - int(partition.name.rsplit("-", 1)[1]))
    if cell.kind in ("seg_first", "seg_middle", "seg_active"):
        logs = _segments(partition, ".log")
        assert len(logs) >= 3, f"setup: only {len(logs)} segments in {partition}"
        return {"seg_first": logs[0], "seg_middle": logs[len(logs) // 2],
                "seg_active": logs[-1]}[cell.kind]
    if cell.kind in ("index", "timeindex"):
        files = [p for p in _segments(partition, "." + cell.kind) if p.stat().st_size]
        assert files, f"setup: every .{cell.kind} in {partition} is empty"
        return files[len(files) // 2]
    if cell.kind == "journal":
        journals = sorted(p for p in home.glob("commits-*.journal") if p.stat().st_size > 16)
        assert journals, f"setup: no commit journal with records in {home}"
        return journals[-1]
    return {"log_state": partition / "log.state", "checkpoint": home / "checkpoint",
            "checkpoint_backup": root / "backup" / "checkpoint",
            "channel_json": home / "channel.json",
            "key_file": root / "keys" / "weir.keys"}[cell.kind]


@dataclass
class Damage:
    """What apply_damage() did: the damaged path, a description, the stray file it made."""

    path: Path
    what: str
    stray: Path | None = None


def _changed(data: bytes, rng: random.Random, n: int) -> bytes:
    """n bytes that each differ from the ones they overwrite."""
    return bytes(b ^ rng.randint(1, 255) for b in data[:n])


def _stray_path(path: Path, damage: str, rng: random.Random) -> Path:
    directory = path.parent
    if damage == "stray_empty":
        segment = re.fullmatch(r"(\d{20})(\.log|\.index|\.timeindex)", path.name)
        if segment or path.name == "log.state":
            suffix = segment.group(2) if segment else ".log"
            top = max(int(p.name[:20]) for p in _segments(directory, ".log"))
            return directory / f"{top + rng.randint(50, 5000):020d}{suffix}"
        journal = re.fullmatch(r"commits-(\d{20})\.journal", path.name)
        if journal:
            return directory / f"commits-{int(journal.group(1)) + rng.randint(2, 9):020d}.journal"
        return directory / f"{path.name}.orig"
    return directory / rng.choice([f"{path.name}~", f".{path.name}.swp", "notes.txt",
                                   f"{path.name[:20]}.bak"])


def apply_damage(path: Path, damage: str, rng: random.Random) -> Damage:
    """Damage `path` as `damage` says; check that the file system really changed."""
    data = path.read_bytes()
    size = len(data)
    assert size > 0 or damage in ("none", "delete", "replace_dir", *STRAYS), \
        f"setup: {path} is empty"
    n = min(size, rng.randint(4, 24))
    if damage == "bitflip":
        pos, bit = rng.randrange(size), rng.randrange(8)
        new = data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1:]
        what = f"bit {bit} of byte {pos} flipped"
    elif damage.startswith("overwrite_"):
        pos = {"overwrite_head": 0, "overwrite_middle": (size - n) // 2,
               "overwrite_tail": size - n}[damage]
        new = data[:pos] + _changed(data[pos:], rng, n) + data[pos + n:]
        what = f"{n} bytes at {pos} overwritten"
    elif damage == "truncate_random":
        cut = rng.randrange(1, size) if size > 1 else 0
        new, what = data[:cut], f"truncated from {size} to {cut} bytes"
    elif damage == "truncate_zero":
        new, what = b"", f"truncated from {size} to 0 bytes"
    elif damage == "append_garbage":
        garbage = rng.randbytes(rng.randint(1, 64))
        new, what = data + garbage, f"{len(garbage)} random bytes appended"
    elif damage == "none":  # the control: an undamaged channel
        return Damage(path, "not damaged (control)")
    elif damage == "delete":
        path.unlink()
        assert not os.path.lexists(path)
        return Damage(path, "deleted")
    elif damage == "replace_dir":
        path.unlink()
        path.mkdir()
        assert path.is_dir()
        return Damage(path, "replaced by an empty directory")
    elif damage in STRAYS:
        stray = _stray_path(path, damage, rng)
        assert not os.path.lexists(stray), f"harness: {stray} exists already"
        content = b"" if damage == "stray_empty" else rng.randbytes(rng.randint(1, 200))
        stray.write_bytes(content)
        assert path.read_bytes() == data
        return Damage(path, f"stray file {stray.name} ({len(content)} bytes) beside it", stray)
    else:
        raise ValueError(f"unknown damage {damage!r}")
    assert new != data, f"harness: damage {damage} left {path} unchanged"
    path.write_bytes(new)
    assert path.read_bytes() == new
    return Damage(path, what)


# -- the oracle -----------------------------------------------------------------------------
@dataclass
class Problem:
    """One failed check: a short code (the table's) and what was expected and seen."""

    code: str
    detail: str


@dataclass
class Result:
    """The outcome of one cell."""

    cell: Cell
    damage: Damage | None = None
    problems: list[Problem] = field(default_factory=list)
    needed_recover: bool = False
    key_restored: bool = False
    config_supplied: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def fail(self, code: str, detail: str) -> None:
        self.problems.append(Problem(code, detail))

    def message(self) -> str:
        where = (f"{self.damage.path} ({self.damage.what})" if self.damage else "(no damage)")
        lines = [f"cell {self.cell.id} (seed {self.cell.seed}): {where}"
                 + ("; recover was needed" if self.needed_recover else "")]
        lines += [f"  [{p.code}] {p.detail}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def run_verify(home: Path) -> tuple[int, str]:
    """`python -m channel_engine verify HOME` (in process: the same code as the CLI)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = engine_cli.main(["verify", str(home)], out=out)
        except BaseException as exc:  # noqa: BLE001 - an uncaught error is a finding
            return 99, f"verify raised {type(exc).__name__}: {exc}"
    return rc, (out.getvalue() + err.getvalue()).strip()


def run_recover(home: Path) -> tuple[int, str]:
    """`python -m channel_engine recover HOME --json` in a child process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        proc = subprocess.run([sys.executable, "-m", "channel_engine", "recover", str(home),
                               "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        return 124, "recover did not finish within 120 s (killed)"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _names(exc: BaseException, path: Path) -> bool:
    return path.name in str(exc) or str(path) in str(exc)


def come_back_count(*reports: Any) -> tuple[int, int | None]:
    """Events the tools report may come back (at-least-once after a journal cut): (exact,
    at_most). exact: every int under a key naming both "come_back" and "event" but not
    "at_most", in the reports given (the take commits cut off whose records are intact).
    at_most: None when no report gives a bound (the journals' content was known), else the
    bound on every event that may come back, the exact ones included: per report the
    largest int under a key naming "come_back", "event" and "at_most" (one report may
    hold copies of one bound: recover's JSON nests the open's recovery report), summed
    over the reports."""
    exact, bounds = 0, []
    for report in reports:
        found: list[int] = []
        stack = [report]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                for key, value in item.items():
                    if isinstance(value, bool) or not isinstance(value, int):
                        if isinstance(value, (dict, list)):
                            stack.append(value)
                    elif "come_back" in key and "event" in key and "at_most" in key:
                        found += [value] if value else []
                    elif "come_back" in key and "event" in key:
                        exact += value
            elif isinstance(item, list):
                stack.extend(item)
        if found:
            bounds.append(max(found))
    return exact, (sum(bounds) if bounds else None)


def _open(config: ChannelConfig | Path) -> Channel:
    """Open as a worker or the CLI does (by the home, reading channel.json), or with the
    appliance's copy of the config."""
    return Channel.open(config, owner_wait_ms=5_000)


def _short(ids: list[Any] | set[Any], n: int = 8) -> str:
    items = sorted(ids)
    return f"{items[:n]}{' ...' if len(items) > n else ''}"


class CellRun:
    """One cell: setup, damage, oracle. Problems go to `result`; nothing raises."""

    def __init__(self, cell: Cell, root: Path) -> None:
        self.cell = cell
        self.root = root
        self.config = cell_config(root, cell.durability, cell.encrypted)
        self.result = Result(cell)
        self.ledger = Ledger(cell.seed)
        self.recover_report: Any = None
        self.came_back: set[int] = set()

    def setup(self) -> Ledger:
        """Build the cell's channel, closed or killed; return the ledger."""
        build_it = build_killed if self.cell.ending == "killed" else build_clean
        return build_it(self.root, self.cell)

    def run(self) -> Result:
        rng = random.Random(f"damage:{self.cell.seed}")
        self.ledger = self.setup()
        key_copy = self.root / "weir.keys.copy"
        if self.cell.encrypted:
            shutil.copy2(self.root / "keys" / "weir.keys", key_copy)
        damage = apply_damage(target_file(self.root, self.cell, rng), self.cell.damage, rng)
        self.result.damage = damage
        verify_rc, verify_out = run_verify(self.config.home)
        channel = self.open_or_recover(damage)
        if channel is None and self.cell.kind == "key_file":
            channel = self.after_key_restore(key_copy, damage)
        if channel is not None:
            self.check_channel(channel, verify_rc, verify_out)
        if damage.stray is not None:
            self.check_stray_kept(damage.stray)
        return self.result

    # -- open, recover ----------------------------------------------------------------------
    def open_or_recover(self, damage: Damage) -> Channel | None:
        r = self.result
        try:
            return _open(self.config.home)
        except ChannelEngineError as exc:
            refused: BaseException = exc
        except Exception as exc:  # noqa: BLE001 - any other error is a finding
            r.fail("open-raised-" + type(exc).__name__,
                   f"open raised {type(exc).__name__} (not a ChannelEngineError): {exc}")
            refused = exc
        if isinstance(refused, ChannelEngineError) and not _names(refused, damage.path):
            r.fail("open-error-unnamed", f"open refused without naming {damage.path.name}: "
                                         f"{refused}")
        r.needed_recover = True
        rc, out = run_recover(self.config.home)
        if rc != 0:
            if self.cell.kind == "key_file":
                if damage.path.name not in out:
                    r.fail("recover-error-unnamed", f"recover refused (exit {rc}) without "
                                                   f"naming the key file: {out[-500:]}")
                r.notes.append(f"the key file cannot be repaired: recover exit {rc}")
                return None
            if self.cell.kind == "channel_json":
                return self.open_with_config(rc, out, damage)
            r.fail("recover-failed", f"open refused ({refused}); recover exited {rc}: "
                                     f"{out[-800:]}")
            return None
        with contextlib.suppress(ValueError):
            self.recover_report = json.loads(out[out.index("{"):])
        try:
            return _open(self.config.home)
        except Exception as exc:  # noqa: BLE001
            r.fail("open-after-recover", f"recover exited 0 but open still raised "
                                         f"{type(exc).__name__}: {exc}")
            return None

    def open_with_config(self, rc: int, out: str, damage: Damage) -> Channel | None:
        """A channel.json recover cannot read: the appliance (manage.py channel_tool) supplies
        the config from its database; the open must then work (and rewrite channel.json)."""
        r = self.result
        if damage.path.name not in out:
            r.fail("recover-error-unnamed", f"recover refused (exit {rc}) without naming "
                                            f"channel.json: {out[-500:]}")
        r.notes.append(f"recover HOME cannot read channel.json (exit {rc}): opened with the "
                       "appliance's copy of the config")
        r.config_supplied = True
        try:
            return _open(self.config)
        except Exception as exc:  # noqa: BLE001
            r.fail("open-with-config", f"open with the appliance's config raised "
                                       f"{type(exc).__name__}: {exc}")
            return None

    def after_key_restore(self, key_copy: Path, damage: Damage) -> Channel | None:
        """A destroyed key file: put the operator's copy back; the data must be untouched."""
        path = damage.path
        if path.is_dir():
            shutil.rmtree(path)
        shutil.copy2(key_copy, path)
        self.result.key_restored = True
        try:
            return _open(self.config.home)
        except Exception as exc:  # noqa: BLE001
            self.result.fail("open-after-key-restore", f"the key file restored, open still "
                                                       f"raised {type(exc).__name__}: {exc}")
            return None

    # -- the checks on an open channel --------------------------------------------------------
    def check_channel(self, channel: Channel, verify_rc: int, verify_out: str) -> None:
        r = self.result
        losses: dict[str, Any] | None = None
        try:
            status = channel.status()
            losses = self.losses(status)
            if losses["unacknowledged"] and status["health"] == "healthy":
                r.fail("healthy-with-loss", f"{losses['unacknowledged']} unacknowledged loss "
                                            "record(s) and health is 'healthy'")
            delivered = self.drain(channel)
            after = channel.status()
            ranges = [(rec["partition"], rec["start"], rec["end"]) for rec in losses["records"]]
            missing = self.check_delivered(delivered, ranges, losses, status)
            if missing and status["health"] == "healthy":
                r.fail("healthy-with-loss", f"{len(missing)} committed untaken events missing "
                                            "and health was 'healthy'")
            if status["events_untaken"] != len(delivered):
                r.fail("untaken-mismatch", f"events_untaken was {status['events_untaken']} "
                                           f"before the takes; the takes delivered "
                                           f"{len(delivered)}")
            if losses["unacknowledged"] and after["health"] == "healthy":
                r.fail("healthy-with-loss", "health is 'healthy' after the takes, with "
                                            f"{losses['unacknowledged']} loss record(s) "
                                            "unacknowledged")
            if after["events_untaken"] != 0:
                r.fail("phantom-backlog", f"takes return nothing, events_untaken is "
                                          f"{after['events_untaken']}")
            self.check_new_puts(channel)
            cost = bool(missing) or r.needed_recover or bool(self.came_back)
            if cost and verify_rc == 0:
                r.fail("verify-missed-damage", "verify before the open exited 0, yet the "
                                               "damage cost events, a refused open or a repair")
            if verify_rc not in (0, 1):
                r.fail("verify-crashed", f"verify before the open: {verify_out[-500:]}")
        except Exception as exc:  # noqa: BLE001
            r.fail("raised-" + type(exc).__name__, "".join(traceback.format_exception(exc))
                   [-1500:])
        finally:
            with contextlib.suppress(Exception):
                channel.close()
        self.check_verify_agrees(losses)

    def losses(self, status: dict[str, Any]) -> dict[str, Any]:
        found = status.get("losses")
        if not isinstance(found, dict):
            self.result.fail("no-losses-interface", "status() has no 'losses' (COMMON.md's "
                                                    "loss interface): counted as no loss")
            return {"events_lost": 0, "unacknowledged_events": 0, "unacknowledged": 0,
                    "records": []}
        return found

    def drain(self, channel: Channel) -> list[Event]:
        delivered: list[Event] = []
        for _ in range(10_000):
            tx = channel.take()
            try:
                events = tx.take(500)
            except ChannelEngineError as exc:
                self.result.fail("take-raised", f"after {len(delivered)} events a take "
                                                f"raised {type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    tx.rollback()
                return delivered
            tx.commit()
            if not events:
                return delivered
            delivered += events
        raise AssertionError("harness: the takes never ended")

    def check_delivered(self, delivered: list[Event], ranges: list[tuple[int, int, int]],
                        losses: dict[str, Any], status: dict[str, Any]) -> set[int]:
        """Delivered once or counted lost; nothing taken comes back uncounted. Returns the
        ids of the committed untaken events that were not delivered."""
        r, ledger = self.result, self.ledger
        seed = ledger.seed
        ids = Counter(event_id_of(e) for e in delivered)
        twice = [i for i, n in ids.items() if n > 1]
        if twice:
            r.fail("delivered-twice", f"{len(twice)} events delivered more than once: "
                                      f"{_short(twice)}")
        wrong = [i for i in ids if i not in ledger.place]
        wrong += [event_id_of(e) for e in delivered if event_id_of(e) in ledger.place and (
            (e.partition, e.offset) != ledger.place[event_id_of(e)]
            or bytes(e.body) != event_body(seed, event_id_of(e))
            or e.key != event_key(seed, event_id_of(e)))]
        if wrong:
            r.fail("wrong-event", f"{len(wrong)} delivered events were never put, moved or "
                                  f"changed: ids {_short(wrong)}")

        def counted(p: int, o: int) -> bool:
            return any(p == rp and rs <= o < re_ for rp, rs, re_ in ranges)

        both = [event_id_of(e) for e in delivered if counted(e.partition, e.offset)]
        if both:
            r.fail("delivered-and-lost", f"{len(both)} delivered events are inside a counted "
                                         f"loss: {_short(both)}")
        missing = ledger.untaken - set(ids)
        uncounted = [i for i in missing if not counted(*ledger.place[i])]
        if uncounted:
            r.fail("lost-uncounted", f"{len(uncounted)} of {len(ledger.untaken)} committed "
                                     f"untaken events neither delivered nor counted lost: ids "
                                     f"{_short(uncounted)} at "
                                     f"{_short([ledger.place[i] for i in uncounted], 4)}; "
                                     f"events_lost={losses['events_lost']}")
        if losses["events_lost"] != len(missing) or \
                losses["unacknowledged_events"] != losses["events_lost"]:
            r.fail("lost-miscounted", f"{len(missing)} committed untaken events missing; "
                                      f"status says events_lost={losses['events_lost']}, "
                                      f"unacknowledged_events="
                                      f"{losses['unacknowledged_events']}")
        self.came_back = set(ids) & ledger.taken
        exact, at_most = come_back_count(self.recover_report, status.get("recovery"),
                                         status.get("losses"))
        back = len(self.came_back)
        if back != exact if at_most is None else not exact <= back <= max(exact, at_most):
            bound = "" if at_most is None else f", and at most {at_most} in all"
            r.fail("came-back", f"{back} events taken and committed before the "
                                f"damage were delivered again ({_short(self.came_back)}); "
                                f"the tools reported {exact} may come back{bound}")
        return missing

    def check_new_puts(self, channel: Channel) -> None:
        r, seed = self.result, self.ledger.seed
        first = 10**6
        with channel.put() as tx:
            for i in range(first, first + 8):
                tx.put(event_body(seed, i), key=event_key(seed, i))
        delivered = self.drain(channel)
        got = sorted(event_id_of(e) for e in delivered)
        if got != list(range(first, first + 8)):
            r.fail("new-put-lost", f"8 events put after the damage; the takes delivered ids "
                                   f"{_short(got)}")
        reused = [(e.partition, e.offset) for e in delivered
                  if e.offset <= self.ledger.max_offset(e.partition)]
        if reused:
            r.fail("offset-reused", f"new puts got offsets already committed before the "
                                    f"damage: {_short(reused)} (ledger max per partition "
                                    f"{[self.ledger.max_offset(p) for p in range(2)]})")

    def check_verify_agrees(self, losses: dict[str, Any] | None) -> None:
        r, home = self.result, self.config.home
        rc, out = run_verify(home)
        unacknowledged = bool(losses and losses["unacknowledged"])
        if rc not in (0, 1):
            r.fail("verify-crashed", f"verify after the run: {out[-500:]}")
        elif unacknowledged and rc == 0:
            r.fail("verify-disagrees", "status() reports an unacknowledged loss, verify "
                                       "exits 0")
        elif not unacknowledged and rc != 0:
            r.fail("verify-disagrees", f"status() reports no unacknowledged loss, verify "
                                       f"exits {rc}: {out[:600]}")
        if not unacknowledged:
            return
        try:
            with _open(self.config.home) as channel:
                acknowledged = channel.acknowledge_losses()
                status = channel.status()
        except Exception as exc:  # noqa: BLE001
            r.fail("acknowledge-failed", f"{type(exc).__name__}: {exc}")
            return
        left = status.get("losses", {}).get("unacknowledged")
        if status["health"] == "healthy" and left:
            r.fail("healthy-with-loss", f"reopened: health 'healthy' with {left} loss "
                                        "record(s) unacknowledged")
        if not acknowledged or left:
            r.fail("acknowledge-failed", f"acknowledge_losses() returned {acknowledged}, "
                                         f"{left} left unacknowledged")
        rc, out = run_verify(home)
        if rc != 0:
            r.fail("verify-after-ack", f"losses acknowledged, verify exits {rc}: "
                                       f"{out[:600]}")

    def check_stray_kept(self, stray: Path) -> None:
        """A stranger is kept (in place, or moved aside under a name starting with its
        own). An empty index file without its .log and an empty commit journal are the
        engine's own leftovers of a crash (Kafka deletes the first; the journal's header is
        written after its creation), holding nothing: those may go."""
        kept = [p for p in stray.parent.iterdir() if p.name.startswith(stray.name)]
        if kept:
            return
        engine_name = re.fullmatch(r"\d{20}\.(index|timeindex)|commits-\d{20}\.journal",
                                   stray.name)
        if engine_name and self.cell.damage == "stray_empty":
            self.result.notes.append(f"the empty {stray.name} was deleted as the engine's own "
                                     "leftover (allowed: it holds nothing)")
            return
        self.result.fail("stray-deleted", f"the stray file {stray.name} is gone from "
                                          f"{stray.parent} (never delete; move aside)")


def run_cell(cell: Cell, root: Path) -> Result:
    """Set up, damage and check one cell under `root` (an empty directory)."""
    return CellRun(cell, root).run()


# -- the table ------------------------------------------------------------------------------
# Short names of the problem codes in the table (the test messages use the codes).
ABBREVIATIONS = {
    "lost-uncounted": "LOST", "lost-miscounted": "", "healthy-with-loss": "",
    "untaken-mismatch": "", "phantom-backlog": "phantom", "take-raised": "take-err",
    "new-put-lost": "newput", "offset-reused": "reuse", "came-back": "back",
    "delivered-twice": "twice", "delivered-and-lost": "both", "wrong-event": "wrong",
    "verify-disagrees": "verify!=", "verify-missed-damage": "verify-0",
    "verify-after-ack": "verify-ack", "recover-failed": "recover-err",
    "open-after-recover": "reopen-err", "open-error-unnamed": "unnamed",
    "recover-error-unnamed": "", "stray-deleted": "stray-del",
}
LEGEND = (
    "Each cell: `ok`, or the problems, per variant (f/p = fsync/policy, c/k = clean close/"
    "killed; no prefix = every variant run). `iface`: the only problem is that status() has "
    "no 'losses' (nothing was lost). LOST: committed untaken events neither delivered nor "
    "counted (also: events_lost/events_untaken wrong, health 'healthy'); phantom: "
    "events_untaken > 0 while takes return nothing; take-err: a take raised; newput: events "
    "put after the damage not delivered; reuse: a new put got an offset committed before; "
    "back: taken events delivered again, not reported; verify!=: verify and status disagree "
    "after the run; verify-0: verify said sound before the open, yet the damage cost "
    "something; open:X: open raised X, not a ChannelEngineError; unnamed: the error does not "
    "name the damaged file; recover-err / reopen-err: recover failed / open failed after "
    "it; stray-del: a stray file was deleted. R: open refused, recover ran; K: the key file "
    "cannot be repaired, the data opened once it was restored; C: recover could not read "
    "channel.json, the channel opened with the appliance's config.")


def markdown_table(results: list[Result]) -> str:
    """File kind x damage, each cell the outcome of its variants (see LEGEND)."""
    by_place: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        by_place.setdefault((result.cell.kind, result.cell.damage), []).append(result)
    damages = [d for d in DAMAGES if any(d == k[1] for k in by_place)]
    lines = ["| file \\ damage | " + " | ".join(damages) + " |",
             "|---|" + "---|" * len(damages)]
    for kind in FILE_KINDS:
        row = [_place_text(by_place.get((kind, damage), [])) for damage in damages]
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    passed = sum(r.passed for r in results)
    only_iface = sum({p.code for p in r.problems} == {"no-losses-interface"} for r in results)
    codes = Counter(p.code for r in results for p in r.problems)
    lines += ["", f"{passed} of {len(results)} cells pass, {only_iface} more fail only for "
                  f"the missing loss interface; {sum(r.needed_recover for r in results)} "
                  "needed recover. Problem codes: "
                  + ", ".join(f"{code} x{n}" for code, n in codes.most_common()), "", LEGEND]
    return "\n".join(lines)


def _place_text(results: list[Result]) -> str:
    """One table cell: the variants with the same outcome grouped together."""
    groups: dict[str, list[str]] = {}
    for result in results:
        variant = f"{result.cell.durability[0]}{result.cell.ending[0]}"
        groups.setdefault(_outcome(result), []).append(variant)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{','.join(v)}: {text}" for text, v in groups.items())


def _outcome(result: Result) -> str:
    mark = ("K " if result.key_restored else "C " if result.config_supplied
            else "R " if result.needed_recover else "")
    codes = {p.code for p in result.problems}
    if not codes:
        return mark + "ok"
    if codes == {"no-losses-interface"}:
        return mark + "iface"
    names = []
    for code in sorted(codes - {"no-losses-interface"}):
        if code.startswith("open-raised-"):
            names.append("open:" + code[len("open-raised-"):])
        else:
            names.append(ABBREVIATIONS.get(code, code))
    return mark + " ".join(sorted({n for n in names if n}, key=names.index))


def run_many(cells: list[Cell], scratch: Path) -> Iterator[Result]:
    for i, cell in enumerate(cells):
        root = scratch / f"{i:03d}-{cell.id}"
        root.mkdir(parents=True)
        try:
            result = run_cell(cell, root)
        except Exception as exc:  # noqa: BLE001 - a harness error shows in the table
            result = Result(cell)
            result.fail("harness-" + type(exc).__name__, str(exc))
        shutil.rmtree(root, ignore_errors=True)
        yield result


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        child_main(*argv[1:5])
        return 0
    if "--table" not in argv:
        print(__doc__)
        return 2
    cells = full_matrix() if "--full" in argv else sample_matrix()
    if "--match" in argv:
        text = argv[argv.index("--match") + 1]
        cells = [c for c in cells if text in c.id]
    import tempfile
    results = []
    with tempfile.TemporaryDirectory(prefix="weir-damage-") as scratch:
        for result in run_many(cells, Path(scratch)):
            results.append(result)
            print(("ok   " if result.passed else "FAIL ") + result.message().splitlines()[0]
                  + "".join(f" [{p.code}]" for p in result.problems), file=sys.stderr)
    print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

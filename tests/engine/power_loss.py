"""Power-loss simulation (as Jepsen's LazyFS or ALICE do, in Python, without FUSE).

SIGKILL keeps the page cache; power loss does not. This module records every
file-changing `os` call a workload makes in a child process, then rebuilds
crash states from the record: what a disk may hold after the power went out
at any instant, opens each state with the engine and checks the contract.

    python tests/engine/power_loss.py summary [--states N] [--seed S] [WORKLOAD ...]
    python tests/engine/power_loss.py record WORKLOAD SEED ROOT OUT   (the child)

Recording (the child). `Recorder.install()` replaces os.open, os.write,
os.pwrite, os.ftruncate, os.posix_fallocate, os.fsync, os.fdatasync,
os.rename, os.replace, os.unlink, os.mkdir, os.rmdir, os.close and os.fdopen
with wrappers that log, in the order the calls return (one lock), every call
on a path under the recording root. pathlib's mkdir/unlink/rename call these
too. The only file object the engine writes is the key file (KeyRing.write_new,
via os.fdopen): its buffered writes are logged when flushed. mmap is used only
to read segments; indexes are plain appended files, recorded like data.
Files are identified by a file id the recorder hands out at create (not the
inode number, which the kernel reuses after an unlink). Log entries:

    ("create", rel, fid)   ("mkdir", rel)   ("rename", src, dst)   ("unlink", rel)
    ("rmdir", rel)         ("write", fid, offset, data)   ("trunc", fid, size)
    ("falloc", fid, offset, length)   ("sync", fid)   ("dsync", dir_rel)
    ("event", kind, data)  workload events, logged when the engine call returned

Crash states (the parent). A crash at point P (a prefix of the log) keeps, per
file, every data operation before that file's last fsync/fdatasync before P,
and per directory every create/rename/unlink/mkdir before that directory's
last fsync before P (ext4 data=ordered, modelled conservatively: an fsync of a
file does not make its name durable, and a rename or create not followed by
a directory fsync may or may not have happened: a random subset of them is
kept, in log order). A file's data written since its last fsync survives as
writeback leaves it: its length from some version between that fsync and P,
and each 512-byte sector from some version (a sector holds everything written
to it up to the version it was written back at; sectors in any order, so a
write may be torn into any subset of its sectors; or, untorn, one version for
the whole file). Modes: "durable" keeps nothing unsynced, "cache" keeps it all
(what SIGKILL leaves), "random" draws as above (keep_probability: how often a
draw takes the newest version). Indexes are plain files (no mmap), so they are
modelled like any data, not as garbage.

Checks. Each state is opened as its next owner opens it (PartitionLog.open on
the partition dir; ChannelOwner.open, which is Channel.open without the socket
server, on the home's config) and drained by one take. Fsync durability: open
never raises; every event whose put commit returned before P is delivered
exactly once at the offset its commit reported, in commit order within its
partition, unless a take of it committed; an event never put (or put in a
rolled-back transaction) never appears; a cross-partition put is all or
nothing; a take whose commit returned never comes back. Policy durability: the
same, except that committed takes may come back (at-least-once) and committed
events may be lost: only events committed after the last completed explicit
flush (a clean close counts as one) and, in each partition (of a log or of a
channel, multi-partition puts included), fewer than flush_messages of them; the
log end never falls below the end log.state recorded (offsets once handed out are
not handed out again). The events
lost, and in how many states the engine
counted a loss (status()["losses"], else recovery.lost_events plus the logs'
lost ranges), are reported. Findings that break no rule but are worth a report
(kind "note:...") are counted apart from failures.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SECTOR = 512
DIR = "<dir>"
Op = tuple[Any, ...]

# -- recording (the child) ----------------------------------------------------------------


class Recorder:
    """Wraps the `os` calls that change files and logs those under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.normpath(os.path.abspath(root))
        self.ops: list[Op] = []
        self.lock = threading.RLock()
        self.names: dict[str, int] = {}  # rel path -> file id (the recorder's namespace)
        self.dirs: set[str] = {""}
        self.fds: dict[int, tuple[str, Any, bool]] = {}  # fd -> (kind, fid or rel, append)
        self.next_fid = 1
        self.initial: dict[str, Any] = self._snapshot()
        self.orig: dict[str, Callable[..., Any]] = {}

    def _snapshot(self) -> dict[str, Any]:
        """The tree before the workload: dirs, and files (fid, content), all durable."""
        initial: dict[str, Any] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames:
                rel = self.rel(os.path.join(dirpath, name))
                assert rel is not None
                self.dirs.add(rel)
                initial[rel] = DIR
            for name in filenames:
                rel = self.rel(os.path.join(dirpath, name))
                assert rel is not None
                fid = self._new_fid(rel)
                initial[rel] = (fid, Path(dirpath, name).read_bytes())
        return initial

    def _new_fid(self, rel: str) -> int:
        fid, self.next_fid = self.next_fid, self.next_fid + 1
        self.names[rel] = fid
        return fid

    def rel(self, path: Any) -> str | None:
        """Path relative to the root, "" for the root, None if outside it."""
        if isinstance(path, int):
            return None
        p = os.path.normpath(os.path.abspath(os.fspath(path)))
        if p == self.root:
            return ""
        if p.startswith(self.root + os.sep):
            return p[len(self.root) + 1:]
        return None

    def event(self, kind: str, **data: Any) -> None:
        """Log a workload event (call it right after the engine call returned)."""
        with self.lock:
            self.ops.append(("event", kind, data))

    # -- the wrappers ---------------------------------------------------------------------
    def install(self) -> None:
        """Replace the `os` functions (for the rest of this process)."""
        for name in ("open", "write", "pwrite", "ftruncate", "posix_fallocate", "fsync",
                     "fdatasync", "rename", "replace", "unlink", "mkdir", "rmdir", "close",
                     "fdopen"):
            self.orig[name] = getattr(os, name)
            setattr(os, name, getattr(self, "_" + name))

    def uninstall(self) -> None:
        """Put the original `os` functions back."""
        for name, fn in self.orig.items():
            setattr(os, name, fn)
        self.orig = {}

    def _open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        rel = self.rel(path)
        if rel is None or kw:
            return int(self.orig["open"](path, flags, mode, **kw))
        with self.lock:
            existed = os.path.lexists(path)
            fd = int(self.orig["open"](path, flags, mode))
            if flags & os.O_DIRECTORY or rel in self.dirs:
                self.fds[fd] = ("dir", rel, False)
                return fd
            fid = self.names.get(rel)
            if not existed:
                fid = self._new_fid(rel)
                self.ops.append(("create", rel, fid))
            elif fid is not None and flags & os.O_TRUNC:
                self.ops.append(("trunc", fid, 0))
            if fid is not None:
                self.fds[fd] = ("file", fid, bool(flags & os.O_APPEND))
            return fd

    def _file(self, fd: int) -> int | None:
        entry = self.fds.get(fd)
        return entry[1] if entry is not None and entry[0] == "file" else None

    def _write(self, fd: int, data: Any) -> int:
        with self.lock:
            fid = self._file(fd)
            if fid is None:
                return int(self.orig["write"](fd, data))
            offset = os.fstat(fd).st_size if self.fds[fd][2] else os.lseek(fd, 0, os.SEEK_CUR)
            n = int(self.orig["write"](fd, data))
            self.ops.append(("write", fid, offset, bytes(memoryview(data)[:n])))
            return n

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        with self.lock:
            n = int(self.orig["pwrite"](fd, data, offset))
            fid = self._file(fd)
            if fid is not None:
                self.ops.append(("write", fid, offset, bytes(memoryview(data)[:n])))
            return n

    def _ftruncate(self, fd: int, length: int) -> None:
        with self.lock:
            self.orig["ftruncate"](fd, length)
            fid = self._file(fd)
            if fid is not None:
                self.ops.append(("trunc", fid, length))

    def _posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        with self.lock:
            self.orig["posix_fallocate"](fd, offset, length)
            fid = self._file(fd)
            if fid is not None:
                self.ops.append(("falloc", fid, offset, length))

    def _sync(self, name: str, fd: int) -> None:
        with self.lock:
            self.orig[name](fd)
            entry = self.fds.get(fd)
            if entry is not None:
                self.ops.append(("sync" if entry[0] == "file" else "dsync", entry[1]))

    def _fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def _fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def _rename_op(self, name: str, src: Any, dst: Any, **kw: Any) -> None:
        rs, rd = self.rel(src), self.rel(dst)
        with self.lock:
            self.orig[name](src, dst, **kw)
            if rs is None and rd is None:
                return
            assert rs is not None and rd is not None, f"rename across the root: {src} {dst}"
            assert rs not in self.dirs, f"directory renames are not modelled: {src}"
            fid = self.names.pop(rs, None)
            if fid is not None:
                self.names[rd] = fid
            self.ops.append(("rename", rs, rd))

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename_op("rename", src, dst, **kw)

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename_op("replace", src, dst, **kw)

    def _unlink(self, path: Any, **kw: Any) -> None:
        rel = self.rel(path)
        with self.lock:
            self.orig["unlink"](path, **kw)
            if rel is not None:
                self.names.pop(rel, None)
                self.ops.append(("unlink", rel))

    def _mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        rel = self.rel(path)
        with self.lock:
            self.orig["mkdir"](path, mode, **kw)
            if rel is not None:
                self.dirs.add(rel)
                self.ops.append(("mkdir", rel))

    def _rmdir(self, path: Any, **kw: Any) -> None:
        rel = self.rel(path)
        with self.lock:
            self.orig["rmdir"](path, **kw)
            if rel is not None:
                self.dirs.discard(rel)
                self.ops.append(("rmdir", rel))

    def _fdopen(self, fd: int, *args: Any, **kw: Any) -> Any:
        f = self.orig["fdopen"](fd, *args, **kw)
        fid = self._file(fd)
        return f if fid is None else _RecordedFile(self, f, fd, fid)

    def _close(self, fd: int) -> None:
        with self.lock:
            self.fds.pop(fd, None)
            self.orig["close"](fd)


class _RecordedFile:
    """A file object from os.fdopen on a recorded descriptor (the engine's key file): what
    it buffered is logged as one write when it is flushed or closed (a new file: the
    writes follow each other from offset 0; text is taken as UTF-8)."""

    def __init__(self, rec: Recorder, f: Any, fd: int, fid: int) -> None:
        self._rec, self._f, self._fd, self._fid = rec, f, fd, fid
        self._parts: list[bytes] = []
        self._offset = 0

    def write(self, data: Any) -> int:
        self._parts.append(data.encode() if isinstance(data, str) else bytes(data))
        return int(self._f.write(data))

    def flush(self) -> None:
        with self._rec.lock:
            self._f.flush()
            if self._parts:
                data = b"".join(self._parts)
                self._rec.ops.append(("write", self._fid, self._offset, data))
                self._offset += len(data)
                self._parts = []

    def close(self) -> None:
        with self._rec.lock:
            self.flush()
            self._f.close()
            self._rec.fds.pop(self._fd, None)

    def __enter__(self) -> _RecordedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


# -- workloads (run in the child) ---------------------------------------------------------

WORKLOADS: dict[str, dict[str, Any]] = {
    "log-fsync": {"kind": "log", "durability": "fsync", "preallocate": False},
    "log-fsync-prealloc": {"kind": "log", "durability": "fsync", "preallocate": True},
    "log-policy": {"kind": "log", "durability": "policy", "flush_messages": 8,
                   "preallocate": True},
    "channel-fsync": {"kind": "channel", "durability": "fsync", "partitions": 3},
    "channel-policy": {"kind": "channel", "durability": "policy", "flush_messages": 10,
                       "partitions": 2},
    # the workload creates the key file (KeyRing.write_new) and a backup checkpoint dir
    "channel-fsync-encrypted": {"kind": "channel", "durability": "fsync", "partitions": 2,
                                "encrypted": True},
    # concurrent appenders share fsyncs (group commit); thread interleaving makes these
    # recordings differ from run to run, so they run under -m slow only
    "log-fsync-threads": {"kind": "log", "durability": "fsync", "preallocate": True,
                          "threads": 3},
    "channel-fsync-threads": {"kind": "channel", "durability": "fsync", "partitions": 3,
                              "threads": 3},
}
DETERMINISTIC = [name for name, spec in WORKLOADS.items() if spec.get("threads", 1) == 1]
SEGMENT_BYTES = 4096


def body(name: str, rng: random.Random) -> bytes:
    """A unique event body of a random size (so batches straddle sectors)."""
    size = rng.randrange(8, 300)
    return f"pl{name}|".encode() + bytes(rng.randrange(256) for _ in range(size))


def log_config(spec: dict[str, Any]) -> Any:
    """The LogConfig of a log workload."""
    from channel_engine import LogConfig
    return LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=256,
                     durability=spec["durability"], flush_messages=spec.get("flush_messages"),
                     preallocate=spec["preallocate"])


def channel_config(spec: dict[str, Any], root: Path) -> Any:
    """The ChannelConfig of a channel workload."""
    from channel_engine import ChannelConfig
    extra: dict[str, Any] = {}
    if spec.get("encrypted"):
        extra = {"encryption_key_file": str(root / "keys.json"), "encryption_active_key": "k1",
                 "use_dual_checkpoints": True, "backup_checkpoint_dir": str(root / "backup")}
    return ChannelConfig("pl", [str(root / "data-a"), str(root / "data-b")], str(root / "home"),
                         **extra,
                         partitions=spec["partitions"], durability=spec["durability"],
                         flush_messages=spec.get("flush_messages"),
                         segment_bytes=SEGMENT_BYTES, index_interval_bytes=256,
                         minimum_required_space=0, checkpoint_on_close=True,
                         transaction_capacity=10_000)


def run_log_workload(rec: Recorder, spec: dict[str, Any], root: Path, seed: int) -> None:
    """Appends across rolls (from `threads` threads: group commit), an explicit flush now
    and then, one clean reopen halfway."""
    from channel_engine import PartitionLog
    for half in range(2):
        log = PartitionLog.open(root / "p-0", log_config(spec))
        _in_threads(spec, seed, half, functools.partial(_log_steps, rec, log))
        log.close()
        rec.event("flush_done")  # a clean close makes everything durable


def _log_steps(rec: Recorder, log: Any, rng: random.Random, name: str) -> None:
    from channel_engine import PendingEvent
    from channel_engine.errors import OffsetOutOfRangeError
    n = 0
    for _ in range(30):
        payloads = []
        for _ in range(rng.randrange(1, 5)):
            n += 1
            payloads.append(body(f"{name}.{n}", rng))
        rec.event("put_begin", payloads=payloads)
        result = log.append([PendingEvent(body=p, timestamp=1_700_000_000_000 + n)
                             for p in payloads])
        rec.event("put_done", payloads=payloads,
                  placed=[(0, result.first_offset + i, p) for i, p in enumerate(payloads)])
        if rng.random() < 0.1:
            log.flush()
            rec.event("flush_done")
        if rng.random() < 0.05:
            log.checkpoint_recovery_point()
        if rng.random() < 0.06:  # Kafka DeleteRecords: segments below go (.deleted, unlink)
            start = rng.randrange(log.log_start_offset, log.high_watermark + 1)
            rec.event("log_start_begin", offset=start)
            try:
                log.delete_records_before(start)
            except OffsetOutOfRangeError:  # another thread raised the log start meanwhile
                continue
            rec.event("log_start", offset=start)


def _in_threads(spec: dict[str, Any], seed: int, half: int,
                steps: Callable[[random.Random, str], None]) -> None:
    """Run `steps` in spec["threads"] threads (1: in this one), each with its own rng."""
    count = spec.get("threads", 1)
    names = [f"{seed}.{half}.{t}" for t in range(count)]
    if count == 1:
        steps(random.Random(f"power-loss:{spec['kind']}:{names[0]}"), names[0])
        return
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            steps(random.Random(f"power-loss:{spec['kind']}:{name}"), name)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def run_channel_workload(rec: Recorder, spec: dict[str, Any], root: Path, seed: int) -> None:
    """Single- and cross-partition puts, takes committed and rolled back, rolled-back
    puts, checkpoints, flushes (from `threads` threads); one clean reopen halfway."""
    from channel_engine import Channel
    from channel_engine.encryption import KeyRing
    config = channel_config(spec, root)
    if spec.get("encrypted"):
        KeyRing.write_new(root / "keys.json", ["k1"])
        rec.event("keys_written")
    for half in range(2):
        with Channel.open(config, owner_wait_ms=0) as channel:
            def steps(rng: random.Random, name: str) -> None:
                counter = [0]
                for _ in range(25):
                    _channel_step(rec, channel, rng, name, counter)
            _in_threads(spec, seed, half, steps)
            rec.event("closing")
        rec.event("flush_done")


def _channel_step(rec: Recorder, channel: Any, rng: random.Random, name: str,
                  counter: list[int]) -> None:
    choice = rng.random()
    if choice < 0.5:
        cross = rng.random() < 0.4
        payloads = []
        with channel.put() as tx:
            for _ in range(rng.randrange(2, 7) if cross else rng.randrange(1, 5)):
                counter[0] += 1
                payloads.append(body(f"{name}.{counter[0]}", rng))
                key = f"k{rng.randrange(1000)}".encode() if cross else None
                tx.put(payloads[-1], key=key, timestamp=1_700_000_000_000 + counter[0])
            rec.event("put_begin", payloads=payloads)
        placed = [(p, e.offset, e.body) for p, first, last in tx.committed
                  for e in channel.read(p, first, last - first + 1)]
        rec.event("put_done", payloads=payloads, placed=placed)
    elif choice < 0.58:
        with channel.put() as tx:
            counter[0] += 1
            payload = body(f"{name}.{counter[0]}", rng)
            tx.put(payload)
            tx.rollback()
        rec.event("put_rolled_back", payloads=[payload])
    elif choice < 0.82:
        tx = channel.take()
        events = tx.take(rng.randrange(1, 8))
        payloads = [e.body for e in events]
        if rng.random() < 0.7:
            rec.event("take_begin", payloads=payloads)
            tx.commit()
            rec.event("take_done", payloads=payloads)
        else:
            tx.rollback()
    elif choice < 0.92:
        channel.checkpoint()
        rec.event("checkpoint_done")
    else:
        channel.flush()
        rec.event("flush_done")


def record_main(workload: str, seed: int, root: Path, out: Path) -> None:
    """The child: run one workload under the recorder and pickle the recording."""
    spec = WORKLOADS[workload]
    root.mkdir(parents=True, exist_ok=True)
    rec = Recorder(root)
    rec.install()
    try:
        if spec["kind"] == "log":
            run_log_workload(rec, spec, root, seed)
        else:
            run_channel_workload(rec, spec, root, seed)
    finally:
        rec.uninstall()
        out.write_bytes(pickle.dumps({"workload": workload, "seed": seed, "root": rec.root,
                                      "initial": rec.initial, "ops": rec.ops}))


# -- crash states (the parent) ------------------------------------------------------------


@dataclass
class Recording:
    """What one workload did, as the recorder logged it."""

    workload: str
    seed: int
    root: str
    initial: dict[str, Any]
    ops: list[Op]

    @property
    def spec(self) -> dict[str, Any]:
        """The workload's settings."""
        return WORKLOADS[self.workload]


def record(workload: str, seed: int, root: Path) -> Recording:
    """Run a workload in a child process under the recorder; its root is left empty."""
    out = root.with_name(root.name + ".recording")
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    child = subprocess.run([sys.executable, __file__, "record", workload, str(seed),
                            str(root), str(out)], env=env, timeout=300, capture_output=True,
                           text=True)
    if child.returncode != 0:
        raise RuntimeError(f"recording {workload} seed {seed} failed:\n{child.stderr[-3000:]}")
    recording = Recording(**pickle.loads(out.read_bytes()))
    out.unlink()
    shutil.rmtree(root)  # states are materialised at the same path (configs name it)
    return recording


def _parent(rel: str) -> str:
    return os.path.dirname(rel)


def _ns_dirs(op: Op) -> tuple[str, ...]:
    if op[0] == "rename":
        return (_parent(op[1]), _parent(op[2]))
    return (_parent(op[1]),)


def _apply_data(content: bytearray, op: Op) -> None:
    if op[0] == "write":
        _, _, offset, data = op
        if len(content) < offset:
            content.extend(bytes(offset - len(content)))
        content[offset:offset + len(data)] = data
    elif op[0] == "trunc":
        size = op[2]
        del content[size:]
        content.extend(bytes(size - len(content)))
    elif op[0] == "falloc":
        end = op[2] + op[3]
        if len(content) < end:
            content.extend(bytes(end - len(content)))


@dataclass(frozen=True)
class CrashState:
    """One crash state: the point in the log, how unsynced operations were chosen."""

    point: int
    mode: str  # durable | cache | random
    seed: str
    keep_probability: float = 0.5
    tear_probability: float = 0.5

    def describe(self, recording: Recording) -> str:
        """Enough to rebuild the state by hand."""
        return (f"{recording.workload} seed={recording.seed} point={self.point}/"
                f"{len(recording.ops)} mode={self.mode} state_seed={self.seed}")


def build_state(recording: Recording,
                state: CrashState) -> tuple[dict[str, Any], dict[int, bytes]]:
    """The namespace (rel -> DIR or fid) and file contents of one crash state."""
    ops = recording.ops[:state.point]
    last_sync: dict[Any, int] = {}
    for i, op in enumerate(ops):
        if op[0] in ("sync", "dsync"):
            last_sync[(op[0], op[1])] = i
    rng = random.Random(state.seed)
    namespace: dict[str, Any] = {}
    durable: dict[int, bytearray] = {}
    unsynced: dict[int, list[Op]] = {}
    for rel, entry in recording.initial.items():
        namespace[rel] = entry if entry == DIR else entry[0]
        if entry != DIR:
            durable[entry[0]] = bytearray(entry[1])
    for i, op in enumerate(ops):
        kind = op[0]
        if kind in ("create", "mkdir", "rename", "unlink", "rmdir"):
            if all(i < last_sync.get(("dsync", d), -1) for d in _ns_dirs(op)) or (
                    state.mode == "cache"
                    or state.mode == "random" and rng.random() < state.keep_probability):
                _apply_ns(namespace, op)
        elif kind in ("write", "trunc", "falloc"):
            if i < last_sync.get(("sync", op[1]), -1):
                _apply_data(durable.setdefault(op[1], bytearray()), op)
            else:
                unsynced.setdefault(op[1], []).append(op)
    contents = {fid: bytes(data) for fid, data in durable.items()}
    for fid, pending in unsynced.items():
        contents[fid] = _unsynced_content(rng, state, durable.get(fid, bytearray()), pending)
    return namespace, contents


def _unsynced_content(rng: random.Random, state: CrashState, base: bytearray,
                      pending: list[Op]) -> bytes:
    """A file after a power loss: its length from some version between its last fsync and
    the crash, and each 512-byte sector from some version (writeback writes a sector with
    everything written to it so far, in any order of sectors)."""
    versions = [bytes(base)]
    content = bytearray(base)
    for op in pending:
        _apply_data(content, op)
        versions.append(bytes(content))
    last = len(versions) - 1
    if state.mode != "random":
        return versions[last if state.mode == "cache" else 0]

    def pick() -> int:
        return last if rng.random() < state.keep_probability else rng.randrange(last + 1)

    size = len(versions[pick()])
    if rng.random() >= state.tear_probability:  # untorn: every sector of one version
        return versions[pick()][:size].ljust(size, b"\0")
    out = bytearray()
    for start in range(0, size, SECTOR):
        out += versions[pick()][start:start + SECTOR].ljust(SECTOR, b"\0")
    return bytes(out[:size])


def _apply_ns(namespace: dict[str, Any], op: Op) -> None:
    kind = op[0]
    if kind == "create":
        namespace[op[1]] = op[2]
    elif kind == "mkdir":
        namespace[op[1]] = DIR
    elif kind == "rename":
        if op[1] in namespace:
            namespace[op[2]] = namespace.pop(op[1])
    else:  # unlink, rmdir
        namespace.pop(op[1], None)


def materialise(recording: Recording, state: CrashState) -> Path:
    """Write one crash state at the recording's root (which must not exist)."""
    namespace, contents = build_state(recording, state)
    root = Path(recording.root)
    root.mkdir()
    present = {""}
    for rel in sorted(namespace, key=lambda r: r.count(os.sep)):
        if _parent(rel) not in present:
            continue  # its directory's entry did not survive: neither does it
        entry = namespace[rel]
        if entry == DIR:
            (root / rel).mkdir()
            present.add(rel)
        else:
            (root / rel).write_bytes(contents.get(entry, b""))
            (root / rel).chmod(0o600)  # modes are not modelled; the key file must be 600
    return root


# -- expectations and checks --------------------------------------------------------------


@dataclass
class Expected:
    """What the workload's events say about a crash at one point."""

    committed: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)  # -> p, off, seq
    attempted: dict[bytes, int] = field(default_factory=dict)  # in-doubt put -> put number
    put_of: dict[bytes, int] = field(default_factory=dict)
    puts: dict[int, list[bytes]] = field(default_factory=dict)
    forbidden: set[bytes] = field(default_factory=set)  # rolled back
    taken: set[bytes] = field(default_factory=set)  # take commit returned
    take_in_doubt: set[bytes] = field(default_factory=set)
    flushed_seq: int = 0  # puts with seq below this were flushed (explicitly) before P
    log_start: int = 0  # a log: offsets below were deleted (delete_records_before returned)
    log_start_maybe: int = 0  # offsets below may be deleted (a delete began)


def expected_at(recording: Recording, point: int) -> Expected:
    """Replay the workload events before `point`."""
    exp = Expected()
    seq = 0
    for op in recording.ops[:point]:
        if op[0] != "event":
            continue
        kind, data = op[1], op[2]
        if kind == "put_begin":
            seq += 1
            exp.puts[seq] = list(data["payloads"])
            for p in data["payloads"]:
                exp.attempted[p] = seq
                exp.put_of[p] = seq
        elif kind == "put_done":
            for partition, offset, payload in data["placed"]:
                exp.attempted.pop(payload, None)
                exp.committed[payload] = (partition, offset, seq)
        elif kind == "put_rolled_back":
            exp.forbidden.update(data["payloads"])
        elif kind == "take_begin":
            exp.take_in_doubt.update(data["payloads"])
        elif kind == "take_done":
            exp.take_in_doubt.difference_update(data["payloads"])
            exp.taken.update(data["payloads"])
        elif kind == "flush_done":
            exp.flushed_seq = seq + 1
        elif kind == "log_start_begin":
            exp.log_start_maybe = max(exp.log_start_maybe, data["offset"])
        elif kind == "log_start":
            exp.log_start = max(exp.log_start, data["offset"])
    return exp


@dataclass
class Observed:
    """What opening a crash state delivered, and what the engine counted lost."""

    delivered: list[tuple[int, int, bytes]]  # partition, offset, body
    counted_lost: int
    log_end: int = 0  # a log: its end offset after the open
    durable_log_end: int | None = None  # a log: the end its log.state held before the open


def check(exp: Expected, obs: Observed,
          window: int | None) -> tuple[list[tuple[str, str]], int]:
    """Failures (kind, detail) of one state, and the committed events it lost. `window`:
    None in fsync durability, else flush_messages (the policy's loss window)."""
    policy = window is not None
    failures: list[tuple[str, str]] = []
    seen: Counter[bytes] = Counter()
    for partition, offset, payload in obs.delivered:
        seen[payload] += 1
        if payload in exp.committed:
            where = exp.committed[payload][:2]
            if where != (partition, offset):
                failures.append(("offset_changed", f"{payload[:12]!r} at {(partition, offset)}, "
                                                   f"committed at {where}"))
        elif payload not in exp.attempted:
            kind = "rolled_back_put_appeared" if payload in exp.forbidden else "phantom"
            failures.append((kind, f"{payload[:12]!r} at {(partition, offset)}"))
        if payload in exp.taken and not policy:
            failures.append(("take_resurrected", f"{payload[:12]!r} at {(partition, offset)}"))
        if offset < exp.log_start:
            failures.append(("deleted_record_reappeared", f"offset {offset} below the log "
                                                          f"start {exp.log_start}"))
    failures += [("duplicate", f"{p[:12]!r} x{n}") for p, n in seen.items() if n > 1]
    failures += _order_failures(exp, obs)
    lost = [p for p in exp.committed
            if p not in seen and p not in exp.taken and p not in exp.take_in_doubt
            and exp.committed[p][1] >= exp.log_start_maybe]
    if lost and not policy:
        failures.append(("lost_committed", f"{len(lost)} events, first {lost[0][:12]!r} at "
                                           f"{exp.committed[lost[0]][:2]}"))
    if lost and window is not None:
        failures += _policy_failures(exp, obs, lost, window)
    for number, payloads in exp.puts.items():
        present = [p for p in payloads if p in seen]
        # a put still in flight (no offsets yet) may be cut by a concurrent DeleteRecords
        # whose offset lay inside its batch (the high watermark had passed it): Kafka's rule
        in_flight_cut = exp.log_start_maybe > 0 and not any(p in exp.committed for p in payloads)
        if present and len(present) != len(payloads) and not in_flight_cut and not any(
                p in exp.taken or p in exp.take_in_doubt
                or exp.committed.get(p, (0, 1 << 62))[1] < exp.log_start_maybe
                for p in payloads):
            failures.append(("partial_put", f"put {number}: {len(present)}/{len(payloads)} "
                                            f"events delivered"))
    return failures, len(lost)


def _order_failures(exp: Expected, obs: Observed) -> list[tuple[str, str]]:
    last: dict[int, tuple[int, int]] = {}
    failures = []
    for partition, offset, payload in obs.delivered:
        seq = exp.committed.get(payload, (0, 0, exp.put_of.get(payload, 0)))[2]
        if partition in last and (offset, seq) < last[partition]:
            failures.append(("out_of_order", f"partition {partition} offset {offset} after "
                                             f"{last[partition]}"))
        last[partition] = (offset, seq)
    return failures


def _policy_failures(exp: Expected, obs: Observed, lost: list[bytes],
                     window: int) -> list[tuple[str, str]]:
    failures = []
    per_partition = Counter(exp.committed[p][0] for p in lost)
    for partition, n in per_partition.items():
        # after each put returns, fewer than flush_messages are unflushed in a partition:
        # in a channel, the events of multi-partition puts whose commit record is not yet
        # synced count too (losing the record aborts the put, its batches on disk or not)
        if n >= window:
            failures.append(("loss_exceeds_window", f"partition {partition}: {n} committed "
                                                    f"events lost, flush_messages={window}"))
    early = [p for p in lost if exp.committed[p][2] < exp.flushed_seq]
    if early:
        failures.append(("lost_before_flush", f"{len(early)} events committed before a "
                                              f"completed flush, first {early[0][:12]!r}"))
    return failures


# -- opening a state with the engine ------------------------------------------------------


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """The checking opens need no durability: skip their fsyncs (much faster)."""
    saved = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync, os.fdatasync = saved


def observe(recording: Recording) -> Observed:
    """Open the materialised state with the engine and deliver everything."""
    if recording.spec["kind"] == "log":
        return _observe_log(recording)
    return _observe_channel(recording)


def _observe_log(recording: Recording) -> Observed:
    from channel_engine import PartitionLog
    from channel_engine.errors import ChannelEngineError
    from channel_engine.log import state as log_state
    root = Path(recording.root)
    try:
        saved = log_state.read(root / "p-0" / "log.state")
    except ChannelEngineError:
        saved = None
    with PartitionLog.open(root / "p-0", log_config(recording.spec)) as log:
        delivered = []
        offset = log.log_start_offset
        while offset < log.high_watermark:
            events = log.read(offset, end_offset=log.high_watermark)
            if not events:  # a gap (reported as lost): go on at the next segment
                bases = [s.base_offset for s in log.segments if s.base_offset > offset]
                if not bases:
                    break
                offset = bases[0]
                continue
            delivered += [(0, e.offset, e.body) for e in events]
            offset = events[-1].offset + 1
        counted = sum(r.offsets for r in log.last_recovery.lost_ranges)
        end = log.log_end_offset
    return Observed(delivered, counted, end, saved.log_end_offset if saved else None)


def _observe_channel(recording: Recording) -> Observed:
    """Open as the owner does (Channel.open minus its socket server, whose shutdown
    costs a poll interval per state) and take everything, then roll the take back."""
    from channel_engine.queue.channel_owner import ChannelOwner
    config = channel_config(recording.spec, Path(recording.root))
    with ChannelOwner.open(config) as owner:
        delivered = []
        take_id = owner.begin_take()
        while True:
            events = owner.take_events(take_id, 1000)
            if not events:
                break
            delivered += [(e.partition, e.offset, e.body) for e in events]
        owner.rollback_take(take_id)
        counted = lost_events_counted(owner)
    return Observed(delivered, counted)


def lost_events_counted(owner: Any) -> int:
    """Events the channel (its owner) says it lost: status()["losses"] once it exists,
    else the replay's recovery.lost_events plus the partition logs' lost ranges."""
    losses = owner.status().get("losses")
    if isinstance(losses, dict) and "events_lost" in losses:
        return int(losses["events_lost"])
    return int(owner.recovery.lost_events) + sum(
        r.offsets for log in owner.logs for r in log.last_recovery.lost_ranges)


# -- running many states ------------------------------------------------------------------


@dataclass
class Summary:
    """States checked and what they found."""

    states: int = 0
    by_workload: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)  # seen, allowed, worth reporting
    examples: dict[str, str] = field(default_factory=dict)
    policy_lost_events: int = 0
    policy_states_with_loss: int = 0
    policy_states_loss_counted: int = 0
    seconds: float = 0.0

    def add(self, other: Summary) -> None:
        """Merge another summary into this one."""
        self.states += other.states
        self.by_workload.update(other.by_workload)
        self.failures.update(other.failures)
        self.notes.update(other.notes)
        for kind, text in other.examples.items():
            self.examples.setdefault(kind, text)
        self.policy_lost_events += other.policy_lost_events
        self.policy_states_with_loss += other.policy_states_with_loss
        self.policy_states_loss_counted += other.policy_states_loss_counted
        self.seconds += other.seconds

    def render(self) -> str:
        """The summary for the closing note."""
        lines = [f"power-loss simulation: {self.states} crash states checked in "
                 f"{self.seconds:.1f} s"]
        lines += [f"  {name}: {n} states" for name, n in sorted(self.by_workload.items())]
        if self.policy_states_with_loss:
            lines.append(f"  policy mode: {self.policy_states_with_loss} states lost "
                         f"{self.policy_lost_events} committed events in the flush window; "
                         f"the engine counted a loss in {self.policy_states_loss_counted}")
        for kind, n in self.notes.most_common():
            lines.append(f"  note {kind}: {n} states, e.g. {self.examples[kind]}")
        if not self.failures:
            lines.append("  failures: none")
        for kind, n in self.failures.most_common():
            lines.append(f"  FAIL {kind}: {n} states, e.g. {self.examples[kind]}")
        return "\n".join(lines)


def choose_states(recording: Recording, count: int, seed: int) -> list[CrashState]:
    """`count` crash states spread over the log: every mode, points at random and right
    before each workload event (an engine call just returned)."""
    rng = random.Random(f"power-loss-states:{recording.workload}:{recording.seed}:{seed}")
    events = [i for i, op in enumerate(recording.ops) if op[0] == "event"]
    states = []
    for k in range(count):
        point = rng.choice(events) if events and rng.random() < 0.4 \
            else rng.randrange(len(recording.ops) + 1)
        mode = rng.choices(("durable", "cache", "random"), (1, 1, 4))[0]
        states.append(CrashState(point, mode, f"{seed}:{k}", rng.choice((0.2, 0.5, 0.8))))
    return states


def check_states(recording: Recording, states: list[CrashState]) -> Summary:
    """Materialise, open and check each state; return what they found."""
    summary = Summary()
    started = time.monotonic()
    policy = recording.spec["durability"] == "policy"
    root = Path(recording.root)
    with no_fsync():
        for state in states:
            failures, lost, counted = _check_one(recording, state, policy)
            if root.exists():
                shutil.rmtree(root)
            summary.states += 1
            summary.by_workload[recording.workload] += 1
            for kind, detail in failures:
                if kind.startswith("note:"):
                    kind = kind[len("note:"):]
                    summary.notes[kind] += 1
                else:
                    summary.failures[kind] += 1
                summary.examples.setdefault(kind, f"{state.describe(recording)}: {detail}")
            if policy and lost:
                summary.policy_states_with_loss += 1
                summary.policy_lost_events += lost
                summary.policy_states_loss_counted += counted > 0
    summary.seconds = time.monotonic() - started
    return summary


def _check_one(recording: Recording, state: CrashState,
               policy: bool) -> tuple[list[tuple[str, str]], int, int]:
    if recording.spec.get("encrypted") and not any(
            op[:2] == ("event", "keys_written") for op in recording.ops[:state.point]):
        return [], 0, 0  # the key file was not made yet: no channel to open, nothing put
    materialise(recording, state)
    try:
        observed = observe(recording)
    except Exception as exc:  # noqa: BLE001 - any error opening a state is the finding
        return [("open_raised", f"{type(exc).__name__}: {exc}")], 0, 0
    window = recording.spec.get("flush_messages") if policy else None
    failures, lost = check(expected_at(recording, state.point), observed, window)
    durable_end = observed.durable_log_end
    # policy mode only: in fsync mode log.state may count appends whose fsync (and so
    # their commit) had not returned; the loader rightly trusts its recovery point there
    if policy and durable_end is not None and observed.log_end < durable_end:
        failures.append(("offsets_handed_out_again",
                         f"log end {observed.log_end} < {durable_end} in log.state: the next "
                         f"appends reuse offsets; {observed.counted_lost} counted lost"))
    return failures, lost, observed.counted_lost


def scratch_base() -> Path | None:
    """Where to materialise states: tmpfs when there is one (a state costs no disk I/O)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def run(workloads: list[str], states_per_workload: int, seed: int,
        base: Path | None = None) -> Summary:
    """Record each workload once (seeded) and check that many crash states of each."""
    total = Summary()
    with tempfile.TemporaryDirectory(dir=base or scratch_base(), prefix="weir-power-loss-") as tmp:
        for name in workloads:
            recording = record(name, seed, Path(tmp) / f"{name}-root")
            total.add(check_states(recording, choose_states(recording, states_per_workload,
                                                            seed)))
    return total


def main(argv: list[str]) -> int:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("workload")
    rec.add_argument("seed", type=int)
    rec.add_argument("root", type=Path)
    rec.add_argument("out", type=Path)
    summ = sub.add_parser("summary")
    summ.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    summ.add_argument("--states", type=int, default=200)
    summ.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # recovery reports of every state are not news
    if args.command == "record":
        record_main(args.workload, args.seed, args.root, args.out)
        return 0
    summary = run(args.workloads, args.states, args.seed)
    print(summary.render())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The worker processes of the multi-process channel tests (test_channel_processes.py);
a script, not a test module. Every mode opens the channel by its home (the parent saved
channel.json there first), so whichever process opens first owns it.

    python channel_worker.py produce HOME --producer I --events N [--batch B] --out FILE
        [--go FILE] [--first-batch K]
    python channel_worker.py consume HOME --consumer J --seed S --done FILE
        [--out FILE] [--history FILE] [--subscription NAME] [--go FILE]
        [--checkpoint-every K]
    python channel_worker.py crash HOME --seed S [--first-id N] [--put-ratio R]
        [--max-put N] [--max-take N] [--rollback-ratio R] [--checkpoint-every K]
        [--checkpointer] [--keyless] [--slow-sync-ms MS] [--stop-phase PHASE --stop-at K]
    python channel_worker.py hold HOME [--commit-first N] --take N
    python channel_worker.py threads HOME --threads T --puts N

produce: puts events seq 0..N-1 of producer I (stress_event()) in put transactions of B
  events, in order, from batch K on (--first-batch: a producer started again after a
  kill); a commit that raises OwnerLostError (the owner went away, outcome unknown) is
  retried with the same events, and the batch is written to FILE as
  `R <batch> <attempts>` (only such a batch may be in the channel more than once). Each
  attempt prints `begin-put <batch>` before its commit and `put <batch>` once it returned,
  so a parent that kills the producer knows what was acknowledged and what was in flight.
consume: takes from its subscription (--subscription, `default` unless named) in
  transactions of 1..1000 events, rolls one in ten back at random (the events return and
  are taken again), commits the rest; every event of a commit is written to FILE (--out)
  as `C <take> <partition> <offset> <producer> <seq> <batch> <key>`, or with `U` when the
  commit raised OwnerLostError (outcome unknown). With --history, every take is also
  written there, one line per step, each written whole at once (it survives a kill -9 of
  the consumer; only the last line may be cut), times from time.monotonic() (one clock
  for every process of the machine):

    D <take> <t0> <p>,<off>,<body>,<batch>,<key> ...  take() returned these events;
                                                      t0: just before take() was called
    R <take>                          rolled back (its events are queued again)
    c <take> <t>                      its commit starts
    C <take> <t>                      its commit returned (gone for good)
    U <take> <t>                      its commit raised OwnerLostError (outcome unknown)
    X <take>                          its commit raised TakeExpiredError (not committed)

  It stops when its subscription is empty after the parent created the --done file
  (every producer finished).
  Both print `open <role>` once the channel is open, wait for the --go file if given,
  and print `done <json stats>` after a clean close.
crash: the kill -9 target (it must be the owner): puts events crash_event(seed, id), ids
  counting from --first-id, and takes, and checkpoints every K operations (or, with
  --checkpointer, in a thread that checkpoints back to back). One line per step on
  stdout, flushed at once, so the parent knows what returned before the SIGKILL
  (--slow-sync-ms makes every commit-journal sync that long, as on a slow disk):

    open <role> <pid>
    begin-put <first id> <last id>     a put commit starts
    put <first id> <last id>           the put commit returned
    inflight <take> <id>:<p>:<off> ... take() of take <take> returned these events
    committing <take>                  its commit starts
    take <take> <id>:<p>:<off> ...     its commit returned (the events are gone for good)
    rollback <take>                    it was rolled back (its events are queued again)
    ckpt-begin                         a checkpoint starts
    ckpt <sequence>                    it returned
    STOP <phase>                       a stop hook fired; this thread waits for the kill
    ERROR <message>                    something raised; the worker exits with 2

  Stop hooks (installed after the open) freeze the checkpointing thread inside the K-th
  checkpoint after the open, so the parent's kill lands exactly there:
    before_write    the journal was rotated, the new checkpoint not yet written
    before_rename   the primary's temp file is written and fsynced, not yet renamed
    before_backup   the primary is in place, the backup (if any) not yet written
    before_journal_removal  both copies written, the old journals not yet removed
    mid_segment_delete      deleting a fully taken segment (the K-th segment deletion)
threads: T threads, started together, each commits N two-partition puts; prints
  `done {"ok": <puts that returned>, "errors": {<error>: <count>}, "role": <role>}`.
hold: a client that commits a take of --commit-first events (`take ...`), then takes
  --take events without committing (`inflight ...`), prints `holding` and waits for the
  parent's SIGKILL.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from child_lines import Output, freeze, nth_call

from channel_engine import Channel, Event, OwnerLostError, PendingEvent, TakeExpiredError
from channel_engine.log import segment as segment_module
from channel_engine.queue import checkpoint as checkpoint_module
from channel_engine.queue import commit_journal
from channel_engine.queue.checkpointer import Checkpointer

STRESS_KEYS = (b"red", b"green", b"blue", b"cyan", b"pink", b"gold", None)
CRASH_KEYS = tuple(f"k{i}".encode() for i in range(8))
BASE_TIMESTAMP = 1_700_000_000_000
STOP_PHASES = ("before_write", "before_rename", "before_backup", "before_journal_removal",
               "mid_segment_delete")


# -- event contents: the parent regenerates them to check what it reads -----------------------
def stress_key(producer: int, seq: int) -> bytes | None:
    """The key of event `seq` of `producer`: runs of five events per key, keyless included."""
    return STRESS_KEYS[(seq // 5 + producer) % len(STRESS_KEYS)]


def stress_event(producer: int, seq: int, batch: int) -> tuple[bytes, bytes | None,
                                                               dict[str, bytes]]:
    """Body, key and headers of event `seq` of `producer` (in put batch `batch`)."""
    body = f"{producer}:{seq}:".encode() + b"x" * (seq % 23)
    return body, stress_key(producer, seq), {"batch": str(batch).encode()}


def crash_event(seed: int, event_id: int, keyless: bool) -> PendingEvent:
    """Event `event_id` of a crash run: derived from (seed, id) only."""
    rng = random.Random(f"weir-channel-crash:{seed}:{event_id}")
    key = None if keyless or rng.random() < 0.25 else rng.choice(CRASH_KEYS)
    body = f"{event_id}:".encode() + rng.randbytes(rng.randint(0, 64))
    return PendingEvent(body, key, {"id": str(event_id).encode()}, BASE_TIMESTAMP + event_id)


def event_id(event: Event) -> int:
    """The id a crash run gave an event (the start of its body)."""
    return int(bytes(event.body).split(b":", 1)[0])


def token(event: Event) -> str:
    return f"{event_id(event)}:{event.partition}:{event.offset}"


# -- output ---------------------------------------------------------------------------------
def fail(out: Output, exc: BaseException) -> None:
    out.line(f"ERROR {type(exc).__name__}: {exc}")
    os._exit(2)


def wait_for_file(path: str | None) -> None:
    while path is not None and not os.path.exists(path):
        time.sleep(0.005)


class Roles:
    """Counts how often this process became the owner after it opened as a client."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.first = channel.role
        self.last = channel.role
        self.became_owner = 0

    def note(self) -> None:
        role = self.channel.role
        if role != self.last and role == "owner":
            self.became_owner += 1
        self.last = role

    def stats(self) -> dict[str, Any]:
        return {"first_role": self.first, "last_role": self.last,
                "became_owner": self.became_owner}


# -- produce --------------------------------------------------------------------------------
def produce(args: argparse.Namespace, out: Output) -> None:
    channel = Channel.open(args.home)
    roles = Roles(channel)
    out.line(f"open {channel.role}")
    wait_for_file(args.go)
    lost = 0
    with open(args.out, "w") as record:
        for first in range(args.first_batch * args.batch, args.events, args.batch):
            batch = first // args.batch
            for attempt in itertools.count(1):
                tx = channel.put()
                for seq in range(first, min(first + args.batch, args.events)):
                    body, key, headers = stress_event(args.producer, seq, batch)
                    tx.put(body, key=key, headers=headers)
                out.line(f"begin-put {batch}")
                try:
                    tx.commit()
                except OwnerLostError:
                    lost += 1
                    roles.note()
                    continue
                out.line(f"put {batch}")
                roles.note()
                if attempt > 1:
                    record.write(f"R {batch} {attempt}\n")
                break
    channel.close()
    out.line("done " + json.dumps({"owner_lost": lost, **roles.stats()}))


# -- consume --------------------------------------------------------------------------------
class History:
    """The --history file: each line written whole with one write(2), so a kill -9 of the
    consumer keeps every line it wrote (the page cache survives) and may cut only the last."""

    def __init__(self, path: str | None) -> None:
        self.fd = -1 if path is None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def line(self, text: str) -> None:
        if self.fd < 0:
            return
        data = memoryview((text + "\n").encode())
        while data:
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def history_token(event: Event) -> str:
    key = "-" if event.key is None else event.key.decode()
    return (f"{event.partition},{event.offset},{bytes(event.body).decode()},"
            f"{event.headers['batch'].decode()},{key}")


def consume(args: argparse.Namespace, out: Output) -> None:
    channel = Channel.open(args.home)
    roles = Roles(channel)
    out.line(f"open {channel.role}")
    wait_for_file(args.go)
    rng = random.Random(args.seed)
    stats = dict.fromkeys(("commits", "uncertain", "rollbacks", "lost_takes", "expired",
                           "checkpoints", "events"), 0)
    takes = 0
    history = History(args.history)
    with open(args.out or os.devnull, "w") as record:
        while True:
            roles.note()
            try:
                tx = channel.take(subscription=args.subscription)
                t0 = time.monotonic()
                events = tx.take(rng.randint(1, 1000))
            except (OwnerLostError, TakeExpiredError):
                stats["lost_takes"] += 1  # the owner went away: the take was returned
                continue
            if not events:
                try:
                    tx.rollback()
                except OwnerLostError:
                    pass
                if os.path.exists(args.done) and untaken(channel, args.subscription) == 0:
                    break
                time.sleep(0.005)
                continue
            takes += 1
            name = f"{args.consumer}.{takes}"
            history.line(f"D {name} {t0:.6f} " + " ".join(history_token(e) for e in events))
            if rng.random() < 0.1:
                try:
                    tx.rollback()
                except OwnerLostError:
                    pass  # its events return to the queue either way
                history.line(f"R {name}")
                stats["rollbacks"] += 1
                continue
            history.line(f"c {name} {time.monotonic():.6f}")
            try:
                tx.commit()
                kind = "C"
                stats["commits"] += 1
            except OwnerLostError:
                kind = "U"  # committed or not: the parent finds out which
                stats["uncertain"] += 1
            except TakeExpiredError:
                history.line(f"X {name}")
                stats["expired"] += 1  # not committed: its events are queued again
                continue
            history.line(f"{kind} {name} {time.monotonic():.6f}")
            stats["events"] += len(events)
            record.writelines(
                f"{kind} {name} {e.partition} {e.offset} {bytes(e.body).decode()} "
                f"{e.headers['batch'].decode()} {'-' if e.key is None else e.key.decode()}\n"
                for e in events)
            if args.checkpoint_every and stats["commits"] % args.checkpoint_every == 0:
                try:
                    channel.checkpoint()
                    stats["checkpoints"] += 1
                except OwnerLostError:
                    pass
    history.close()
    channel.close()
    out.line("done " + json.dumps({**stats, **roles.stats()}))


def untaken(channel: Channel, subscription: str) -> int:
    """Events of the subscription not taken and committed (queued or in flight)."""
    while True:
        try:
            return int(channel.status()["subscriptions"][subscription]["events_untaken"])
        except OwnerLostError:
            continue


# -- crash ----------------------------------------------------------------------------------
def install_stop_hook(out: Output, phase: str, at: int, home: Path) -> None:
    """Freeze the calling thread at the `at`-th occurrence of `phase` after the open."""
    due = nth_call(at)

    if phase == "before_write":
        write = checkpoint_module.write

        def write_then_stop(saved: Any, directory: Path, backup: Path | None,
                            **options: Any) -> None:
            if Path(directory) == home and due():
                freeze(out, phase)
            write(saved, directory, backup, **options)
        checkpoint_module.write = write_then_stop  # type: ignore[assignment]
    elif phase == "before_rename":
        replace = os.replace

        def replace_then_stop(src: Any, dst: Any, *a: Any, **k: Any) -> None:
            if Path(dst) == home / checkpoint_module.FILE_NAME and due():
                freeze(out, phase)
            replace(src, dst, *a, **k)
        os.replace = replace_then_stop
    elif phase == "before_backup":
        write_backup = Checkpointer._write_backup

        def backup_then_stop(self: Any, saved: Any, backup: Any) -> str:
            if due():
                freeze(out, phase)
            return write_backup(self, saved, backup)
        Checkpointer._write_backup = backup_then_stop  # type: ignore[method-assign]
    elif phase == "before_journal_removal":
        remove_before = commit_journal.remove_before

        def remove_then_stop(directory: Path, generation: int) -> int:
            if due():
                freeze(out, phase)
            return remove_before(directory, generation)
        commit_journal.remove_before = remove_then_stop  # type: ignore[assignment]
    elif phase == "mid_segment_delete":
        cls: Any = segment_module.LogSegment
        rename = cls.rename_to_deleted

        def rename_then_stop(self: Any) -> None:
            if due():
                freeze(out, phase)
            rename(self)
        cls.rename_to_deleted = rename_then_stop
    else:
        raise SystemExit(f"unknown stop phase {phase!r}")


def slow_down_journal_syncs(seconds: float) -> None:
    """A slow disk: each commit-journal sync takes `seconds` longer."""
    cls: Any = commit_journal.CommitJournal
    sync = cls.sync

    def slow_sync(self: Any, ticket: int | None = None) -> None:
        time.sleep(seconds)
        sync(self, ticket)
    cls.sync = slow_sync


def crash(args: argparse.Namespace, out: Output) -> None:
    channel = Channel.open(args.home)
    out.line(f"open {channel.role} {os.getpid()}")
    if args.stop_phase:
        install_stop_hook(out, args.stop_phase, args.stop_at, channel.config.home)
    if args.slow_sync_ms:
        slow_down_journal_syncs(args.slow_sync_ms / 1000)
    rng = random.Random(args.seed)
    next_id = args.first_id
    take_numbers = itertools.count(1)

    def checkpoint() -> None:
        out.line("ckpt-begin")
        result = channel.checkpoint()
        out.line(f"ckpt {result.sequence}")

    def checkpoint_forever() -> None:
        pause = random.Random(args.seed + 1)
        try:
            while True:
                checkpoint()
                time.sleep(pause.uniform(0, 0.005))
        except BaseException as exc:
            fail(out, exc)

    if args.checkpointer:
        threading.Thread(target=checkpoint_forever, daemon=True).start()
    try:
        for ops in itertools.count(1):
            if rng.random() < args.put_ratio:
                count = rng.randint(1, args.max_put)
                ids = range(next_id, next_id + count)
                next_id += count
                tx = channel.put()
                tx.put_all([crash_event(args.seed, i, args.keyless) for i in ids])
                out.line(f"begin-put {ids[0]} {ids[-1]}")
                tx.commit()
                out.line(f"put {ids[0]} {ids[-1]}")
            else:
                take_no = next(take_numbers)
                take = channel.take()
                events = take.take(rng.randint(1, args.max_take))
                if events:
                    out.line(f"inflight {take_no} " + " ".join(token(e) for e in events))
                if events and rng.random() < args.rollback_ratio:
                    take.rollback()
                    out.line(f"rollback {take_no}")
                else:
                    if events:
                        out.line(f"committing {take_no}")
                    take.commit()
                    if events:
                        out.line(f"take {take_no} " + " ".join(token(e) for e in events))
            if not args.checkpointer and args.checkpoint_every and ops % args.checkpoint_every == 0:
                checkpoint()
    except BaseException as exc:
        fail(out, exc)


# -- hold -----------------------------------------------------------------------------------
def hold(args: argparse.Namespace, out: Output) -> None:
    channel = Channel.open(args.home)
    out.line(f"open {channel.role} {os.getpid()}")
    try:
        if args.commit_first:
            with channel.take() as tx:
                events = tx.take(args.commit_first)
            out.line("take 0 " + " ".join(token(e) for e in events))
        tx = channel.take()
        events = tx.take(args.take)
        out.line("inflight 1 " + " ".join(token(e) for e in events))
        out.line("holding")
    except BaseException as exc:
        fail(out, exc)
    while True:
        time.sleep(3600)


# -- threads --------------------------------------------------------------------------------
def threads(args: argparse.Namespace, out: Output) -> None:
    channel = Channel.open(args.home)
    out.line(f"open {channel.role} {os.getpid()}")
    barrier = threading.Barrier(args.threads)
    lock = threading.Lock()
    results: dict[str, Any] = {"ok": 0, "errors": {}}

    def put_some(number: int) -> None:
        barrier.wait()
        for i in range(args.puts):
            try:
                with channel.put() as tx:
                    tx.put(f"{number}:{i}:a".encode(), key=b"red")  # partition 0
                    tx.put(f"{number}:{i}:b".encode(), key=b"pink")  # partition 1
            except Exception as exc:
                with lock:
                    name = f"{type(exc).__name__}: {exc}"
                    results["errors"][name] = results["errors"].get(name, 0) + 1
            else:
                with lock:
                    results["ok"] += 1

    running = [threading.Thread(target=put_some, args=(n,)) for n in range(args.threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    results["role"] = channel.role
    channel.close()
    out.line("done " + json.dumps(results))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("produce", "consume", "crash", "hold", "threads"))
    parser.add_argument("home")
    parser.add_argument("--go")
    parser.add_argument("--out")
    parser.add_argument("--done")
    parser.add_argument("--producer", type=int, default=0)
    parser.add_argument("--consumer", type=int, default=0)
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--first-batch", type=int, default=0)
    parser.add_argument("--subscription", default="default")
    parser.add_argument("--history")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument("--put-ratio", type=float, default=0.5)
    parser.add_argument("--max-put", type=int, default=100)
    parser.add_argument("--max-take", type=int, default=150)
    parser.add_argument("--rollback-ratio", type=float, default=0.2)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--checkpointer", action="store_true")
    parser.add_argument("--keyless", action="store_true")
    parser.add_argument("--slow-sync-ms", type=float, default=0.0)
    parser.add_argument("--stop-phase", choices=STOP_PHASES)
    parser.add_argument("--stop-at", type=int, default=1)
    parser.add_argument("--commit-first", type=int, default=0)
    parser.add_argument("--take", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--puts", type=int, default=1)
    args = parser.parse_args(argv)
    out = Output()
    modes = {"produce": produce, "consume": consume, "crash": crash, "hold": hold,
             "threads": threads}
    modes[args.mode](args, out)


if __name__ == "__main__":
    main()

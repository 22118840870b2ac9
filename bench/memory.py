"""Benchmark: resident memory of every process of a running appliance, idle and under
load, and the memory a queued event costs (issue 18: it must stay O(1), no Python object
per queued event).

    .venv/bin/python bench/memory.py [--events 1000000] [--clients 2] [--load-s 15]

It starts the whole appliance as a user does (`scripts/run.sh --background`, embedded
defaults, a private var dir and port, its own Redis and nginx), creates a channel (3
partitions, fsync durability) and a produce token, then reports, per process (named by
its role: web master and workers, nginx, the three Celery workers and their pool
children, beat, redis, the supervisor) its RSS and PSS (proportional set size: shared
pages split among the processes sharing them, so the PSS column adds up to what the
appliance costs the machine):
  * idle: after start-up and one request to every web worker;
  * under load: the peak over --load-s seconds of --clients processes POSTing
    1000-event requests (200-byte bodies), sampled every 0.2 s;
  * queued: after --events more events are queued (nothing takes them), the PSS sum
    again; (its rise) / (events queued) is the memory per queued event, with the
    channel's bytes on disk per event beside it for scale. The figure is taken at five
    queue depths, so growth with depth shows (a per-event cost grows the sum linearly;
    the allocator's noise after load is some MB either way).
Memory is not a rate: the machine's load does not skew these figures as it does the
throughput benches'.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.http_ingest import BATCH, free_port, http_client, manage, queued_events  # noqa: E402


def descendants(root: int) -> list[int]:
    """root and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def role(pid: int, parent_roles: dict[int, str]) -> str:
    """What the process is, from its command line (a child of a master: its worker)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    line = " ".join(a.decode(errors="replace") for a in argv)
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    if ppid in parent_roles and parent_roles[ppid] != "supervisor":
        return f"{parent_roles[ppid]} child"
    for needle, name in (("scripts.supervisor", "supervisor"), ("redis-server", "redis"),
                         ("nginx", "nginx"), ("gunicorn", "web"), (" beat", "beat"),
                         ("-n exports@", "exports worker"), ("-n kafka@", "kafka worker"),
                         ("-n worker@", "tasks worker"), ("appliance.front", "nginx")):
        if needle in line:
            return name
    return line[:40]


def memory(pid: int) -> tuple[int, int]:
    """RSS and PSS of a process, in bytes (0, 0 once it is gone)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0, 0
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in rollup[1:]}
    return fields.get("Rss", 0), fields.get("Pss", 0)


def snapshot(supervisor: int) -> dict[int, tuple[str, int, int]]:
    """Every appliance process: pid -> (role, RSS, PSS)."""
    roles: dict[int, str] = {}
    out = {}
    for pid in descendants(supervisor):
        try:
            roles[pid] = role(pid, roles)
        except OSError:
            continue
        rss, pss = memory(pid)
        out[pid] = (roles[pid], rss, pss)
    return out


def mb(value: float) -> str:
    """Bytes as MB, one decimal."""
    return f"{value / 1e6:8.1f}"


def produce(port: int, key: str, clients: int, requests: int) -> None:
    """clients processes, each POSTing `requests` 1000-event batches."""
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=http_client, args=(port, key, requests, out))
             for _ in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        out.get()
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a client failed (exit {p.exitcode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--load-s", type=float, default=15.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-membench-", dir="/var/tmp"))
    port = free_port()
    env = {**os.environ, "WEIR_VAR_DIR": str(root / "var"), "WEIR_BIND": f"127.0.0.1:{port}",
           "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "WEIR_API_RATE": "100000000/minute"}
    env.pop("DATABASE_URL", None)
    subprocess.run(["scripts/run.sh", "--background"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        supervisor = int((root / "var" / "run" / "supervisor.pid").read_text())
        manage(env, "create_channel", "bench", "--partitions", "3",
               "--set", "minimum_required_space=0", "--set", "capacity=100000000")
        key = manage(env, "create_token", "bench", "--role", "produce").split()[-1]
        admin = manage(env, "create_token", "bench-check", "--role", "admin").split()[-1]
        produce(port, key, 4, 2)  # every web worker opens it (4: the per-token cap)
        time.sleep(3)
        idle = snapshot(supervisor)
        peak = dict(idle)
        out: multiprocessing.Queue = multiprocessing.Queue()
        load = [multiprocessing.Process(target=http_client, args=(port, key, 10**6, out))
                for _ in range(args.clients)]
        for client in load:
            client.start()
        deadline = time.monotonic() + args.load_s
        while time.monotonic() < deadline:
            for pid, (name, rss, pss) in snapshot(supervisor).items():
                if rss > peak.get(pid, (name, 0, 0))[1]:
                    peak[pid] = (name, rss, pss)
            time.sleep(0.2)
        for client in load:
            client.terminate()
            client.join()
        print(f"{'process':<22} {'pid':>7} {'idle RSS':>9} {'idle PSS':>9} {'load RSS':>9} "
              f"{'load PSS':>9}   (MB)")
        for pid, (name, rss, pss) in sorted(idle.items(), key=lambda item: item[1][0]):
            _, load_rss, load_pss = peak.get(pid, (name, 0, 0))
            print(f"{name:<22} {pid:>7} {mb(rss)}  {mb(pss)}  {mb(load_rss)}  {mb(load_pss)}")
        print(f"{'all (PSS adds up)':<22} {'':>7} {'':>9} {mb(sum(p for _, _, p in idle.values()))}"
              f"  {'':>9} {mb(sum(p for _, _, p in peak.values()))}")
        queued_memory(port, key, admin, supervisor, root, args.events)
    finally:
        subprocess.run(["scripts/run.sh", "--stop"], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


def queued_memory(port: int, key: str, admin: str, supervisor: int, root: Path,
                  events: int) -> None:
    """Memory per queued event at five queue depths."""
    step = max(1, events // 5 // (4 * BATCH))
    base_events = queued_events(port, admin)
    base = sum(p for _, _, p in snapshot(supervisor).values())
    print(f"queued events (none taken): {base_events:,} at the start, PSS sum {mb(base)} MB")
    for _ in range(5):
        produce(port, key, 4, step)
        time.sleep(1)
        queued = queued_events(port, admin)
        pss = sum(p for _, _, p in snapshot(supervisor).values())
        disk = sum(f.stat().st_size for f in (root / "var" / "channels").rglob("*.log"))
        print(f"  {queued:>10,} queued: PSS sum {mb(pss)} MB, "
              f"{(pss - base) / max(1, queued - base_events):6.1f} B more per event queued "
              f"since the start; on disk {disk / max(1, queued):6.1f} B per event")


if __name__ == "__main__":
    main()

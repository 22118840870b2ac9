"""Benchmark: events/s and latency of the produce endpoint on a real gunicorn, next to the
engine alone and Redis Streams (XADD, appendfsync always) doing the same work, one run.

    .venv/bin/python bench/http_ingest.py [--requests 300] [--clients 4] [--workers 3]
                                          [--rounds 3] [--front none|nginx]

Work: batches of 1000 events with 200-byte bodies, fsync durability (a request returns
once its events are on disk). Contenders:
  * weir over HTTP: gunicorn (--workers, 2 threads each) on 127.0.0.1, a channel with
    3 partitions; --clients load-generator processes, each with one keep-alive
    connection, POST the same pre-built JSON body; latency per request. With --front
    nginx, the clients talk to nginx (appliance/front.py, as scripts/run.sh starts it,
    without the per-token in-flight limit) and nginx to gunicorn over its Unix socket,
    a new upstream connection a request;
  * engine alone: one process, `with channel.put() as tx: tx.put_all(batch)`;
  * Redis Streams: a private redis-server (appendonly yes, appendfsync always), the
    same client processes each sending a pipeline of 1000 XADD per batch.
The load generator shares the machine's cores with the server: its own cost is in the
figures, as it would be for a producer on the same host.
Straight to gunicorn (--front none), a keep-alive connection stays with the worker that
accepted it, and one worker's accept loop often takes several connections arriving at
once: then one worker (one GIL) parses most requests while the others idle. The "spread"
line says how the weir rounds' CPU fell on the workers; a round with one worker at ~100%
is slower for that reason. Behind nginx every request is accepted anew, by whichever
worker is free. This machine is a noisy VM
(rates swing by 2x from one minute to the next), so the contenders take turns for
--rounds rounds and each one's median round is reported, with every round's rate.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import cpu_s, machine_busy_seconds  # noqa: E402

BATCH, BODY = 1000, 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bodies() -> list[str]:
    return [(f"{i:08d}" + "x" * BODY)[:BODY] for i in range(BATCH)]


def http_client(port: int, key: str, requests: int, out: multiprocessing.Queue) -> None:
    payload = json.dumps({"events": [{"body": b} for b in bodies()]}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        conn.request("POST", "/api/v1/channels/bench/events", payload, headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}")
        latencies.append(time.perf_counter() - started)
    out.put(latencies)


def redis_client(port: int, requests: int, out: multiprocessing.Queue) -> None:
    import redis

    client = redis.Redis(port=port)
    batch = [b.encode() for b in bodies()]
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        pipe = client.pipeline(transaction=True)
        for body in batch:
            pipe.xadd("bench", {"body": body})
        pipe.execute()
        latencies.append(time.perf_counter() - started)
    out.put(latencies)


def run_clients(target, args: tuple, clients: int) -> tuple[float, list[float]]:  # type: ignore[no-untyped-def]
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=target, args=(*args, out)) for _ in range(clients)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    latencies = [lat for _ in procs for lat in out.get()]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a client failed (exit {p.exitcode})")
    return elapsed, latencies


def median_round(name: str, events: int, results: list[tuple[float, list[float]]]) -> float:
    """Print a contender's median round (rate, latency) and every round's rate."""
    ranked = sorted(results, key=lambda result: result[0])
    elapsed, latencies = ranked[len(ranked) // 2]
    rate = events / elapsed
    line = f"  {name:<40} {rate:>10,.0f} events/s"
    if latencies:
        cuts = statistics.quantiles(latencies, n=100)
        line += f"   p50 {cuts[49] * 1000:6.1f} ms   p99 {cuts[98] * 1000:6.1f} ms"
    every = ", ".join(f"{events / e:,.0f}" for e, _ in results)
    print(f"{line}   (rounds: {every})")
    return rate


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def worker_cpu(master: int) -> dict[int, float]:
    """CPU seconds (user + system) of each gunicorn worker of `master` so far."""
    found = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
    cpu = {}
    for pid in map(int, found.stdout.split()):
        try:
            cpu[pid] = cpu_s(pid)
        except FileNotFoundError:
            continue
    return cpu


def spread(before: dict[int, float], after: dict[int, float]) -> str:
    """Each worker's share of the CPU its siblings used between two worker_cpu()s."""
    used = sorted((after[pid] - before.get(pid, 0.0) for pid in after), reverse=True)
    total = sum(used) or 1.0
    return " / ".join(f"{100 * u / total:.0f}%" for u in used)


def start_web(root: Path, env: dict[str, str], workers: int, front: str,
              procs: list[subprocess.Popen[bytes]]) -> int:
    """Start gunicorn (and nginx before it with front "nginx"), each added to `procs` as
    it starts (for stop_all); the port to send requests to."""
    port = free_port()
    bind = f"unix:{root / 'web.sock'}" if front == "nginx" else f"127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs.append(subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "appliance.wsgi", "--bind", bind,
         "--workers", str(workers), "--threads", "2", "--no-control-socket"],
        cwd=ROOT, env=env, start_new_session=True, **quiet))
    if front == "nginx":
        deadline = time.monotonic() + 60
        while not (root / "web.sock").exists():
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gunicorn did not make its socket")
            time.sleep(0.05)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "appliance.front", "--listen", f"127.0.0.1:{port}",
             "--upstream", bind, "--dir", str(root / "front"), "--max-in-flight", "0"],
            cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "appliance.settings"},
            start_new_session=True, **quiet))
    return port


def queued_events(port: int, key: str) -> int:
    """events_untaken of the bench channel, as its detail endpoint reports it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/api/v1/channels/bench", headers={"Authorization": f"Bearer {key}"})
    response = conn.getresponse()
    body = json.loads(response.read())
    if response.status != 200:
        raise SystemExit(f"channel detail: HTTP {response.status} {body}")
    return int(body["status"]["events_untaken"])


def engine_alone(root: Path, requests: int) -> float:
    """Seconds for one process to put `requests` batches into a fresh channel."""
    from channel_engine import Channel, ChannelConfig, PendingEvent

    config = ChannelConfig("alone", [str(root / "data")], str(root / "home"),
                           partitions=3, minimum_required_space=0, capacity=10**8)
    batch = [PendingEvent(b.encode()) for b in bodies()]
    with Channel.open(config) as channel:
        started = time.perf_counter()
        for _ in range(requests):
            with channel.put() as tx:
                tx.put_all(batch)
        return time.perf_counter() - started


def bench_appliance(root: Path, *settings: str) -> tuple[dict[str, str], str, str]:
    """An appliance's database under root (SQLite) with channel `bench` (3 partitions,
    fsync durability, no disk guard, `settings` too) and no rate limit to speak of: its
    environment, a produce token and an admin token."""
    env = {**os.environ, "WEIR_VAR_DIR": str(root / "var"),
           "WEIR_DATA_ROOT": str(root / "channels"), "WEIR_API_RATE": "100000000/minute"}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    extra = [arg for setting in settings for arg in ("--set", setting)]
    manage(env, "create_channel", "bench", "--partitions", "3", "--set",
           "minimum_required_space=0", "--set", "capacity=100000000", *extra)
    key = manage(env, "create_token", "bench", "--role", "produce").split()[-1]
    admin = manage(env, "create_token", "bench-check", "--role", "admin").split()[-1]
    return env, key, admin


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group, SIGKILL the ones still there after 30 s."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="batches per contender")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--front", choices=("none", "nginx"), default="none",
                        help="nginx before gunicorn, as scripts/run.sh runs it")
    args = parser.parse_args()
    per_client = args.requests // args.clients
    events = per_client * args.clients * BATCH
    root = Path(tempfile.mkdtemp(prefix="weir-httpbench-", dir="/var/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env, key, admin = bench_appliance(root, "transaction_capacity=10000")
        port = start_web(root, env, args.workers, args.front, procs)
        redis_port = free_port()
        (root / "redis").mkdir()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--dir", str(root / "redis"),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, start_new_session=True))
        wait_port(port)
        wait_port(redis_port)
        run_clients(http_client, (port, key, 5), args.clients * 2)  # warm up every worker
        print(f"{events:,} events of {BODY} B in batches of {BATCH}, fsync durability, "
              f"{args.clients} client processes, gunicorn {args.workers} workers x 2 threads, "
              f"front: {args.front}, {os.cpu_count()} CPUs, {args.rounds} rounds (median shown)")
        rounds: dict[str, list[tuple[float, list[float]]]] = {
            "engine alone (1 process, no HTTP)": [], "weir produce over HTTP": [],
            "redis streams XADD (appendfsync always)": []}
        runs = list(rounds.values())
        shares, costs = [], []
        for index in range(args.rounds):
            runs[0].append((engine_alone(root / f"round-{index}", per_client * args.clients),
                            []))
            before, busy = worker_cpu(procs[0].pid), machine_busy_seconds()
            runs[1].append(run_clients(http_client, (port, key, per_client), args.clients))
            after, requests = worker_cpu(procs[0].pid), per_client * args.clients
            shares.append(spread(before, after))
            costs.append(f"{1000 * (sum(after.values()) - sum(before.values())) / requests:.2f}"
                         f" / {1000 * (machine_busy_seconds() - busy) / requests:.2f}")
            runs[2].append(run_clients(redis_client, (redis_port, per_client), args.clients))
        acknowledged = events * args.rounds + 5 * args.clients * 2 * BATCH
        queued = queued_events(port, admin)
        print(f"  check: the channel holds {queued:,} events, {acknowledged:,} acknowledged")
        if queued != acknowledged:
            raise SystemExit("the channel does not hold every acknowledged event exactly once")
        rates = {name: median_round(name, events, results)
                 for name, results in rounds.items()}
        alone, weir, redis_rate = rates.values()
        print(f"  spread: the gunicorn workers' shares of their CPU, each weir round: "
              f"{'; '.join(shares)}")
        print(f"  CPU ms a request, the gunicorn workers / the whole machine (clients, nginx "
              f"and the kernel too), each weir round: {'; '.join(costs)}")
        print(f"target: >= 150,000 events/s over HTTP and above Redis Streams: weir "
              f"{weir:,.0f} ({weir / redis_rate:.2f}x redis, {weir / alone:.2f}x the engine "
              "alone)")
    finally:
        stop_all(procs)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

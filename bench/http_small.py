"""Benchmark: small produce requests (1 and 10 events) over HTTP, next to a bare WSGI app
on the same gunicorn settings, one run.

    .venv/bin/python bench/http_small.py [--seconds 10] [--connections 8] [--workers 2]
                                         [--threads 8] [--worker-class gthread|sync]
                                         [--rounds 3] [--sizes 1,10]
                                         [--owner separate|web]

Work: wrk (Debian's; installed when missing) POSTs the same JSON body over
--connections keep-alive connections for --seconds, to
  * weir: the produce endpoint of a real gunicorn (--workers x --threads of
    --worker-class, by default as scripts/run.sh runs it; sync runs one thread a worker),
    a channel with 3 partitions, fsync
    durability (a request is answered once its events are on disk), a produce token;
    the channel owned, by default, by a process outside the web workers
    (bench/channel_holder.py), as the Celery worker's child owns it under scripts/run.sh
    (its flusher opens every channel at the first tick), so every request is a client's
    over owner.sock; --owner web leaves it to the first web worker that puts (about
    half the requests then served in the owner, whose GIL its own threads share with
    the owner's: slower, bench/README.md). The owner's CPU and fsyncs count as the
    server's;
  * bare WSGI: gunicorn, same workers and threads, serving an app that reads the body
    and answers 200 with a small JSON (bench/bare_wsgi.py) — the floor of any Python
    web app on this server; the ratio to it is what issue 18 targets (>= 0.5x at 1 event).
Both take turns for --rounds rounds; each one's median round is reported with its p50
and p99 latency (wrk's), the server's CPU time a request (user + system, all its
processes: what the rate costs, which a loaded machine changes less than the rate), its
fsyncs and context switches a request (perf stat on every server process and thread, when
perf is installed: how many requests one group-commit fsync carries, how many thread
hand-offs a request costs), and every round's rate. wrk runs on the same 2 CPUs as the
server: its cost is in both contenders' figures alike.
After each size the channel's queued events are checked against the 200s wrk counted:
every acknowledged event is there (at most the requests in flight when wrk stopped more:
wrk does not count those, the server may have committed them).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import channel_holder  # noqa: E402
from bench.http_ingest import (  # noqa: E402
    bench_appliance,
    free_port,
    queued_events,
    stop_all,
    wait_port,
)
from scripts.supervisor import WEB_THREADS, WEB_WORKERS  # noqa: E402 - the appliance's

BODY = 200
# counted by perf in the server's processes (per request: how well group commit gathers,
# how many thread hand-offs a request costs)
PERF_EVENTS = ("syscalls:sys_enter_fdatasync", "syscalls:sys_enter_fsync", "context-switches")
LUA = """
wrk.method = "POST"
wrk.body = io.open("{body}"):read("*a")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("HTTP " .. status .. " " .. body .. "\\n")
    os.exit(1)
  end
end
"""


def payload(events: int) -> bytes:
    """A produce request body of `events` 200-byte events."""
    return json.dumps({"events": [{"body": (f"{i:08d}" + "x" * BODY)[:BODY]}
                                  for i in range(events)]}).encode()


def gunicorn(app: str, port: int, workers: int, env: dict[str, str], threads: int = 2,
             worker_class: str = "gthread") -> subprocess.Popen[bytes]:
    """Start gunicorn serving `app` with workers x threads of worker_class."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), app, "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--threads", str(threads),
         "--worker-class", worker_class, "--no-control-socket"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)


def cpu_seconds(server: subprocess.Popen[bytes], also: tuple[int, ...] = ()
                ) -> tuple[float, float]:
    """User and system CPU seconds of every process of a gunicorn (its process group) and
    of the processes `also` (a channel's owner outside the web workers)."""
    named = {str(pid) for pid in also}
    user = system = 0
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == server.pid or entry.name in named:  # gunicorn's group
            user, system = user + int(fields[11]), system + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def server_pids(server: subprocess.Popen[bytes], also: tuple[int, ...] = ()) -> list[int]:
    """The pids of every process of a gunicorn (its process group), and `also`."""
    named = {str(pid) for pid in also}
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == server.pid or entry.name in named:
            pids.append(int(entry.name))
    return pids


def perf_counts(server: subprocess.Popen[bytes], also: tuple[int, ...] = ()
                ) -> subprocess.Popen[str] | None:
    """`perf stat` counting fsyncs and context switches in every process of a gunicorn
    and `also` (all their threads), until interrupted; None without perf."""
    if not shutil.which("perf"):
        return None
    return subprocess.Popen(
        ["perf", "stat", "-x", ",", "-e", ",".join(PERF_EVENTS),
         "-p", ",".join(map(str, server_pids(server, also)))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_result(perf: subprocess.Popen[str] | None) -> dict[str, float]:
    """The counts of a perf_counts() run, stopped now (empty if perf failed)."""
    if perf is None:
        return {}
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate(timeout=30)
    counts = {}
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in PERF_EVENTS and fields[0].isdigit():
            counts[fields[2]] = float(fields[0])
    return counts


def wrk(url: str, script: Path, seconds: int, connections: int,
        server: subprocess.Popen[bytes] | None = None, also: tuple[int, ...] = ()
        ) -> dict[str, float]:
    """Run wrk; its requests/s, p50 and p99 latency (ms) and request count, and the
    server's CPU, fsyncs and context switches a request when given the server (with the
    processes `also`: an owner outside it)."""
    before = cpu_seconds(server, also) if server else (0.0, 0.0)
    perf = perf_counts(server, also) if server else None
    done = subprocess.run(["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s",
                           "--timeout", "30s",
                           "--latency", "-s", str(script), url],
                          capture_output=True, text=True)
    counts = perf_result(perf)
    after = cpu_seconds(server, also) if server else (0.0, 0.0)
    if done.returncode or "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise SystemExit(f"wrk failed:\n{done.stdout}\n{done.stderr}")
    requests = int(re.search(r"(\d+) requests in", done.stdout).group(1))
    return {"rate": float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1)),
            "p50": _latency(done.stdout, "50%"), "p99": _latency(done.stdout, "99%"),
            "requests": requests,
            "user_us": 1e6 * (after[0] - before[0]) / max(1, requests),
            "system_us": 1e6 * (after[1] - before[1]) / max(1, requests),
            "fsyncs": (counts.get(PERF_EVENTS[0], 0) + counts.get(PERF_EVENTS[1], 0))
            / max(1, requests),
            "switches": counts.get(PERF_EVENTS[2], 0) / max(1, requests)}


def _latency(out: str, cut: str) -> float:
    value, unit = re.search(rf"{cut}\s+([\d.]+)(us|ms|s)", out).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def report(name: str, events: int, rounds: list[dict[str, float]]) -> float:
    """Print a contender's median round; return its requests/s."""
    middle = sorted(rounds, key=lambda r: r["rate"])[len(rounds) // 2]
    every = ", ".join(f"{r['rate']:,.0f}" for r in rounds)
    print(f"  {name:<32} {middle['rate']:>9,.0f} req/s {middle['rate'] * events:>10,.0f} "
          f"events/s   p50 {middle['p50']:6.2f} ms   p99 {middle['p99']:6.2f} ms   "
          f"CPU {middle['user_us']:4.0f}+{middle['system_us']:3.0f} us/request   "
          f"fsyncs {middle['fsyncs']:.2f}/request   switches {middle['switches']:4.1f}/request   "
          f"(rounds: {every})")
    return middle["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=WEB_WORKERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=WEB_THREADS,
                        help="gunicorn threads a worker")
    parser.add_argument("--worker-class", default="gthread", choices=("gthread", "sync"),
                        help="gunicorn worker class (sync: one request at a time a worker)")
    parser.add_argument("--sizes", default="1,10", help="events a request, comma-separated")
    parser.add_argument("--owner", default="separate", choices=("separate", "web"),
                        help="separate: a process other than the web workers owns the "
                             "channel, as the Celery worker's child does under "
                             "scripts/run.sh (every web worker a client over owner.sock); "
                             "web: the first web worker to put owns it")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["bash", "-c", ". scripts/common.sh && apt_install wrk"], cwd=ROOT,
                       check=True)
    root = Path(tempfile.mkdtemp(prefix="weir-smallbench-", dir="/var/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    holder = None
    try:
        env, key, admin = bench_appliance(root)
        if args.owner == "separate":
            holder = channel_holder.start(env)
        also = () if holder is None else (holder.pid,)
        weir_port, bare_port = free_port(), free_port()
        threads = 1 if args.worker_class == "sync" else args.threads
        weir_server = gunicorn("appliance.wsgi", weir_port, args.workers, env, threads,
                               args.worker_class)
        bare_server = gunicorn("bench.bare_wsgi:app", bare_port, args.workers, env, threads,
                               args.worker_class)
        procs += [weir_server, bare_server]
        wait_port(weir_port)
        wait_port(bare_port)
        print(f"{args.connections} connections, {args.seconds} s a round, gunicorn "
              f"{args.workers} {args.worker_class} workers x {threads} threads, "
              f"{os.cpu_count()} CPUs, channel owner: {args.owner}, "
              f"fsync durability, {args.rounds} rounds (median shown); CPU: the server's "
              "user+system time a request")
        for events in (int(size) for size in args.sizes.split(",")):
            (root / "body.json").write_bytes(payload(events))
            script = root / f"produce-{events}.lua"
            script.write_text(LUA.format(body=root / "body.json", key=key))
            wrk(f"http://127.0.0.1:{weir_port}/api/v1/channels/bench/events", script, 2,
                args.connections)  # warm every worker and thread
            acknowledged = queued_events(weir_port, admin)
            weir, bare = [], []
            for _ in range(args.rounds):
                weir.append(wrk(f"http://127.0.0.1:{weir_port}/api/v1/channels/bench/events",
                                script, args.seconds, args.connections, weir_server,
                                also))
                acknowledged += int(weir[-1]["requests"]) * events
                bare.append(wrk(f"http://127.0.0.1:{bare_port}/", script, args.seconds,
                                args.connections, bare_server))
            print(f"{events}-event requests ({events * BODY} B of bodies):")
            ours = report("weir produce (fsync)", events, weir)
            floor = report("bare WSGI app", events, bare)
            print(f"  weir / bare: {ours / floor:.2f}x")
            queued = queued_events(weir_port, admin)
            print(f"  check: the channel holds {queued:,} events, {acknowledged:,} "
                  "acknowledged")
            in_flight = 2 * args.connections * events * args.rounds  # wrk leaves out late answers
            if not acknowledged <= queued <= acknowledged + in_flight:
                raise SystemExit("the channel does not hold every acknowledged event once")
    finally:
        stop_all(procs)
        if holder is not None:
            channel_holder.stop(holder)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: an interleaved A/B of gunicorn shapes and put placement on small produce
requests, and the web workers' memory under maximum-size produce requests.

    .venv/bin/python bench/http_ab.py [--contenders 2x8,2x8:off,3x4] [--seconds 5]
                                      [--rounds 5] [--connections 8] [--events 1]
                                      [--memory-clients 16]

Each contender ("WORKERSxTHREADS"; ":bare" for bench/bare_wsgi.py, issue 18's floor;
":off" for put placement left out:
bench/no_placement_wsgi.py; ":ext" for the channel owned by a process that is not a web
worker, as the Celery worker owns it under scripts/run.sh, so every request is a client's
over owner.sock: bench/channel_holder.py, its CPU and fsyncs counted with the server's;
":sw=S" for web workers whose interpreter hands the GIL on every S seconds instead of
5 ms: bench/switch_wsgi.py) is its own appliance (database, channel `bench` of 3
partitions, fsync durability) served by its own gunicorn, so no two share an owner.
Rounds interleave: each round runs wrk against every contender in turn, the order
rotated each round, so the machine's load (shared, 2 CPUs) falls on all alike. Reported
per contender: the median round's requests/s, the median p99 and its spread over the
rounds (min-max), the median fsyncs (perf, when installed) and server CPU a request, and
every round's rate.

Memory (--memory-clients > 0): --memory-clients threads each POST one maximum-size
produce request at once (WEIR_MAX_PRODUCE_BYTES of JSON, transaction_capacity events)
to each contender in turn (with --compression zstd: uncompressed, its one record batch
would exceed max_batch_bytes and be refused, 413), while the resident set (VmRSS) of
every web worker is sampled every 50 ms; reported: the peak of the workers' sum and of
the largest worker, next to their size before.
"""
from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from appliance.env import MAX_PRODUCE_BYTES  # noqa: E402
from bench import channel_holder  # noqa: E402
from bench.http_ingest import bench_appliance, free_port, stop_all, wait_port  # noqa: E402
from bench.http_small import LUA, gunicorn, payload, server_pids, wrk  # noqa: E402

MAX_EVENTS = 10_000  # transaction_capacity's default: the most events one request may carry


class Contender:
    """One appliance and its gunicorn, of one shape, placement on or off."""

    def __init__(self, spec: str, root: Path, compression: str) -> None:
        shape, _, mode = spec.partition(":")
        self.name = spec
        self.workers, self.threads = (int(n) for n in shape.split("x"))
        self.env, self.key, _ = bench_appliance(root, f"compression={compression}")
        self.port = free_port()
        self.holder: subprocess.Popen[str] | None = None
        if mode == "ext":  # a process other than the web workers owns the channel
            self.holder = channel_holder.start(self.env)
        app = "appliance.wsgi"
        if mode == "bare":  # the floor: bench/bare_wsgi.py on the same gunicorn shape
            app = "bench.bare_wsgi:app"
        elif mode == "off":
            app = "bench.no_placement_wsgi:application"
        elif mode.startswith("sw="):  # the GIL's switch interval, in seconds
            app = "bench.switch_wsgi:application"
            self.env["WEIR_BENCH_SWITCH_S"] = mode.removeprefix("sw=")
        self.server = gunicorn(app, self.port, self.workers, self.env, self.threads)
        self.rounds: list[dict[str, float]] = []
        self.script = root / "produce.lua"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/channels/bench/events"

    def worker_rss_kib(self) -> list[int]:
        """VmRSS of each web worker (every process of the gunicorn but its master)."""
        sizes = []
        for pid in server_pids(self.server):
            if pid == self.server.pid:
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            sizes += [int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("VmRSS:")]
        return sizes


def max_size_body() -> bytes:
    """A produce body just under WEIR_MAX_PRODUCE_BYTES with MAX_EVENTS events."""
    overhead = len(payload(MAX_EVENTS)) - MAX_EVENTS * 200  # JSON around 200-byte bodies
    size = (MAX_PRODUCE_BYTES - overhead - 1024) // MAX_EVENTS
    return json.dumps({"events": [{"body": (f"{i:08d}" + "x" * size)[:size]}
                                  for i in range(MAX_EVENTS)]}).encode()


def post(port: int, key: str, body: bytes, statuses: list[int]) -> None:
    """POST one produce request; record its status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/api/v1/channels/bench/events", body=body,
                 headers={"Authorization": f"Bearer {key}",
                          "Content-Type": "application/json"})
    statuses.append(conn.getresponse().status)
    conn.close()


def memory(contender: Contender, clients: int, body: bytes) -> str:
    """Peak worker RSS while `clients` maximum-size requests run at once."""
    before = contender.worker_rss_kib()
    statuses: list[int] = []
    threads = [threading.Thread(target=post, args=(contender.port, contender.key, body,
                                                   statuses)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    peak_sum = peak_one = 0
    while any(thread.is_alive() for thread in threads):
        sizes = contender.worker_rss_kib()
        peak_sum, peak_one = max(peak_sum, sum(sizes)), max(peak_one, max(sizes, default=0))
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    if statuses != [200] * clients:
        raise SystemExit(f"{contender.name}: maximum-size produce answered {statuses}")
    return (f"  {contender.name:<8} workers' RSS {sum(before) / 1024:6.0f} MiB before, peak "
            f"{peak_sum / 1024:6.0f} MiB (largest worker {peak_one / 1024:5.0f} MiB)")


def report(contenders: list[Contender], args: argparse.Namespace) -> None:
    """Print each contender's median rate, median p99 and its spread over the rounds."""
    print(f"{args.events}-event requests, {args.connections} connections, "
          f"{args.seconds} s a round, {args.rounds} interleaved rounds, fsync durability")
    for contender in contenders:
        rounds = contender.rounds
        rates = sorted(r["rate"] for r in rounds)
        every = ", ".join(f"{r['rate']:,.0f}" for r in rounds)
        p99s = sorted(r["p99"] for r in rounds)
        print(f"  {contender.name:<8} {rates[len(rates) // 2]:>7,.0f} req/s (median)   "
              f"p99 {p99s[len(p99s) // 2]:6.2f} ms median, {p99s[0]:.2f}-{p99s[-1]:.2f} "
              f"spread   p50 {sorted(r['p50'] for r in rounds)[len(rounds) // 2]:5.2f} ms"
              f"   fsyncs {_median(rounds, 'fsyncs'):.2f}/request   switches "
              f"{_median(rounds, 'switches'):.1f}/request   CPU "
              f"{_median(rounds, 'user_us') + _median(rounds, 'system_us'):.0f} us/request"
              f"   (rounds: {every})")


def _median(rounds: list[dict[str, float]], field: str) -> float:
    return sorted(r[field] for r in rounds)[len(rounds) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contenders", default="2x8,2x8:off,3x4")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--events", type=int, default=1, help="events a request")
    parser.add_argument("--memory-clients", type=int, default=16)
    parser.add_argument("--compression", default="none",
                        help="the channel's codec (zstd lets a maximum-size request of "
                             "repeated bytes fit in one record batch)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="weir-abbench-", dir="/var/tmp"))
    contenders: list[Contender] = []
    try:
        for index, spec in enumerate(args.contenders.split(",")):
            contenders.append(Contender(spec, root / str(index), args.compression))
        (root / "body.json").write_bytes(payload(args.events))
        for contender in contenders:
            wait_port(contender.port)
            contender.script.write_text(LUA.format(body=root / "body.json", key=contender.key))
            wrk(contender.url, contender.script, 2, args.connections)  # warm every thread
        for round_ in range(args.rounds):
            for i in range(len(contenders)):
                contender = contenders[(round_ + i) % len(contenders)]
                also = () if contender.holder is None else (contender.holder.pid,)
                contender.rounds.append(wrk(contender.url, contender.script, args.seconds,
                                            args.connections, contender.server, also))
        if args.rounds:
            report(contenders, args)
        if args.memory_clients:
            body = max_size_body()
            print(f"memory: {args.memory_clients} concurrent produce requests of "
                  f"{len(body) / 2**20:.1f} MiB ({MAX_EVENTS} events) each")
            for contender in contenders:
                print(memory(contender, args.memory_clients, body), flush=True)
    finally:
        stop_all([contender.server for contender in contenders])
        for contender in contenders:
            if contender.holder is not None:
                channel_holder.stop(contender.holder)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Load for the slow-client tests (test_slow_clients.py, bench/slow_clients.py): normal
producers measured, and an attack run in a process of its own.

Normal producers: threads, each with its own token and one keep-alive connection, POST
EVENTS events at a paced RATE requests/s (late requests go at once, so a producer catches
up after a stall); a request failing or taking over REQUEST_TIMEOUT_S counts as lost.
Their rate is the requests answered 200 per second, from their start until the last
answer (a producer that stalled and caught up afterwards took longer); p99 their latency.

The attack, asyncio, bounded by SECONDS (N: greedy requests, default 1,000):

    python tests/appliance/load_clients.py HOST PORT GREEDY_KEY SLOW_KEYS SECONDS [PAUSE [N]]

prints "ready" once every connection is open, then one JSON line of counts when done:
  * slow headers: connections sending one header line a second, never ending the header
    (reconnecting when dropped);
  * slow bodies: produce requests with a whole header (a token of their own each) and a
    Content-Length of 100 kB, sending ten bytes a second;
  * greedy: one token, 1,000 requests in parallel, each sent again PAUSE (GREEDY_PAUSE_S)
    after its answer (whatever it was) — a thousand in flight whenever the server lets them.
Everything stays on 127.0.0.1.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import resource
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

EVENTS = 20
RATE = 10.0  # requests/s of one normal producer
REQUEST_TIMEOUT_S = 5.0
SLOW_HEADERS, SLOW_BODIES, GREEDY = 50, 50, 1000
GREEDY_PAUSE_S = 1.0
PATH = "/api/v1/channels/orders/events"


@dataclass
class Figures:
    """What normal producers got in one window."""

    seconds: float
    latencies: list[float] = field(default_factory=list)  # of requests answered 200
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        """Requests answered 200 per second."""
        return len(self.latencies) / self.seconds

    @property
    def p99(self) -> float:
        """The 99th percentile latency in seconds (inf when nothing succeeded)."""
        if not self.latencies:
            return float("inf")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def line(self) -> str:
        """One human-readable line."""
        failed = sum(self.failures.values())
        return (f"{self.rate:7.1f} req/s ({self.rate * EVENTS:7.0f} events/s), p99 "
                f"{self.p99 * 1000:7.1f} ms, {failed} failed {dict(self.failures) or ''}")


def _producer(host: str, port: int, key: str, seconds: float, rate: float,
              figures: Figures, lock: threading.Lock) -> None:
    body = json.dumps({"events": [{"body": f"normal-{i}", "key": str(i)}
                                  for i in range(EVENTS)]}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    start = time.monotonic()
    sent = 0
    while True:
        due = start + sent / rate
        if due >= start + seconds:
            break
        time.sleep(max(0.0, due - time.monotonic()))
        sent += 1
        began = time.monotonic()
        try:
            connection.request("POST", PATH, body, headers)
            response = connection.getresponse()
            response.read()
            outcome = str(response.status)
        except (OSError, http.client.HTTPException) as exc:
            outcome = type(exc).__name__
            connection.close()
            connection = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
        took = time.monotonic() - began
        with lock:
            if outcome == "200" and took <= REQUEST_TIMEOUT_S:
                figures.latencies.append(took)
            else:
                figures.failures[outcome] += 1
    connection.close()


def measure(host: str, port: int, keys: list[str], seconds: float,
            rate: float = RATE) -> Figures:
    """Run one paced producer per key for `seconds`; their figures."""
    figures, lock = Figures(seconds), threading.Lock()
    threads = [threading.Thread(target=_producer, args=(host, port, key, seconds, rate,
                                                        figures, lock))
               for key in keys]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # until the last answer: a producer that fell behind and caught up late took longer
    figures.seconds = time.monotonic() - began
    return figures


# -- the attack (its own process) ---------------------------------------------------------
class Attack:
    """The attack's connections and what they saw."""

    def __init__(self, host: str, port: int, greedy_key: str, slow_keys: list[str],
                 seconds: float, greedy_pause_s: float = GREEDY_PAUSE_S,
                 greedy: int = GREEDY) -> None:
        self.host, self.port = host, port
        self.greedy_pause_s, self.greedy_count = greedy_pause_s, greedy
        self.greedy_key, self.slow_keys = greedy_key, slow_keys
        self.stop_at = time.monotonic() + seconds
        self.counts: Counter[str] = Counter()
        self.open = Counter[str]()
        self.low = Counter[str]()  # the fewest open at once after "ready", per kind
        self.ready = False

    def left(self) -> float:
        return self.stop_at - time.monotonic()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)

    def _opened(self, kind: str, delta: int) -> None:
        self.open[kind] += delta
        if self.ready and self.left() > 0.5:  # not the closing at the end
            self.low[kind] = min(self.low.get(kind, self.open[kind]), self.open[kind])

    async def slow(self, kind: str, head: bytes, drip: bytes) -> None:
        """Send `head`, then `drip` once a second, until dropped (then again) or done."""
        while self.left() > 0:
            try:
                reader, writer = await self._connect()
            except OSError:
                self.counts[f"{kind}_connect_failed"] += 1
                await asyncio.sleep(0.5)
                continue
            self._opened(kind, 1)
            try:
                writer.write(head)
                while self.left() > 0:
                    await writer.drain()
                    try:  # dropped by the server (b"") or answered: either ends it
                        data = await asyncio.wait_for(reader.read(1024), min(1.0, self.left()))
                        self.counts[f"{kind}_{'answered' if data else 'dropped'}"] += 1
                        break
                    except TimeoutError:
                        writer.write(drip)
            except OSError:
                self.counts[f"{kind}_dropped"] += 1
            finally:
                self._opened(kind, -1)
                writer.close()

    async def greedy(self, body: bytes) -> None:
        """One of the greedy client's parallel requests, again and again."""
        request = (f"POST {PATH} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   f"Authorization: Bearer {self.greedy_key}\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        writer = None
        while self.left() > 0:
            try:
                if writer is None:
                    reader, writer = await self._connect()
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.left())
                status = head.split(b" ", 2)[1].decode()
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                    if name.strip().lower() == b"connection" and b"close" in value.lower():
                        status += "+close"
                await asyncio.wait_for(reader.readexactly(length), self.left())
                self.counts[f"greedy_{status.split('+')[0]}"] += 1
                if status.endswith("+close"):
                    writer.close()
                    writer = None
            except (TimeoutError, OSError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError, IndexError, ValueError) as exc:
                ended = self.left() <= 0  # cut off by the end of the run, not the server
                self.counts[f"greedy_{'unanswered_at_end' if ended else type(exc).__name__}"] += 1
                if writer is not None:
                    writer.close()
                writer = None
            await asyncio.sleep(min(self.greedy_pause_s, max(0.0, self.left())))
        if writer is not None:
            writer.close()

    async def run(self) -> dict[str, int]:
        """Open everything, say "ready", keep at it until the time is up; the counts."""
        host = f"Host: {self.host}:{self.port}\r\n".encode()
        tasks = [asyncio.create_task(self.slow(
            "slow_header", b"POST " + PATH.encode() + b" HTTP/1.1\r\n" + host,
            b"X-Slow: 1\r\n")) for _ in range(SLOW_HEADERS)]
        for key in self.slow_keys[:SLOW_BODIES]:
            head = (f"POST {PATH} HTTP/1.1\r\n{host.decode()}Authorization: Bearer {key}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                    '{"events": [{"body": "').encode()
            tasks.append(asyncio.create_task(self.slow("slow_body", head, b"x" * 10)))
        body = json.dumps({"events": [{"body": "greedy"}]}).encode()
        while self.open["slow_header"] + self.open["slow_body"] < SLOW_HEADERS + SLOW_BODIES:
            if self.left() <= 0:
                break
            await asyncio.sleep(0.05)
        tasks += [asyncio.create_task(self.greedy(body)) for _ in range(self.greedy_count)]
        await asyncio.sleep(0.5)  # the first thousand are sent
        self.ready = True
        self.low.update({k: self.open[k] for k in ("slow_header", "slow_body")})
        print("ready", flush=True)
        await asyncio.gather(*tasks)
        return {**self.counts, **{f"{k}_open_low": v for k, v in self.low.items()}}


def main(argv: list[str]) -> int:
    """The attack's process: HOST PORT GREEDY_KEY SLOW_KEYS(comma-separated) SECONDS
    [GREEDY_PAUSE_S [GREEDY]]."""
    host, port, greedy_key, slow_keys, seconds = argv[:5]
    pause = float(argv[5]) if len(argv) > 5 else GREEDY_PAUSE_S
    greedy = int(argv[6]) if len(argv) > 6 else GREEDY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    attack = Attack(host, int(port), greedy_key, slow_keys.split(","), float(seconds), pause,
                    greedy)
    print(json.dumps(asyncio.run(attack.run())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Slow and greedy clients cannot starve normal producers (issue 13): a real gunicorn
behind the real nginx front, both started by the supervisor's code, on loopback.

Normal producers (4 tokens, 10 requests/s of 20 events each, tests/appliance/load_clients.py)
are measured unloaded, then while 50 slow-header clients, 50 slow-body clients and one
greedy token with 1,000 requests in parallel attack; they must keep >= 90 % of their
unloaded rate with p99 < 1 s. Both windows run in this one test, so a busy machine slows
both alike. Before the front, six slow-header or three slow-body connections held every
gunicorn thread (`bench/slow_clients.py` prints the figures, with the front off for
contrast).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from front_helpers import web_server
from load_clients import SLOW_BODIES, SLOW_HEADERS, measure

pytestmark = pytest.mark.own_sqlite  # its appliance runs on a SQLite database of its own

LOAD = Path(__file__).resolve().parent / "load_clients.py"
NORMAL = [f"normal-{i}" for i in range(4)]
SLOW = [f"slow-{i}" for i in range(SLOW_BODIES)]
WARM_S, BASE_S, LOADED_S = 1.0, 4.0, 6.0


def start_attack(host: str, port: int, greedy: str, slow: list[str],
                 seconds: float) -> subprocess.Popen[str]:
    attack = subprocess.Popen([sys.executable, str(LOAD), host, str(port), greedy,
                               ",".join(slow), str(seconds)], stdout=subprocess.PIPE,
                              text=True)
    assert attack.stdout is not None
    line = attack.stdout.readline()
    assert line.strip() == "ready", line
    return attack


@pytest.mark.timeout(120)
def test_it_keeps_normal_producers_at_rate_under_slow_and_greedy_clients(
        tmp_path: Path) -> None:
    with web_server(tmp_path, ["greedy", *NORMAL, *SLOW]) as server:
        keys = [server.tokens[name] for name in NORMAL]
        measure("127.0.0.1", server.port, keys, WARM_S)  # connections, caches, imports
        base = measure("127.0.0.1", server.port, keys, BASE_S)
        attack = start_attack("127.0.0.1", server.port, server.tokens["greedy"],
                              [server.tokens[name] for name in SLOW], LOADED_S + 2)
        try:
            loaded = measure("127.0.0.1", server.port, keys, LOADED_S)
            out, _ = attack.communicate(timeout=30)
        finally:
            if attack.poll() is None:
                attack.kill()
                attack.wait()
    seen = json.loads(out.strip().splitlines()[-1])
    print(f"\nunloaded: {base.line()}\nloaded:   {loaded.line()}\nattack:   {seen}")
    assert not base.failures and base.rate > 0
    # the attack happened: every slow connection stayed open, the greedy token was both
    # served (up to its limit) and refused
    assert seen["slow_header_open_low"] >= SLOW_HEADERS * 0.9, seen
    assert seen["slow_body_open_low"] >= SLOW_BODIES * 0.9, seen
    assert seen.get("greedy_200", 0) > 0 and seen.get("greedy_429", 0) >= 1000, seen
    assert loaded.rate >= 0.9 * base.rate, (base.line(), loaded.line())
    assert loaded.p99 < 1.0, loaded.line()

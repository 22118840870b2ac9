"""Benchmark: normal producers' rate and p99 under slow and greedy clients, with the front
(nginx, appliance/front.py) as scripts/run.sh starts it, and without it for contrast.

    .venv/bin/python bench/slow_clients.py [--seconds 6] [--modes nginx,nginx-nolimit,none]
                                           [--greedy-pause 1.0] [--greedy 1000]

Each mode starts its own appliance (gunicorn, 3 workers x 2 threads, through the
supervisor's code; a channel with policy durability) on 127.0.0.1, measures 4 paced
producers (10 requests/s of 20 events each) unloaded, then while 50 slow-header clients,
50 slow-body clients and one token with 1,000 parallel requests attack
(tests/appliance/load_clients.py, the same load as tests/appliance/test_slow_clients.py).
Modes: nginx (the front, WEIR_TOKEN_MAX_IN_FLIGHT=4), nginx-nolimit (the front without the
per-token limit: what the greedy client alone does), none (gunicorn serves clients directly:
the appliance before the front). A producer's request failing or taking over 5 s is lost.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "appliance"
sys.path[:0] = [str(ROOT), str(HELPERS)]

from front_helpers import web_server  # noqa: E402
from load_clients import GREEDY, GREEDY_PAUSE_S, SLOW_BODIES, measure  # noqa: E402

MODES = {"nginx": ("nginx", 4), "nginx-nolimit": ("nginx", 0), "none": ("none", 4)}
NORMAL = [f"normal-{i}" for i in range(4)]
SLOW = [f"slow-{i}" for i in range(SLOW_BODIES)]


def run_mode(mode: str, seconds: float, pause: float, greedy: int) -> None:
    """Start an appliance in `mode`, measure unloaded then attacked, print both."""
    kind, limit = MODES[mode]
    with tempfile.TemporaryDirectory(prefix="weir-bench-") as tmp, \
            web_server(Path(tmp), ["greedy", *NORMAL, *SLOW], kind, limit) as server:
        keys = [server.tokens[name] for name in NORMAL]
        measure("127.0.0.1", server.port, keys, 1.0)
        base = measure("127.0.0.1", server.port, keys, seconds)
        attack = subprocess.Popen(
            [sys.executable, str(HELPERS / "load_clients.py"), "127.0.0.1", str(server.port),
             server.tokens["greedy"], ",".join(server.tokens[n] for n in SLOW),
             str(seconds + 2), str(pause), str(greedy)], stdout=subprocess.PIPE, text=True)
        assert attack.stdout is not None
        ready = attack.stdout.readline().strip()
        loaded = measure("127.0.0.1", server.port, keys, seconds)
        out, _ = attack.communicate(timeout=60)
    seen = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    kept = loaded.rate / base.rate * 100 if base.rate else 0.0
    print(f"== {mode}: {kind} front, per-token limit {limit or 'off'}; {greedy} greedy "
          f"requests, pause {pause} s")
    print(f"   unloaded  {base.line()}")
    print(f"   attacked  {loaded.line()}  -> {kept:.0f} % of the unloaded rate")
    print(f"   attack ({ready or 'never ready'}): {seen}", flush=True)


def main() -> int:
    """Run the asked modes one after the other."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="each window")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--greedy-pause", type=float, default=GREEDY_PAUSE_S,
                        help="seconds each greedy request waits after its answer")
    parser.add_argument("--greedy", type=int, default=GREEDY,
                        help="the greedy token's parallel requests (0: slow clients only)")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        run_mode(mode.strip(), args.seconds, args.greedy_pause, args.greedy)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Make the golden channel that tests/engine/test_golden_channel.py opens.

    .venv/bin/python tests/engine/golden/make_golden_channel.py

writes tests/engine/golden/channel-v3/: channel `orders` (2 partitions, small segments,
no preallocation) as the release before subscriptions left it when its process died:
checkpoint version 3, commit journal version 1, channel.json version 2, a loss ledger.
It was run once, with that release's engine (main at 30c5989), and the result committed.
Never rerun it to make a failing golden test pass: that test failing means the engine
can no longer open a channel it once wrote, which is the bug.

What happened to it, in order (a fixed clock: 1_700_000_000.0 s, +1 s per call):
  1. puts of e00..e19, keys k0..k4 (multi-partition puts: transactional batches and
     put commit records);
  2. a take of 5, committed; a checkpoint;
  3. a take of 4, committed (journalled after the checkpoint: replayed on open);
  4. a take of 3 left in flight (returned on open), a take of 2 rolled back;
  5. the process exits without closing (as kill -9 leaves it; every commit was synced:
     fsync durability).
So the channel holds 11 events untaken: the 20 less the 9 of the committed takes. Which
ones is written to expected.json (partition, offset, body of each untaken event). The
paths in channel.json are the maker's; the test opens a copy under the same settings.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(os.environ.get("WEIR_GOLDEN_ENGINE", Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(ROOT))

from channel_engine import Channel, ChannelConfig  # noqa: E402

TARGET = Path(__file__).resolve().parent / "channel-v3"


def settings(base: Path) -> ChannelConfig:
    """The golden channel's config with its directories under `base`."""
    return ChannelConfig("orders", [str(base / "data")], str(base / "home"), partitions=2,
                         minimum_required_space=0, segment_bytes=1024,
                         index_interval_bytes=64, preallocate=False,
                         checkpoint_interval_ms=3_600_000)


def main() -> None:
    work = Path(tempfile.mkdtemp())
    ticks = iter(range(1_700_000_000, 1_800_000_000))
    channel = Channel.open(settings(work), clock=lambda: float(next(ticks)))
    for start in range(0, 20, 5):
        with channel.put() as tx:
            for i in range(start, start + 5):
                tx.put(f"e{i:02d}".encode(), key=f"k{i % 5}".encode())
    taken = []
    with channel.take() as tx:
        taken += tx.take(5)
    channel.checkpoint()
    with channel.take() as tx:
        taken += tx.take(4)
    in_flight = channel.take()
    in_flight.take(3)
    rolled_back = channel.take()
    rolled_back.take(2)
    rolled_back.rollback()
    with Channel.open(settings(work), read_only=True) as snapshot:
        events = [e for p in range(2) for e in snapshot.read(p, 0, 100)]
    gone = {(e.partition, e.offset) for e in taken}
    expected = sorted([e.partition, e.offset, e.body.decode()] for e in events
                      if (e.partition, e.offset) not in gone)
    assert len(expected) == 11, expected
    if TARGET.exists():
        shutil.rmtree(TARGET)
    shutil.copytree(work, TARGET, ignore=shutil.ignore_patterns(".lock", "*.sock"))
    (TARGET / "expected.json").write_text(json.dumps({"untaken": expected}, indent=1) + "\n")
    os._exit(0)  # no close: as a killed process leaves it


if __name__ == "__main__":
    main()

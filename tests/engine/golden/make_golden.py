"""Make the golden partition directory that tests/engine/test_golden.py reads.

    .venv/bin/python tests/engine/golden/make_golden.py

writes tests/engine/golden/partition-v2/: a partition log as released format
v2 leaves it after a clean close (record batches v2 with CRC-32C, `.index`,
`.timeindex`, log.state version 2: with its committed-end record). partition-v1/
was made the same way by format v1 (log.state version 1, 44 bytes); the other
files of the two are byte for byte the same. It holds 11 events in 5 batches over 3
segments: four uncompressed batches and one gzip batch, keys None and bytes,
headers, an empty body, timestamps that go back, an offset index entry.

Run it once per released on-disk format, into a new directory (partition-v2/ for
the next one), and commit the result. Never rerun it to make a failing golden
test pass: that test failing means the engine can no longer read files it once
wrote, which is the bug.

Deterministic: fixed timestamps, gzip's header mtime pinned to 0, and log.state
rewritten with a fixed written_at_ms (close stamps the wall clock). The `.lock`
file is left out: it is not data, and every writer creates it.
"""
from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from channel_engine.event import PendingEvent  # noqa: E402
from channel_engine.filenames import LOCK_FILE, LOG_STATE_FILE  # noqa: E402
from channel_engine.log import state as log_state  # noqa: E402
from channel_engine.log.config import LogConfig  # noqa: E402
from channel_engine.log.partition_log import PartitionLog  # noqa: E402

TARGET = Path(__file__).resolve().parent / "partition-v2"
WRITTEN_AT_MS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=350, index_interval_bytes=100)

# One PartitionLog.open per entry: its compression and the batches it appends
OPENS = [
    ("none", [
        [PendingEvent(b"first", None, None, 1_600_000_000_000),
         PendingEvent(b"second", b"key-2", {"src": b"golden", "n": b"2"}, 1_600_000_000_010),
         PendingEvent(b"", b"", {}, 1_600_000_000_005)],
        [PendingEvent(b"fourth", b"key-4", None, 1_600_000_000_015)],
        [PendingEvent(b"fifth" * 20, b"key-5", {"n": b"5"}, 1_600_000_000_020),
         PendingEvent(b"sixth", None, {"empty": b""}, 1_600_000_000_030)],
    ]),
    ("gzip", [
        [PendingEvent(b"gzip-7 " * 30, b"key-7", {"codec": b"gzip"}, 1_600_000_000_040),
         PendingEvent(b"gzip-8 " * 30, None, None, 1_600_000_000_041),
         PendingEvent(b"gzip-9", b"key-9", {"a": b"1", "b": b"2"}, 1_600_000_000_035),
         PendingEvent(b"gzip-10", None, None, 1_600_000_000_050)],
    ]),
    ("none", [
        [PendingEvent(b"eleventh", b"key-11", None, 1_600_000_000_060)],
    ]),
]


def main() -> None:
    if TARGET.exists():
        shutil.rmtree(TARGET)
    with mock.patch.object(gzip, "time", SimpleNamespace(time=lambda: 0)):
        for compression, batches in OPENS:
            with PartitionLog.open(TARGET, CONFIG.replace(compression=compression)) as log:
                for events in batches:
                    log.append(events)
    state = log_state.read(TARGET / LOG_STATE_FILE)
    assert state is not None and state.clean_shutdown
    log_state.write(TARGET / LOG_STATE_FILE, state.with_(written_at_ms=WRITTEN_AT_MS))
    (TARGET / LOCK_FILE).unlink()
    for path in sorted(TARGET.iterdir()):
        print(f"{path.stat().st_size:6d}  {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

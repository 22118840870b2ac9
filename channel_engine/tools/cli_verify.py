"""`python -m channel_engine verify PATH`: deep CRC and index check, exit 1 on damage.

The checks are tools/verify.py's; this module prints them (text or --json).
Read-only: it never repairs (`recover` does) and takes no lock.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.tools.cli_paths import is_home, require_dir, supplied_config
from channel_engine.tools.verify import (
    verify_channel,
    verify_partition,
)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Verify a partition directory or a channel's home; 0 when sound, else 1."""
    require_dir(args.path)
    if is_home(args.path, args):
        return _verify_channel(args.path, supplied_config(args), args.json, out)
    report = verify_partition(args.path)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        for note in report.notes:
            print(f"note: {note}", file=out)
        for damage in report.damages:
            print(f"DAMAGE {damage}", file=out)
        verdict = "sound" if report.ok else f"{len(report.damages)} damaged place(s)"
        print(f"{args.path}: {report.segments} segments, {report.batches} batches, "
              f"{report.records} records, {report.bytes} bytes checked: {verdict}", file=out)
    return 0 if report.ok else 1


def _verify_channel(home: Path, config: ChannelConfig | None, as_json: bool,
                    out: TextIO) -> int:
    result = verify_channel(config or home)
    if as_json:
        print(json.dumps(result, indent=2), file=out)
    else:
        for note in result["notes"]:
            print(f"note: {note}", file=out)
        for problem in result["problems"]:
            print(f"DAMAGE {problem}", file=out)
        records = sum(r["records"] for r in result["partitions"] if r)
        verdict = "sound" if result["ok"] else f"{len(result['problems'])} problem(s)"
        name = repr(result["channel"]) if result["channel"] else str(home)
        print(f"channel {name}: {len(result['partitions'])} partitions, "
              f"{records} records, newest checkpoint {result['checkpoint_source'] or 'none'}: "
              f"{verdict}", file=out)
    return 0 if result["ok"] else 1

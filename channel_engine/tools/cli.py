"""Operator tools for a channel or a partition directory, in the spirit of
kafka-dump-log.sh and Flume's file channel integrity tool.

    python -m channel_engine produce PATH [--batch N] [--key K] [--header k=v]...
    python -m channel_engine dump PATH [--print-data] [--json]
    python -m channel_engine verify PATH [--config FILE] [--json]
    python -m channel_engine stat PATH [--json]
    python -m channel_engine recover PATH [--config FILE] [--json] [--ack]

PATH is a channel's home (its checkpoint_dir, holding channel.json), a partition
directory, or (dump) one .log, .index or .timeindex file. On a channel:
produce puts through the channel (as a client when another process owns it);
dump prints the checkpoints and the commit journals (on a partition: every intact
batch, each damaged region with its byte, length, reason and offsets, then the
batches after it, exit 1 when it met damage); verify reports every
damage of the home's files (channel.json, both checkpoint copies, the journals,
strays) and of every partition, without failing on any; stat prints the
channel's status and each partition's segments; recover repairs every damage
verify reports (tools/recover.py: journals cut at their first bad record,
damaged files kept aside, strays moved aside, every batch CRC-checked), opens
the channel as its owner, replays it and prints what it cost: events lost (by
offsets), take commits that may come back (at least once; "up to N events" when
a journal's content is unknown), files moved aside;
with --ack it then acknowledges every loss in the channel's loss ledger and
prints what it acknowledged.
--config FILE supplies the channel's settings (a JSON object, as channel.json
holds them) when channel.json is damaged or missing. A directory is a channel's
home when it holds channel.json, a checkpoint or a commit journal (or --config
is given), else a partition directory. Exit status: 0 success (verify: sound),
1 damage found or the operation failed, 2 bad usage.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TextIO

from channel_engine.errors import (
    ChannelEngineError,
    UsageError,
    describe_os_error,
)
from channel_engine.log import record_batch
from channel_engine.log.config import LogConfig
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.tools import cli_dump, cli_produce, cli_recover, cli_stat, cli_verify

# This module parses the command line and maps errors to the exit status (the text above
# is also --help's); each tool lives in its own module, what PATH is in cli_paths.
CONFIG_HELP = ("the channel's settings, a JSON object as channel.json holds them (when "
               "channel.json is damaged or missing)")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         config: ChannelConfig | None = None) -> int:
    """Run one tool; return the exit status. `config` supplies the channel's settings
    (as --config FILE does) to verify and recover, from a database say."""
    out = out or sys.stdout
    parser = _parser()
    args = parser.parse_args(argv)
    args.supplied = config
    try:
        return int(args.run(args, out))
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        sys.stderr.close()
        return 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ChannelEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or directory the tool met cannot be used
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{describe_os_error(exc) if where else exc}", file=sys.stderr)
        return 1


def _version() -> str:
    """What --version prints: the release and which record batch codec this process runs."""
    try:
        release = metadata.version("weir")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        release = "(not installed)"
    return f"weir {release}, record batch codec: {record_batch.CODEC}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m channel_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    tools = parser.add_subparsers(dest="tool", required=True)

    produce = tools.add_parser("produce", help="append stdin lines as events")
    produce.add_argument("path", type=Path)
    produce.add_argument("--batch", type=int, default=100, help="events per batch (100)")
    produce.add_argument("--key", help="key of every event")
    produce.add_argument("--header", action="append", default=[], metavar="K=V",
                         help="a header of every event (repeatable)")
    produce.add_argument("--compression", default="none",
                         choices=sorted(record_batch.COMPRESSION_CODECS))
    produce.add_argument("--segment-bytes", type=int, default=LogConfig.segment_bytes)
    produce.set_defaults(run=cli_produce.run)

    dump = tools.add_parser("dump", help="print batches and records (or index entries)")
    dump.add_argument("path", type=Path)
    dump.add_argument("--print-data", action="store_true", help="print every record")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.set_defaults(run=cli_dump.run)

    verify = tools.add_parser("verify", help="deep CRC and index check; exit 1 on damage")
    verify.add_argument("path", type=Path)
    verify.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=cli_verify.run)

    stat = tools.add_parser("stat", help="the segments table")
    stat.add_argument("path", type=Path)
    stat.add_argument("--json", action="store_true")
    stat.set_defaults(run=cli_stat.run)

    recover = tools.add_parser("recover", help="repair every damage verify reports")
    recover.add_argument("path", type=Path)
    recover.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    recover.add_argument("--json", action="store_true")
    recover.add_argument("--ack", action="store_true",
                         help="then acknowledge every recorded loss (a channel home only)")
    recover.set_defaults(run=cli_recover.run)
    return parser

"""`python -m channel_engine recover PATH`: repair every damage verify reports.

tools/recover.py does the repair (journals cut at their first bad record,
damaged files kept aside, strays moved aside, every batch CRC-checked), then the
channel is opened as its owner and replayed; this module prints what it cost:
events lost (by offsets), take commits that may come back, files moved aside;
with --ack it then acknowledges every loss in the channel's loss ledger. Needs
the channel closed (its owner lock refuses a second owner).
"""
from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from channel_engine.errors import (
    UsageError,
)
from channel_engine.log.partition_log import PartitionLog
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.tools.cli_paths import is_home, require_dir, supplied_config
from channel_engine.tools.recover import RepairReport, repair


def _acknowledge(channel: ChannelOwner) -> list[dict[str, Any]]:
    """Acknowledge every loss record; return the records acknowledged now."""
    before = channel.status()["losses"]["records"]
    channel.acknowledge_losses()
    after = {r["id"]: r for r in channel.status()["losses"]["records"]}
    return [after[r["id"]] for r in before
            if r["acknowledged_at_ms"] is None and r["id"] in after]


def _print_acknowledged(records: list[dict[str, Any]], out: TextIO) -> None:
    events = sum(r["events"] for r in records)
    print(f"acknowledged {len(records)} loss records ({events} events)", file=out)
    for r in records:
        print(f"  #{r['id']} partition {r['partition']} offsets {r['start']}..{r['end'] - 1}: "
              f"{r['events']} events; {r['cause']}; {r['path']} byte {r['position']} "
              f"({r['length']} bytes)", file=out)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Repair PATH and print what it cost; with --ack, acknowledge the losses."""
    require_dir(args.path)
    if is_home(args.path, args):
        acknowledged: list[dict[str, Any]] = []
        on_open = (lambda owner: acknowledged.extend(_acknowledge(owner))) if args.ack \
            else None
        repaired = repair(args.path, supplied_config(args), on_open)
        if args.json:
            extra = {"acknowledged": acknowledged} if args.ack else {}
            print(json.dumps({**repaired.recovery, "repair": repaired.to_dict(), **extra},
                             indent=2), file=out)
        else:
            _print_repair(repaired, out)
            if args.ack:
                _print_acknowledged(acknowledged, out)
        return 0
    if args.ack:
        raise UsageError(f"{args.path}: --ack needs a channel home (losses are the channel's)")
    with PartitionLog.open(args.path, force_recovery=True) as log:
        report = log.last_recovery
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        for action in report.actions:
            print(f"{action.kind}: {action.path}: byte {action.position}: {action.reason} "
                  f"({action.bytes_dropped} bytes dropped)", file=out)
        print(report.summary(), file=out)
    return 0


def _print_repair(report: RepairReport, out: TextIO) -> None:
    """What recover did, then what it cost: events lost, take commits back, files moved."""
    print(f"recover {report.home} (channel {report.channel!r})", file=out)
    for moved in report.moved_aside:
        print(f"moved aside: {moved['path']} -> {moved['kept_as']} ({moved['why']})", file=out)
    for cut in report.journals_cut:
        print(f"journal cut: {cut['path']} at byte {cut['position']}: {cut['reason']} "
              f"({cut['intact_after']} intact record(s) after it, {cut['unreadable_bytes']} "
              f"unreadable bytes{'' if cut['replayed'] else '; the checkpoint covers it'})",
              file=out)
    for rewritten in report.rewritten:
        print(f"rewritten: {rewritten['path']} ({rewritten['why']})", file=out)
    print(f"events lost: {report.events_lost}", file=out)
    for lost in report.lost_ranges:
        print(f"  partition {lost['partition']}: offsets [{lost['start']}, {lost['end']}) "
              f"{lost['path']} byte {lost['position']} ({lost['cause']})", file=out)
    for cut in report.cut_at:
        print(f"  partition {cut['partition']}: log cut at offset {cut['offset']} "
              f"({cut['path']} byte {cut['position']}); queued events beyond it counted above",
              file=out)
    puts = report.put_commits_cut
    print(f"events aborted: {report.events_aborted} (put commits cut from the journals: "
          f"{len(puts)}{_commit_list(puts)})", file=out)
    takes = report.take_commits_back
    print(f"take commits that may come back (at-least-once): {len(takes)}, "
          f"{report.events_may_come_back} events{_commit_list(takes)}", file=out)
    if report.unreadable_journal_bytes:
        print(f"  and {report.unreadable_journal_bytes} unreadable journal bytes after the cut "
              "(they may have held more commits)", file=out)
    if report.events_may_come_back_at_most:
        unknown = [j["path"] for j in report.journals_unknown] + [
            j["path"] for j in report.recovery.get("journals_unknown", [])]
        print(f"  journal content unknown ({', '.join(unknown)}): up to "
              f"{report.events_may_come_back_at_most} events may come back in all", file=out)
    if report.no_checkpoint:
        print("no valid checkpoint: every event still in the logs was queued again (takes "
              "committed before it come back, at least once)", file=out)
    print(f"files moved aside: {len(report.moved_aside)}", file=out)
    print(f"after recovery: {report.events_untaken} events untaken", file=out)
    if report.losses:  # the channel's loss ledger, where it keeps one
        print(f"loss ledger: {report.losses.get('events_lost', 0)} events lost, "
              f"{report.losses.get('unacknowledged_events', 0)} not yet acknowledged "
              f"({report.losses.get('unacknowledged', 0)} unacknowledged records; "
              "`recover --ack` acknowledges them)", file=out)
    for key, value in report.recovery.items():
        print(f"{key}: {value}", file=out)


def _commit_list(commits: list[dict[str, Any]]) -> str:
    shown = "; ".join(f"id {c['id']}: " + ", ".join(f"partition {p} [{a}, {b})"
                                                 for p, a, b in c["ranges"])
                      for c in commits[:20])
    more = f"; and {len(commits) - 20} more" if len(commits) > 20 else ""
    return f" ({shown}{more})" if commits else ""

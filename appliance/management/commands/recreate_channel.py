"""manage.py recreate_channel NAME --yes — make a channel whose files are missing (a volume
not mounted, a directory removed) again, empty where they are missing, recording the loss
in its loss ledger (appliance/channels.py, "Storage that vanished"). The appliance never
does this by itself: mount the volume back instead if you can. Without --yes it only says
what is missing. --next-offset P:N (repeatable) makes partition P, when its directory is
among the missing, go on at offset N at the least: above what a drain sent beyond the
channel's last checkpoint (a drain refuses a recreated partition whose offsets it had sent,
and its error names this option). Exits non-zero when nothing is missing or it cannot be
done."""
from __future__ import annotations

from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from appliance import channels
from appliance.manage_channels import Refused, parse_next_offsets, recreate_channel
from appliance.models import Channel


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--yes", action="store_true",
                            help="recreate it (the loss is recorded); without it, only tell")
        parser.add_argument("--next-offset", action="append", default=[], metavar="P:N",
                            type=_partition_offset,
                            help="partition P, made again, goes on at offset N at the least "
                                 "(repeat for more partitions)")

    def handle(self, *args: Any, **options: Any) -> None:
        row = Channel.objects.filter(name=options["name"]).first()
        if row is None:
            raise CommandError(f"no channel {options['name']!r}")
        try:
            if not options["yes"]:
                missing = channels.missing_storage(row)
                if not missing:
                    raise CommandError(f"channel {row.name!r} has all its files: nothing to "
                                       "recreate")
                self.stdout.write(f"channel {row.name!r}: missing {', '.join(missing)}\n"
                                  f"{channels.STORAGE_ADVICE} Run again with --yes to "
                                  "recreate it empty.")
                return
            made = recreate_channel(row, _next_offsets(options["next_offset"]) or None)
        except Refused as refused:
            raise CommandError("; ".join(" ".join(m) for m in refused.errors.values())) \
                from refused
        except channels.StorageMissing as exc:
            raise CommandError(str(exc)) from exc
        finally:
            channels.close_all()
        self.stdout.write(f"recreated channel {row.name!r} empty where its files were "
                          f"missing ({', '.join(map(str, made))}); the loss is recorded in "
                          "its loss ledger: acknowledge it once dealt with")


def _partition_offset(text: str) -> str:
    """One --next-offset P:N, checked; argparse names the option otherwise."""
    try:
        found = parse_next_offsets(text)
    except Refused as refused:
        raise ArgumentTypeError(refused.errors["next_offsets"][0]) from refused
    if len(found) != 1:
        raise ArgumentTypeError(f"{text!r}: give one PARTITION:OFFSET, e.g. 1:5000")
    return text


def _next_offsets(pairs: list[str]) -> dict[int, int]:
    """Every --next-offset as {P: N}; CommandError naming the option for a partition
    given twice (which one was meant cannot be told)."""
    try:
        return parse_next_offsets(" ".join(pairs))
    except Refused as refused:
        raise CommandError(f"--next-offset: {refused.errors['next_offsets'][0]}") from refused

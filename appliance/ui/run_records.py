"""The channel page's task runs as an operator reads them: each task by what it does, each
detail field labelled and its value in units (counts, durations, sizes, times), and runs
that found nothing to do folded together, counted, so the runs that did something stand out.

A run found nothing to do when its outcome is "nothing due" (a checkpoint made meanwhile;
the flusher, exporter and Kafka sink record none such), or it is a retention check that
deleted, dropped and unlinked nothing: retention runs at every interval and records "ok"
either way (appliance/tasks.py), so without this the table would be mostly idle checks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from appliance.models import TaskRun
from appliance.templatetags.weir_ui import age, duration, ms_time, num, size

TASKS = {"weir.flush_channel": "Flush", "weir.checkpoint_channel": "Checkpoint",
         "weir.retention_channel": "Retention check", "weir.export_channel": "Export",
         "weir.kafka_sink_channel": "Kafka sink"}
RETENTION_COUNTS = ("segments_deleted", "events_dropped", "files_unlinked")


def _run_number(value: Any) -> str:
    return f"#{value}"


def _yes_no(value: Any) -> str:
    return "yes" if value else "no"


# detail key -> (label, how its value reads)
FIELDS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "flushed": ("Flushed", _yes_no),
    "events": ("Events", num),
    "sequence": ("Checkpoint", _run_number),
    "written_at_ms": ("Written", ms_time),
    "duration_ms": ("Writing took", duration),
    "lock_held_ms": ("Channel held", duration),
    "backup": ("Backup copy", str),
    "segments_deleted": ("Segments deleted", num),
    "journals_removed": ("Journals removed", num),
    "events_dropped": ("Events dropped", num),
    "files_unlinked": ("Files deleted", num),
    "checkpoint_age_ms": ("Last checkpoint", lambda ms: f"{age(ms)} ago"),
    "busy": ("Busy", str),
    "export_run": ("Export run", _run_number),
    "rows": ("Rows", num),
    "bytes": ("Written", size),
    "kafka_run": ("Kafka run", _run_number),
    "transactions": ("Kafka transactions", num),
}


@dataclass(frozen=True)
class RunLine:
    """One run: the record, what its task is called, its detail as (label, value) pairs."""

    run: TaskRun
    task: str
    fields: list[tuple[str, str]]


@dataclass
class RunGroup:
    """Runs shown together: one that did something (or failed), or idle ones folded."""

    idle: bool
    lines: list[RunLine] = field(default_factory=list)

    @property
    def newest(self) -> datetime:
        """When its newest run started."""
        return self.lines[0].run.started_at

    @property
    def oldest(self) -> datetime:
        """When its oldest run started."""
        return self.lines[-1].run.started_at

    @property
    def tasks(self) -> list[str]:
        """The tasks of its runs, each once, in order of appearance."""
        return list(dict.fromkeys(line.task for line in self.lines))


def idle(run: TaskRun) -> bool:
    """True when the run found nothing to do (module doc)."""
    if run.outcome == TaskRun.NOTHING_DUE:
        return True
    return (run.outcome == TaskRun.OK and run.task == "weir.retention_channel"
            and not any(run.detail.get(key) for key in RETENTION_COUNTS))


def fields(detail: dict[str, Any]) -> list[tuple[str, str]]:
    """A run's detail as labelled values (an unknown key: its words, its value as text)."""
    shown = []
    for key, value in detail.items():
        label, show = FIELDS.get(key, (key.replace("_", " ").capitalize(), str))
        shown.append((label, "—" if value is None else show(value)))
    return shown


def line(run: TaskRun) -> RunLine:
    """How one run is shown."""
    return RunLine(run, TASKS.get(run.task, run.task), fields(run.detail or {}))


def groups(runs: Iterable[TaskRun]) -> list[RunGroup]:
    """The runs (newest first) with each stretch of idle runs folded into one group."""
    result: list[RunGroup] = []
    for run in runs:
        quiet = idle(run)
        if not (quiet and result and result[-1].idle):
            result.append(RunGroup(quiet))
        result[-1].lines.append(line(run))
    return result


def recent(runs: Iterable[TaskRun], limit: int) -> list[RunGroup]:
    """groups() of the runs (newest first) up to the limit-th run that did something; the
    idle runs between them never count against the limit."""
    shown: list[RunGroup] = []
    busy = 0
    for group in groups(runs):
        busy += 0 if group.idle else len(group.lines)
        if busy > limit:
            break
        shown.append(group)
    return shown

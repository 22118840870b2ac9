"""The channel page's task runs as an operator reads them (appliance/ui/run_records.py):
tasks by what they do, detail fields labelled with units, and each stretch of runs that
found nothing to do folded into one counted group that does not count against the limit."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from appliance.models import TaskRun
from appliance.ui import run_records

T0 = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)


def run(task: str, outcome: str, minutes_ago: int, **detail: object) -> TaskRun:
    return TaskRun(task=f"weir.{task}", channel="orders", outcome=outcome, duration_ms=1.5,
                   started_at=T0 - timedelta(minutes=minutes_ago), detail=detail)


def test_it_names_tasks_and_labels_fields_with_units() -> None:
    checkpoint = run_records.line(run(
        "checkpoint_channel", "ok", 0, sequence=12, written_at_ms=0, duration_ms=3.24,
        lock_held_ms=0.2, backup="off", segments_deleted=0, journals_removed=2))
    assert checkpoint.task == "Checkpoint"
    assert checkpoint.fields == [("Checkpoint", "#12"), ("Written", "1970-01-01 00:00:00 UTC"),
                                 ("Writing took", "3.2 ms"), ("Channel held", "0.2 ms"),
                                 ("Backup copy", "off"), ("Segments deleted", "0"),
                                 ("Journals removed", "2")]
    export = run_records.line(run("export_channel", "ok", 0, export_run=7, rows=1_234_567,
                                  bytes=3 << 20, new_field=None))
    assert export.task == "Export"
    assert export.fields == [("Export run", "#7"), ("Rows", "1,234,567"),
                             ("Written", "3.0 MiB"), ("New field", "—")]
    assert run_records.line(run("flush_channel", "ok", 0, flushed=True)).fields == \
        [("Flushed", "yes")]


def test_it_folds_each_stretch_of_idle_runs_into_one_group() -> None:
    runs = [run("checkpoint_channel", "ok", 0, sequence=3),
            run("checkpoint_channel", "nothing due", 1, checkpoint_age_ms=4000),
            run("retention_channel", "ok", 2, segments_deleted=0, events_dropped=0,
                files_unlinked=0),
            run("checkpoint_channel", "nothing due", 3),
            run("retention_channel", "failed", 4),
            run("retention_channel", "ok", 5, segments_deleted=2, events_dropped=0,
                files_unlinked=4),
            run("checkpoint_channel", "nothing due", 6)]
    groups = run_records.groups(runs)
    assert [(g.idle, len(g.lines)) for g in groups] == \
        [(False, 1), (True, 3), (False, 1), (False, 1), (True, 1)]
    folded = groups[1]
    assert folded.tasks == ["Checkpoint", "Retention check"]
    assert (folded.newest, folded.oldest) == (T0 - timedelta(minutes=1),
                                              T0 - timedelta(minutes=3))
    assert folded.lines[0].fields == [("Last checkpoint", "4.0 s ago")]


def test_idle_runs_do_not_count_against_the_limit() -> None:
    runs = [run("checkpoint_channel", "nothing due", n) for n in range(50)]
    runs[10:10] = [run("checkpoint_channel", "ok", 10)]
    runs += [run("checkpoint_channel", "ok", 60 + n) for n in range(5)]
    shown = run_records.recent(runs, limit=3)
    assert [(g.idle, len(g.lines)) for g in shown] == \
        [(True, 10), (False, 1), (True, 40), (False, 1), (False, 1)]

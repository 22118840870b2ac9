"""How many rows an export's Spark write has handed to its file writers so far: live, for
the progress lines ("export orders: 120,000 of 300,000 rows written (40%)", exporter.py).

Why not Spark's own counts: it counts a write's rows (its write stats) and a task's input
records when the task ends, so a one-task export would say 0% until it is done, and a
count of finished tasks says nothing of the running ones. What Spark does count as rows
go is the SQL metric "number of output rows" of the write's scan: executors send it
with their heartbeats (spark.executor.heartbeatInterval: the job sets HEARTBEAT) and the
driver's SQL status store sums it. That counts rows written only if each row is written
as it is read. Spark's planned write first sorts a task's rows by their output folder
(reading them all, then writing them all), so the export's write runs unplanned
(write_conf), with a few files of a task open at once instead of the sort (the export's
max_open_files: file_formats.MAX_OPEN_FILES); a task with more time buckets than that
sorts the rest, as Spark always did, and keeps one file per bucket (output_layout.py
checks it). Rows are counted when a writer takes them: the format may still buffer them
(a Parquet row group) until the file closes. With max_open_files 1 every task sorts
first: its rows count only once the sort hands them on.

The status store is Spark's internal API (py4j; no public one has the metric): should a
Spark version change it, rows_written answers None and the progress line says only that
the write goes on, never failing the export.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# How often executors send their metrics (Spark's default is 10 s): the progress's pace
HEARTBEAT = "1s"
_ROWS = "number of output rows"
_COUNT = re.compile(r"[0-9][0-9,]*")


def write_conf(max_open_files: int) -> dict[str, str]:
    """The Spark SQL settings of an export's write: unplanned, so that rows are written as
    they are read, and never more than `max_open_files` files of a task open at once.
    Spark keeps up to maxConcurrentOutputFileWriters writers open; past them it sorts the
    task's other rows and writes them one file at a time, while the concurrent writers it
    has not reached in that order stay open: one more than the setting. 0 turns the
    concurrent writers off (a sort first, one file open)."""
    return {"spark.sql.optimizer.plannedWrite.enabled": "false",
            "spark.sql.maxConcurrentOutputFileWriters": str(max_open_files - 1)}


def rows_written(spark: Any) -> int | None:
    """Rows the running SQL execution of `spark` (the newest, if several) has handed
    to its writers, as the executors' last heartbeats tell; None when none runs or the
    status store cannot be read."""
    try:
        store = spark._jsparkSession.sharedState().statusStore()
        running = [e for e in _items(store.executionsList()) if e.completionTime().isEmpty()]
        if not running:
            return None
        newest = max(running, key=lambda e: e.executionId())
        rows = {m.accumulatorId() for m in _items(newest.metrics()) if m.name() == _ROWS}
        values = store.executionMetrics(newest.executionId())
        counts = [int(pair._2().replace(",", "")) for pair in _items(values)
                  if pair._1() in rows and _COUNT.fullmatch(pair._2())]
        return max(counts, default=0)
    except Exception:  # noqa: BLE001 -- progress only: never fail the export for it
        return None


def _items(collection: Any) -> Iterator[Any]:
    """The items of a Scala collection (a map's as Tuple2s) seen through py4j."""
    iterator = collection.iterator()
    while iterator.hasNext():
        yield iterator.next()

"""What an export run reports: a PartitionReport per channel partition, and describe(),
a failure in one line. The run's report (Exporter.run) is JSON: the run's channel,
run_id, output, format, schema_version (the layout of its columns:
file_formats.py), outcome, error, spark_master, rows, bytes, duration_s, recorded
(its commit record is written), committed_runs (the runs whose commit records its step 1
read: each of them committed, whatever its own job reported), missing_files, and
"partitions", a PartitionReport each. The job prints it as its last line (export.py);
the appliance keeps it in an ExportRun.

The outcome (of the run and of each PartitionReport):

    outcome     when                                         the events of its ranges
    ----------  -------------------------------------------  -----------------------------
    running     until the run writes its commit record       not in the output
    committing  just before the commit record is written     in the output if the record
                                                              is (committed_runs tells)
    committed   the commit record is written (commit point)  in the output: exactly once
    ok          the run is done (files moved, take committed) in the output
    failed      the run stopped; with `recorded` true it     in the output iff recorded
                had passed its commit point

The job prints the report when it is "committing" and again when "committed" (its
commit lines, export.py), so that the appliance knows what a job killed before its last
line had done.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from channel_engine.errors import ChannelEngineError
from channel_engine.offset_ranges import Range


@dataclass
class PartitionReport:
    """What one run did for one channel partition."""

    partition: int
    ranges: list[Range] = field(default_factory=list)
    skipped: list[Range] = field(default_factory=list)  # already in the output
    files: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    # The partitions of a run are written by one Spark job and committed by one take, so
    # they share the run's outcome (the table above), error and duration.
    outcome: str = "running"
    error: str | None = None
    duration_s: float = 0.0


def describe(exc: BaseException) -> str:
    """A failure in one line for the report: "Type: message"; a Java exception raised
    through py4j as its class and message and those of its causes (HDFS's own words:
    "Permission denied: user=…", "could only be written to 0 of the 1 minReplication
    nodes…"), without the Java stack trace py4j puts in its message. An engine error is
    its message alone: a sentence naming the channel, file and values, as the Kafka sink
    tells it (a class name means nothing to an operator)."""
    if isinstance(exc, ChannelEngineError):
        return str(exc)
    java = getattr(exc, "java_exception", None)
    if java is None:
        return f"{type(exc).__name__}: {exc}"
    try:
        causes: list[str] = []
        while java is not None and len(causes) < 8:
            line = str(java.toString()).strip().splitlines()
            if line and line[0] not in causes:
                causes.append(line[0])
            java = java.getCause()
    except Exception:  # noqa: BLE001 -- the JVM is gone: the message is all there is
        return f"{type(exc).__name__}: {' '.join(str(exc).strip().splitlines()[:2])}"
    return f"{type(exc).__name__}: {'; caused by '.join(causes)}"

"""The export job: drain a channel into a Hadoop filesystem, exactly once.

    spark-submit channel_engine/spark/export.py --home /data/orders/checkpoint \\
        --output hdfs://namenode:8020/weir [--format parquet|json|avro] \\
        [--path %Y/%m/%d/%H] [--roll-rows 1000000] [--roll-bytes 268435456] \\
        [--max-events 10000000] [--master local[*]|spark://…|yarn] [--read-url URL] \\
        [--schema-version 1|2] [--max-open-files N]
    (or: python -m channel_engine.spark.export …; manage.py export_channel NAME)

It prints a recovered line `{"recovered": {"run_id": …, "committed_runs": […]}}` once
step 1 has read the output's commit records (the runs they name committed, whatever
their jobs reported; printed before the records are compacted, which forgets their run
ids), progress lines ("export orders: 120,000 of 300,000 rows written (40%)":
write_progress.py), a commit
line `{"commit": …}` just before its commit point and another just after (the run's
report so far, outcome "committing", then "committed": export_report.py), then one JSON
report line on stdout: `{"report": …}`, or `{"report": null, "error": …, "run": …}` when
it failed (exit status 1; "run" holds what the failed run had reserved). A job killed
after its commit point has printed its "committed" line: the appliance records the run
as what it did (appliance/exports.py), and the next run finishes its moves; one killed
between its two commit lines is confirmed by the next job's recovered line.

Cluster settings: the master comes from --master (WEIR_SPARK_MASTER); Hadoop's from
HADOOP_CONF_DIR (core-site.xml, hdfs-site.xml), which spark-submit puts on the JVM's
classpath, so an --output without a scheme resolves against its fs.defaultFS. The job
ships channel_engine to the executors itself (package_zip); they need its dependencies.

Where the rest is written down, each beside the code that owns it:

    module              what
    ------------------  ---------------------------------------------------------------
    exporter.py         the protocol (steps 1-8, what a crash at each leaves), durability
    output_layout.py    the output layout under <output>/<channel>/, pieces, file names
    commit_records.py   the commit records (_weir/commits/*.json): format, recovery
    path_overlap.py     which export paths share folders (no two schema versions in one)
    ../channel_id.py    the channel's drain id (export.id in its home)
    file_formats.py     the formats (parquet, json, avro) and Spark's writer of each
    export_settings.py  a run's settings (the options above) and their limits
    export_report.py    the report line's report, and how a failure is described
    ../offset_ranges.py offset ranges [start, end): merged, subtracted
    export_lock.py      export.lock: one export of a channel at a time
    export_driver.py    a warm driver: a long-lived process running these jobs one at a
                        time on its SparkSession (driver_protocol.py: its socket protocol)
    write_progress.py   the rows written so far, for the progress lines

Two exports of one channel must not run at once: the job holds `export.lock` (flock) in
the channel's home from before Spark starts until it exits (export_lock.py), and refuses
to start while another process holds it: exit status 75 and the report line
`{"report": null, "error": "an export of channel 'orders' is already running …"}`, nothing
written. The kernel releases the lock of a killed job, so none is ever stale. (The
appliance also holds `export-run.lock` around its ExportRun row: appliance/exports.py.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from channel_engine.spark.export_report import describe
from channel_engine.spark.export_settings import ExportSettings
from channel_engine.spark.exporter import Exporter
from channel_engine.spark.file_formats import FORMATS, MAX_OPEN_FILES, SCHEMA_VERSIONS

# HDFS's client retries a NameNode that does not answer (a restart: an upgrade, a config
# change) for up to 10 x 2 s instead of failing the run at its first call; without it, a
# connection the restart cut answers EOFException once. To change it, set them as
# spark.hadoop.<key> (spark-defaults.conf, --conf): they win over these (and these over
# hdfs-site.xml).
HDFS_CLIENT_RETRY = {"dfs.client.retry.policy.enabled": "true",
                     "dfs.client.retry.policy.spec": "2000,10"}


def spark_session(master: str | None = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """A SparkSession for the export (UTC, no UI, executors' metrics every HEARTBEAT for the
    progress lines unless spark-defaults.conf says otherwise: write_progress.py), with
    channel_engine shipped to its executors. Without a master: spark-submit's --master when
    spark-submit started this process, else local[*]. Only a local master gets this
    interpreter for its workers and a loopback address: a cluster's executors reach the
    driver, and run the Python, of their own hosts (spark.driver.host, spark.pyspark.python
    in spark-defaults.conf). spark.pyspark.python is honoured here too: pyspark reads it
    only under spark-submit, and without it a `python -m` job's executors would run PATH's
    python3. `conf`: more Spark settings of the caller's (a warm driver's)."""
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not spark-submit
        master = "local[*]"
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        root = str(Path(__file__).resolve().parents[2])
        paths = os.environ.get("PYTHONPATH", "")
        if root not in paths.split(os.pathsep):  # local workers import channel_engine too
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, paths) if p)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("weir-export")
    if master is not None:
        builder = builder.master(master)
    from pyspark import SparkConf, SparkContext

    from channel_engine.spark.write_progress import HEARTBEAT

    # Start the JVM now to read what spark-defaults.conf sets (honoured below), with the
    # master and name the builder gives: spark-submit sets a cluster up from them (YARN's
    # Python archives), as getOrCreate's own start would.
    launch = SparkConf(loadDefaults=False).setAppName("weir-export")
    SparkContext._ensure_initialized(
        conf=launch.setMaster(master) if master is not None else launch)
    if not SparkConf().contains("spark.executor.heartbeatInterval"):
        builder = builder.config("spark.executor.heartbeatInterval", HEARTBEAT)
    builder = (builder.config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")  # it prints its own progress
             .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in HDFS_CLIENT_RETRY.items():  # before the first HDFS client is made
        if not spark.sparkContext.getConf().contains(f"spark.hadoop.{key}"):
            hadoop.set(key, value)
    python = spark.sparkContext.getConf().get("spark.pyspark.python", None)
    if python:  # before any Python function (the weir source) is made with it
        spark.sparkContext.pythonExec = python
    spark.sparkContext.addPyFile(package_zip())
    return spark


# How a job gets its SparkSession for a master: a fresh one stopped at the job's end (the
# job's own process), or a new session of a warm driver's (export_driver.py)
Sessions = Callable[[str | None], AbstractContextManager[Any]]


@contextmanager
def fresh_session(master: str | None) -> Iterator[Any]:
    """A SparkSession of this process's own (spark_session), stopped when the block ends."""
    spark = spark_session(master)
    try:
        yield spark
    finally:
        spark.stop()


def package_zip() -> str:
    """channel_engine's Python files zipped for SparkContext.addPyFile: executors on other
    hosts (spark://, yarn) then run the driver's version of Weir's code. They still need
    its dependencies installed (pyproject.toml: aiokafka, crc32c, cryptography, msgpack,
    pyarrow). The zip is named by its content in the temp dir, so every run of one
    version shares one file (written atomically) instead of leaving one behind each."""
    import hashlib
    import io
    import tempfile
    import zipfile

    package = Path(__file__).resolve().parents[1]
    sources = sorted(package.rglob("*.py"))
    content = io.BytesIO()
    with zipfile.ZipFile(content, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sources:
            # a fixed date: the same sources give the same bytes, so the same name
            info = zipfile.ZipInfo(source.relative_to(package.parent).as_posix(),
                                   (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, source.read_bytes())
    data = content.getvalue()
    path = Path(tempfile.gettempdir()) / \
        f"weir-channel-engine-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        handle, temp = tempfile.mkstemp(prefix=".weir-channel-engine-", dir=path.parent)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    return str(path)


def main(argv: list[str] | None = None, sessions: Sessions = fresh_session) -> int:
    """The spark-submit / python -m entry point; a warm driver (export_driver.py) runs it
    too, with its own `sessions`. Its exit status."""
    parser = argparse.ArgumentParser(description="Export a Weir channel exactly once.")
    parser.add_argument("--home", required=True, help="the channel's home (checkpoint_dir)")
    parser.add_argument("--output", required=True, help="base URI: hdfs://… or file://…")
    parser.add_argument("--format", default="parquet", choices=sorted(FORMATS))
    parser.add_argument("--path", default="%Y/%m/%d/%H", help="time path (Flume escapes)")
    parser.add_argument("--roll-rows", type=int, default=1_000_000,
                        help="the most events in one file")
    parser.add_argument("--roll-bytes", type=int, default=256 << 20,
                        help="the most bytes of events (as stored in the log) in one file")
    parser.add_argument("--progress-every", type=float, default=2.0, metavar="SECONDS",
                        help="a progress line this often while Spark writes")
    parser.add_argument("--max-events", type=int, default=10_000_000)
    parser.add_argument("--subscription", default="default",
                        help="the subscription to drain, made at earliest when missing "
                             "(default: default)")
    parser.add_argument("--master", default=os.environ.get("WEIR_SPARK_MASTER"),
                        help="local[*], spark://host:7077, yarn (default: WEIR_SPARK_MASTER, "
                             "else spark-submit's --master, else local[*])")
    parser.add_argument("--schema-version", type=int, choices=sorted(SCHEMA_VERSIONS),
                        help="the columns' layout: 1 bytes (Weir's before the versions), 2 "
                             "readable (default: the version of the files in the folders of "
                             "--path, else of the output's newest commit record, else 2; "
                             "another version than those folders hold is refused)")
    parser.add_argument("--max-open-files", type=int,
                        help="the most files one Spark task holds open at once (default: "
                             + ", ".join(f"{n} for {f}" for f, n in MAX_OPEN_FILES.items())
                             + ")")
    parser.add_argument("--read-url", help="executors read over this appliance URL (token "
                                           "in WEIR_EXPORT_READ_TOKEN) instead of from files")
    args = parser.parse_args(argv)
    try:
        settings = ExportSettings(args.home, args.output, args.format, args.path,
                                  args.roll_rows, args.max_events, args.read_url,
                                  os.environ.get("WEIR_EXPORT_READ_TOKEN"), args.roll_bytes,
                                  args.progress_every, args.subscription,
                                  args.schema_version, args.max_open_files)
    except ValueError as exc:
        parser.error(str(exc))
    if not (Path(args.home) / "channel.json").is_file():
        parser.error(f"--home: no channel.json in {args.home}")
    from channel_engine.errors import ExportRunningError
    from channel_engine.spark.export_lock import EXIT_BUSY, hold

    try:
        name = json.loads((Path(args.home) / "channel.json").read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None  # the run itself reports a bad channel.json
    try:
        with hold(args.home, name):  # for the whole run, before Spark starts
            return _export(settings, args.master, sessions)
    except ExportRunningError as exc:
        print(json.dumps({"report": None, "error": str(exc)}), flush=True)
        return EXIT_BUSY


def _export(settings: ExportSettings, master: str | None, sessions: Sessions) -> int:
    """Run the export; print its report line: {"report": …} or, when it failed,
    {"report": null, "error": …, "run": what the failed run had reserved, or null}."""
    exporter = None
    with sessions(master) as spark:
        try:
            exporter = Exporter(spark, settings,
                                progress=lambda line: print(line, flush=True),
                                on_commit=lambda run: print(json.dumps({"commit": run}),
                                                            flush=True),
                                on_recover=lambda found: print(json.dumps(
                                    {"recovered": found}), flush=True))
            report = exporter.run()
        except Exception as exc:  # noqa: BLE001 -- the report says what failed, for the appliance
            failed = getattr(exporter, "report", None)
            print(json.dumps({"report": None, "error": describe(exc),
                              "run": failed}), flush=True)
            return 1
    print(json.dumps({"report": report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

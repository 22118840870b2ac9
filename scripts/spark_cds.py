"""A class-data-sharing archive (the JDK's AppCDS) of the classes a Weir export loads, so
that each short-lived Spark JVM of a run starts from it instead of parsing and verifying
Spark's ~10,000 classes again: an export run's driver used about 9 s of CPU with it and
21 s without on this project's 2-core machine (November 2026).

    python scripts/spark_cds.py [DIR]   # prints the archive's path (made when missing)

The archive is made once per Java build and pyspark version (its name holds both) by
running the export job itself (parquet, json and avro, in one JVM, with
-XX:ArchiveClassesAtExit) on a small channel, and kept in DIR (default var/jvm/cds, a
gitignored cache). A JVM uses it with

    SPARK_SUBMIT_OPTS="-XX:SharedArchiveFile=<path> -Xlog:cds*=off"

which every spark-submit (and so every pyspark driver) adds to its java command. A JVM
whose classpath or Java build does not match the archive runs as without it (the JDK
checks; -Xlog:cds*=off keeps that check's warning out of the job's output). Used by
scripts/test.sh (common.sh's use_spark_cds) for every Spark JVM of the test run.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "var" / "jvm" / "cds"


def archive_name() -> str:
    """spark-<pyspark version>-<hash of `java -version`>.jsa: one per Java build."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    build = hashlib.sha256(java.stderr.encode()).hexdigest()[:12]
    return f"spark-{pyspark.__version__}-{build}.jsa"


def make_archive(target: Path) -> None:
    """Run the export job in one JVM that writes its loaded classes to `target` at exit."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    # -Xlog: the JDK lists each class it leaves out (signed jars): noise, not failure
    os.environ["SPARK_SUBMIT_OPTS"] = f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(ROOT))
    from pyspark import SparkContext

    from channel_engine import Channel, ChannelConfig
    from channel_engine.spark import export

    with tempfile.TemporaryDirectory() as scratch:
        for file_format in ("parquet", "json", "avro"):
            config = ChannelConfig(f"cds-{file_format}", [f"{scratch}/{file_format}/data"],
                                   f"{scratch}/{file_format}/home", partitions=2,
                                   minimum_required_space=0)
            with Channel.open(config) as channel, channel.put() as tx:
                for i in range(100):
                    tx.put(f"event-{i}".encode(), key=b"k", headers={"h": b"v"})
            status = export.main(["--home", str(config.home), "--output",
                                  Path(scratch, "out").as_uri(), "--format", file_format,
                                  "--master", "local[2]"])
            if status != 0:
                raise SystemExit(f"spark_cds: the {file_format} export failed ({status})")
        gateway = SparkContext._gateway
        if gateway is None or gateway.proc is None:
            raise SystemExit("spark_cds: no Spark JVM of this process to archive")
        gateway.proc.stdin.close()  # the JVM exits at EOF, writing the archive first
        gateway.proc.wait(timeout=300)
    if not partial.exists():
        raise SystemExit(f"spark_cds: the JVM wrote no archive at {partial}")
    partial.replace(target)  # whole or absent for a concurrent reader


def main(argv: list[str]) -> int:
    """Print the archive's path, making it first when it is missing."""
    directory = Path(argv[0]) if argv else DEFAULT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / archive_name()
    if not target.exists():
        print(f"spark_cds: making {target} (once per Java build and pyspark version)",
              file=sys.stderr)
        make_archive(target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

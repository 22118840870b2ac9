"""Write the golden export files (tests/spark/golden/export-files/v<version>.<format>): one
file of each schema version (channel_engine/spark/file_formats.py) in each format, as the
export's own writer writes them, for file_schema.py's test. Run once with local Spark:

    .venv/bin/python tests/spark/golden/make_export_files.py
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from channel_engine.spark.file_formats import SESSION_CONF, columns, writer
from channel_engine.spark.source import SCHEMA

OUT = Path(__file__).resolve().parent / "export-files"
EVENTS = [("orders", 0, 0, 1795788300123, b"k", {"h": b"v"}, b"hello"),
          ("orders", 0, 1, 1795788300124, None, {}, b"\xff\xfe not UTF-8")]


def main() -> None:
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    frame = spark.createDataFrame(EVENTS, SCHEMA).selectExpr(
        "*", "0 AS _p", "0 AS _chunk", "'b' AS _bucket")
    OUT.mkdir(exist_ok=True)
    for version in (1, 2):
        for file_format in ("parquet", "avro", "json"):
            temp = tempfile.mkdtemp()
            writer(columns(frame, version).coalesce(1), file_format, version) \
                .mode("overwrite").save(temp)
            [part] = [p for p in Path(temp).rglob("part-*") if not p.name.endswith(".crc")]
            shutil.copyfile(part, OUT / f"v{version}.{file_format}")
            shutil.rmtree(temp)
    spark.stop()


if __name__ == "__main__":
    main()

"""The file formats of the export's output and the Spark writer of each.

All three are Spark's own writers (writer()). Avro is the class the `avro` short name
resolves to for writes, org.apache.spark.sql.avro.AvroFileFormat, named in full: Spark 4
ships it inside spark-sql, so neither the job nor a spark-submit of it needs the
spark-avro jar (`--packages org.apache.spark:spark-avro_2.13:<Spark version>` only adds
the short name and from_avro/to_avro, for other jobs). Avro files carry AVRO_SCHEMA
(record weir.Event: timestamp a timestamp-millis long, key a union with null, headers a
map of bytes), deflate-compressed, as Weir's earlier fastavro writer wrote them.

The columns the writer partitions by (_p, _chunk, _bucket) place each event in its file:
output_layout.py. This module imports no PySpark: the appliance reads FORMATS.
"""
from __future__ import annotations

import json
from typing import Any

# The Spark data source of each format. Avro is Spark's own writer, by its class name:
# since Spark 4.0 it lives in spark-sql (pyspark's jars), and the short name "avro" only
# resolves to it when the spark-avro jar (its data source registration) is on the
# classpath too. Spark writes with the "avro" short name through this same class.
FORMATS = {"parquet": "parquet", "json": "json",
           "avro": "org.apache.spark.sql.avro.AvroFileFormat"}
# Avro files carry this schema (the writer's avroSchema option; without it Spark would
# name the record "topLevelRecord", make every field a union with null and drop the
# timestamp's logical type) and deflate, the codec every Avro reader must support.
AVRO_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": "channel", "type": "string"}, {"name": "partition", "type": "int"},
               {"name": "offset", "type": "long"},
               {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "key", "type": ["null", "bytes"]},
               {"name": "headers", "type": {"type": "map", "values": "bytes"}},
               {"name": "body", "type": "bytes"}]}
WRITER_OPTIONS: dict[str, dict[str, str]] = {
    "avro": {"avroSchema": json.dumps(AVRO_SCHEMA), "compression": "deflate"}}


def writer(frame: Any, file_format: str) -> Any:
    """The export's DataFrameWriter for `file_format`: a file per (_p, _chunk, _bucket)."""
    out = (frame.write.partitionBy("_p", "_chunk", "_bucket")
           # one file per piece and bucket, whatever spark-defaults.conf says
           .option("maxRecordsPerFile", 0).format(FORMATS[file_format]))
    return out.options(**WRITER_OPTIONS.get(file_format, {}))

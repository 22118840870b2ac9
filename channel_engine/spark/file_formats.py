"""The file formats of the export's output, the columns written in each schema version,
and the Spark writer of each format.

Two layouts of the columns exist, told apart by the export's schema version (a setting
of the export, written in each commit record: commit_records.py). An output folder
holds one of them only: a reader of a folder never meets two schemas (the appliance
refuses a change of version whose export path already holds committed files).

Version 2 (readable; the default of a new export). Text is text, as Flume's HDFS sink
(DataStream) and Kafka Connect's StringConverter write it: a body, key or header value
that is valid UTF-8 is a string column, and only one that is not (an image, a protobuf)
keeps its raw bytes, in a `*_bytes` column, the string column then null. So each
event's bytes are in exactly one of the two, and a reader of text never decodes base64:

    column         Spark type          Parquet                 Avro                   JSON
    -------------  ------------------  ----------------------  ---------------------  -------
    channel        string              BINARY (STRING)         string                 string
    partition      int                 INT32                   int                    number
    offset         long                INT64                   long                   number
    timestamp      timestamp           INT64 TIMESTAMP(MILLIS, long timestamp-millis  ISO 8601
                                       adjusted to UTC)                               (below)
    key            string or null      BINARY (STRING)         ["null", "string"]     string
    key_bytes      binary or null      BINARY                  ["null", "bytes"]      base64
    headers        map<string,string>  MAP of STRING           map of ["null",        object
                                                               "string"]
    headers_bytes  map<string,binary>  MAP of BINARY           ["null", map of        object of
                   or null                                     bytes]                 base64
    body           string or null      BINARY (STRING)         ["null", "string"]     string
    body_bytes     binary or null      BINARY                  ["null", "bytes"]      base64

key: the event's key when it has one and it is UTF-8 (key_bytes when not; both null
without a key). headers: the header values that are UTF-8 (a null value stays null);
headers_bytes: the others, null when there are none. body: the body when UTF-8 (an
empty body is ""), body_bytes when not. timestamp: the event time (milliseconds since
the epoch, as stored), in UTC; in JSON "2026-11-27T14:05:00.123Z". JSON Lines leave out
null fields (Spark's ignoreNullFields): a text event has no *_bytes fields.

Version 1 (bytes; what Weir wrote before the versions, kept for the exports that already
hold it). The "weir" source's columns as they are (source.py's SCHEMA): every key,
header value and body as bytes, the timestamp a number:

    column     Spark type          Parquet            Avro                        JSON
    ---------  ------------------  -----------------  --------------------------  ----------
    channel    string              BINARY (STRING)    string                      string
    partition  int                 INT32              int                         number
    offset     long                INT64              long                        number
    timestamp  long (ms, UTC)      INT64 (no logical  long timestamp-millis       number (ms)
                                   type)
    key        binary or null      BINARY             ["null", "bytes"]           base64
    headers    map<string,binary>  MAP of BINARY      map of bytes                object of
                                                                                  base64
    body       binary              BINARY             bytes                       base64

A null key is left out of a JSON line. A reader cannot tell text from base64 in a JSON
`body` of version 1 (text that happens to be valid base64 decodes to garbage): that is
why a folder never mixes the versions.

All three are Spark's own writers (writer()). Avro is the class the `avro` short name
resolves to for writes, org.apache.spark.sql.avro.AvroFileFormat, named in full: Spark 4
ships it inside spark-sql, so neither the job nor a spark-submit of it needs the
spark-avro jar (`--packages org.apache.spark:spark-avro_2.13:<Spark version>` only adds
the short name and from_avro/to_avro, for other jobs). Avro files carry the version's
schema (AVRO_SCHEMAS: record weir.Event, the columns above), deflate-compressed.

Open files. A Spark task writes its piece's events to one file per time bucket, each
writer open until its task is done with it: MAX_OPEN_FILES caps them per task (the
export's max_open_files setting; Parquet lowest, its row groups being the biggest
buffers). A task with more buckets than that sorts its remaining rows and writes those
one file at a time.

The columns the writer partitions by (_p, _chunk, _bucket) place each event in its file:
output_layout.py. This module imports no PySpark at its top: the appliance reads FORMATS.
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
# The export's schema versions (the module doc), for people; a new export writes LATEST
SCHEMA_VERSIONS = {1: "bytes: key, headers and body as bytes (base64 in JSON), the time "
                      "a number of milliseconds (Weir's layout before the versions)",
                   2: "readable: text as strings (raw bytes only where not UTF-8), the "
                      "time a timestamp"}
LATEST_SCHEMA = 2
# Avro files carry their version's schema (the writer's avroSchema option; without it Spark
# would name the record "topLevelRecord", make every field a union with null and drop the
# timestamp's logical type) and deflate, the codec every Avro reader must support.
AVRO_SCHEMA_V1 = {
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": "channel", "type": "string"}, {"name": "partition", "type": "int"},
               {"name": "offset", "type": "long"},
               {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "key", "type": ["null", "bytes"]},
               {"name": "headers", "type": {"type": "map", "values": "bytes"}},
               {"name": "body", "type": "bytes"}]}
AVRO_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": "channel", "type": "string"}, {"name": "partition", "type": "int"},
               {"name": "offset", "type": "long"},
               {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "key", "type": ["null", "string"]},
               {"name": "key_bytes", "type": ["null", "bytes"]},
               {"name": "headers", "type": {"type": "map", "values": ["null", "string"]}},
               {"name": "headers_bytes", "type": ["null", {"type": "map", "values": "bytes"}]},
               {"name": "body", "type": ["null", "string"]},
               {"name": "body_bytes", "type": ["null", "bytes"]}]}
# The most files of a format one Spark task holds open at once (the export's default
# max_open_files; write_progress.write_conf). Past it Spark sorts the task's remaining rows,
# where Flume's hdfs.maxOpenFiles closes the oldest file.
# An open writer's buffers live on the executor's heap, outside Spark's managed memory,
# until its file closes: a Parquet writer holds its whole row group (parquet.block.size,
# 128 MiB by default, scaled down only once the writers near 95% of the heap), an Avro
# writer one block (about 64 KiB, deflated as it fills), a JSON writer a stream buffer.
MAX_OPEN_FILES = {"parquet": 4, "json": 16, "avro": 16}
MAX_OPEN_FILES_LIMIT = 1024
# Spark SQL settings of the write: Parquet's timestamps as TIMESTAMP(MILLIS) (Spark's
# default is the legacy INT96, which most readers show as a number or refuse)
SESSION_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MILLIS"}
AVRO_SCHEMAS = {1: AVRO_SCHEMA_V1, 2: AVRO_SCHEMA}
# Each version's writer options, by format
WRITER_OPTIONS: dict[int, dict[str, dict[str, str]]] = {
    1: {"avro": {"avroSchema": json.dumps(AVRO_SCHEMA_V1), "compression": "deflate"},
        "json": {"ignoreNullFields": "true"}},
    2: {"avro": {"avroSchema": json.dumps(AVRO_SCHEMA), "compression": "deflate"},
        "json": {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX",
                 "ignoreNullFields": "true"}}}
# A binary column as text when it is UTF-8, and the raw bytes when it is not
_TEXT = "CASE WHEN is_valid_utf8(CAST({0} AS STRING)) THEN CAST({0} AS STRING) END"
_RAW = "CASE WHEN NOT is_valid_utf8(CAST({0} AS STRING)) THEN {0} END"
_TEXT_HEADERS = ("transform_values(map_filter(headers, (k, v) -> v IS NULL OR "
                 "is_valid_utf8(CAST(v AS STRING))), (k, v) -> CAST(v AS STRING))")
_RAW_HEADERS = "map_filter(headers, (k, v) -> NOT is_valid_utf8(CAST(v AS STRING)))"


def check_schema_version(version: int) -> int:
    """`version` when it is a schema version of the export; else a ValueError naming it."""
    if type(version) is not int or version not in SCHEMA_VERSIONS:
        raise ValueError(f"schema_version must be one of "
                         f"{', '.join(map(str, SCHEMA_VERSIONS))}, not {version!r}")
    return version


def source_columns(version: int) -> str:
    """The "weir" source's option columns that reads the events for schema `version`: its
    own columns for version 1, "readable" (text split from bytes as it reads) for 2."""
    return "events" if check_schema_version(version) == 1 else "readable"


def columns(frame: Any, version: int) -> Any:
    """The events of the "weir" source's `frame` (read with the option columns
    source_columns(version) says, or of the events schema) in the columns of schema
    `version` (the module doc), with any other column of `frame` (the placing columns)
    after them."""
    if check_schema_version(version) == 1:
        return frame  # the source's own columns are version 1's
    if "body_bytes" in frame.columns:  # split as read (source.py's READABLE_SCHEMA)
        from pyspark.sql import functions as F

        return frame.withColumn("timestamp", F.timestamp_millis("timestamp"))
    return readable(frame)


def readable(frame: Any) -> Any:
    """The events of a `frame` of the "weir" source's events schema in the columns
    written (the table above), split by Spark SQL, with any other column of `frame` (the
    placing columns) after them. The source's option columns=readable gives the same
    columns split as it reads, at a fraction of the cost (spark/arrow_decode.py)."""
    from pyspark.sql import functions as F

    placing = [c for c in frame.columns if c.startswith("_")]
    raw_headers = F.expr(_RAW_HEADERS)
    return frame.select(
        "channel", "partition", "offset", F.timestamp_millis("timestamp").alias("timestamp"),
        F.expr(_TEXT.format("key")).alias("key"), F.expr(_RAW.format("key")).alias("key_bytes"),
        F.expr(_TEXT_HEADERS).alias("headers"),
        F.when(F.size(raw_headers) > 0, raw_headers).alias("headers_bytes"),
        F.expr(_TEXT.format("body")).alias("body"),
        F.expr(_RAW.format("body")).alias("body_bytes"), *placing)


def writer(frame: Any, file_format: str, version: int = LATEST_SCHEMA) -> Any:
    """The export's DataFrameWriter for `file_format` in schema `version`: a file per
    (_p, _chunk, _bucket)."""
    out = (frame.write.partitionBy("_p", "_chunk", "_bucket")
           # one file per piece and bucket, whatever spark-defaults.conf says
           .option("maxRecordsPerFile", 0).format(FORMATS[file_format]))
    return out.options(**WRITER_OPTIONS[version].get(file_format, {}))

"""The schema version (file_formats.py: 1 bytes, 2 readable) of a committed export file,
read from the file itself.

Why: commit records name their files' version (commit_records.py) only since the
versions; Weir wrote version 2's columns already from the readable exports (3c37d9c) on,
with records of the very same shape as version 1's (same keys, same file names). So the
version of a record without one is told by one of its files:

    format   what is read                                   version 2 when       else
    -------  ---------------------------------------------  -------------------  ----
    parquet  the footer: the file's last 8 bytes are the    Spark's row schema   1
             footer's length (int32, little-endian) and     (footer key-value
             "PAR1"; in it, Spark's schema JSON, the value  org.apache.spark.sql
             of key org.apache.spark.sql.parquet.row.       .parquet.row.metadata)
             metadata (Thrift compact: field 2 header       names a column
             0x18, a varint length, the bytes)              body_bytes
    avro     the header: "Obj" 0x01, then the metadata map  avro.schema names a  1
             (blocks of a zigzag varint count, each entry   field body_bytes
             a string key and a bytes value, ended by 0)
    json     the first line (one event)                     its timestamp is a   1
                                                            string (ISO 8601)

body_bytes is version 2's only (a column even when null: Parquet and Avro keep every
column of the schema); JSON Lines leave out null fields, so there the timestamp tells (a
number of milliseconds in version 1). A file none of these reads (damaged, cut short,
another writer's, an unknown suffix) says nothing: None, and the caller keeps version 1,
what it assumed before.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable

# read(offset, length): bytes of the file from offset (fewer at its end)
Reader = Callable[[int, int], bytes]
HEAD_BYTES = 64 * 1024  # an Avro header or a JSON line of one event fits, as Weir writes them
PARQUET_MAGIC = b"PAR1"
PARQUET_TAIL = struct.Struct("<i4s")  # footer length, magic
assert PARQUET_TAIL.size == 8
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
THRIFT_BINARY_FIELD_2 = 0x18  # compact protocol: field id delta 1, type binary
AVRO_MAGIC = b"Obj\x01"
V2_ONLY_COLUMN = "body_bytes"


def schema_version_of(name: str, size: int, read: Reader) -> int | None:
    """The schema version of export file `name` (`size` bytes, read through `read`), or
    None when the file does not say (the module doc)."""
    try:
        if name.endswith(".parquet"):
            columns = _parquet_columns(size, read)
        elif name.endswith(".avro"):
            columns = _avro_columns(read(0, HEAD_BYTES))
        elif name.endswith(".json"):
            return _json_version(read(0, HEAD_BYTES))
        else:
            return None
    except (ValueError, IndexError, KeyError, TypeError, struct.error):
        return None  # damaged or not Weir's: it says nothing
    return None if columns is None else (2 if V2_ONLY_COLUMN in columns else 1)


def _parquet_columns(size: int, read: Reader) -> list[str] | None:
    """The column names of Spark's schema in a Parquet footer, or None."""
    if size < 12:
        return None
    length, magic = PARQUET_TAIL.unpack(read(size - 8, 8))
    if magic != PARQUET_MAGIC or not 0 < length <= size - 12:
        return None
    footer = read(size - 8 - length, length)
    at = footer.find(SPARK_SCHEMA_KEY)
    if at < 0 or footer[at + len(SPARK_SCHEMA_KEY)] != THRIFT_BINARY_FIELD_2:
        return None
    value_length, start = _varint(footer, at + len(SPARK_SCHEMA_KEY) + 1)
    schema = json.loads(footer[start:start + value_length])
    return [str(field["name"]) for field in schema["fields"]]


def _avro_columns(head: bytes) -> list[str] | None:
    """The field names of the avro.schema in an Avro container file's header, or None."""
    if not head.startswith(AVRO_MAGIC):
        return None
    at = len(AVRO_MAGIC)
    while True:
        count, at = _zigzag(head, at)
        if count == 0:
            return None
        if count < 0:  # a block with its byte size: skip the size
            count = -count
            _, at = _zigzag(head, at)
        for _ in range(count):
            key, at = _avro_bytes(head, at)
            value, at = _avro_bytes(head, at)
            if key == b"avro.schema":
                return [str(field["name"]) for field in json.loads(value)["fields"]]


def _json_version(head: bytes) -> int | None:
    """The version of a JSON Lines file by its first event's timestamp, or None."""
    line = head.split(b"\n", 1)[0]
    if not line.strip() or len(line) == len(head) == HEAD_BYTES:
        return None  # empty, or a first line longer than was read
    timestamp = json.loads(line)["timestamp"]
    if isinstance(timestamp, str):
        return 2
    return 1 if isinstance(timestamp, int) else None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 varint at `at` (Thrift compact, Avro): (value, next position)."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _zigzag(data: bytes, at: int) -> tuple[int, int]:
    """An Avro long (zigzag varint) at `at`: (value, next position)."""
    raw, at = _varint(data, at)
    return (raw >> 1) ^ -(raw & 1), at


def _avro_bytes(data: bytes, at: int) -> tuple[bytes, int]:
    """Avro bytes or string at `at` (a long length, then the bytes): (value, next)."""
    length, at = _zigzag(data, at)
    if length < 0 or at + length > len(data):
        raise ValueError("Avro header cut short")
    return data[at:at + length], at + length


def local_reader(path: str) -> tuple[int, Reader]:
    """(size, reader) of a local file, for schema_version_of."""
    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(length)

    return os.path.getsize(path), read


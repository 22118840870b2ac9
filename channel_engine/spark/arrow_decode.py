"""EventColumns: decoded records gathered column by column into the "weir" source's Arrow
RecordBatches, with no Python object per event.

Why: the source first built an Event per record (PartitionLog.read) and then transposed
the events into columns: 2.5-5 µs of Python per event on the benchmark machine, in a
worker that shares the CPUs with Spark's JVM. Taking record_batch.record_columns() lists
(aiokafka's compiled decoder fills them) straight into Arrow arrays costs about 1 µs.

The Arrow layout handed to Spark. Spark checks the first batch's schema against
to_arrow_schema(SCHEMA, timezone="UTC") and refuses any difference, so each column is built
with exactly that type:

    column     Arrow type               built from
    ---------  -----------------------  --------------------------------------------------
    channel    string                   the split's channel, repeated
    partition  int32                    the split's partition, repeated
    offset     int64                    record offsets
    timestamp  int64                    record timestamps (ms, CreateTime), not an Arrow
                                        timestamp type: the SQL type is long
    key        binary                   record keys; null where the record has none
    headers    map<string, binary>      int32 entry offsets (n + 1 of them) over
                                        flattened names and values: record i's entries
                                        are [ends[i], ends[i + 1]). A record's headers
                                        go through dict() first, as PartitionLog.read
                                        does: a repeated name keeps its last value
    body       binary                   record values; a null value reads as b"", as
                                        PartitionLog.read gives it

Not thread-safe: one per split, in the worker that reads it.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any

import pyarrow as pa

from channel_engine.log.record_batch import Headers


class EventColumns:
    """Records of one channel partition gathered until to_batch() turns them into one
    RecordBatch of `schema` (see the module doc)."""

    def __init__(self, channel: str, partition: int, schema: Any) -> None:
        self.channel = channel
        self.partition = partition
        self.schema = schema
        self._clear()

    def _clear(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Headers] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, offsets: list[int], timestamps: list[int], keys: list[bytes | None],
               values: list[bytes | None], headers: list[Headers]) -> None:
        """Add records given column by column (equal lengths, in offset order)."""
        self.offsets += offsets
        self.timestamps += timestamps
        self.keys += keys
        self.values += values
        self.headers += headers

    def to_batch(self) -> Any:
        """The gathered records as one RecordBatch; starts gathering afresh."""
        count = len(self.offsets)
        bodies = pa.array(self.values, pa.binary())
        if bodies.null_count:
            bodies = bodies.fill_null(b"")
        batch = pa.RecordBatch.from_arrays([
            pa.repeat(pa.scalar(self.channel, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.int64()),
            pa.array(self.keys, pa.binary()),
            _header_maps(self.headers),
            bodies,
        ], schema=self.schema)
        self._clear()
        return batch


def _header_maps(headers: list[Headers]) -> Any:
    """One map<string, binary> entry per record (see the module doc)."""
    if not any(headers):  # the common case: no record has headers, every map is empty
        ends = pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1)
        return pa.MapArray.from_arrays(ends, pa.array([], pa.string()), pa.array([], pa.binary()))
    maps = [dict(h) if h else {} for h in headers]
    names = [name for m in maps for name in m]
    values = [value for m in maps for value in m.values()]
    ends = pa.array(list(accumulate(map(len, maps), initial=0)), pa.int32())
    return pa.MapArray.from_arrays(ends, pa.array(names, pa.string()),
                                   pa.array(values, pa.binary()))

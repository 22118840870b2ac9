"""dfs.py against a real HDFS: what the exporter's durability rests on, observed on the
DataNodes themselves. A commit record is written with hsync before close, so each
DataNode of its block's pipeline has fsynced it (their FsyncCount metric, read from their
own /jmx, grows); a file that is only closed (as Spark's writers leave data files) is
not fsynced unless the DataNodes run with dfs.datanode.synconclose."""
from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from channel_engine.spark.dfs import Dfs


def activity(dfs: Dfs) -> tuple[int, int]:
    """(blocks written, fsyncs) summed over the DataNodes, each from its own /jmx."""
    written = synced = 0
    for node in dfs._fs.getDataNodeStats():  # noqa: SLF001 -- a DistributedFileSystem
        url = (f"http://{node.getIpAddr()}:{node.getInfoPort()}/jmx"
               "?qry=Hadoop:service=DataNode,name=DataNodeActivity-*")
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 -- 127.0.0.1
            for bean in json.load(answer)["beans"]:
                written += int(bean["BlocksWritten"])
                synced += int(bean["FsyncCount"])
    return written, synced


def fsyncs_of(dfs: Dfs, write: Callable[[], None]) -> int:
    """The DataNodes' fsyncs while `write` wrote one block (read once /jmx shows the
    block: it caches the metrics for their period, 10 s by default)."""
    written, synced = activity(dfs)
    write()
    deadline = time.monotonic() + 30
    while (now := activity(dfs))[0] == written:
        assert time.monotonic() < deadline, "the DataNodes' /jmx never showed the block"
        time.sleep(0.5)
    return now[1] - synced


@pytest.mark.hdfs
def test_it_hsyncs_a_written_file_on_its_datanodes_and_a_closed_one_is_not(
        spark: Any, hdfs_url: str) -> None:
    dfs = Dfs(spark, f"{hdfs_url}/{uuid.uuid4().hex}")
    assert dfs.base_uri.startswith("hdfs://")
    dfs.mkdirs(dfs.base_uri)

    def close_only() -> None:  # what Spark's writers do with a data file
        stream = dfs._fs.create(dfs._path(dfs.join("data.parquet")), False)  # noqa: SLF001
        stream.write(bytearray(b"x" * 1000))
        stream.close()

    # Nothing fsyncs a closed block (unless dfs.datanode.synconclose is on), so the
    # count below is write_bytes' own hsync.
    assert fsyncs_of(dfs, close_only) == 0, "the DataNodes fsync on close here"
    record = dfs.join("record.json")
    # fails when write_bytes only closes (or hflushes) the stream
    assert fsyncs_of(dfs, lambda: dfs.write_bytes(record, b'{"ranges": {}}')) >= 1
    assert dfs.read_bytes(record) == b'{"ranges": {}}'

"""The export job against a real HDFS (a MiniDFSCluster from scripts/hdfs.sh, or the
cluster at WEIR_TEST_HDFS_URL): the exporter writes through Hadoop's hdfs:// client
inside pyspark's JVM, and what it committed is read back over HDFS. Marked `hdfs`: run
with `-m hdfs` (about 2.5 min on a loaded 2-core machine, HDFS start-up included)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_export import (
    as_put,
    check_names,
    event,
    export,
    export_here,
    exported,
    make_channel,
    stored,
    untaken,
)

from channel_engine.spark.dfs import Dfs

pytestmark = pytest.mark.hdfs


def test_an_export_to_hdfs_holds_every_event_exactly_once_after_a_killed_run(
        tmp_path: Path, spark: Any, hdfs_url: str) -> None:
    config = make_channel(tmp_path, 600)
    output = f"{hdfs_url}/{tmp_path.name}"
    # A job killed after writing its files, before its commit record: nothing visible.
    code, _, log = export(config, output, "--roll-rows", "100", crash_at="written")
    assert code == -9, log
    assert exported(spark, output) == []
    report = export_here(spark, config, output, roll_rows=100)  # the rerun, on our JVM
    assert report["rows"] == 600 and report["outcome"] == "ok"
    rows = exported(spark, output)  # read back through HDFS by the tests' Spark
    assert rows == stored(config)  # every event, none twice
    assert as_put(rows) == sorted(event(i) for i in range(600))
    check_names(spark, output, 100)
    dfs = Dfs(spark, output)
    assert dfs.base_uri.startswith("hdfs://")
    assert dfs.list_files(dfs.join("orders", "_weir", "tmp")) == []
    assert untaken(config) == 0

"""The tests' SparkSession is where conftest.py says: a test on HDFS runs its Spark work on
the run's cluster, with executors in JVMs of their own; any other test on local[2]
(unless WEIR_TEST_SPARK_SESSION puts every test on one). A session of the other kind is
stopped before the next starts."""
from __future__ import annotations

from typing import Any

import pytest
from spark_sessions import session_kind


def executors(spark: Any) -> int:
    """How many executors the session has once a job ran (none in local mode: the driver
    runs its tasks)."""
    assert spark.sparkContext.parallelize(range(4), 2).count() == 4
    return int(spark.sparkContext._jsc.sc().getExecutorIds().size())  # noqa: SLF001


@pytest.mark.hdfs
def test_a_test_on_hdfs_runs_on_the_cluster_with_executors_of_their_own(
        spark: Any, hdfs_url: str, request: pytest.FixtureRequest) -> None:
    if session_kind(request.node) == "local":  # WEIR_TEST_SPARK_SESSION=local chose it
        assert spark.sparkContext.master.startswith("local") and executors(spark) == 0
        return
    assert spark.sparkContext.master == request.getfixturevalue("spark_master").url
    assert executors(spark), "no executor of its own"


def test_a_test_on_files_runs_on_local_mode_unless_told(
        spark: Any, request: pytest.FixtureRequest) -> None:
    if session_kind(request.node) == "cluster":  # WEIR_TEST_SPARK_SESSION=cluster chose it
        assert spark.sparkContext.master.startswith("spark://") and executors(spark)
        return
    assert spark.sparkContext.master == "local[2]" and executors(spark) == 0

"""The export job as a cluster runs it: started by spark-submit, reading Hadoop's settings
from HADOOP_CONF_DIR, and shipping channel_engine to executors that do not have it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from channel_engine import Channel, ChannelConfig
from channel_engine.spark.export import package_zip

ROOT = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
CORE_SITE = """<?xml version="1.0"?>
<configuration>
  <property><name>fs.defaultFS</name><value>{}</value></property>
</configuration>
"""


def make_channel(tmp_path: Path, events: int) -> ChannelConfig:
    config = ChannelConfig("orders", [str(tmp_path / "data")], str(tmp_path / "home"),
                           partitions=2, minimum_required_space=0)
    with Channel.open(config) as channel, channel.put() as tx:
        for i in range(events):
            tx.put(f"event-{i}".encode(), key=f"k{i % 5}".encode())
    return config


def report_of(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith('{"report"')]
    assert lines, stdout
    return dict(json.loads(lines[-1]))


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "WEIR_SPARK_MASTER", "HADOOP_CONF_DIR")}
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **extra}


def test_spark_submit_runs_the_export_with_its_own_master(tmp_path: Path) -> None:
    config = make_channel(tmp_path, 120)
    output = tmp_path / "out"
    done = subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         str(ROOT / "channel_engine" / "spark" / "export.py"), "--home", str(config.home),
         "--output", output.as_uri()],
        capture_output=True, text=True, env=clean_env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = report_of(done.stdout)["report"]
    assert isinstance(report, dict) and report["rows"] == 120
    files = [p for p in (output / "orders").rglob("*.parquet") if "_weir" not in p.parts]
    assert sum(pq.read_table(p).num_rows for p in files) == 120
    assert report["spark_master"] == "local[1]"  # spark-submit's, not the job's default
    with Channel.open(config) as channel:
        assert channel.status()["events_untaken"] == 0


def test_an_output_without_a_scheme_goes_to_hadoops_default_filesystem(
        tmp_path: Path) -> None:
    config = make_channel(tmp_path, 10)
    conf = tmp_path / "hadoop-conf"
    conf.mkdir()
    (conf / "core-site.xml").write_text(CORE_SITE.format("weirtestfs://namenode:8020"))
    done = subprocess.run(
        [sys.executable, "-m", "channel_engine.spark.export", "--home", str(config.home),
         "--output", "/weir", "--master", "local[1]"],
        capture_output=True, text=True, env=clean_env(HADOOP_CONF_DIR=str(conf)),
        timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    error = report_of(done.stdout)["error"]
    assert isinstance(error, str) and "weirtestfs" in error  # core-site.xml was read
    with Channel.open(config) as channel:
        assert channel.status()["events_untaken"] == 10  # nothing taken


def test_the_package_zip_alone_imports_the_data_source(tmp_path: Path) -> None:
    path = package_zip()
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {"channel_engine/__init__.py", "channel_engine/spark/source.py",
            "channel_engine/spark/arrow_decode.py"} <= names
    for layer in ("log", "queue", "owner", "tools"):  # the subpackages travel too
        assert f"channel_engine/{layer}/__init__.py" in names, layer
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "import channel_engine.spark.source as s; print(s.__file__)")
    done = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True,
                          env=clean_env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(path), done.stdout  # from the zip, not the repo


WORKER_PROBE = """
import sys
from channel_engine.spark.export import package_zip, spark_session
spark = spark_session("local[1]")
where = spark.sparkContext.parallelize([0], 1).map(
    lambda _: __import__("channel_engine").__file__).collect()[0]
spark.stop()
print("zip", package_zip())
print("worker", where)
"""


# In the default run, test_export_cluster.py checks this on the cluster's executors (JVMs
# of their own, with an audit hook on every file they open); this local[1] probe, a cold
# driver of ~20 s, runs in the slow run.
@pytest.mark.slow
def test_executors_import_channel_engine_from_the_shipped_zip(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WORKER_PROBE], capture_output=True,
                          text=True, env=clean_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith(("zip ", "worker ")))
    # Spark's copy of the zip (in its userFiles), not the editable install in the venv
    assert f"/{Path(lines['zip']).name}/channel_engine/" in lines["worker"], lines

"""The export job when HDFS breaks: a NameNode restarted between runs and during one, a
DataNode lost under replication 1, an output directory the job's user may not write.
Each run completes or fails cleanly (exit status 1, one report line naming HDFS's
problem, the take rolled back, nothing committed), and the next run leaves every event
in the output exactly once.

The faults go to a MiniDFSCluster of this module's own (one NameNode, one DataNode,
permissions on; scripts/hdfs.sh restart-namenode|stop-namenode|start-namenode|
stop-datanode N|start-datanode N), never to the shared `hdfs_url` cluster or to an
outside one (WEIR_TEST_HDFS_URL): they would disturb other tests. A fault "during a run"
is made while the job is stopped (SIGSTOP to its process group) at step "writing", with
its first data file open on HDFS (WEIR_EXPORT_STOP_AT, exporter.py's crash_point). Marked
`hdfs`: run with `-m hdfs`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from services import started_service
from test_export import (
    ROOT,
    as_put,
    committed_files,
    event,
    export,
    export_here,
    exported,
    job_env,
    make_channel,
    put_events,
    stored,
    untaken,
)

from channel_engine import Channel, ChannelConfig
from channel_engine.spark.dfs import Dfs

pytestmark = pytest.mark.hdfs
SCRIPT = str(ROOT / "scripts" / "hdfs.sh")
USER = "alice"  # the export's HDFS user in the permission tests (HADOOP_USER_NAME)


@dataclass
class Cluster:
    """This module's MiniDFSCluster: its URL and the environment naming its state dir."""

    url: str
    env: dict[str, str]

    def fault(self, *command: str) -> str:
        """Run `scripts/hdfs.sh COMMAND` (restart-namenode, stop-datanode 0, ...)."""
        done = subprocess.run([SCRIPT, *command], capture_output=True, text=True,
                              env=self.env, timeout=300, check=False)
        assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr
        return done.stdout.strip()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = {**os.environ, "WEIR_HDFS_DIR": str(tmp_path_factory.mktemp("hdfs-faults"))}
    with started_service("hdfs.sh", env, "--datanodes", "1", "--permissions", "on") as url:
        yield Cluster(url, env)


def new_output(cluster: Cluster) -> str:
    return f"{cluster.url}/{uuid.uuid4().hex}"


def report_line(stdout: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.startswith('{"report"')]
    return json.loads(lines[-1]) if lines else None


@dataclass
class StoppedJob:
    """An export job (its own process group) stopped by SIGSTOP at a step of its run."""

    process: subprocess.Popen[str]
    config: ChannelConfig
    output: str

    def cont(self) -> None:
        """Let it go on (SIGCONT)."""
        os.killpg(self.process.pid, signal.SIGCONT)

    def wait(self) -> tuple[int, dict[str, Any] | None, str]:
        """Its end: (exit status, report line, output)."""
        out, err = self.process.communicate(timeout=300)
        return self.process.returncode, report_line(out), out + err

    def resume(self) -> tuple[int, dict[str, Any] | None, str]:
        """SIGCONT it and wait for its end."""
        self.cont()
        return self.wait()


@pytest.fixture
def stopped_run(tmp_path: Path, cluster: Cluster) -> Iterator[StoppedJob]:
    """An export of a 300-event channel (100-row files) to a new output on the module's
    cluster, in a session of its own, once it has stopped itself at step "writing" (its
    first data file open); killed at the test's end if still on."""
    config = make_channel(tmp_path, 300)
    output = new_output(cluster)
    env = job_env("spark.hadoop.dfs.replication=1",  # each block on the one DataNode
                  WEIR_EXPORT_STOP_AT="writing")
    process = subprocess.Popen(
        [sys.executable, "-m", "channel_engine.spark.export", "--home", str(config.home),
         "--output", output, "--master", "local[2]", "--roll-rows", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True)  # its SIGSTOP stops its group: the job, not pytest
    try:
        deadline = time.monotonic() + 300
        while state(process.pid) != "T":
            if process.poll() is not None or time.monotonic() > deadline:
                out, err = process.communicate(timeout=60) if process.poll() is not None \
                    else ("", "")
                pytest.fail(f"the job did not stop at step writing:\n{out}{err}"[-5000:])
            time.sleep(0.05)
        yield StoppedJob(process, config, output)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            os.killpg(process.pid, signal.SIGCONT)
            process.communicate(timeout=60)


def state(pid: int) -> str:
    """The process's state letter in /proc (R, S, T for stopped, Z...); "" once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (FileNotFoundError, IndexError):
        return ""


def superuser_fs(spark: Any, url: str) -> Any:
    """Hadoop's FileSystem for the cluster as the tests' own user, who started it: HDFS's
    superuser (the export job runs as USER)."""
    jvm = spark._jvm  # noqa: SLF001 -- py4j is the way to Hadoop's API
    return jvm.org.apache.hadoop.fs.Path(url).getFileSystem(
        spark._jsc.hadoopConfiguration())  # noqa: SLF001


def make_dir(spark: Any, url: str, path: str, owner: str, mode: str) -> None:
    """Create `path` on the cluster owned by `owner` with `mode` (octal, e.g. "755")."""
    jvm = spark._jvm  # noqa: SLF001
    fs, where = superuser_fs(spark, url), jvm.org.apache.hadoop.fs.Path(f"{url}{path}")
    assert fs.mkdirs(where)
    fs.setOwner(where, owner, owner)
    fs.setPermission(where, jvm.org.apache.hadoop.fs.permission.FsPermission(mode))


def assert_nothing_committed(spark: Any, config: ChannelConfig, output: str,
                             events: int) -> None:
    """No data file under a final name, no commit record, every event still untaken."""
    dfs = Dfs(spark, output)
    assert committed_files(spark, output) == []
    assert dfs.list_files(dfs.join("orders", "_weir", "commits")) == []
    assert untaken(config) == events


def assert_exactly_once(spark: Any, config: ChannelConfig, output: str, events: int) -> None:
    """Every event of the channel in the output once, nothing left to take or in temp."""
    rows = exported(spark, output)
    assert rows == stored(config)
    assert as_put(rows) == sorted(event(i) for i in range(events))
    assert untaken(config) == 0
    dfs = Dfs(spark, output)
    assert dfs.list_files(dfs.join("orders", "_weir", "tmp")) == []


def assert_clear_failure(code: int, report: dict[str, Any] | None, log: str,
                         *words: str) -> str:
    """Exit status 1 and one report line whose error is one line naming `words`."""
    assert code == 1 and report is not None and report["report"] is None, log[-5000:]
    error = str(report["error"])
    assert all(word in error for word in words), error
    assert "\n" not in error and "\tat " not in error, error  # no Java stack trace
    assert report["run"]["outcome"] == "failed" and not report["run"]["recorded"], report
    return error


def test_it_exports_exactly_once_across_a_namenode_restart_between_runs(
        tmp_path: Path, spark: Any, cluster: Cluster) -> None:
    config = make_channel(tmp_path, 300)
    output = new_output(cluster)
    assert export_here(spark, config, output, roll_rows=100)["rows"] == 300
    assert cluster.fault("restart-namenode").startswith("ok namenode up")
    with Channel.open(config) as channel:
        put_events(channel, 300, 450)
    report = export_here(spark, config, output, roll_rows=100)
    assert report["outcome"] == "ok" and report["rows"] == 150  # only the new events
    assert_exactly_once(spark, config, output, 450)


def test_a_namenode_restarted_during_a_run_leaves_each_event_exactly_once(
        spark: Any, cluster: Cluster, stopped_run: StoppedJob) -> None:
    job, config, output = stopped_run, stopped_run.config, stopped_run.output
    cluster.fault("stop-namenode")
    try:
        job.cont()  # it goes on with the NameNode away, which comes back (same image and
        time.sleep(1)  # edits, same port) some seconds later
    finally:
        cluster.fault("start-namenode")
    code, report, log = job.wait()
    if code == 0:  # the client rode through the restart
        assert report is not None and report["report"]["rows"] == 300, log[-5000:]
    else:  # or the run failed cleanly: taken back, nothing committed
        assert_clear_failure(code, report, log)
        assert_nothing_committed(spark, config, output, 300)
    report = export_here(spark, config, output, roll_rows=100)  # the next run
    assert report["outcome"] == "ok" and report["rows"] == (300 if code else 0)
    assert_exactly_once(spark, config, output, 300)


def test_a_datanode_lost_under_replication_1_fails_the_run_and_commits_nothing(
        spark: Any, cluster: Cluster, stopped_run: StoppedJob) -> None:
    job, config, output = stopped_run, stopped_run.config, stopped_run.output
    cluster.fault("stop-datanode", "0")  # the only one: every block of the output with it
    try:
        began = time.monotonic()
        code, report, log = job.resume()
        waited = time.monotonic() - began
    finally:
        cluster.fault("start-datanode", "0")
    assert_clear_failure(code, report, log, "could only be written to 0 of the 1 "
                                            "minReplication nodes")
    assert waited < 120, f"the failed run took {waited:.0f} s to end"  # no long retries
    assert_nothing_committed(spark, config, output, 300)
    report = export_here(spark, config, output, roll_rows=100)  # with the DataNode back
    assert report["outcome"] == "ok" and report["rows"] == 300
    assert_exactly_once(spark, config, output, 300)


def test_an_output_directory_the_user_may_not_write_fails_the_run_cleanly(
        tmp_path: Path, spark: Any, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_channel(tmp_path, 200)
    top = f"/{uuid.uuid4().hex}"
    make_dir(spark, cluster.url, f"{top}/locked", "bob", "755")  # bob's: others read only
    make_dir(spark, cluster.url, f"{top}/mine", USER, "755")
    monkeypatch.setenv("HADOOP_USER_NAME", USER)  # the job's HDFS user (simple auth)
    locked = f"{cluster.url}{top}/locked/weir"
    code, report, log = export(config, locked, "--roll-rows", "100")
    assert_clear_failure(code, report, log, "AccessControlException",
                         f"Permission denied: user={USER}, access=WRITE",
                         f'inode="{top}/locked"')
    assert untaken(config) == 200  # taken back
    assert Dfs(spark, locked).list_files(f"{cluster.url}{top}/locked") == []
    mine = f"{cluster.url}{top}/mine/weir"
    code, report, log = export(config, mine, "--roll-rows", "100")
    assert code == 0 and report is not None and report["report"]["rows"] == 200, log[-5000:]
    assert_exactly_once(spark, config, mine, 200)
    status = superuser_fs(spark, cluster.url).getFileStatus(
        spark._jvm.org.apache.hadoop.fs.Path(committed_files(spark, mine)[0]))  # noqa: SLF001
    assert status.getOwner() == USER  # written as the job's user, not the superuser

"""scripts/run.sh's logs, rotated by size (scripts/log_rotation.py) and written by the log
writer (scripts/log_writer.py) from each child's pipe: a child writing past the limit
leaves at most WEIR_LOG_BACKUPS rotated files, none over the limit, every line whole and
none lost across a rotation; a full disk drops and counts lines without stopping the child
and the log resumes saying so; a failed rotation keeps no closed fd; a log that cannot be
opened starts no child; the foreground view drops and counts lines past its queue; a killed
supervisor's child gets SIGTERM and the lines it writes while it stops are logged, the
writer exiting after it; a file another process writes (nginx's access log) is renamed and
reopened, and so is a detached supervisor's own log; the Redis URL the supervisor prints
has its password masked."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.log_rotation import RotatingLog, Rotation, rotate_reopened
from scripts.supervisor import Config, Failed, LogTail, Supervisor, masked

ROOT = Path(__file__).resolve().parents[1]
LIMIT, BACKUPS = 4096, 3
# Lines of varying length, numbered; stdout and stderr both, as a Celery worker writes.
WRITER = """
import sys
for i in range({count}):
    out = sys.stderr if i % 7 == 0 else sys.stdout
    out.write(f"{{i:06d}} " + "x" * (i % 113) + "\\n")
    out.flush()
"""


def supervisor_of(var: Path, rotation: Rotation) -> Supervisor:
    """A supervisor of no appliance: its _spawn alone is used."""
    config = Config(var, "redis://127.0.0.1:1/0", "127.0.0.1:1", 1, 1,
                    ("weir", "weir-export", "weir-kafka"), rotation=rotation)
    (var / "log").mkdir(parents=True)
    return Supervisor(config, follow=False)


def numbers(path: Path) -> list[int]:
    """The numbers of a log's lines, each checked whole."""
    found = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        number, _, body = line.partition(b" ")
        assert body == b"x" * (int(number) % 113), (path, line)
        found.append(int(number))
    return found


def test_it_rotates_a_childs_log_keeping_n_files_none_over_the_limit_no_line_lost(
        tmp_path: Path) -> None:
    supervisor = supervisor_of(tmp_path, Rotation(LIMIT, BACKUPS))
    count = 3000  # ~190 KB: dozens of rotations
    supervisor._spawn("writer", [sys.executable, "-c", WRITER.format(count=count)])
    [child] = supervisor.children
    assert child.popen.wait(timeout=60) == 0
    child.output.join(10)
    log = tmp_path / "log" / "writer.log"
    files = sorted((tmp_path / "log").glob("writer.log*"))  # beside supervisor.log
    assert [p.name for p in files] == ["writer.log", "writer.log.1", "writer.log.2",
                                       "writer.log.3"]
    kept = [log.with_name(f"writer.log.{n}") for n in (3, 2, 1)] + [log]
    for path in kept:
        assert 0 < path.stat().st_size <= LIMIT, path
    lines = [n for path in kept for n in numbers(path)]
    assert lines == list(range(lines[0], count))  # in order, none missing, none twice
    assert len(lines) * 60 > BACKUPS * LIMIT  # the files are full, not one line each


def test_an_existing_log_is_appended_to_then_rotated(tmp_path: Path) -> None:
    supervisor = supervisor_of(tmp_path, Rotation(LIMIT, 2))
    log = tmp_path / "log" / "writer.log"
    log.write_bytes(b"999999 " + b"x" * (999999 % 113) + b"\n")  # from an earlier run
    supervisor._spawn("writer", [sys.executable, "-c", WRITER.format(count=20)])
    [child] = supervisor.children
    assert child.popen.wait(timeout=60) == 0
    child.output.join(10)
    assert numbers(log) == [999999, *range(20)]
    assert not log.with_name("writer.log.1").exists()


# Writes a numbered line every 2 ms until the file argv[1] exists, then "last"; a write
# to a broken pipe (its log's reader gone) ends it with an error.
TICKER = """
import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    print(f"{i:06d}", flush=True)
    i += 1
    time.sleep(0.002)
print("last", flush=True)
"""


def test_a_full_disk_drops_and_counts_lines_and_the_log_resumes(tmp_path: Path) -> None:
    supervisor = supervisor_of(tmp_path, Rotation(LIMIT, BACKUPS))
    log, stop = tmp_path / "log" / "ticker.log", tmp_path / "stop"
    log.symlink_to("/dev/full")  # every write: ENOSPC
    supervisor._spawn("ticker", [sys.executable, "-c", TICKER, str(stop)])
    [child] = supervisor.children
    time.sleep(1)  # a few hundred lines dropped, several retries failed
    assert child.exited() is None
    log.unlink()  # space again: the retry reopens a file of its own
    deadline = time.monotonic() + 15
    while b"dropped" not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() < deadline, "the log never resumed"
        time.sleep(0.05)
    stop.touch()
    assert child.popen.wait(timeout=10) == 0  # it never met a broken pipe
    child.output.join(10)
    first, *rest = log.read_bytes().decode().splitlines()
    assert re.fullmatch(r"weir: [0-9]+ bytes of this log dropped: "
                        r"\[Errno 28\] No space left on device", first), first
    assert int(first.split()[1]) % 7 == 0 and int(first.split()[1]) > 7 * 100  # whole lines
    assert rest[-1] == "last"
    numbers = [int(line) for line in rest[:-1]]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def test_a_failed_rotation_keeps_no_closed_fd_and_retries(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    (tmp_path / "a.log.1").mkdir()  # shift cannot rename a.log over a directory
    (tmp_path / "a.log.1" / "x").touch()
    log = RotatingLog(path, Rotation(1024, 1))
    log.write([b"x" * 1000 + b"\n"])
    log.write([b"y" * 100 + b"\n"])  # rotation fails: dropped, not raised
    assert log.fd == -1 and log.dropped == 101
    log.close()  # nothing closed twice (it could be another file's fd by then)
    (tmp_path / "a.log.1" / "x").unlink()
    (tmp_path / "a.log.1").rmdir()
    log.retry_at = 0  # the retry is due
    log.write([b"z\n"])
    assert (tmp_path / "a.log.1").read_bytes() == b"x" * 1000 + b"\n"
    assert path.read_bytes().startswith(b"weir: 101 bytes of this log dropped: ")
    assert path.read_bytes().endswith(b"\nz\n")
    log.close()


def test_a_child_whose_log_cannot_be_opened_is_never_started(tmp_path: Path) -> None:
    supervisor = supervisor_of(tmp_path, Rotation(LIMIT, BACKUPS))
    (tmp_path / "log" / "marker.log").mkdir()  # opening it for writing: EISDIR
    marker = tmp_path / "started"
    with pytest.raises(Failed, match="cannot open the log .*marker.log: Is a directory"):
        supervisor._spawn("marker", [sys.executable, "-c",
                                     f"open({str(marker)!r}, 'w')"])
    time.sleep(1)  # time enough to start Python had it been started
    assert not marker.exists() and not supervisor.children


def test_a_log_writer_that_cannot_start_fails_the_start_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_writer(*args: object) -> None:
        raise OSError(24, "Too many open files")
    monkeypatch.setattr("scripts.supervisor.LogWriter", no_writer)
    supervisor = supervisor_of(tmp_path, Rotation(LIMIT, BACKUPS))
    with pytest.raises(Failed, match="cannot start the log writer: .*Too many open files"):
        supervisor._spawn("writer", [sys.executable, "-c", "pass"])
    assert not supervisor.children


def test_the_foreground_view_drops_and_counts_lines_past_its_queue(
        capsys: pytest.CaptureFixture[str]) -> None:
    tail = LogTail()
    tail.add("web")
    for i in range(LogTail.QUEUE_MAX + 5):  # the terminal printed none meanwhile
        tail.put("web", b"line %d\n" % i)
    tail.dropped(2)  # lines the log writer could not send
    tail.pump()
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].endswith("line 0") and shown[-2].endswith(f"line {LogTail.QUEUE_MAX - 1}")
    assert shown[-1] == "weir: 7 lines not shown (the terminal was behind); the logs have them"


SUPERVISOR = """
import sys, time
from pathlib import Path
from scripts.log_rotation import Rotation
from scripts.supervisor import Config, Supervisor
var = Path(sys.argv[1])
(var / "log").mkdir(parents=True)
supervisor = Supervisor(Config(var, "redis://127.0.0.1:1/0", "127.0.0.1:1", 1, 1,
                               ("a", "b", "c"), rotation=Rotation(4096, 2)), follow=False)
supervisor._spawn("child", [sys.executable, "-c", CHILD])
print(supervisor.children[0].popen.pid, supervisor.logs.process.pid, flush=True)
time.sleep(600)
"""
# Writes a line every 10 ms; at SIGTERM, takes a second to stop, saying so, as gunicorn's
# graceful stop or a Celery warm shutdown do.
CHILD = """
import signal, sys, time
def stop(*_):
    print("SIGTERM", flush=True)
    for i in range(20):
        time.sleep(0.05)
        print(f"stopping {i}", flush=True)
    print("stopped", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    print("tick", flush=True)
    time.sleep(0.01)
"""


def test_a_killed_supervisors_children_get_sigterm_and_their_last_lines_are_logged(
        tmp_path: Path) -> None:
    code = SUPERVISOR.replace("CHILD", repr(CHILD))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child, writer = map(int, parent.stdout.readline().split())
    try:
        time.sleep(0.5)  # a few ticks through the pipe
        assert b"tick\n" in (tmp_path / "log" / "child.log").read_bytes()
        parent.send_signal(signal.SIGKILL)
        os.kill(writer, signal.SIGTERM)  # as a service manager stopping every process: kept
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not zombie(child):
            assert time.monotonic() < deadline, "the child outlived its supervisor"
            assert not zombie(writer), "the log writer went before the child"
            time.sleep(0.05)
        while not zombie(writer):  # every pipe ended: it goes too
            assert time.monotonic() < deadline, "the log writer outlived the child"
            time.sleep(0.05)
        logs = [tmp_path / "log" / name for name in ("child.log.1", "child.log")]
        lines = [line for log in logs if log.exists() for line in log.read_text().splitlines()]
        assert lines[-22:] == ["SIGTERM", *(f"stopping {i}" for i in range(20)), "stopped"]
    finally:
        for pid in (child, writer):
            if not zombie(pid):
                os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


# A detached supervisor's own output: supervisor.log, rotated as it fills.
DETACHED = """
import sys
from pathlib import Path
from scripts.log_rotation import Rotation
from scripts.supervisor import Config, Supervisor, _detach_output, say
var = Path(sys.argv[1])
(var / "log").mkdir(parents=True)
config = Config(var, "redis://127.0.0.1:1/0", "127.0.0.1:1", 1, 1, ("a", "b", "c"),
                rotation=Rotation(1024, 2))
supervisor = Supervisor(config, follow=False)
_detach_output(config.log("supervisor"))
supervisor.own_log = config.log("supervisor")
for i in range(200):
    say(f"{i:06d}")
    supervisor.rotate_reopened_logs()
"""


def test_a_detached_supervisors_own_log_is_rotated(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", DETACHED, str(tmp_path)], cwd=ROOT, env=env,
                   check=True, timeout=60)
    log = tmp_path / "log" / "supervisor.log"
    kept = [log.with_name("supervisor.log.2"), log.with_name("supervisor.log.1"), log]
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == sorted(p.name for p in kept)
    lines = [int(line.split()[1]) for path in kept for line in path.read_text().splitlines()]
    assert lines == list(range(lines[0], 200))  # none lost in the renames
    # rotated once it reaches the limit: past it by one line at most
    assert all(path.stat().st_size < 1024 + len("weir: 000000\n") for path in kept)


# Appends a numbered line to a file every 2 ms, reopening it on SIGUSR1, as nginx does.
REOPENER = """
import signal, sys, time
path = sys.argv[1]
out = open(path, "ab", buffering=0)
def reopen(*_):
    global out
    out = open(path, "ab", buffering=0)
signal.signal(signal.SIGUSR1, reopen)
i = 0
while True:
    out.write(b"%06d\\n" % i)
    i += 1
    time.sleep(0.002)
"""


def test_a_file_another_process_writes_is_renamed_then_reopened(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    writer = subprocess.Popen([sys.executable, "-c", REOPENER, str(log)])
    rotation = Rotation(1024, 2)
    try:
        rotations = 0
        deadline = time.monotonic() + 30
        while rotations < 4:
            assert time.monotonic() < deadline, rotations
            rotations += rotate_reopened(log, rotation,
                                         lambda: writer.send_signal(signal.SIGUSR1))
            time.sleep(0.05)
        time.sleep(0.2)  # the last reopen done, a few lines in the new file
    finally:
        writer.kill()
        writer.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["access.log", "access.log.1",
                                                          "access.log.2"]
    kept = [log.with_name("access.log.2"), log.with_name("access.log.1"), log]
    lines = [int(line) for path in kept for line in path.read_text().split()]
    assert lines == list(range(lines[0], lines[-1] + 1))  # none lost in the renames


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:s3cret@redis.example:6380/2", "redis://:***@redis.example:6380/2"),
    ("rediss://weir:s3cret@redis.example/0", "rediss://weir:***@redis.example/0"),
])
def test_the_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert masked(url) == shown

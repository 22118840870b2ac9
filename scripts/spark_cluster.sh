#!/usr/bin/env bash
# A Spark standalone cluster for tests and by hand: scripts/spark_cluster.sh start|stop|status
#
# start [--cores N] [--memory 1g]
#   Starts a standalone master and one worker (N cores, default 2; memory for its
#   executors, default 1g) from the pinned pyspark's own launcher (bin/spark-class
#   org.apache.spark.deploy.master.Master / ...worker.Worker), each a JVM of its own in
#   the background, bound to 127.0.0.1 on free ports (the web UIs too; the REST
#   submission server off). Returns once the worker has registered with the master and
#   prints `spark://127.0.0.1:PORT` as its last line; fails after
#   WEIR_SPARK_START_TIMEOUT seconds (default 120) with the logs' tail, stopping what
#   it started.
#   The worker runs without the caller's PYTHONPATH and outside the repo, so the Python
#   workers of its executors import only what the job ships them (export.py's
#   package_zip) and what their interpreter has installed; they run the interpreter the
#   driver names (PYSPARK_PYTHON in the job's environment).
# stop    kills the worker, then the master (SIGTERM, then SIGKILL after 30 s), with the
#         executors the worker started, and waits until they are gone.
# status  prints "running spark://..." (exit 0) or "stopped" (exit 3).
#
# State lives in WEIR_SPARK_DIR (default var/spark): master.pid, worker.pid, url,
# master.log, worker.log, work/ (one directory per application and executor, with the
# executors' stdout and stderr, where their Python workers log too) and local/ (Spark's
# scratch space). work/ and local/ are emptied at each start.
# The Python whose pyspark is used: WEIR_PYTHON, else the repo's .venv, else python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/common.sh"  # state_dir, pid_of, terminate
dir=$(state_dir WEIR_SPARK_DIR "$root/var/spark")
urlfile=$dir/url

python=${WEIR_PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3

running_pid() {  # running_pid master|worker
  local class=org.apache.spark.deploy.worker.Worker
  [ "$1" = master ] && class=org.apache.spark.deploy.master.Master
  pid_of "$dir/$1.pid" "$class"
}

# launch NAME CLASS ARGS...: a daemon of its own session, its pid in NAME.pid
launch() {
  local name=$1
  shift
  # setsid: the cluster outlives this script and a Ctrl-C in its terminal; spark-class
  # execs java, so the pid stays the JVM's.
  (cd "$dir" && exec env -u PYTHONPATH SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS="$dir/local" \
    SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}" \
    SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false ${SPARK_MASTER_OPTS:-}" \
    setsid "$spark_home/bin/spark-class" "$@" >"$dir/$name.log" 2>&1 </dev/null) &
  echo $! >"$dir/$name.pid"
}

# wait_for NAME PATTERN: the first match of PATTERN in NAME.log, once it is there
wait_for() {
  local name=$1 pattern=$2 found="" pid
  pid=$(cat "$dir/$name.pid")
  while [ "$SECONDS" -lt "$deadline" ]; do
    found=$(grep -o -m 1 -E "$pattern" "$dir/$name.log" || true)
    if [ -n "$found" ]; then
      echo "$found"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$dir/$name.log" >&2
      echo "weir: the Spark $name exited before it was up (log: $dir/$name.log)" >&2
      return 1
    fi
    sleep 0.2
  done
  tail -n 30 "$dir/$name.log" >&2
  echo "weir: the Spark $name was not up after ${timeout}s (log: $dir/$name.log)" >&2
  return 1
}

start() {
  local cores=2 memory=1g
  while [ $# -gt 0 ]; do
    case "$1" in
      --cores) cores=$2; shift 2 ;;
      --memory) memory=$2; shift 2 ;;
      *) echo "weir: unknown option $1" >&2; return 2 ;;
    esac
  done
  if pid=$(running_pid master); then
    echo "weir: Spark already running (master pid $pid); scripts/spark_cluster.sh stop first" >&2
    cat "$urlfile"
    return 0
  fi
  command -v java >/dev/null \
    || { echo "weir: scripts/spark_cluster.sh needs a Java 17 runtime (java) on PATH" >&2; return 1; }
  spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') \
    || { echo "weir: $python cannot import pyspark (set WEIR_PYTHON)" >&2; return 1; }
  stop >/dev/null  # a worker left by a half-failed start
  rm -rf "$dir/work" "$dir/local"
  mkdir -p "$dir/work" "$dir/local"
  timeout=${WEIR_SPARK_START_TIMEOUT:-120}
  deadline=$((SECONDS + timeout))
  launch master org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port 0 --webui-port 0
  local url
  if ! url=$(wait_for master 'spark://127\.0\.0\.1:[0-9]+'); then
    stop >/dev/null
    return 1
  fi
  launch worker org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port 0 \
    --webui-port 0 --cores "$cores" --memory "$memory" --work-dir "$dir/work" "$url"
  if ! wait_for worker 'Successfully registered with master' >/dev/null; then
    stop >/dev/null
    return 1
  fi
  echo "$url" >"$urlfile"
  echo "weir: Spark up (master pid $(cat "$dir/master.pid"), worker pid" \
       "$(cat "$dir/worker.pid") with $cores cores and $memory; logs under $dir)" >&2
  echo "$url"
}

# halt NAME: SIGTERM its whole session (the worker's holds its executors and their Python
# workers), SIGKILL after 30 s, then SIGKILL whatever the session still holds
halt() {
  local pid
  if pid=$(running_pid "$1"); then
    terminate "$pid" "the Spark $1" group
  fi
  rm -f "$dir/$1.pid"
}

stop() {
  halt worker
  halt master
  rm -f "$urlfile"
  echo "stopped"
}

status() {
  local master worker
  if master=$(running_pid master) && worker=$(running_pid worker); then
    echo "running $(cat "$urlfile" 2>/dev/null || echo "(starting)") master pid $master" \
         "worker pid $worker"
  else
    echo "stopped"
    return 3
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: scripts/spark_cluster.sh start [--cores N] [--memory 1g] | stop | status" >&2; exit 2 ;;
esac

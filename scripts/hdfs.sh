#!/usr/bin/env bash
# A real HDFS for tests and by hand: scripts/hdfs.sh start|stop|status
#
# start [--datanodes N] [--permissions on|off] [--port P] [--keep]
#   Fetches the pinned Hadoop jars (scripts/jvm_deps.py hdfs), compiles the launcher
#   scripts/jvm/hdfs/MiniHdfs.java, and starts a MiniDFSCluster (a NameNode and N
#   DataNodes in one JVM) in the background. Returns once the NameNode is out of safe
#   mode and prints `hdfs://127.0.0.1:PORT` as its last line; fails after
#   WEIR_HDFS_START_TIMEOUT seconds (default 120) with the log's tail.
# stop    kills it (SIGTERM, then SIGKILL after 30 s) and waits until it is gone.
# status  prints "running hdfs://..." (exit 0) or "stopped" (exit 3).
#
# Faults, for the fault tests and by hand, on a running cluster (each returns once done,
# printing "ok ..."; an error prints "weir: error: ..." and exits 1; not running: exit 3):
# restart-namenode  stops the NameNode and starts it on the same port with its image and
#                   edits; returns once it is out of safe mode
# stop-namenode | start-namenode
# stop-datanode N   stops DataNode N (0-based): its blocks are unreadable until it starts
# start-datanode N  starts it again (same ports and storage); returns once it is live
# They go to the launcher's control port (127.0.0.1, the port in $WEIR_HDFS_DIR/control;
# MiniHdfs.java describes the protocol), answered within WEIR_HDFS_CONTROL_TIMEOUT
# seconds (default 180).
#
# State lives in WEIR_HDFS_DIR (default var/hdfs): pid, url, control, hdfs.log, data/.
# The data is formatted afresh at each start unless --keep is given.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/common.sh"  # state_dir, pid_of, terminate
dir=$(state_dir WEIR_HDFS_DIR "$root/var/hdfs")
pidfile=$dir/pid
urlfile=$dir/url
controlfile=$dir/control
log=$dir/hdfs.log

running_pid() { pid_of "$pidfile" MiniHdfs; }

start() {
  if pid=$(running_pid); then
    echo "weir: HDFS already running (pid $pid); scripts/hdfs.sh stop first" >&2
    cat "$urlfile"
    return 0
  fi
  command -v java >/dev/null && command -v javac >/dev/null \
    || { echo "weir: scripts/hdfs.sh needs a JDK 17 (java, javac) on PATH" >&2; return 1; }
  local lib classes
  lib=$(python3 "$root/scripts/jvm_deps.py" hdfs | tail -n 1)
  classes=$root/var/jvm/hdfs/classes
  if [ ! -f "$classes/MiniHdfs.class" ] || [ "$root/scripts/jvm/hdfs/MiniHdfs.java" -nt "$classes/MiniHdfs.class" ]; then
    mkdir -p "$classes"
    # javac warns that sun.misc.Signal is internal API: shown only when it fails.
    if ! javac -cp "$lib/*" -d "$classes" "$root/scripts/jvm/hdfs/MiniHdfs.java" >"$dir/javac.log" 2>&1; then
      cat "$dir/javac.log" >&2
      echo "weir: could not compile scripts/jvm/hdfs/MiniHdfs.java" >&2
      return 1
    fi
  fi
  rm -f "$urlfile" "$pidfile" "$controlfile"
  # setsid: the cluster outlives this script and a Ctrl-C in its terminal.
  setsid java -Xmx1g -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
    -cp "$classes:$lib/*" MiniHdfs "$dir" "$@" >"$log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$pidfile"
  local timeout=${WEIR_HDFS_START_TIMEOUT:-120} waited=0 url=""
  while [ "$waited" -lt $((timeout * 5)) ]; do
    url=$(grep -o '^hdfs://127\.0\.0\.1:[0-9]*$' "$log" | tail -n 1 || true)
    [ -n "$url" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$log" >&2
      echo "weir: HDFS exited before it was up (log: $log)" >&2
      rm -f "$pidfile"
      return 1
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  if [ -z "$url" ]; then
    tail -n 30 "$log" >&2
    echo "weir: HDFS not up after ${timeout}s (log: $log); stopping it" >&2
    stop >/dev/null
    return 1
  fi
  echo "$url" >"$urlfile"
  echo "weir: HDFS up (pid $pid, data and log under $dir)" >&2
  echo "$url"
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$pidfile" "$urlfile" "$controlfile"
    echo "stopped"
    return 0
  fi
  terminate "$pid" HDFS
  rm -f "$pidfile" "$urlfile" "$controlfile"
  echo "stopped"
}

status() {
  local pid
  if pid=$(running_pid); then
    echo "running $(cat "$urlfile" 2>/dev/null || echo "(starting)") pid $pid"
  else
    echo "stopped"
    return 3
  fi
}

# One command line to the launcher's control port; its answer line on stdout when "ok".
control() {
  if ! running_pid >/dev/null; then
    echo "weir: HDFS is not running (scripts/hdfs.sh start first)" >&2
    return 3
  fi
  local port reply=""
  port=$(cat "$controlfile" 2>/dev/null) || { echo "weir: no $controlfile" >&2; return 1; }
  if ! exec 3<>"/dev/tcp/127.0.0.1/$port"; then
    echo "weir: cannot reach the HDFS launcher's control port 127.0.0.1:$port" >&2
    return 1
  fi
  printf '%s\n' "$*" >&3
  IFS= read -r -t "${WEIR_HDFS_CONTROL_TIMEOUT:-180}" reply <&3 \
    || reply="error: no answer to '$*' within ${WEIR_HDFS_CONTROL_TIMEOUT:-180} s (log: $log)"
  exec 3<&- 3>&-
  case $reply in
    ok*) echo "$reply" ;;
    *) echo "weir: $reply" >&2; return 1 ;;
  esac
}

cmd=${1:-}
shift || true
case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  status) status ;;
  restart-namenode | stop-namenode | start-namenode) control "$cmd" ;;
  stop-datanode | start-datanode)
    [ $# -eq 1 ] || { echo "usage: scripts/hdfs.sh $cmd N" >&2; exit 2; }
    control "$cmd" "$1" ;;
  *) echo "usage: scripts/hdfs.sh start [--datanodes N] [--permissions on|off] [--port P] [--keep] | stop | status | restart-namenode | stop-namenode | start-namenode | stop-datanode N | start-datanode N" >&2; exit 2 ;;
esac

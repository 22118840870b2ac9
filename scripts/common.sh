# Shell helpers shared by bootstrap.sh, run.sh, test.sh, hdfs.sh, spark_cluster.sh and kafka.sh
# Functions only: sourcing this changes nothing until one is called.

# Run a command as root (through sudo unless we are root already).
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Install Debian packages quietly.
apt_install() {
  echo "weir: installing Debian packages: $*"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Install Debian's redis-server when the binary is missing.
ensure_redis_server() {
  command -v redis-server >/dev/null || apt_install redis-server
}

# Install Debian's nginx when missing: the front scripts/run.sh starts before gunicorn
# (appliance/front.py). Weir runs nginx itself, on a generated config: the package's own
# service (port 80, Debian's default site), where the package started it, is disabled.
ensure_nginx() {
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] && return 0
  if ! apt_install nginx; then
    echo "weir: could not install Debian's nginx, the front that keeps slow clients from" \
         "holding gunicorn's threads; install it, or set WEIR_FRONT=none to serve gunicorn" \
         "directly without that defence" >&2
    return 1
  fi
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    as_root systemctl disable --now nginx.service >/dev/null 2>&1 || true
  fi
}

# state_dir VAR DEFAULT: print a service script's state directory ($VAR, else DEFAULT),
# made when missing, as an absolute path (hdfs.sh, spark_cluster.sh, kafka.sh).
state_dir() {
  local place=${!1:-$2}
  mkdir -p "$place"
  (cd "$place" && pwd)
}

# pid_of PIDFILE PATTERN: print the pid PIDFILE holds when that process runs and its
# command line holds PATTERN (a pid the kernel gave to another process since is not it).
pid_of() {
  [ -f "$1" ] || return 1
  local pid
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null && grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# terminate PID WHAT [group]: SIGTERM the process (its whole process group with "group":
# a daemon started in a session of its own, with the children it started), SIGKILL it
# after 30 s, saying so, and return once it is gone (with "group", SIGKILL whatever the
# group still holds then too). WHAT names it in the message.
terminate() {
  local pid=$1 what=$2 group=${3:-} i
  if [ "$group" = group ]; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  for i in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "weir: $what (pid $pid) still up after 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  if [ "$group" = group ]; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# Run the function $1 when the calling shell exits, before those registered earlier (the
# last started is the first stopped). One EXIT trap runs them all: a second `trap ... EXIT`
# would replace the first and leave its server running. INT and TERM exit through it too.
on_exit() {
  _weir_exit_hooks="$1${_weir_exit_hooks:+ $_weir_exit_hooks}"
  trap _run_exit_hooks EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

_run_exit_hooks() {
  local hook
  for hook in ${_weir_exit_hooks:-}; do "$hook" || true; done
  _weir_exit_hooks=""
}

# Exit 0 when a Redis answers PING at the URL $1 (needs .venv: run after bootstrap.sh).
redis_answers() {
  .venv/bin/python - "$1" <<'EOF' 2>/dev/null
import sys
import redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1, socket_timeout=2).ping()
EOF
}

# The tests' Redis: WEIR_TEST_REDIS_URL (default redis://127.0.0.1:6379, no db) when one
# answers there, else a private redis-server on a free port (no persistence) that is
# stopped when the calling shell exits. Exports WEIR_TEST_REDIS_URL, and REDIS_URL (db 0)
# for what reads the appliance settings (Celery's broker, the browser tests' live server).
use_test_redis() {
  local wanted=${WEIR_TEST_REDIS_URL:-redis://127.0.0.1:6379}
  if redis_answers "$wanted"; then
    export WEIR_TEST_REDIS_URL=$wanted
  else
    ensure_redis_server
    _start_private_test_redis "$wanted"
  fi
  export REDIS_URL=${WEIR_TEST_REDIS_URL%/}/0
}

_start_private_test_redis() {
  local port
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  _test_redis_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-test-redis.XXXXXX")
  echo "weir: no Redis answers at $1: starting a private redis-server on 127.0.0.1:$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$_test_redis_dir" --loglevel warning >"$_test_redis_dir/redis.log" 2>&1 &
  _test_redis_pid=$!
  on_exit _stop_private_test_redis
  export WEIR_TEST_REDIS_URL=redis://127.0.0.1:$port
  local tries=0
  until redis_answers "$WEIR_TEST_REDIS_URL"; do
    tries=$((tries + 1))
    if [ "$tries" -gt 50 ] || ! kill -0 "$_test_redis_pid" 2>/dev/null; then
      echo "weir: the private redis-server did not answer; its log:" >&2
      cat "$_test_redis_dir/redis.log" >&2
      exit 1
    fi
    sleep 0.2
  done
}

_stop_private_test_redis() {
  if [ -n "${_test_redis_pid:-}" ]; then
    kill "$_test_redis_pid" 2>/dev/null || true
    wait "$_test_redis_pid" 2>/dev/null || true
    rm -rf "$_test_redis_dir"
    _test_redis_pid=""
  fi
}

# Exit 0 when a PostgreSQL accepts a connection at the URL $1 (needs .venv).
postgres_answers() {
  .venv/bin/python - "$1" <<'EOF' 2>/dev/null
import sys
import psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
EOF
}

# The newest PostgreSQL server install's bin dir (Debian: /usr/lib/postgresql/N/bin).
postgres_bin_dir() {
  find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' -printf '%h\n' \
    2>/dev/null | sort -V | tail -n 1
}

# Install Debian's postgresql (initdb, pg_ctl, the server) when no install has initdb.
ensure_postgres_server() {
  [ -n "$(postgres_bin_dir)" ] || apt_install postgresql
}

# The tests' PostgreSQL: WEIR_TEST_POSTGRES_URL when one accepts connections there, else
# (unset, or nothing answers) a private server stopped when the calling shell exits: its
# data dir and unix socket under a temp dir, on 127.0.0.1 and a free port, trust auth,
# no fsync (test data only), superuser `postgres`, a database `test`. Exports
# WEIR_TEST_POSTGRES_URL. Exits the shell with the reason when the server cannot start.
use_test_postgres() {
  local wanted=${WEIR_TEST_POSTGRES_URL:-}
  if [ -n "$wanted" ] && postgres_answers "$wanted"; then
    export WEIR_TEST_POSTGRES_URL=$wanted
    return 0
  fi
  if ! ensure_postgres_server || [ -z "$(postgres_bin_dir)" ]; then
    echo "weir: no PostgreSQL answers at ${wanted:-WEIR_TEST_POSTGRES_URL (unset)} and" \
         "Debian's postgresql could not be installed: the appliance tests cannot run on" \
         "PostgreSQL" >&2
    exit 1
  fi
  _start_private_test_postgres "${wanted:-WEIR_TEST_POSTGRES_URL (unset)}"
}

# PostgreSQL refuses to run as root: as root, its commands run as Debian's `postgres`
# user (else `nobody`), which owns the temp dir.
_as_test_postgres_user() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$_test_postgres_user" -- "$@"; else "$@"; fi
}

_start_private_test_postgres() {
  local bin port data
  bin=$(postgres_bin_dir)
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  _test_postgres_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-test-postgres.XXXXXX")
  _test_postgres_bin=$bin
  _test_postgres_user=$(id -un)
  data=$_test_postgres_dir/data
  if [ "$(id -u)" -eq 0 ]; then
    _test_postgres_user=nobody
    id postgres >/dev/null 2>&1 && _test_postgres_user=postgres
    chown "$_test_postgres_user" "$_test_postgres_dir"
  fi
  on_exit _stop_private_test_postgres
  echo "weir: no PostgreSQL answers at $1: starting a private PostgreSQL" \
       "($bin, as $_test_postgres_user) on 127.0.0.1:$port"
  if ! _as_test_postgres_user test -w "$_test_postgres_dir"; then
    echo "weir: the PostgreSQL user $_test_postgres_user cannot write $_test_postgres_dir" \
         "(a parent directory is closed to it): set TMPDIR to a directory it can reach" >&2
    exit 1
  fi
  if ! _as_test_postgres_user "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 \
         --locale=C --no-sync >"$_test_postgres_dir/initdb.log" 2>&1; then
    echo "weir: initdb of the private PostgreSQL failed; its log:" >&2
    cat "$_test_postgres_dir/initdb.log" >&2
    exit 1
  fi
  # Test data only: durability traded for speed.
  cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$_test_postgres_dir'
fsync = off
full_page_writes = off
synchronous_commit = off
EOF
  if ! _as_test_postgres_user "$bin/pg_ctl" -D "$data" -l "$_test_postgres_dir/postgres.log" \
         -w -t 60 start >/dev/null 2>&1 \
     || ! "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres test \
          2>>"$_test_postgres_dir/postgres.log"; then
    echo "weir: the private PostgreSQL did not start; its log:" >&2
    cat "$_test_postgres_dir/postgres.log" >&2
    exit 1
  fi
  export WEIR_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/test
}

_stop_private_test_postgres() {
  if [ -n "${_test_postgres_dir:-}" ]; then
    if [ -f "$_test_postgres_dir/data/postmaster.pid" ]; then
      _as_test_postgres_user "$_test_postgres_bin/pg_ctl" -D "$_test_postgres_dir/data" \
        -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$_test_postgres_dir"
    _test_postgres_dir=""
  fi
}

# Run "$@" in the background while the caller goes on: in a process group of its own,
# SIGINT not ignored (as it would be for a plain `&` in a script, and for anything when
# this script itself was started with SIGINT ignored, as a background job or by nohup:
# env resets it before the command starts), stdout and stderr to
# a temp log. `finish_background` waits for it, prints the log and returns its status.
# When the calling shell exits first (a failure, Ctrl-C, SIGTERM), the group gets SIGINT
# (pytest then tears its fixtures down, stopping the servers its tests started), and
# SIGKILL if it is still there WEIR_BACKGROUND_GRACE_S (30) seconds later. One at a time.
start_background() {
  _background_log=$(mktemp "${TMPDIR:-/tmp}/weir-background.XXXXXX")
  on_exit _stop_background
  set -m
  env --default-signal=INT "$@" >"$_background_log" 2>&1 &
  _background_pid=$!
  set +m
}

finish_background() {
  local status=0
  wait "$_background_pid" || status=$?
  _background_pid=""
  cat "$_background_log"
  rm -f "$_background_log"
  return "$status"
}

_stop_background() {
  if [ -n "${_background_pid:-}" ] && kill -INT -- "-$_background_pid" 2>/dev/null; then
    local waited=0
    while _running "$_background_pid" \
          && [ "$waited" -lt "$((${WEIR_BACKGROUND_GRACE_S:-30} * 10))" ]; do
      sleep 0.1
      waited=$((waited + 1))
    done
    kill -KILL -- "-$_background_pid" 2>/dev/null || true
    wait "$_background_pid" 2>/dev/null || true
  fi
  _background_pid=""
  rm -f "${_background_log:-}"
}

# Exit 0 when the process $1 exists and is not a zombie (Linux's /proc).
_running() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ]
}

# The run's JVM services, started once for every pytest process of the test command (the
# xdist workers and the PostgreSQL pass) and stopped when the script exits: a
# MiniDFSCluster (scripts/hdfs.sh) unless WEIR_TEST_HDFS_URL names an HDFS, a Spark
# standalone master and worker (scripts/spark_cluster.sh) unless WEIR_TEST_SPARK_MASTER
# names a cluster, and a Kafka broker (scripts/kafka.sh) unless WEIR_TEST_KAFKA_BOOTSTRAP
# names one. They start at once (each takes 10-50 s, mostly waiting); one failing stops
# the script with its log's tail, before any test runs.
use_test_jvm_services() {
  local hdfs_dir="" spark_dir="" kafka_dir="" hdfs_pid="" spark_pid="" kafka_pid=""
  if [ -z "${WEIR_TEST_KAFKA_BOOTSTRAP:-}" ]; then
    kafka_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-test-kafka.XXXXXX")
    _test_kafka_dir=$kafka_dir
    on_exit _stop_test_kafka
    WEIR_KAFKA_DIR=$kafka_dir scripts/kafka.sh start >"$kafka_dir/start.out" 2>&1 &
    kafka_pid=$!
  fi
  if [ -z "${WEIR_TEST_HDFS_URL:-}" ]; then
    hdfs_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-test-hdfs.XXXXXX")
    _test_hdfs_dir=$hdfs_dir
    on_exit _stop_test_hdfs
    WEIR_HDFS_DIR=$hdfs_dir scripts/hdfs.sh start >"$hdfs_dir/start.out" 2>&1 &
    hdfs_pid=$!
  fi
  if [ -z "${WEIR_TEST_SPARK_MASTER:-}" ]; then
    spark_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-test-spark.XXXXXX")
    _test_spark_dir=$spark_dir
    on_exit _stop_test_spark
    # room for every pytest process's session (tests/spark/conftest.py: 2 cores, 768m
    # each) and the cluster tests' jobs beside them; cores are slots, not CPUs
    WEIR_SPARK_DIR=$spark_dir WEIR_PYTHON=${root:-$PWD}/.venv/bin/python \
      scripts/spark_cluster.sh start --cores 8 --memory 6g >"$spark_dir/start.out" 2>&1 &
    spark_pid=$!
  fi
  # the class-data-sharing archive of Spark's classes (scripts/spark_cds.py), made
  # meanwhile when missing: every Spark JVM of the run (drivers, the cluster's executors)
  # starts on it
  .venv/bin/python scripts/spark_cds.py >"${TMPDIR:-/tmp}/weir-spark-cds.$$.out" 2>&1 &
  local cds_pid=$!
  if [ -n "$hdfs_pid" ]; then
    wait "$hdfs_pid" || _service_failed "HDFS (scripts/hdfs.sh start)" "$hdfs_dir/start.out"
    export WEIR_TEST_HDFS_URL; WEIR_TEST_HDFS_URL=$(tail -n 1 "$hdfs_dir/start.out")
  fi
  if [ -n "$kafka_pid" ]; then
    wait "$kafka_pid" || _service_failed "Kafka (scripts/kafka.sh start)" "$kafka_dir/start.out"
    export WEIR_TEST_KAFKA_BOOTSTRAP WEIR_TEST_KAFKA_SASL_BOOTSTRAP \
      WEIR_TEST_KAFKA_SSL_BOOTSTRAP WEIR_TEST_KAFKA_TLS_DIR=$kafka_dir/tls
    WEIR_TEST_KAFKA_BOOTSTRAP=$(tail -n 1 "$kafka_dir/start.out")
    WEIR_TEST_KAFKA_SASL_BOOTSTRAP=$(cat "$kafka_dir/sasl_bootstrap")
    WEIR_TEST_KAFKA_SSL_BOOTSTRAP=$(cat "$kafka_dir/ssl_bootstrap")
  fi
  if [ -n "$spark_pid" ]; then
    wait "$spark_pid" \
      || _service_failed "the Spark cluster (scripts/spark_cluster.sh start)" "$spark_dir/start.out"
    export WEIR_TEST_SPARK_MASTER WEIR_TEST_SPARK_DIR=$spark_dir
    WEIR_TEST_SPARK_MASTER=$(tail -n 1 "$spark_dir/start.out")
  fi
  local cds_out="${TMPDIR:-/tmp}/weir-spark-cds.$$.out"
  if wait "$cds_pid"; then
    use_spark_cds "$(tail -n 1 "$cds_out")"
  else  # a speed-up only: the tests run as well (slower) without it
    tail -n 20 "$cds_out" >&2
    echo "weir: WARNING: no class-data-sharing archive (scripts/spark_cds.py failed);" \
      "the Spark JVMs start without it" >&2
  fi
  rm -f "$cds_out"
}

# Start every Spark JVM from here on (spark-submit adds SPARK_SUBMIT_OPTS to the driver's
# java command; tests/spark pass WEIR_SPARK_JAVA_OPTS to their cluster executors) on the
# class-data-sharing archive $1; the JDK ignores one that does not match, quietly.
use_spark_cds() {
  export WEIR_SPARK_JAVA_OPTS="-XX:SharedArchiveFile=$1 -Xlog:cds*=off"
  export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }$WEIR_SPARK_JAVA_OPTS"
}

_service_failed() {
  tail -n 40 "$2" >&2
  echo "weir: $1 failed: the tests cannot run without it" >&2
  exit 1
}

_stop_test_hdfs() {
  WEIR_HDFS_DIR=$_test_hdfs_dir scripts/hdfs.sh stop >/dev/null 2>&1 || true
  rm -rf "$_test_hdfs_dir"
}

_stop_test_kafka() {
  WEIR_KAFKA_DIR=$_test_kafka_dir scripts/kafka.sh stop >/dev/null 2>&1 || true
  rm -rf "$_test_kafka_dir"
}

_stop_test_spark() {
  WEIR_SPARK_DIR=$_test_spark_dir scripts/spark_cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$_test_spark_dir"
}

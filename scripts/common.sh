# Shell helpers shared by bootstrap.sh, run.sh and test.sh (sourced, never run).
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
  # INT and TERM exit through the EXIT trap, so the private Redis goes with the shell.
  trap _stop_private_test_redis EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
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

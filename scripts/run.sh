#!/usr/bin/env bash
# Run the whole appliance on embedded defaults (scripts/supervisor.py says what runs):
#   scripts/run.sh               in the foreground, showing every process's log; Ctrl-C stops it
#   scripts/run.sh --background  in the background; returns once it answers on /health
#   scripts/run.sh --stop        stops the one running (in the background or the foreground)
#   scripts/run.sh --status      exit 0 when running, 3 when not
# Data, logs and the pid file live in WEIR_VAR_DIR (default: var/ in the repo).
# Clients reach gunicorn through nginx on WEIR_BIND (appliance/front.py; WEIR_FRONT=none: not).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
export WEIR_VAR_DIR=${WEIR_VAR_DIR:-$root/var}
. scripts/common.sh  # ensure_redis_server, ensure_nginx

# Starting: the supervisor starts a private redis-server when nothing answers at REDIS_URL
# (on this machine); install Debian's package for that when the binary is missing. nginx
# is the front before gunicorn (unless WEIR_FRONT=none): installed when missing too.
case "${1:-}" in
  --stop | --status | -h | --help) ;;
  *)
    if [ "${WEIR_FRONT:-nginx}" = nginx ]; then
      ensure_nginx
    fi
    if ! command -v redis-server >/dev/null &&
       .venv/bin/python -c 'import os, sys
from scripts.supervisor import private_redis_needed
sys.exit(0 if private_redis_needed(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0") else 1)'
    then
      ensure_redis_server
    fi
    ;;
esac
exec .venv/bin/python -m scripts.supervisor "$@"

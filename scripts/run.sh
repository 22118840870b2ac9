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
. scripts/common.sh  # ensure_redis_server, ensure_nginx

# Starting: the supervisor starts a private redis-server when nothing answers at REDIS_URL
# (on this machine), and nginx as the front before gunicorn (unless WEIR_FRONT=none); it
# names the Debian packages that takes and this machine lacks, installed here first. The
# settings and their defaults are the supervisor's (appliance/env.py), read once there.
case "${1:-}" in
  --stop | --status | -h | --help) ;;
  *)
    for package in $(.venv/bin/python -m scripts.supervisor --missing-packages); do
      case "$package" in
        nginx) ensure_nginx ;;
        redis-server) ensure_redis_server ;;
      esac
    done
    ;;
esac
exec .venv/bin/python -m scripts.supervisor "$@"

#!/usr/bin/env bash
# Run the appliance on embedded defaults: set up the database, then serve.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
export WEIR_VAR_DIR=${WEIR_VAR_DIR:-$root/var}
mkdir -p "$WEIR_VAR_DIR"
.venv/bin/python manage.py migrate --noinput
bind=${WEIR_BIND:-127.0.0.1:8000}
echo "Weir is starting on http://$bind/ (health: http://$bind/health) — Ctrl-C stops it"
exec .venv/bin/gunicorn appliance.wsgi --bind "$bind" --workers "${WEIR_WEB_WORKERS:-2}" \
  --access-logfile - --error-logfile -

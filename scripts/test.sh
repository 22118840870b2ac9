#!/usr/bin/env bash
# Run every test: lint, type check, the default pytest suite (SQLite; the browser tests
# in tests/e2e use Debian's chromium, installed here when missing), then the
# appliance tests again on PostgreSQL (WEIR_TEST_POSTGRES_URL, default the local
# server on 127.0.0.1:5432; skipped with a message when none answers).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the many-trial runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
# The browser tests (tests/e2e) drive Debian's Chromium through Playwright.
if [ ! -x "${WEIR_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "test: installing Debian's chromium for the browser tests"
  as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
pg=${WEIR_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/test}
if .venv/bin/python -c "import psycopg, sys; psycopg.connect(sys.argv[1], connect_timeout=3).close()" "$pg" 2>/dev/null; then
  echo "== appliance tests on PostgreSQL ($pg)"
  DATABASE_URL=$pg .venv/bin/python -m pytest tests/appliance -q
else
  echo "== no PostgreSQL answers at $pg: appliance tests ran on SQLite only"
fi

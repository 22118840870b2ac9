#!/usr/bin/env bash
# Run every test: lint, type check, the default pytest suite (SQLite), then the
# appliance tests again on PostgreSQL (WEIR_TEST_POSTGRES_URL, default the local
# server on 127.0.0.1:5432; skipped with a message when none answers).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the many-trial runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
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

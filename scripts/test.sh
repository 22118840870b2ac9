#!/usr/bin/env bash
# Run every test: lint, type check, the default pytest suite (SQLite; the browser tests
# in tests/e2e use Debian's chromium, installed here when missing), then the
# appliance tests again on PostgreSQL (WEIR_TEST_POSTGRES_URL, default the local
# server on 127.0.0.1:5432; skipped with a message when none answers).
# Redis: the tests use the one at WEIR_TEST_REDIS_URL (default redis://127.0.0.1:6379)
# when it answers, else a private redis-server (free port, no persistence) stopped when
# this script exits; Debian's redis-server is installed when missing (scripts/common.sh).
# JVM artifacts (Kafka's tools, for tests/engine/test_kafka_tools.py) are fetched first by
# scripts/jvm_deps.py into var/jvm/ (pinned, sha256-checked; the cache is used offline
# later); it stops here, naming what is missing, when Maven Central cannot be reached,
# unless WEIR_KAFKA_HOME names a Kafka install to use instead.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the many-trial runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
. scripts/common.sh  # apt_install, ensure_nginx, use_test_redis
command -v java >/dev/null || apt_install openjdk-17-jre-headless
if [ -z "${WEIR_KAFKA_HOME:-}" ]; then
  command -v mvn >/dev/null || apt_install maven
  kafka_libs=$(.venv/bin/python scripts/jvm_deps.py kafka-tools)
  echo "== Kafka's tools from $kafka_libs"
fi
# The browser tests (tests/e2e) drive Debian's Chromium through Playwright.
if [ ! -x "${WEIR_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "test: installing Debian's chromium for the browser tests"
  apt_install chromium
fi
# The front's tests (tests/appliance/test_front.py, test_slow_clients.py) run Debian's nginx.
ensure_nginx
use_test_redis
echo "== tests use the Redis at $WEIR_TEST_REDIS_URL"
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

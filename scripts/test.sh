#!/usr/bin/env bash
# Run every test: lint, type check, the default pytest suite (SQLite; the browser tests
# in tests/e2e use Debian's chromium, installed here when missing) on WEIR_TEST_WORKERS
# (default 2) pytest-xdist workers (tests/conftest.py says how their work is split: by
# file, longest first), and beside it (or after it: WEIR_TEST_PASSES=after), in a pytest
# process of its own, the appliance tests again on PostgreSQL: the one at WEIR_TEST_POSTGRES_URL
# when it answers, else a private server (Debian's postgresql, installed when missing;
# temp data dir, free port) stopped when this script exits. Never skipped: when
# PostgreSQL cannot start, the script fails saying why, before any test runs. The script
# fails when either pass failed.
# HDFS, Spark and Kafka: one MiniDFSCluster, one Spark standalone cluster (master + worker
# JVMs) and one Kafka broker (KRaft, one node) serve every pytest process of the run,
# started here at once and stopped on exit, unless WEIR_TEST_HDFS_URL /
# WEIR_TEST_SPARK_MASTER / WEIR_TEST_KAFKA_BOOTSTRAP name outside ones (scripts/common.sh's
# use_test_jvm_services; HDFS's jars are fetched first, like Kafka's), and every Spark JVM
# of the run starts from a class-data-sharing archive of Spark's classes (spark_cds.py).
# Redis: the tests use the one at WEIR_TEST_REDIS_URL (default redis://127.0.0.1:6379)
# when it answers, else a private redis-server (free port, no persistence) stopped when
# this script exits; Debian's redis-server is installed when missing (scripts/common.sh).
# JVM artifacts (Kafka's tools, for tests/engine/test_kafka_tools.py) are fetched first by
# scripts/jvm_deps.py into var/jvm/ (pinned, sha256-checked; the cache is used offline
# later); it stops here, naming what is missing, when Maven Central cannot be reached,
# unless WEIR_KAFKA_HOME names a Kafka install to use instead.
# Extra arguments go to the main pass's pytest (e.g. `scripts/test.sh -m slow` for the
# many-trial runs; `-n 0` runs it in one process).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
# Bootstrap compiles the record batch codec (installing a compiler when it can): here its
# tests must run, not be skipped as they are where it was not built (tests/engine/codec_helpers.py).
export WEIR_REQUIRE_COMPILED_CODEC=1
. scripts/common.sh  # apt_install, ensure_nginx, use_test_redis/postgres/jvm_services
command -v java >/dev/null || apt_install openjdk-17-jre-headless
if [ -z "${WEIR_KAFKA_HOME:-}" ]; then
  command -v mvn >/dev/null || apt_install maven
  kafka_libs=$(.venv/bin/python scripts/jvm_deps.py kafka-tools)
  echo "== Kafka's tools from $kafka_libs"
fi
# HDFS's jars and a JDK up front: the run's MiniDFSCluster (tests/conftest.py, scripts/hdfs.sh)
command -v javac >/dev/null || apt_install openjdk-17-jdk-headless; command -v mvn >/dev/null || apt_install maven
echo "== HDFS's jars in $(.venv/bin/python scripts/jvm_deps.py hdfs | tail -n 1)"
# The browser tests (tests/e2e) drive Debian's Chromium through Playwright.
if [ ! -x "${WEIR_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "test: installing Debian's chromium for the browser tests"
  apt_install chromium
fi
# The front's tests (tests/appliance/test_front.py, test_slow_clients.py) run Debian's nginx.
ensure_nginx
use_test_redis
echo "== tests use the Redis at $WEIR_TEST_REDIS_URL"
use_test_postgres
echo "== the PostgreSQL pass uses $WEIR_TEST_POSTGRES_URL"
use_test_jvm_services
echo "== tests use the HDFS at $WEIR_TEST_HDFS_URL, the Spark cluster at $WEIR_TEST_SPARK_MASTER" \
  "and the Kafka broker at $WEIR_TEST_KAFKA_BOOTSTRAP"
# The PostgreSQL pass runs beside the main pass (WEIR_TEST_PASSES=beside, the default: its
# output held and printed after the main pass's; ~5 min shorter on 2 cores) or after it
# (=after: one pytest process at a time, for a machine with less room).
started=$SECONDS
# Each pass ends with its 25 slowest tests (setup and teardown apart): where the budget goes.
# It leaves out the tests marked own_sqlite: their appliance runs in processes of their own
# on a SQLite database of their own, so on this pass they would only run again unchanged.
postgres_pass=(env DATABASE_URL="$WEIR_TEST_POSTGRES_URL"
               .venv/bin/python -m pytest tests/appliance -q -p no:cacheprovider --durations=25
               -m "not slow and not own_sqlite")
beside=${WEIR_TEST_PASSES:-beside}
if [ "$beside" = beside ]; then start_background "${postgres_pass[@]}"; fi
.venv/bin/ruff check .
.venv/bin/mypy
workers=(-n "${WEIR_TEST_WORKERS:-2}")  # a later -n in "$@" wins; -p no:xdist has no -n
for arg in "$@"; do
  if [ "$arg" = no:xdist ] || [ "$arg" = -pno:xdist ]; then workers=(); fi
done
main=0
# The tests marked postgres_pass run in the PostgreSQL pass only (a later -m in "$@" wins).
.venv/bin/python -m pytest "${workers[@]}" --durations=25 -m "not slow and not postgres_pass" \
  "$@" || main=$?
echo "== appliance tests on PostgreSQL ($WEIR_TEST_POSTGRES_URL), run $beside the main pass:"
postgres=0
if [ "$beside" = beside ]; then
  finish_background || postgres=$?
else
  "${postgres_pass[@]}" || postgres=$?
fi
echo "== both passes took $((SECONDS - started)) s"
if [ "$main" -ne 0 ]; then exit "$main"; fi
exit "$postgres"

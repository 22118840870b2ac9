#!/usr/bin/env bash
# Run every test: lint, type check, then the default pytest suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the many-trial runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"

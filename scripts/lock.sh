#!/usr/bin/env bash
# Compile the Python locks from pyproject.toml with uv: requirements/runtime.txt (the
# appliance: the Dockerfile installs it) and requirements/test.txt (runtime + the test
# extra: scripts/bootstrap.sh installs it into .venv). Every package pinned with its
# hashes, for Python 3.11 on Linux, inside requirements/constraints.txt. runtime.txt is
# compiled under test.txt, so the appliance runs on exactly the versions the tests ran.
# Needs PyPI. Usage: scripts/lock.sh [--upgrade | --upgrade-package NAME ...]
# (no argument: keep every current pin that still fits; add or change only what must).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

uv=${UV:-}
if [ -z "$uv" ]; then
  if command -v uv >/dev/null; then uv=$(command -v uv)
  else
    # uv itself, pinned, in a throwaway venv under var/ (gitignored).
    if [ ! -x var/lock-tools/bin/uv ]; then
      python3.11 -m venv var/lock-tools
      var/lock-tools/bin/pip install -q "uv==0.13.9"
    fi
    uv=var/lock-tools/bin/uv
  fi
fi

compile() {  # compile OUTPUT [uv pip compile arguments...]
  local out=$1; shift
  "$uv" pip compile -q pyproject.toml requirements/build.in \
    -c requirements/constraints.txt --generate-hashes \
    --python-version 3.11 --python-platform linux \
    --custom-compile-command "scripts/lock.sh" -o "$out" "$@"
  # The fingerprint tests/test_lockfile.py checks against pyproject.toml.
  sed -i "2a # inputs-sha256: $(python3.11 scripts/lock_inputs.py)" "$out"
}

compile requirements/test.txt --extra test "$@"
compile requirements/runtime.txt -c requirements/test.txt
echo "lock: wrote requirements/runtime.txt and requirements/test.txt"

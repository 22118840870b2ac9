#!/usr/bin/env bash
# Make .venv ready on a fresh Debian machine with Python 3.11: apt packages when
# missing, then the project and its pinned dependencies. Cheap when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/common.sh  # as_root, apt_install

python=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    python=$(command -v "$candidate"); break
  fi
done
if [ -z "$python" ]; then
  apt_install python3 python3-venv python3-dev
  python=$(command -v python3)
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$python" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt_install python3-venv
    "$python" -m venv .venv
  fi
fi

stamp=.venv/.weir-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi

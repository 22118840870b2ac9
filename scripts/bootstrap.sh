#!/usr/bin/env bash
# Make .venv ready on a fresh Debian machine with Python 3.11: apt packages when
# missing, then every Python package from the hash-checked lock requirements/test.txt
# (runtime + test extra, compiled by scripts/lock.sh), then the project itself (editable,
# --no-deps). Re-syncs when the lock or pyproject.toml changed; cheap when nothing did.
# Usage: scripts/bootstrap.sh [VENV]  (default .venv; another path for a trial install).
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

venv=${1:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    apt_install python3-venv
    "$python" -m venv "$venv"
  fi
fi

# The engine's C extension (the record batch codec, channel_engine/log/_batch_codec.c)
# needs the C compiler Python builds extensions with (sysconfig's CC) and Python's headers.
# It is optional: where they cannot be had, the install goes on and the engine uses its
# pure Python codec (slower), saying so.
can_compile() {
  "$venv/bin/python" - <<'PY'
import os, shlex, shutil, sysconfig
cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
print("compiler" if shutil.which(cc) and os.path.exists(headers) else "no-compiler")
PY
}
codec_built() {
  local module
  for module in _batch_codec _statx; do
    if compgen -G "channel_engine/log/$module*.so" >/dev/null; then echo "$module built"
    else echo "$module missing"; fi
  done
}

# The stamp holds the hash of what was installed: the lock, pyproject.toml, the C sources
# the install compiles, whether their extension is built and whether a compiler is here.
# When any changes, the venv is synced again: a changed .c is rebuilt, a deleted build
# redone, and a venv synced where no compiler could be had is built once one is installed;
# where none can be, later runs do not try again (no apt-get each run). When nothing
# changed, this costs one sha256sum and a Python start.
lock=requirements/test.txt
stamp=$venv/.weir-installed
installed() {
  { cat "$lock" pyproject.toml channel_engine/log/*.c; codec_built; can_compile; } |
    sha256sum | cut -d' ' -f1
}
want=$(installed)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: syncing $venv with $lock"
  rm -f "$stamp"
  pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install --require-hashes --no-deps -r "$lock"
  # Packages the lock no longer names (dropped or renamed dependencies) go, so the venv
  # holds exactly the lock, plus the project and pip itself.
  extra=$("$venv/bin/python" scripts/lock_inputs.py --unlocked "$lock")
  if [ -n "$extra" ]; then "${pip[@]}" uninstall -y $extra; fi
  if [ "$(can_compile)" = no-compiler ]; then
    apt_install gcc python3-dev || true  # a failure is the warning below
  fi
  # The project itself, editable, built by the locked setuptools (nothing unhashed fetched).
  "${pip[@]}" install --no-deps --no-build-isolation -e .
  if [ "$(codec_built)" = missing ]; then
    echo "bootstrap: warning: the record batch codec was not compiled (no C compiler or" \
         "Python headers): the engine runs its pure Python codec, slower" >&2
  fi
  installed > "$stamp"  # as it is now: built or not, compiler or not
fi

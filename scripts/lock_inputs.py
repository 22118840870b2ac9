"""The fingerprint of what the Python locks are compiled from (run by scripts/lock.sh).

The locks (requirements/runtime.txt, requirements/test.txt) carry a line
``# inputs-sha256: <hex>``: the SHA-256 of pyproject.toml's requires-python, direct
dependencies and extras, the build backend's requirement (requirements/build.in) and the
constraints (requirements/constraints.txt), comments and blank lines left out. An edit to
any of them changes the fingerprint, so tests/test_lockfile.py fails until the locks are
compiled again; edits elsewhere in pyproject.toml (tool settings, comments) do not.
Prints the fingerprint; with ``--unlocked LOCK``, the installed distributions LOCK does
not name (what scripts/bootstrap.sh uninstalls to sync a venv). Standard library only
(Python 3.11+): it runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from importlib.metadata import distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INPUT_FILES = ("requirements/build.in", "requirements/constraints.txt")
# Kept in a synced venv although no lock names them: the installer, and the project.
ALWAYS_KEPT = frozenset({"pip", "weir"})
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def canonical_name(name: str) -> str:
    """A distribution name normalised as PEP 503 does (``Py_YAML`` -> ``py-yaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_pins(lock: Path) -> dict[str, str]:
    """Canonical name -> pinned version of every package a lock file pins."""
    return {canonical_name(m[1]): m[2] for m in _PIN.finditer(lock.read_text())}


def lock_header_sha256(lock: Path) -> str | None:
    """The ``# inputs-sha256:`` a lock was compiled from, or None when it has none."""
    found = re.search(r"^# inputs-sha256: ([0-9a-f]{64})$", lock.read_text(), re.MULTILINE)
    return found[1] if found else None


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file, without comments and blanks."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def lock_inputs(root: Path = ROOT) -> dict[str, object]:
    """What the locks depend on, as plain data."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        **{name: requirement_lines(root / name) for name in INPUT_FILES},
    }


def inputs_sha256(root: Path = ROOT) -> str:
    """The fingerprint written into the locks' headers."""
    canonical = json.dumps(lock_inputs(root), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def unlocked_installed(lock: Path) -> list[str]:
    """Installed distributions (this interpreter's) that the lock does not name."""
    installed = {canonical_name(d.metadata["Name"]) for d in distributions()}
    return sorted(installed - set(locked_pins(lock)) - ALWAYS_KEPT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--unlocked"]:
        print(" ".join(unlocked_installed(Path(sys.argv[2]))))
    else:
        print(inputs_sha256())

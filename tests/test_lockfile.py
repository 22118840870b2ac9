"""The Python locks (requirements/*.txt) agree with pyproject.toml.

A static check, no network: every direct dependency (and the test extra's) is pinned in
the lock at a version its pyproject requirement allows, with the extras it asks for
locked too; every package carries hashes; the lock's ``# inputs-sha256:`` header matches
pyproject.toml's dependencies, build.in and constraints.txt as they are now; the
constraints hold; runtime.txt pins nothing test.txt pins differently. When one fails,
compile the locks again with scripts/lock.sh (README, "Reproducible installs").
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "requirements" / "runtime.txt"
TEST = ROOT / "requirements" / "test.txt"


def _load_lock_inputs() -> ModuleType:
    path = ROOT / "scripts" / "lock_inputs.py"
    spec = importlib.util.spec_from_file_location("lock_inputs", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lock_inputs", module)
    spec.loader.exec_module(module)
    return module


lock_inputs = _load_lock_inputs()


def _project(root: Path = ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


def _direct(root: Path = ROOT, extra: str | None = None) -> list[Requirement]:
    project = _project(root)
    wanted = project["dependencies"] + (project["optional-dependencies"][extra] if extra else [])
    return [Requirement(line) for line in wanted]


def _disagreements(requirements: list[Requirement], lock: Path) -> list[str]:
    """Each direct requirement the lock misses or pins outside its range."""
    pins = lock_inputs.locked_pins(lock)
    problems = []
    for req in requirements:
        name = lock_inputs.canonical_name(req.name)
        if name not in pins:
            problems.append(f"{req} is not in {lock.name}")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req} but {lock.name} pins {name}=={pins[name]}")
    return problems


def _extras_requirements(requirements: list[Requirement]) -> list[Requirement]:
    """What the extras of direct requirements bring (e.g. celery[redis] -> redis)."""
    from importlib.metadata import PackageNotFoundError, distribution

    brought = []
    for req in requirements:
        for extra in req.extras:
            try:
                metadata = distribution(req.name).metadata
            except PackageNotFoundError:  # pragma: no cover - only in a half-built venv
                pytest.fail(f"{req.name} is not installed: run scripts/bootstrap.sh")
            for line in metadata.get_all("Requires-Dist") or []:
                sub = Requirement(line)
                if sub.marker and sub.marker.evaluate({"extra": extra}) and (
                    not sub.marker.evaluate({"extra": ""})
                ):
                    sub.marker = None
                    brought.append(sub)
    return brought


@pytest.mark.parametrize(("lock", "extra"), [(RUNTIME, None), (TEST, "test")])
def test_it_pins_every_direct_dependency_inside_its_pyproject_range(lock: Path, extra):
    assert _disagreements(_direct(extra=extra), lock) == []


@pytest.mark.parametrize(("lock", "extra"), [(RUNTIME, None), (TEST, "test")])
def test_it_locks_what_the_extras_of_direct_dependencies_bring(lock: Path, extra):
    requirements = _direct(extra=extra)
    assert any(req.extras for req in requirements)
    assert _disagreements(_extras_requirements(requirements), lock) == []


@pytest.mark.parametrize("lock", [RUNTIME, TEST])
def test_it_was_compiled_from_the_current_pyproject(lock: Path):
    header = lock_inputs.lock_header_sha256(lock)
    assert header is not None, f"{lock.name} has no '# inputs-sha256:' line"
    assert header == lock_inputs.inputs_sha256(), (
        f"{lock.name} was compiled from other inputs than pyproject.toml, "
        "requirements/build.in and requirements/constraints.txt: run scripts/lock.sh"
    )


def test_it_notices_a_pin_changed_in_pyproject_but_not_in_the_lock(tmp_path: Path):
    for name in ("pyproject.toml", "requirements/build.in", "requirements/constraints.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"Django==5.2.19"', '"Django==5.2.18"'))
    assert lock_inputs.inputs_sha256(tmp_path) != lock_inputs.lock_header_sha256(TEST)
    assert _disagreements(_direct(tmp_path), TEST) == [
        "Django==5.2.18 but test.txt pins django==5.2.19"
    ]


def test_it_ignores_pyproject_edits_outside_the_dependencies(tmp_path: Path):
    for name in ("pyproject.toml", "requirements/build.in", "requirements/constraints.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a comment\n[tool.other]\nx = 1\n")
    assert lock_inputs.inputs_sha256(tmp_path) == lock_inputs.inputs_sha256()


@pytest.mark.parametrize("lock", [RUNTIME, TEST])
def test_it_keeps_every_locked_package_inside_the_constraints(lock: Path):
    pins = lock_inputs.locked_pins(lock)
    constraints = lock_inputs.requirement_lines(ROOT / "requirements" / "constraints.txt")
    assert constraints, "requirements/constraints.txt names no constraint"
    for line in constraints:
        req = Requirement(line)
        name = lock_inputs.canonical_name(req.name)
        assert name not in pins or req.specifier.contains(pins[name]), (lock.name, line)
    assert pins["pandas"].split(".")[0] == "2"  # pyspark 4.3.0 warns on pandas 3


@pytest.mark.parametrize("lock", [RUNTIME, TEST])
def test_it_pins_every_package_with_hashes(lock: Path):
    text = lock.read_text()
    body = text[text.index("\n", text.index("inputs-sha256")) + 1 :]
    blocks = re.split(r"\n(?=[A-Za-z0-9])", body)
    unhashed = [block.split()[0] for block in blocks if "--hash=sha256:" not in block]
    assert unhashed == []
    assert len(blocks) == len(lock_inputs.locked_pins(lock))


def test_it_runs_the_appliance_on_the_versions_the_tests_ran():
    runtime, test = lock_inputs.locked_pins(RUNTIME), lock_inputs.locked_pins(TEST)
    assert {name: (version, test.get(name)) for name, version in runtime.items()
            if test.get(name) != version} == {}

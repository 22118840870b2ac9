#!/usr/bin/env python3
"""Fetch a pinned set of JVM artifacts from Maven Central into the gitignored cache.

A *set* is a directory scripts/jvm/<set>/ holding
  pom.xml     the direct artifacts (group:artifact:version), packaging "pom";
  sha256.txt  the sha256 of every jar of the set, direct and transitive
              (`sha256sum` format: "<hex>  <file name>").
`scripts/jvm_deps.py SET...` makes var/jvm/<SET>/lib/ hold exactly those jars and prints
that directory, one line per set (use it as `java -cp 'DIR/*'`). Maven's own local
repository for these fetches is var/jvm/m2 (not ~/.m2).

Later runs use the cache and touch no network: when lib/ already holds exactly the
pinned jars with the pinned hashes, Maven is not run. Otherwise Maven
(`dependency:copy-dependencies`, runtime scope) fetches the set into a fresh directory,
every jar is checked against sha256.txt, and only then does it replace lib/.

Failure (exit status 1, one message on stderr naming the set and its artifacts): Maven
missing, the repository unreachable or an artifact missing (the tail of Maven's log is
shown, the whole log kept in var/jvm/<set>/fetch.log), a jar whose hash is not the
pinned one, or a jar more or fewer than pinned.

Adding a set: write scripts/jvm/<set>/pom.xml, run `scripts/jvm_deps.py --pin <set>`
once (it fetches and writes sha256.txt from what it got; review and commit it).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = ROOT / "scripts" / "jvm"
CACHE = Path(os.environ.get("WEIR_JVM_CACHE", ROOT / "var" / "jvm"))
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class FetchError(Exception):
    """A set could not be fetched or did not match its pins."""


def direct_artifacts(set_name: str) -> list[str]:
    """The set's direct artifacts as group:artifact:version, from its pom."""
    pom = ET.parse(SETS / set_name / "pom.xml").getroot()
    props = {p.tag.split("}")[1]: (p.text or "")
             for p in pom.findall("m:properties/*", POM_NS)}
    out = []
    for dep in pom.findall("m:dependencies/m:dependency", POM_NS):
        fields = [dep.findtext(f"m:{f}", "", POM_NS) for f in ("groupId", "artifactId", "version")]
        for name, value in props.items():
            fields = [f.replace("${" + name + "}", value) for f in fields]
        out.append(":".join(fields))
    return out


def read_pins(set_name: str) -> dict[str, str]:
    """File name -> sha256 as pinned in scripts/jvm/<set>/sha256.txt."""
    pins = {}
    for line in (SETS / set_name / "sha256.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(None, 1)
            pins[name.strip()] = digest
    return pins


def digests(directory: Path) -> dict[str, str]:
    """File name -> sha256 of every jar in a directory."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.glob("*.jar"))}


def mismatch(found: dict[str, str], pins: dict[str, str]) -> str | None:
    """Why a fetched directory is not the pinned set, or None when it is."""
    problems = [f"missing {n}" for n in sorted(set(pins) - set(found))]
    problems += [f"unpinned {n}" for n in sorted(set(found) - set(pins))]
    problems += [f"sha256 of {n} is {found[n]}, pinned {pins[n]}"
                 for n in sorted(set(found) & set(pins)) if found[n] != pins[n]]
    return "; ".join(problems) or None


def run_maven(set_name: str, target: Path) -> None:
    """Copy the set's runtime dependencies into target with Maven, or raise FetchError."""
    what = f"set '{set_name}' ({', '.join(direct_artifacts(set_name))})"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError(f"cannot fetch {what}: `mvn` is not installed (apt-get install maven)")
    log = CACHE / set_name / "fetch.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [mvn, "-B", "-q", "-Dstyle.color=never", f"-Dmaven.repo.local={CACHE / 'm2'}",
               "-f", str(SETS / set_name / "pom.xml"), "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={target}"]
    with log.open("w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        raise FetchError(f"cannot fetch {what} from Maven Central (is it reachable?); "
                         f"Maven exited {result.returncode}, full log {log}:\n{tail}")


def ensure(set_name: str) -> Path:
    """Make var/jvm/<set>/lib hold exactly the pinned jars; return it."""
    if not (SETS / set_name / "pom.xml").is_file():
        known = ", ".join(sorted(p.name for p in SETS.iterdir() if (p / "pom.xml").is_file()))
        raise FetchError(f"no JVM artifact set '{set_name}' (known: {known})")
    pins = read_pins(set_name)
    lib = CACHE / set_name / "lib"
    if lib.is_dir() and mismatch(digests(lib), pins) is None:
        return lib
    with tempfile.TemporaryDirectory(dir=CACHE.parent if CACHE.exists() else None) as tmp:
        fetched = Path(tmp) / "lib"
        run_maven(set_name, fetched)
        problem = mismatch(digests(fetched), pins)
        if problem:
            raise FetchError(f"set '{set_name}': what Maven fetched is not what "
                             f"scripts/jvm/{set_name}/sha256.txt pins: {problem}")
        if lib.exists():
            shutil.rmtree(lib)
        shutil.move(str(fetched), lib)
    return lib


def pin(set_name: str) -> Path:
    """Fetch a set afresh and write its sha256.txt from what was fetched."""
    lib = CACHE / set_name / "lib"
    if lib.exists():
        shutil.rmtree(lib)
    run_maven(set_name, lib)
    lines = [f"{digest}  {name}" for name, digest in digests(lib).items()]
    (SETS / set_name / "sha256.txt").write_text("\n".join(lines) + "\n")
    return lib


def main(argv: list[str]) -> int:
    """Fetch (or with --pin, pin) each named set; print each lib directory."""
    pinning = "--pin" in argv
    names = [a for a in argv if a != "--pin"]
    if not names:
        print(__doc__, file=sys.stderr)
        return 2
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            print(pin(name) if pinning else ensure(name))
    except FetchError as error:
        print(f"jvm_deps: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

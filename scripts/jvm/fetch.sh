#!/usr/bin/env bash
# Fetch one pinned set of JVM artifacts: scripts/jvm/fetch.sh NAME
#
# scripts/jvm/NAME/pom.xml pins the artifacts (group:artifact:version); Maven copies them
# and what they need into the gitignored cache var/jvm/NAME/lib (its local repository is
# var/jvm/m2, so nothing lands in ~/.m2). scripts/jvm/NAME/SHA256SUMS pins the checksum
# of the top-level jars: a mismatch removes the cache and fails. Later runs use the cache
# (a stamp records the pom it was made from). Prints the lib dir as its last line.
# Exit 1 with a message naming what is missing when Maven Central cannot be reached.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
name=${1:?usage: scripts/jvm/fetch.sh NAME}
spec=$root/scripts/jvm/$name
cache=$root/var/jvm/$name
lib=$cache/lib
[ -f "$spec/pom.xml" ] || { echo "weir: no pinned JVM artifact set $spec/pom.xml" >&2; exit 1; }

stamp=$(sha256sum "$spec/pom.xml" "$spec/SHA256SUMS" | sha256sum | cut -c1-64)
if [ -f "$cache/stamp" ] && [ "$(cat "$cache/stamp")" = "$stamp" ] \
   && (cd "$lib" && sha256sum --quiet -c "$spec/SHA256SUMS" >/dev/null 2>&1); then
  echo "$lib"
  exit 0
fi

command -v mvn >/dev/null || { echo "weir: Maven (mvn) is needed to fetch $name's JVM artifacts; apt-get install maven" >&2; exit 1; }
rm -rf "$lib" "$cache/stamp"
mkdir -p "$lib"
wanted=$(sed -n 's/.*<artifactId>\(.*\)<\/artifactId>.*/\1/p' "$spec/pom.xml" | tail -n +2 | tr '\n' ' ')
echo "weir: fetching pinned JVM artifacts for $name from Maven Central: $wanted" >&2
if ! mvn -q -B -Dmaven.repo.local="$root/var/jvm/m2" -f "$spec/pom.xml" \
     dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib" >"$cache/fetch.log" 2>&1; then
  tail -n 20 "$cache/fetch.log" >&2
  echo "weir: could not fetch $name's JVM artifacts ($wanted, versions in $spec/pom.xml) from Maven Central:" \
       "unreachable, or not served there (full log: $cache/fetch.log)" >&2
  rm -rf "$lib"
  exit 1
fi
if ! (cd "$lib" && sha256sum --quiet -c "$spec/SHA256SUMS" >&2); then
  echo "weir: $name's JVM artifacts in $lib do not match the pinned checksums in $spec/SHA256SUMS" >&2
  rm -rf "$lib"
  exit 1
fi
echo "$stamp" >"$cache/stamp"
echo "$lib"

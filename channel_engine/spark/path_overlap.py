"""Whether two export paths (Flume's time escapes, output_layout.ESCAPES) can put files in
one folder, or one's files in a folder above the other's: a reader of a folder reads the
folders below it too. One folder must never hold files of two schema versions
(file_formats.py), so both the export job (exporter.py, by its commit records) and the
appliance (appliance/export_schema.py, by its ExportRun rows) refuse a path that overlaps
one holding files of another version; both ask this module.

Paths are compared folder by folder (%Y/%m/%d/%H beside %Y/%m/%d/%H/v2 or %Y/%m/%d
overlap; v1/%Y beside v2/%Y do not): each time escape stands for the digits it writes
(%Y four, %j three, the others two), so a concrete folder (2026/11/27/14, as the files of
a commit record name it) is compared with a pattern too. A folder name with an escape
this module does not know may be any name. UNKNOWN_PATH ("") overlaps every path: what
is held where nobody knows (the appliance's rows from before the paths), or in the root
folder itself, which a reader of it reads with every folder below. folder() normalises a
path first ("./%Y", "a/../%Y" and "%Y/" name "%Y"). own_path() is the path of its own
both suggest when they refuse.

Pure functions, no I/O: safe anywhere (the appliance, the driver).
"""
from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping

from channel_engine.spark.output_layout import ESCAPES

UNKNOWN_PATH = ""  # the path of files whose folders nobody knows: it overlaps every path


def folder(path: str) -> str:
    """An export path as the folder it names ("a/", "./a" and "b/../a" name "a")."""
    # normpath keeps a leading "//" (POSIX leaves its meaning open): one folder all the same
    normal = re.sub("^/+", "/", posixpath.normpath(path or "."))
    return "" if normal in (".", "/") else normal


def _folder_shape(name: str) -> list[str | None] | None:
    """A folder name of an export path as the characters it makes, None for each digit a
    time escape writes (%Y four, %j three, the others two); None for a name of an escape
    this module does not know (it may be any name)."""
    shape: list[str | None] = []
    for match in re.finditer(r"%(.)|([^%]+)", name):
        if match.group(2) is not None:
            shape.extend(match.group(2))
        elif match.group(1) in ESCAPES:
            shape.extend([None] * len(ESCAPES[match.group(1)]))
        else:
            return None
    return shape


def _may_be_one_folder(a: str, b: str) -> bool:
    """Whether folder names `a` and `b` of two export paths can name one folder."""
    x, y = _folder_shape(a), _folder_shape(b)
    if x is None or y is None:
        return True
    return len(x) == len(y) and all(map(_may_be_one_char, x, y))


def _may_be_one_char(i: str | None, j: str | None) -> bool:
    """Whether two characters of folder shapes (None: a digit of an escape) can match."""
    if i is None:
        return j is None or j.isdigit()
    return i.isdigit() if j is None else i == j


def overlap(path: str, other: str) -> bool:
    """Whether export paths `path` and `other` can put files in one folder, or one's files
    in a folder above the other's (%Y/%m/%d/%H and %Y/%m/%d/%H/v2, or %Y/%m/%d): a
    reader of a folder reads those below it. Compared folder by folder, each time escape
    standing for the digits it writes."""
    parts, others = folder(path).split("/"), folder(other).split("/")
    return all(_may_be_one_folder(a, b) for a, b in zip(
        [p for p in parts if p], [p for p in others if p], strict=False))


def versions_overlapping(held: Mapping[str, Iterable[int]], path: str) -> dict[int, list[str]]:
    """The schema versions that `held` ({path: versions of the files under it}) has in
    folders export path `path` overlaps, each with those paths (sorted)."""
    found: dict[int, list[str]] = {}
    for other, versions in sorted(held.items()):
        if overlap(path, other):
            for version in versions:
                found.setdefault(version, []).append(other)
    return found


def own_path(path: str, version: int, held: Mapping[str, Iterable[int]]) -> str | None:
    """An export path to suggest for files of `version` instead of `path`: the same under
    "v<version>/" (in place of a "v<n>/" it starts with), or None when that one overlaps
    a path `held` ({path: versions}) has files of another version under too."""
    own = f"v{version}/" + re.sub(r"^v\d+/", "", folder(path))
    return None if set(versions_overlapping(held, own)) - {version} else own

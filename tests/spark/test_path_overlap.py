"""path_overlap.py: which export paths can share folders, patterns and the concrete folders
of committed files alike (the appliance's refusals over the API: tests/appliance/
test_export_schema.py; the job's, with real Spark: test_export.py)."""
from __future__ import annotations

import pytest

from channel_engine.spark.path_overlap import (
    UNKNOWN_PATH,
    folder,
    overlap,
    own_path,
    versions_overlapping,
)


@pytest.mark.parametrize(("path", "other"), [
    ("%Y/%m/%d/%H", "%Y/%m/%d/%H/"),  # one folder
    ("%Y/%m/%d/%H", "%Y/%m/%d/%H/v2"),  # below it
    ("%Y/%m/%d/%H", "%Y/%m"),  # above it
    ("%Y/%m/%d/%H", "2026/11/27/14"),  # a committed file's folder
    ("v1/%Y/%m", "v1/2026"),
    ("%Y/%j/%H", "2026/331/14"),
    ("%Y/%m/%d/%H", UNKNOWN_PATH),  # nobody knows where: anywhere
    ("x/%q/%H", "x/anything/01"),  # an escape it does not know may be any name
])
def test_paths_that_can_share_a_folder_overlap(path: str, other: str) -> None:
    assert overlap(path, other) and overlap(other, path)


@pytest.mark.parametrize(("path", "other"), [
    ("v2/%Y/%m/%d/%H", "%Y/%m/%d/%H"),
    ("v2/%Y/%m/%d/%H", "2026/11/27/14"),
    ("%Y/%m/%d/%H", "2026/11/27/1x"),
    ("%Y-%m/%d", "2026/11"),
    ("%Y/%m/%d/%H%M", "%Y/%m/%d/%H"),
])
def test_paths_of_folders_apart_do_not_overlap(path: str, other: str) -> None:
    assert not overlap(path, other) and not overlap(other, path)


def test_it_tells_the_versions_held_under_overlapping_paths_and_where() -> None:
    held = {"%Y/%m/%d/%H": {1}, "2026/11/27/14": {1}, "v2/%Y/%m/%d/%H": {2},
            "old/%Y": {1, 2}}
    assert versions_overlapping(held, "%Y/%m/%d") == {1: ["%Y/%m/%d/%H", "2026/11/27/14"]}
    assert versions_overlapping(held, "v2/%Y") == {2: ["v2/%Y/%m/%d/%H"]}
    assert versions_overlapping(held, "old/%Y/%m") == {1: ["old/%Y"], 2: ["old/%Y"]}
    assert versions_overlapping(held, "new/%Y") == {}
    assert versions_overlapping({**held, UNKNOWN_PATH: {2}}, "new/%Y") == {2: [UNKNOWN_PATH]}


@pytest.mark.parametrize(("path", "named"), [
    ("%Y/%m/", "%Y/%m"), ("./%Y", "%Y"), ("a/../%Y", "%Y"), ("%Y//%m", "%Y/%m"),
    ("a/..", ""), ("/", ""), ("", ""), ("//x/", "/x"),
])
def test_a_path_names_its_folder_normalised(path: str, named: str) -> None:
    assert folder(path) == named


def test_the_path_of_its_own_suggested_holds_no_other_version() -> None:
    held = {"%Y/%m/%d/%H": [1], "v1/%Y": [1], "v1/x/%Y": [2]}
    assert own_path("%Y/%m/%d/%H/", 2, held) == "v2/%Y/%m/%d/%H"
    assert own_path("v1/%Y/%m", 2, held) == "v2/%Y/%m"  # never v2/v1/...
    assert own_path("v1/x/%Y", 1, held) is None  # v1/x/%Y holds version 2
    assert own_path("x/%Y", 2, {**held, "v2/x/%Y": [1]}) is None

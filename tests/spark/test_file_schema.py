"""file_schema.py: the schema version of a committed export file read from the file
itself (Parquet footer, Avro header, first JSON line), for commit records written before
the versions; golden files of both versions in each format, written by the export's own
writer (golden/make_export_files.py). A file that says nothing is None, never a guess."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from channel_engine.spark.file_schema import local_reader, schema_version_of

GOLDEN = Path(__file__).resolve().parent / "golden" / "export-files"


@pytest.mark.parametrize("file_format", ["parquet", "avro", "json"])
@pytest.mark.parametrize("version", [1, 2])
def test_it_reads_the_version_of_a_golden_file(file_format: str, version: int) -> None:
    path = str(GOLDEN / f"v{version}.{file_format}")
    assert schema_version_of(path, *local_reader(path)) == version


@pytest.mark.parametrize("file_format", ["parquet", "avro", "json"])
def test_a_file_cut_short_or_damaged_says_nothing(file_format: str, tmp_path: Path) -> None:
    data = (GOLDEN / f"v2.{file_format}").read_bytes()
    path = tmp_path / f"f.{file_format}"
    # Parquet's footer, Avro's schema, JSON's first line cut; nothing; zeros
    for damaged in (data[:40], b"", b"\x00" * len(data)):
        path.write_bytes(damaged)
        assert schema_version_of(str(path), *local_reader(str(path))) is None
    path.write_bytes(data[:4] + b"\xff" * 40 + data[44:])  # damage inside: never a wrong 1
    assert schema_version_of(str(path), *local_reader(str(path))) in (None, 2)


def test_a_file_of_another_suffix_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    shutil.copyfile(GOLDEN / "v2.json", path)
    assert schema_version_of(str(path), *local_reader(str(path))) is None

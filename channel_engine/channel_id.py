"""`export.id` in a channel's home: the id the drains know a channel by — the export's
commit records (spark/commit_records.py) and the Kafka sink's offsets records
(kafka_sink/offsets_record.py).

    file               what                                          who
    -----------------  --------------------------------------------  ----------------------
    <home>/export.id   JSON {"format": "weir-export-id", "version":  the first drain of the
                       1, "id": <uuid hex>}                          channel (export or sink)

A channel deleted and created again under its name starts at offset 0 with a new id:
the ranges its namesake's records hold are not skipped, and an export file name its
namesake holds gets "+<first 8 of the id>" before the extension (output_layout.py). A
damaged file is an ExportError naming it, never replaced: a new id would drain the
channel's events again. (The file keeps the name it had when the export was its only
reader.)

Concurrency contract: any process may call channel_id() at any time. The first one
writes a temp file of its own (`export.id.<8 hex>.tmp`: is_temp_name, which a writable
open of the channel notes and leaves alone rather than move aside as a stranger), syncs
it and hard-links it to the name, which fails when the name exists: two drains starting
at once on a new channel agree on one id (the loser reads the winner's). A temp file
gone before its link (an older engine moved it aside) is written again.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from channel_engine.atomic_file import fsync_directory
from channel_engine.errors import ExportError
from channel_engine.filenames import TMP_SUFFIX

EXPORT_ID_FILE = "export.id"  # in the channel's home
EXPORT_ID_FORMAT = "weir-export-id"
EXPORT_ID_VERSION = 1
CREATE_ATTEMPTS = 5
_TEMP_NAME = re.compile(re.escape(EXPORT_ID_FILE) + r"\.[0-9a-f]{8}" + re.escape(TMP_SUFFIX))


def channel_id(home: str | Path) -> str:
    """The channel's drain id (EXPORT_ID_FILE in its home), made on first use: records of
    a channel once deleted and then created again under the same name carry another id,
    so its new offsets are not taken for the old channel's."""
    path = Path(home) / EXPORT_ID_FILE
    for _ in range(CREATE_ATTEMPTS):
        try:
            document = json.loads(path.read_text())
            break
        except FileNotFoundError:
            _create(path)
        except ValueError as exc:
            raise ExportError(f"{path}: not valid JSON ({exc})") from exc
    else:
        raise ExportError(f"{path}: could not be made in {CREATE_ATTEMPTS} attempts (its "
                          "temp file went each time)")
    if not isinstance(document, dict) or document.get("format") != EXPORT_ID_FORMAT \
            or document.get("version") != EXPORT_ID_VERSION \
            or not isinstance(document.get("id"), str):
        raise ExportError(f"{path}: not a Weir export id (format {EXPORT_ID_FORMAT}, v1)")
    return str(document["id"])


def _create(path: Path) -> None:
    """Write a new id at `path` unless one is there already (link(2) never replaces)."""
    document = {"format": EXPORT_ID_FORMAT, "version": EXPORT_ID_VERSION,
                "id": uuid.uuid4().hex}
    temp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps(document).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)
        fsync_directory(path.parent)
    except FileExistsError:
        pass  # another drain made it first: its id holds
    except FileNotFoundError:
        pass  # the temp file went (moved aside): channel_id() writes another
    finally:
        temp.unlink(missing_ok=True)


def is_temp_name(name: str) -> bool:
    """Is `name` the temp file of an id being made (_create)?"""
    return _TEMP_NAME.fullmatch(name) is not None

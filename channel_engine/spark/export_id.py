"""`export.id` in a channel's home: the id the export's commit records know a channel by.

    file               what                                          who
    -----------------  --------------------------------------------  ----------------------
    <home>/export.id   JSON {"format": "weir-export-id", "version":  the first export of
                       1, "id": <uuid hex>}, written atomically       the channel

A channel deleted and created again under its name starts at offset 0 with a new id:
the ranges of its namesake's commit records (their "channel_id", commit_records.py) are
not skipped, and a file name its namesake holds gets "+<first 8 of the id>" before the
extension (output_layout.py). A damaged file is an ExportError naming it, never
replaced: a new id would export the channel's events again.

Concurrency contract: call channel_id() under the export lock (export_lock.py), so that
two runs never make two ids.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from channel_engine.atomic_file import write_atomically
from channel_engine.errors import ExportError

EXPORT_ID_FILE = "export.id"  # in the channel's home
EXPORT_ID_FORMAT = "weir-export-id"
EXPORT_ID_VERSION = 1


def channel_id(home: str | Path) -> str:
    """The channel's export id (EXPORT_ID_FILE in its home), made on first use: records
    of a channel once deleted and then created again under the same name carry another
    id, so its new offsets are not taken for the old channel's. Call under export_lock."""
    path = Path(home) / EXPORT_ID_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        document = {"format": EXPORT_ID_FORMAT, "version": EXPORT_ID_VERSION,
                    "id": uuid.uuid4().hex}
        write_atomically(path, json.dumps(document).encode())
    except ValueError as exc:
        raise ExportError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != EXPORT_ID_FORMAT \
            or document.get("version") != EXPORT_ID_VERSION \
            or not isinstance(document.get("id"), str):
        raise ExportError(f"{path}: not a Weir export id (format {EXPORT_ID_FORMAT}, v1)")
    return str(document["id"])

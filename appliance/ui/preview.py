"""A safe preview of event bytes: text when they are printable UTF-8, else a hex dump.
Templates escape the result; nothing from an event is ever rendered as HTML."""
from __future__ import annotations

from dataclasses import dataclass

TEXT_LIMIT = 4096   # characters of a text body shown
HEX_LIMIT = 512     # bytes of a binary body shown


@dataclass(frozen=True)
class Preview:
    """How to show some bytes: kind 'text' or 'hex', the text, and whether it was cut."""

    kind: str
    text: str
    size: int
    cut: bool


def preview(data: bytes | None) -> Preview | None:
    """Text for printable UTF-8, else a hex dump (16 bytes a line with offsets)."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\n\r\t" for c in text):
        return Preview("text", text[:TEXT_LIMIT], len(data), len(text) > TEXT_LIMIT)
    return Preview("hex", hex_dump(data), len(data), len(data) > HEX_LIMIT)


def hex_dump(data: bytes) -> str:
    """The first HEX_LIMIT bytes as a hex dump: 16 bytes a line with offsets and ASCII."""
    shown = data[:HEX_LIMIT]
    lines = []
    for at in range(0, len(shown), 16):
        chunk = shown[at:at + 16]
        ascii_part = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {ascii_part}")
    return "\n".join(lines)

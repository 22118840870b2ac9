"""The causes of loss records as the channel page shows them: a plain label for each.

The engine writes a record's cause as "<code>: <what it found>" (channel_engine's
log/recovery.py action kinds, queue/losses.py, queue/loss_ledger.py, tools/recover.py);
the code is for tools and logs. The page shows the label and the rest of the text, and
keeps the code in a title attribute (the loss table, templates/ui/_channel_status.html).
A code this table does not know is shown as the cause's own text, whole: never hidden.
"""
from __future__ import annotations

from dataclasses import dataclass

LABELS = {
    "truncated": "Damaged end of a segment cut off",
    "damage_split": "Damaged part of a segment cut out",
    "gap": "Offsets missing from the log (files gone)",
    "log_end_mismatch": "Log shorter than it was when closed",
    "queue_beyond_log_end": "Log ends before events it had (files lost, or not yet on disk "
                            "at a crash)",
    "corrupt at read": "Damaged data found when read",
    "unreadable": "Offsets no read could deliver",
    "journal_cut": "Put removed from its commit journal by a repair",
    "journal_missing": "Commit journal missing",
    "journal_unreadable": "Commit journal unreadable",
    "state_missing": "Queue state missing (no checkpoint)",
    "state_damaged": "Queue state damaged (checkpoints unreadable)",
    "ledger_missing": "Loss records missing",
    "ledger_damaged": "Loss records damaged",
}


@dataclass(frozen=True)
class Cause:
    """A cause as shown: its label, the text after its code, and the code (for a title)."""

    label: str
    detail: str
    code: str


def shown(cause: str) -> Cause:
    """How the page shows a record's cause (module doc)."""
    code, sep, detail = cause.partition(": ")
    if sep and code in LABELS:
        return Cause(LABELS[code], detail, code)
    return Cause(cause, "", "")

"""RecoveryReport: what opening a partition log found and did, with counts, never silently."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Kinds of action, and whether they lose bytes that once were written
TRUNCATED = "truncated"              # invalid or partial batch and everything after it cut
                                     # (no intact batch after it); counted as lost offsets
                                     # when the bytes were known durable
DAMAGE_SPLIT = "damage_split"        # a damaged region cut out: the intact batches after it
                                     # moved to a new segment, the damaged bytes kept aside
BASE_OFFSET_REPAIRED = "base_offset_repaired"  # a batch's base offset field (outside its
                                     # CRC) rewritten to the offset its place holds: no loss
STRAY_MOVED = "stray_moved"          # a file the engine did not write renamed <name>.stray
ZERO_TAIL_CUT = "zero_tail_cut"      # zeros after the last batch cut: preallocated space, or
                                     # pages never flushed (within the policy-mode window)
INDEX_REBUILT = "index_rebuilt"      # derived data rewritten from the log: no data lost
STRAY_FILE_DELETED = "stray_file_deleted"    # .deleted, .tmp, index without a .log
SEGMENT_DELETED = "segment_deleted"  # wholly below the log start offset (retention finished)
GAP = "gap"                          # offsets missing before, between or after segments
LOG_END_MISMATCH = "log_end_mismatch"  # a 'clean' log whose end disagrees with log.state


@dataclass(frozen=True)
class LostRange:
    """Offsets [start, end) of one partition that the log can no longer deliver, and why.

    The log layer reports these (at open, at `recover`, and when a read meets damage);
    the channel layer takes them out of its queue, counts the events that were not yet
    taken, and keeps them in its loss ledger until an operator acknowledges them."""

    start: int
    end: int
    path: str
    position: int = 0   # byte position of the damage in `path` (0 when not a byte range)
    length: int = 0     # bytes of `path` that held the lost batches (0 when unknown)
    cause: str = ""

    @property
    def offsets(self) -> int:
        """How many offsets the range covers."""
        return self.end - self.start


@dataclass(frozen=True)
class RecoveryAction:
    """One thing recovery did to one file."""

    kind: str
    path: str
    reason: str
    position: int = 0
    bytes_dropped: int = 0
    first_offset_lost: int | None = None
    next_offset_kept: int | None = None


@dataclass
class RecoveryReport:
    """Everything one open of a partition log found and did."""

    directory: str
    clean_shutdown: bool = False
    state_problem: str | None = None
    recovery_point: int = 0
    segments: int = 0
    segments_scanned: int = 0
    bytes_scanned: int = 0
    batches_scanned: int = 0
    duration_ms: float = 0.0
    actions: list[RecoveryAction] = field(default_factory=list)

    def add(self, action: RecoveryAction) -> None:
        """Record an action."""
        self.actions.append(action)

    @property
    def bytes_dropped(self) -> int:
        """Bytes of data cut because they were invalid (zero tails not counted)."""
        return sum(a.bytes_dropped for a in self.actions if a.kind in (TRUNCATED, DAMAGE_SPLIT))

    @property
    def lost_ranges(self) -> list[LostRange]:
        """Offset ranges this open found missing or cut, in offset order."""
        lost = [LostRange(a.first_offset_lost, a.next_offset_kept, a.path, a.position,
                          a.bytes_dropped, f"{a.kind}: {a.reason}")
                for a in self.actions
                if a.first_offset_lost is not None and a.next_offset_kept is not None
                and a.next_offset_kept > a.first_offset_lost]
        return sorted(lost, key=lambda r: (r.start, r.end))

    @property
    def lost_data(self) -> bool:
        """True if any batch bytes were cut or any offsets went missing."""
        return any(a.kind in (TRUNCATED, DAMAGE_SPLIT, GAP) for a in self.actions)

    def reports_loss_from(self, offset: int) -> bool:
        """True if an action already reports lost offsets starting at `offset`."""
        return any(a.first_offset_lost == offset and a.next_offset_kept is not None
                   for a in self.actions)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form."""
        out = asdict(self)
        out["bytes_dropped"] = self.bytes_dropped
        out["lost_data"] = self.lost_data
        return out

    def summary(self) -> str:
        """One line for a log file."""
        kinds: dict[str, int] = {}
        for action in self.actions:
            kinds[action.kind] = kinds.get(action.kind, 0) + 1
        done = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing to repair"
        how = "clean" if self.clean_shutdown else "unclean"
        return (f"{self.directory}: opened after {how} shutdown in {self.duration_ms:.1f} ms; "
                f"scanned {self.segments_scanned}/{self.segments} segments "
                f"({self.bytes_scanned} bytes); {done}; {self.bytes_dropped} bytes dropped")

"""The damage matrix (issue 12): every file kind the engine writes x every kind of on-disk
damage x both durability modes x a clean close or a SIGKILL. The cells, the setup, the
damages and the oracle live in damage.py (its docstring says exactly what is checked).

The default run has a seeded sample of 44 cells (every file kind with four damages, every
damage on four file kinds, durability and ending spread evenly); `-m slow` runs the other
440. Each cell is its own test id, e.g. `-k "seg_middle-bitflip-fsync-killed"`; a cell's
randomness comes from its name only, so a rerun is the same run.

The results as a markdown table (file kind x damage; `ok` or the problems of each variant,
and whether recover was needed; the legend is printed below it, damage.LEGEND):

    PYTHONPATH=$PWD python tests/engine/test_damage_matrix.py --table [--full] [--match TEXT]

The first tests check the harness itself: the damages really happen, a cell is rebuilt the
same from its name, an undamaged channel passes, and the oracle fails when it must.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
from damage import (
    BASE_TIMESTAMP,
    DAMAGES,
    DURABILITIES,
    ENDINGS,
    FILE_KINDS,
    Cell,
    CellRun,
    Ledger,
    apply_damage,
    build_clean,
    come_back_count,
    event_body,
    event_key,
    full_matrix,
    main,
    run_cell,
    sample_matrix,
    target_file,
)

from channel_engine import Event

SAMPLE = sample_matrix()
REST = [cell for cell in full_matrix() if cell not in SAMPLE]


# -- the harness ------------------------------------------------------------------------------
def test_it_samples_every_file_kind_and_damage() -> None:
    assert len(SAMPLE) == 44 and len(REST) == 11 * 11 * 2 * 2 - 44
    assert len({c.id for c in SAMPLE + REST}) == len(SAMPLE + REST)
    for kind in FILE_KINDS:
        assert len({c.damage for c in SAMPLE if c.kind == kind}) == 4, kind
    for damage in DAMAGES:
        assert len({c.kind for c in SAMPLE if c.damage == damage}) == 4, damage
    variants = {(c.durability, c.ending) for c in SAMPLE}
    assert variants == {(d, e) for d in DURABILITIES for e in ENDINGS}
    assert {c.encrypted for c in SAMPLE if c.kind != "key_file"} == {True, False}
    assert all(c.encrypted for c in SAMPLE if c.kind == "key_file")


def _segment_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "part"
    directory.mkdir()
    for base in (0, 17, 40):
        (directory / f"{base:020d}.log").write_bytes(random.Random(base).randbytes(300))
    return directory


@pytest.mark.parametrize("damage", DAMAGES)
def test_it_applies_each_damage_for_real(tmp_path: Path, damage: str) -> None:
    path = _segment_dir(tmp_path) / f"{17:020d}.log"
    before = path.read_bytes()
    done = apply_damage(path, damage, random.Random(7))
    if damage == "bitflip":
        after = path.read_bytes()
        diff = [i for i in range(len(before)) if before[i] != after[i]]
        assert len(after) == len(before) and len(diff) == 1
        assert bin(before[diff[0]] ^ after[diff[0]]).count("1") == 1
    elif damage.startswith("overwrite_"):
        after = path.read_bytes()
        diff = [i for i in range(len(before)) if before[i] != after[i]]
        n = diff[-1] - diff[0] + 1
        assert len(after) == len(before) and len(diff) == n and 4 <= n <= 24
        where = {"overwrite_head": 0, "overwrite_middle": (len(before) - n) // 2,
                 "overwrite_tail": len(before) - n}[damage]
        assert diff[0] == where, done.what
    elif damage == "truncate_random":
        after = path.read_bytes()
        assert 0 < len(after) < len(before) and before.startswith(after)
    elif damage == "truncate_zero":
        assert path.read_bytes() == b""
    elif damage == "append_garbage":
        after = path.read_bytes()
        assert after.startswith(before) and len(after) > len(before)
    elif damage == "delete":
        assert not path.exists()
    elif damage == "replace_dir":
        assert path.is_dir() and not any(path.iterdir())
    else:
        assert path.read_bytes() == before and done.stray is not None
        assert done.stray.parent == path.parent and done.stray.exists()
        if damage == "stray_empty":
            assert done.stray.read_bytes() == b"" and done.stray.suffix == ".log"
            assert int(done.stray.name[:20]) > 40  # a larger base offset than any segment


def test_it_rebuilds_the_same_cell_from_its_name(tmp_path: Path) -> None:
    """Same ledger, same files of the same sizes (the bytes differ only where the engine
    draws its own randomness: nonces, transaction ids, wall-clock stamps), same damage."""
    cell = Cell("seg_middle", "overwrite_middle", "fsync", "clean")
    assert cell.encrypted
    ledgers, damages, layouts = [], [], []
    for run in ("a", "b"):
        root = tmp_path / run
        root.mkdir()
        ledgers.append(build_clean(root, cell))
        # channel.json's crc32c covers the run's own paths: its digits (and size) vary
        layouts.append({str(p.relative_to(root)): p.stat().st_size
                        for p in root.rglob("*") if p.is_file() and p.name != "channel.json"})
        rng = random.Random(f"damage:{cell.seed}")
        done = apply_damage(target_file(root, cell, rng), cell.damage, rng)
        damages.append((done.path.relative_to(root), done.what))
    assert ledgers[0].to_json() == ledgers[1].to_json()
    assert damages[0] == damages[1]
    assert layouts[0] == layouts[1]
    assert ledgers[0].taken and ledgers[0].untaken  # the setup took some and left some


@pytest.mark.parametrize("ending", ENDINGS)
def test_it_passes_an_undamaged_channel(tmp_path: Path, ending: str) -> None:
    """The control: no damage, no problem (but the missing loss interface on a branch
    without it, which the oracle must still name)."""
    result = run_cell(Cell("seg_middle", "none", "policy", ending), tmp_path)
    codes = {p.code for p in result.problems}
    assert codes <= {"no-losses-interface"}, result.message()
    assert not result.needed_recover


class _Tampered(CellRun):
    """A control cell whose ledger claims what did not happen: the oracle must object."""

    def setup(self) -> Ledger:
        ledger = super().setup()
        untaken = sorted(ledger.untaken)
        ledger.taken.add(untaken[0])  # delivered again, and nobody said it may come back
        ghost = ledger.puts  # put (says the ledger) and gone without a count
        ledger.puts += 1
        ledger.place[ghost] = (0, ledger.max_offset(0) + 1000)
        return ledger


def test_it_fails_a_cell_that_loses_or_repeats_events(tmp_path: Path) -> None:
    result = _Tampered(Cell("seg_middle", "none", "fsync", "clean"), tmp_path).run()
    codes = {p.code for p in result.problems}
    assert {"came-back", "lost-uncounted"} <= codes, result.message()
    assert "came-back" in result.message() and "ids [" in result.message()


def _accounting(tmp_path: Path, delivered_ids: list[int], records: list[tuple[int, int, int]],
                events_lost: int, recovery: dict[str, int] | None = None) -> set[str]:
    """The oracle's accounting alone, on a made-up ledger: ids 0..9 at offsets 0..9 of
    partition 0, 0..2 taken before the damage; what a channel delivered and counted."""
    run = CellRun(Cell("seg_middle", "none", "fsync", "clean"), tmp_path)
    seed = run.ledger.seed
    run.ledger = Ledger(seed, 10, {i: (0, i) for i in range(10)}, {0, 1, 2})
    delivered = [Event(0, i, BASE_TIMESTAMP + i, event_key(seed, i), {}, event_body(seed, i))
                 for i in delivered_ids]
    losses = {"events_lost": events_lost, "unacknowledged_events": events_lost,
              "unacknowledged": len(records),
              "records": [{"partition": p, "start": a, "end": b} for p, a, b in records]}
    run.check_delivered(delivered, [(p, a, b) for p, a, b in records], losses,
                        {"losses": losses, "recovery": recovery or {}})
    return {p.code for p in run.result.problems}


def test_it_accounts_delivered_lost_and_returned_events(tmp_path: Path) -> None:
    assert _accounting(tmp_path, list(range(3, 10)), [], 0) == set()
    # 5 and 6 neither delivered nor counted, counted wrong, or counted and delivered
    assert _accounting(tmp_path, [3, 4, 7, 8, 9], [(0, 5, 7)], 2) == set()
    assert _accounting(tmp_path, [3, 4, 7, 8, 9], [], 0) == {"lost-uncounted",
                                                            "lost-miscounted"}
    assert _accounting(tmp_path, [3, 4, 7, 8, 9], [(0, 5, 7)], 3) == {"lost-miscounted"}
    assert _accounting(tmp_path, [3, 4, 7, 8, 9], [(0, 4, 7)], 2) == {"delivered-and-lost"}
    assert _accounting(tmp_path, [3, 4, 4, 5, 6, 7, 8, 9], [], 0) == {"delivered-twice"}
    # taken events delivered again: only as many as the tools report may come back
    assert _accounting(tmp_path, list(range(1, 10)), [], 0) == {"came-back"}
    assert _accounting(tmp_path, list(range(1, 10)), [], 0,
                       {"take_commits_may_come_back_events": 2}) == set()
    assert _accounting(tmp_path, [3, 4, 5, 6, 7, 8, 9, 42], [], 0) == {"wrong-event"}


def test_it_accepts_events_coming_back_within_a_bound_only_where_one_is_reported(
        tmp_path: Path) -> None:
    """A journal whose content is unknown: the tools bound what may come back (in all)."""
    every = list(range(0, 10))  # 0..2 taken before the damage: all three come back
    assert _accounting(tmp_path, every, [], 0, {"events_may_come_back_at_most": 10}) == set()
    assert _accounting(tmp_path, every, [], 0, {"events_may_come_back_at_most": 3}) == set()
    assert _accounting(tmp_path, every, [], 0, {"events_may_come_back_at_most": 2}) == {
        "came-back"}
    assert _accounting(tmp_path, every, [], 0, {"events_may_come_back_at_most": 0}) == {
        "came-back"}  # a bound of 0 is no bound: nothing may come back uncounted
    # the exact ones (intact records after a cut) must come back, bound or not
    assert _accounting(tmp_path, list(range(3, 10)), [], 0,
                       {"events_may_come_back": 2, "events_may_come_back_at_most": 10}) == {
        "came-back"}
    assert _accounting(tmp_path, list(range(1, 10)), [], 0,
                       {"events_may_come_back": 2, "events_may_come_back_at_most": 10}) == set()


def test_it_reads_exact_and_bounded_come_backs_apart() -> None:
    recover = {"events_may_come_back_at_most": 7, "repair": {
        "events_may_come_back": 2, "take_commits_may_come_back": 1,
        "events_may_come_back_at_most": 7, "recovery": {"events_may_come_back_at_most": 7}}}
    assert come_back_count(recover, {"events_may_come_back_at_most": 0}, None) == (2, 7)
    assert come_back_count(recover, {"events_may_come_back_at_most": 3}) == (2, 10)
    assert come_back_count({"events_may_come_back": 4}, {}) == (4, None)


# -- the matrix ---------------------------------------------------------------------------------
def _check(cell: Cell, tmp_path: Path) -> None:
    result = run_cell(cell, tmp_path)
    if not result.passed:
        pytest.fail(result.message(), pytrace=False)


@pytest.mark.parametrize("cell", SAMPLE, ids=lambda c: c.id)
def test_it_delivers_or_counts_every_event_after_damage(tmp_path: Path, cell: Cell) -> None:
    _check(cell, tmp_path)


# Open gaps, kept visible: strict xfails, so a fix makes them fail until removed. None now
# (the last four, a destroyed one-batch active segment after a kill, are closed by
# log.state's committed-end record: log/state.py).
KNOWN_GAPS: set[str] = set()


def _with_known_gaps(cells: list[Cell]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=pytest.mark.xfail(
        strict=True, reason="issue 12 open gap (KNOWN_GAPS)"))
            if c.id in KNOWN_GAPS else pytest.param(c, id=c.id) for c in cells]


@pytest.mark.slow
@pytest.mark.parametrize("cell", _with_known_gaps(REST))
def test_it_delivers_or_counts_every_event_after_damage_full_matrix(tmp_path: Path,
                                                                     cell: Cell) -> None:
    _check(cell, tmp_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

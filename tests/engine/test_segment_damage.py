"""Damaged segment files and stray files: open, `recover`, reads and `verify` keep every
intact batch, count every lost offset once, never hand a committed offset out again, and
move strangers aside without letting them change offsets (issue 12, points 1, 2, 5)."""
from __future__ import annotations

import io
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from channel_engine import LogConfig, PartitionLog, PendingEvent
from channel_engine.log import state as state_file
from channel_engine.log.recovery import BASE_OFFSET_REPAIRED, DAMAGE_SPLIT, STRAY_MOVED, TRUNCATED
from channel_engine.tools import cli
from channel_engine.tools.verify import scan_log_file

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)
TRUSTING = CONFIG.replace(verify_on_open=False)  # a clean log's bytes unchecked (Kafka)
BATCHES = 40
PER_BATCH = 5


def fill(directory: Path, batches: int = BATCHES, config: LogConfig = CONFIG) -> list[bytes]:
    """Write `batches` batches of 5 events and close cleanly; return all bodies in order."""
    bodies = []
    with PartitionLog.open(directory, config) as log:
        for b in range(batches):
            batch = [f"batch {b} event {i} ".encode() * 3 for i in range(PER_BATCH)]
            log.append([PendingEvent(body, timestamp=1_000 + b) for body in batch])
            bodies += batch
    return bodies


def segment_logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def batch_spans(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, end, first offset, next offset) of each batch of a .log."""
    return [(p, p + h.size, h.base_offset, h.next_offset)
            for p, h in scan_log_file(path, None).batches]


def make_unclean(directory: Path, recovery_point: int | None = None) -> None:
    """What a crash leaves: no clean flag, the recovery point last persisted (default: the
    log end, as after every commit was made durable)."""
    state = state_file.read(directory / "log.state")
    assert state is not None
    state = state.with_(clean_shutdown=False)
    if recovery_point is not None:
        state = state.with_(recovery_point=recovery_point)
    state_file.write(directory / "log.state", state)


def damage(path: Path, position: int, length: int, how: str) -> None:
    """Change bytes [position, position + length) of a file: every byte differs after."""
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(length)
        if how == "zeros" and any(old):
            new = bytes(len(old))
        else:
            new = bytes(b ^ (0xFF if how != "bit" else 0x01) for b in old)
        f.seek(position)
        f.write(new)


def delivered(directory: Path) -> dict[int, bytes]:
    with PartitionLog.open(directory, CONFIG, read_only=True) as log:
        return {e.offset: e.body for e in log.iter_events(log.log_start_offset)}


def verify(directory: Path) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(["verify", str(directory)], out), out.getvalue()


def lost_offsets(ranges: list) -> set[int]:  # type: ignore[type-arg]
    out: set[int] = set()
    for r in ranges:
        assert not out & set(range(r.start, r.end)), "a loss counted twice"
        out |= set(range(r.start, r.end))
    return out


def check_open_after_damage(directory: Path, bodies: list[bytes], hit: set[int],
                            force: bool = False) -> None:
    """Open (writable) and read everything: nothing fails, every offset is delivered or
    counted lost (at open or by the read; never both, never neither), every batch the
    damage did not touch is delivered, the next append gets an offset above every committed
    one; the next open repairs what the read met and agrees; so does verify."""
    total = len(bodies)
    status_before, text_before = verify(directory)
    with PartitionLog.open(directory, CONFIG, force_recovery=force) as log:
        got = {e.offset: e.body for e in log.iter_events(log.log_start_offset)}
        lost = lost_offsets(log.take_new_losses())
        assert log.append([PendingEvent(b"after")]).first_offset == total
    assert all(bodies[o] == body for o, body in got.items())
    assert not lost & set(got), "an offset both delivered and counted lost"
    assert lost | set(got) == set(range(total)), "an offset neither delivered nor counted"
    assert lost <= hit, f"lost {sorted(lost - hit)} that the damage did not touch"
    assert status_before == 1 or not lost, text_before  # verify saw every loss first
    assert not re.search(r"\.\.\d+ (lost|are missing)", text_before) or lost, text_before
    with PartitionLog.open(directory, CONFIG) as log:
        again = {e.offset: e.body for e in log.iter_events(log.log_start_offset)}
        assert lost_offsets(log.take_new_losses()) == lost
    assert again.pop(total) == b"after" and again == got
    assert not list(directory.glob("*.repair"))
    status, text = verify(directory)
    assert (status == 0) == (not lost), text


POSITIONS = ["head", "second_batch", "middle", "last_batch", "tail_bytes"]


def place(path: Path, where: str, rng: random.Random) -> int:
    spans = batch_spans(path)
    if where == "head":
        return rng.randrange(0, 30)
    if where == "second_batch":
        return rng.randrange(spans[1][0], spans[1][1])
    if where == "middle":
        return rng.randrange(spans[0][1], spans[-1][0])
    if where == "last_batch":
        return rng.randrange(spans[-1][0], spans[-1][1])
    return spans[-1][1] - rng.randrange(1, 20)


def hit_offsets(path: Path, position: int, length: int) -> set[int]:
    return {o for start, end, first, nxt in batch_spans(path)
            if start < position + length and position < end for o in range(first, nxt)}


def run_damage_case(tmp_path: Path, seed: int, which: int, where: str, how: str,
                    length: int, mode: str) -> None:
    rng = random.Random(seed)
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[which]
    position = place(path, where, rng)
    length = min(length, path.stat().st_size - position)
    hit = hit_offsets(path, position, length)
    damage(path, position, length, how)
    if mode == "unclean":
        make_unclean(tmp_path)
    if mode == "crashed":  # recovery walks every CRC from the damaged segment on
        make_unclean(tmp_path, int(path.name[:20]))
    check_open_after_damage(tmp_path, bodies, hit, force=mode == "recover")


@pytest.mark.parametrize("mode", ["clean", "unclean", "crashed", "recover"])
@pytest.mark.parametrize("where", POSITIONS)
@pytest.mark.parametrize(("how", "length"), [("bit", 1), ("garbage", 16), ("zeros", 40)])
def test_it_keeps_every_intact_batch_wherever_the_damage_falls(
    tmp_path: Path, mode: str, where: str, how: str, length: int,
) -> None:
    seed = POSITIONS.index(where) * 100 + length
    run_damage_case(tmp_path, seed, 1 if where != "tail_bytes" else -1, where, how, length,
                    mode)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(300))
def test_it_keeps_every_intact_batch_under_random_damage(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    which = rng.randrange(0, 4)
    where, how = rng.choice(POSITIONS), rng.choice(["bit", "garbage", "zeros"])
    length, mode = rng.choice([1, 8, 61, 300]), rng.choice(["clean", "unclean", "recover"])
    if which < 3 and where != "tail_bytes" and rng.random() < 0.3:
        mode = "crashed"  # the damage lies below the last segment: counted as lost
    run_damage_case(tmp_path, seed, which, where, how, length, mode)


@pytest.mark.parametrize("mode", ["clean", "unclean", "recover"])
@pytest.mark.parametrize(("batch", "byte"), [(0, 0), (0, 7), (3, 1), (3, 6), (-1, 2), (-1, 7)])
def test_a_damaged_base_offset_field_is_never_read_as_other_offsets(
    tmp_path: Path, mode: str, batch: int, byte: int,
) -> None:
    bodies = fill(tmp_path)  # the base offset lies outside the CRC: only offsets show it
    path = segment_logs(tmp_path)[1]
    start, _, first, nxt = batch_spans(path)[batch]
    damage(path, start + byte, 1, "bit")
    if mode == "unclean":
        make_unclean(tmp_path)
    check_open_after_damage(tmp_path, bodies, set(range(first, nxt)), force=mode == "recover")


@pytest.mark.parametrize("mode", ["clean", "crashed"])
def test_a_damaged_base_offset_field_loses_nothing(tmp_path: Path, mode: str) -> None:
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    start, _, first, _ = batch_spans(path)[3]
    damage(path, start + 5, 1, "bit")
    if mode == "crashed":
        make_unclean(tmp_path, int(path.name[:20]))
    status, text = verify(tmp_path)
    assert status == 1 and "no offset is lost" in text
    actions = []
    with PartitionLog.open(tmp_path, CONFIG) as log:  # clean: met by the read, delivered
        actions += log.last_recovery.actions
        assert [e.body for e in log.iter_events(0)] == bodies
        assert log.take_new_losses() == []
    with PartitionLog.open(tmp_path, CONFIG) as log:  # a .repair marker, if the read met it
        actions += log.last_recovery.actions
        assert log.take_new_losses() == []
    [fixed] = actions
    assert fixed.kind == BASE_OFFSET_REPAIRED and (fixed.path, fixed.position) == \
        (str(path), start) and f"offset {first} belongs" in fixed.reason
    assert verify(tmp_path)[0] == 0 and delivered(tmp_path) == dict(enumerate(bodies))


def test_damage_in_the_first_bytes_keeps_the_rest_of_the_segment(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    second = segment_logs(tmp_path)[1]
    spans = batch_spans(second)
    damage(second, 0, 20, "garbage")
    with PartitionLog.open(tmp_path, CONFIG) as log:
        report = log.last_recovery
        [split] = [a for a in report.actions if a.kind == DAMAGE_SPLIT]
        assert (split.first_offset_lost, split.next_offset_kept) == (spans[0][2], spans[1][2])
        assert report.lost_data and second not in [s.log_path for s in log.segments]
    got = delivered(tmp_path)
    assert set(range(spans[1][2], spans[-1][3])) <= set(got)
    assert len((tmp_path / f"{second.name}.damaged-0").read_bytes()) == spans[0][1]
    assert len(got) == len(bodies) - PER_BATCH


def test_recover_never_hands_out_a_committed_offset_again(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    last = segment_logs(tmp_path)[-1]
    spans = batch_spans(last)
    damage(last, spans[-1][0] + 70, 4, "garbage")  # the very last batch: tail damage
    out = io.StringIO()
    assert cli.main(["recover", str(tmp_path)], out) == 0
    assert TRUNCATED in out.getvalue()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert log.log_end_offset == len(bodies)
        assert log.append([PendingEvent(b"new")]).first_offset == len(bodies)
    with PartitionLog.open(tmp_path, CONFIG, force_recovery=True) as log:  # again: no change
        assert log.log_end_offset == len(bodies) + 1


def test_a_torn_tail_above_the_recovery_point_is_cut_and_not_counted(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, CONFIG.replace(durability="policy",
                                                     flush_messages=1000))
    for i in range(6):
        log.append([PendingEvent(b"event %d" % i)])
    log.flush()
    log.checkpoint_recovery_point()  # recovery point 6 on disk
    log.append([PendingEvent(b"unflushed")])
    path = log.segments[-1].log_path
    log.state.release_dir_lock()
    for segment in log.segments:
        segment.close()
    os.truncate(path, path.stat().st_size - 5)  # the write whose commit never returned:
    with open(tmp_path / "log.state", "r+b") as f:  # killed before log.state's record of it
        f.seek(state_file.COMMITTED_END_AT)
        f.write(state_file.encode_committed_end(6))
    with PartitionLog.open(tmp_path, CONFIG) as log:
        [cut] = [a for a in log.last_recovery.actions if a.kind == TRUNCATED]
        assert cut.first_offset_lost == 6 and cut.next_offset_kept is None
        assert log.take_new_losses() == [] and log.log_end_offset == 6
    assert not list(tmp_path.glob("*.damaged-*"))


# -- a crash at each step of a repair -------------------------------------------------------
def repaired_copy(tmp_path: Path) -> tuple[Path, Path, Path, int, int]:
    """A damaged log (clean) and the same log after a repair; return (damaged dir,
    repaired dir, damaged .log, damage position, split base)."""
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    fill(damaged)
    path = segment_logs(damaged)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + 70, 3, "garbage")
    repaired = tmp_path / "repaired"
    shutil.copytree(damaged, repaired)
    PartitionLog.open(repaired, CONFIG, force_recovery=True).close()  # `recover`
    return damaged, repaired, path, spans[2][0], spans[3][2]


@pytest.mark.parametrize("step", ["damaged_copy", "tmp_segment", "new_segment", "cut"])
def test_a_crash_at_any_step_of_a_repair_is_repaired_again_without_loss_or_duplicate(
    tmp_path: Path, step: str,
) -> None:
    damaged, repaired, path, position, split_base = repaired_copy(tmp_path)
    kept_name = f"{path.name}.damaged-{position}"
    new_name = f"{split_base:020d}.log"
    state = tmp_path / "crashed"
    shutil.copytree(damaged, state)
    shutil.copy(repaired / kept_name, state / kept_name)
    if step == "tmp_segment":
        (state / (new_name + ".tmp")).write_bytes((repaired / new_name).read_bytes()[:100])
    if step in ("new_segment", "cut"):
        shutil.copy(repaired / new_name, state / new_name)
    if step == "cut":
        shutil.copy(repaired / path.name, state / path.name)
    with PartitionLog.open(repaired, CONFIG) as log:
        expected_losses = [(r.start, r.end) for r in log.take_new_losses()]
        expected = {e.offset: e.body for e in log.iter_events(0)}
    assert expected_losses == [(split_base - PER_BATCH, split_base)]
    with PartitionLog.open(state, CONFIG) as log:  # an ordinary open: repairs what it sees
        got = {e.offset: e.body for e in log.iter_events(0)}
        losses = [(r.start, r.end) for r in log.take_new_losses()]  # at open or by the read
    assert losses == expected_losses and got == expected
    PartitionLog.open(state, CONFIG, force_recovery=True).close()  # `recover` again
    assert delivered(state) == expected
    assert sorted(p.name for p in state.iterdir()) == sorted(p.name for p in repaired.iterdir())
    assert (state / kept_name).read_bytes() == (repaired / kept_name).read_bytes()


def test_damaged_bytes_kept_aside_are_never_loaded_nor_deleted(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[1][0] + 80, 1, "bit")
    PartitionLog.open(tmp_path, CONFIG, force_recovery=True).close()
    [kept] = tmp_path.glob("*.damaged-*")
    content = kept.read_bytes()
    for force in (False, True):
        with PartitionLog.open(tmp_path, CONFIG, force_recovery=force) as log:
            assert not any(a.kind == DAMAGE_SPLIT for a in log.last_recovery.actions)
            assert log.log_end_offset == len(bodies)
    assert kept.read_bytes() == content
    assert "kept aside" in verify(tmp_path)[1]


# -- strays ---------------------------------------------------------------------------------
@pytest.mark.parametrize("clean", [True, False])
def test_a_stray_empty_segment_past_the_log_end_changes_nothing(
    tmp_path: Path, clean: bool,
) -> None:
    bodies = fill(tmp_path)
    if not clean:
        make_unclean(tmp_path)
    stray = tmp_path / f"{len(bodies) + 1000:020d}.log"
    stray.write_bytes(b"")
    assert verify(tmp_path)[0] == 1
    with PartitionLog.open(tmp_path, CONFIG, read_only=True) as reader:  # ignored, not moved
        assert reader.log_end_offset == len(bodies)
    assert stray.exists()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        [moved] = [a for a in log.last_recovery.actions if a.kind == STRAY_MOVED]
        assert moved.path == str(stray) and log.take_new_losses() == []
        assert log.log_end_offset == len(bodies)
        assert log.append([PendingEvent(b"next")]).first_offset == len(bodies)
        assert len(log.read(len(bodies) - 1, max_events=5)) == 2
    assert not stray.exists() and stray.with_name(stray.name + ".stray").exists()
    assert verify(tmp_path)[0] == 0


def test_odd_names_directories_and_foreign_segments_are_moved_aside(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    first = segment_logs(tmp_path)[0]
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / f"{len(bodies) + 7:020d}.log").mkdir()
    foreign = tmp_path / f"{3:020d}.log"  # starts with a batch at offset 0, not 3
    foreign.write_bytes(first.read_bytes())
    status, text = verify(tmp_path)
    assert status == 1 and text.count("stray:") == 4
    with PartitionLog.open(tmp_path, CONFIG) as log:
        moved = sorted(Path(a.path).name for a in log.last_recovery.actions
                       if a.kind == STRAY_MOVED)
        assert moved == sorted([foreign.name, f"{len(bodies) + 7:020d}.log", "notes.txt", "sub"])
        assert log.take_new_losses() == [] and log.log_end_offset == len(bodies)
        assert [e.body for e in log.iter_events(0)] == bodies
    assert (tmp_path / "notes.txt.stray").read_text() == "hello"
    assert (tmp_path / "sub.stray").is_dir() and (tmp_path / (foreign.name + ".stray")).exists()
    assert verify(tmp_path)[0] == 0


@pytest.mark.parametrize("preallocate", [False, True])
def test_the_empty_active_segment_of_a_roll_is_not_a_stray(
    tmp_path: Path, preallocate: bool,
) -> None:
    config = CONFIG.replace(preallocate=preallocate)
    log = PartitionLog.open(tmp_path, config)
    log.append([PendingEvent(b"a")] * 3)
    log.roll()
    log.checkpoint_recovery_point()
    log.append([PendingEvent(b"b")] * 2)
    log.roll()  # empty active segment at 5, past the persisted log end (3)
    log.state.release_dir_lock()  # kill -9
    for segment in log.segments:
        segment.close()
    with PartitionLog.open(tmp_path, config) as log:
        assert not [a for a in log.last_recovery.actions if a.kind == STRAY_MOVED]
        assert log.log_end_offset == 5 and log.segments[-1].base_offset == 5
        assert log.append([PendingEvent(b"c")]).first_offset == 5
    with PartitionLog.open(tmp_path, config) as log:  # a clean close after a roll
        log.roll()
    with PartitionLog.open(tmp_path, config) as log:
        assert not [a for a in log.last_recovery.actions if a.kind == STRAY_MOVED]
        assert log.segments[-1].base_offset == 6 == log.log_end_offset


def test_the_empty_segment_the_loader_made_after_a_hole_is_not_a_stray(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    last = segment_logs(tmp_path)[-1]
    for suffix in (".log", ".index", ".timeindex"):
        last.with_suffix(suffix).unlink()
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert log.segments[-1].base_offset == len(bodies) and log.segments[-1].size == 0
        log.state.release_dir_lock()  # kill -9 right after the open
        for segment in log.segments:
            segment.close()
        log.state.closed = True
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert not [a for a in log.last_recovery.actions if a.kind == STRAY_MOVED]
        assert log.log_end_offset == len(bodies)


def test_an_empty_segment_between_two_segments_is_moved_aside(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    logs = segment_logs(tmp_path)
    inside = int(logs[1].name[:20]) + 2
    stray = tmp_path / f"{inside:020d}.log"
    stray.write_bytes(bytes(4096))  # preallocated-looking zeros
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert [Path(a.path).name for a in log.last_recovery.actions
                if a.kind == STRAY_MOVED] == [stray.name]
        assert [e.body for e in log.iter_events(0)] == bodies


# -- damage met at use ----------------------------------------------------------------------
def test_a_read_only_reader_skips_damage_reports_it_and_writes_nothing(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[2]
    spans = batch_spans(path)
    damage(path, spans[0][0] + 62, 4, "garbage")  # the first batch of a segment
    before = sorted(p.name for p in tmp_path.iterdir())
    with PartitionLog.open(tmp_path, CONFIG, read_only=True) as reader:
        events = reader.read(spans[0][2], max_events=3)
        assert [e.offset for e in events] == list(range(spans[1][2], spans[1][2] + 3))
        [lost] = reader.take_new_losses()
        assert (lost.start, lost.end, lost.position) == (spans[0][2], spans[1][2], spans[0][0])
        assert reader.stats()["read_damage"]["offsets_lost"] == PER_BATCH
        assert len(list(reader.iter_events(0))) == len(bodies) - PER_BATCH
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_read_that_meets_a_damaged_header_from_the_index_resumes_after_it(
    tmp_path: Path,
) -> None:
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + 16, 1, "garbage")  # magic of the third batch
    target = spans[4][2] + 1  # find_position walks the headers over the damaged one
    with PartitionLog.open(tmp_path, TRUSTING) as log:  # the damage is met by reads
        assert [e.offset for e in log.read(target, max_events=2)] == [target, target + 1]
        assert log.take_new_losses() == []  # below the offsets asked for: the open reports
        events = log.read(spans[1][2], max_events=20)
        assert [e.offset for e in events][:6] == [spans[1][2] + i for i in range(5)] + \
            [spans[3][2]]
        [lost] = log.take_new_losses()
        assert (lost.start, lost.end) == (spans[2][2], spans[3][2])
    assert len(bodies) == BATCHES * PER_BATCH


def test_reads_report_each_lost_offset_of_a_damaged_place_once(tmp_path: Path) -> None:
    fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + 80, 1, "bit")
    first, after = spans[2][2], spans[3][2]
    with PartitionLog.open(tmp_path, TRUSTING) as log:  # the damage is met by reads
        assert log.read(first + 2, max_events=1)[0].offset == after
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(first + 2, after)]
        assert log.read(first + 3, max_events=1)[0].offset == after
        assert log.read(first, max_events=1)[0].offset == after
        assert [(r.start, r.end) for r in log.take_new_losses()] == [(first, first + 2)]
        assert log.stats()["read_damage"] == {"places": 1, "offsets_lost": PER_BATCH}
        assert (tmp_path / f"{int(path.name[:20]):020d}.repair").exists()


def test_a_directory_in_place_of_log_state_is_moved_aside(tmp_path: Path) -> None:
    bodies = fill(tmp_path)
    (tmp_path / "log.state").unlink()
    (tmp_path / "log.state").mkdir()
    status, text = verify(tmp_path)
    assert status == 1 and "log.state: byte 0: stray: not a regular file" in text
    with PartitionLog.open(tmp_path, CONFIG, read_only=True) as reader:
        assert reader.log_end_offset == len(bodies)
    with PartitionLog.open(tmp_path, CONFIG) as log:
        assert STRAY_MOVED in [a.kind for a in log.last_recovery.actions]
        assert [e.body for e in log.iter_events(0)] == bodies
    assert (tmp_path / "log.state.stray").is_dir() and (tmp_path / "log.state").is_file()


def test_a_header_scan_skips_a_damaged_header_and_counts_it(tmp_path: Path) -> None:
    fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + 16, 1, "garbage")  # the magic: the header itself is bad
    with PartitionLog.open(tmp_path, CONFIG) as log:  # clean: unseen at open
        bases = [h.base_offset for _, _, h in log.batch_headers(0)]
        assert spans[2][2] not in bases and spans[3][2] in bases
        assert bases == sorted(bases) and len(bases) == BATCHES - 1
        [lost] = log.take_new_losses()
        assert (lost.start, lost.end) == (spans[2][2], spans[3][2])


def test_a_refreshing_reader_ignores_a_stray_empty_segment(tmp_path: Path) -> None:
    writer = PartitionLog.open(tmp_path, CONFIG)
    writer.append([PendingEvent(b"a")] * 3)
    reader = PartitionLog.open(tmp_path, CONFIG, read_only=True)
    (tmp_path / f"{1000:020d}.log").write_bytes(b"")
    writer.append([PendingEvent(b"b")] * 2)
    writer.roll()  # a real roll at 5: the reader follows it
    writer.append([PendingEvent(b"c")])
    reader.refresh()
    assert reader.log_end_offset == 6 and [s.base_offset for s in reader.segments] == [0, 5]
    reader.close()
    writer.close()


def test_a_reader_keeps_the_intact_batches_after_damage_inside_a_segment(
    tmp_path: Path,
) -> None:
    bodies = fill(tmp_path)
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + 80, 1, "bit")
    make_unclean(tmp_path, spans[0][2])  # the open walks every CRC of that segment
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with PartitionLog.open(tmp_path, CONFIG, read_only=True) as reader:
        assert [a.kind for a in reader.last_recovery.actions] == [DAMAGE_SPLIT]
        got = [e.offset for e in reader.iter_events(0)]
        assert got == [o for o in range(len(bodies)) if not spans[2][2] <= o < spans[3][2]]
        assert [(r.start, r.end) for r in reader.take_new_losses()] == \
            [(spans[2][2], spans[3][2])]
        assert reader.take_new_losses() == []  # the reads did not report it again
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("where", ["header", "records"])
def test_it_finds_offsets_for_time_past_damage_as_reads_do(tmp_path: Path, where: str) -> None:
    fill(tmp_path)  # batch b holds offsets 5b..5b+4, every event stamped 1000 + b
    path = segment_logs(tmp_path)[1]
    spans = batch_spans(path)
    damage(path, spans[2][0] + (16 if where == "header" else 80), 1, "garbage")
    hit, after = spans[2][2] // PER_BATCH, spans[3][2]
    with PartitionLog.open(tmp_path, TRUSTING) as log:  # the damage is met at use
        assert log.offsets_for_time(1_000 + hit - 1) == spans[1][2]  # before it: untouched
        assert log.offsets_for_time(1_000 + hit) == after  # its events: the next intact one
        assert log.offsets_for_time(1_000 + hit + 1) == after
        assert log.offsets_for_time(1_000 + BATCHES) is None
        lost = log.take_new_losses()
        assert lost_offsets(lost) <= set(range(spans[2][2], after))  # counted once, as reads
        assert [e.offset for e in log.read(spans[2][2], max_events=1)] == [after]
        assert lost_offsets(lost + log.take_new_losses()) == set(range(spans[2][2], after))

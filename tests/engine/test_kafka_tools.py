"""Kafka's own code reads Weir's files: `kafka.tools.DumpLogSegments` (kafka-dump-log) on
partition directories PartitionLog wrote with every codec (keys, headers, encryption
off) and on the golden directories, and every record, batch and index entry it prints
must be what Weir put there.

The JVM artifacts (set `kafka-tools`, Kafka 4.1.1 pinned with sha256 in
scripts/jvm/kafka-tools/) come from `scripts/jvm_deps.py` and its cache under var/jvm/;
`WEIR_KAFKA_HOME` points at a Kafka install to use instead (its libs/ on the class path).
If neither gives Kafka's classes the tests FAIL, naming what is missing: they are never
skipped.

The JVM starts three times per run, not per test: one DumpLogSegments invocation per
mode (`--deep-iteration --print-data-log`, `--verify-index-only`,
`--index-sanity-check`) with every file of every directory in its `--files` list.
DumpLogSegments prints keys and payloads as UTF-8 text and headers by key only, so the
data here is text and header values are left to kafka-python (test_kafka_codec.py) and
to Kafka's consumer reading Weir's files from a broker (test_kafka_broker.py).
A damaged copy of a golden directory rides along in every invocation, and Kafka must
report its damage: the parsing below is strict enough to see a failure.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_golden import EXPECTED as GOLDEN_EVENTS
from test_golden import GOLDENS
from test_kafka_codec import CODEC_IDS, CODECS, CONFIG, append_all, batches_for

from channel_engine.filenames import parse_segment_file
from channel_engine.log.partition_log import PartitionLog

ROOT = Path(__file__).resolve().parents[2]
LOG4J = ROOT / "scripts" / "jvm" / "kafka-tools" / "log4j.properties"
MODES = {
    "dump": ["--deep-iteration", "--print-data-log"],
    "verify": ["--verify-index-only"],
    "sanity": ["--index-sanity-check"],
}
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
BATCH = re.compile(
    r"baseOffset: (?P<base>\d+) lastOffset: (?P<last>\d+) count: (?P<count>\d+) "
    r"baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
    r"partitionLeaderEpoch: -1 isTransactional: false isControl: false "
    r"deleteHorizonMs: OptionalLong.empty position: (?P<position>\d+) "
    r"CreateTime: (?P<max_ts>-?\d+) size: (?P<size>\d+) magic: 2 "
    r"compresscodec: (?P<codec>\w+) crc: \d+ isvalid: (?P<valid>true|false)$")
RECORD = re.compile(
    r"\| offset: (?P<offset>\d+) CreateTime: (?P<ts>-?\d+) keySize: (?P<key_size>-?\d+) "
    r"valueSize: (?P<value_size>-?\d+) sequence: -1 headerKeys: \[(?P<headers>[^\]]*)\]"
    r"(?P<rest>.*)$", re.S)
OFFSET_ENTRY = re.compile(r"offset: (\d+) position: (\d+)$")
TIME_ENTRY = re.compile(r"timestamp: (-?\d+) offset: (\d+)$")


_FETCHED: dict[str, tuple[int, str, str]] = {}


def kafka_classpath() -> str:
    """Kafka's jars as a java -cp value: WEIR_KAFKA_HOME's libs, else the pinned set."""
    home = os.environ.get("WEIR_KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            pytest.fail(f"WEIR_KAFKA_HOME={home}: no libs/kafka_2.13-*.jar there", pytrace=False)
        return f"{libs}/*"
    if "kafka-tools" not in _FETCHED:  # fetch (or fail) once a run, not once a test
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "jvm_deps.py"),
                                 "kafka-tools"],
                                capture_output=True, text=True, timeout=900, check=False)
        _FETCHED["kafka-tools"] = (result.returncode, result.stdout, result.stderr)
    returncode, stdout, stderr = _FETCHED["kafka-tools"]
    if returncode != 0:
        pytest.fail("Kafka's tools are needed and could not be had: "
                    f"{stderr.strip()}\n(or set WEIR_KAFKA_HOME to a Kafka install)",
                    pytrace=False)
    return f"{stdout.split()[-1]}/*"


def java() -> str:
    """The java launcher: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not Path(found).exists():
        pytest.fail("Kafka's tools need Java 17 (no java on PATH, JAVA_HOME unset)", pytrace=False)
    return found


def dump_log_segments(classpath: str, mode: list[str],
                      files: list[Path]) -> tuple[str, str, float]:
    """Run DumpLogSegments once on every file; return its stdout, stderr and seconds taken."""
    command = [java(), f"-Dlog4j.configuration=file:{LOG4J}", "-cp", classpath,
               "kafka.tools.DumpLogSegments", *mode, "--files", ",".join(map(str, files))]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, f"DumpLogSegments {mode} exited {result.returncode}:\n" \
                                   f"{result.stderr[-3000:]}"
    return result.stdout, result.stderr, elapsed


REPORTS = ("Mismatches in :", "Found timestamp mismatch in :", "Found out of order timestamp in :",
           "Non-consecutive offsets in ")


def sections(output: str, errors: str) -> dict[str, list[str]]:
    """Split DumpLogSegments' stdout by "Dumping <file>"; the problem reports it prints
    after the last file (on stderr, or on stdout glued to the last file's last line: it
    ends lines lazily) and anything else on stderr go under ""."""
    for report in REPORTS:
        output = output.replace(report, "\n" + report)
    out: dict[str, list[str]] = {"": []}
    current, reporting = "", False
    for line in output.splitlines():
        reporting = reporting or line.startswith(REPORTS)
        if reporting:
            out[""].append(line)
        elif line.startswith("Dumping "):
            current = line[len("Dumping "):]
            out[current] = []
        elif line:
            out[current].append(line)
    out[""] += [line for line in errors.splitlines() if line]
    return out


def segment_bases(directory: Path) -> list[int]:
    return sorted(base for base, suffix in
                  (parse_segment_file(p.name) or (None, None) for p in directory.iterdir())
                  if suffix == ".log")


def segment_files(directory: Path) -> list[Path]:
    return [directory / f"{base:020d}{suffix}" for base in segment_bases(directory)
            for suffix in (".log", ".index", ".timeindex")]


def write_codec_partition(directory: Path, codec: str) -> list[tuple]:
    expected: list = []
    with PartitionLog.open(directory, CONFIG.replace(compression=codec)) as log:
        append_all(log, batches_for(seed=CODEC_IDS[codec], count=40), expected)
    return expected


def write_mixed_partition(directory: Path) -> list[tuple]:
    expected: list = []
    for codec in CODECS:
        with PartitionLog.open(directory, CONFIG.replace(compression=codec)) as log:
            append_all(log, batches_for(seed=20 + CODEC_IDS[codec], count=6), expected)
    return expected


def damage(directory: Path) -> None:
    """A payload byte flipped in segment 4 and the offset index entry of segment 0 moved to the
    batch before (a position mid-batch makes DumpLogSegments itself crash)."""
    log = directory / f"{4:020d}.log"
    data = bytearray(log.read_bytes())
    data[-3] ^= 0x20
    log.write_bytes(bytes(data))
    (directory / f"{0:020d}.index").write_bytes(struct.pack(">ii", 3, 0))


@pytest.fixture(scope="module")
def partitions(tmp_path_factory) -> dict[str, tuple[Path, list[tuple]]]:
    """Directory and expected (offset, timestamp, key, headers, body) of each partition."""
    root = tmp_path_factory.mktemp("kafka-tools")
    out = {}
    for codec in CODECS:
        out[codec] = (root / codec, write_codec_partition(root / codec, codec))
    out["mixed"] = (root / "mixed", write_mixed_partition(root / "mixed"))
    golden_expected = [(e.offset, e.timestamp, e.key, list(e.headers.items()), e.body)
                       for e in GOLDEN_EVENTS]
    for golden in GOLDENS.values():
        shutil.copytree(golden, root / golden.name)  # never run a tool on the committed files
        out[golden.name] = (root / golden.name, golden_expected)
    shutil.copytree(GOLDENS[1], root / "damaged")
    damage(root / "damaged")
    out["damaged"] = (root / "damaged", golden_expected)
    return out


@pytest.fixture(scope="module")
def dumps(partitions) -> dict[str, dict[str, list[str]]]:
    """Each mode's DumpLogSegments output over every file, split by file."""
    classpath = kafka_classpath()
    files = [f for directory, _ in partitions.values() for f in segment_files(directory)]
    out = {}
    for mode, args in MODES.items():
        output, errors, elapsed = dump_log_segments(classpath, args, files)
        print(f"DumpLogSegments {' '.join(args)}: {len(files)} files in {elapsed:.1f} s")
        out[mode] = sections(output, errors)
    return out


def parse_record(line: str) -> tuple:
    """(offset, timestamp, key, header keys, payload) of one `| offset: ...` line."""
    match = RECORD.match(line)
    assert match, f"not a record line: {line!r}"
    rest = match["rest"]
    key_size, value_size = int(match["key_size"]), int(match["value_size"])
    key = None
    if key_size >= 0:
        assert rest.startswith(" key: "), line
        key, rest = rest[6:6 + key_size].encode(), rest[6 + key_size:]
    assert rest.startswith(" payload: "), line
    payload = rest[len(" payload: "):].encode()
    assert len(payload) == value_size, line
    headers = match["headers"].split(",") if match["headers"] else []
    return int(match["offset"]), int(match["ts"]), key, headers, payload


def read_segment(lines: list[str], size: int) -> tuple[list[dict], list[tuple]]:
    """Batches and records DumpLogSegments printed for one .log file of `size` bytes."""
    assert lines[0].startswith("Log starting offset: ")
    batches: list[dict] = []
    records: list[tuple] = []
    for line in lines[1:]:
        if line.startswith("|"):
            records.append(parse_record(line))
            batches[-1]["records"].append(records[-1])
        else:
            match = BATCH.match(line)
            assert match, f"not a batch line: {line!r}"
            batches.append({**match.groupdict(), "records": []})
    assert sum(int(b["size"]) for b in batches) == size, "batches must cover the file"
    return batches, records


def check_batches(batches: list[dict], position: int = 0) -> None:
    for batch in batches:
        assert int(batch["position"]) == position
        position += int(batch["size"])
        assert batch["valid"] == "true"
        recs = batch["records"]
        assert int(batch["count"]) == len(recs)
        assert [r[0] for r in recs] == list(range(int(batch["base"]), int(batch["last"]) + 1))
        assert int(batch["max_ts"]) == max(r[1] for r in recs)


def log_dump(dumps, directory: Path) -> dict[int, list[dict]]:
    """Batches of each segment of a directory, as Kafka's dump printed them."""
    out = {}
    for base in segment_bases(directory):
        log = directory / f"{base:020d}.log"
        batches, _ = read_segment(dumps["dump"][str(log)], log.stat().st_size)
        assert int(batches[0]["base"]) == base, f"{log}: first batch vs file name"
        out[base] = batches
    return out


GOOD = ["none", "gzip", "snappy", "lz4", "zstd", "mixed", "partition-v1", "partition-v2"]


@pytest.mark.parametrize("name", GOOD)
def test_it_gets_every_record_back_from_kafkas_dump_as_weir_wrote_it(dumps, partitions, name):
    directory, expected = partitions[name]
    segments = log_dump(dumps, directory)
    records = []
    for batches in segments.values():
        check_batches(batches)
        records += [r for b in batches for r in b["records"]]
    assert records == [(o, t, k, [h for h, _ in hs], b) for o, t, k, hs, b in expected]
    codecs = {b["codec"] for batches in segments.values() for b in batches}
    if name in CODEC_IDS:
        assert codecs == {name}
    elif name == "mixed":
        assert codecs == set(CODECS)
    else:
        assert [b["codec"] for bs in segments.values() for b in bs] == \
            ["none", "none", "none", "gzip", "none"]


@pytest.mark.parametrize("name", GOOD)
def test_it_gets_every_index_entry_back_from_kafkas_dump_as_weir_wrote_it(dumps, partitions,
                                                                          name):
    directory, _ = partitions[name]
    segments = log_dump(dumps, directory)
    entries = 0
    for base, batches in segments.items():
        index, timeindex = (directory / f"{base:020d}{s}" for s in (".index", ".timeindex"))
        written = [(base + r, p) for r, p in struct.iter_unpack(">ii", index.read_bytes())]
        printed = [tuple(map(int, OFFSET_ENTRY.match(line).groups()))  # type: ignore[union-attr]
                   for line in dumps["dump"][str(index)] if OFFSET_ENTRY.match(line)]
        assert printed == written
        if not written:
            assert dumps["dump"][str(index)] == [f"{index} is empty."]
        starts = {int(b["position"]): int(b["last"]) for b in batches}
        assert all(starts.get(p) == o for o, p in printed), "an entry points at no batch's end"
        written_t = [(t, base + r) for t, r in struct.iter_unpack(">qi", timeindex.read_bytes())]
        printed_t = [tuple(map(int, TIME_ENTRY.match(line).groups()))  # type: ignore[union-attr]
                     for line in dumps["dump"][str(timeindex)] if TIME_ENTRY.match(line)]
        assert printed_t == written_t and printed_t
        max_ts = {int(b["last"]): int(b["max_ts"]) for b in batches}
        assert all(max_ts.get(o) == t for t, o in printed_t), "a time entry names no batch"
        entries += len(printed) + len(printed_t)
    assert entries > len(segments)
    assert not [line for line in dumps["dump"][""] if str(directory) in line], \
        "Kafka's dump reported index problems"


def verify_problems(dumps, directory: Path) -> list[str]:
    """Lines of --verify-index-only about a directory's files that are not plain listing."""
    fine = re.compile(r"^(Log starting offset: \d+|baseOffset: .*isvalid: true|.* is empty\.)$")
    return [line for f in segment_files(directory) for line in dumps["verify"][str(f)]
            if not fine.match(line)]


@pytest.mark.parametrize("name", GOOD)
def test_it_passes_kafkas_index_verification(dumps, partitions, name):
    directory, _ = partitions[name]
    assert verify_problems(dumps, directory) == []
    assert not [line for line in dumps["verify"][""] if str(directory) in line]


@pytest.mark.parametrize("name", GOOD)
def test_it_passes_kafkas_index_sanity_check(dumps, partitions, name):
    directory, _ = partitions[name]
    for f in segment_files(directory):
        if f.suffix != ".log":
            verdict = "is empty." if f.stat().st_size == 0 else "passed sanity check."
            assert dumps["sanity"][str(f)] == [f"{f} {verdict}"]


def test_it_sees_kafka_report_a_damaged_copy(dumps, partitions):
    directory, _ = partitions["damaged"]
    batches = log_dump(dumps, directory)
    assert [b["valid"] for b in batches[4]] == ["false"]
    problems = verify_problems(dumps, directory) + [
        line for line in dumps["verify"][""] if str(directory) in line]
    assert any("isvalid: false" in line for line in problems)
    assert any(f"{0:020d}.index" in line for line in problems), problems

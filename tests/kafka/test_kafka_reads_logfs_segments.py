"""Kafka reads logfs's segments (CONTRACT.md section 13): Kafka's own DumpLogSegments (Kafka's jars, in the session's
client JVM) over every segment of every kind logfs writes (tests/kafka/logfs_segments.py) reports no error and no
index mismatch, and prints the records that were appended, record by record; and ``logfs-dump-log-segments`` prints,
for the same files and options, what Kafka's tool prints, line for line.

All files of all kinds go to each of Kafka's runs at once (five runs, one JVM), and to logfs's tool likewise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from logfs.storage import LogConfig, ManualClock, load_log
from logfs.testing.kafka_dump import Dump, parse_dump
from logfs_segments import CODECS, T0, write_all

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["plain", *CODECS, "compacted", "compacted-zstd", "recovered", "tiered"]
MODES = {  # name -> (options, which files)
    "batches-and-indexes": ((), (".log", ".index", ".timeindex")),
    "deep-iteration": (("--deep-iteration",), (".log",)),
    "print-data-log": (("--deep-iteration", "--print-data-log"), (".log",)),
    "verify-index-only": (("--verify-index-only",), (".index", ".timeindex")),
    "index-sanity-check": (("--index-sanity-check",), (".index", ".timeindex")),
}


def java_string(data: bytes) -> str:
    """What Kafka's StringDecoder makes of bytes (new String(bytes, UTF_8): U+FFFD for each malformed sequence)."""
    return data.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return {p.kind: p for p in write_all(tmp_path_factory.mktemp("logfs-segments"))}


@pytest.fixture(scope="module")
def dumps(written, kafka_dump, tmp_path_factory) -> dict[str, tuple[Dump, Dump]]:
    """mode -> (Kafka's dump, logfs's dump) over the files of every kind. logfs's tool runs as its command does
    (a process of its own, one per mode, all at once) while Kafka's runs one mode after another in its JVM."""
    out_dir = tmp_path_factory.mktemp("logfs-dumps")
    running = {}
    for mode, (options, suffixes) in MODES.items():
        args = ["--files", ",".join(f for p in written.values() for f in p.files(suffixes)), *options]
        with open(out_dir / f"{mode}.out", "w") as out, open(out_dir / f"{mode}.err", "w") as err:
            running[mode] = (args, subprocess.Popen([sys.executable, "-m", "logfs.tools.dump", *args], cwd=ROOT,
                                                    stdout=out, stderr=err))
    out = {}
    for mode, (options, suffixes) in MODES.items():
        kafka = kafka_dump.run([f for p in written.values() for f in p.files(suffixes)], *options)
        args, proc = running[mode]
        status = proc.wait(timeout=300)
        logfs = parse_dump((out_dir / f"{mode}.out").read_text(), (out_dir / f"{mode}.err").read_text(), args,
                           status)
        out[mode] = (kafka, logfs)
    return out


def test_every_kind_was_written(written):
    assert sorted(written) == sorted(KINDS)
    for p in written.values():
        logs = p.files((".log",))
        assert len(logs) >= 2 and p.records, p.kind
        assert len(p.files((".index",))) == len(p.files((".timeindex",))) == len(logs), p.kind


def test_kafka_reads_every_batch_as_valid(written, dumps):
    kafka, _ = dumps["deep-iteration"]
    assert kafka.problems == [], kafka.problems
    for p in written.values():
        for log in p.files((".log",)):
            dumped = kafka.files[log]
            assert dumped.start_offset == int(Path(log).name[:20])
            assert not [line for line in dumped.other if "invalid bytes" in line], (p.kind, log)
            assert all(b["isvalid"] is True and b["magic"] == 2 for b in dumped.batches), (p.kind, log)
            positions = [b["position"] for b in dumped.batches]
            sizes = [b["size"] for b in dumped.batches]
            assert positions == [sum(sizes[:i]) for i in range(len(sizes))]
            assert sum(sizes) == Path(log).stat().st_size  # every byte is in a batch Kafka reads
            if dumped.batches:
                assert dumped.batches[0]["baseOffset"] >= dumped.start_offset
            for b in dumped.batches:  # the batch's fields agree with its records
                records = [r for r in dumped.records if r["baseOffset"] == b["baseOffset"]]
                assert len(records) == b["count"], (p.kind, b)
                if records:  # (the cleaner keeps an emptied batch, as Kafka's does, for the offsets it spans)
                    assert records[-1]["offset"] == b["lastOffset"]
                    assert b[b["timestamp_type"]] == max(r["timestamp"] for r in records)
        # The codec the segments were rewritten in, on every batch of every sealed segment.
        codecs = {b["compresscodec"] for log in p.files((".log",)) for b in kafka.files[log].batches if b["count"]}
        assert codecs == {p.codec}, p.kind


def test_kafka_sanity_checks_every_index(written, dumps):
    """The check a broker runs on each index when it loads a segment (``--index-sanity-check``)."""
    sanity, _ = dumps["index-sanity-check"]
    assert sanity.problems == [] and sanity.stderr == ""
    indexes = [f for p in written.values() for f in p.files((".index", ".timeindex"))]
    assert list(sanity.files) == indexes
    for path, dumped in sanity.files.items():
        assert dumped.other in ([f"{path} passed sanity check."], [f"{path} is empty."]), dumped.lines
    for p in written.values():  # not all empty: the check looked at entries
        passed = [f for f in p.files((".index",)) if sanity.files[f].other[0].endswith("passed sanity check.")]
        assert passed, p.kind


@pytest.mark.parametrize("kind", KINDS)
def test_kafka_finds_no_index_mismatch(written, kafka_dump, kind):
    """Every offset index entry names the last offset of the batch at its position, every time index entry the last
    offset of a batch whose largest timestamp it holds (``--verify-index-only``; one run per kind, as Kafka does not
    name the file of an indexed offset it did not find)."""
    files = written[kind].files((".index", ".timeindex"))
    verify = kafka_dump.run(files, "--verify-index-only")
    assert list(verify.files) == files
    assert verify.problems == [] and verify.stderr == ""
    assert all(verify.files[f].other in ([], [f"{f} is empty."]) for f in files)


def test_a_tail_batch_grown_in_place_leaves_no_stale_index_entry(tmp_path, kafka_dump):
    """Small appends grow the last batch in place (logfs/storage/local/tail_batch.py), but never a batch an index
    entry names: Kafka's --verify-index-only wants every entry to name the last offset of its batch (found by this
    test: the entry kept the batch's last offset from before it grew)."""
    def build(name: str, interval: int):
        log = load_log(str(tmp_path / name), "t", 0, LogConfig.for_tests(index_interval_bytes=interval),
                       clock=ManualClock(T0))
        log.append([b"first batch, indexed"] * 5)
        data = b"indexed too, then grown\n" * 3
        log.append_lines(b"", data, len(data))
        for i in range(40):
            log.append_lines(b"", b"line %d\n" % i, 7 + (i >= 10))
        log.roll()
        log.close()
        return [str(tmp_path / name / f"{0:020d}{s}") for s in (".log", ".index", ".timeindex")]

    every = build("t-0", 1)  # an entry for every batch: no batch grows
    sparse = build("t-1", 200)  # an entry every 200 bytes: the batches between entries grow
    batches = kafka_dump.run(every[:1]).batches()
    assert [(b["baseOffset"], b["lastOffset"]) for b in batches] == [(0, 4), (5, 7)] + [(o, o) for o in range(8, 48)]
    grown = [b for b in kafka_dump.run(sparse[:1]).batches() if b["lastOffset"] > b["baseOffset"] + 2]
    assert grown, "small appends grew a batch in place"
    verify = kafka_dump.run(every[1:] + sparse[1:], "--verify-index-only")
    assert verify.stderr == "" and verify.problems == []


@pytest.mark.parametrize("kind", KINDS)
def test_kafka_prints_the_appended_records(written, dumps, kind):
    p = written[kind]
    kafka, _ = dumps["print-data-log"]
    assert kafka.problems == [], kafka.problems
    got = [r for log in p.files((".log",)) for r in kafka.files[log].records]
    assert len(got) == len(p.records)
    for r, want in zip(got, p.records):
        expected = {
            "offset": want.offset, "timestamp_type": "CreateTime", "timestamp": want.timestamp,
            "keySize": -1 if want.key is None else len(want.key),
            "valueSize": -1 if want.value is None else len(want.value),
            "key": None if want.key is None else java_string(want.key),
            "payload": None if want.value is None else java_string(want.value),
            "headerKeys": [k for k, _ in want.headers], "sequence": -1, "isControl": False, "control": None,
        }
        assert {k: r[k] for k in expected} == expected
        assert r["baseOffset"] <= r["offset"] <= r["lastOffset"]
    # Offsets go up; a compacted log's gaps are what Kafka reports as non-consecutive, nothing else is.
    offsets = [r["offset"] for r in got]
    assert offsets == sorted(set(offsets))
    gaps = kafka.reported.get("non_consecutive", [])
    if kind.startswith("compacted"):
        assert any(line.startswith("Non-consecutive offsets in ") and f"/{kind}-0/" in line for line in gaps)
    else:
        assert not [line for line in gaps if f"/{kind}-0/" in line]


@pytest.mark.parametrize("mode", list(MODES))
def test_logfs_dump_prints_what_kafka_prints(dumps, mode):
    kafka, logfs = dumps[mode]
    assert kafka.error is None and kafka.status == 0
    assert logfs.status == 0, logfs.stderr
    for name, mine, theirs in (("stdout", logfs.stdout, kafka.stdout), ("stderr", logfs.stderr, kafka.stderr)):
        a, b = mine.splitlines(), theirs.splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert a == b, (f"{mode}: {name} differs at line {first + 1} ({len(a)} lines from logfs, {len(b)} from "
                        f"Kafka):\n  logfs: {a[first] if first < len(a) else '<end>'}\n"
                        f"  kafka: {b[first] if first < len(b) else '<end>'}")

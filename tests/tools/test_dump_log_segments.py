"""tools/dump_log_segments.py, run as a subprocess on engine-written and kafka-python-written segments.

Expected values come from kafka-python's own v2 batch reader (an implementation independent of the engine's
and of the tool's), not from the tool's code paths."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch as KafkaBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaBuilder

from harness import daemon_env
from logfs.storage import LogConfig, ManualClock, load_log

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "dump_log_segments.py"
T0 = 1_700_000_000_000
BATCH_FIELDS = [
    "baseOffset", "lastOffset", "count", "baseSequence", "lastSequence", "producerId", "producerEpoch",
    "partitionLeaderEpoch", "isTransactional", "isControl", "deleteHorizonMs", "position", "CreateTime", "size",
    "magic", "compresscodec", "crc", "isvalid",
]
FIELD = re.compile(r"(\w+): (\S+)")


def dump(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env=daemon_env())


def batch_lines(out: str) -> list[dict[str, str]]:
    """Batch lines as ordered field dicts (every batch field's value is a single token)."""
    return [dict(FIELD.findall(line)) for line in out.splitlines() if line.startswith("baseOffset: ")]


def kafka_batches(path: Path) -> list[tuple[int, KafkaBatch]]:
    """(position, batch) for each whole batch in the file, read by kafka-python."""
    data, pos, out = path.read_bytes(), 0, []
    while len(data) - pos >= 61:
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        if pos + size > len(data):
            break
        out.append((pos, KafkaBatch(data[pos : pos + size])))
        pos += size
    return out


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A partition written by the engine: two sealed-by-close segments (0 and 20), keys, tombstones, headers."""
    directory = tmp_path / "topic-0"
    log = load_log(str(directory), "topic", 0, LogConfig.for_tests(index_interval_bytes=100),
                   clock=ManualClock(T0))
    for i in range(10):
        log.append([f"value-{i}".encode(), None], keys=[f"k{i}".encode(), f"k{i}".encode()],
                   headers=[[("h1", b"x"), ("h2", None)], []], timestamp_ms=T0 + i)
    log.roll()
    log.append(["héllo wörld".encode(), b"plain"], timestamp_ms=T0 + 1000)
    log.close()
    return directory


def seg(directory: Path, base: int, suffix: str) -> Path:
    return directory / f"{base:020d}{suffix}"


# -- .log ------------------------------------------------------------------------------------------
def test_engine_log_batch_lines(engine_dir: Path):
    log0 = seg(engine_dir, 0, ".log")
    result = dump("--files", str(log0))
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"Dumping {log0}", "Log starting offset: 0"]
    parsed = batch_lines(result.stdout)
    expected = kafka_batches(log0)
    assert len(parsed) == len(expected) == 10 == len(lines) - 2
    for fields, (pos, kb) in zip(parsed, expected):
        assert list(fields) == BATCH_FIELDS
        assert kb.validate_crc()
        assert fields == {
            "baseOffset": str(kb.base_offset), "lastOffset": str(kb.last_offset), "count": "2",
            "baseSequence": "-1", "lastSequence": "-1", "producerId": "-1", "producerEpoch": "-1",
            "partitionLeaderEpoch": "0", "isTransactional": "false", "isControl": "false",
            "deleteHorizonMs": "OptionalLong.empty", "position": str(pos), "CreateTime": str(kb.max_timestamp),
            "size": str(kb.size_in_bytes), "magic": "2", "compresscodec": "none", "crc": str(kb.crc),
            "isvalid": "true",
        }
    assert [int(f["baseOffset"]) for f in parsed] == list(range(0, 20, 2))
    assert [int(f["CreateTime"]) for f in parsed] == [T0 + i for i in range(10)]
    positions = [int(f["position"]) for f in parsed]
    sizes = [int(f["size"]) for f in parsed]
    assert positions == [sum(sizes[:i]) for i in range(10)] and sum(sizes) == log0.stat().st_size


def test_engine_deep_iteration(engine_dir: Path):
    result = dump("--deep-iteration", "--files", str(seg(engine_dir, 0, ".log")))
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()[2:]
    assert len(lines) == 30  # each batch line followed by its two record lines
    assert lines[0].startswith("baseOffset: 0 lastOffset: 1 ")
    assert lines[1] == f"| offset: 0 CreateTime: {T0} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [h1,h2]"
    assert lines[2] == f"| offset: 1 CreateTime: {T0} keySize: 2 valueSize: -1 sequence: -1 headerKeys: []"
    assert lines[28] == f"| offset: 18 CreateTime: {T0 + 9} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [h1,h2]"
    assert "payload" not in result.stdout and "key: " not in result.stdout


def test_engine_print_data_log(engine_dir: Path):
    result = dump("--print-data-log", "--files", f"{seg(engine_dir, 0, '.log')},{seg(engine_dir, 20, '.log')}")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[3] == f"| offset: 0 CreateTime: {T0} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [h1,h2]" \
                       " key: k0 payload: value-0"
    # A tombstone prints its key and no payload.
    assert lines[4] == f"| offset: 1 CreateTime: {T0} keySize: 2 valueSize: -1 sequence: -1 headerKeys: [] key: k0"
    second = lines[lines.index(f"Dumping {seg(engine_dir, 20, '.log')}"):]
    assert second[1] == "Log starting offset: 20"
    assert second[2].startswith("baseOffset: 20 lastOffset: 21 count: 2 ")
    assert second[3] == (f"| offset: 20 CreateTime: {T0 + 1000} keySize: -1 valueSize: {len('héllo wörld'.encode())}"
                         " sequence: -1 headerKeys: [] payload: héllo wörld")
    assert second[4].endswith("headerKeys: [] payload: plain")


def test_invalid_trailing_bytes(engine_dir: Path):
    log0 = seg(engine_dir, 0, ".log")
    with open(log0, "ab") as f:
        f.write(b"\x00" * 7 + b"garbage, not a batch")
    result = dump("--files", str(log0))
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(batch_lines(result.stdout)) == 10
    assert lines[-1] == "Found 27 invalid bytes at the end of 00000000000000000000.log"

    # A torn last batch: the whole partial batch counts as invalid bytes.
    size = log0.stat().st_size
    os.truncate(log0, size - 27 - 10)
    result = dump("--files", str(log0))
    assert len(batch_lines(result.stdout)) == 9
    assert result.stdout.splitlines()[-1] == f"Found {95 - 10} invalid bytes at the end of 00000000000000000000.log"


def test_crc_invalid_batch(engine_dir: Path):
    log0 = seg(engine_dir, 0, ".log")
    data = bytearray(log0.read_bytes())
    pos = kafka_batches(log0)[3][0]
    at = data.index(b"value-3", pos)
    data[at + 6] ^= 0x01  # value-3 -> value-2 with a stale CRC
    log0.write_bytes(bytes(data))
    result = dump("--print-data-log", "--files", str(log0))
    assert result.returncode == 0
    parsed = batch_lines(result.stdout)
    assert [f["isvalid"] for f in parsed] == ["true"] * 3 + ["false"] + ["true"] * 6
    assert parsed[3]["crc"] == str(KafkaBatch(bytes(data[pos : pos + 95])).crc)
    assert "key: k3 payload: value-2" in result.stdout
    assert "invalid bytes" not in result.stdout


# -- indexes ---------------------------------------------------------------------------------------
def test_index_and_timeindex(engine_dir: Path):
    index, timeindex = seg(engine_dir, 0, ".index"), seg(engine_dir, 0, ".timeindex")
    files = [index, timeindex, seg(engine_dir, 20, ".index"), seg(engine_dir, 20, ".timeindex")]
    result = dump("--files", ",".join(map(str, files)))
    assert result.returncode == 0 and result.stderr == ""
    last_offset_at = {pos: kb.last_offset for pos, kb in kafka_batches(seg(engine_dir, 0, ".log"))}
    max_ts_of = {kb.last_offset: kb.max_timestamp for _, kb in kafka_batches(seg(engine_dir, 0, ".log"))}
    out = result.stdout.split("Dumping ")
    index_lines = out[1].splitlines()
    assert index_lines[0] == str(index)
    entries = [tuple(map(int, re.fullmatch(r"offset: (\d+) position: (\d+)", line).groups()))
               for line in index_lines[1:]]
    # 95-byte batches and a 100-byte interval: an entry for every second batch, as Kafka's append does.
    assert entries == [(5, 190), (9, 380), (13, 570), (17, 760)]
    assert all(last_offset_at[pos] == offset for offset, pos in entries)
    assert len(index.read_bytes()) == 8 * len(entries)

    time_lines = out[2].splitlines()
    assert time_lines[0] == str(timeindex)
    times = [tuple(map(int, re.fullmatch(r"timestamp: (\d+) offset: (\d+)", line).groups()))
             for line in time_lines[1:]]
    assert times == [(T0 + 2, 5), (T0 + 4, 9), (T0 + 6, 13), (T0 + 8, 17), (T0 + 9, 19)]
    assert all(max_ts_of[offset] == ts for ts, offset in times)
    assert out[3].splitlines() == [str(seg(engine_dir, 20, ".index")), f"{seg(engine_dir, 20, '.index')} is empty."]
    assert out[4].splitlines() == [str(seg(engine_dir, 20, ".timeindex")), f"timestamp: {T0 + 1000} offset: 21"]


def test_index_stops_at_preallocated_zero_slots(engine_dir: Path):
    index = seg(engine_dir, 0, ".index")
    with open(index, "ab") as f:
        f.write(bytes(8 * 50))
    result = dump("--files", str(index))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.splitlines()[1:] == [
        "offset: 5 position: 190", "offset: 9 position: 380", "offset: 13 position: 570", "offset: 17 position: 760"]


def test_verify_index_only_and_sanity_check_clean(engine_dir: Path):
    files = ",".join(str(seg(engine_dir, b, s)) for b in (0, 20) for s in (".index", ".timeindex"))
    result = dump("--verify-index-only", "--files", files)
    assert result.returncode == 0 and result.stderr == ""
    assert all(line.startswith("Dumping ") or line.endswith("is empty.") for line in result.stdout.splitlines())
    result = dump("--index-sanity-check", "--files",
                  f"{seg(engine_dir, 0, '.index')},{seg(engine_dir, 0, '.timeindex')}")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.count("passed sanity check.") == 2


def test_verify_index_only_finds_mismatches(engine_dir: Path):
    index, timeindex = seg(engine_dir, 0, ".index"), seg(engine_dir, 0, ".timeindex")
    with open(index, "r+b") as f:
        f.seek(8)
        f.write(struct.pack(">ii", 8, 380))  # the batch at 380 ends at offset 9, not 8
    with open(timeindex, "r+b") as f:
        f.seek(24)
        f.write(struct.pack(">qi", T0 + 1, 13))  # goes backwards and disagrees with the batch's max timestamp
        f.write(struct.pack(">qi", T0 + 8, 16))  # offset 16 is not the last offset of a batch
    result = dump("--verify-index-only", "--files", f"{index},{timeindex}")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"Dumping {index}", f"Dumping {timeindex}"]
    assert result.stderr.splitlines() == [
        f"Mismatches in :{index}",
        "  Index offset: 8, log offset: 9",
        f"Found timestamp mismatch in :{timeindex}",
        f"  Index timestamp: {T0 + 1}, log timestamp: {T0 + 6}",
        f"Found out of order timestamp in :{timeindex}",
        f"  Index timestamp: {T0 + 1}, Previously indexed timestamp: {T0 + 4}",
        "The following indexed offsets are not found in the log.",
        "Indexed offset: 16, found log offset: 17",
    ]
    # Without --verify-index-only the entries print too, and the same errors are reported.
    result = dump("--files", str(index))
    assert "offset: 8 position: 380" in result.stdout and "  Index offset: 8, log offset: 9" in result.stderr


# -- a segment written by kafka-python -------------------------------------------------------------
def _kafka_segment(directory: Path) -> tuple[Path, list[bytes]]:
    """Base offset 100: an idempotent uncompressed batch, a gzip batch with keys and headers, a LogAppendTime
    batch and a transactional COMMIT control batch."""
    batches = []
    b = KafkaBuilder(2, 0, 0, 4242, 3, 10, 1 << 20)
    for i in range(3):
        b.append(i, T0 + i, None, f"idem-{i}".encode(), [])
    batches.append(bytearray(b.build()))
    b = KafkaBuilder(2, 1, 0, -1, -1, -1, 1 << 20)  # gzip
    for i in range(4):
        b.append(i, T0 + 10 + i, f"key-{i}".encode(), f"zipped-{i}".encode() * 20, [("trace", b"t"), ("n", None)])
    batches.append(bytearray(b.build()))
    b = KafkaBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    b.append(0, T0 + 20, b"lat", b"appended", [])
    batches.append(bytearray(b.build()))
    b = KafkaBuilder(2, 0, 1, 4242, 3, -1, 1 << 20)
    b.append(0, T0 + 30, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 7), [])
    batches.append(bytearray(b.build()))

    def restamp(buf: bytearray, attrs_or: int = 0, max_ts: int | None = None) -> None:
        attrs = struct.unpack_from(">h", buf, 21)[0] | attrs_or
        struct.pack_into(">h", buf, 21, attrs)
        if max_ts is not None:
            struct.pack_into(">q", buf, 35, max_ts)
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))

    restamp(batches[2], 0x08, T0 + 555)  # LogAppendTime, stamped by the "broker"
    restamp(batches[3], 0x20)  # control
    offset = 100
    for buf in batches:
        struct.pack_into(">q", buf, 0, offset)
        struct.pack_into(">i", buf, 12, 7)  # partition leader epoch
        offset += KafkaBatch(bytes(buf)).last_offset_delta + 1
    path = directory / f"{100:020d}.log"
    path.write_bytes(b"".join(batches))
    return path, [bytes(b) for b in batches]


def test_kafka_python_segment(tmp_path: Path):
    path, raw = _kafka_segment(tmp_path)
    result = dump("--print-data-log", "--files", str(path))
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"Dumping {path}", "Log starting offset: 100"]
    parsed = batch_lines(result.stdout)
    expected = kafka_batches(path)
    assert len(parsed) == 4
    for fields, (pos, kb), buf in zip(parsed, expected, raw):
        assert list(fields) == BATCH_FIELDS[:12] + [list(fields)[12]] + BATCH_FIELDS[13:]
        assert kb.validate_crc() and fields["isvalid"] == "true"
        assert fields["crc"] == str(kb.crc) and fields["size"] == str(len(buf)) == str(kb.size_in_bytes)
        assert fields["position"] == str(pos) and fields["partitionLeaderEpoch"] == "7"
        assert fields["baseOffset"] == str(kb.base_offset) and fields["lastOffset"] == str(kb.last_offset)
        assert fields["count"] == str(kb.records_count)
    assert [f["compresscodec"] for f in parsed] == ["none", "gzip", "none", "none"]
    assert [f["baseOffset"] for f in parsed] == ["100", "103", "107", "108"]
    idem, gz, lat, ctl = parsed
    assert (idem["baseSequence"], idem["lastSequence"], idem["producerId"], idem["producerEpoch"]) == \
        ("10", "12", "4242", "3")
    assert gz["CreateTime"] == str(T0 + 13) and gz["count"] == "4"
    assert "CreateTime" not in lat and lat["LogAppendTime"] == str(T0 + 555)
    assert (ctl["isTransactional"], ctl["isControl"], ctl["producerId"]) == ("true", "true", "4242")

    records = [line for line in lines if line.startswith("| ")]
    assert records[0] == f"| offset: 100 CreateTime: {T0} keySize: -1 valueSize: 6 sequence: 10 headerKeys: []" \
                         " payload: idem-0"
    assert records[2].startswith(f"| offset: 102 CreateTime: {T0 + 2} keySize: -1 valueSize: 6 sequence: 12 ")
    value = "zipped-1" * 20
    assert records[4] == (f"| offset: 104 CreateTime: {T0 + 11} keySize: 5 valueSize: {len(value)} sequence: -1"
                          f" headerKeys: [trace,n] key: key-1 payload: {value}")
    assert records[7] == f"| offset: 107 LogAppendTime: {T0 + 555} keySize: 3 valueSize: 8 sequence: -1" \
                         " headerKeys: [] key: lat payload: appended"
    assert records[8] == f"| offset: 108 CreateTime: {T0 + 30} keySize: 4 valueSize: 6 sequence: -1 headerKeys: []" \
                         " endTxnMarker: COMMIT coordinatorEpoch: 7"
    assert len(records) == 9


def test_undecodable_compressed_batch(tmp_path: Path):
    path, raw = _kafka_segment(tmp_path)
    data = bytearray(path.read_bytes())
    start = len(raw[0]) + 61
    data[start : start + 20] = bytes(20)  # wreck the gzip stream of the second batch
    path.write_bytes(bytes(data))
    result = dump("--deep-iteration", "--files", str(path))
    assert result.returncode == 1
    assert [f["isvalid"] for f in batch_lines(result.stdout)] == ["true", "false", "true", "true"]
    assert f"cannot decode the records of the batch at position {len(raw[0])}" in result.stderr
    assert "| offset: 107 LogAppendTime" in result.stdout  # later batches still dumped


def test_missing_file_fails_clearly(tmp_path: Path):
    missing = tmp_path / f"{0:020d}.log"
    result = dump("--files", str(missing))
    assert result.returncode != 0
    assert f"{missing} does not exist" in result.stderr
    result = dump("--files", str(tmp_path / f"{0:020d}.index"))
    assert result.returncode != 0 and "does not exist" in result.stderr
    assert dump().returncode != 0  # --files is required


def test_a_batch_met_mid_grow_is_read_again_not_reported(tmp_path: Path, monkeypatch):
    """The daemon grows the active segment's last batch in place: the records past the end, then the header.
    The dump meets the file between the two and a thread finishes the grow meanwhile: it reads the file again
    and dumps the grown batch whole, with no invalid bytes reported."""
    import threading
    import time

    from logfs.tools import dump as dump_module

    directory = tmp_path / "t-0"
    log = load_log(str(directory), "t", 0, LogConfig.for_tests(), clock=ManualClock(T0))
    for i in range(5):
        log.append_lines(b"", b"line %d\n" % i, 7)
    path = Path(log.active_segment.log_path)
    images = []
    real = os.pwrite

    def pwrite(fd, data, position):
        images.append((bytes(data), position))
        return len(data)  # only recorded: the test writes them itself

    monkeypatch.setattr(os, "pwrite", pwrite)
    log.append_lines(b"", b"line 5\n", 7)
    monkeypatch.undo()
    log.close_without_flush()
    (records, end), (header, at) = images
    assert at == 0 and end == path.stat().st_size
    fd = os.open(path, os.O_WRONLY)
    real(fd, records, end)  # the state between the two writes
    finish = threading.Timer(0.003, lambda: real(fd, header, at))
    finish.start()
    buf = dump_module.read_log(str(path))
    finish.join()
    os.close(fd)
    parsed = list(dump_module.batches(buf))
    assert len(parsed) == 1 and parsed[0][1].records_count == 6 and parsed[0][1].size == len(buf)
    result = dump("--deep-iteration", "--files", str(path))
    assert "invalid bytes" not in result.stdout and "isvalid: true" in result.stdout
    assert result.stdout.count("| offset: ") == 6

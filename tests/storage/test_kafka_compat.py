"""Cross-validation with an independent Kafka v2 implementation (kafka-python's pure-Python codec).

Both directions: every .log the engine writes parses with kafka-python, and segments written by kafka-python
(as a foreign writer would: plain `<base>.log` files, no indexes, optionally compressed) load and read back.
kafka-python's codecs need python-snappy (snappy), lz4 (lz4) and zstandard (zstd); gzip is in the stdlib.
"""

import os
import random
import struct

import pytest
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from logfs.storage import LogConfig, LogManager, BrokerConfig
from logfs.view.text import live_view

CODECS = {
    "none": (0, lambda: True, None),
    "gzip": (1, kafka_codec.has_gzip, None),
    "snappy": (2, kafka_codec.has_snappy, "python-snappy"),
    "lz4": (3, kafka_codec.has_lz4, "lz4"),
    "zstd": (4, kafka_codec.has_zstd, "zstandard"),
}


def require_codec(name):
    code, available, package = CODECS[name]
    if not available():
        pytest.skip(f"kafka-python cannot {name}-compress without the {package} package")
    return code


def parse_log_file(path):
    """[(batch, [records])] of one .log file, via kafka-python; every batch's CRC is checked."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    records = MemoryRecords(data)
    consumed = 0
    while records.has_next():
        batch = records.next_batch()
        assert isinstance(batch, DefaultRecordBatch)
        assert batch.magic == 2
        assert batch.validate_crc(), f"CRC mismatch in {path} batch {batch.base_offset}"
        consumed += batch.size_in_bytes
        out.append((batch, list(batch)))
    assert consumed == len(data), "trailing bytes kafka-python could not parse"
    return out


def render(records, sep=None, marker=None):
    out = []
    for key, value in records:
        body = value if value is not None else (marker or b"")
        out.append((key + sep if sep and key is not None else b"") + body + b"\n")
    return b"".join(out)


def all_records(log):
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        got = log.read(offset)
        out += got
        offset = got[-1].offset + 1
    return out


# -- the engine's files, read by kafka-python --------------------------------------------------------

def test_engine_segments_parse_with_kafka_python(open_log, clock):
    rng = random.Random(3)
    log = open_log(LogConfig.for_tests(segment_bytes=4096, index_interval_bytes=256))
    expected = []
    for i in range(120):
        n = rng.randint(1, 6)
        vals = [None if rng.random() < 0.1 else os.urandom(rng.randint(0, 60)) for _ in range(n)]
        keys = [None if rng.random() < 0.3 else f"key-{rng.randint(0, 9)}".encode() for _ in range(n)]
        hdrs = [[(f"h{j}", None if rng.random() < 0.2 else os.urandom(3)) for j in range(rng.randint(0, 2))]
                for _ in range(n)]
        first, _ = log.append(vals, keys=keys, headers=hdrs)
        expected += [(first + j, clock.time_ms(), keys[j], vals[j], hdrs[j]) for j in range(n)]
        clock.advance(rng.randint(0, 20))
    first, _ = log.append([b"a", b"b", b"c", b"d", b"e"], keys=[b"1", None, b"3", None, b"5"])
    expected += [(first + j, clock.time_ms(), k, v, []) for j, (k, v) in
                 enumerate(zip([b"1", None, b"3", None, b"5"], [b"a", b"b", b"c", b"d", b"e"]))]
    log.truncate_to(first + 3)  # inside the last batch: the engine rewrites it, and it must parse too
    expected = expected[:-2]
    log.append([b"tail"], keys=[b"k"])
    expected.append((expected[-1][0] + 1, clock.time_ms(), b"k", b"tail", []))
    log.roll()
    log.close()

    files = sorted(n for n in os.listdir(log.directory) if n.endswith(".log"))
    assert len(files) > 3
    assert os.path.getsize(os.path.join(log.directory, files[-1])) == 0  # the fresh active segment
    parsed = []
    for name in files[:-1]:
        batches = parse_log_file(os.path.join(log.directory, name))
        assert batches[0][0].base_offset == int(name[:20])  # the file is named after its first offset
        for batch, records in batches:
            assert batch.compression_type == 0
            assert batch.last_offset == records[-1].offset
            assert batch.max_timestamp == max(r.timestamp for r in records)
            assert [r.offset for r in records] == list(range(batch.base_offset, batch.last_offset + 1))
            parsed += records
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in parsed] == [
        (o, ts, k, v, [tuple(h) for h in hs]) for o, ts, k, v, hs in expected]


# -- kafka-python's batches, read by the engine ------------------------------------------------------

def kafka_batch(base_offset, records, compression=0, producer=None):
    """One v2 batch built by kafka-python; records are (offset delta, timestamp, key, value, headers)."""
    builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 30)
    if producer is not None:
        builder.set_producer_state(*producer, False)
    for delta, ts, key, value, headers in records:
        assert builder.append(delta, ts, key, value, headers) is not None
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base_offset)  # what the broker does; not covered by the CRC
    return bytes(buf)


def foreign_partition(directory, compression, rng, segments=3, batches_per_segment=6):
    """Write a partition as another Kafka writer would. Returns [(offset, ts, key, value, headers)]."""
    os.makedirs(directory, exist_ok=True)
    model, offset, ts = [], 0, 1_600_000_000_000
    for _ in range(segments):
        base = offset
        data = []
        for b in range(batches_per_segment):
            n = rng.randint(1, 40)
            recs = []
            for d in range(n):
                ts += rng.randint(0, 3)
                key = None if rng.random() < 0.3 else f"user-{rng.randint(0, 20)}".encode()
                value = None if rng.random() < 0.1 else (b"compressible text " * rng.randint(0, 8)
                                                         + str(offset + d).encode())
                headers = [("trace", str(offset + d).encode())] if rng.random() < 0.3 else []
                recs.append((d, ts, key, value, headers))
            producer = (1000 + b, 0, offset) if b % 2 else None
            batch = kafka_batch(offset, recs, compression, producer)
            if compression and n > 3:
                assert batch[22] & 0x07 == compression, "kafka-python did not compress the batch"
            data.append(batch)
            model += [(offset + d, t, k, v, h) for d, t, k, v, h in recs]
            offset += n
        with open(os.path.join(directory, f"{base:020d}.log"), "wb") as f:
            f.write(b"".join(data))
    return model


@pytest.mark.parametrize("name", sorted(CODECS))
def test_foreign_segments_load_and_read(tmp_path, open_log, name):
    compression = require_codec(name)
    rng = random.Random(compression)
    directory = tmp_path / "t-0"
    model = foreign_partition(str(directory), compression, rng)
    assert not any(n.endswith("index") for n in os.listdir(directory))
    fmt = dict(key_separator=b"=", null_marker=b"NULL")
    log = open_log(LogConfig.for_tests(index_interval_bytes=256, **fmt), had_clean_shutdown=True)
    assert log.log_end_offset == len(model)
    got = all_records(log)
    assert [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers)) for r in got] == [
        (o, ts, k, v, tuple(tuple(x) for x in h)) for o, ts, k, v, h in model]
    for offset in rng.sample(range(len(model)), 30):
        assert log.read(offset, max_bytes=1)[0].offset == offset
    for o, ts, *_ in rng.sample(model, 20):
        assert log.offset_for_timestamp(ts) == next(m[0] for m in model if m[1] >= ts)

    expected = render([(k, v) for _, _, k, v, _ in model], b"=", b"NULL")
    view = live_view(log)
    assert view.length() == len(expected)
    assert view.read(0, len(expected) + 10) == expected
    for _ in range(50):
        pos = rng.randrange(len(expected))
        size = rng.randint(1, 3000)
        assert view.read(pos, size) == expected[pos:pos + size]
    # The engine appends after the foreign batches, and kafka-python reads the result.
    log.append([b"mine"], keys=[b"me"])
    assert live_view(log).length() == len(expected) + len(b"me=mine\n")
    log.close()
    parsed = [r for name_ in sorted(os.listdir(directory)) if name_.endswith(".log")
              for _, rs in parse_log_file(os.path.join(directory, name_)) for r in rs]
    assert [(r.offset, r.value) for r in parsed[-2:]] == [(len(model) - 1, model[-1][3]), (len(model), b"mine")]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_truncate_inside_a_foreign_compressed_batch(tmp_path, open_log, name):
    compression = require_codec(name)
    directory = tmp_path / "t-0"
    os.makedirs(directory)
    recs = [(d, 1000 + d, None, b"repeat me please " * 4 + str(d).encode(), []) for d in range(20)]
    with open(directory / f"{0:020d}.log", "wb") as f:
        f.write(kafka_batch(0, recs, compression))
    log = open_log(LogConfig.for_tests())
    log.truncate_to(7)
    assert [r.value for r in all_records(log)] == [v for _, _, _, v, _ in recs[:7]]
    log.append([b"next"])
    log.close()
    parsed = [r for name_ in sorted(os.listdir(directory)) if name_.endswith(".log")
              for _, rs in parse_log_file(str(directory / name_)) for r in rs]
    assert [(r.offset, r.timestamp, r.value) for r in parsed] == [
        (d, 1000 + d, v) for d, _, _, v, _ in recs[:7]] + [(7, parsed[-1].timestamp, b"next")]


def test_foreign_data_dir_mounts_through_the_manager(tmp_path):
    rng = random.Random(11)
    data = tmp_path / "data"
    models = {p: foreign_partition(str(data / f"events-{p}"), require_codec("gzip") if p else 0, rng, segments=2)
              for p in range(2)}
    mgr = LogManager(str(data), BrokerConfig.from_properties({}))
    try:
        assert mgr.list_topics() == ["events"] and mgr.partitions("events") == [0, 1]
        for p, model in models.items():
            log = mgr.get_log("events", p)
            assert [(r.offset, r.value) for r in all_records(log)] == [(o, v) for o, _, _, v, _ in model]
            expected = render([(k, v) for _, _, k, v, _ in model])
            view = live_view(log)
            assert view.length() == len(expected) and view.read(0, len(expected)) == expected
    finally:
        mgr.close()


def test_foreign_compacted_batch_with_offset_gaps(tmp_path, open_log):
    """A compacted batch (as Kafka's cleaner leaves it) has gaps between record offsets."""
    directory = tmp_path / "t-0"
    os.makedirs(directory)
    deltas = [0, 2, 5, 9]
    recs = [(d, 1000 + d, f"k{d}".encode(), f"v{d}".encode(), []) for d in deltas]
    data = kafka_batch(10, recs) + kafka_batch(20, [(0, 2000, b"k20", b"v20", [])])
    with open(directory / f"{10:020d}.log", "wb") as f:
        f.write(data)
    log = open_log(LogConfig.for_tests(key_separator=b":"))
    assert log.log_start_offset == 10 and log.log_end_offset == 21
    assert [r.offset for r in all_records(log)] == [10, 12, 15, 19, 20]
    assert log.read(11)[0].offset == 12  # a read in a gap starts at the next retained record
    assert log.read(16)[0].offset == 19
    assert log.offset_for_timestamp(1003) == 15
    view = live_view(log)
    assert view.read(0, 100) == b"k0:v0\nk2:v2\nk5:v5\nk9:v9\nk20:v20\n"
    assert view.position_of(13) == len(b"k0:v0\nk2:v2\n")
    assert view.offset_at(len(b"k0:v0\nk2:v2\n")) == 15
    # Truncating inside the gapped batch keeps the surviving records at their offsets.
    log.truncate_to(17)
    assert [(r.offset, r.value) for r in all_records(log)] == [(10, b"v0"), (12, b"v2"), (15, b"v5")]
    assert log.log_end_offset == 16
    first, _ = log.append([b"next"])
    assert first == 16
    log.close()
    parsed = [r for _, rs in parse_log_file(str(directory / f"{10:020d}.log")) for r in rs]
    assert [(r.offset, r.timestamp, r.key) for r in parsed[:3]] == [(10, 1000, b"k0"), (12, 1002, b"k2"),
                                                                     (15, 1005, b"k5")]

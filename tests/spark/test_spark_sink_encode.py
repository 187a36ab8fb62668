"""The sink's row paths without Spark: Kafka's murmur2 and default partitioner (against kafka-python's, an
independent implementation of the Java client's), and batches encoded from Arrow buffers in C, byte for byte the
Python path's."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from logfs.spark import sink_rows as sink
from logfs.storage.format import records as rec

_speedups = pytest.importorskip("logfs._speedups")


# Kafka's own test vectors (UtilsTest.testMurmur2).
KAFKA_VECTORS = {"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
                 "a-little-bit-longer-string": -1486304829, "abc": 479470107,
                 "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971}


def test_murmur2_is_kafkas():
    for text, expected in KAFKA_VECTORS.items():
        assert sink.murmur2(text.encode()) == _speedups.murmur2(text.encode()) == expected
    rng = random.Random(5)
    for n in list(range(40)) + [100, 1000]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert sink.murmur2(data) & 0xFFFFFFFF == kafka_murmur2(data) & 0xFFFFFFFF
        assert _speedups.murmur2(data) == sink.murmur2(data)
    # A key lands where the Java producer's default partitioner puts it (kafka-python's copy of it:
    # DefaultPartitioner.partition).
    partitions = list(range(7))
    for i in range(200):
        key = f"user-{i}".encode()
        assert sink.default_partition(key, partitions, 0)[0] == (kafka_murmur2(key) & 0x7FFFFFFF) % 7


def _column(items, kind=pa.binary()):
    return pa.array(items, kind)


@pytest.mark.parametrize("offset", [0, 3])
def test_partition_rows_in_c_is_the_python_path(offset):
    rng = random.Random(offset)
    n = 500
    keys = [None if rng.random() < 0.2 else f"k{rng.randrange(50)}".encode() * rng.randrange(1, 4) for _ in range(n)]
    explicit = [None if rng.random() < 0.7 else rng.choice([0, 2, 5]) for _ in range(n)]
    parts = [0, 1, 2, 5, 9]  # a hole-y topic: partitions are its numbers, not 0..n-1
    kcol = _column([b"pad"] * offset + keys).slice(offset)
    ecol = pa.array([1] * offset + explicit, pa.int32()).slice(offset)
    raw, rr = _speedups.partition_rows(n, sink._buffers(kcol),
                                       (ecol.buffers()[0], ecol.buffers()[1], ecol.offset),
                                       pa.array(parts, pa.int32()).buffers()[1], 7)
    got = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(raw)]).to_pylist()
    want, r = [], 7
    for k, e in zip(keys, explicit):
        if e is None:
            e, r = sink.default_partition(k, parts, r)
        want.append(e)
    assert got == want and rr == r


@pytest.mark.parametrize("keyed", [True, False])
def test_encode_arrow_is_the_python_path(keyed):
    rng = random.Random(9)
    n = 3000
    values = [None if rng.random() < 0.05 else rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]
    keys = [None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 20)) for _ in range(n)] if keyed else None
    order = list(range(n))
    rng.shuffle(order)
    vcol = _column(values)
    kcol = _column(keys) if keyed else None
    idx = pa.array(order, pa.int64())
    got = _speedups.encode_arrow(sink._buffers(vcol), sink._buffers(kcol) if keyed else None, idx.buffers()[1],
                                 100, 2500, 8192, 1234)
    for b in got:
        sink._CRC.pack_into(b, 17, sink._crc32c.crc32c(memoryview(b)[21:]))
    rows = order[100:2500]
    want = sink.encode_batches([values[i] for i in rows], [keys[i] for i in rows] if keyed else None, None, 8192,
                               1234)
    assert [bytes(b) for b in got] == [bytes(b) for b in want]
    decoded = [(r.offset, r.key, r.value) for b in got for r in rec.decode(bytes(b))]
    assert [(k, v) for _, k, v in decoded] == [(keys[i] if keyed else None, values[i]) for i in rows]
    for b in got:
        header = rec.validate(b)
        assert header.producer_id == -1 and header.base_timestamp == 1234 and header.size <= 8192 or \
            header.records_count == 1


def test_encode_arrow_refuses_buffers_that_do_not_hold_the_rows():
    col = _column([b"abc", b"de"])
    valid, offsets, data, offset = sink._buffers(col)
    with pytest.raises(ValueError):
        _speedups.encode_arrow((valid, offsets, data, offset), None, pa.array([5], pa.int64()).buffers()[1], 0, 1,
                               100, 0)
    with pytest.raises(ValueError):
        _speedups.encode_arrow((valid, offsets[:4], data, offset), None, None, 0, 2, 100, 0)

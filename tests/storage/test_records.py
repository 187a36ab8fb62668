"""The v2 batch codec: header parsing, validation (CRC-32C), decoding, offset stamping."""

import random
import struct

import pytest

from logfs.storage.format import records as rec
from logfs.storage.errors import CorruptRecordError


def test_build_and_decode():
    batch = rec.build_batch(1234, 99, [b"a", None, b""], keys=[b"k", None, b"x"],
                            headers=[[("h", b"1")], [], [("n", None)]], timestamps=[99, 105, 101])
    header = rec.validate(batch)
    assert header.base_offset == 1234 and header.last_offset == 1236 and header.next_offset == 1237
    assert header.magic == 2 and header.records_count == 3 and header.size == len(batch)
    assert header.base_timestamp == 99 and header.max_timestamp == 105
    assert header.compression == 0 and not header.is_control and header.partition_leader_epoch == 0
    assert list(rec.decode(batch)) == [
        rec.Record(1234, 99, b"k", b"a", (("h", b"1"),)), rec.Record(1235, 105, None, None, ()),
        rec.Record(1236, 101, b"x", b"", (("n", None),)),
    ]
    assert rec.peek_size(batch) == len(batch)
    assert rec.peek_size(batch[:11]) is None


def test_build_with_offset_gaps():
    batch = rec.build_batch(50, 7, [b"a", b"b", b"c"], offset_deltas=[0, 3, 8])
    header = rec.validate(batch)
    assert header.last_offset == 58 and header.records_count == 3
    assert [r.offset for r in rec.decode(batch)] == [50, 53, 58]


def _aiokafka_batch(base, ts, values, keys, headers, timestamps, deltas):
    """The same records through aiokafka's own builder: an independent encoder to compare with."""
    from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 31)
    for i, value in enumerate(values):
        builder.append(deltas[i] if deltas else i, timestamps[i] if timestamps else ts, keys[i] if keys else None,
                       value, list(headers[i]) if headers else [])
    out = builder.build()
    struct.pack_into(">q", out, 0, base)
    struct.pack_into(">i", out, 12, 0)
    return bytes(out)


@pytest.mark.parametrize("seed", range(40))
def test_generic_encoder_matches_aiokafka(seed):
    rnd = random.Random(seed)
    n = rnd.randint(1, 40)
    values = [None if rnd.random() < 0.2 else rnd.randbytes(rnd.choice([0, 5, 300])) for _ in range(n)]
    keys = [None if rnd.random() < 0.3 else rnd.randbytes(rnd.choice([0, 3, 200])) for _ in range(n)] \
        if seed % 2 else None
    headers = [[(f"h{j}", None if rnd.random() < 0.3 else rnd.randbytes(4)) for j in range(rnd.randint(0, 3))]
               for _ in range(n)] if seed % 3 else None
    stamps = [1_700_000_000_000 + rnd.randint(-1000, 100000) for _ in range(n)] if seed % 4 else None
    deltas = sorted(rnd.sample(range(n * 3), n)) if seed % 5 else None
    ours = rec.build_batch_generic(77, 1_700_000_000_000, values, keys, headers, stamps, deltas)
    assert ours == _aiokafka_batch(77, 1_700_000_000_000, values, keys, headers, stamps, deltas)


def test_generic_encoder_keeps_the_fields_the_cleaner_keeps():
    """The cleaner re-encodes a batch's kept records with the batch's own last offset delta, producer fields,
    attributes (not compression) and a delete horizon as base timestamp."""
    batch = rec.build_batch_generic(
        100, 0, [b"a", None], [b"k1", b"k2"], None, [5000, 5007], [2, 6], base_timestamp=9000,
        last_offset_delta=9, attributes=rec.ATTR_DELETE_HORIZON | rec.ATTR_TRANSACTIONAL | 3,
        producer=(42, 3, 17), leader_epoch=8)
    header = rec.validate(batch)
    assert (header.base_offset, header.last_offset_delta, header.base_timestamp, header.max_timestamp) == \
        (100, 9, 9000, 5007)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 17)
    assert header.attributes == rec.ATTR_DELETE_HORIZON | rec.ATTR_TRANSACTIONAL  # uncompressed
    assert header.partition_leader_epoch == 8
    assert [(r.offset, r.timestamp, r.key, r.value) for r in rec.decode(batch)] == [
        (102, 5000, b"k1", b"a"), (106, 5007, b"k2", None)]
    empty = rec.validate(rec.build_batch_generic(7, -1, [], last_offset_delta=0))
    assert (empty.base_offset, empty.records_count, empty.base_timestamp, empty.max_timestamp) == (7, 0, -1, -1)


def test_with_base_offset_keeps_crc_valid():
    batch = rec.build_batch(0, 1, [b"v"])
    moved = rec.with_base_offset(batch, 10**12)
    assert rec.validate(moved).base_offset == 10**12
    assert [r.offset for r in rec.decode(moved)] == [10**12]


@pytest.mark.parametrize("where", [25, 40, -1])
def test_validate_detects_corruption(where):
    batch = bytearray(rec.build_batch(0, 1, [b"hello world"]))
    batch[where] ^= 0x01
    with pytest.raises(CorruptRecordError):
        rec.validate(bytes(batch))


def test_validate_rejects_bad_structure():
    batch = rec.build_batch(0, 1, [b"hello"])
    with pytest.raises(CorruptRecordError):
        rec.validate(batch[:-1])  # truncated
    with pytest.raises(CorruptRecordError):
        rec.parse_header(batch[:60])
    bad_magic = bytearray(batch)
    bad_magic[16] = 1
    with pytest.raises(CorruptRecordError):
        rec.parse_header(bytes(bad_magic))
    too_small = bytearray(batch)
    struct.pack_into(">i", too_small, 8, 10)
    with pytest.raises(CorruptRecordError):
        rec.parse_header(bytes(too_small))
    with pytest.raises(ValueError):
        rec.build_batch(0, 1, [])


def test_iter_headers_stops_at_a_partial_batch():
    a = rec.build_batch(0, 1, [b"a"])
    b = rec.build_batch(1, 1, [b"bb", b"cc"])
    buf = a + b + rec.build_batch(3, 1, [b"d"])[:30]
    got = [(pos, h.base_offset, h.last_offset) for pos, h in rec.iter_headers(buf)]
    assert got == [(0, 0, 0), (len(a), 1, 2)]


def test_build_batch_plain_records_is_build_batch_generic():
    """The replica's encoder (storage/cluster/replica.py) gives build_batch_generic's bytes: values and keys of
    every size class (null, empty, one- to three-byte varint lengths), timestamps before and after the first, offset
    gaps, both timestamp types. Seeded."""
    rnd = random.Random(46)
    for _ in range(200):
        n = rnd.randint(1, 200)
        values = [None if rnd.random() < 0.05 else rnd.randbytes(rnd.choice([0, 1, 63, 64, 99, 9000, 20000]))
                  for _ in range(n)]
        keys = [None if rnd.random() < 0.5 else rnd.randbytes(rnd.choice([0, 3, 70, 10000])) for _ in range(n)]
        first = rnd.randint(0, 2 ** 41)
        stamps = [first + rnd.randint(-5000, 100_000) for _ in range(n)]
        offsets = sorted(rnd.sample(range(n * 3 if rnd.random() < 0.5 else 20_000), n))
        deltas = [o - offsets[0] for o in offsets]
        attributes = rnd.choice([0, 0x08])
        assert rec.build_batch_plain_records(77, values, keys, stamps, deltas, attributes=attributes) == \
            rec.build_batch_generic(77, stamps[0], values, keys=keys, headers=[()] * n, timestamps=stamps,
                                    offset_deltas=deltas, attributes=attributes)

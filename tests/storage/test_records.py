"""The v2 batch codec: header parsing, validation (CRC-32C), decoding, offset stamping."""

import struct

import pytest

from logfs.storage import records as rec
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

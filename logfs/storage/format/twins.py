"""The Python twins of the format's C functions (:data:`logfs.storage.format.speedups.TWINS`): the same
signatures and the same bytes, for a process without the accelerator and for the parity test. Each is the plain
statement of what its C function does, not a fast path."""

from __future__ import annotations

import os
import struct

from . import records as rec
from .records import _varint as put_varint

RECORD_OVERHEAD = 12  # bytes a record is counted beyond its line when cutting batches (_speedups.c, Log.append)


def _whole_lines(prefix, data, end: int) -> list[bytes]:
    data = memoryview(data)
    if end <= 0 or end > len(data) or data[end - 1] != 0x0A or b"\n" in bytes(prefix):
        raise ValueError("encode_lines needs whole lines")
    return (bytes(prefix) + bytes(data[:end])).split(b"\n")[:-1]


def _line_record(line: bytes, offset_delta: int, ts_delta: int, out: bytearray) -> None:
    body = bytearray(b"\0")  # attributes
    put_varint(ts_delta, body)
    put_varint(offset_delta, body)
    body += b"\x01"  # key length -1 (null), zigzag
    put_varint(len(line), body)
    body += line
    body += b"\0"  # no headers
    put_varint(len(body), out)
    out += body


def encode_lines(prefix, data, end: int, target: int) -> tuple[list[tuple[bytearray, int, int]], int]:
    """The lines of ``prefix + data[:end]`` as whole v2 batches of about ``target`` bytes of records (a line each,
    no key), their 61 header bytes zeroed: ``[(batch, records, payload bytes), ...]`` and the longest line."""
    lines = _whole_lines(prefix, data, end)
    batches, i = [], 0
    while i < len(lines):
        batch, j, counted, payload = bytearray(rec.HEADER_SIZE), i, 0, 0
        while j < len(lines) and (j == i or counted + len(lines[j]) + RECORD_OVERHEAD <= target):
            _line_record(lines[j], j - i, 0, batch)
            counted += len(lines[j]) + RECORD_OVERHEAD
            payload += len(lines[j])
            j += 1
        batches.append((batch, j - i, payload))
        i = j
    return batches, max(map(len, lines))


def grow_lines(batch: bytearray, prefix, data, end: int, ts_delta: int, cap: int) -> tuple[int, int, int] | None:
    """The lines of ``prefix + data[:end]`` appended as records to ``batch`` (one of :func:`encode_lines`'s making),
    offset deltas continuing from its count (which is updated); None, ``batch`` untouched, past ``cap`` bytes."""
    lines = _whole_lines(prefix, data, end)
    if len(batch) < rec.HEADER_SIZE:
        raise ValueError("grow_lines needs a whole batch")
    first = int.from_bytes(batch[57:61], "big")
    records = bytearray()
    for k, line in enumerate(lines):
        _line_record(line, first + k, ts_delta, records)
        if len(batch) + len(records) > cap:
            return None
    batch += records
    batch[57:61] = (first + len(lines)).to_bytes(4, "big")
    return len(lines), sum(map(len, lines)), max(map(len, lines))


def encode_records(values: list, keys: list | None = None) -> bytes:
    """The records section of an uncompressed v2 batch (offset delta i, timestamp delta 0, no headers)."""
    return rec.build_batch_generic(0, 0, values, keys)[rec.HEADER_SIZE:]


def render_records(batch, separator: bytes | None, null_marker: bytes | None) -> bytes:
    """The lines of one uncompressed batch: ``[key + separator] + (value | null marker | "") + "\\n"`` each."""
    attributes = _plain_attributes(batch)
    if attributes & rec.ATTR_CONTROL:
        return b""
    out = []
    for r in _decode(batch):
        body = r.value if r.value is not None else (null_marker or b"")
        out.append(r.key + separator + body + b"\n" if separator and r.key is not None else body + b"\n")
    return b"".join(out)


def batch_stats(batch) -> tuple[int, int, int, int, int]:
    """(records, keyed, nulls, key bytes, value bytes) of one uncompressed batch (a control batch counts nothing)."""
    if _plain_attributes(batch) & rec.ATTR_CONTROL:
        return (0, 0, 0, 0, 0)
    return record_stats(_decode(batch))


def record_stats(decoded) -> tuple[int, int, int, int, int]:
    """(records, keyed, nulls, key bytes, value bytes) of decoded records (``records.Record``)."""
    records = keyed = nulls = key_bytes = value_bytes = 0
    for r in decoded:
        records += 1
        if r.key is not None:
            keyed += 1
            key_bytes += len(r.key)
        if r.value is None:
            nulls += 1
        else:
            value_bytes += len(r.value)
    return (records, keyed, nulls, key_bytes, value_bytes)


def min_timestamp(batch) -> int | None:
    """The smallest record timestamp of one uncompressed batch as readers see its records (CreateTime: the first
    timestamp plus the smallest delta, which may be negative; LogAppendTime: the batch's max timestamp); None
    without records. The records are walked with the C walk's checks (ValueError for a malformed one)."""
    attributes = _plain_attributes(batch)
    view = memoryview(batch).cast("B")
    count = int.from_bytes(view[57:61], "big", signed=True)
    if count <= 0:
        return None
    if attributes & rec.ATTR_TIMESTAMP_TYPE:
        return int.from_bytes(view[35:43], "big", signed=True)
    pos, end, lowest = rec.HEADER_SIZE, len(view), None
    for _ in range(count):
        length, pos = _get_varint(view, pos, end)
        if length < 0 or length > end - pos:
            raise ValueError("malformed record batch")
        record_end = pos + length
        p = pos + 1  # attributes
        ts_delta, p = _get_varint(view, p, record_end)
        _, p = _get_varint(view, p, record_end)  # offset delta
        for _field in ("key", "value"):
            n, p = _get_varint(view, p, record_end)
            if n < -1 or n > record_end - p:
                raise ValueError("malformed record batch")
            p += max(n, 0)
        headers, p = _get_varint(view, p, record_end)
        if headers < 0:
            raise ValueError("malformed record batch")
        lowest = ts_delta if lowest is None else min(lowest, ts_delta)
        pos = record_end
    first = int.from_bytes(view[27:35], "big", signed=True)
    return (first + lowest + (1 << 63)) % (1 << 64) - (1 << 63)  # (wrapping as Kafka's long arithmetic does)


def _get_varint(view, pos: int, end: int) -> tuple[int, int]:
    """Kafka's zigzag varint at ``pos`` (before ``end``), and the position after it; ValueError past ``end`` or
    for an over-long encoding (the C reader's limits)."""
    z = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("malformed record batch")
        b = view[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    z &= (1 << 64) - 1
    return (z >> 1) ^ -(z & 1), pos


def merge_batches(batches: list, last_offset: int) -> bytes:
    """Plain batches (in offset order) merged into one: the first's base offset, base timestamp, attributes and
    leader epoch; each record's deltas re-based; the CRC left 0 (the caller stamps it)."""
    first = rec.parse_header(batches[0])
    rs = [r for b in batches for r in _decode(b)]
    merged = bytearray(rec.build_batch_generic(
        first.base_offset, first.base_timestamp, [r.value for r in rs], [r.key for r in rs],
        [r.headers for r in rs], [r.timestamp for r in rs], [r.offset - first.base_offset for r in rs],
        base_timestamp=first.base_timestamp, last_offset_delta=last_offset - first.base_offset,
        attributes=first.attributes, leader_epoch=first.partition_leader_epoch))
    merged[17:21] = bytes(4)
    return bytes(merged)


def _plain_attributes(batch) -> int:
    view = memoryview(batch)
    if len(view) < rec.HEADER_SIZE or view[16] != 2:
        raise ValueError("not a v2 batch")
    attributes = int.from_bytes(view[21:23], "big")
    if attributes & rec.ATTR_COMPRESSION_MASK:
        raise ValueError("compressed batch")
    return attributes


def _decode(batch):
    try:
        return list(rec.decode(bytes(batch)))
    except rec.CorruptRecordError as exc:
        raise ValueError(str(exc)) from None


# The index files' layouts by kind (0 offset, 1 time, 2 view: logfs.storage.local.index).
_LAYOUTS = {0: struct.Struct(">ii"), 1: struct.Struct(">qi"), 2: struct.Struct(">IIIIIQQ")}


def index_floor(fd: int, kind: int, field: int, n: int, target: int, sep_len: int, marker_len: int) -> int:
    """Slot of the greatest of the first ``n`` entries of the index file ``fd`` (layout ``kind``: 0 offset, 1 time,
    2 view) whose key ``field`` is <= ``target``; -1 for none, -2 if the file is shorter than its entries. One
    pread a probe. The view index's field 2 is the view length before the entry (:meth:`LineFormat.length`)."""
    if kind not in _LAYOUTS or not 0 <= field <= 2 or n < 0:
        raise ValueError("index_floor: bad kind, field or entry count")
    layout = _LAYOUTS[kind]
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        raw = os.pread(fd, layout.size, mid * layout.size)
        if len(raw) != layout.size:
            return -2
        e = layout.unpack(raw)
        if kind == 0:
            key = e[0]
        elif kind == 1:
            key = e[0] if field == 0 else e[1]
        elif field < 2:
            key = e[field]
        else:
            key = e[2] + e[6] + e[4] * marker_len + (e[5] + e[3] * sep_len if sep_len > 0 else 0)
        if target < key:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


"""Kafka v2 record batches: building, header parsing, validation and decoding.

Owns the byte format of ``.log`` files (magic 2, CRC-32C over attributes..end). Encoding is the C accelerator's
for plain records, else the one Python encoder here (:func:`build_batch_generic`, also the cleaner's); record
decoding uses aiokafka's compiled codec (~7M records/s here, against ~0.3M/s for kafka-python's pure-Python
reader); CRC-32C uses the ``crc32c`` package (hardware, ~20 GB/s here).
Compressed batches (gzip, snappy, lz4, zstd): :func:`compress_batch` makes one from a plain batch, and
:func:`decompress_batch` turns one back into the equivalent plain batch, once per batch, so that every reader
keeps its paths for plain batches; the framing of each codec is :mod:`.codecs`'s alone.

Batch header layout (61 bytes, big-endian)::

    0 baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 | 16 magic i8 | 17 crc u32
    21 attributes i16 | 23 lastOffsetDelta i32 | 27 baseTimestamp i64 | 35 maxTimestamp i64
    43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32 | 57 recordsCount i32 | 61 records...
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import crc32c as _crc32c

from . import codecs
from ..errors import CorruptRecordError

from .speedups import C as _speedups


@functools.cache
def _codec():
    """aiokafka's compiled batch reader, imported on first use: importing aiokafka loads its client and asyncio
    (~70 ms at every start), and plain batches (the common case) never need it."""
    from aiokafka.record._crecords.default_records import DefaultRecordBatch  # type: ignore[import-untyped]

    return DefaultRecordBatch


HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted in batchLength
MAGIC = 2
_CRC_START = 21
_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE = struct.Struct(">qi")
_OFFSET_AND_EPOCH = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch
_PREFIX = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

COMPRESSION_NAMES = codecs.NAMES

Headers = Sequence[tuple[str, bytes | None]]


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int  # bytes after the batchLength field
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & ATTR_TIMESTAMP_TYPE else 0


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_type: int = 0


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte header at ``pos``; raises CorruptRecordError if it cannot be a v2 batch."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError("truncated batch header")
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptRecordError(f"unsupported magic {header.magic} at position {pos}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"batch length {header.batch_length} too small at position {pos}")
    return header


def peek_size(buf, pos: int = 0) -> int | None:
    """Total size of the batch at ``pos`` from its first 12 bytes, or None if fewer than 12 bytes remain."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    return _BASE.unpack_from(buf, pos)[1] + LOG_OVERHEAD


def crc_of(buf, pos: int, size: int) -> int:
    return _crc32c.crc32c(memoryview(buf)[pos + _CRC_START : pos + size])


def validate(buf, pos: int = 0) -> BatchHeader:
    """Full validation of one batch at ``pos`` in ``buf``: header sanity and CRC-32C."""
    header = parse_header(buf, pos)
    if len(buf) - pos < header.size:
        raise CorruptRecordError(f"truncated batch at position {pos}")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptRecordError(f"invalid batch counts at position {pos}")
    if crc_of(buf, pos, header.size) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in batch at position {pos}")
    return header


def build_batch(base_offset: int, timestamp_ms: int, values: Sequence[bytes | None],
                keys: Sequence[bytes | None] | None = None, **fields) -> bytes:
    """Encode records with offsets ``base_offset + i`` into one uncompressed v2 batch (CreateTime): by the C encoder
    when it serves (values and keys alone), else by :func:`build_batch_generic`, which ``fields`` go to
    (``headers``, per-record ``timestamps``, ``offset_deltas``, increasing, for a batch with gaps such as a
    compacted one, ...)."""
    if not values:
        raise ValueError("a batch needs at least one record")
    if _speedups is not None and all(v is None for v in fields.values()):
        n = len(values)
        after_crc = _AFTER_CRC.pack(0, n - 1, timestamp_ms, timestamp_ms, -1, -1, -1, n) + _speedups.encode_records(
            values if isinstance(values, list) else list(values),
            None if keys is None else (keys if isinstance(keys, list) else list(keys)),
        )
        return _PREFIX.pack(base_offset, len(after_crc) + 9, 0, MAGIC, _crc32c.crc32c(after_crc)) + after_crc
    return build_batch_generic(base_offset, timestamp_ms, values, keys, **fields)


def finish_batch(batch: bytearray, base_offset: int, count: int, timestamp_ms: int) -> bytearray:
    """Fill in the 61-byte header of a batch whose records section ``_speedups.encode_lines`` wrote (records with
    offset deltas 0..count-1, timestamp deltas 0, no keys or headers): offsets, timestamps, producer fields, the
    length and the CRC-32C, in place. Returns ``batch``."""
    _AFTER_CRC.pack_into(batch, _CRC_START, 0, count - 1, timestamp_ms, timestamp_ms, -1, -1, -1, count)
    crc = _crc32c.crc32c(memoryview(batch)[_CRC_START:])
    _PREFIX.pack_into(batch, 0, base_offset, len(batch) - LOG_OVERHEAD, 0, MAGIC, crc)
    return batch


_LAST_DELTA = struct.Struct(">i")  # at 23
_MAX_TS = struct.Struct(">q")  # at 35
_LENGTH = struct.Struct(">i")  # at 8
_CRC = struct.Struct(">I")  # at 17
_ATTRIBUTES = struct.Struct(">h")  # at 21


def restamp_batch(batch: bytearray, last_delta: int, max_timestamp: int) -> None:
    """Rewrite, in place, the header fields of a batch of ``finish_batch``'s making whose records section
    ``_speedups.grow_lines`` extended (offset deltas 0..last_delta; it left the count at bytes 57..60): the
    length, the last offset delta, the max timestamp and the CRC-32C. The base offset and base timestamp stay."""
    _LAST_DELTA.pack_into(batch, 23, last_delta)
    _MAX_TS.pack_into(batch, 35, max_timestamp)
    _LENGTH.pack_into(batch, 8, len(batch) - LOG_OVERHEAD)
    _CRC.pack_into(batch, 17, _crc32c.crc32c(memoryview(batch)[_CRC_START:]))


def stamp_crc(batch: bytes | bytearray) -> bytes:
    """``batch`` with its CRC-32C computed (over attributes to the end) and written in."""
    out = batch if isinstance(batch, bytearray) else bytearray(batch)
    _CRC.pack_into(out, 17, _crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def build_batch_generic(
    base_offset: int,
    timestamp_ms: int,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Headers] | None = None,
    timestamps: Sequence[int] | None = None,
    offset_deltas: Sequence[int] | None = None,
    *,
    base_timestamp: int | None = None,
    last_offset_delta: int | None = None,
    attributes: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    leader_epoch: int = 0,
) -> bytes:
    """The one v2 batch encoder in Python: :func:`build_batch` with headers or per-record timestamps, without the
    accelerator, and the cleaner's re-encoding of a batch's kept records, which keeps the batch's own fields:
    ``last_offset_delta`` (may exceed the last record's delta), ``attributes`` (minus compression), ``producer``
    (id, epoch, base sequence), the leader epoch, and ``base_timestamp`` (a delete horizon). No records (with
    ``last_offset_delta``) gives an empty batch, its timestamps ``timestamp_ms``."""
    n = len(values)
    stamps = timestamps if timestamps is not None else [timestamp_ms] * n
    base_ts = base_timestamp if base_timestamp is not None else (stamps[0] if n else timestamp_ms)
    body = bytearray()
    for i in range(n):
        record = bytearray(b"\x00")  # attributes
        _varint(stamps[i] - base_ts, record)
        _varint(offset_deltas[i] if offset_deltas is not None else i, record)
        for field in (keys[i] if keys is not None else None, values[i]):
            _varbytes(field, record)
        record_headers = headers[i] if headers is not None else ()
        _varint(len(record_headers), record)
        for hkey, hvalue in record_headers:
            _varbytes(hkey.encode(), record)
            _varbytes(hvalue, record)
        _varint(len(record), body)
        body += record
    if last_offset_delta is None:
        last_offset_delta = (offset_deltas[-1] if offset_deltas is not None else n - 1) if n else 0
    after_crc = _AFTER_CRC.pack(attributes & ~ATTR_COMPRESSION_MASK, last_offset_delta, base_ts,
                                max(stamps) if n else timestamp_ms, *producer, n) + bytes(body)
    return _PREFIX.pack(base_offset, len(after_crc) + 9, leader_epoch, MAGIC, _crc32c.crc32c(after_crc)) + after_crc


def build_batch_plain_records(base_offset: int, values: Sequence[bytes | None], keys: Sequence[bytes | None],
                              timestamps: Sequence[int], offset_deltas: Sequence[int], *, attributes: int = 0) -> bytes:
    """:func:`build_batch_generic`'s bytes for records without headers (what a Kafka cluster mount's replica
    re-encodes: storage/cluster/replica.py), in about a third of its time: each record's small varints come from a
    table rather than a loop. At least one record."""
    base_ts = timestamps[0]
    parts = []
    append = parts.append
    small = _SMALL_VARINTS
    limit = len(small)
    for i, value in enumerate(values):
        key = keys[i]
        delta = timestamps[i] - base_ts
        offset_delta = offset_deltas[i]
        head = (small[delta] if 0 <= delta < limit else _varint_bytes(delta)) + (
            small[offset_delta] if offset_delta < limit else _varint_bytes(offset_delta))
        if key is None:
            head += b"\x01"
        else:
            head += (small[len(key)] if len(key) < limit else _varint_bytes(len(key))) + key
        if value is None:
            record_length = 1 + len(head) + 1 + 1
            append(_varint_bytes(record_length) + b"\x00" + head + b"\x01\x00")
        else:
            size = len(value)
            size_bytes = small[size] if size < limit else _varint_bytes(size)
            record_length = 1 + len(head) + len(size_bytes) + size + 1
            append((small[record_length] if record_length < limit else _varint_bytes(record_length)) + b"\x00" +
                   head + size_bytes)
            append(value)
            append(b"\x00")
    n = len(values)
    after_crc = _AFTER_CRC.pack(attributes & ~ATTR_COMPRESSION_MASK, offset_deltas[-1], base_ts, max(timestamps),
                                -1, -1, -1, n) + b"".join(parts)
    return _PREFIX.pack(base_offset, len(after_crc) + 9, 0, MAGIC, _crc32c.crc32c(after_crc)) + after_crc


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    _varint(value, out)
    return bytes(out)


def _varint(value: int, out: bytearray) -> None:
    """Kafka's zigzag varint."""
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


_SMALL_VARINTS = [_varint_bytes(i) for i in range(1 << 13)]  # (non-negative values below 8192: 1-2 bytes)


def _varbytes(field: bytes | None, out: bytearray) -> None:
    if field is None:
        _varint(-1, out)
    else:
        _varint(len(field), out)
        out += field


def with_base_offset(batch: bytes | bytearray, base_offset: int) -> bytes:
    """Return a copy of ``batch`` re-stamped with a new base offset (CRC unaffected)."""
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    return bytes(out)


def decode(buf, pos: int = 0, size: int | None = None) -> Iterator[Record]:
    """Records of the batch at ``pos`` (control batches yield nothing); a compressed batch is decompressed once,
    by :func:`decompress_batch`."""
    if size is None:
        size = peek_size(buf, pos) or 0
    view = memoryview(buf)[pos : pos + size]
    header = parse_header(view)
    if header.is_control:
        return
    ts_type = header.timestamp_type
    for r in _codec()(bytes(decompress_batch(view))):
        yield Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers), ts_type)


def decode_raw(buf: bytes):
    """The codec's own record objects for one batch: the fast path for rendering (attributes .key, .value,
    .offset, .timestamp). ``buf`` must hold exactly one batch; a compressed one is decompressed once, by
    :func:`decompress_batch`."""
    if len(buf) >= HEADER_SIZE and buf[22] & ATTR_COMPRESSION_MASK:  # the low byte of the attributes
        buf = bytes(decompress_batch(buf))
    return _codec()(buf)


_INT_MAX = (1 << 31) - 1


def compress_batch(batch, codec: int, level: int | None = None) -> bytes:
    """The v2 batch ``batch`` (bytes-like, exactly one batch) with its records section compressed as one block of
    ``codec`` (1 gzip, 2 snappy, 3 lz4, 4 zstd) at ``level`` (None: Kafka's default for the codec). Every header
    field is kept (base offset, leader epoch, last offset delta, timestamps, producer fields, records count, the
    other attribute bits); the codec bits are set and the length and CRC-32C recomputed.

    A batch already in ``codec`` is returned as it is (Kafka, too, keeps a batch whose codec is the target, at
    whatever level); one in another codec is decompressed first; ``codec`` 0 gives the plain batch
    (:func:`decompress_batch`). Control batches and batches without records stay uncompressed, as Kafka writes
    them. The input's CRC-32C is checked first, so that a damaged batch is never given a fresh, valid CRC. Raises
    CorruptRecordError if ``batch`` is not one whole batch or its CRC does not match, ValueError for an unknown
    ``codec``."""
    if codec not in codecs.NAMES:
        raise ValueError(f"no codec with id {codec}")
    view = memoryview(batch).cast("B")
    header = _whole_batch(view)
    if crc_of(view, 0, header.size) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in the batch at offset {header.base_offset}")
    if header.compression == codec:
        return bytes(view)
    if header.compression:
        view = memoryview(decompress_batch(view)).cast("B")
    if codec == 0 or header.is_control or header.records_count == 0:
        return bytes(view)
    return _rebuild(view, header, (header.attributes & ~ATTR_COMPRESSION_MASK) | codec,
                    codecs.compress(codec, view[HEADER_SIZE:], level))


def decompress_batch(buf, pos: int = 0, stamp: bool = True):
    """The batch at ``pos`` in ``buf`` as the equivalent uncompressed batch: the records section decompressed
    (once, sized from what the frame records), the codec bits cleared, the length and CRC-32C recomputed (with
    ``stamp`` False the CRC field is left as the compressed batch had it: for a reader that renders the records
    and never checks the plain batch's CRC, the text view), every other header field kept. An uncompressed batch is returned as it is, without a copy: ``buf`` itself when it
    holds exactly that batch, else a memoryview of it; a decompressed one is new ``bytes``.

    The compressed batch's CRC-32C is checked first (it covers the compressed bytes, and a damaged zstd or lz4
    block can decompress without error into wrong bytes). Raises CorruptRecordError for a truncated batch, a CRC
    mismatch, an unknown codec or data its codec cannot read."""
    view = memoryview(buf).cast("B")
    header = parse_header(view, pos)
    if len(view) - pos < header.size:
        raise CorruptRecordError(f"truncated batch at position {pos}")
    if not header.compression:
        return buf if pos == 0 and len(view) == header.size else view[pos : pos + header.size]
    view = view[pos : pos + header.size]
    if crc_of(view, 0, header.size) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in batch at position {pos}")
    if header.compression not in codecs.NAMES:
        raise CorruptRecordError(f"unknown compression codec {header.compression} in batch at position {pos}")
    records = codecs.decompress(header.compression, view[HEADER_SIZE:], _INT_MAX - (HEADER_SIZE - LOG_OVERHEAD))
    return _rebuild(view, header, header.attributes & ~ATTR_COMPRESSION_MASK, records, stamp)


def _whole_batch(view: memoryview) -> BatchHeader:
    header = parse_header(view)
    if len(view) != header.size:
        raise CorruptRecordError(f"expected one whole batch of {header.size} bytes, got {len(view)}")
    return header


def _rebuild(view: memoryview, header: BatchHeader, attributes: int, records, stamp: bool = True) -> bytes:
    """The batch of ``view`` (its header ``header``) with ``attributes`` and the records section ``records``: the
    header's other fields copied, the length and (with ``stamp``) the CRC-32C computed; one copy of ``records``."""
    length = HEADER_SIZE - LOG_OVERHEAD + len(records)
    if length > _INT_MAX:
        raise CorruptRecordError(f"batch at offset {header.base_offset} would exceed 2 GiB")
    head = bytearray(view[:HEADER_SIZE])
    _ATTRIBUTES.pack_into(head, 21, attributes)
    _LENGTH.pack_into(head, 8, length)
    if stamp:
        crc = _crc32c.crc32c(records, _crc32c.crc32c(memoryview(head)[_CRC_START:]))
        _CRC.pack_into(head, 17, crc)
    return b"".join((head, records))


def min_timestamp(header: BatchHeader, batch) -> int | None:
    """The smallest record timestamp of the whole batch ``batch`` (its header ``header``), as readers see its
    records: a LogAppendTime batch's are all its max timestamp (the header says it); a CreateTime batch's are its
    first timestamp plus each record's delta, which may be negative (a batch's records need not be in time
    order), so they are walked (in C; a compressed batch is decompressed first). None for a batch without
    records. CorruptRecordError if the records cannot be walked."""
    if header.records_count <= 0:
        return None
    if header.timestamp_type:
        return header.max_timestamp
    if header.compression:
        batch = decompress_batch(batch, stamp=False)  # (the walk checks no CRC: none computed for the plain one)
    try:
        if _speedups is not None:
            return _speedups.min_timestamp(batch)
        from .speedups import twin

        return twin("min_timestamp")(batch)
    except ValueError as exc:
        raise CorruptRecordError(f"batch at offset {header.base_offset}: {exc}") from None


def iter_headers(buf, start: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Headers of the complete batches in ``buf`` from ``start``, with their positions (no CRC check)."""
    pos = start
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        header = parse_header(buf, pos)
        if end - pos < header.size:
            return
        yield pos, header
        pos += header.size

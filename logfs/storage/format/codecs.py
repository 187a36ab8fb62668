"""The codecs of Kafka v2 batches: the one place that knows each codec's framing.

A compressed v2 batch keeps its 61-byte header as is and holds its whole records section as one compressed block,
its codec in bits 0-2 of the attributes (Kafka's ids below). :func:`compress` writes, and :func:`decompress`
reads, exactly the framing Kafka's own Java reader requires (checked against apache/kafka's
``Lz4BlockInputStream`` / ``KafkaLZ4BlockInputStream``, ``ZstdCompression``, ``SnappyCompression`` and
``GzipCompression``, and snappy-java's ``SnappyInputStream``):

- **zstd** (``zstandard``): one frame per batch, its content size written (a one-shot compression knows it), no
  zstd checksum (the batch's CRC-32C covers the compressed bytes). Read: one frame or several in a row (Java's
  ``ZstdInputStream`` reads on across frames), with or without the content size (Java producers stream theirs
  without one). The compression and decompression contexts are kept per thread and reused.
- **lz4** (``lz4.frame``, liblz4): one standard frame, version 1, independent blocks (FLG bit 5; Java refuses
  linked blocks), 64 KB blocks (what Kafka writes), the content size written, no block or content checksum, no
  dictionary id. Kafka's level 9 (its default) is lz4-java's fast compressor and every other level LZ4 HC at that
  level (Kafka 3.8's ``Lz4BlockOutputStream``): the same here (liblz4's frame API compresses levels 1-2 fast and
  treats levels above 12 as 12). Read: the first frame, as Java does; content size and checksums honoured when
  present.
- **snappy** (``cramjam``'s raw snappy): written in xerial framing, what snappy-java's ``SnappyOutputStream``
  writes and Kafka reads: the 16-byte header (``\\x82SNAPPY\\0``, version 1, compatible version 1), then chunks of
  at most 32 KiB of input, each a big-endian int32 length and a raw snappy block. Read: xerial (also streams
  concatenated with their headers, as snappy-java reads them) or a raw snappy block. Never Google's framing
  format.
- **gzip** (``zlib``, the standard library): one gzip member (RFC 1952). Read: one member or several in a row, as
  Java's ``GZIPInputStream`` does. Level -1 is zlib's default, 6.

Decompression is sized from what the frame records, checked against ``max_size`` before anything is allocated
(zstd's and lz4's content size, each raw snappy block's length preamble); gzip records no size up front and is
stopped at ``max_size``.
Every codec runs its compression and decompression with the GIL released (zstandard, liblz4, cramjam and zlib
release it around the codec call); what runs with the GIL held is a copy of the output where a library makes one
(lz4 decompression, joining snappy's chunks) and the per-32-KiB chunk loop of snappy. Corrupt input raises
:class:`CorruptRecordError` naming the codec, never a library's own exception. Measured choices, and the
alternatives measured: docs/compression.md.
"""

from __future__ import annotations

import struct
import threading
import zlib

from ..errors import CorruptRecordError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
IDS = {name: codec for codec, name in NAMES.items()}

# compression.type values (topic and broker) -> the codec of what logfs writes; None: "producer", keep the
# producer's codec (lines appended through the mount arrive as text, so for them it means uncompressed).
COMPRESSION_TYPES: dict[str, int | None] = {
    "uncompressed": NONE, "zstd": ZSTD, "lz4": LZ4, "snappy": SNAPPY, "gzip": GZIP, "producer": None,
}

# KIP-390 (Kafka 3.8): the level settings, their defaults and ranges. Snappy has no level.
LEVEL_SETTINGS = {GZIP: "compression.gzip.level", LZ4: "compression.lz4.level", ZSTD: "compression.zstd.level"}
DEFAULT_LEVELS = {GZIP: -1, LZ4: 9, ZSTD: 3}
LEVEL_RANGES = {GZIP: (1, 9), LZ4: (1, 17), ZSTD: (-131072, 22)}  # gzip also takes -1 (= 6)

_LZ4_FAST_LEVEL = 9  # Kafka's default lz4 level: lz4-java's fast compressor, not HC
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_CHUNK = 32 * 1024  # snappy-java's default block size, and Kafka's
_INT32 = struct.Struct(">i")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_SIZE = (1 << 31) - 1  # a batch's length is an int32


def check_level(codec: int, level: int) -> int:
    """``level`` if Kafka accepts it for ``codec``, else ValueError."""
    if codec == GZIP and level == -1:
        return level
    lo, hi = LEVEL_RANGES.get(codec, (0, 0))
    if codec not in LEVEL_RANGES or not lo <= level <= hi:
        raise ValueError(f"level {level} is out of range for {NAMES.get(codec, codec)}")
    return level


def compress(codec: int, data, level: int | None = None) -> bytes:
    """``data`` (bytes-like) compressed as one block of ``codec`` (an attribute id, 1-4) in Kafka's framing, at
    ``level`` (None: Kafka's default for the codec; snappy ignores it)."""
    if codec == ZSTD:
        return _zstd_compressor(DEFAULT_LEVELS[ZSTD] if level is None else level).compress(data)
    if codec == LZ4:
        return _lz4_compress(data, DEFAULT_LEVELS[LZ4] if level is None else level)
    if codec == SNAPPY:
        return _snappy_compress(data)
    if codec == GZIP:
        level = DEFAULT_LEVELS[GZIP] if level is None else level
        c = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: the gzip wrapper
        return c.compress(data) + c.flush()
    raise ValueError(f"no codec with id {codec}")


def decompress(codec: int, data, max_size: int = MAX_SIZE) -> bytes:
    """The uncompressed bytes of ``data`` (bytes-like), one block of ``codec`` as any Kafka producer may write it.
    Raises CorruptRecordError if it cannot be read, or holds more than ``max_size`` bytes."""
    try:
        if codec == ZSTD:
            return _zstd_decompress(data, max_size)
        if codec == LZ4:
            return _lz4_decompress(data, max_size)
        if codec == SNAPPY:
            return _snappy_decompress(data, max_size)
        if codec == GZIP:
            return _gzip_decompress(data, max_size)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library's own error types: zstandard.ZstdError, RuntimeError, zlib.error, ...
        raise CorruptRecordError(f"corrupt {NAMES[codec]} data: {exc}") from None
    raise CorruptRecordError(f"unknown compression codec {codec}")


# -- zstd ------------------------------------------------------------------------------------------------------

_local = threading.local()


def _zstd():
    import zstandard  # imported on first use: plain batches, the common case, never need it

    return zstandard


def _zstd_compressor(level: int):
    """This thread's compression context for ``level`` (zstandard's contexts are not thread-safe; each reuse saves
    the context's allocation and set-up)."""
    try:
        cache = _local.zstd_c
    except AttributeError:
        cache = _local.zstd_c = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = _zstd().ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
    return c


def _zstd_decompressor():
    try:
        return _local.zstd_d
    except AttributeError:
        d = _local.zstd_d = _zstd().ZstdDecompressor()
        return d


def _zstd_decompress(data, max_size: int) -> bytes:
    zstandard = _zstd()
    d = _zstd_decompressor()
    size = zstandard.frame_content_size(data)  # -1: not recorded
    if size > max_size:
        raise CorruptRecordError(f"zstd frame claims {size} bytes, more than {max_size}")
    if size >= 0:
        try:  # one frame with its content size: one allocation of exactly that, decompressed into in place
            return d.decompress(data, allow_extra_data=False)
        except zstandard.ZstdError:
            pass  # several frames, or a damaged one: the general path says which
    return _zstd_frames(d, memoryview(data).cast("B"), max_size)


_ZSTD_STEP = 4096  # compressed bytes fed per call on the general path: bounds the output between two checks


def _zstd_frames(d, view: memoryview, max_size: int) -> bytes:
    """Frames in a row, each with or without its content size, the output checked against ``max_size`` as it
    grows (a frame without a content size says nothing of its size up front)."""
    parts, total, pos = [], 0, 0
    while True:
        if bytes(view[pos : pos + 4]) != _ZSTD_MAGIC:
            raise CorruptRecordError("corrupt zstd data: no frame where one should start")
        obj = d.decompressobj()
        while not obj.eof:
            if pos >= len(view):
                raise CorruptRecordError("corrupt zstd data: truncated frame")
            chunk = view[pos : pos + _ZSTD_STEP]
            pos += len(chunk)
            part = obj.decompress(chunk)
            total += len(part)
            if total > max_size:
                raise CorruptRecordError(f"zstd data holds more than {max_size} bytes")
            parts.append(part)
        pos -= len(obj.unused_data)  # what was fed past this frame's end: the next frame's
        if pos >= len(view):
            return b"".join(parts)


# -- lz4 -------------------------------------------------------------------------------------------------------


def _lz4():
    import lz4.frame

    return lz4.frame


def _lz4_compress(data, level: int) -> bytes:
    lz4f = _lz4()
    return lz4f.compress(
        data, compression_level=0 if level == _LZ4_FAST_LEVEL else level, block_size=lz4f.BLOCKSIZE_MAX64KB,
        block_linked=False, content_checksum=False, block_checksum=False, store_size=True)


def _lz4_decompress(data, max_size: int) -> bytes:
    lz4f = _lz4()
    if len(data) < 7:
        raise CorruptRecordError("corrupt lz4 data: shorter than a frame header")
    head = bytes(data[:15])
    if head[4] & 0x20 == 0:
        raise CorruptRecordError("lz4 frame with linked blocks (Kafka reads only independent blocks)")
    if head[4] & 0x08:  # the content size is recorded: refuse a claim past the limit before allocating it
        if len(head) < 14:
            raise CorruptRecordError("corrupt lz4 data: truncated frame header")
        size = struct.unpack_from("<Q", head, 6)[0]
        if size > max_size:
            raise CorruptRecordError(f"lz4 frame claims {size} bytes, more than {max_size}")
        return lz4f.decompress(data)  # the first frame, as Kafka's reader; one allocation of the content size
    dec = lz4f.LZ4FrameDecompressor()  # no content size: stopped one byte past the limit
    out = dec.decompress(data, max_length=max_size + 1)
    if len(out) > max_size:
        raise CorruptRecordError(f"lz4 data holds more than {max_size} bytes")
    if not dec.eof:
        raise CorruptRecordError("corrupt lz4 data: truncated frame")
    return out


# -- snappy ----------------------------------------------------------------------------------------------------


def _snappy():
    import cramjam

    return cramjam.snappy


def _snappy_compress(data) -> bytes:
    raw = _snappy().compress_raw
    view = memoryview(data).cast("B")
    parts = [_XERIAL_HEADER]
    for i in range(0, len(view), _XERIAL_CHUNK):
        block = raw(view[i : i + _XERIAL_CHUNK])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data, max_size: int) -> bytes:
    snappy = _snappy()
    view = memoryview(data).cast("B")
    if bytes(view[:8]) != _XERIAL_MAGIC:
        size = snappy.decompress_raw_len(view)
        if size > max_size:
            raise CorruptRecordError(f"snappy block claims {size} bytes, more than {max_size}")
        return bytes(snappy.decompress_raw(view))
    chunks, total, pos, end = [], 0, 0, len(view)
    while pos < end:
        if bytes(view[pos : pos + 8]) == _XERIAL_MAGIC:  # a stream header (the first, or a concatenated stream's)
            if end - pos < 16:
                raise CorruptRecordError("corrupt snappy data: truncated xerial header")
            if _INT32.unpack_from(view, pos + 12)[0] > 1:
                raise CorruptRecordError("xerial snappy stream of an unsupported version")
            pos += 16
            continue
        if end - pos < 4:
            raise CorruptRecordError("corrupt snappy data: truncated xerial chunk length")
        n = _INT32.unpack_from(view, pos)[0]
        if n < 0 or n > end - pos - 4:
            raise CorruptRecordError("corrupt snappy data: xerial chunk past the end")
        chunk = view[pos + 4 : pos + 4 + n]
        total += snappy.decompress_raw_len(chunk)
        if total > max_size:
            raise CorruptRecordError(f"snappy data holds more than {max_size} bytes")
        chunks.append(chunk)
        pos += 4 + n
    return b"".join([snappy.decompress_raw(c) for c in chunks])


# -- gzip ------------------------------------------------------------------------------------------------------


def _gzip_decompress(data, max_size: int) -> bytes:
    """One member or several in a row, as Java's GZIPInputStream reads them (zlib checks each member's CRC-32 and
    length trailer)."""
    parts, total, rest = [], 0, memoryview(data).cast("B")
    while True:
        d = zlib.decompressobj(31)
        part = d.decompress(rest, max_size + 1 - total)
        total += len(part)
        if total > max_size:
            raise CorruptRecordError(f"gzip data holds more than {max_size} bytes")
        if not d.eof:
            raise CorruptRecordError("corrupt gzip data: truncated member")
        parts.append(part)
        rest = d.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)

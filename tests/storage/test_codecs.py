"""The codecs of Kafka v2 batches (logfs.storage.format.codecs) and compressed batches (records.compress_batch /
decompress_batch): round trips per codec and level, the framing Kafka's Java reader requires (checked on the bytes,
field by field, and by the Java stream classes Kafka reads them with), batches read back by two independent Kafka
parsers (kafka-python's pure-Python reader and aiokafka's compiled one, each with its own codecs), the framings
other producers write, and corrupt input."""

from __future__ import annotations

import os
import random
import struct

import pytest
import zstandard
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import _DefaultRecordBatchPy as AioBatchPy
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from logfs import _speedups
from logfs.storage import CorruptRecordError
from logfs.storage.format import codecs, records

CODECS = [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
LEVELS = [(codecs.ZSTD, lvl) for lvl in (-131072, -5, 1, 3, 19, 22)] + \
         [(codecs.LZ4, lvl) for lvl in (1, 3, 9, 12, 17)] + \
         [(codecs.GZIP, lvl) for lvl in (-1, 1, 9)] + [(codecs.SNAPPY, None)]
MiB = 1 << 20


def log_text(size: int, seed: int = 7) -> bytes:
    """Log-like lines (timestamps, levels, ids, paths): compressible, not trivially."""
    rnd = random.Random(seed)
    words = ["GET", "POST", "/api/v1/items", "/login", "INFO", "WARN", "ERROR", "connection", "user", "timeout"]
    out, n = [], 0
    while n < size:
        line = (f"2026-11-24 05:{rnd.randrange(60):02d}:{rnd.randrange(60):02d}.{rnd.randrange(1000):03d} "
                f"[{rnd.randrange(30000)}] {' '.join(rnd.choice(words) for _ in range(rnd.randrange(3, 12)))} "
                f"id={rnd.getrandbits(48):x}\n").encode()
        out.append(line)
        n += len(line)
    return b"".join(out)[:size]


DATA = {"empty": b"", "one byte": b"x", "1 MiB of log text": log_text(MiB), "1 MiB random": os.urandom(MiB)}


@pytest.mark.parametrize("codec,level", LEVELS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", list(DATA))
def test_round_trip_per_codec_and_level(codec, level, name):
    data = DATA[name]
    packed = codecs.compress(codec, data, level)
    assert isinstance(packed, bytes)
    assert codecs.decompress(codec, packed) == data
    assert codecs.decompress(codec, memoryview(packed)) == data
    if name == "1 MiB of log text" and not (codec == codecs.ZSTD and level < 0):  # negative zstd: nearly stored
        ratio = len(data) / len(packed)
        assert ratio > 1.8, (codecs.NAMES[codec], level, ratio)


def test_levels_change_the_output_where_kafka_has_levels():
    text = DATA["1 MiB of log text"]
    assert len(codecs.compress(codecs.ZSTD, text, 19)) < len(codecs.compress(codecs.ZSTD, text, 1))
    assert len(codecs.compress(codecs.GZIP, text, 9)) < len(codecs.compress(codecs.GZIP, text, 1))
    # Kafka's lz4 level 9 (its default) is the fast compressor; other levels are LZ4 HC.
    assert len(codecs.compress(codecs.LZ4, text, 12)) < len(codecs.compress(codecs.LZ4, text, 9))
    assert codecs.compress(codecs.LZ4, text) == codecs.compress(codecs.LZ4, text, 9)
    assert codecs.compress(codecs.ZSTD, text) == codecs.compress(codecs.ZSTD, text, 3)


def test_unknown_codec():
    with pytest.raises(ValueError):
        codecs.compress(5, b"x")
    with pytest.raises(CorruptRecordError):
        codecs.decompress(7, b"x")


# -- the framing Kafka's Java reader requires ------------------------------------------------------------------


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 (the lz4 frame's header checksum), written out here so the check does not trust liblz4."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    n, i = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed & m, (seed - p1) & m]
        while i + 16 <= n:
            for j in range(4):
                lane = struct.unpack_from("<I", data, i + 4 * j)[0]
                v[j] = (rotl((v[j] + lane * p2) & m, 13) * p1) & m
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        h = (rotl((h + struct.unpack_from("<I", data, i)[0] * p3) & m, 17) * p4) & m
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & m, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    return h ^ (h >> 16)


def test_xxh32_matches_the_reference_vectors():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


@pytest.mark.parametrize("level", [1, 9, 12])
def test_lz4_is_one_frame_of_independent_64k_blocks_as_kafka_reads_it(level):
    """Kafka's KafkaLZ4BlockInputStream / Lz4BlockInputStream: magic 0x184D2204; FLG version 1, reserved bits 0,
    block independence set (linked blocks are refused); BD: 64 KB (Kafka writes 64 KB; reads 64 KB-4 MB), reserved
    bits 0; the descriptor checksum (second byte of XXH32 of FLG..content size); blocks no larger than 64 KB; the
    end mark; nothing after it."""
    data = DATA["1 MiB of log text"] + DATA["1 MiB random"][:100_000]
    frame = codecs.compress(codecs.LZ4, data, level)
    assert struct.unpack_from("<I", frame)[0] == 0x184D2204
    flg, bd = frame[4], frame[5]
    assert flg >> 6 == 1  # version
    assert flg & 0x20  # block independence
    assert flg & 0x03 == 0  # reserved (and no dictionary id)
    assert flg & 0x08  # content size recorded
    assert not flg & 0x10 and not flg & 0x04  # no block or content checksum
    assert bd == 0x40  # 64 KB max block, reserved bits clear
    assert struct.unpack_from("<Q", frame, 6)[0] == len(data)
    assert frame[14] == (xxh32(frame[4:14]) >> 8) & 0xFF
    pos, total, blocks, raw = 15, 0, 0, 0
    while True:
        size = struct.unpack_from("<I", frame, pos)[0]
        pos += 4
        if size == 0:
            break
        stored = size & 0x7FFFFFFF
        assert stored <= 64 * 1024
        raw += bool(size & 0x80000000)  # the incompressible tail is stored as is
        pos += stored
        blocks += 1
    assert pos == len(frame)  # one frame, nothing after its end mark
    assert blocks == -(-len(data) // (64 * 1024)) and raw >= 1


@pytest.mark.parametrize("level", [-5, 3, 19])
def test_zstd_is_one_frame_with_its_content_size(level):
    data = DATA["1 MiB of log text"]
    frame = codecs.compress(codecs.ZSTD, data, level)
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == len(data)
    assert not params.has_checksum  # the batch's CRC-32C covers the compressed bytes
    # Exactly one frame: a decoder that refuses trailing data reads it all.
    assert zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False) == data
    assert zstandard.frame_content_size(codecs.compress(codecs.ZSTD, b"")) == 0


def test_snappy_is_xerial_in_32k_chunks():
    """What snappy-java's SnappyOutputStream writes and SnappyInputStream (Kafka's reader) reads: the 16-byte
    header, then chunks of at most 32 KiB of input, each a big-endian length and a raw snappy block. Never
    Google's framing format (stream identifier 0xff 0x06 0 0 'sNaPpY')."""
    import cramjam

    data = DATA["1 MiB of log text"] + b"tail"
    stream = codecs.compress(codecs.SNAPPY, data)
    assert stream[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    assert not stream.startswith(b"\xff\x06\x00\x00sNaPpY")
    pos, out = 16, []
    while pos < len(stream):
        n = struct.unpack_from(">i", stream, pos)[0]
        chunk = stream[pos + 4: pos + 4 + n]
        assert cramjam.snappy.decompress_raw_len(chunk) <= 32 * 1024
        out.append(bytes(cramjam.snappy.decompress_raw(chunk)))
        pos += 4 + n
    assert pos == len(stream) and b"".join(out) == data
    assert all(len(c) == 32 * 1024 for c in out[:-1])
    assert codecs.compress(codecs.SNAPPY, b"") == stream[:16]


def test_gzip_is_one_standard_member():
    import gzip

    data = DATA["1 MiB of log text"]
    member = codecs.compress(codecs.GZIP, data)
    assert member[:3] == b"\x1f\x8b\x08"
    assert gzip.decompress(member) == data
    assert struct.unpack_from("<I", member, len(member) - 4)[0] == len(data)


# -- reading what other producers write -------------------------------------------------------------------------


def test_reads_zstd_without_content_size_and_several_frames():
    """Java producers stream zstd (no content size in the frame); Java's reader goes on across frames."""
    data = DATA["1 MiB of log text"]
    streamed = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)
    assert zstandard.frame_content_size(streamed) == -1
    assert codecs.decompress(codecs.ZSTD, streamed) == data
    two = codecs.compress(codecs.ZSTD, data[:1000]) + streamed
    assert codecs.decompress(codecs.ZSTD, two) == data[:1000] + data
    with pytest.raises(CorruptRecordError, match="zstd"):
        codecs.decompress(codecs.ZSTD, two + b"junk")
    with pytest.raises(CorruptRecordError, match="truncated"):
        codecs.decompress(codecs.ZSTD, two[:-1])
    with pytest.raises(CorruptRecordError, match="truncated"):
        codecs.decompress(codecs.ZSTD, codecs.compress(codecs.ZSTD, data[:1000]) + streamed[:100])


def test_reads_lz4_with_checksums_and_refuses_linked_blocks():
    import lz4.frame

    data = DATA["1 MiB of log text"]
    for kw in ({"content_checksum": True}, {"block_checksum": True}, {"store_size": False},
               {"block_size": lz4.frame.BLOCKSIZE_MAX4MB}):
        frame = lz4.frame.compress(data, block_linked=False, **kw)
        assert codecs.decompress(codecs.LZ4, frame) == data
    linked = lz4.frame.compress(data, block_linked=True)
    with pytest.raises(CorruptRecordError, match="linked"):
        codecs.decompress(codecs.LZ4, linked)


def test_reads_raw_snappy_and_concatenated_xerial_streams():
    import cramjam

    data = DATA["1 MiB of log text"]
    assert codecs.decompress(codecs.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
    two = codecs.compress(codecs.SNAPPY, data[:70_000]) + codecs.compress(codecs.SNAPPY, data[70_000:])
    assert codecs.decompress(codecs.SNAPPY, two) == data
    assert codecs.decompress(codecs.SNAPPY, kafka_codec.snappy_encode(data)) == data  # kafka-python's xerial


def test_reads_gzip_members_in_a_row():
    data = DATA["1 MiB of log text"]
    two = codecs.compress(codecs.GZIP, data[:5000], 1) + codecs.compress(codecs.GZIP, data[5000:], 9)
    assert codecs.decompress(codecs.GZIP, two) == data


@pytest.mark.parametrize("codec", CODECS)
def test_what_kafka_python_compresses_reads_back(codec):
    data = DATA["1 MiB of log text"]
    encode = {codecs.GZIP: kafka_codec.gzip_encode, codecs.SNAPPY: kafka_codec.snappy_encode,
              codecs.LZ4: kafka_codec.lz4_encode, codecs.ZSTD: kafka_codec.zstd_encode}[codec]
    assert codecs.decompress(codec, encode(data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_decompression_is_bounded(codec):
    data = DATA["1 MiB of log text"]
    with pytest.raises(CorruptRecordError, match="more than"):
        codecs.decompress(codec, codecs.compress(codec, data), max_size=MiB - 1)
    assert codecs.decompress(codec, codecs.compress(codec, data), max_size=MiB) == data


def test_frames_without_their_size_are_bounded_as_they_decompress():
    """A frame that does not record its content size (zstd and lz4 from streaming producers) is stopped once its
    output passes the limit, not after."""
    import lz4.frame

    data = b"\x00" * (8 * MiB)  # ~1000x: a small frame, a large output
    zstd = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)
    lz4 = lz4.frame.compress(data, block_linked=False, store_size=False)
    for codec, frame in ((codecs.ZSTD, zstd), (codecs.LZ4, lz4)):
        assert codecs.decompress(codec, frame) == data
        with pytest.raises(CorruptRecordError, match="more than"):
            codecs.decompress(codec, frame, max_size=MiB)
    with pytest.raises(CorruptRecordError, match="truncated"):
        codecs.decompress(codecs.LZ4, lz4[:-4])


def test_a_zstd_frame_claiming_a_huge_size_is_refused_before_allocating():
    frame = bytearray(codecs.compress(codecs.ZSTD, b"x" * 300))
    params = zstandard.get_frame_parameters(bytes(frame))
    assert params.content_size == 300
    lying = zstandard.ZstdCompressor(level=3).compress(b"")  # header, then patch a huge content size in
    fhd = lying[4]
    assert fhd >> 6 == 0 and fhd & 0x20  # single segment, 1-byte size: rebuild with an 8-byte size instead
    huge = b"\x28\xb5\x2f\xfd" + bytes([0xC0 | 0x20]) + struct.pack("<Q", 1 << 40) + lying[6:]
    assert zstandard.frame_content_size(huge) == 1 << 40
    with pytest.raises(CorruptRecordError, match="claims"):
        codecs.decompress(codecs.ZSTD, huge)


@pytest.mark.parametrize("codec", CODECS)
def test_corrupt_data_is_a_corrupt_record_error(codec):
    data = DATA["1 MiB of log text"]
    packed = codecs.compress(codec, data)
    rnd = random.Random(codec)
    broken = 0
    for cut in (0, 1, 5, len(packed) // 2, len(packed) - 1):
        with pytest.raises(CorruptRecordError):
            codecs.decompress(codec, packed[:cut])
    for _ in range(20):
        damaged = bytearray(packed)
        for _ in range(8):
            damaged[rnd.randrange(len(damaged))] = rnd.randrange(256)
        try:
            out = codecs.decompress(codec, bytes(damaged))
        except CorruptRecordError:
            broken += 1
        else:
            assert isinstance(out, bytes)  # a damage no codec check sees: the batch CRC-32C does (below)
    assert broken > 0
    with pytest.raises(CorruptRecordError):
        codecs.decompress(codec, b"\x00" * 64)


# -- compressed batches -----------------------------------------------------------------------------------------


def mount_batches(text: bytes, target: int, base_offset: int = 1000, ts: int = 1_764_000_000_000) -> list[bytes]:
    """Batches as the bulk append writes them (_speedups.encode_lines + finish_batch)."""
    end = text.rfind(b"\n") + 1
    out, offset = [], base_offset
    batches, _ = _speedups.encode_lines(b"", text, end, target)
    for batch, count, _payload in batches:
        out.append(bytes(records.finish_batch(batch, offset, count, ts)))
        offset += count
    return out


def grown_batch() -> bytes:
    """A tail batch as the small append grows it (grow_lines + restamp_batch): timestamp deltas > 0."""
    batches, _ = _speedups.encode_lines(b"", b"first\nsecond\n", 13, 1 << 20)
    batch = records.finish_batch(batches[0][0], 77, 2, 1_764_000_000_000)
    n, _payload, _longest = _speedups.grow_lines(batch, b"", b"third\nfourth\n", 13, 250, 1 << 20)
    records.restamp_batch(batch, 3, 1_764_000_000_250)
    return bytes(batch)


def rich_batch() -> bytes:
    """Keys, null values, headers, per-record timestamps, offset gaps, producer fields and attributes."""
    n = 300
    return records.build_batch_generic(
        5000, 1_764_000_000_000, [None if i % 17 == 0 else b"value-%d " % i * (i % 7) for i in range(n)],
        keys=[None if i % 5 == 0 else b"key-%d" % (i % 40) for i in range(n)],
        headers=[[("logfs.pid", b"%d" % i), ("h", None)] if i % 3 == 0 else [] for i in range(n)],
        timestamps=[1_764_000_000_000 + 7 * i for i in range(n)], offset_deltas=[2 * i for i in range(n)],
        last_offset_delta=2 * n + 5, attributes=records.ATTR_TIMESTAMP_TYPE | records.ATTR_TRANSACTIONAL,
        producer=(4242, 3, 17), leader_epoch=9)


BATCHES = {
    "bulk 256 KiB": mount_batches(log_text(600_000), 256 * 1024)[0],
    "bulk 64 KiB": mount_batches(log_text(200_000, seed=3), 64 * 1024)[1],
    "small append grown": grown_batch(),
    "keys headers gaps": rich_batch(),
    "one record": mount_batches(b"only line\n", 1 << 20)[0],
}


def fields(r) -> tuple:
    return (r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers])


@pytest.mark.parametrize("codec,level", [(codecs.GZIP, None), (codecs.GZIP, 1), (codecs.SNAPPY, None),
                                         (codecs.LZ4, None), (codecs.LZ4, 12), (codecs.ZSTD, None),
                                         (codecs.ZSTD, 19), (codecs.ZSTD, -3)], ids=str)
@pytest.mark.parametrize("name", list(BATCHES))
def test_compressed_batches_read_back_by_kafka_python_and_aiokafka(name, codec, level):
    plain = BATCHES[name]
    packed = records.compress_batch(plain, codec, level)
    head, phead = records.validate(packed), records.validate(plain)  # CRC-32C recomputed
    assert head.compression == codec
    assert head._replace(crc=0, batch_length=0, attributes=0) == phead._replace(crc=0, batch_length=0, attributes=0)
    assert head.attributes == phead.attributes | codec
    expected = [fields(r) for r in KafkaPythonBatch(plain)]
    assert len(expected) == phead.records_count
    kp = KafkaPythonBatch(packed)
    assert kp.validate_crc() and kp.compression_type == codec
    assert [fields(r) for r in kp] == expected
    for reader in (AioBatch, AioBatchPy):  # aiokafka's compiled reader and its pure-Python one
        assert [fields(r) for r in reader(bytearray(packed))] == expected
    assert records.decompress_batch(packed) == plain  # byte for byte
    assert [fields(r) for r in records.decode(packed)] == [fields(r) for r in records.decode(plain)]
    assert [fields(r) for r in records.decode_raw(packed)] == expected


def test_compress_batch_keeps_or_converts_codecs():
    plain = BATCHES["bulk 256 KiB"]
    zstd = records.compress_batch(plain, codecs.ZSTD)
    assert records.compress_batch(zstd, codecs.ZSTD, 19) == zstd  # the target codec already: kept as is
    lz4 = records.compress_batch(zstd, codecs.LZ4)
    assert lz4 == records.compress_batch(plain, codecs.LZ4)
    assert records.compress_batch(lz4, 0) == plain
    assert records.compress_batch(plain, 0) == plain
    with pytest.raises(ValueError):
        records.compress_batch(plain, 6)


def test_control_and_empty_batches_stay_uncompressed():
    """Kafka never compresses control batches, and writes the empty batches compaction keeps without a codec."""
    control = records.build_batch_generic(10, 1, [None], keys=[b"\x00\x00\x00\x00"],
                                          attributes=records.ATTR_CONTROL | records.ATTR_TRANSACTIONAL)
    empty = records.build_batch_generic(20, 1, [], last_offset_delta=4, producer=(7, 0, 0))
    for batch in (control, empty):
        assert records.compress_batch(batch, codecs.ZSTD) == batch


def test_compress_batch_needs_exactly_one_whole_sound_batch():
    plain = BATCHES["one record"]
    for bad in (plain[:-1], plain + plain, plain[:40]):
        with pytest.raises(CorruptRecordError):
            records.compress_batch(bad, codecs.ZSTD)
    damaged = bytearray(plain)
    damaged[-3] ^= 1  # a flipped bit on disk: compressing must not give it a fresh, valid CRC
    with pytest.raises(CorruptRecordError, match="CRC"):
        records.compress_batch(bytes(damaged), codecs.ZSTD)


def test_decompress_batch_returns_plain_batches_without_a_copy():
    one, two = BATCHES["bulk 64 KiB"], BATCHES["one record"]
    assert records.decompress_batch(one) is one
    buf = bytearray(one + two)
    view = records.decompress_batch(buf, len(one))
    assert isinstance(view, memoryview) and view.obj is buf and bytes(view) == two
    packed = records.compress_batch(two, codecs.ZSTD)
    region = one + packed + one
    assert records.decompress_batch(region, len(one)) == two
    assert records.decompress_batch(memoryview(region)[len(one):len(one) + len(packed)]) == two


@pytest.mark.parametrize("codec", CODECS)
def test_corrupt_compressed_batch_is_a_corrupt_record_error(codec):
    plain = BATCHES["bulk 256 KiB"]
    packed = bytearray(records.compress_batch(plain, codec))
    # Damage the compressed bytes without fixing the CRC: the CRC check catches it, whatever the codec sees.
    damaged = bytearray(packed)
    damaged[len(damaged) // 2] ^= 0x55
    with pytest.raises(CorruptRecordError, match="CRC"):
        records.decompress_batch(bytes(damaged))
    # Damage that keeps the CRC right (a writer's bug): the codec refuses it, as a CorruptRecordError.
    garbage = bytearray(packed[:61]) + b"\x00\x01\x02\x03" * 50
    struct.pack_into(">i", garbage, 8, len(garbage) - 12)
    struct.pack_into(">I", garbage, 17, records.crc_of(garbage, 0, len(garbage)))
    with pytest.raises(CorruptRecordError, match=codecs.NAMES[codec]):
        records.decompress_batch(bytes(garbage))
    with pytest.raises(CorruptRecordError, match="truncated"):
        records.decompress_batch(bytes(packed[:-1]))
    # An unknown codec id (5-7) in the attributes.
    unknown = bytearray(packed)
    struct.pack_into(">h", unknown, 21, (records.parse_header(packed).attributes & ~7) | 6)
    struct.pack_into(">I", unknown, 17, records.crc_of(unknown, 0, len(unknown)))
    with pytest.raises(CorruptRecordError, match="unknown compression codec 6"):
        records.decompress_batch(bytes(unknown))
    with pytest.raises(CorruptRecordError):
        list(records.decode(bytes(damaged)))


# -- the Java readers Kafka itself uses -------------------------------------------------------------------------

JAVA_READER = r"""
import java.io.*;
import java.nio.file.*;
import java.util.zip.GZIPInputStream;

public class CodecReader {
    // args: codec in out [codec in out ...]; each input decompressed with the stream class Kafka's broker and
    // clients use for that codec (lz4: lz4-java's frame reader, Kafka's own reader being built on lz4-java).
    public static void main(String[] args) throws Exception {
        for (int i = 0; i < args.length; i += 3) {
            InputStream raw = new ByteArrayInputStream(Files.readAllBytes(Paths.get(args[i + 1])));
            InputStream in;
            switch (args[i]) {
                case "gzip": in = new GZIPInputStream(raw); break;
                case "snappy": in = new org.xerial.snappy.SnappyInputStream(raw); break;
                case "lz4": in = new net.jpountz.lz4.LZ4FrameInputStream(raw); break;
                case "zstd": in = new com.github.luben.zstd.ZstdInputStreamNoFinalizer(raw); break;
                default: throw new IllegalArgumentException(args[i]);
            }
            try (OutputStream out = Files.newOutputStream(Paths.get(args[i + 2]))) {
                in.transferTo(out);
            }
        }
    }
}
"""


def java_codec_jars() -> list[str] | None:
    import shutil

    try:
        import pyspark
    except ImportError:
        return None
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    found = []
    for prefix in ("snappy-java-", "zstd-jni-", "lz4-java-"):
        match = sorted(f for f in os.listdir(jars) if f.startswith(prefix) and f.endswith(".jar"))
        if not match:
            return None
        found.append(os.path.join(jars, match[-1]))
    return found if shutil.which("javac") and shutil.which("java") else None


def test_java_readers_kafka_uses_read_every_codec(tmp_path):
    """snappy-java's SnappyInputStream and zstd-jni's ZstdInputStreamNoFinalizer (the classes Kafka reads snappy
    and zstd with), Java's GZIPInputStream (Kafka's gzip reader) and lz4-java's frame reader, from the jars PySpark
    ships (the test extra), read what codecs.compress writes, at several levels."""
    import subprocess

    jars = java_codec_jars()
    if jars is None:
        pytest.fail("javac/java or PySpark's snappy-java, zstd-jni and lz4-java jars are missing (the test extra "
                    "and tools/dev.sh install them)")
    (tmp_path / "CodecReader.java").write_text(JAVA_READER)
    cp = os.pathsep.join(jars + [str(tmp_path)])
    subprocess.run(["javac", "-cp", cp, "-d", str(tmp_path), str(tmp_path / "CodecReader.java")], check=True,
                   timeout=120)
    args, expected = [], {}
    for codec, level in [(codecs.GZIP, -1), (codecs.GZIP, 9), (codecs.SNAPPY, None), (codecs.LZ4, 9),
                         (codecs.LZ4, 12), (codecs.ZSTD, 3), (codecs.ZSTD, -5), (codecs.ZSTD, 19)]:
        for name in ("one byte", "1 MiB of log text", "1 MiB random"):
            stem = f"{codecs.NAMES[codec]}-{level}-{name.replace(' ', '_')}"
            (tmp_path / (stem + ".in")).write_bytes(codecs.compress(codec, DATA[name], level))
            args += [codecs.NAMES[codec], str(tmp_path / (stem + ".in")), str(tmp_path / (stem + ".out"))]
            expected[stem] = DATA[name]
    r = subprocess.run(["java", "-cp", cp, "CodecReader", *args], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    for stem, data in expected.items():
        assert (tmp_path / (stem + ".out")).read_bytes() == data, stem

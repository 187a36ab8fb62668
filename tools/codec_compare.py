"""Compare the Python codec libraries logfs could compress Kafka batches with (docs/compression.md).

    python tools/codec_compare.py CORPUS [CORPUS...] [--blocks 65536,262144,1048576] [--rounds 2]

Each corpus (a text file of log lines) is cut into Kafka v2 records sections as logfs writes them (one record per
line, ``logfs._speedups.encode_lines`` when importable, else the same bytes from ``records.build_batch``), of
about each block size: what ``compress_batch`` compresses. Every candidate compresses and decompresses every block
with the framing Kafka's reader needs; the table gives compress and decompress MB/s (of uncompressed bytes, best
of ``--rounds``), the ratio, and how far a pure-Python thread gets during one codec call on 8 MiB against an idle wait as long
("GIL free": near 1 when the codec releases the GIL, near 0 when it holds it). Missing
libraries are skipped. Run it with a Python that has the candidates installed and logfs importable
(``PYTHONPATH=.``)."""

from __future__ import annotations

import argparse
import struct
import sys
import threading
import time
import zlib

KiB = 1024


def records_sections(path: str, block: int) -> list[bytes]:
    """The records sections (batch minus its 61-byte header) of the corpus cut into batches of ~``block`` bytes."""
    data = open(path, "rb").read()
    end = data.rfind(b"\n") + 1
    try:
        from logfs import _speedups

        batches, _ = _speedups.encode_lines(b"", data, end, block)
        return [bytes(b[61:]) for b, _n, _p in batches]
    except ImportError:  # the same bytes through the pure-Python encoder
        from logfs.storage.format import records

        out, lines, size = [], [], 0
        for line in data[:end].split(b"\n")[:-1]:
            if lines and size + len(line) + 12 > block:
                out.append(records.build_batch(0, 0, lines)[61:])
                lines, size = [], 0
            lines.append(line)
            size += len(line) + 12
        if lines:
            out.append(records.build_batch(0, 0, lines)[61:])
        return out


def candidates() -> dict[str, tuple]:
    """name -> (codec, compress(data) -> bytes, decompress(data, size) -> bytes)."""
    found: dict[str, tuple] = {}
    try:  # what logfs does (logfs.storage.format.codecs, the chosen libraries with Kafka's framing), at Kafka's defaults
        from logfs.storage.format import codecs as ours

        for codec in (ours.ZSTD, ours.LZ4, ours.SNAPPY, ours.GZIP):
            found[f"logfs.storage.format.codecs {ours.NAMES[codec]}"] = (
                ours.NAMES[codec], lambda d, c=codec: ours.compress(c, d), lambda d, n, c=codec: ours.decompress(c, d))
    except ImportError:
        pass
    try:
        import zstandard

        local = threading.local()

        def zc(d):
            if not hasattr(local, "c"):
                local.c = zstandard.ZstdCompressor(level=3)
                local.d = zstandard.ZstdDecompressor()
            return local.c.compress(d)

        def zd(d, n):
            if not hasattr(local, "c"):
                zc(b"")
            return local.d.decompress(d)

        found["zstd 3: zstandard"] = ("zstd", zc, zd)
    except ImportError:
        pass
    try:
        import pyzstd

        found["zstd 3: pyzstd"] = ("zstd", lambda d: pyzstd.compress(d, 3), lambda d, n: pyzstd.decompress(d))
    except ImportError:
        pass
    try:
        import cramjam

        found["zstd 3: cramjam"] = ("zstd", lambda d: bytes(cramjam.zstd.compress(d, 3)),
                                    lambda d, n: bytes(cramjam.zstd.decompress(d, output_len=n)))
    except ImportError:
        pass
    try:
        import lz4.frame as lz4f

        # Kafka's default level 9 is lz4-java's fast compressor; any other level is LZ4 HC at that level.
        for label, level in (("fast (Kafka's default 9)", 0), ("HC 9", 9)):
            kw = dict(compression_level=level, block_size=lz4f.BLOCKSIZE_MAX64KB, block_linked=False, store_size=True)
            found[f"lz4 {label}: lz4"] = ("lz4", lambda d, kw=kw: lz4f.compress(d, **kw),
                                          lambda d, n: lz4f.decompress(d))
    except ImportError:
        pass
    try:
        import cramjam

        # cramjam.lz4.compress links its blocks (FLG bit 5 clear), which Kafka's reader refuses; its streaming
        # Compressor can write independent blocks (with block checksums, without the content size), as aiokafka does.
        def cramjam_lz4(d, level):
            c = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
            c.compress(d)
            return bytes(c.finish())

        for label, level in (("fast (Kafka's default 9)", 0), ("HC 9", 9)):
            found[f"lz4 {label}: cramjam"] = ("lz4", lambda d, level=level: cramjam_lz4(d, level),
                                              lambda d, n: bytes(cramjam.lz4.decompress(d, output_len=n)))
    except ImportError:
        pass
    try:
        import cramjam

        found["snappy: cramjam raw + xerial"] = ("snappy", lambda d: _xerial(cramjam.snappy.compress_raw, d),
                                                 lambda d, n: _unxerial(cramjam.snappy.decompress_raw, d))
    except ImportError:
        pass
    try:
        import snappy  # python-snappy

        found["snappy: python-snappy + xerial"] = ("snappy", lambda d: _xerial(snappy.compress, d),
                                                   lambda d, n: _unxerial(snappy.decompress, d))
    except ImportError:
        pass
    found["gzip 6: zlib (stdlib)"] = ("gzip", lambda d: _zlib_gzip(zlib, d, 6),
                                      lambda d, n: zlib.decompress(d, 31, max(n, 16 * KiB)))
    try:
        from zlib_ng import zlib_ng

        found["gzip 6: zlib-ng"] = ("gzip", lambda d: _zlib_gzip(zlib_ng, d, 6),
                                    lambda d, n: zlib_ng.decompress(d, 31, max(n, 16 * KiB)))
    except ImportError:
        pass
    try:
        from isal import isal_zlib

        found["gzip 2 (isal's levels are 0-3): isal"] = (
            "gzip", lambda d: _zlib_gzip(isal_zlib, d, 2), lambda d, n: isal_zlib.decompress(d, 31, max(n, 16 * KiB)))
    except ImportError:
        pass
    try:
        import cramjam

        found["gzip 6: cramjam"] = ("gzip", lambda d: bytes(cramjam.gzip.compress(d, 6)),
                                    lambda d, n: bytes(cramjam.gzip.decompress(d, output_len=n)))
    except ImportError:
        pass
    return found


_XERIAL = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def _xerial(raw, data, chunk=32 * KiB) -> bytes:
    out = [_XERIAL]
    view = memoryview(data)
    for i in range(0, len(data), chunk):
        block = raw(view[i:i + chunk])
        out.append(struct.pack(">i", len(block)))
        out.append(bytes(block))
    return b"".join(out)


def _unxerial(raw, data) -> bytes:
    out, pos = [], 16
    view = memoryview(data)
    while pos < len(data):
        n = struct.unpack_from(">i", data, pos)[0]
        out.append(bytes(raw(view[pos + 4:pos + 4 + n])))
        pos += 4 + n
    return b"".join(out)


def _zlib_gzip(module, data, level) -> bytes:
    c = module.compressobj(level, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def timed(fn, items, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for item in items:
            fn(*item)
        best = min(best, time.perf_counter() - t0)
    return best


def gil_free(fn, prepare, text: bytes, trials: int = 5) -> float:
    """How far a pure-Python counting thread gets during one call ``fn(*prepare(data))`` on ``text`` repeated until
    the call lasts 40 ms or more, against an idle wait as long (the median of ``trials``; the switch interval is
    0.5 ms meanwhile): near 0 when the call holds the GIL throughout, near 1 when it releases it."""
    data = text
    while True:
        args = prepare(data)
        t0 = time.perf_counter()
        fn(*args)
        if time.perf_counter() - t0 >= 0.04 or len(data) >= 256 << 20:
            break
        data = data * 2
    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    t = threading.Thread(target=counter)
    t.start()
    results = []
    try:
        for _ in range(trials):
            c0, t0 = count[0], time.perf_counter()
            fn(*args)
            during, dt = count[0] - c0, time.perf_counter() - t0
            c0 = count[0]
            time.sleep(dt)
            idle = count[0] - c0
            results.append(during / max(idle, 1))
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)
    return min(1.0, sorted(results)[trials // 2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--blocks", default="65536,262144,1048576")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="", help="substring filter on the candidate names")
    args = ap.parse_args(argv)
    found = {k: v for k, v in candidates().items() if args.only in k}
    for path in args.corpus:
        print(f"\n### {path}\n")
        print("| candidate | block | compress MB/s | decompress MB/s | ratio | GIL free (compress / decompress) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for block in (int(b) for b in args.blocks.split(",")):
            sections = records_sections(path, block)
            total = sum(map(len, sections))
            if block == 262144:  # the yardsticks of the GIL column, on the same blocks
                import hashlib

                big = b"".join(sections)[:8 << 20]
                one = lambda d: (d,)  # noqa: E731
                print(f"| reference: hashlib.sha256 (releases the GIL) | | | | | "
                      f"{gil_free(lambda d: hashlib.sha256(d).digest(), one, big):.2f} |")
                print(f"| reference: bytes.upper (holds the GIL) | | | | | {gil_free(bytes.upper, one, big):.2f} |")
            for name, (_codec, comp, decomp) in found.items():
                packed = [comp(s) for s in sections]
                for s, p in zip(sections, packed):
                    if decomp(p, len(s)) != s:
                        raise SystemExit(f"{name}: round trip failed")
                tc = timed(comp, [(s,) for s in sections], args.rounds)
                td = timed(decomp, [(p, len(s)) for s, p in zip(sections, packed)], args.rounds)
                ratio = total / sum(map(len, packed))
                gil = ""
                if block == 262144:
                    gil = (f"{gil_free(comp, one, big):.2f} / "
                           f"{gil_free(decomp, lambda d: (comp(d), len(d)), big):.2f}")
                print(f"| {name} | {block // KiB} KiB | {total / tc / 1e6:,.0f} | {total / td / 1e6:,.0f} | "
                      f"{ratio:.2f} | {gil} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

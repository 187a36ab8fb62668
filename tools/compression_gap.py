"""Where a zstd topic's bytes at rest go, against ``zstd -3`` of the same text in 1 MiB blocks (issue 22's target:
at most 1.15x). Engine only, no mount: the corpus is cut into Kafka v2 batches of plain lines as logfs's bulk
append writes them (``_speedups.encode_lines``: one record per line, attributes 0, timestamp delta 0, offset delta
0..n-1, null key, no headers), ~``--batch`` bytes of records each, and each batch's records section is compressed
as one zstd frame (what ``records.compress_batch`` does), the 61-byte header counted.

Rows (each against the reference, ``zstd -3`` of the text in 1 MiB blocks):

- ``text, B blocks``: the text itself in blocks of the batch size (the block size's share of the gap);
- ``framing alone``: the same records with empty values (length, attributes, timestamp delta, offset delta, key
  length, value length, header count and the batch header: what the record format adds, compressed on its own,
  a lower bound of its cost under zstd);
- ``batches``: the records sections, at zstd levels and parameters (``zstandard.ZstdCompressionParameters``:
  anything a stock decoder reads, window at most the batch);
- MB/s: compression (and decompression) of the records sections per second of this thread's CPU time (so that
  other jobs on the machine do not count), best of ``--repeat``.

Usage: ``PYTHONPATH=. python tools/compression_gap.py CORPUS [--mib 32] [--batch 262144 ...] [--quick]``.
"""

from __future__ import annotations

import argparse
import time

import zstandard

from logfs._speedups import encode_lines

HEADER = 61
REF_BLOCK = 1 << 20


def blocks(data: bytes, size: int) -> list[bytes]:
    """``data`` cut into blocks of about ``size`` bytes at line ends."""
    out, pos = [], 0
    while pos < len(data):
        end = min(len(data), pos + size)
        if end < len(data):
            nl = data.rfind(b"\n", pos, end)
            end = nl + 1 if nl >= pos else end
        out.append(data[pos:end])
        pos = end
    return out


def records_sections(text: bytes, target: int) -> tuple[list[bytes], list[bytes]]:
    """(the records sections of the batches, the same batches' records with empty values)."""
    batches, _ = encode_lines(b"", text, len(text), target)
    sections, framing = [], []
    for batch, count, _payload in batches:
        sections.append(bytes(batch[HEADER:]))
        empty, _ = encode_lines(b"", b"\n" * count, count, 1 << 40)
        framing.append(bytes(empty[0][0][HEADER:]))
    return sections, framing


def compressor(params) -> zstandard.ZstdCompressor:
    """A level (int) or parameters; the frame as logfs writes it: content size, no checksum."""
    if isinstance(params, zstandard.ZstdCompressionParameters):
        return zstandard.ZstdCompressor(compression_params=params)
    return zstandard.ZstdCompressor(level=params, write_content_size=True, write_checksum=False)


def compressed(parts: list[bytes], params, repeat: int) -> tuple[int, float]:
    """(total compressed bytes plus a header per part, MB/s of the input)."""
    c = compressor(params)
    best, total = None, 0
    for _ in range(repeat):
        t0 = time.thread_time()
        total = sum(len(c.compress(p)) for p in parts)
        took = time.thread_time() - t0
        best = took if best is None else min(best, took)
    size = sum(len(p) for p in parts)
    return total + HEADER * len(parts), size / best / 1e6


def decompress_speed(parts: list[bytes], params, repeat: int) -> float:
    c = compressor(params)
    frames = [c.compress(p) for p in parts]
    d = zstandard.ZstdDecompressor()
    best = None
    for _ in range(repeat):
        t0 = time.thread_time()
        for f in frames:
            d.decompress(f)
        took = time.thread_time() - t0
        best = took if best is None else min(best, took)
    return sum(len(p) for p in parts) / best / 1e6


def params(level: int, source: int, **kw) -> zstandard.ZstdCompressionParameters:
    return zstandard.ZstdCompressionParameters.from_level(level, source_size=source, write_content_size=1,
                                                          write_checksum=0, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--mib", type=int, default=32, help="the corpus's first MiB (cut at a line end)")
    ap.add_argument("--batch", type=int, nargs="*", default=[64 << 10, 256 << 10, 1 << 20, 4 << 20])
    ap.add_argument("--levels", type=int, nargs="*", default=[1, 3, 5, 7, 9, 12, 15, 19])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with open(args.corpus, "rb") as f:
        text = f.read(args.mib << 20)
    text = text[: text.rfind(b"\n") + 1]
    ref, ref_speed = compressed(blocks(text, REF_BLOCK), 3, args.repeat)
    ref -= HEADER * len(blocks(text, REF_BLOCK))
    print(f"corpus {args.corpus}: {len(text):,} bytes; zstd -3 of the text in 1 MiB blocks {ref:,} B "
          f"({len(text) / ref:.2f}x, {ref_speed:.0f} MB/s)")
    print("| batch | row | bytes | x zstd -3 text 1 MiB | ratio (text / bytes) | compress MB/s | decompress MB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def row(batch: int, name: str, parts: list[bytes], p, decomp: bool = False) -> None:
        total, speed = compressed(parts, p, args.repeat)
        dspeed = f"{decompress_speed(parts, p, args.repeat):,.0f}" if decomp else ""
        print(f"| {batch >> 10} KiB | {name} | {total:,} | {total / ref:.3f} | {len(text) / total:.2f} | "
              f"{speed:,.0f} | {dspeed} |", flush=True)

    for batch in args.batch:
        sections, framing = records_sections(text, batch)
        row(batch, "text alone, blocks of the batch size", blocks(text, batch), 3)
        row(batch, "framing alone (empty values), level 3", framing, 3)
        for level in args.levels:
            row(batch, f"batches, level {level}", sections, level, decomp=level in (3, 9, 19))
        src = batch
        for name, kw in (("level 3, min_match 4", dict(min_match=4)),
                         ("level 3, min_match 3", dict(min_match=3)),
                         ("level 3, strategy lazy2", dict(strategy=zstandard.STRATEGY_LAZY2)),
                         ("level 3, strategy btlazy2", dict(strategy=zstandard.STRATEGY_BTLAZY2)),
                         ("level 3, btopt, min_match 3", dict(strategy=zstandard.STRATEGY_BTOPT, min_match=3)),
                         ("level 3, search_log 4, lazy2, min_match 4",
                          dict(strategy=zstandard.STRATEGY_LAZY2, search_log=4, min_match=4)),
                         ("level 3, hash_log 20, chain_log 20", dict(hash_log=20, chain_log=20))):
            row(batch, name, sections, params(3, src, **kw))


if __name__ == "__main__":
    main()

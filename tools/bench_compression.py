"""The compression scenario of tools/bench.py (``--only compression``, issue 22): a zstd topic (Kafka's default
level 3) against an uncompressed one, in the same run, on two data sets:

- ``lines``: the bench's own ~100-byte JSON lines (``make_lines``, far more repetitive than real logs);
- ``real``: a real log corpus (``--corpus PATH``; default /tmp/codecs-corpus/real.log, made as docs/compression.md
  says), repeated whole to the data size. Without it the scenario says so and measures ``lines`` only.

Each data set goes into two DATA_DIRs, each with its own daemon (``log.segment.bytes`` 32 MiB, 1 MiB with
--quick, so both logs have several sealed segments): topic ``t`` uncompressed, and topic ``t`` with
``compression.type=zstd``, whose sealed segments the daemon rewrites in the background. Figures:

- **at rest**: ``.log`` bytes of the zstd topic's sealed segments (once the rewrite is done: every sealed segment's
  first batch carries the zstd bits) against python-zstandard level 3 of the same text (the sealed segments'
  lines) in 1 MiB blocks, and against the uncompressed topic; the engine's rewrite of the uncompressed topic's
  segments in lz4, snappy and gzip (``compression.write_compressed`` in this process) for their ratios;
- **ingest**: ``cat FILE >> partition`` (as bulk_append, no fsync), MB/s, best of ``rounds``, the two topics in
  turn (the order alternating by round; a zstd ingest's rewrite is waited for before the next step); whether
  the rewrite (the cleaner's child process) was running during the timed window (sampled every 20 ms), and the
  seconds from the end of the ingest until every sealed segment is compressed; the rewrite's throughput alone:
  a copy of the uncompressed DATA_DIR mounted, its topic set to zstd, timed until all is compressed;
- **sequential read**: ``cat partition > /dev/null`` on a new mount with the page cache dropped (cold), then again
  (warm), best of ``rounds``;
- **random read**: ``user.logfs.position.<offset>`` (getxattr) and a ``pread`` of the line, for random offsets
  (the same for both topics), on a new mount with the page cache dropped; p50 and p99 over all rounds; each line
  checked against the text;
- **Spark**: ``spark.read.format("logfs").load(DATA_DIR)`` count, ``local[2]``, in a driver process of its own:
  cold (page cache dropped) once, then warm, best of ``rounds``; and from the bucket: both DATA_DIRs mounted
  again with tiering to a SeaweedFS started here (logfs/testing/seaweed.py; without it this part reports what is
  missing), every sealed segment uploaded, then ``load("s3://BUCKET/PREFIX")`` counts, best of ``rounds``;
- **compressing at append instead** (engine, no mount): ``Log.append_lines`` of 1 MiB writes (~64 KiB batches), and
  the cost per MiB of ``records.compress_batch`` (zstd 3) on each of those batches, as it would be on the request
  thread; the ratio that gives, against the background rewrite's ~256 KiB merged batches.

The pair of DATA_DIRs and what is on disk: tools/bench_compression_disk.py; the Spark part:
tools/bench_compression_spark.py; the markdown tables: tools/bench_markdown.py.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import statistics
import time

from bench_compression_disk import (CODECS, SYSTEMS, TOPIC, ZSTD, ChildWatch, Pair, base_of, compressed_count,
                                    sealed_log_bytes, segment_files, setx, wait_compressed)
from bench_compression_spark import spark
from logfs.testing.benchlib import append_file, daemon_pid, drop_caches, getx, make_lines, read_file

DEFAULT_CORPUS = "/tmp/codecs-corpus/real.log"


# -- the data sets ----------------------------------------------------------------------------------------------
def bench_lines(bench, size: int) -> str:
    path = os.path.join(bench.work, "compression-lines.json")
    if not os.path.exists(path):
        make_lines(path, size)
    return path


def corpus_data(bench, corpus: str, size: int) -> tuple[str, int]:
    """The corpus repeated whole to at least ``size`` bytes (cut at a line end to ``size`` if it is bigger);
    returns the file and the number of copies."""
    path = os.path.join(bench.work, "compression-real.log")
    total = os.path.getsize(corpus)
    copies = max(1, round(size / total))
    if total > size:
        with open(corpus, "rb") as f:
            head = f.read(size)
        with open(path, "wb") as f:
            f.write(head[: head.rindex(b"\n") + 1])
        return path, 1
    with open(corpus, "rb") as src, open(path, "wb") as out:
        text = src.read()
        if not text.endswith(b"\n"):
            text += b"\n"
        for _ in range(copies):
            out.write(text)
    return path, copies


# -- the mounted figures ----------------------------------------------------------------------------------------
def ingest(bench, name: str, src: str, opts: tuple[str, ...]) -> tuple[Pair, dict]:
    """Best of ``rounds`` ingests into both topics (and the median of each round's ratio: on a shared machine a
    busy moment lands on both topics of a round); returns the last round's pair (both unmounted) and figures."""
    size = os.path.getsize(src)
    best = {s: float("inf") for s in SYSTEMS}
    during, until, ratios = False, [], []
    pair = None
    for round_ in range(bench.rounds):
        if pair is not None:
            shutil.rmtree(pair.root, ignore_errors=True)
        pair = Pair(os.path.join(bench.work, f"compression-{name}"), opts)
        try:
            pair.create()
            took_by = {}
            for system in (SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]):
                os.sync()
                with ChildWatch(daemon_pid(pair.data[system])) as watch:
                    took = append_file(src, pair.part(system), fsync=False)
                ended = time.perf_counter()
                best[system] = min(best[system], took)
                took_by[system] = took
                assert os.stat(pair.part(system)).st_size == size
                if system == "zstd":
                    during = during or watch.seen
                    wait_compressed(pair.data["zstd"])
                    until.append(time.perf_counter() - ended)
            ratios.append(took_by["plain"] / took_by["zstd"])
        finally:
            pair.close()
    mb = size / 1e6
    return pair, {"MBps_ingest_plain": mb / best["plain"], "MBps_ingest_zstd": mb / best["zstd"],
                  "ingest_ratio": best["plain"] / best["zstd"], "ingest_ratio_median": statistics.median(ratios),
                  "target_ingest": 0.9,
                  "rewrite_during_ingest": during, "s_until_compressed": min(until)}


def read_line(fd: int, pos: int) -> bytes:
    got = os.pread(fd, 4096, pos)
    while b"\n" not in got:
        more = os.pread(fd, 16384, pos + len(got))
        if not more:
            break
        got += more
    return got.split(b"\n", 1)[0]


def reads(bench, pair: Pair, text: bytes, n: int) -> tuple[dict, int]:
    """Per round and topic, on a new mount (logfs's own caches start cold too): the page cache dropped, ``cat`` of
    the partition (cold) and again (warm); the page cache dropped again, then ``n`` random offsets (the same for
    both topics in a round): ``getxattr position.<offset>`` + ``pread`` of the line, each checked against the
    text. Returns the figures, and the text position where the active segment starts (the sealed segments'
    text)."""
    best: dict[str, float] = {}
    latencies: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    rng = random.Random(22)
    dropped, sealed_text = True, None
    for round_ in range(bench.rounds):
        offsets: list[int] = []
        for system in (SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]):
            pair.mount(system)
            path = pair.part(system)
            try:
                if sealed_text is None:
                    active = base_of(segment_files(pair.data[system])[-1])
                    sealed_text = int(getx(path, f"position.{active}"))
                if not offsets:
                    end = int(getx(path, "log_end_offset"))
                    offsets = [rng.randrange(end) for _ in range(n)]
                dropped = drop_caches() and dropped
                for kind in ("cold", "warm"):
                    took = read_file(path, len(text))
                    best[f"{kind}_{system}"] = min(took, best.get(f"{kind}_{system}", float("inf")))
                drop_caches()
                fd = os.open(path, os.O_RDONLY)
                try:
                    for offset in offsets:
                        start = time.perf_counter()
                        pos = int(os.getxattr(fd, f"user.logfs.position.{offset}"))  # (the descriptor's view)
                        line = read_line(fd, pos)
                        latencies[system].append(time.perf_counter() - start)
                        assert pos == 0 or text[pos - 1] == 10, (system, offset, pos)
                        assert line == text[pos: text.index(b"\n", pos)], (system, offset, pos)
                finally:
                    os.close(fd)
            finally:
                pair.unmount(system)
    mb = len(text) / 1e6
    row = {"MBps_cold_plain": mb / best["cold_plain"], "MBps_cold_zstd": mb / best["cold_zstd"],
           "cold_ratio": best["cold_plain"] / best["cold_zstd"], "target_cold": 0.9,
           "MBps_warm_plain": mb / best["warm_plain"], "MBps_warm_zstd": mb / best["warm_zstd"],
           "warm_ratio": best["warm_plain"] / best["warm_zstd"], "page_cache_dropped": dropped,
           "random_reads": len(latencies["plain"])}
    for system in SYSTEMS:
        q = statistics.quantiles(latencies[system], n=100)
        row[f"p50_ms_{system}"] = q[49] * 1000
        row[f"p99_ms_{system}"] = q[98] * 1000
    row["p99_ratio"] = row["p99_ms_zstd"] / row["p99_ms_plain"]
    row["target_p99_max"] = 2.0
    return row, sealed_text


def rewrite_alone(bench, pair: Pair) -> float:
    """MB/s of the daemon's rewrite of a topic that nothing else touches: a copy of the uncompressed DATA_DIR
    mounted, ``compression.type=zstd`` set on its topic, timed until every sealed segment is in zstd."""
    copy = Pair(os.path.join(bench.work, "compression-rewrite"), pair.opts)
    try:
        os.rmdir(copy.mnt["zstd"])
        shutil.rmtree(os.path.join(copy.root, "zstd"))
        shutil.copytree(pair.data["plain"], copy.data["zstd"])
        os.makedirs(copy.mnt["zstd"])
        os.sync()
        copy.mount("zstd")
        sealed = sealed_log_bytes(copy.data["zstd"])
        start = time.perf_counter()
        setx(os.path.join(copy.mnt["zstd"], TOPIC), "compression.type", "zstd")
        wait_compressed(copy.data["zstd"])
        took = time.perf_counter() - start
    finally:
        copy.close()
        shutil.rmtree(copy.root, ignore_errors=True)
    return sealed / took / 1e6


# -- the engine's figures (no mount) ------------------------------------------------------------------------------
def zstd3_blocks(text: bytes, block: int = 1 << 20) -> int:
    import zstandard

    c = zstandard.ZstdCompressor(level=3)
    return sum(len(c.compress(text[i: i + block])) for i in range(0, len(text), block))


def engine_rewrites(data: str, rounds: int) -> dict:
    """The engine's rewrite (``compression.write_compressed``, the function the cleaner's child runs) of the
    uncompressed topic's sealed segments in each codec, into a scratch directory: bytes and MB/s (best of
    ``rounds`` for zstd, one pass for the others)."""
    from logfs.storage import LogConfig
    from logfs.storage.cleaner.compression import write_compressed
    from logfs.storage.local.lifecycle import discard, open_segment

    directory = os.path.join(data, f"{TOPIC}-0")
    scratch = os.path.join(os.path.dirname(data), "rewrite-scratch")
    out = {}
    for name, codec in CODECS.items():
        config = dataclasses.replace(LogConfig(), segment_bytes=1 << 30, compression_type=name)
        total = took = 0.0
        size_in = 0
        for path in segment_files(data)[:-1]:
            segment = open_segment(directory, base_of(path), config, active=False)
            segment.load_state()
            try:
                size_in += segment.size
                times = []
                for _ in range(rounds if name == "zstd" else 1):
                    shutil.rmtree(scratch, ignore_errors=True)
                    os.makedirs(scratch)
                    start = time.perf_counter()
                    cleaned = write_compressed(scratch, config, segment, int(time.time() * 1000))
                    times.append(time.perf_counter() - start)
                    size = cleaned.size
                    discard(cleaned)
                took += min(times)
                total += size
            finally:
                for index in (segment.offset_index, segment.time_index, segment.view_index):
                    index.close_handler()
                os.close(segment.fd)
        out[name] = (int(total), size_in / took / 1e6)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def append_time_compression(bench, text: bytes) -> dict:
    """The alternative design, measured: compress each bulk-append batch on the request thread.

    ``Log.append_lines`` of the text in 1 MiB writes cut at line ends (uncompressed, one segment), best of
    ``rounds``; then ``records.compress_batch(batch, zstd, 3)`` of each batch it wrote (what compressing at append
    would add to each write), best of ``rounds``; and the background rewrite of the same segment
    (``write_compressed``: ~256 KiB merged batches), for its ratio and CPU per MiB."""
    from logfs.storage import LogConfig, load_log
    from logfs.storage.format import records as rec
    from logfs.storage.cleaner.compression import write_compressed
    from logfs.storage.local.lifecycle import discard

    work = os.path.join(bench.work, "compression-engine")
    chunks, at = [], 0
    while at < len(text):
        end = text.rfind(b"\n", at, at + (1 << 20)) + 1 or text.index(b"\n", at) + 1
        chunks.append(text[at:end])
        at = end
    mib = len(text) / (1 << 20)
    config = dataclasses.replace(LogConfig(), segment_bytes=1 << 30)
    t_append = float("inf")
    for _ in range(bench.rounds):
        shutil.rmtree(work, ignore_errors=True)
        plog = load_log(os.path.join(work, f"{TOPIC}-0"), TOPIC, 0, config)
        start = time.perf_counter()
        for chunk in chunks:
            plog.append_lines(b"", chunk, len(chunk))
        t_append = min(t_append, time.perf_counter() - start)
        if _ < bench.rounds - 1:
            plog.close()
    plog.roll()
    segment = plog.segments.as_list()[0]
    buf = segment.read(0, segment.size)
    batches = [bytes(buf[pos: pos + h.size]) for pos, h in rec.iter_headers(buf)]
    t_compress, small = float("inf"), 0
    for _ in range(bench.rounds):
        start = time.perf_counter()
        small = sum(len(rec.compress_batch(b, ZSTD, 3)) for b in batches)
        t_compress = min(t_compress, time.perf_counter() - start)
    zconfig = dataclasses.replace(config, compression_type="zstd")
    scratch = os.path.join(work, "scratch")
    t_rewrite, big = float("inf"), 0
    for _ in range(bench.rounds):
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        start = time.perf_counter()
        cleaned = write_compressed(scratch, zconfig, segment, int(time.time() * 1000))
        t_rewrite = min(t_rewrite, time.perf_counter() - start)
        big = cleaned.size
        discard(cleaned)
    plog.close()
    shutil.rmtree(work, ignore_errors=True)
    return {"append_mb": round(len(text) / 1e6, 1), "append_batches": len(batches),
            "batch_kib": segment.size / len(batches) / 1024,
            "MBps_append_engine": len(text) / t_append / 1e6,
            "ms_per_mib_compress_at_append": t_compress * 1000 / mib,
            "ms_per_mib_append_engine": t_append * 1000 / mib,
            "MBps_append_with_compress": len(text) / (t_append + t_compress) / 1e6,
            "append_kept_with_compress": t_append / (t_append + t_compress),
            "ratio_at_append_64k": len(text) / small, "ratio_rewrite_256k": len(text) / big,
            "ms_per_mib_rewrite_engine": t_rewrite * 1000 / mib}


# -- the scenario ---------------------------------------------------------------------------------------------------
def compression(bench) -> None:
    quick = bench.quick
    size = (4 << 20) if quick else (256 << 20)
    segment = (1 << 20) if quick else (32 << 20)
    n_random = 200 if quick else 2000
    opts = (f"log.segment.bytes={segment}",)
    corpus = bench.corpus if bench.corpus is not None else (DEFAULT_CORPUS if os.path.exists(DEFAULT_CORPUS) else "")
    datasets = {"lines": bench_lines(bench, size)}
    copies = 1
    if corpus and os.path.exists(corpus):
        datasets["real"], copies = corpus_data(bench, corpus, size)
    else:
        why = f"no corpus at {corpus or DEFAULT_CORPUS} (--corpus PATH): the bench's lines only"
        print(f"compression: {why}", flush=True)
        for record in ("compression_real", "compression_spark_real", "compression_bucket_real"):
            bench.record(record, skipped=why)
    pairs: dict[str, Pair] = {}
    try:
        for name, src in datasets.items():
            with open(src, "rb") as f:
                text = f.read()
            row = {"mb": round(len(text) / 1e6, 1), "segment_mb": segment >> 20, "best_of": bench.rounds,
                   "corpus": os.path.basename(corpus) if name == "real" else "make_lines",
                   "copies": copies if name == "real" else 1}
            pair, figures = ingest(bench, name, src, opts)
            pairs[name] = pair
            read_figures, sealed_text = reads(bench, pair, text, n_random)
            # At rest: the sealed segments (the same offsets in both: both rolled at the same records).
            plain, zstd = segment_files(pair.data["plain"]), segment_files(pair.data["zstd"])
            assert [base_of(p) for p in plain] == [base_of(p) for p in zstd], (plain, zstd)
            assert compressed_count(pair.data["zstd"])[0] == len(zstd) - 1
            z3 = zstd3_blocks(text[:sealed_text])
            row.update(segments=len(zstd) - 1, sealed_text_mb=sealed_text / 1e6,
                       mb_plain=sealed_log_bytes(pair.data["plain"]) / 1e6,
                       mb_zstd=sealed_log_bytes(pair.data["zstd"]) / 1e6, mb_zstd3_1mib=z3 / 1e6)
            row["ratio_plain"] = sealed_text / 1e6 / row["mb_plain"]
            row["ratio_zstd"] = sealed_text / 1e6 / row["mb_zstd"]
            row["ratio_zstd3_1mib"] = sealed_text / z3
            row["at_rest_vs_zstd3"] = row["mb_zstd"] / row["mb_zstd3_1mib"]
            row["at_rest_vs_plain"] = row["mb_zstd"] / row["mb_plain"]
            row["target_at_rest_max"] = 1.15
            rewrites = engine_rewrites(pair.data["plain"], bench.rounds)
            for codec in ("lz4", "snappy", "gzip"):
                row[f"ratio_{codec}"] = sealed_text / rewrites[codec][0]
                row[f"MBps_rewrite_engine_{codec}"] = rewrites[codec][1]
            row["MBps_rewrite_engine_zstd"] = rewrites["zstd"][1]
            row.update(figures)
            row["MBps_rewrite_daemon"] = rewrite_alone(bench, pair)
            row.update(read_figures)
            row.update(append_time_compression(bench, text[: text.rfind(b"\n", 0, 64 << 20) + 1]))
            row["load_avg"] = "/".join(f"{x:.2f}" for x in os.getloadavg())
            bench.record(f"compression_{name}", **row)
        spark(bench, pairs)
    finally:
        for pair in pairs.values():
            pair.close()
            shutil.rmtree(pair.root, ignore_errors=True)

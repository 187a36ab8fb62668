"""The markdown tables of tools/bench.py's report (``markdown(report)``), ready to paste into docs/benchmarks.md:
the write-path figures (bulk append, sequential read, small writes) as tables of their own, the compression
scenario's (tools/bench_compression.py), and one figure/value table per other scenario."""

from __future__ import annotations

from logfs.testing.benchlib import fmt, met, table


def markdown(report: dict) -> str:
    """One table per scenario, ready to paste into docs/benchmarks.md. Ratios are logfs's throughput over the
    reference's (above 1: logfs is faster)."""
    results = report["results"]
    out = [f"Run of {report['when']}{' (--quick: tiny sizes, not figures)' if report['quick'] else ''}: "
           f"{report['machine']['cpus']} CPUs, kernel {report['machine']['kernel']}, "
           f"Python {report['machine']['python']}."]
    if "bulk_append" in results:
        nosync, fsync = results["bulk_append"], results["bulk_append_fsync"]
        out += ["", f"**Bulk append**: `cat` of {fmt(nosync['mb'])} MB of ~100-byte JSON lines into a file opened "
                f"`O_APPEND`, closed at the end (timed), best of {nosync['best_of']}; logfs, nullfs and ext4 in turn."]
        out += table(["sync", "logfs MB/s", "nullfs MB/s", "ext4 MB/s", "logfs/nullfs", "logfs/ext4", "target",
                      "met?"],
                     [["none", nosync["MBps_logfs"], nosync["MBps_nullfs"], nosync["MBps_ext4"],
                       nosync["ratio_vs_nullfs"], nosync["ratio_vs_ext4"], "≥ 0.35 of ext4",
                       met(nosync["ratio_vs_ext4"] >= nosync["target_vs_ext4"])],
                      ["`fsync` of the descriptor before closing it", fsync["MBps_logfs"], fsync["MBps_nullfs"],
                       fsync["MBps_ext4"], fsync["ratio_vs_nullfs"], fsync["ratio_vs_ext4"], "≥ 0.8 of ext4",
                       met(fsync["ratio_vs_ext4"] >= fsync["target_vs_ext4"])]])
        cold, warm = results["sequential_read"], results["sequential_read_warm"]
        out += ["", f"**Sequential read**: `cat` of the {fmt(cold['mb'])} MB written above `> /dev/null`, "
                f"best of {cold['best_of']}; logfs on a new mount."]
        out += table(["page cache", "logfs MB/s", "nullfs MB/s", "ext4 MB/s", "logfs/nullfs", "logfs/ext4"],
                     [["cold: dropped before each system's read" if cold["page_cache_dropped"]
                       else "cold: could NOT be dropped (not root)", cold["MBps_logfs"], cold["MBps_nullfs"],
                       cold["MBps_ext4"], cold["ratio_vs_nullfs"], cold["ratio_vs_ext4"]],
                      ["warm: the same file read again at once", warm["MBps_logfs"], warm["MBps_nullfs"],
                       warm["MBps_ext4"], warm["ratio_vs_nullfs"], warm["ratio_vs_ext4"]]])
    if "small_writes" in results:
        small = results["small_writes"]
        rows = small["rows"]
        out += ["", f"**Small writes**: one line per `write()` on an `O_APPEND` descriptor, {fmt(rows[0]['lines'])} "
                f"lines per case split between the writer processes, all writing to the same file; aggregate "
                f"lines/s, best of {small['best_of']}; logfs, nullfs and ext4 in turn. `.log` bytes per byte of "
                f"text: after a clean unmount, worst round. Targets: ≥ 0.85 of nullfs, ≤ 1.15 `.log` bytes per "
                f"byte (1.5 for 25-byte lines)."]
        out += table(["writers", "line bytes", "logfs lines/s", "nullfs lines/s", "ext4 lines/s", "logfs/nullfs",
                      "logfs/ext4", "`.log` bytes per text byte", "met?"],
                     [[r["writers"], r["line_bytes"], r["lines_per_s_logfs"], r["lines_per_s_nullfs"],
                       r["lines_per_s_ext4"], r["ratio_vs_nullfs"], r["ratio_vs_ext4"], r["log_bytes_per_text_byte"],
                       met(r["ratio_vs_nullfs"] >= r["target_vs_nullfs"]
                           and r["log_bytes_per_text_byte"] <= r["target_max_log_bytes_per_text_byte"])]
                      for r in rows])
    if any(name.startswith("compression") for name in results):
        out += compression_tables(results)
    for name, values in results.items():
        if name.startswith(("bulk_append", "sequential_read", "small_writes", "compression")):
            continue
        out += ["", f"**{name}**"] + table(["figure", "value"], [[k, v] for k, v in values.items()])
    return "\n".join(out) + "\n"


# -- the compression scenario ---------------------------------------------------------------------------------------------------------
_SECTIONS = [
    ("At rest: `.log` bytes of the sealed segments once rewritten; a ratio is text bytes over stored bytes.", [
        ("sealed segments", "", "segments", None),
        ("text of the sealed segments, MB", "", "sealed_text_mb", None),
        ("uncompressed topic, MB", "", "mb_plain", None),
        ("zstd topic, MB", "", "mb_zstd", None),
        ("`zstd -3` of the same text in 1 MiB blocks, MB", "", "mb_zstd3_1mib", None),
        ("ratio: zstd topic", "", "ratio_zstd", None),
        ("ratio: `zstd -3`, 1 MiB blocks", "", "ratio_zstd3_1mib", None),
        ("zstd topic / `zstd -3` in 1 MiB blocks", "", "at_rest_vs_zstd3", ("≤ 1.15", lambda v: v <= 1.15)),
        ("zstd topic / uncompressed topic", "", "at_rest_vs_plain", None),
        ("ratio: lz4 (the engine's rewrite of the same segments)", "", "ratio_lz4", None),
        ("ratio: snappy (idem)", "", "ratio_snappy", None),
        ("ratio: gzip (idem)", "", "ratio_gzip", None)]),
    ("Ingest: `cat FILE >> partition` (no fsync), best of the rounds, the two topics in turn; then the rewrite.", [
        ("uncompressed topic, MB/s", "", "MBps_ingest_plain", None),
        ("zstd topic, MB/s", "", "MBps_ingest_zstd", None),
        ("zstd / uncompressed (best against best)", "", "ingest_ratio", ("≥ 0.9", lambda v: v >= 0.9)),
        ("zstd / uncompressed, median of the rounds' pairs", "", "ingest_ratio_median", None),
        ("the rewrite ran during a timed zstd ingest", "", "rewrite_during_ingest", None),
        ("s from the end of the ingest until all is compressed (best)", "", "s_until_compressed", None),
        ("the daemon's rewrite alone (topic set to zstd afterwards), MB/s", "", "MBps_rewrite_daemon", None),
        ("the engine's rewrite, one thread, zstd, MB/s", "", "MBps_rewrite_engine_zstd", None),
        ("idem lz4, MB/s", "", "MBps_rewrite_engine_lz4", None),
        ("idem snappy, MB/s", "", "MBps_rewrite_engine_snappy", None),
        ("idem gzip, MB/s", "", "MBps_rewrite_engine_gzip", None)]),
    ("Reads on a new mount. Sequential: `cat partition > /dev/null`, cold (page cache dropped) then warm, best of "
     "the rounds. Random: `getxattr user.logfs.position.<offset>` + `pread` of the line, the same random offsets "
     "for both topics, page cache dropped at the start of each round.", [
        ("sequential cold, uncompressed, MB/s", "", "MBps_cold_plain", None),
        ("sequential cold, zstd, MB/s", "", "MBps_cold_zstd", None),
        ("cold: zstd / uncompressed", "", "cold_ratio", ("≥ 0.9", lambda v: v >= 0.9)),
        ("sequential warm, uncompressed, MB/s", "", "MBps_warm_plain", None),
        ("sequential warm, zstd, MB/s", "", "MBps_warm_zstd", None),
        ("warm: zstd / uncompressed", "", "warm_ratio", None),
        ("random reads per topic", "", "random_reads", None),
        ("random p50, uncompressed, ms", "", "p50_ms_plain", None),
        ("random p50, zstd, ms", "", "p50_ms_zstd", None),
        ("random p99, uncompressed, ms", "", "p99_ms_plain", None),
        ("random p99, zstd, ms", "", "p99_ms_zstd", None),
        ("p99: zstd / uncompressed", "", "p99_ratio", ("≤ 2", lambda v: v <= 2.0))]),
    ("Spark: `spark.read.format(\"logfs\").load(...).count()`, `local[2]`, `minPartitions` 4, in a driver process of "
     "its own. DATA_DIR: unmounted, cold once (page cache dropped), then warm, best of the rounds. Bucket: both "
     "DATA_DIRs tiered to SeaweedFS, `load(\"s3://BUCKET/PREFIX\")`, best of the rounds. Ratio: uncompressed "
     "seconds over zstd seconds.", [
        ("records", "spark", "records", None),
        ("DATA_DIR warm, uncompressed, s", "spark", "s_count_plain", None),
        ("DATA_DIR warm, zstd, s", "spark", "s_count_zstd", None),
        ("DATA_DIR warm: ratio", "spark", "spark_local_ratio", ("≥ 0.8", lambda v: v >= 0.8)),
        ("DATA_DIR cold, uncompressed, s", "spark", "s_count_cold_plain", None),
        ("DATA_DIR cold, zstd, s", "spark", "s_count_cold_zstd", None),
        ("DATA_DIR cold: ratio", "spark", "spark_local_cold_ratio", ("≥ 0.8", lambda v: v >= 0.8)),
        ("bucket objects, uncompressed, MB", "bucket", "mb_bucket_plain", None),
        ("bucket objects, zstd, MB", "bucket", "mb_bucket_zstd", None),
        ("bucket, uncompressed, s", "bucket", "s_count_plain", None),
        ("bucket, zstd, s", "bucket", "s_count_zstd", None),
        ("bucket: ratio", "bucket", "spark_bucket_ratio", ("≥ 1.0", lambda v: v >= 1.0))]),
    ("The alternative, compressing at append (engine, no mount): `Log.append_lines` of 1 MiB writes cut at line "
     "ends, then `records.compress_batch` (zstd 3) of each batch it wrote, as the request thread would; against "
     "the background rewrite (`compression.write_compressed`, ~256 KiB merged batches) of the same segment.", [
        ("text appended, MB", "", "append_mb", None),
        ("batches written by the append (KiB each)", "", "batch_kib", None),
        ("engine append alone, MB/s", "", "MBps_append_engine", None),
        ("engine append alone, ms per MiB", "", "ms_per_mib_append_engine", None),
        ("compress_batch of each appended batch, ms per MiB (request thread)", "", "ms_per_mib_compress_at_append",
         None),
        ("append + compress, MB/s", "", "MBps_append_with_compress", None),
        ("append throughput kept", "", "append_kept_with_compress", None),
        ("ratio: ~64 KiB batches compressed at append", "", "ratio_at_append_64k", None),
        ("ratio: the rewrite's ~256 KiB merged batches", "", "ratio_rewrite_256k", None),
        ("the rewrite, ms per MiB (in the cleaner's child process)", "", "ms_per_mib_rewrite_engine", None)]),
]


def compression_tables(results: dict) -> list[str]:
    """The compression section: one table per part, a column per data set, targets beside."""
    names = [n for n in ("lines", "real") if f"compression_{n}" in results
             and "skipped" not in results[f"compression_{n}"]]
    out = []
    for n in ("lines", "real"):
        for record in (f"compression_{n}", f"compression_spark_{n}", f"compression_bucket_{n}"):
            if "skipped" in results.get(record, {}):
                out += ["", f"**{record}** not measured: {results[record]['skipped']}."]
    if not names:
        return out
    main = {n: results[f"compression_{n}"] for n in names}
    sets = "; ".join(f"`{n}`, {fmt(r['mb'])} MB: {r['corpus']}" + (f" {r['copies']} times" if r["copies"] > 1 else "")
                     for n, r in main.items())
    loads = "; ".join(f"`{n}` {r['load_avg']}" for n, r in main.items())
    first = main[names[0]]
    out += ["", f"**Compression** (issue 22): a zstd topic (level 3; sealed segments rewritten in the background) "
            f"against an uncompressed one in the same run, `log.segment.bytes` {first['segment_mb']} MiB, best of "
            f"{first['best_of']}. Data sets: {sets}. Load average (1/5/15 min) after each: {loads}."]
    for intro, rows in _SECTIONS:
        body = []
        for label, kind, key, target in rows:
            records = [results.get(f"compression_{kind + '_' if kind else ''}{n}", {}) for n in names]
            if any(key not in r for r in records):
                continue
            cells = [r[key] for r in records]
            body.append([label, *cells, target[0] if target else "",
                         ", ".join(met(target[1](c)) for c in cells) if target else ""])
        if body:
            out += ["", intro] + table(["figure", *names, "target", "met?"], body)
    return out

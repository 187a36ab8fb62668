"""tools/bench.py --quick runs end to end (so it never rots) and reports every scenario with sane figures: every
number in its JSON and in the markdown tables it prints is finite and positive, every table row is there, and
every figure printed on a scenario line is the JSON report's own value, within physical bounds."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from harness import daemon_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANGES = {
    **{name: {"MBps_logfs": (0.5, 1e5), "MBps_nullfs": (0.5, 1e5), "MBps_ext4": (0.5, 1e6),
              "ratio_vs_nullfs": (0.001, 100), "ratio_vs_ext4": (0.001, 100), "mb": (0.1, 1e5), "best_of": (1, 1),
              **targets}
       for name, targets in {
           "bulk_append": {"target_vs_nullfs": (0.5, 0.5), "target_vs_ext4": (0.35, 0.35)},
           "bulk_append_fsync": {"target_vs_ext4": (0.8, 0.8)},
           "sequential_read": {"target_vs_nullfs": (0.6, 0.6), "page_cache_dropped": bool},
           "sequential_read_warm": {},
       }.items()},
    "shell_appends": {"n": (500, 500), "per_s_logfs": (1, 1e6), "per_s_ext4": (1, 1e6),
                      "ratio_vs_ext4": (0.001, 100), "target": (0.7, 0.7)},
    "read_at_offset": {"ms_small": (0.001, 60_000), "ms_big": (0.001, 60_000), "big_over_small": (0.001, 1000),
                       "target_max": (2, 2), "small_mb": (1, 1), "big_mb": (64, 64)},
    "mount_time": {"clean_small_s": (0.01, 300), "clean_big_s": (0.01, 300), "big_over_small": (0.001, 1000),
                   "kill9_small_s": (0.01, 300), "kill9_big_s": (0.01, 300), "small_mb": (8, 8),
                   "big_mb": (128, 128), "target_max": (2, 2)},
    "memory": {"rss_mb_small": (1, 1000), "rss_mb_big": (1, 1000), "partitions": (10, 10),
               "store_mb_big": (128, 128), "target_max_mb": (200, 200)},
    "responsiveness": {**{f"{k}_{mode}": r for mode in ("process", "thread") for k, r in (
                          ("p99_ms_idle", (0.001, 60_000)), ("p99_ms_cleaning", (0.001, 60_000)),
                          ("ratio", (0.0001, 10_000)), ("clean_s", (0.001, 600)))},  # -1: never cleaned
                       "partition_mb": (16, 16), "target_max": (3, 3)},
    "spark": {"mb": (8, 8), "s_logfs": (0.01, 900), "s_ext4": (0.01, 900), "ratio_vs_ext4": (0.001, 1000),
              "records": (1, 10**9), "target": (0.8, 0.8)},
    "spark_sink": {"rows": (50_000, 50_000), "row_bytes": (50, 200), "rows_per_s_logfs": (1, 1e8),
                   "rows_per_s_json": (1, 1e8), "ratio_vs_json": (0.001, 1000), "publish_mb": (7, 9),
                   "publish_MBps": (0.1, 1e5), "cp_fsync_MBps": (0.1, 1e6), "publish_vs_cp": (0.0001, 1000)},
    "metrics": {"partitions": (200, 200), "lines": (5000, 5000), "interval_ms": (250, 250),
                "lines_per_s_off": (10, 1e6), "lines_per_s_on": (10, 1e6), "ratio_on_vs_off": (0.05, 20),
                "render_ms": (0.01, 10_000), "file_kb": (10, 100_000), "best_of": (1, 1)},
    "writer_headers": {"lines": (5000, 5000), "line_bytes": (100, 100), "lines_per_s_off": (10, 1e6),
                       "lines_per_s_on": (10, 1e6), "ratio_on_vs_off": (0.05, 20),
                       "log_bytes_per_text_byte_off": (1.0, 1.5), "log_bytes_per_text_byte_on": (1.2, 5),
                       "best_of": (1, 1)},
    "tiered": {"mb": (24, 24), "segment_mb": (4, 4), "rounds": (1, 1),
               **{f"p99_ms_{k}": (0.001, 60_000) for k in (
                   "idle", "store_up_uploading", "store_down", "store_slow")},
               **{f"ratio_{k}": (0.0001, 10_000) for k in ("store_up_uploading", "store_down", "store_slow")},
               "target_ratio_max": (2, 2), "tiered_text_mb": (10, 26), "tiered_stored_mb": (10, 30),
               "MBps_store_get_cold": (0.01, 1e5), "MBps_store_get_warm": (0.01, 1e5),
               **{f"MBps_{unit}_{k}": (0.01, 1e5) for unit in ("stored", "text")
                  for k in ("1m_cold", "1m_warm", "8k_cold", "8k_warm")},
               "MBps_text_local_1m": (0.01, 1e5),
               **{f"ratio_{k}_cold_vs_store_{s}": (0.0001, 10_000) for k in ("1m", "8k")
                  for s in ("cold", "warm", "cold_worst_round")},
               "target_1m": (0.5, 0.5), "target_8k": (0.3, 0.3), "random_reads": (100, 100),
               "random_gets": (1, 200), "random_get_mb": (0.01, 30), "random_read_ms_median": (0.01, 60_000),
               "random_read_ms_max": (0.01, 60_000), "cache_limit_mb": (2.097152, 2.097152),
               "cache_max_mb": (0.01, 30), "cache_max_block_files_mb": (0.01, 30),
               "MBps_stored_1m_cold_small_cache": (0.01, 1e5)},
    "spark_cluster": {"mb": (8, 20), "records": (50_000, 1_000_000),
                      **{f"{k}_{q}_{src}": r for q in ("count", "groupby") for src in ("bucket", "local")
                         for k, r in (("s", (0.01, 900)), ("MBps", (0.01, 1e5)))},
                      "ratio_count": (0.001, 1000), "ratio_groupby": (0.001, 1000), "target": (0.5, 0.5)},
    # 500 partitions: the daemon holds a descriptor per partition in use (its budget is half of RLIMIT_NOFILE)
    # and none for idle ones right after mounting.
    "many_partitions": {"partitions": (500, 500), "mkdir_ms": (0.01, 10_000), "first_append_ms": (0.001, 10_000),
                        "first_append_last_over_first_tenth": (0.0001, 10_000),
                        "listing_us_per_partition": (0.1, 1e6), "fds": (500, 600), "maps": (10, 5000),
                        "rss_mb": (1, 1000), "remount_s": (0.01, 300), "fds_after_remount": (1, 100),
                        "second_append_ms": (0.001, 10_000)},
    # logfs and Kafka's broker on the same 8 MiB of 100-byte records (tools/bench_kafka.py).
    "kafka": {"records": (83_886, 83_886), "value_bytes": (100, 100), "append_per_s_logfs": (100, 1e8),
              "append_per_s_kafka": (100, 1e8), "append_per_s_kafka_defaults": (100, 1e8),
              "append_ratio": (0.001, 1000), "read_per_s_logfs": (100, 1e9), "read_per_s_kafka": (100, 1e9),
              "read_ratio": (0.001, 1000), "page_cache_dropped": bool},
    **{f"compression_{data}": {
        "mb": (4, 4.3), "segment_mb": (1, 1), "best_of": (1, 1), "corpus": str, "copies": (1, 1),
        "segments": (2, 10), "sealed_text_mb": (1, 4.3), "mb_plain": (1, 5), "mb_zstd": (0.01, 2),
        "mb_zstd3_1mib": (0.01, 2), "ratio_plain": (0.7, 1), "ratio_zstd": (2, 100), "ratio_zstd3_1mib": (2, 200),
        "at_rest_vs_zstd3": (0.8, 5), "at_rest_vs_plain": (0.01, 0.5), "target_at_rest_max": (1.15, 1.15),
        **{f"ratio_{codec}": (1.5, 100) for codec in ("lz4", "snappy", "gzip")},
        **{f"MBps_rewrite_engine_{codec}": (0.1, 1e5) for codec in ("zstd", "lz4", "snappy", "gzip")},
        "MBps_ingest_plain": (0.5, 1e5), "MBps_ingest_zstd": (0.5, 1e5), "ingest_ratio": (0.01, 100),
        "ingest_ratio_median": (0.01, 100), "target_ingest": (0.9, 0.9), "rewrite_during_ingest": bool,
        "s_until_compressed": (0.0001, 600), "MBps_rewrite_daemon": (0.01, 1e5),
        **{f"MBps_{kind}_{topic}": (0.5, 1e5) for kind in ("cold", "warm") for topic in ("plain", "zstd")},
        "cold_ratio": (0.01, 100), "warm_ratio": (0.01, 100), "target_cold": (0.9, 0.9), "page_cache_dropped": bool,
        "random_reads": (200, 200), **{f"p{q}_ms_{topic}": (0.001, 60_000) for q in (50, 99)
                                       for topic in ("plain", "zstd")},
        "p99_ratio": (0.001, 1000), "target_p99_max": (2, 2),
        "append_mb": (4, 4.3), "append_batches": (30, 200), "batch_kib": (16, 64), "MBps_append_engine": (0.5, 1e5),
        "ms_per_mib_compress_at_append": (0.01, 10_000), "ms_per_mib_append_engine": (0.01, 10_000),
        "MBps_append_with_compress": (0.5, 1e5), "append_kept_with_compress": (0.01, 1),
        "ratio_at_append_64k": (2, 100), "ratio_rewrite_256k": (2, 100), "ms_per_mib_rewrite_engine": (0.01, 10_000),
        "load_avg": str} for data in ("lines", "real")},
    **{f"compression_spark_{data}": {
        "records": (10_000, 100_000), **{f"s_count{kind}_{topic}": (0.01, 900) for kind in ("", "_cold")
                                          for topic in ("plain", "zstd")},
        "spark_local_ratio": (0.001, 1000), "spark_local_cold_ratio": (0.001, 1000),
        "target_spark_local": (0.8, 0.8), "best_of": (1, 1)} for data in ("lines", "real")},
    **{f"compression_bucket_{data}": {
        "records": (10_000, 100_000), "mb_bucket_plain": (1, 5), "mb_bucket_zstd": (0.01, 2),
        "s_count_plain": (0.01, 900), "s_count_zstd": (0.01, 900), "spark_bucket_ratio": (0.001, 1000),
        "target_spark_bucket": (1, 1), "best_of": (1, 1)} for data in ("lines", "real")},
}
# Reported as skipped (with the reason) where what they need is missing: pyspark, logfs/testing/seaweed.py, the corpus,
# Kafka's jars.
MAY_SKIP = {"spark", "spark_cluster", "kafka", *(name for name in RANGES if name.startswith("compression_"))}

SCENARIOS = {"bulk_append", "bulk_append_fsync", "sequential_read", "sequential_read_warm", "small_writes",
             "shell_appends", "read_at_offset", "mount_time", "memory", "responsiveness", "spark", "spark_sink", "metrics",
             "writer_headers", "tiered", "spark_cluster", "many_partitions", "spark_time", "kafka",
             *(name for name in RANGES if name.startswith("compression_"))}
SMALL_CASES = {(writers, length) for writers in (1, 4) for length in (25, 100, 1000)}
NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?(e[+-]?\d+)?$")


def numbers(value, where=""):
    """Every number in a JSON value, with where it is (booleans are flags, not figures)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from numbers(item, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def tables(text):
    """The markdown tables in ``text``: {header row: [data rows as lists of cells]}."""
    found, current = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if current is None:
            current = found.setdefault(tuple(cells), [])
        elif set(cells) != {"---"}:
            current.append(cells)
    return found


def run_quick(tmp_path):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench.py"), "--quick", "--json", str(out),
                           "--markdown", str(md), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900, env=daemon_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text()), md.read_text()


def printed_figures(stdout: str) -> dict[str, dict[str, str]]:
    """The table bench.py prints: one line per scenario, ``name  key=value  key=value ...``."""
    table = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(" ")
        if name in RANGES and rest.lstrip().startswith("skipped="):  # a reason, in words
            table[name] = {"skipped": rest.lstrip()[len("skipped="):]}
        elif name in RANGES:
            table[name] = dict(field.split("=", 1) for field in rest.split())
    return table


def check_figures(stdout: str, results: dict) -> None:
    table = printed_figures(stdout)
    assert set(RANGES) <= set(results) and set(table) == set(RANGES), (sorted(results), sorted(table))
    for name, expected in RANGES.items():
        if name in MAY_SKIP and "skipped" in results[name]:
            assert table[name] == {"skipped": results[name]["skipped"]}, (name, table[name])
            continue
        values, shown = results[name], table[name]
        assert set(values) == set(expected) == set(shown), (name, sorted(values), sorted(shown))
        for key, bounds in expected.items():
            value = values[key]
            if bounds is bool:  # a yes/no fact, printed as True/False
                assert isinstance(value, bool) and shown[key] == str(value), (name, key, value, shown[key])
                continue
            if bounds is str:  # a name, printed as it is
                assert isinstance(value, str) and value and shown[key] == value, (name, key, value, shown[key])
                continue
            lo, hi = bounds
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, key, value)
            assert math.isfinite(value) and lo <= value <= hi, f"{name}.{key} = {value}, expected [{lo}, {hi}]"
            # The printed figure is the reported one (4 significant digits for floats).
            assert math.isclose(float(shown[key]), value, rel_tol=1e-3), (name, key, shown[key], value)


def test_check_figures_refuses_missing_or_insane_figures():
    results = {name: {k: True if r is bool else "x" if r is str else r[0] for k, r in fields.items()}
               for name, fields in RANGES.items()}
    stdout = "\n".join(f"{name:16s} " + "  ".join(f"{k}={v}" for k, v in fields.items())
                       for name, fields in results.items())
    check_figures(stdout, results)
    bad = [("bulk_append", "MBps_logfs", float("nan")), ("mount_time", "clean_big_s", -1.0),
           ("responsiveness", "clean_s_process", -1.0), ("memory", "rss_mb_big", 5000.0),
           ("compression_lines", "at_rest_vs_plain", 2.0)]
    for name, key, value in bad:
        broken = {n: dict(v) for n, v in results.items()}
        broken[name][key] = value
        with pytest.raises(AssertionError):
            check_figures(stdout.replace(f"{key}={results[name][key]}", f"{key}={value}"), broken)
    with pytest.raises(AssertionError):  # a figure in the report but not printed
        check_figures(stdout.replace("  target_vs_nullfs=0.5", "", 1), results)
    with pytest.raises(AssertionError):  # a scenario that printed nothing
        check_figures("\n".join(line for line in stdout.splitlines() if not line.startswith("spark")), results)
    # A scenario part reported as skipped, with its reason in words, is accepted; its figures are not required.
    why = "no corpus at /nowhere/real.log (--corpus PATH): the bench's lines only"
    skipped = {**results, "compression_real": {"skipped": why}}
    lines = [f"compression_real skipped={why}" if line.startswith("compression_real ") else line
             for line in stdout.splitlines()]
    check_figures("\n".join(lines), skipped)
    with pytest.raises(AssertionError):  # but not a skip that printed something else
        check_figures("\n".join(lines).replace("the bench's lines only", "nothing"), skipped)


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_bench_quick(tmp_path):
    stdout, report, md = run_quick(tmp_path)
    results = report["results"]
    assert set(results) == SCENARIOS

    # JSON: every figure is a finite, positive number (ratios included: a zero or an infinity means a timing
    # or a division went wrong).
    figures = dict(numbers(results))
    assert len(figures) > 60
    for where, value in figures.items():
        assert math.isfinite(value) and value > 0, (where, value)
    for name in ("bulk_append", "bulk_append_fsync", "sequential_read", "sequential_read_warm"):
        for key in ("MBps_logfs", "MBps_nullfs", "MBps_ext4", "ratio_vs_nullfs", "ratio_vs_ext4", "mb"):
            assert key in results[name], (name, key)
        row = results[name]
        # The ratios are the MB/s figures divided, not something computed apart.
        assert row["ratio_vs_ext4"] == pytest.approx(row["MBps_logfs"] / row["MBps_ext4"])
        assert row["ratio_vs_nullfs"] == pytest.approx(row["MBps_logfs"] / row["MBps_nullfs"])
    assert results["sequential_read"]["page_cache_dropped"] is (os.geteuid() == 0)
    rows = results["small_writes"]["rows"]
    assert {(row["writers"], row["line_bytes"]) for row in rows} == SMALL_CASES and len(rows) == len(SMALL_CASES)
    for row in rows:
        assert row["ratio_vs_nullfs"] == pytest.approx(row["lines_per_s_logfs"] / row["lines_per_s_nullfs"])
        assert row["ratio_vs_ext4"] == pytest.approx(row["lines_per_s_logfs"] / row["lines_per_s_ext4"])
        # A record stores its line and a header: more .log bytes than text, but not wildly more.
        assert 1.0 < row["log_bytes_per_text_byte"] < 10, row
    assert 0 < results["memory"]["rss_mb_big"] < 1000
    assert results["spark"].get("records", 1) > 0
    for name in SCENARIOS - {"small_writes"}:
        assert re.search(rf"^{name} +\w+=", stdout, re.M), name
    assert len(re.findall(r"^small_writes +writers=", stdout, re.M)) == len(SMALL_CASES)

    # Markdown: printed and written alike; every expected row present; every numeric cell finite and positive.
    assert stdout.endswith(md)
    assert not re.search(r"\b(nan|inf)\b", md, re.I)
    found = tables(md)
    by_first = {header[0]: body for header, body in found.items()}
    assert [row[0] for row in by_first["sync"]] == ["none", "`fsync` of the descriptor before closing it"]
    assert [row[0].split(":")[0] for row in by_first["page cache"]] == ["cold", "warm"]
    assert {(int(row[0]), int(row[1])) for row in by_first["writers"]} == SMALL_CASES
    for header, body in found.items():
        for row in body:
            assert len(row) == len(header), (header, row)
            for cell in row:
                if NUMBER.match(cell):
                    value = float(cell.replace(",", ""))
                    assert math.isfinite(value) and value > 0, (header, row)
    for header in ("sync", "page cache", "writers"):
        for row in by_first[header]:
            assert sum(bool(NUMBER.match(cell)) for cell in row) >= 5, row

    # Every figure printed on a scenario line is the report's own value, within physical bounds.
    check_figures(stdout, results)

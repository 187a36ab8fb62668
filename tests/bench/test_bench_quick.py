"""tools/bench.py --quick runs end to end (so it never rots), and every figure it prints exists and is a sane
number: the printed table and the JSON report agree, every figure is finite and within physical bounds."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCENARIOS = {"bulk_append", "sequential_read", "shell_appends", "read_at_offset", "mount_time", "memory",
             "responsiveness", "spark"}
# Every figure each scenario must report, with its sane range (inclusive) for a --quick run on any machine
# that can run the suite. Wider than any real result; narrow enough that a unit slip (s for ms, bytes for MB),
# a zero or a negative duration, or a NaN fails.
RANGES = {
    "bulk_append": {"MBps_logfs": (0.5, 1e5), "MBps_nullfs": (0.5, 1e5), "MBps_ext4": (0.5, 1e6),
                    "ratio_vs_nullfs": (0.01, 100), "target": (0.5, 0.5), "best_of": (1, 1)},
    "sequential_read": {"MBps_logfs": (0.5, 1e5), "MBps_nullfs": (0.5, 1e5), "MBps_ext4": (0.5, 1e6),
                        "ratio_vs_nullfs": (0.01, 100), "target": (0.6, 0.6), "best_of": (1, 1),
                        "page_cache_dropped": bool},
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
                       "partition_mb": (24, 24), "target_max": (3, 3)},
    "spark": {"mb": (32, 32), "s_logfs": (0.01, 900), "s_ext4": (0.01, 900), "ratio_vs_ext4": (0.001, 1000),
              "records": (1, 10**9), "target": (0.8, 0.8)},
}


def printed_figures(stdout: str) -> dict[str, dict[str, str]]:
    """The table bench.py prints: one line per scenario, ``name  key=value  key=value ...``."""
    table = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(" ")
        if name in SCENARIOS:
            table[name] = dict(field.split("=", 1) for field in rest.split())
    return table


def check_figures(stdout: str, results: dict) -> None:
    table = printed_figures(stdout)
    assert set(results) == SCENARIOS and set(table) == SCENARIOS, (sorted(results), sorted(table))
    for name, expected in RANGES.items():
        if name == "spark" and "skipped" in results[name]:
            continue
        values, shown = results[name], table[name]
        assert set(values) == set(expected) == set(shown), (name, sorted(values), sorted(shown))
        for key, bounds in expected.items():
            value = values[key]
            if bounds is bool:  # a yes/no fact, printed as True/False
                assert isinstance(value, bool) and shown[key] == str(value), (name, key, value, shown[key])
                continue
            lo, hi = bounds
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, key, value)
            assert math.isfinite(value) and lo <= value <= hi, f"{name}.{key} = {value}, expected [{lo}, {hi}]"
            # The printed figure is the reported one (4 significant digits for floats).
            assert math.isclose(float(shown[key]), value, rel_tol=1e-3), (name, key, shown[key], value)


def test_check_figures_refuses_missing_or_insane_figures():
    results = {name: {k: True if r is bool else r[0] for k, r in fields.items()} for name, fields in RANGES.items()}
    stdout = "\n".join(f"{name:16s} " + "  ".join(f"{k}={v}" for k, v in fields.items())
                       for name, fields in results.items())
    check_figures(stdout, results)
    bad = [("bulk_append", "MBps_logfs", float("nan")), ("mount_time", "clean_big_s", -1.0),
           ("responsiveness", "clean_s_process", -1.0), ("memory", "rss_mb_big", 5000.0)]
    for name, key, value in bad:
        broken = {n: dict(v) for n, v in results.items()}
        broken[name][key] = value
        with pytest.raises(AssertionError):
            check_figures(stdout.replace(f"{key}={results[name][key]}", f"{key}={value}"), broken)
    with pytest.raises(AssertionError):  # a figure in the report but not printed
        check_figures(stdout.replace("  target=0.5", ""), results)
    with pytest.raises(AssertionError):  # a scenario that printed nothing
        check_figures("\n".join(line for line in stdout.splitlines() if not line.startswith("spark")), results)


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True
    check_figures(proc.stdout, report["results"])

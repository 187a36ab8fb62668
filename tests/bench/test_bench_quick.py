"""tools/bench.py --quick runs end to end (so it never rots) and reports every scenario with sane figures: every
number in its JSON and in the markdown tables it prints is finite and positive, and every table row is there."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")

SCENARIOS = {"bulk_append", "bulk_append_fsync", "sequential_read", "sequential_read_warm", "small_writes",
             "shell_appends", "read_at_offset", "mount_time", "memory", "responsiveness", "spark"}
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
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text()), md.read_text()


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

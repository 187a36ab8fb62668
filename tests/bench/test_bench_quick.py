"""tools/bench.py --quick runs end to end (so it never rots) and reports every scenario with sane figures."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    results = report["results"]
    assert set(results) == {"bulk_append", "sequential_read", "shell_appends", "read_at_offset", "mount_time",
                            "memory", "responsiveness", "spark"}
    assert results["bulk_append"]["MBps_logfs"] > 0 and results["bulk_append"]["ratio_vs_nullfs"] > 0
    assert results["sequential_read"]["MBps_logfs"] > 0
    assert results["read_at_offset"]["ms_big"] > 0
    assert 0 < results["memory"]["rss_mb_big"] < 1000
    assert results["responsiveness"]["clean_s_process"] > 0
    assert results["spark"].get("records", 1) > 0  # the cleaner really compacted the partition
    for line in ("bulk_append", "responsiveness"):
        assert line in proc.stdout

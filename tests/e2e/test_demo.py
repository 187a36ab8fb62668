"""tools/demo.py, the tour a new user runs (`bash tools/dev.sh demo`): every step runs and shows what it claims,
Spark included; it ends with the mount up, `--unmount` takes it down cleanly; a second run replaces the first;
what is missing is one clear line, never a traceback.

The demo is its own process (its own daemon, and its own JVM for the Spark steps), as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import daemon_env, daemon_pids, mounted_at

from logfs.testing.spark_standalone import spark_missing_reason

DEMO = Path(__file__).resolve().parents[2] / "tools" / "demo.py"


def run_demo(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEMO), *args], env=env or daemon_env(), capture_output=True,
                          text=True, timeout=timeout)


def steps_of(out: str) -> list[str]:
    return re.findall(r"^== \d+\. (.*)$", out, re.M)


def after(out: str, command_start: str, lines: int = 12) -> str:
    """The output printed after the first command line starting with ``$ command_start``."""
    i = out.index("$ " + command_start)
    return "\n".join(out[i:].splitlines()[1 : 1 + lines])


@pytest.fixture
def demo_dir(tmp_path):
    root = tmp_path / "demo"
    yield root
    run_demo("--unmount", "--dir", str(root), timeout=60)
    if mounted_at(root / "mnt"):
        subprocess.run(["fusermount3", "-uz", str(root / "mnt")], capture_output=True)


def test_the_demo_tours_the_mission_spark_included_and_stays_mounted(demo_dir):
    reason = spark_missing_reason()
    if reason:
        pytest.skip(f"the Spark steps cannot run here: {reason}")
    r = run_demo("--dir", str(demo_dir))
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in out + r.stderr and "Warning" not in r.stderr, r.stderr[-3000:]

    steps = steps_of(out)
    for word in ("Mount", "zstd", "Append", "tail -f", "xattrs", "Compression", "retention", "Tiered",
                 "Spark reads the mount", "`logfs` data source", "Metrics"):
        assert any(word in s for s in steps), (word, steps)

    assert "fuse.logfs" in after(out, "findmnt", 1)
    # Two writers at once: 2000 lines, 1000 of A, no torn line.
    assert after(out, "wc -l < demo/mnt/orders/1", 3).split() == ["2000", "1000", "0"]
    # tail -f showed the three lines appended while it ran.
    tail = after(out, "timeout", 8)
    for i, item in ((100, "gadget"), (101, "gizmo"), (102, "widget")):
        assert f'{{"id":{i},"item":"{item}"}}' in tail, tail
    assert after(out, "pos=$(getfattr", 3).splitlines()[1] == '{"id":42,"item":"widget"}'
    assert after(out, "off=$(getfattr", 2).splitlines() == ["100", '{"id":100,"item":"gadget"}']
    ratio = int(re.search(r"^ratio: (\d+)x$", out, re.M).group(1))
    assert ratio >= 3, ratio
    # Segments rolled at 1 KiB, then retention.bytes deleted the oldest: the file starts at the new log start.
    assert int(after(out, "for n in 1 2 3;", 3).split()[-2]) >= 5
    kept = after(out, "getfattr -d -m '^user.logfs.(log_start_offset|segment_count)$'", 6)
    start = int(re.search(r'^user\.logfs\.log_start_offset="(\d+)"$', kept, re.M).group(1))
    assert start > 0 and f"click {start + 1}" in kept, kept
    tiered = after(out, "getfattr -d -m 'log_start_offset|remote_log_end_offset", 7)
    assert int(re.search(r'local_log_start_offset="(\d+)"', tiered).group(1)) > 0, tiered
    assert after(out, "wc -l < demo/mnt/events/0", 2).splitlines() == ["2000", "event 1"]

    # Spark: the mount's files and the logfs source agree with the shell's count.
    assert after(out, "cat demo/mnt/orders/* | wc -l", 1).strip() == "2103"
    assert re.search(r'^>>> spark\.read\.text\(.*\)\.count\(\)\n2103$', out, re.M), out
    assert re.search(r"\|\s*gadget\|\s*701\|", out) and re.search(r"\|\s*widget\|\s*701\|", out)
    assert re.search(r"\|\s*0\|\s*103\|\s*0\|\s*102\|", out) and re.search(r"\|\s*1\|\s*2000\|\s*0\|\s*1999\|", out)
    assert re.search(r'\|102\s*\|[^|]*\|\{"id":102,"item":"widget"\}\|', out), out

    metrics = out.split("logfs.prom")[-1]
    for name in ("logfs_topics 4", 'logfs_partition_log_end_offset{topic="orders",partition="1"} 2000',
                 "logfs_compression_segments_total", "logfs_retention_deleted_segments_total",
                 'logfs_partition_remote_size_bytes{topic="events",partition="0"}'):
        assert name in metrics, (name, metrics)

    # It ends with the mount up and the line that takes it down.
    assert mounted_at(demo_dir / "mnt")
    assert f"Take it down with: fusermount3 -u {demo_dir / 'mnt'}" in out

    # A second run replaces the first (its mount taken down first); without Java it says so in one line and
    # skips the Spark steps.
    second = run_demo("--dir", str(demo_dir), env=daemon_env(JAVA_HOME=str(demo_dir / "no-java")))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Traceback" not in second.stdout + second.stderr
    assert f"JAVA_HOME={demo_dir / 'no-java'} has no bin/java" in second.stdout
    assert after(second.stdout, "wc -l < demo/mnt/orders/1", 1).strip() == "2000"  # a fresh store
    assert mounted_at(demo_dir / "mnt")

    down = run_demo("--unmount", "--dir", str(demo_dir), timeout=60)
    assert down.returncode == 0 and "clean shutdown" in down.stdout, down.stdout + down.stderr
    assert not mounted_at(demo_dir / "mnt") and not daemon_pids(demo_dir / "data")
    assert (demo_dir / "data" / ".kafka_cleanshutdown").exists()


def test_a_missing_tool_is_one_clear_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_demo("--dir", str(tmp_path / "demo"), env=daemon_env(PATH=str(empty)), timeout=60)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "demo: `fusermount3` is not installed (Debian package fuse3" in r.stderr, r.stderr
    assert "demo: `getfattr` is not installed (Debian package attr" in r.stderr, r.stderr
    assert not (tmp_path / "demo").exists()

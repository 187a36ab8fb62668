"""``logfs-dump-log-segments`` reports damaged indexes as Kafka's DumpLogSegments does, line for line, with many
files in error at once: Kafka prints its per-file errors in the iteration order of the Scala hash maps it collects
them in (not the order of the files), which logfs's tool reproduces (logfs.tools.dump.ScalaHashMap). 40 partitions:
past the maps' first two table sizes (16 and 32 slots: they grow at 12 and 24 files)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from logfs.storage import LogConfig, ManualClock, load_log

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


def damaged_partitions(root: Path, n: int) -> list[str]:
    """``n`` partitions of 10 one-record batches each (an index entry per batch), each with its index entries
    damaged in one of four ways: a wrong offset, a wrong timestamp, timestamps out of order, an offset that is no
    batch's last. Returns their .index and .timeindex files."""
    files = []
    for i in range(n):
        directory = root / f"part{i}-0"
        log = load_log(str(directory), f"part{i}", 0, LogConfig.for_tests(index_interval_bytes=1),
                       clock=ManualClock(T0))
        for j in range(10):
            log.append([b"record %d of %d" % (j, i)], timestamp_ms=T0 + j)
        log.roll()
        log.close()
        index, timeindex = directory / f"{0:020d}.index", directory / f"{0:020d}.timeindex"
        kind = i % 4
        with open(index if kind == 0 else timeindex, "r+b") as f:
            if kind == 0:
                f.seek(8 * (1 + i % 5))
                f.write(struct.pack(">i", 7))  # names offset 7 at a batch holding another
            elif kind == 1:
                f.seek(12 * (i % 5))
                f.write(struct.pack(">q", T0 - i))  # a timestamp the batch does not hold
            elif kind == 2:
                f.seek(12 * 3)
                f.write(struct.pack(">q", T0 + 1))  # goes back in time
            else:
                f.seek(12 * 2 + 8)
                f.write(struct.pack(">i", 100 + i))  # past every batch
        files += [str(index), str(timeindex)]
    return files


def test_damaged_indexes_are_reported_in_kafkas_order(tmp_path, kafka_dump):
    files = damaged_partitions(tmp_path, 40)
    kafka = kafka_dump.run(files)  # every entry printed, then the errors
    assert kafka.error is None and kafka.status == 0
    r = subprocess.run([sys.executable, "-m", "logfs.tools.dump", "--files", ",".join(files)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == kafka.stdout.splitlines()
    assert r.stderr.splitlines() == kafka.stderr.splitlines()
    # Every kind of error, from many files, and not in the order of the files.
    for section in ("index_mismatches", "time_mismatches", "out_of_order", "not_found"):
        assert len(kafka.reported[section]) > 10, section
    named = [line.split(":", 1)[1] for line in kafka.reported["index_mismatches"] if line.startswith("Mis")]
    assert len(named) == 10 and named != sorted(named, key=files.index)

"""The sink's exactly once, with Spark's own failures, in driver processes of their own (tests/spark/sink_driver.py):

- a batch write of 1 M rows whose tasks' first attempts fail half way through (``local[2,3]``: retried) appends
  each row once (kafka-python reads the segments);
- a streaming query from a logfs topic into another, its driver killed with -9 (2 times; 10 with LOGFS_LONG=1),
  at random moments and right after the daemon committed a micro-batch (Spark then replays a micro-batch the
  daemon applied), and restarted from its checkpoint, appends every input record once, in order per key, and a
  reader following an output partition through the mount (as ``tail -f``) only ever sees whole micro-batches.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
from kafka.record.memory_records import MemoryRecords

from logfs.spark.sink_rows import murmur2

pytestmark = pytest.mark.mount

DRIVER = Path(__file__).resolve().parent / "sink_driver.py"
CODE_ROOT = str(Path(__file__).resolve().parents[2])
LONG = os.environ.get("LOGFS_LONG") == "1"


def driver(*args: str, env: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=CODE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYSPARK_PYTHON=sys.executable, **(env or {}))
    return subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True, text=True)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group: the Python driver and its JVM (as a crash of its host)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()))
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        kill(proc)
        raise AssertionError(f"the driver said nothing for {timeout} s")
    return result[0]


def batches_of(data_dir, topic: str, partition: int) -> list:
    """kafka-python's batches of one partition, CRC-checked: [(producer id, [(key, value), ...])]."""
    out = []
    for path in sorted(glob.glob(os.path.join(str(data_dir), f"{topic}-{partition}", "*.log"))):
        records = MemoryRecords(open(path, "rb").read())
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc()
            out.append((batch.producer_id, [(r.key, r.value) for r in batch]))
    return out


def test_a_batch_write_whose_first_attempts_fail_appends_each_row_once(mount_logfs, tmp_path):
    fs = mount_logfs("num.partitions=4")
    os.mkdir(fs.path("out"))
    markers = tmp_path / "markers"
    markers.mkdir()
    rows = 200_000  # (per task ~33,000: the first attempts fail after ~16,000 of theirs)
    proc = driver("batch", str(fs.mnt), "out", str(rows), str(markers))
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        kill(proc)
    assert proc.returncode == 0, out
    assert sorted(os.listdir(markers)) == ["failed-0", "failed-3"]  # first attempts failed, and were retried
    seen = collections.Counter()
    for p in range(4):
        batches = batches_of(fs.data, "out", p)
        assert len({pid for pid, _ in batches}) == 1  # one commit
        for _, records in batches:
            for key, value in records:
                assert key == b"k%d" % (int(value) % 1000)
                assert (murmur2(key) & 0x7FFFFFFF) % 4 == p
                seen[int(value)] += 1
    assert len(seen) == rows and set(seen.values()) == {1} and min(seen) == 0 and max(seen) == rows - 1
    assert os.listdir(fs.path(".logfs-staging")) == []


class Tail:
    """Follows one partition file through the mount as ``tail -f`` does (read to the end, wait, read on), and notes
    how many whole lines it had seen at every end it reached."""

    def __init__(self, path: str):
        self.path = path
        self.ends: set[int] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        try:
            lines = 0
            with open(self.path, "rb", buffering=0) as f:
                while not self.stop.is_set():
                    data = f.read(1 << 20)
                    if data:
                        lines += data.count(b"\n")
                        continue
                    self.ends.add(lines)
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc

    def close(self) -> set[int]:
        self.stop.set()
        self.thread.join(30)
        assert self.error is None, self.error
        return self.ends


def test_a_stream_whose_driver_is_killed_appends_every_record_once(mount_logfs, tmp_path):
    fs = mount_logfs("num.partitions=3", foreground=True)  # (its log: the replays it recognised)
    killed_stream(fs, tmp_path, 10 if LONG else 2)  # (one of each kind of kill)


def killed_stream(fs, tmp_path, kills: int, env: dict | None = None, check_staged=lambda: None) -> None:
    """A stream from topic ``in`` into topic ``out`` of ``fs`` (mounted in the foreground: its log tells when a
    commit was applied), its driver (sink_driver.py, ``env`` added to its environment) killed with -9 ``kills``
    times and restarted from its checkpoint, then run to the end; checks every record once, in order per key,
    whole micro-batches for the partition readers, and nothing left staged (also ``check_staged()``)."""
    os.mkdir(fs.path("in"))
    os.setxattr(fs.path("in"), "user.logfs.config.logfs.key.separator", b"\t")
    os.mkdir(fs.path("out"))
    keys, per_key = 50, 300
    records = [(f"key{k}", f"key{k}:{seq}") for seq in range(per_key) for k in range(keys)]
    by_partition = collections.defaultdict(list)
    for key, value in records:
        by_partition[zlib.crc32(key.encode()) % 3].append(f"{key}\t{value}\n")
    for p, lines in by_partition.items():
        for start in range(0, len(lines), 2000):
            fs.append(f"in/{p}", "".join(lines[start:start + 2000]))
    tails = [Tail(fs.path(f"out/{p}")) for p in range(3)]
    checkpoint = str(tmp_path / "checkpoint")
    args = ["stream", str(fs.data), str(fs.mnt), "in", "out", checkpoint, "3000"]  # ~5 micro-batches in all
    rng = random.Random(int(time.time()))
    try:
        committed = []  # micro-batches each killed run reported done
        for i in range(kills):
            proc = driver(*args, env=env)
            try:
                assert read_line(proc, 180).strip() == "ready"
                assert read_line(proc, 180).strip() == "started"
                first = read_line(proc, 180)
                if i % 2:
                    # Killed at a random moment once the stream runs: during a micro-batch's tasks, its commit, or
                    # the checkpoint writes between them.
                    time.sleep(rng.uniform(0.0, 3.0))
                else:
                    # Killed as soon as the daemon has committed a micro-batch: most likely before Spark has
                    # recorded it in its checkpoint, so the restarted query replays it.
                    seen = fs.stderr().count("committed q-")
                    deadline = time.monotonic() + 60
                    while fs.stderr().count("committed q-") == seen and time.monotonic() < deadline:
                        time.sleep(0.001)
            finally:
                kill(proc)
            committed.append(1 + sum(1 for line in proc.stdout.read().splitlines() if line.startswith("{")))
            assert first.startswith('{"batch"')
        proc = driver(*args, env=env)
        try:
            out, _ = proc.communicate(timeout=600)
        finally:
            kill(proc)
        assert proc.returncode == 0, out
        assert json.loads(out.strip().splitlines()[-1])["batches"] >= 1
        print("micro-batches reported by each killed run:", committed, "; micro-batches the daemon recognised as "
              "replays of committed ones:", fs.stderr().count("was applied before: nothing appended again"))
    finally:
        ends = [t.close() for t in tails]
    seen = collections.Counter()
    for p in range(3):
        batches = batches_of(fs.data, "out", p)
        # Each micro-batch's records are contiguous in the partition: its batches form one run of its producer id.
        runs = [pid for i, (pid, _) in enumerate(batches) if i == 0 or batches[i - 1][0] != pid]
        assert len(runs) == len(set(runs))
        boundaries, total = {0}, 0
        last_seq: dict[bytes, int] = {}
        for i, (pid, rs) in enumerate(batches):
            total += len(rs)
            if i + 1 == len(batches) or batches[i + 1][0] != pid:
                boundaries.add(total)
            for key, value in rs:
                assert (murmur2(key) & 0x7FFFFFFF) % 3 == p
                seq = int(value.split(b":")[1])
                assert seq > last_seq.get(key, -1)  # in order per key
                last_seq[key] = seq
                seen[value] += 1
        # The reader following the file saw whole micro-batches only.
        assert ends[p] <= boundaries, sorted(ends[p] - boundaries)[:5]
    assert set(seen) == {v.encode() for _, v in records} and set(seen.values()) == {1}
    assert os.listdir(fs.path(".logfs-staging")) == []
    check_staged()

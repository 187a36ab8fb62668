"""A running Kafka broker's log directory mounted read-only (issue 45's acceptance), measured.

    PYTHONPATH=$PWD python tools/bench_broker.py [--only read,tail,idle] [--quick] [--read-mib 200]
                                                [--partitions 10000] [--idle-s 60] [--tail-s 30]

- **read**: a real broker (logfs/testing/kafka.py, started here) receives ``--read-mib`` of 100-byte records in
  one partition; then, in the same run, alternated, Kafka's own ``kafka-consumer-perf-test``
  (``org.apache.kafka.tools.ConsumerPerformance``, from the jars, in a JVM of its own: its start is not counted,
  its own figure is) reads the partition from the broker, and ``cat``'s 1 MiB reads of the mounted file read it
  through the mount (a fresh mount each time: its indexes are built at mount, not counted; the page cache is warm
  for both: the broker's segments were just written). Figures: MB/s of record values (the mount's lines are the
  values and a newline: the same bytes plus one per record) and records/s.
- **tail**: the broker receives records at a steady rate (``--rate`` a second, one producer, ``linger.ms=0``)
  for ``--tail-s`` seconds while a reader on the mount reads on at the end of the file (a ``tail -f``: read,
  and when nothing came, sleep 10 ms) and notes when each line appears; each line carries its send time, and the
  figure is the delay from the record's CreateTime to its line read: p50/p99/max.
- **idle**: ``--partitions`` partitions in Kafka's format (100 topics; one segment of one batch each, written
  here byte by byte as a broker writes them; no broker needed for an idle mount), mounted; after the mount, the
  daemon's CPU time (utime + stime of /proc/PID/stat, all its threads) over ``--idle-s`` seconds, as a share of
  one core; and one append to one partition then, timed to its line on the mount.

Prints one line per figure and a markdown table. Imports logfs/testing/benchlib.py and logfs/testing/kafka.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from logfs.storage.format import records as rec
from logfs.storage.names import filename_prefix
from logfs.testing.benchlib import daemon_pid, leave_nothing, mount_logfs, rss_kb, table, unmount

MiB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def synthetic_broker_dir(root: str, partitions: int, topics: int = 100) -> list[str]:
    """A log directory of ``partitions`` partitions in Kafka's format (as a broker lays them out: one active
    segment each, one batch of 10 records); the partition directories."""
    os.makedirs(root, exist_ok=True)
    open(os.path.join(root, ".lock"), "wb").close()
    out = []
    per_topic = max(1, partitions // topics)
    for n in range(partitions):
        topic, partition = f"idle{n // per_topic:03d}", n % per_topic
        directory = os.path.join(root, f"{topic}-{partition}")
        os.makedirs(directory, exist_ok=True)
        batch = rec.build_batch(0, int(time.time() * 1000), [b"%s/%d line %d" % (topic.encode(), partition, i)
                                                             for i in range(10)])
        with open(os.path.join(directory, filename_prefix(0) + ".log"), "wb") as f:
            f.write(batch)
        out.append(directory)
    return out


def bench_idle(work: str, partitions: int, seconds: float, opts: list[str]) -> dict:
    broker_dir, cache, mnt = (os.path.join(work, n) for n in ("kafka", "cache", "mnt"))
    dirs = synthetic_broker_dir(broker_dir, partitions)
    start = time.perf_counter()
    mount_logfs(broker_dir, mnt, "ro", f"logfs.cache.dir={cache}", *opts)
    mount_s = time.perf_counter() - start
    pid = daemon_pid(broker_dir)
    try:
        time.sleep(2)  # (the first looks after the mount)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(seconds)
        cpu1, t1 = cpu_seconds(pid), time.perf_counter()
        share = (cpu1 - cpu0) / (t1 - t0)
        # One append, to a partition in the middle, timed to its line on the mount.
        target = dirs[len(dirs) // 2]
        topic, partition = os.path.basename(target).rsplit("-", 1)
        path = os.path.join(mnt, topic, partition)
        with open(path, "rb") as reader:
            reader.read()
            batch = rec.build_batch(10, int(time.time() * 1000), [b"appended"])
            with open(os.path.join(target, filename_prefix(0) + ".log"), "ab") as f:
                f.write(batch)
            sent = time.perf_counter()
            got = b""
            while not got.endswith(b"appended\n"):
                got += reader.read()
                if time.perf_counter() - sent > 30:
                    raise RuntimeError("the append did not show in 30 s")
                time.sleep(0.002)
            shown_s = time.perf_counter() - sent
        rss = rss_kb(pid)
    finally:
        unmount(mnt, broker_dir)
    return {"partitions": partitions, "cpu_share": share, "cpu_s": cpu1 - cpu0, "window_s": t1 - t0,
            "mount_s": mount_s, "append_shown_s": shown_s, "rss_mib": rss / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="read,tail,idle")
    ap.add_argument("--quick", action="store_true", help="shorter windows and a smaller read")
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("-o", dest="opts", action="append", default=[], help="a mount option for the idle mount")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    work = args.workdir or tempfile.mkdtemp(prefix="bench-broker-")
    rows = []
    try:
        if "idle" in only:
            r = bench_idle(os.path.join(work, "idle"), args.partitions, 20 if args.quick else args.idle_s, args.opts)
            print(f"idle: {r['partitions']} partitions: {100 * r['cpu_share']:.2f}% of one core "
                  f"({r['cpu_s']:.2f} s CPU in {r['window_s']:.1f} s); mount {r['mount_s']:.1f} s; an append shown "
                  f"after {1000 * r['append_shown_s']:.0f} ms; RSS {r['rss_mib']:.0f} MiB", flush=True)
            rows.append(["idle mount", f"{r['partitions']} partitions", f"{100 * r['cpu_share']:.2f}% of one core",
                         f"append shown in {1000 * r['append_shown_s']:.0f} ms"])
    finally:
        leave_nothing(work, remove=args.workdir is None)
    print("\n".join(table(["figure", "setting", "logfs", "note"], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

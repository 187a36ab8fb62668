#!/usr/bin/env python3
"""logfs benchmarks, side by side with the two references that bound it, in the same run:

- ext4: the same operations on plain files in a directory on the same disk;
- nullfs (logfs/testing/nullfs.py): a do-nothing pyfuse3 filesystem, the ceiling for any Python FUSE filesystem here;
- the raw store: SeaweedFS's own GETs of the objects tiered reads fetch (scenario tiered);
- Apache Kafka: a broker given the same records, with its own producer and consumer performance tools (scenario
  kafka, tools/bench_kafka.py; the kafka:// mount and a broker's directory have benchmarks of their own,
  tools/bench_kafka_store.py and tools/bench_broker.py).

Ratios within one run matter, not absolute figures (shared 2-core machines).

    python tools/bench.py [--quick] [--json FILE] [--markdown FILE] [--workdir DIR] [--only NAME[,NAME...]]
                          [--rounds N]

Prints one line per figure as it goes, then markdown tables to paste into docs/benchmarks.md (also written to
--markdown FILE). Ratios are logfs's throughput over the reference's.

Scenarios: bulk_append (no sync) and bulk_append_fsync; sequential_read (page cache dropped) and
sequential_read_warm; small_writes (one line per write(), 1 and 4 writers, 25/100/1000-byte lines);
shell_appends, read_at_offset, mount_time, memory, responsiveness, spark, spark_sink (the logfs sink against
df.write.json to a local directory, rows/s; the publish alone against cp + fsync), metrics (tools/bench_options.py:
small writes with the metrics file off and on), writer_headers (the same with logfs.writer.headers off and on), tiered
(tools/bench_tiered.py: append p99 with the store up/down/slow; tiered reads at 1 MiB and 8 KiB, cold/warm,
against the store's own GETs; random reads' GETs; the cache bound; starts its own SeaweedFS), spark_cluster
(tools/bench_cluster.py: the Spark source on a 2-worker standalone cluster, count and groupBy of a tiered log from
the bucket against the same offsets from the local DATA_DIR), many_partitions (tools/bench_scale.py at 20,000
partitions: mkdir, first append, listing, descriptors, maps, remount; 500 with --quick), kafka (appends and a cold
sequential read of 100-byte records against Kafka's kafka-producer-perf-test and kafka-consumer-perf-test on a
broker started for it; needs the set-up's Kafka jars, else skipped). Naming any of a group in
--only runs the whole group.

The issue-15 write-path figures alone (bulk append, sequential read, small writes), best of 3, ~4 minutes:

    python tools/bench.py --only bulk_append,small_writes --json out.json --markdown out.md

Scenario compression (tools/bench_compression.py, issue 22): a zstd topic against an uncompressed one, on the
bench's lines and on a real log corpus (--corpus PATH, default /tmp/codecs-corpus/real.log when it exists): bytes at
rest, ingest, sequential and random reads, the Spark count from DATA_DIR and from the bucket, and compressing at
append instead, measured at the engine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_markdown import markdown
from logfs.testing.benchlib import (NullFS, append_file, daemon_pid, drop_caches, getx, kill9, leave_nothing,
                                   line_writers, machine, make_lines, mount_logfs, mounted_at, read_file, rss_kb,
                                   timed_shell, unmount, write_report)


# -- scenarios ----------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, workdir: str, quick: bool, rounds: int | None = None, corpus: str | None = None):
        self.work = workdir
        self.quick = quick
        self.corpus = corpus  # the compression scenario's real log corpus (None: its default)
        self.results: dict[str, dict] = {}
        self.size = (32 << 20) if quick else (1 << 30)
        # The write-path scenarios (bulk append, sequential read, small writes) are tiny with --quick: seconds.
        self.bulk_size = (4 << 20) if quick else self.size
        self.small_lines = 400 if quick else 30000  # per case, split between the writers
        self.rounds = rounds or (1 if quick else 3)
        self._lines: str | None = None

    @property
    def lines(self) -> str:
        """~100-byte JSON lines, ``size`` bytes; made on first use (small writes do not need them)."""
        if self._lines is None:
            self._lines = os.path.join(self.work, "lines.json")
            make_lines(self._lines, self.size)
        return self._lines

    def dirs(self, name: str) -> tuple[str, str]:
        data, mnt = os.path.join(self.work, name, "data"), os.path.join(self.work, name, "mnt")
        shutil.rmtree(os.path.join(self.work, name), ignore_errors=True)
        os.makedirs(mnt)
        return data, mnt

    def record(self, name: str, **values):
        self.results[name] = values
        print(f"{name:16s} " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in values.items()), flush=True)

    def bulk_append_and_sequential_read(self):
        """Bulk append (``cat FILE >> partition``) without sync, and with an fsync of the written descriptor before
        it is closed; then sequential read (``cat partition > /dev/null``) with cold and with warm caches.

        Like for like: every system gets the same data, the same client (``cat`` writing to, or reading from, a
        descriptor opened the same way) and the same sync. ``os.sync()`` runs (untimed) before every timed step,
        so no system pays for another's writeback. Best of ``rounds`` per figure; in each round logfs, nullfs
        and ext4 are measured in turn, so a busy moment on a shared machine does not land on one system only."""
        src = self.bulk_lines()
        size = os.path.getsize(src)
        mb = size / 1e6
        rounds = self.rounds
        best: dict[str, float] = {}

        def keep(name: str, seconds: float) -> None:
            best[name] = min(seconds, best.get(name, float("inf")))

        dropped = True
        for round_ in range(rounds):
            data, mnt = self.dirs(f"bulk{round_}")
            ext4_dir = os.path.join(self.work, f"bulk{round_}", "ext4")
            os.makedirs(ext4_dir)
            mount_logfs(data, mnt, "log.segment.bytes=268435456")
            null = NullFS(os.path.join(self.work, f"bulk{round_}", "nullmnt"), size)
            try:
                for mode in ("nosync", "fsync"):
                    os.mkdir(f"{mnt}/{mode}")
                    targets = {"logfs": f"{mnt}/{mode}/0", "null": f"{null.mnt}/f", "ext4": f"{ext4_dir}/{mode}"}
                    for system, path in targets.items():
                        os.sync()
                        keep(f"append_{mode}_{system}", append_file(src, path, fsync=mode == "fsync"))
                    assert os.stat(targets["logfs"]).st_size == size
                    assert os.stat(targets["ext4"]).st_size == size
                    if mode == "nosync":
                        os.unlink(targets["ext4"])
                # Reads: logfs on a new mount, so its own caches start cold too. "cold": the page cache is
                # dropped before the read, on every side; "warm": the same file read again at once.
                unmount(mnt, data)
                mount_logfs(data, mnt)
                sources = {"logfs": f"{mnt}/fsync/0", "null": f"{null.mnt}/f", "ext4": f"{ext4_dir}/fsync"}
                for system, path in sources.items():
                    dropped = drop_caches() and dropped
                    keep(f"read_cold_{system}", read_file(path, size))
                    keep(f"read_warm_{system}", read_file(path, size))
            finally:
                null.close()
                if mounted_at(mnt):
                    unmount(mnt, data)
                shutil.rmtree(os.path.join(self.work, f"bulk{round_}"), ignore_errors=True)

        def figures(kind: str) -> dict:
            logfs, null, ext4 = (best[f"{kind}_{s}"] for s in ("logfs", "null", "ext4"))
            return {"MBps_logfs": mb / logfs, "MBps_nullfs": mb / null, "MBps_ext4": mb / ext4,
                    "ratio_vs_nullfs": null / logfs, "ratio_vs_ext4": ext4 / logfs}

        common = {"mb": round(mb, 1), "best_of": rounds}
        self.record("bulk_append", **figures("append_nosync"), target_vs_nullfs=0.5, target_vs_ext4=0.35, **common)
        self.record("bulk_append_fsync", **figures("append_fsync"), target_vs_ext4=0.8, **common)
        self.record("sequential_read", **figures("read_cold"), target_vs_nullfs=0.6, page_cache_dropped=dropped,
                    **common)
        self.record("sequential_read_warm", **figures("read_warm"), **common)

    def bulk_lines(self) -> str:
        """The bulk scenarios' input: the first ``bulk_size`` bytes of the lines file, cut at a line end."""
        if self.bulk_size >= self.size_of_lines():
            return self.lines
        path = os.path.join(self.work, "bulk.json")
        if not os.path.exists(path):
            with open(self.lines, "rb") as f:
                head = f.read(self.bulk_size)
            with open(path, "wb") as f:
                f.write(head[: head.rindex(b"\n") + 1])
        return path

    def small_writes(self):
        """One line per ``write()`` on an ``O_APPEND`` descriptor, as ``echo``, ``logger``, ``logging.FileHandler``
        and ``tee -a`` do: 1 and 4 writer processes appending to the same file, 25-, 100- and 1000-byte lines.
        Aggregate lines/s for logfs, nullfs and ext4 measured in turn (both FUSE mounts stay up, idle while the
        others run), best of ``rounds``. For logfs also the bytes of ``.log`` on disk per byte of text, after a
        clean unmount (the worst round)."""
        rounds = self.rounds
        total = self.small_lines
        cases = [(writers, length) for writers in (1, 4) for length in (25, 100, 1000)]
        best: dict[tuple, float] = {}
        disk: dict[tuple, float] = {}
        for round_ in range(rounds):
            data, mnt = self.dirs(f"small{round_}")
            ext4_dir = os.path.join(self.work, f"small{round_}", "ext4")
            os.makedirs(ext4_dir)
            mount_logfs(data, mnt)
            null = NullFS(os.path.join(self.work, f"small{round_}", "nullmnt"), 1 << 20)
            try:
                for writers, length in cases:
                    topic = f"w{writers}_l{length}"
                    os.mkdir(f"{mnt}/{topic}")
                    targets = {"logfs": f"{mnt}/{topic}/0", "null": f"{null.mnt}/f", "ext4": f"{ext4_dir}/{topic}"}
                    for system, path in targets.items():
                        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
                        os.sync()
                        rate = total / line_writers(path, writers, total // writers, length)
                        best[(writers, length, system)] = max(rate, best.get((writers, length, system), 0.0))
                    assert int(getx(targets["logfs"], "log_end_offset")) == total
                    assert os.stat(targets["ext4"]).st_size == total * length
            finally:
                null.close()
                unmount(mnt, data)
            for writers, length in cases:
                part = os.path.join(data, f"w{writers}_l{length}-0")
                on_disk = sum(os.path.getsize(os.path.join(part, name)) for name in os.listdir(part)
                              if name.endswith(".log"))
                ratio = on_disk / (total * length)
                disk[(writers, length)] = max(ratio, disk.get((writers, length), 0.0))
            shutil.rmtree(os.path.join(self.work, f"small{round_}"), ignore_errors=True)
        rows = []
        for writers, length in cases:
            logfs, null, ext4 = (best[(writers, length, s)] for s in ("logfs", "null", "ext4"))
            rows.append({"writers": writers, "line_bytes": length, "lines": total, "lines_per_s_logfs": logfs,
                         "lines_per_s_nullfs": null, "lines_per_s_ext4": ext4, "ratio_vs_nullfs": logfs / null,
                         "ratio_vs_ext4": logfs / ext4, "log_bytes_per_text_byte": disk[(writers, length)],
                         "target_vs_nullfs": 0.85, "target_max_log_bytes_per_text_byte": 1.5 if length <= 25 else 1.15})
        self.results["small_writes"] = {"best_of": rounds, "rows": rows}
        for row in rows:
            print(f"small_writes     " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in row.items()), flush=True)

    def size_of_lines(self) -> int:
        return os.path.getsize(self.lines)

    def shell_appends(self):
        n = 500 if self.quick else 10000
        data, mnt = self.dirs("shell")
        mount_logfs(data, mnt)
        os.mkdir(f"{mnt}/t")
        loop = 'for i in $(seq {n}); do /bin/echo "{{\\"n\\":$i}}" >> {f}; done'
        t_logfs = timed_shell(loop.format(n=n, f=f"{mnt}/t/0"))
        assert getx(f"{mnt}/t/0", "log_end_offset") == str(n)
        unmount(mnt, data)
        ext4 = os.path.join(self.work, "shell.ext4")
        t_ext4 = timed_shell(loop.format(n=n, f=ext4))
        os.unlink(ext4)
        self.record("shell_appends", n=n, per_s_logfs=n / t_logfs, per_s_ext4=n / t_ext4,
                    ratio_vs_ext4=t_ext4 / t_logfs, target=0.7)

    def read_at_offset(self):
        small, big = ((1 << 20), (64 << 20)) if self.quick else ((10 << 20), (2 << 30))
        timings = {}
        for label, size in (("small", small), ("big", big)):
            data, mnt = self.dirs(f"offset-{label}")
            mount_logfs(data, mnt)
            os.mkdir(f"{mnt}/t")
            reps = max(1, size // self.size_of_lines())
            remainder = size - reps * self.size_of_lines()
            script = f"for i in $(seq {reps}); do cat {self.lines}; done >> {mnt}/t/0" if size >= self.size_of_lines() \
                else f"head -c {size} {self.lines} | head -n -1 >> {mnt}/t/0"
            timed_shell(script)
            if remainder > 0 and size >= self.size_of_lines():
                timed_shell(f"head -c {remainder} {self.lines} | head -n -1 >> {mnt}/t/0")
            unmount(mnt, data)
            mount_logfs(data, mnt)  # cold logfs caches
            path = f"{mnt}/t/0"
            end = int(getx(path, "log_end_offset"))
            samples = []
            for k in range(20):
                offset = (end // 21) * (k + 1)
                start = time.perf_counter()
                with open(path, "rb", buffering=0) as f:  # open, ask the descriptor, seek, read: race-free
                    f.seek(int(getx(f.fileno(), f"position.{offset}")))
                    first = f.read(4096).split(b"\n", 1)[0]
                samples.append(time.perf_counter() - start)
                assert first.startswith(b'{"id":')
            timings[label] = statistics.median(samples)
            unmount(mnt, data)
            shutil.rmtree(os.path.join(self.work, f"offset-{label}"))
        self.record("read_at_offset", ms_small=timings["small"] * 1000, ms_big=timings["big"] * 1000,
                    big_over_small=timings["big"] / timings["small"], target_max=2.0,
                    small_mb=small >> 20, big_mb=big >> 20)

    def fill_store(self, data: str, mnt: str, total: int, partitions: int) -> None:
        os.mkdir(f"{mnt}/t")
        for p in range(1, partitions):
            open(f"{mnt}/t/{p}", "a").close()
        per = total // partitions
        reps = max(1, per // self.size_of_lines())
        for p in range(partitions):
            if per >= self.size_of_lines():
                timed_shell(f"for i in $(seq {reps}); do cat {self.lines}; done >> {mnt}/t/{p}")
            else:
                timed_shell(f"head -c {per} {self.lines} | head -n -1 >> {mnt}/t/{p}")

    def mount_time_and_memory(self):
        small, big = ((8 << 20), (128 << 20)) if self.quick else ((100 << 20), (5 << 30))
        parts = 10 if self.quick else 50
        out = {}
        for label, size in (("small", small), ("big", big)):
            data, mnt = self.dirs(f"store-{label}")
            mount_logfs(data, mnt, "log.segment.bytes=134217728")
            self.fill_store(data, mnt, size, parts)
            for p in range(parts):
                getx(f"{mnt}/t/{p}", f"position.{p}")
            out[f"rss_mb_{label}"] = rss_kb(daemon_pid(data)) / 1024
            unmount(mnt, data)
            os.sync()  # measure the mount, not the writeback of the data just written
            out[f"mount_s_{label}"] = mount_logfs(data, mnt)
            # After kill -9: a small unflushed tail on one partition, then remount.
            with open(f"{mnt}/t/0", "ab") as f:
                f.write(b"tail line\n" * 1000)
            kill9(mnt, data)
            out[f"mount_after_kill9_s_{label}"] = mount_logfs(data, mnt)
            unmount(mnt, data)
            out[f"store_mb_{label}"] = size >> 20
            shutil.rmtree(os.path.join(self.work, f"store-{label}"))
        self.record("mount_time", clean_small_s=out["mount_s_small"], clean_big_s=out["mount_s_big"],
                    big_over_small=out["mount_s_big"] / out["mount_s_small"], target_max=2.0,
                    kill9_small_s=out["mount_after_kill9_s_small"], kill9_big_s=out["mount_after_kill9_s_big"],
                    small_mb=out["store_mb_small"], big_mb=out["store_mb_big"])
        self.record("memory", rss_mb_small=out["rss_mb_small"], rss_mb_big=out["rss_mb_big"], partitions=parts,
                    store_mb_big=out["store_mb_big"], target_max_mb=200.0)

    def responsiveness(self):
        size = (16 << 20) if self.quick else (1 << 30)  # (quick: ~50,000 keys in ~160,000 lines)
        row = {}
        for mode in ("process", "thread"):
            data, mnt = self.dirs(f"clean-{mode}")
            mount_logfs(data, mnt, "log.segment.bytes=16777216", "log.cleaner.backoff.ms=100",
                        "log.cleaner.min.cleanable.ratio=0.01", extra_env={"LOGFS_CLEANER_MODE": mode})
            os.mkdir(f"{mnt}/kv")
            subprocess.run(["setfattr", "-n", "user.logfs.config.logfs.key.separator", "-v", "=", f"{mnt}/kv"],
                           check=True)
            keyed = os.path.join(self.work, "keyed.txt")
            subprocess.run(["bash", "-c", f"sed -E 's/^\\{{\"id\":0*([0-9]*[0-9]).*\"user\":\"(u[0-9]*)\"/\\2=&/' "
                            f"{self.lines} | head -c {size} | head -n -1 > {keyed}"], check=True)
            timed_shell(f"cat {keyed} >> {mnt}/kv/0")
            idle = self.append_latencies(f"{mnt}/kv/1" if False else f"{mnt}/kv/0", 2000)
            before = int(getx(f"{mnt}/kv/0", "size_bytes"))
            subprocess.run(["setfattr", "-n", "user.logfs.config.cleanup.policy", "-v", "compact", f"{mnt}/kv"],
                           check=True)
            during, cleaned_s = [], None
            start = time.perf_counter()
            while time.perf_counter() - start < 600:
                during += self.append_latencies(f"{mnt}/kv/0", 200)
                if int(getx(f"{mnt}/kv/0", "size_bytes")) < before // 2:
                    cleaned_s = time.perf_counter() - start
                    break
            unmount(mnt, data)
            os.unlink(keyed)
            shutil.rmtree(os.path.join(self.work, f"clean-{mode}"))
            p99_idle = statistics.quantiles(idle, n=100)[98] * 1000
            p99_during = statistics.quantiles(during, n=100)[98] * 1000
            row[f"p99_ms_idle_{mode}"] = p99_idle
            row[f"p99_ms_cleaning_{mode}"] = p99_during
            row[f"ratio_{mode}"] = p99_during / p99_idle
            row[f"clean_s_{mode}"] = cleaned_s if cleaned_s is not None else -1.0
        row["partition_mb"] = size >> 20
        row["target_max"] = 3.0
        self.record("responsiveness", **row)

    def many_partitions(self):
        """tools/bench_scale.py at one count (20,000 partitions; 500 with --quick): its figures for the table."""
        from bench_scale import run_count

        r = run_count(self.work, 500 if self.quick else 20_000, None, lambda _: None)
        self.record("many_partitions", partitions=r["partitions"], mkdir_ms=r["mkdir"]["mean_ms"],
                    first_append_ms=r["first_append"]["mean_ms"],
                    first_append_last_over_first_tenth=r["first_append"]["last_tenth_ms"]
                    / r["first_append"]["first_tenth_ms"],
                    listing_us_per_partition=r["listing_us_per_partition"], fds=r["after_appends"]["fds"],
                    maps=r["after_appends"]["maps"], rss_mb=r["after_appends"]["rss_mb"], remount_s=r["remount_s"],
                    fds_after_remount=r["after_remount"]["fds"], second_append_ms=r["second_append"]["mean_ms"])

    @staticmethod
    def append_latencies(path: str, n: int) -> list[float]:
        out = []
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(n):
                line = b"probe=%d\n" % i
                start = time.perf_counter()
                os.write(fd, line)
                out.append(time.perf_counter() - start)
        finally:
            os.close(fd)
        return out


# scenario name -> what runs it: a method of Bench, or "module.function" (a tools/bench_*.py function of the Bench)
SCENARIOS = {
    "bulk_append": "bulk_append_and_sequential_read",
    "bulk_append_fsync": "bulk_append_and_sequential_read",
    "sequential_read": "bulk_append_and_sequential_read",
    "sequential_read_warm": "bulk_append_and_sequential_read",
    "small_writes": "small_writes",
    "shell_appends": "shell_appends",
    "read_at_offset": "read_at_offset",
    "mount_time": "mount_time_and_memory",
    "memory": "mount_time_and_memory",
    "responsiveness": "responsiveness",
    "spark": "bench_spark.spark",
    "metrics": "bench_options.metrics",
    "writer_headers": "bench_options.writer_headers",
    "spark_sink": "bench_spark.spark_sink",
    "tiered": "bench_tiered.tiered",
    "spark_cluster": "bench_cluster.spark_cluster",
    "spark_time": "bench_spark_time.spark_time",
    "many_partitions": "many_partitions",
    "compression": "bench_compression.compression",
    "kafka": "bench_kafka.kafka",
}


def run_scenario(bench: Bench, target: str) -> None:
    if "." in target:
        module, function = target.split(".")
        getattr(importlib.import_module(module), function)(bench)
    else:
        getattr(bench, target)()


def _raise_on_signal(signum, _frame):
    """SIGTERM and SIGHUP end the run through the same clean-up as an error (SIGINT already does)."""
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes for bulk append, sequential read and small writes (seconds), small ones "
                             "for the rest (about 3 minutes in all here, 174 s quiet, mostly the Spark and "
                             "compression scenarios)")
    parser.add_argument("--json", default=None, help="write results here (default: print only)")
    parser.add_argument("--workdir", default=None,
                        help="scratch directory on the disk to measure (kept; default: a new /var/tmp/logfs-bench-* "
                             "removed at the end, also when the run fails or is interrupted)")
    parser.add_argument("--only", default=None, help="comma-separated scenario names")
    parser.add_argument("--rounds", type=int, default=None,
                        help="best of N for bulk append, sequential read and small writes (default 3, 1 with --quick)")
    parser.add_argument("--markdown", default=None, help="also write the markdown tables here")
    parser.add_argument("--corpus", default=None,
                        help="compression: a real log corpus (default /tmp/codecs-corpus/real.log if it exists)")
    parser.add_argument("--spark-time-mb", type=int, default=None,
                        help="spark_time: the partition's size in MB (default 256, 4 with --quick); a time window's "
                             "speed-up over the full scan grows with it, as Spark's fixed cost of a query stays")
    args = parser.parse_args(argv)
    wanted = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="logfs-bench-", dir="/var/tmp"))
    try:
        os.makedirs(workdir, exist_ok=True)
        print(f"workdir {workdir}", flush=True)
        bench = Bench(workdir, args.quick, args.rounds, args.corpus)
        bench.spark_time_mb = args.spark_time_mb
        ran = set()
        took: dict[str, float] = {}  # seconds each scenario took (what a --quick run spends where)
        for name in wanted:
            target = SCENARIOS[name]
            if target not in ran:
                ran.add(target)
                start = time.perf_counter()
                run_scenario(bench, target)
                took[target] = round(time.perf_counter() - start, 1)
                print(f"{target}: {took[target]} s", file=sys.stderr, flush=True)
    finally:
        leave_nothing(workdir, remove=not args.workdir)
    report = {
        "machine": machine(),
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": bench.results,
        "scenario_seconds": took,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

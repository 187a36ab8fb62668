#!/usr/bin/env python3
"""logfs benchmarks, side by side with the two references that bound it, in the same run:

- ext4: the same operations on plain files in a directory on the same disk;
- nullfs (tools/nullfs.py): a do-nothing pyfuse3 filesystem, the ceiling for any Python FUSE filesystem here.

Prints a table and writes JSON. Ratios matter, not absolute figures (shared 2-core machines).

    python tools/bench.py [--quick] [--json FILE] [--workdir DIR] [--only NAME[,NAME...]]

Scenarios: bulk_append, shell_appends, sequential_read, read_at_offset, mount_time, memory, responsiveness,
spark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable


# -- mounts -----------------------------------------------------------------------------------------------
def mounted(path: str) -> bool:
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def wait(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def daemon_pid(data: str) -> int | None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"logfs.cli" in b" ".join(args) and data.encode() in args:
            return int(pid)
    return None


def env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def mount_logfs(data: str, mnt: str, *opts: str, extra_env: dict | None = None) -> float:
    """Mount (daemon mode: returns once usable); returns the seconds the mount command took."""
    os.makedirs(mnt, exist_ok=True)
    cmd = [PY, "-m", "logfs.cli", data, mnt]
    if opts:
        cmd += ["-o", ",".join(opts)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env={**env(), **(extra_env or {})}, stderr=subprocess.DEVNULL)
    took = time.perf_counter() - start
    assert mounted(mnt)
    return took


def unmount(mnt: str, data: str | None = None) -> None:
    pid = daemon_pid(data) if data else None
    subprocess.run(["fusermount3", "-u", mnt], check=False, stderr=subprocess.DEVNULL)
    if mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], check=False)
    if pid:
        wait(lambda: not os.path.exists(f"/proc/{pid}"), 120, "the daemon to exit")


def kill9(mnt: str, data: str) -> None:
    pid = daemon_pid(data)
    os.kill(pid, 9)
    wait(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z")
    subprocess.run(["fusermount3", "-uz", mnt], check=False)


class NullFS:
    def __init__(self, mnt: str, size: int):
        self.mnt = mnt
        os.makedirs(mnt, exist_ok=True)
        self.proc = subprocess.Popen([PY, os.path.join(HERE, "nullfs.py"), mnt, "--size", str(size)])
        wait(lambda: mounted(mnt), 30, "nullfs")

    def close(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=False)
        self.proc.wait(30)


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed_shell(script: str) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", script], check=True)
    return time.perf_counter() - start


def make_lines(path: str, size: int) -> int:
    """~100-byte JSON lines; returns the line count."""
    count = 0
    with open(path, "wb") as f:
        written = 0
        chunk = []
        while written < size:
            line = b'{"id":%09d,"user":"u%05d","event":"click","payload":"%s"}\n' % (count, count % 50000, b"p" * 30)
            chunk.append(line)
            written += len(line)
            count += 1
            if len(chunk) >= 10000:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))
    return count


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def getx(path: str, name: str) -> str:
    return os.getxattr(path, f"user.logfs.{name}").decode()


# -- scenarios ----------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, workdir: str, quick: bool):
        self.work = workdir
        self.quick = quick
        self.results: dict[str, dict] = {}
        self.size = (32 << 20) if quick else (1 << 30)
        self.lines = os.path.join(workdir, "lines.json")
        self.line_count = make_lines(self.lines, self.size)

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
        """Best of ``rounds`` for each system (1 with --quick), the three measured in turn each round, so a busy
        moment on a shared machine does not land on one system only."""
        mb = self.size / 1e6
        rounds = 1 if self.quick else 3
        best: dict[str, float] = {}

        def keep(name: str, seconds: float) -> None:
            best[name] = min(seconds, best.get(name, float("inf")))

        ext4 = os.path.join(self.work, "ext4.out")
        dropped = False
        for round_ in range(rounds):
            data, mnt = self.dirs(f"bulk{round_}")
            mount_logfs(data, mnt, "log.segment.bytes=268435456")
            os.mkdir(f"{mnt}/t")
            keep("append_logfs", timed_shell(f"cat {self.lines} >> {mnt}/t/0"))
            assert os.stat(f"{mnt}/t/0").st_size == self.size_of_lines()
            unmount(mnt, data)
            null = NullFS(os.path.join(self.work, "nullmnt"), os.path.getsize(self.lines))
            try:
                keep("append_null", timed_shell(f"cat {self.lines} >> {null.mnt}/f"))
                dropped = drop_caches()
                keep("read_null", timed_shell(f"cat {null.mnt}/f > /dev/null"))
            finally:
                null.close()
            keep("append_ext4", timed_shell(f"rm -f {ext4}; cat {self.lines} >> {ext4} && sync {ext4}"))
            # Sequential read with cold caches: a new mount, and the page cache dropped.
            mount_logfs(data, mnt)
            drop_caches()
            keep("read_logfs", timed_shell(f"cat {mnt}/t/0 > /dev/null"))
            unmount(mnt, data)
            drop_caches()
            keep("read_ext4", timed_shell(f"cat {ext4} > /dev/null"))
            shutil.rmtree(os.path.join(self.work, f"bulk{round_}"), ignore_errors=True)
        os.unlink(ext4)
        self.record("bulk_append", MBps_logfs=mb / best["append_logfs"], MBps_nullfs=mb / best["append_null"],
                    MBps_ext4=mb / best["append_ext4"], ratio_vs_nullfs=best["append_null"] / best["append_logfs"],
                    target=0.5, best_of=rounds)
        self.record("sequential_read", MBps_logfs=mb / best["read_logfs"], MBps_nullfs=mb / best["read_null"],
                    MBps_ext4=mb / best["read_ext4"], ratio_vs_nullfs=best["read_null"] / best["read_logfs"],
                    target=0.6, page_cache_dropped=dropped, best_of=rounds)

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
                position = int(getx(path, f"position.{offset}"))
                with open(path, "rb", buffering=0) as f:
                    f.seek(position)
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
        size = (24 << 20) if self.quick else (1 << 30)
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

    def spark(self):
        """spark.read.json(...).groupBy(...).count() over the mount versus the same lines on ext4."""
        try:
            os.environ["PYSPARK_PYTHON"] = sys.executable
            from pyspark.sql import SparkSession
        except ImportError:
            self.record("spark", skipped="pyspark not installed")
            return
        size = (32 << 20) if self.quick else (1 << 30)
        data, mnt = self.dirs("spark")
        ext4_dir = os.path.join(self.work, "spark-ext4")
        os.makedirs(ext4_dir, exist_ok=True)
        mount_logfs(data, mnt, "num.partitions=2")
        os.mkdir(f"{mnt}/events")
        for p in range(2):
            timed_shell(f"head -c {size // 2} {self.lines} | head -n -1 >> {mnt}/events/{p}")
            timed_shell(f"head -c {size // 2} {self.lines} | head -n -1 > {ext4_dir}/{p}")
        spark = (SparkSession.builder.master("local[2]").appName("logfs-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "4").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            def job(path):
                start = time.perf_counter()
                rows = spark.read.json(f"file://{path}").groupBy("user").count().collect()
                return time.perf_counter() - start, sum(r["count"] for r in rows)

            job(ext4_dir)  # JVM and code warm-up
            t_ext4, n_ext4 = min(job(ext4_dir) for _ in range(2))
            t_logfs, n_logfs = min(job(f"{mnt}/events") for _ in range(2))
            assert n_ext4 == n_logfs
        finally:
            spark.stop()
            unmount(mnt, data)
            shutil.rmtree(ext4_dir, ignore_errors=True)
        self.record("spark", mb=size >> 20, s_logfs=t_logfs, s_ext4=t_ext4, ratio_vs_ext4=t_ext4 / t_logfs,
                    records=n_logfs, target=0.8)

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


SCENARIOS = {
    "bulk_append": "bulk_append_and_sequential_read",
    "sequential_read": "bulk_append_and_sequential_read",
    "shell_appends": "shell_appends",
    "read_at_offset": "read_at_offset",
    "mount_time": "mount_time_and_memory",
    "memory": "mount_time_and_memory",
    "responsiveness": "responsiveness",
    "spark": "spark",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes in all")
    parser.add_argument("--json", default=None, help="write results here (default: print only)")
    parser.add_argument("--workdir", default=None, help="scratch directory on the disk to measure")
    parser.add_argument("--only", default=None, help="comma-separated scenario names")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="logfs-bench-", dir="/var/tmp")
    os.makedirs(workdir, exist_ok=True)
    wanted = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    bench = Bench(workdir, args.quick)
    ran = set()
    try:
        for name in wanted:
            method = SCENARIOS[name]
            if method not in ran:
                ran.add(method)
                getattr(bench, method)()
    finally:
        for entry in os.listdir(workdir):
            mnt = os.path.join(workdir, entry, "mnt")
            if os.path.isdir(mnt) and mounted(mnt):
                subprocess.run(["fusermount3", "-uz", mnt], check=False)
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": bench.results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

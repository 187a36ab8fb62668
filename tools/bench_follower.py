"""Follower mounts, measured (issue 33's acceptance): a writer tiering to a SeaweedFS on 127.0.0.1 (started here,
tools/seaweed.py), and follower mounts of its bucket prefix with caches of their own.

    python tools/bench_follower.py [--segments 100] [--partitions 1000] [--interval-ms 1000]

- **lag**: from the writer's manifest commit (its ``remote_log_end_offset`` moving, polled every 10 ms) to the
  follower showing that end (its ``log_end_offset``, polled every 10 ms), over ``--segments`` segments, while a
  writer appends; p50/p99/max against the follow interval plus 1 s;
- **idle cost**: a follower of ``--partitions`` tiered partitions in which nothing changes, for 20 s: requests a
  second to the store (its ``logfs_follow_requests_total`` and the tiered read counters), its RSS and descriptors.

A follower's reads are the writer's tiered read path (``tools/bench.py --only tiered`` measures it).

Prints one line per figure and a markdown table. Standalone: imports only tools/seaweed.py (and logfs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from seaweed import SeaweedS3  # noqa: E402

PY = sys.executable


def run_env(sw) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(sw.env())
    return e


def mount(source: str, mnt: str, opts: list[str], environ: dict) -> None:
    subprocess.run([PY, "-m", "logfs.cli", source, mnt, "-o", ",".join(opts)], check=True, env=environ)


def unmount(mnt: str) -> None:
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    for _ in range(200):
        if not any(line.split()[1] == mnt for line in open("/proc/mounts")):
            return
        time.sleep(0.05)
    subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def getx(path: str, name: str) -> int:
    return int(os.getxattr(path, "user.logfs." + name))


def metric(path: str, name: str) -> float:
    try:
        for line in open(path):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    except FileNotFoundError:
        pass
    return -1.0


def pid_of(mnt: str) -> int:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                args = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if os.fsencode(mnt) in args and b"logfs.cli" in args:
                return int(name)
    raise RuntimeError(f"no daemon for {mnt}")


def drop_caches() -> None:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--interval-ms", type=int, default=1000)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="logfs-bench-follower-")
    sw = SeaweedS3(os.path.join(work, "seaweed"))
    sw.start()
    rows = []
    mounts = []
    try:
        sw.create_bucket()
        environ = run_env(sw)
        prefix = "bench"
        wmnt, fmnt = os.path.join(work, "writer"), os.path.join(work, "follower")
        os.makedirs(wmnt)
        os.makedirs(fmnt)
        common = [f"logfs.remote.s3.endpoint={sw.endpoint}"]
        mount(os.path.join(work, "data"), wmnt, common + [
            "remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={sw.bucket}",
            f"logfs.remote.s3.prefix={prefix}", "remote.log.manager.task.interval.ms=100",
            "log.segment.bytes=262144", "log.segment.delete.delay.ms=0"], environ)
        mounts.append(wmnt)
        os.mkdir(os.path.join(wmnt, "lag"))
        os.setxattr(os.path.join(wmnt, "lag"), "user.logfs.config.remote.storage.enable", b"true")
        metrics = os.path.join(work, "follower.prom")
        mount(f"s3://{sw.bucket}/{prefix}", fmnt, common + [
            f"logfs.remote.cache.dir={os.path.join(work, 'cache')}", f"logfs.follow.interval.ms={args.interval_ms}",
            f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=500"], environ)
        mounts.append(fmnt)

        # -- lag --------------------------------------------------------------------------------------------
        stop = threading.Event()
        line = b"%s\n" % (b"l" * 99)

        def writer():
            fd = os.open(os.path.join(wmnt, "lag", "0"), os.O_WRONLY | os.O_APPEND)
            while not stop.is_set():
                os.write(fd, line * 200)
                time.sleep(0.02)
            os.close(fd)

        t = threading.Thread(target=writer)
        t.start()
        seen_writer: dict[int, float] = {}
        lags = []
        wpath, fpath = os.path.join(wmnt, "lag", "0"), os.path.join(fmnt, "lag", "0")
        deadline = time.monotonic() + 60 + args.segments * 3
        try:
            while len(lags) < args.segments and time.monotonic() < deadline:
                now = time.monotonic()
                end = getx(wpath, "remote_log_end_offset")
                if end and end not in seen_writer:
                    seen_writer[end] = now
                try:
                    shown = getx(fpath, "log_end_offset")
                except OSError:
                    shown = 0
                for e in [e for e in seen_writer if e <= shown]:
                    lags.append(now - seen_writer.pop(e))
                time.sleep(0.01)
        finally:
            stop.set()
            t.join()
        q = statistics.quantiles(lags, n=100) if len(lags) >= 2 else [0] * 99
        bound = args.interval_ms / 1000 + 1
        rows.append(("lag, manifest commit to follower (s)", f"p50 {q[49]:.2f}, p99 {q[98]:.2f}, max {max(lags):.2f} "
                     f"over {len(lags)} segments", f"p99 <= {bound:g}", q[98] <= bound))
        print(rows[-1], flush=True)

        # -- idle cost ------------------------------------------------------------------------------------------
        many = os.path.join(wmnt, "many")
        os.mkdir(many)
        os.setxattr(many, "user.logfs.config.remote.storage.enable", b"true")
        os.setxattr(many, "user.logfs.config.segment.ms", b"500")
        for p in range(args.partitions):
            path = os.path.join(many, str(p))
            with open(path, "ab") as f:
                f.write(b"record of partition %d\n" % p)
        time.sleep(2)
        for p in range(args.partitions):  # a second append rolls the first segment (segment.ms)
            with open(os.path.join(many, str(p)), "ab") as f:
                f.write(b"second record\n")
        target = args.partitions
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if len(os.listdir(os.path.join(fmnt, "many"))) >= target and all(
                        getx(os.path.join(fmnt, "many", str(p)), "log_end_offset") >= 1 for p in (0, target - 1)):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(2 * args.interval_ms / 1000)
        subprocess.run(["fusermount3", "-u", wmnt], check=True)  # the writer gone: nothing changes any more
        mounts.remove(wmnt)
        time.sleep(2)
        before, started = metric(metrics, "logfs_follow_requests_total"), time.monotonic()
        gets_before = metric(metrics, "logfs_remote_fetch_requests_total")
        time.sleep(20)
        elapsed = time.monotonic() - started
        rate = (metric(metrics, "logfs_follow_requests_total") - before) / elapsed
        gets = max(0.0, metric(metrics, "logfs_remote_fetch_requests_total") - gets_before) / elapsed
        pid = pid_of(fmnt)
        rss = int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rows.append((f"idle follower of {target} partitions: requests/s", f"{rate + gets:.2f} "
                     f"(follow {rate:.2f}, reads {gets:.2f}); RSS {rss} MB, {fds} descriptors", "<= 5", rate + gets <= 5))
        print(rows[-1], flush=True)
    finally:
        for m in mounts:
            unmount(m)
        sw.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| figure | result | target | met |\n| --- | --- | --- | --- |")
    for name, result, target, ok in rows:
        print(f"| {name} | {result} | {target} | {'yes' if ok else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Follower mounts, measured (issue 33's acceptance): a writer tiering to a SeaweedFS on 127.0.0.1 (started here,
logfs/testing/seaweed.py), and follower mounts of its bucket prefix with caches of their own.

    python tools/bench_follower.py [--only lag,reads,idle] [--segments 100] [--partitions 1000]
                                   [--interval-ms 1000] [--read-mib 512] [--runs 3]

- **lag**: from the writer's manifest commit (its ``remote_log_end_offset`` moving, polled every 10 ms) to the
  follower showing that end (its ``log_end_offset``, polled every 10 ms), over ``--segments`` segments, while a
  writer appends; p50/p99/max against the follow interval plus 1 s;
- **reads**: ``--read-mib`` of lines in 64 MiB segments, tiered, and no longer on the writer's disk. *Cold*: a
  follower mounted on an empty cache directory reads the tiered text of the partition with 1 MiB ``read()``s; in the
  same run, alternated with it, boto3 GETs the same ``.log`` objects (one GET after another, as a client of the
  store reads them; and, as the store's best, 16 MiB ranged GETs on 4 threads, what the follower's read-ahead
  issues). The page cache is dropped before each (SeaweedFS's volume files are not in memory). The figure is the
  ratio of times to read the same segments (the follower returns their text, the GETs their bytes). *Warm*: the
  same read again on the follower (its block cache holds the blocks) against the writer's warm read of the same
  tiered data (its own block cache), alternated;
- **idle**: ``--partitions`` partitions with a tiered segment each (``segment.ms``: a second append rolls the
  first segment) with ``--idle-tiered``, else tiered with nothing uploaded yet (each named in the follower index),
  followed until the follower's metrics say it caught up (``logfs_partitions``, ``logfs_follow_lag_seconds``);
  then the writer's RSS and descriptors, idle, at that count; then the writer unmounted (nothing changes any more)
  and, over 6 windows of 5 s, the follower's requests a second to the store (its ``logfs_follow_requests_total``
  and the tiered read GETs), its RSS and descriptors. Both daemons write their metrics file every second.

Each figure is measured ``--runs`` times (reads) or once per run of the script (lag, idle); the spread is printed.
Prints one line per figure and a markdown table. Imports logfs/testing/benchlib.py and logfs/testing/seaweed.py (and logfs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

from logfs.testing.benchlib import (append_file, daemon_pid, daemon_pids, drop_caches, leave_nothing, make_lines,
                                   mount_logfs, rss_kb, table, unmount)
from logfs.testing.seaweed import SeaweedS3

MiB = 1 << 20
PREFIX = "bench"


def getx(path: str, name: str) -> int:
    return int(os.getxattr(path, "user.logfs." + name))


def metric(path: str, name: str) -> float:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.split()[-1])
    except FileNotFoundError:
        pass
    return -1.0


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """median (min-max, n)"""
    if not values:
        return "n/a"
    return (f"{statistics.median(values):.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f}, "
            f"n={len(values)})")


def set_config(path: str, **config) -> None:
    for key, value in config.items():
        os.setxattr(path, "user.logfs.config." + key.replace("_", "."), str(value).encode())


class Bench:
    def __init__(self, args, work: str):
        self.args = args
        self.work = work
        self.sw = SeaweedS3(os.path.join(work, "seaweed"))
        self.data = os.path.join(work, "data")
        self.wmnt = os.path.join(work, "writer")
        self.source = None
        self.rows: list[list] = []
        self.followers: dict[str, str] = {}  # mountpoint -> cache dir
        self.proxy = None  # a RateProxy (--rate-mbps)

    # -- mounts ------------------------------------------------------------------------------------------------
    @property
    def read_endpoint(self) -> str:
        """Where the followers and the reference GETs reach the store: through a RateProxy with --rate-mbps or
        --latency-ms."""
        if not self.args.rate_mbps and not self.args.latency_ms:
            return self.sw.endpoint
        if self.proxy is None:
            from logfs.testing.seaweed import RateProxy

            self.proxy = RateProxy(int(self.sw.endpoint.rsplit(":", 1)[1]), self.args.rate_mbps * 1e6,
                                   self.args.latency_ms / 1000)
        return self.proxy.endpoint

    @property
    def write_endpoint(self) -> str:
        """Where the writer reaches the store: through the proxy with --latency-ms (its passes are round trips)."""
        return self.read_endpoint if self.args.latency_ms else self.sw.endpoint

    def start(self) -> None:
        self.sw.start()
        self.sw.create_bucket()
        self.sw.warm_up()
        self.source = f"s3://{self.sw.bucket}/{PREFIX}"
        self.mount_writer()

    def mount_writer(self) -> None:
        mount_logfs(self.data, self.wmnt, f"logfs.remote.s3.endpoint={self.write_endpoint}",
                    "remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={self.sw.bucket}",
                    f"logfs.remote.s3.prefix={PREFIX}", "remote.log.manager.task.interval.ms=100",
                    "log.segment.bytes=262144", "log.segment.delete.delay.ms=0", f"logfs.remote.cache.bytes={4 << 30}",
                    # (as the idle follower's: the metrics' render is part of a daemon's RSS at 20,000 partitions)
                    f"logfs.metrics.file={os.path.join(self.work, 'writer.prom')}", "logfs.metrics.interval.ms=1000",
                    *filter(None, self.args.writer_opts.split(",")), extra_env=self.sw.env())

    def mount_follower(self, name: str, *opts: str, fresh: bool = False) -> str:
        mnt, cache = os.path.join(self.work, name), os.path.join(self.work, name + ".cache")
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
        mount_logfs(self.source, mnt, f"logfs.remote.s3.endpoint={self.read_endpoint}",
                    f"logfs.remote.cache.dir={cache}", f"logfs.follow.interval.ms={self.args.interval_ms}",
                    f"logfs.remote.cache.bytes={4 << 30}", *opts, extra_env=self.sw.env())
        self.followers[mnt] = cache
        return mnt

    def unmount_follower(self, mnt: str) -> None:
        unmount(mnt, self.source)
        self.followers.pop(mnt, None)

    def topic(self, name: str, **config) -> str:
        path = os.path.join(self.wmnt, name)
        os.mkdir(path)
        set_config(path, remote_storage_enable="true", **config)
        return path

    def report(self, name: str, result: str, target: str, ok) -> None:
        self.rows.append([name, result, target, ok if ok is not None else "-"])
        print(f"{name}: {result} (target {target})", flush=True)

    # -- lag ----------------------------------------------------------------------------------------------------
    def lag(self) -> None:
        args = self.args
        self.topic("lag")
        fmnt = self.mount_follower("follower-lag", fresh=True)
        stop = threading.Event()
        line = b"%s\n" % (b"l" * 99)
        wpath, fpath = os.path.join(self.wmnt, "lag", "0"), os.path.join(fmnt, "lag", "0")

        def writer():
            fd = os.open(wpath, os.O_WRONLY | os.O_APPEND)
            while not stop.is_set():
                os.write(fd, line * 200)
                time.sleep(0.02)
            os.close(fd)

        t = threading.Thread(target=writer)
        t.start()
        seen_writer: dict[int, float] = {}
        lags = []
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
        self.unmount_follower(fmnt)
        q = statistics.quantiles(lags, n=100, method="inclusive") if len(lags) >= 2 else [0] * 99
        bound = args.interval_ms / 1000 + 1
        self.report("lag, manifest commit to follower (s)", f"p50 {q[49]:.2f}, p99 {q[98]:.2f}, max {max(lags):.2f} "
                    f"over {len(lags)} segments", f"p99 <= {bound:g}", q[98] <= bound)

    # -- reads --------------------------------------------------------------------------------------------------
    def reads(self) -> None:
        args = self.args
        seg = 64 * MiB
        self.topic("reads", segment_bytes=seg, local_retention_bytes=1)
        src = os.path.join(self.work, "lines.txt")
        make_lines(src, args.read_mib * MiB)
        wpath = os.path.join(self.wmnt, "reads", "0")
        append_file(src, wpath, fsync=False)
        os.unlink(src)
        with open(wpath, "ab") as f:  # past the last full segment: it rolls, and is tiered
            f.write(b"x" * 100 + b"\n")
        expected = (args.read_mib * MiB) // seg  # segments sealed
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # tiered, and gone from the writer's disk
            if getx(wpath, "remote_segment_count") >= expected and \
                    getx(wpath, "local_log_start_offset") >= getx(wpath, "remote_log_end_offset"):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the reads topic was not tiered (and deleted locally) in time")
        end = getx(wpath, "remote_log_end_offset")
        length = getx(wpath, f"position.{end}")  # the tiered text
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.read_endpoint, region_name="us-east-1",
                              aws_access_key_id=self.sw.access_key, aws_secret_access_key=self.sw.secret_key,
                              config=Config(s3={"addressing_style": "path"}, max_pool_connections=8))
        listing = client.list_objects_v2(Bucket=self.sw.bucket, Prefix=f"{PREFIX}/reads-0/")
        objects = sorted((o["Key"], o["Size"]) for o in listing.get("Contents", []) if o["Key"].endswith(".log"))
        assert len(objects) == getx(wpath, "remote_segment_count"), objects
        object_bytes = sum(size for _, size in objects)

        def get_sequential() -> float:
            started = time.perf_counter()
            for key, _ in objects:
                body = client.get_object(Bucket=self.sw.bucket, Key=key)["Body"]
                while body.read(MiB):
                    pass
            return time.perf_counter() - started

        def get_ranges(size=16 * MiB, threads=4) -> float:
            ranges = [(key, start, min(size, total - start)) for key, total in objects
                      for start in range(0, total, size)]

            def one(r):
                key, start, n = r
                body = client.get_object(Bucket=self.sw.bucket, Key=key,
                                         Range=f"bytes={start}-{start + n - 1}")["Body"]
                got = 0
                while chunk := body.read(MiB):
                    got += len(chunk)
                return got

            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                assert sum(pool.map(one, ranges)) == object_bytes
            return time.perf_counter() - started

        buf = bytearray(MiB)
        mb = object_bytes / 1e6

        def read_text(path: str) -> float:
            fd = os.open(path, os.O_RDONLY)
            try:
                started, done = time.perf_counter(), 0
                while done < length:
                    n = os.readv(fd, [memoryview(buf)[:min(MiB, length - done)]])
                    if n == 0:
                        raise RuntimeError(f"{path}: short read at {done} of {length}")
                    done += n
                return time.perf_counter() - started
            finally:
                os.close(fd)

        def writer_cold() -> float:
            """The writer's own cold read of its tiered data: remounted with its block cache emptied."""
            unmount(self.wmnt, self.data)
            shutil.rmtree(os.path.join(self.data, "reads-0", "logfs-remote", "blocks"), ignore_errors=True)
            self.mount_writer()
            drop_caches()
            return read_text(wpath)

        read_text(wpath)  # (the writer's first read of its tiered data, before any figure)
        cold, cold_w, seq, par, warm_f, warm_w, cold_cpu = [], [], [], [], [], [], []
        for run in range(args.runs):
            fmnt = self.mount_follower("follower-reads", fresh=True)  # an empty cache directory
            fpath = os.path.join(fmnt, "reads", "0")
            deadline = time.monotonic() + 60
            while getx(fpath, "log_end_offset") < end:
                if time.monotonic() > deadline:
                    raise RuntimeError("the follower did not show the tiered end")
                time.sleep(0.05)
            order = ["follower", "writer", "get", "ranges"]
            order = order[run % 4:] + order[:run % 4]  # each first in turn
            for what in order:
                if what == "writer":
                    cold_w.append(writer_cold())
                    continue
                drop_caches()
                if what == "follower":
                    pid = daemon_pids(self.source, fmnt)[0]
                    before = cpu_seconds(pid)
                    cold.append(read_text(fpath))
                    cold_cpu.append(cpu_seconds(pid) - before)
                elif what == "get":
                    seq.append(get_sequential())
                else:
                    par.append(get_ranges())
            # Warm: each mount's blocks in its block cache and their files in the page cache (one read first).
            read_text(fpath)
            read_text(wpath)
            for what in (("follower", "writer") if run % 2 == 0 else ("writer", "follower")):
                (warm_f if what == "follower" else warm_w).append(read_text(fpath if what == "follower" else wpath))
            self.unmount_follower(fmnt)
            print(f"reads run {run} ({', '.join(order)}): cold follower {cold[-1]:.2f}s, writer {cold_w[-1]:.2f}s, "
                  f"GETs {seq[-1]:.2f}s, 4x16MiB GETs {par[-1]:.2f}s; warm follower {warm_f[-1]:.2f}s, writer "
                  f"{warm_w[-1]:.2f}s; load {os.getloadavg()[0]:.1f}", flush=True)
        ratios = [s / c for s, c in zip(seq, cold)]
        ratios_par = [p / c for p, c in zip(par, cold)]
        ratios_w = [w / c for w, c in zip(cold_w, cold)]
        warm_ratios = [w / f for w, f in zip(warm_w, warm_f)]
        self.report(f"cold follower read, 1 MiB reads, {len(objects)} x 64 MiB segments: ratio to the store's GETs",
                    f"{spread(ratios)} (follower {spread([mb / c for c in cold], ' MB/s', 0)}; one GET at a time "
                    f"{spread([mb / s for s in seq], ' MB/s', 0)})", ">= 0.5", min(ratios) >= 0.5)
        self.report("cold follower read: ratio to 4 x 16 MiB ranged GETs at once (the read-ahead's GETs)",
                    f"{spread(ratios_par)} (GETs {spread([mb / p for p in par], ' MB/s', 0)})", "(reference)", None)
        self.report("cold follower read: ratio to the writer's cold read of the same tiered data",
                    f"{spread(ratios_w)} (writer {spread([mb / w for w in cold_w], ' MB/s', 0)})", "(reference)",
                    None)
        self.report("cold follower read: the follower daemon's CPU seconds per GB of .log read (all its threads)",
                    spread([c / (mb / 1000) for c in cold_cpu], " s"), "(reference: lower is better)", None)
        self.report("warm follower read vs the writer's warm read of the same tiered data (ratio)",
                    f"{spread(warm_ratios)} (follower {spread([length / 1e6 / w for w in warm_f], ' MB/s', 0)}, "
                    f"writer {spread([length / 1e6 / w for w in warm_w], ' MB/s', 0)})", "match (~1)",
                    statistics.median(warm_ratios) >= 0.9)

    # -- idle ---------------------------------------------------------------------------------------------------
    def idle(self) -> None:
        args = self.args
        # --idle-tiered: segment.ms rolls each partition's first segment at its second append, and the writer tiers
        # it (on this machine ~0.3 s a segment for the writer to upload, and again for the follower to fetch its
        # indexes, both mostly fsyncs: 20,000 take hours). Otherwise each partition is tiered with nothing uploaded
        # yet: its (empty) manifest read, and the partition named in the follower index, which the follower mounts.
        many = self.topic("many", **({"segment_ms": 500} if args.idle_tiered else {}))
        metrics = os.path.join(self.work, "follower.prom")
        fmnt = self.mount_follower("follower-idle", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=1000",
                                   fresh=True)
        started = time.monotonic()
        for p in range(args.partitions):
            with open(os.path.join(many, str(p)), "ab") as f:
                f.write(b"record of partition %d\n" % p)
        created = time.monotonic() - started
        print(f"idle: {args.partitions} partitions created in {created:.0f}s", flush=True)
        target = args.partitions
        last = os.path.join(many, str(target - 1))
        deadline = time.monotonic() + 4 * 3600
        if args.idle_tiered:
            time.sleep(1)
            for p in range(args.partitions):  # a second append rolls the first segment (segment.ms)
                with open(os.path.join(many, str(p)), "ab") as f:
                    f.write(b"second record\n")
            while time.monotonic() < deadline:  # every partition tiered (the last one created is the last tiered)
                if getx(os.path.join(many, "0"), "remote_log_end_offset") >= 1 and \
                        getx(last, "remote_log_end_offset") >= 1:
                    break
                time.sleep(1)
            print(f"idle: tiered after {time.monotonic() - started:.0f}s", flush=True)
        def caught_up() -> bool:  # every partition shown, and a look since after which it showed all published
            return (metric(metrics, "logfs_partitions") >= target
                    and 0 <= metric(metrics, "logfs_follow_lag_seconds") <= args.interval_ms / 1000 + 1
                    and metric(metrics, "logfs_follow_lag_offsets") in (0.0, -1.0))

        while time.monotonic() < deadline:
            if caught_up():
                time.sleep(2)
                if caught_up():
                    break
            time.sleep(1)
        print(f"idle: followed after {time.monotonic() - started:.0f}s", flush=True)
        time.sleep(max(10, 3 * args.interval_ms / 1000))  # the writer's last passes, the follower's last looks
        wpid, fpid = daemon_pid(self.data), daemon_pid(self.source)
        w_rss, w_fds = [], []
        for _ in range(3):
            w_rss.append(rss_kb(wpid) / 1024)
            w_fds.append(fds_of(wpid))
            time.sleep(1)
        unmount(self.wmnt, self.data)  # the writer gone: nothing changes any more
        time.sleep(3)
        samples, f_rss, f_fds = [], [], []
        for _ in range(6):  # 6 x 5 s windows of the metrics (written every second)
            before, gets_before, t0 = (metric(metrics, "logfs_follow_requests_total"),
                                       metric(metrics, "logfs_remote_fetch_requests_total"), time.monotonic())
            time.sleep(5)
            elapsed = time.monotonic() - t0
            follow = (metric(metrics, "logfs_follow_requests_total") - before) / elapsed
            gets = max(0.0, metric(metrics, "logfs_remote_fetch_requests_total") - gets_before) / elapsed
            samples.append(follow + gets)
            f_rss.append(rss_kb(fpid) / 1024)
            f_fds.append(fds_of(fpid))
        print(f"idle: requests/s per 5 s window, in order: {', '.join(f'{x:.2f}' for x in samples)}", flush=True)
        self.report(f"idle follower of {target} partitions: requests/s to the store", spread(samples, "/s"),
                    "<= 5", max(samples) <= 5)
        self.report(f"idle follower of {target} partitions: RSS (MiB) vs the writer's",
                    f"follower {spread(f_rss, '', 0)}, writer {spread(w_rss, '', 0)}", "within the writer's",
                    max(f_rss) <= max(w_rss))
        self.report(f"idle follower of {target} partitions: open descriptors vs the writer's",
                    f"follower {spread(f_fds, '', 0)}, writer {spread(w_fds, '', 0)}", "within the writer's",
                    max(f_fds) <= max(w_fds))
        self.unmount_follower(fmnt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="lag,reads,idle", help="comma-separated: lag, reads, idle")
    ap.add_argument("--writer-opts", default="", help="more -o options for the writer's mount (comma-separated)")
    ap.add_argument("--latency-ms", type=float, default=0,
                    help="the writer, the followers and the reference GETs reach the store through a proxy that "
                         "starts each answer this long after its request (a store in another region)")
    ap.add_argument("--rate-mbps", type=float, default=0,
                    help="reads: the followers and the reference GETs reach the store through a proxy that passes "
                         "at most this many MB/s per connection (a remote store; the writer's cold read does not)")
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--read-mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tmpdir", default=None, help="where the run's directories go (the writer's DATA_DIR, the "
                    "followers' caches, SeaweedFS's data): /dev/shm makes fsync free (used for --only idle at "
                    "20,000 partitions; not for reads, whose cold runs need a disk under the store)")
    ap.add_argument("--idle-tiered", action="store_true", help="idle: a tiered segment in every partition (slow)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    work = tempfile.mkdtemp(prefix="logfs-bench-follower-", dir=args.tmpdir)
    bench = Bench(args, work)
    try:
        bench.start()
        for name in ("lag", "reads", "idle"):  # idle last: a fresh follower then reads every partition's state
            if name in only:
                getattr(bench, name)()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # (a second Ctrl-C does not cut the clean-up short)
        for mnt in list(bench.followers):
            unmount(mnt)
        unmount(bench.wmnt, bench.data)
        bench.sw.shutdown()
        leave_nothing(work, remove=True)
    print("\n".join(table(["figure", "result", "target", "met"], bench.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

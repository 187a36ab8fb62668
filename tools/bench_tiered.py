"""The tiered storage scenario of tools/bench.py (``--only tiered``), against a SeaweedFS on 127.0.0.1 that it starts
itself (logfs/testing/seaweed.py). Two topics in one mount: ``r`` (the reads: ~256 MB of the bench's lines, 16 MiB
segments; 24 MB in 4 MiB segments with ``--quick``) and ``t`` (the append latencies: 1 MiB segments, so uploads
run all the time).

- **append p99** (one ~10-byte line per write) on ``t``: idle (nothing to upload), store up while a fresh batch
  of segments is uploaded, store down (S3 gateway stopped), store slow (a stalling proxy in front of the store,
  the only figures that go through it);
- **sequential reads of ``r``'s tiered range**, straight to SeaweedFS (no proxy): ``dd bs=1M`` and ``dd bs=8k``
  from offset 0 to the first local byte, cold (a new mount, the block cache emptied, the kernel's page cache
  dropped) and warm (read again at once), and the local part with ``dd bs=1M``; in the same round, the store's
  own throughput for the same ``.log`` objects: whole-object GETs one at a time by one client (logfs's own S3
  client, ``S3Store.get_bytes``), page cache dropped first (cold, as the mount's cold read sees the store) and
  again (warm). MB/s are given in stored bytes (the ``.log`` objects' sizes over the time: what was fetched per
  second) and in text bytes (what the reader got). Best of the bench's rounds; the ratios divide the best cold
  mount read by the best store GETs of the same run;
- **random reads**: 100 cold reads (new mount, empty cache) at random offsets of the tiered range, each a
  ``user.logfs.position.<offset>`` getxattr then a 100-byte ``pread`` there; the mount reaches the store through
  a counting proxy (tools-local: it parses the HTTP requests that pass), which counts the ranged GETs of
  ``.log`` objects and their bytes. Without ``--quick`` the same 100 reads are also made with the code of the
  commit before read-ahead (``LOGFS_BENCH_TIERED_BASE``, default ``f4dc25f``; ``none`` to skip; exported with
  ``git archive`` into the work directory, its C accelerator compiled there), and that code's cold sequential
  reads too, for comparison in the same run;
- **the cache bound**: a cold ``dd bs=1M`` of the tiered range with ``logfs.remote.cache.bytes`` of 8 MiB
  (2 MiB with ``--quick``), the blocks directory's size sampled every ~2 ms throughout: its largest total
  (temporary files of blocks being written included) and largest total of complete block files.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from contextlib import contextmanager

from logfs.testing.benchlib import PY, ROOT, daemon_pid, drop_caches, env, getx, mounted_at, timed_shell, unmount, wait_for
from logfs.testing.seaweed import SeaweedS3, StallProxy, TcpProxy

BASE_COMMIT = "f4dc25f"  # the parent of 323f1d8 "Read-ahead for tiered reads (issue 23)"
RANDOM_READS = 100


def _p99_ms(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


class CountingProxy(TcpProxy):
    """A TCP proxy on 127.0.0.1 in front of an S3 endpoint that parses the HTTP/1.1 requests going through it
    (request line, ``Range``, ``Content-Length``; bodies skipped) and records each one, and counts the bytes
    that come back. ``reset()`` starts a new count. A request it cannot frame (chunked upload) stops the parse of
    that connection and is counted in ``unparsed``."""

    name = "counting-proxy"

    def __init__(self, target_port: int) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.bytes_down = 0
        self.unparsed = 0
        super().__init__(target_port)

    def reset(self) -> None:
        with self.lock:
            self.requests, self.bytes_down, self.unparsed = [], 0, 0

    def log_gets(self) -> tuple[int, int]:
        """Ranged GETs of ``.log`` objects since the last reset, and the bytes they asked for."""
        gets, total = 0, 0
        with self.lock:
            for method, path, rng in self.requests:
                if method == "GET" and path.split("?")[0].endswith(".log"):
                    gets += 1
                    m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
                    if m is None:
                        raise RuntimeError(f"a GET of a .log object without a closed range: {path} {rng}")
                    total += int(m.group(2)) - int(m.group(1)) + 1
        return gets, total

    def _pump(self, src, dst, upstream: bool) -> None:
        (self._up if upstream else self._down)(src, dst)

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        buf, skip, parsing = b"", 0, True
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
            if not parsing:
                continue
            buf += data
            while True:
                if skip:
                    n = min(skip, len(buf))
                    buf, skip = buf[n:], skip - n
                    if skip:
                        break
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head, buf = buf[:end].decode("latin-1").split("\r\n"), buf[end + 4:]
                method, path = head[0].split(" ")[:2]
                headers = {}
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                with self.lock:
                    self.requests.append((method, path, headers.get("range")))
                    if "chunked" in headers.get("transfer-encoding", ""):
                        self.unparsed += 1
                        parsing = False
                skip = int(headers.get("content-length", "0"))
                if not parsing:
                    break

    def _down(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            data = src.recv(262144)
            if not data:
                break
            with self.lock:
                self.bytes_down += len(data)
            dst.sendall(data)


def base_tree(bench) -> str | None:
    """The logfs package of the commit before read-ahead, exported into the work directory with its C accelerator
    built; None (with a note) when not asked for or not available (no git history)."""
    commit = os.environ.get("LOGFS_BENCH_TIERED_BASE", "" if bench.quick else BASE_COMMIT)
    if not commit or commit == "none":
        return None
    tree = os.path.join(bench.work, f"base-{commit}")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    try:
        archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "logfs"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        cfg = sysconfig.get_config_var
        so = os.path.join(tree, "logfs", "_speedups" + cfg("EXT_SUFFIX"))
        subprocess.run([*cfg("CC").split(), *cfg("CFLAGS").split(), *cfg("CCSHARED").split(),
                        f"-I{sysconfig.get_paths()['include']}", "-shared", "-o", so,
                        os.path.join(tree, "logfs", "_speedups.c")], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"tiered: no comparison with {commit}: {exc}", file=sys.stderr)
        return None
    return tree


def mount_tree(data: str, mnt: str, opts: list[str], extra_env: dict, tree: str = ROOT) -> None:
    """Mount with the logfs package of ``tree`` (run from there, so nothing else's shadows it), and check that
    the daemon loaded that tree's C accelerator."""
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([PY, "-m", "logfs.cli", data, mnt, "-o", ",".join(opts)], check=True, cwd=tree,
                   env={**env(), "PYTHONPATH": tree, **extra_env}, stderr=subprocess.DEVNULL)
    assert mounted_at(mnt)
    with open(f"/proc/{daemon_pid(data)}/maps") as f:
        maps = f.read()
    assert os.path.join(os.path.realpath(tree), "logfs", "_speedups") in maps, f"the daemon is not {tree}'s"


def clear_blocks(data: str) -> None:
    for blocks in glob.glob(os.path.join(data, "*", "logfs-remote", "blocks")):
        shutil.rmtree(blocks)


class DirSampler:
    """The largest total size of the files in some directories, sampled every ~2 ms in a thread: all files, and
    complete block files only (not ``.tmp-`` ones)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.max_all = self.max_blocks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = blocks = 0
            for directory in glob.glob(self.pattern):
                try:
                    entries = list(os.scandir(directory))
                except FileNotFoundError:
                    continue
                for entry in entries:
                    try:
                        size = entry.stat().st_size
                    except FileNotFoundError:
                        continue
                    total += size
                    if ".tmp-" not in entry.name:
                        blocks += size
            self.max_all = max(self.max_all, total)
            self.max_blocks = max(self.max_blocks, blocks)
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def aws_env(sw: SeaweedS3):
    saved = {k: os.environ.get(k) for k in sw.env()}
    os.environ.update(sw.env())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tiered(bench) -> None:
    quick = bench.quick
    size = (24 << 20) if quick else (256 << 20)  # text appended to r
    segment = (4 << 20) if quick else (16 << 20)
    small_cache = (2 << 20) if quick else (8 << 20)
    rounds = bench.rounds
    print(f"tiered: load average at the start {_load()}", flush=True)
    sw = SeaweedS3(os.path.join(bench.work, "seaweed"))
    sw.start()
    stall = counting = None
    data, mnt = bench.dirs("tiered")
    base = base_tree(bench)
    try:
        sw.create_bucket()
        stall = StallProxy(sw.s3)

        def opts(endpoint: str, cache: int = 2 * size, interval: int = 200) -> list[str]:
            return ["remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={sw.bucket}",
                    f"logfs.remote.s3.endpoint={endpoint}", "log.segment.bytes=1048576",
                    f"remote.log.manager.task.interval.ms={interval}", "log.segment.delete.delay.ms=0",
                    f"logfs.remote.cache.bytes={cache}"]

        # -- writes and append latencies, through the stalling proxy ---------------------------------------
        mount_tree(data, mnt, opts(stall.endpoint), sw.env())
        r, t = f"{mnt}/r/0", f"{mnt}/t/0"
        for topic, seg in (("r", segment), ("t", 1 << 20)):
            os.mkdir(f"{mnt}/{topic}")
            for key, value in (("remote.storage.enable", "true"), ("local.retention.bytes", str(2 << 20)),
                               ("segment.bytes", str(seg))):
                subprocess.run(["setfattr", "-n", f"user.logfs.config.{key}", "-v", value, f"{mnt}/{topic}"],
                               check=True)

        def caught_up(part: str, most: int):
            return lambda: int(getx(part, "segment_count")) <= most

        timed_shell(f"head -c {size} {bench.lines} | head -n -1 >> {r}")
        timed_shell(f"head -c {size // 8} {bench.lines} | head -n -1 >> {t}")
        wait_for(caught_up(r, 1), 900, "the upload of r")
        wait_for(caught_up(t, 3), 600, "the upload of t's first batch")
        row = {"mb": size >> 20, "segment_mb": segment >> 20, "rounds": rounds,
               "p99_ms_idle": _p99_ms(bench.append_latencies(t, 2000))}
        timed_shell(f"head -c {size // 4} {bench.lines} | head -n -1 >> {t}")
        row["p99_ms_store_up_uploading"] = _p99_ms(bench.append_latencies(t, 2000))
        wait_for(caught_up(t, 3), 600, "the upload of t's second batch")
        sw.stop()
        timed_shell(f"head -c {4 << 20} {bench.lines} | head -n -1 >> {t}")
        row["p99_ms_store_down"] = _p99_ms(bench.append_latencies(t, 2000))
        sw.start()
        stall.stalled = True
        timed_shell(f"head -c {4 << 20} {bench.lines} | head -n -1 >> {t}")
        row["p99_ms_store_slow"] = _p99_ms(bench.append_latencies(t, 2000))
        stall.stalled = False
        wait_for(caught_up(t, 3), 600, "the uploads after the outage")
        for k in ("store_up_uploading", "store_down", "store_slow"):
            row[f"ratio_{k}"] = row[f"p99_ms_{k}"] / row["p99_ms_idle"]
        row["target_ratio_max"] = 2.0

        log_start = int(getx(r, "log_start_offset"))
        local_start = int(getx(r, "local_log_start_offset"))
        tiered_text = int(getx(r, f"position.{local_start}"))
        total = os.stat(r).st_size
        unmount(mnt, data)
        with open(os.path.join(data, "r-0", "logfs-remote", "manifest.json")) as f:
            segments = [s for s in json.load(f)["segments"] if s["next_offset"] <= local_start]
        keys = [s["objects"]["log"]["key"] for s in segments]
        stored = sum(s["size"] for s in segments)
        assert segments and segments[0]["base_offset"] == log_start, (log_start, segments[:1])
        row["tiered_text_mb"] = tiered_text / 1e6
        row["tiered_stored_mb"] = stored / 1e6

        # -- sequential reads, straight to the store --------------------------------------------------------
        direct = opts(sw.endpoint, interval=600_000)
        from logfs.remote.s3 import S3Store

        with aws_env(sw):
            store = S3Store(sw.bucket, endpoint=sw.endpoint)

        def store_gets() -> float:
            start = time.perf_counter()
            got = sum(len(store.get_bytes(key)) for key in keys)
            took = time.perf_counter() - start
            assert got == stored, (got, stored)
            return took

        def dd(bs: str, count: int, skip: int = 0) -> float:
            return timed_shell(f"dd if={r} of=/dev/null bs={bs} count={count} skip={skip} "
                               "iflag=count_bytes,skip_bytes status=none")

        def cold_mount(tree: str = ROOT, cache: int = 2 * size, endpoint: str = sw.endpoint) -> None:
            if mounted_at(mnt):
                unmount(mnt, data)
            clear_blocks(data)
            drop_caches()
            mount_tree(data, mnt, opts(endpoint, cache=cache, interval=600_000), sw.env(), tree)

        times: dict[str, list[float]] = {}

        def keep(name: str, seconds: float) -> None:
            times.setdefault(name, []).append(seconds)

        for _ in range(rounds):
            drop_caches()
            keep("store_cold", store_gets())
            keep("store_warm", store_gets())
            cold_mount()
            keep("1m_cold", dd("1M", tiered_text))
            keep("1m_warm", dd("1M", tiered_text))
            keep("local", dd("1M", total - tiered_text, tiered_text))
            cold_mount()
            keep("8k_cold", dd("8k", tiered_text))
            keep("8k_warm", dd("8k", tiered_text))
            unmount(mnt, data)
        best = {k: min(v) for k, v in times.items()}
        row["MBps_store_get_cold"] = stored / best["store_cold"] / 1e6
        row["MBps_store_get_warm"] = stored / best["store_warm"] / 1e6
        for k in ("1m_cold", "1m_warm", "8k_cold", "8k_warm"):
            row[f"MBps_stored_{k}"] = stored / best[k] / 1e6
            row[f"MBps_text_{k}"] = tiered_text / best[k] / 1e6
        row["MBps_text_local_1m"] = (total - tiered_text) / best["local"] / 1e6
        for k in ("1m", "8k"):
            row[f"ratio_{k}_cold_vs_store_cold"] = best["store_cold"] / best[f"{k}_cold"]
            row[f"ratio_{k}_cold_vs_store_warm"] = best["store_warm"] / best[f"{k}_cold"]
            # the worst round's own ratio (its mount read against its own store GETs)
            row[f"ratio_{k}_cold_vs_store_cold_worst_round"] = min(
                s / m for s, m in zip(times["store_cold"], times[f"{k}_cold"]))
        row["target_1m"], row["target_8k"] = 0.5, 0.3

        # -- random reads, through a counting proxy ---------------------------------------------------------
        counting = CountingProxy(sw.s3)
        rng = random.Random(23)
        offsets = [rng.randrange(log_start, local_start) for _ in range(RANDOM_READS)]

        def random_reads(tree: str) -> tuple[int, int, list[float]]:
            cold_mount(tree, endpoint=counting.endpoint)
            time.sleep(1)  # the mount's first tiering pass (manifest, listing) is not counted
            counting.reset()
            took = []
            fd = os.open(r, os.O_RDONLY)
            try:
                for offset in offsets:
                    start = time.perf_counter()
                    pos = int(os.getxattr(fd, f"user.logfs.position.{offset}"))  # (the descriptor's view)
                    got = os.pread(fd, 100, pos)
                    took.append(time.perf_counter() - start)
                    assert got.startswith(b'{"id":%09d,' % offset), (offset, got)  # line k is record k
            finally:
                os.close(fd)
            time.sleep(0.5)  # nothing should be in flight; anything that was is counted
            gets, fetched = counting.log_gets()
            assert counting.unparsed == 0
            unmount(mnt, data)
            return gets, fetched, took

        gets, fetched, took = random_reads(ROOT)
        row["random_reads"] = RANDOM_READS
        row["random_gets"], row["random_get_mb"] = gets, fetched / 1e6
        row["random_read_ms_median"] = statistics.median(took) * 1000
        row["random_read_ms_max"] = max(took) * 1000

        # -- the cache bound ---------------------------------------------------------------------------------
        cold_mount(cache=small_cache)
        sampler = DirSampler(os.path.join(data, "*", "logfs-remote", "blocks"))
        took_small = dd("1M", tiered_text)
        sampler.stop()
        unmount(mnt, data)
        row["cache_limit_mb"] = small_cache / 1e6
        row["cache_max_mb"] = sampler.max_all / 1e6
        row["cache_max_block_files_mb"] = sampler.max_blocks / 1e6
        row["MBps_stored_1m_cold_small_cache"] = stored / took_small / 1e6

        # -- the commit before read-ahead, same data, same store ----------------------------------------------
        if base is not None:
            gets, fetched, took = random_reads(base)
            row["random_gets_base"], row["random_get_mb_base"] = gets, fetched / 1e6
            row["random_read_ms_median_base"] = statistics.median(took) * 1000
            cold_mount(base)
            row["MBps_stored_1m_cold_base"] = stored / dd("1M", tiered_text) / 1e6
            cold_mount(base)
            row["MBps_stored_8k_cold_base"] = stored / dd("8k", tiered_text) / 1e6
            unmount(mnt, data)
        print(f"tiered: load average at the end {_load()}", flush=True)
        bench.record("tiered", **row)
    finally:
        if mounted_at(mnt):
            unmount(mnt, data)
        for proxy in (stall, counting):
            if proxy is not None:
                proxy.close()
        sw.shutdown()
        shutil.rmtree(os.path.join(bench.work, "tiered"), ignore_errors=True)

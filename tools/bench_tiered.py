"""The tiered storage scenario of tools/bench.py (``--only tiered``), against a SeaweedFS it starts itself
(tools/seaweed.py), reached through a stalling proxy for the "slow" figures.

- append p99 (one ~10-byte line per write) on a tiered partition: idle (nothing to upload), store up while a
  fresh batch of segments is uploaded, store down (S3 gateway stopped), store slow (proxy stalled);
- sequential read (``cat``) of the tiered part of the log: cold cache (cache emptied, new mount) and warm (read
  again), against the local part read the same way;
- time to first byte at a tiered offset (new mount, empty cache): ``position.<offset>`` xattr, then open, seek
  and a 100-byte read.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time

from bench import getx, mount_logfs, timed_shell, unmount, wait
from seaweed import SeaweedS3, StallProxy


def _p99_ms(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000


def tiered(bench) -> None:
    size = (24 << 20) if bench.quick else (256 << 20)
    sw = SeaweedS3(os.path.join(bench.work, "seaweed"))
    sw.start()
    proxy = None
    data, mnt = bench.dirs("tiered")
    try:
        sw.create_bucket()
        proxy = StallProxy(sw.s3)
        opts = ("remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={sw.bucket}",
                f"logfs.remote.s3.endpoint={proxy.endpoint}", "log.segment.bytes=1048576",
                "remote.log.manager.task.interval.ms=200", "log.segment.delete.delay.ms=0",
                f"logfs.remote.cache.bytes={2 * size}")
        mount_logfs(data, mnt, *opts, extra_env=sw.env())
        part = f"{mnt}/t/0"
        os.mkdir(f"{mnt}/t")
        for key, value in (("remote.storage.enable", "true"), ("local.retention.bytes", str(2 << 20))):
            subprocess.run(["setfattr", "-n", f"user.logfs.config.{key}", "-v", value, f"{mnt}/t"], check=True)

        def caught_up():
            return int(getx(part, "segment_count")) <= 3

        timed_shell(f"head -c {size} {bench.lines} | head -n -1 >> {part}")
        wait(caught_up, 600, "the upload of the first batch")
        row = {"mb": size >> 20, "p99_ms_idle": _p99_ms(bench.append_latencies(part, 2000))}
        timed_shell(f"head -c {size // 4} {bench.lines} | head -n -1 >> {part}")
        row["p99_ms_store_up_uploading"] = _p99_ms(bench.append_latencies(part, 2000))
        wait(caught_up, 600, "the upload of the second batch")
        sw.stop()
        timed_shell(f"head -c {4 << 20} {bench.lines} | head -n -1 >> {part}")
        row["p99_ms_store_down"] = _p99_ms(bench.append_latencies(part, 2000))
        sw.start()
        proxy.stalled = True
        timed_shell(f"head -c {4 << 20} {bench.lines} | head -n -1 >> {part}")
        row["p99_ms_store_slow"] = _p99_ms(bench.append_latencies(part, 2000))
        proxy.stalled = False
        wait(caught_up, 600, "the uploads after the outage")
        for k in ("store_up_uploading", "store_down", "store_slow"):
            row[f"ratio_{k}"] = row[f"p99_ms_{k}"] / row["p99_ms_idle"]
        row["target_ratio_max"] = 2.0

        local_start = int(getx(part, "local_log_start_offset"))
        tiered_bytes = int(getx(part, f"position.{local_start}"))
        total = os.stat(part).st_size
        unmount(mnt, data)
        shutil.rmtree(os.path.join(data, "logfs-remote-cache", "blocks"), ignore_errors=True)
        mount_logfs(data, mnt, *opts, extra_env=sw.env())
        target = local_start // 2
        start = time.perf_counter()
        pos = int(getx(part, f"position.{target}"))
        with open(part, "rb") as f:
            f.seek(pos)
            f.read(100)
        row["ttfb_ms_tiered_offset_cold"] = (time.perf_counter() - start) * 1000
        cold = timed_shell(f"head -c {tiered_bytes} {part} > /dev/null")
        warm = timed_shell(f"head -c {tiered_bytes} {part} > /dev/null")
        local = timed_shell(f"tail -c {total - tiered_bytes} {part} > /dev/null")
        row["MBps_tiered_cold"] = tiered_bytes / cold / 1e6
        row["MBps_tiered_warm"] = tiered_bytes / warm / 1e6
        row["MBps_local"] = (total - tiered_bytes) / local / 1e6
        unmount(mnt, data)
        bench.record("tiered", **row)
    finally:
        if proxy is not None:
            proxy.close()
        sw.shutdown()
        shutil.rmtree(os.path.join(bench.work, "tiered"), ignore_errors=True)

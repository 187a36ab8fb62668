"""What optional features cost on the small-write path, for tools/bench.py (``--only metrics`` and later
scenarios of the same shape): one 100-byte line per ``write()`` on an ``O_APPEND`` descriptor, one writer process,
with the feature off and on, measured in turn, best of ``rounds``, so a busy moment on a shared machine does not
land on one side only.

- ``metrics``: two mounts side by side, each with ``partitions`` partitions (so that a render has real work): one
  without metrics, one writing ``-o logfs.metrics.file`` every 250 ms (forty times the default rate). The figures
  say what the render thread takes from the request loop; the per-request counters are the same on both sides
  (they cannot be turned off), their cost is the comparison with the commit before them in docs/benchmarks.md.
- ``writer_headers``: one mount, two topics, the second with ``logfs.writer.headers=true`` (each record then
  carries the writer's pid, uid and command name, and goes through the record encoder instead of the bulk path
  and the tail-batch growth). Also the ``.log`` bytes per byte of text on each side.
"""

from __future__ import annotations

import os
import re

from logfs.testing.benchlib import line_writers, mount_logfs, unmount

LINE = 100


def _best_rates(targets: dict[str, str], lines: int, rounds: int) -> dict[str, float]:
    """{side: best lines/s} over ``rounds`` rounds, the sides measured in turn in each round."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for side, path in targets.items():
            os.sync()
            rate = lines / line_writers(path, 1, lines, LINE)
            best[side] = max(rate, best.get(side, 0.0))
    return best


def metrics(bench) -> None:
    partitions = 200 if bench.quick else 2000
    lines = 5000 if bench.quick else 40000
    interval_ms = 250
    off_data, off_mnt = bench.dirs("metrics-off")
    on_data, on_mnt = bench.dirs("metrics-on")
    prom = os.path.join(bench.work, "metrics-on", "logfs.prom")
    per_topic = partitions // 10
    mount_logfs(off_data, off_mnt, f"num.partitions={per_topic}")
    try:
        mount_logfs(on_data, on_mnt, f"num.partitions={per_topic}", f"logfs.metrics.file={prom}",
                    f"logfs.metrics.interval.ms={interval_ms}")
        try:
            for mnt in (off_mnt, on_mnt):
                for t in range(10):
                    os.mkdir(f"{mnt}/t{t}")
            best = _best_rates({"off": f"{off_mnt}/t0/0", "on": f"{on_mnt}/t0/0"}, lines, bench.rounds)
        finally:
            unmount(on_mnt, on_data)
    finally:
        unmount(off_mnt, off_data)
    with open(prom) as f:  # as written at the clean shutdown
        text = f.read()
    render = float(re.search(r"^logfs_metrics_render_duration_seconds (\S+)$", text, re.M).group(1))
    appended = int(re.search(r'^logfs_partition_appended_records_total\{topic="t0",partition="0"\} (\d+)$', text,
                             re.M).group(1))
    assert appended == lines * bench.rounds, (appended, lines)  # the file counted every write
    bench.record("metrics", partitions=partitions, lines=lines, interval_ms=interval_ms,
                 lines_per_s_off=best["off"], lines_per_s_on=best["on"], ratio_on_vs_off=best["on"] / best["off"],
                 render_ms=render * 1000, file_kb=len(text) / 1024, best_of=bench.rounds)


def writer_headers(bench) -> None:
    lines = 5000 if bench.quick else 40000
    data, mnt = bench.dirs("writer-headers")
    mount_logfs(data, mnt)
    try:
        for topic in ("off", "on"):
            os.mkdir(f"{mnt}/{topic}")
        os.setxattr(f"{mnt}/on", "user.logfs.config.logfs.writer.headers", b"true")
        best = _best_rates({"off": f"{mnt}/off/0", "on": f"{mnt}/on/0"}, lines, bench.rounds)
    finally:
        unmount(mnt, data)
    text = lines * bench.rounds * LINE
    disk = {side: sum(os.path.getsize(os.path.join(data, f"{side}-0", name))
                      for name in os.listdir(os.path.join(data, f"{side}-0")) if name.endswith(".log")) / text
            for side in ("off", "on")}
    bench.record("writer_headers", lines=lines, line_bytes=LINE, lines_per_s_off=best["off"],
                 lines_per_s_on=best["on"], ratio_on_vs_off=best["on"] / best["off"],
                 log_bytes_per_text_byte_off=disk["off"], log_bytes_per_text_byte_on=disk["on"],
                 best_of=bench.rounds)

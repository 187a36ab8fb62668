#!/usr/bin/env python3
"""Many partitions on one mount (issue 24): what each costs as their number grows.

For each count N (default 1,000, 5,000 and 20,000; N/5 topics of 5 partitions each, ``num.partitions=5``), on a
fresh DATA_DIR and mount:

- ``mkdir`` of every topic (each creates its 5 partitions), timed one by one;
- the first append to every partition (open ``O_APPEND``, one line, close), timed one by one;
- a listing: ``os.scandir`` of the root and of every topic directory, with a ``stat`` of every entry (``ls -lR``);
- a read of every partition (open, read, close), checked;
- the daemon's RSS, descriptors (``/proc/PID/fd``) and memory maps (``/proc/PID/maps`` lines) after the appends;
- a clean unmount, then the remount (timed), the daemon's RSS, descriptors and maps right after it, a read and a
  second append to every partition (checked), and the same figures again;
- the apparent size of DATA_DIR while mounted (sum of ``st_size``: what ``ls -l``, ``du --apparent-size`` and
  backups see; active segments' indexes are preallocated sparse files).

Per-partition costs are reported as means, and for the first and the last tenth of the operations, so a cost
that grows with the count shows. ``--nofile N`` runs the daemon with ``RLIMIT_NOFILE`` N (soft and hard);
by default it inherits this process's limit.

    python tools/bench_scale.py [--counts 1000,5000,20000] [--nofile N] [--json FILE] [--markdown FILE]
                                [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from logfs.testing.benchlib import PY, daemon_pid, env, machine, mounted_at, wait_for, write_report

PARTITIONS_PER_TOPIC = 5
# A clean unmount flushes every partition (an fsync each, as Kafka's shutdown): minutes for 20,000 on a slow disk.
EXIT_TIMEOUT = 900.0


def mount(data: str, mnt: str, nofile: int | None) -> float:
    """Mount (the command returns once the mount is usable); the seconds it took."""
    os.makedirs(mnt, exist_ok=True)
    def limit() -> None:  # (in the child, before exec: the daemon it starts inherits the limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    start = time.perf_counter()
    subprocess.run([PY, "-m", "logfs.cli", data, mnt, "-o", f"num.partitions={PARTITIONS_PER_TOPIC}"],
                   check=True, env=env(), preexec_fn=limit if nofile else None)
    took = time.perf_counter() - start
    if not mounted_at(mnt):
        raise RuntimeError(f"{mnt} is not mounted")
    return took


def unmount(mnt: str, data: str) -> None:
    """``fusermount3 -u``, then wait for the daemon's clean shutdown to finish."""
    pid = daemon_pid(data)
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    if pid:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), EXIT_TIMEOUT, "the daemon to exit")


def process_figures(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    soft, hard = open_limits(pid)
    return {"rss_mb": rss / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")), "maps": maps,
            "nofile_soft": soft, "nofile_hard": hard}


def cpu_s(pid: int) -> float:
    """The daemon's CPU time so far (user + system): a per-operation cost that other load on a shared machine
    changes far less than wall-clock time."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_limits(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    return -1, -1


def spread(times: list[float]) -> dict:
    """Mean, and means of the first and last tenth, in ms."""
    tenth = max(1, len(times) // 10)
    return {"mean_ms": 1000 * sum(times) / len(times), "first_tenth_ms": 1000 * sum(times[:tenth]) / tenth,
            "last_tenth_ms": 1000 * sum(times[-tenth:]) / tenth}


def apparent_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def listing(mnt: str) -> tuple[float, int]:
    """``ls -lR``: scandir of the root and every topic, a stat of every entry. (seconds, partitions seen)."""
    start = time.perf_counter()
    seen = 0
    with os.scandir(mnt) as topics:
        for topic in topics:
            topic.stat()
            with os.scandir(topic.path) as parts:
                for part in parts:
                    part.stat()
                    seen += 1
    return time.perf_counter() - start, seen


def append_all(paths: list[str], line_of) -> list[float]:
    times = []
    for i, path in enumerate(paths):
        data = line_of(i)
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        times.append(time.perf_counter() - start)
    return times


def read_all(paths: list[str], expect) -> float:
    start = time.perf_counter()
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            got = f.read()
        if got != expect(i):
            raise AssertionError(f"{path}: read {got[:80]!r}, expected {expect(i)[:80]!r}")
    return time.perf_counter() - start


def run_count(workdir: str, count: int, nofile: int | None, say) -> dict:
    base = os.path.join(workdir, f"scale-{count}")
    data, mnt = os.path.join(base, "data"), os.path.join(base, "mnt")
    os.makedirs(data)
    topics = [f"t{i:05d}" for i in range(count // PARTITIONS_PER_TOPIC)]
    paths = [os.path.join(mnt, t, str(p)) for t in topics for p in range(PARTITIONS_PER_TOPIC)]
    first = lambda i: b"first line of partition %d\n" % i  # noqa: E731
    second = lambda i: b"second line %d\n" % i  # noqa: E731
    out: dict = {"partitions": len(paths), "topics": len(topics)}
    try:
        out["mount_empty_s"] = mount(data, mnt, nofile)
        pid = daemon_pid(data)
        cpu: dict = {}  # the daemon's CPU per operation, µs
        mkdirs = []
        before = cpu_s(pid)
        for topic in topics:
            start = time.perf_counter()
            os.mkdir(os.path.join(mnt, topic))
            mkdirs.append(time.perf_counter() - start)
        cpu["mkdir_us"], before = 1e6 * (cpu_s(pid) - before) / len(topics), cpu_s(pid)
        out["mkdir"] = spread(mkdirs)
        say(f"{count}: mkdir {out['mkdir']['mean_ms']:.2f} ms per topic")
        out["first_append"] = spread(append_all(paths, first))
        cpu["first_append_us"], before = 1e6 * (cpu_s(pid) - before) / len(paths), cpu_s(pid)
        say(f"{count}: first append {out['first_append']['mean_ms']:.2f} ms per partition")
        took, seen = listing(mnt)
        if seen != len(paths):
            raise AssertionError(f"the listing showed {seen} partitions of {len(paths)}")
        cpu["listing_us"], before = 1e6 * (cpu_s(pid) - before) / len(paths), cpu_s(pid)
        out["listing_s"], out["listing_us_per_partition"] = took, 1e6 * took / len(paths)
        out["read_all_s"] = read_all(paths, first)
        cpu["read_us"] = 1e6 * (cpu_s(pid) - before) / len(paths)
        out["after_appends"] = process_figures(pid)
        say(f"{count}: after the appends {out['after_appends']}")
        start = time.perf_counter()
        unmount(mnt, data)
        out["unmount_s"] = time.perf_counter() - start
        out["remount_s"] = mount(data, mnt, nofile)
        pid = daemon_pid(data)
        cpu["remount_s"] = cpu_s(pid)  # (all of a new daemon's CPU so far: loading the store)
        out["after_remount"] = process_figures(pid)
        out["data_dir_apparent_gb"] = apparent_bytes(data) / 1e9  # (mounted: active segments' indexes preallocated)
        say(f"{count}: remount {out['remount_s']:.2f} s, then {out['after_remount']}")
        out["read_all_after_remount_s"] = read_all(paths, first)
        before = cpu_s(pid)
        out["second_append"] = spread(append_all(paths, second))
        cpu["second_append_us"] = 1e6 * (cpu_s(pid) - before) / len(paths)
        out["daemon_cpu"] = cpu
        out["read_all_after_second_append_s"] = read_all(paths, lambda i: first(i) + second(i))
        out["after_second_appends"] = process_figures(pid)
        say(f"{count}: after the second appends {out['after_second_appends']}")
        unmount(mnt, data)
    finally:
        pid = daemon_pid(data)
        if mounted_at(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        if pid:
            wait_for(lambda: not os.path.exists(f"/proc/{pid}"), EXIT_TIMEOUT, "the daemon to exit")
        shutil.rmtree(base, ignore_errors=True)
    return out


def markdown(report: dict) -> str:
    rows = report["results"]
    lines = [f"Run of {report['when']}: {report['machine']['cpus']} CPUs, kernel {report['machine']['kernel']}, "
             f"Python {report['machine']['python']}; daemon RLIMIT_NOFILE "
             f"{report['nofile'] or 'inherited'}. Per-operation costs: mean (first tenth / last tenth), ms.", "",
             "| partitions | mount (empty) s | `mkdir` per topic | first append per partition | listing µs per "
             "partition | fds / maps / RSS MB after appends | remount s | fds / maps / RSS MB after remount | "
             "second append per partition | fds / maps after it | DATA_DIR apparent GB |",
             "|" + " --- |" * 11]

    def ms(d: dict) -> str:
        return f"{d['mean_ms']:.2f} ({d['first_tenth_ms']:.2f} / {d['last_tenth_ms']:.2f})"

    def proc(d: dict, rss: bool = True) -> str:
        return f"{d['fds']:,} / {d['maps']:,}" + (f" / {d['rss_mb']:.0f}" if rss else "")

    for r in rows:
        lines.append(f"| {r['partitions']:,} | {r['mount_empty_s']:.2f} | {ms(r['mkdir'])} | {ms(r['first_append'])} | "
                     f"{r['listing_us_per_partition']:.0f} | {proc(r['after_appends'])} | {r['remount_s']:.2f} | "
                     f"{proc(r['after_remount'])} | {ms(r['second_append'])} | "
                     f"{proc(r['after_second_appends'], rss=False)} | {r['data_dir_apparent_gb']:.1f} |")
    lines += ["", "The daemon's CPU time (user + system) per operation, µs, and for loading the store at remount, s:",
              "", "| partitions | `mkdir` per topic | first append | listing, per partition | read | remount (s) | "
              "second append |", "|" + " --- |" * 7]
    for r in rows:
        c = r["daemon_cpu"]
        lines.append(f"| {r['partitions']:,} | {c['mkdir_us']:,.0f} | {c['first_append_us']:.0f} | "
                     f"{c['listing_us']:.0f} | {c['read_us']:.0f} | {c['remount_s']:.2f} | "
                     f"{c['second_append_us']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1000,5000,20000", help="partition counts (multiples of 5)")
    parser.add_argument("--nofile", type=int, default=None, help="the daemon's RLIMIT_NOFILE (soft and hard)")
    parser.add_argument("--workdir", default=None, help="scratch directory on the disk to measure")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    workdir = args.workdir or tempfile.mkdtemp(prefix="logfs-bench-scale-", dir="/var/tmp")
    os.makedirs(workdir, exist_ok=True)
    results = []
    try:
        for count in counts:
            results.append(run_count(workdir, count, args.nofile, lambda s: print(s, flush=True)))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {"machine": machine(),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nofile": args.nofile, "results": results}
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Several log directories, measured (issue 35's acceptance).

    python tools/bench_log_dirs.py [--size-mb 1024] [--rounds 3] [--workdir DIR] [--json F] [--markdown F]

- **move**: a partition of ``--size-mb`` in the first directory is moved to the second (``setfattr -n
  user.logfs.log_dir``) while one writer appends a line to it with a ``write()`` every 2 ms: the append latency
  p50/p99/max while idle (the same writer, the same partition, before the move) against during the move, and
  the move's duration, for each pacing of the copy: logfs's default (``logfs.move.disk.share`` 0.2), unthrottled
  (share 1: Kafka's default), and Kafka's byte-rate throttle (``--throttle-mb``). Target: p99 during the move
  within 2x of idle.
- **faulted**: the second directory is on faultfs (the test suite's fault-injecting passthrough, run as a program:
  tools import nothing of the tests); four writers append to partitions of the first directory (``cat`` of a
  64 MiB file each, fsync at the end) while the second is healthy, then after every write below it fails with EIO
  (one append to its partition makes logfs see it), in the same mount. Target: the first directory's throughput
  within the noise.

Both directories of the move are on the same disk here (one disk on this machine): the copy competes with the
appends for it, which is the harder case. Prints one line per figure and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time

from logfs.testing.benchlib import (
    PY, append_file, env, fmt, machine, make_lines, met, mount_logfs, mounted_at, table, unmount, wait_for,
    write_report,
)


LINE = b'{"id":000000000,"user":"u00000","event":"click","payload":"pppppppppppppppppppppppppppppp"}\n'


def _latencies(path: str, stop: threading.Event, out: list[float], period_s: float = 0.002) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        while not stop.is_set():
            start = time.perf_counter()
            os.write(fd, LINE)
            out.append(time.perf_counter() - start)
            time.sleep(period_s)
    finally:
        os.close(fd)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def pacings(throttle_mb: int) -> dict[str, list[str]]:
    """How a move is paced, by name: the mount options of each."""
    return {"logfs's default (a fifth of the disk's time)": [],
            "unthrottled (Kafka's default)": ["logfs.move.disk.share=1"],
            f"throttled at {throttle_mb} MB/s": ["logfs.move.disk.share=1",
                                                f"replica.alter.log.dirs.io.max.bytes.per.second={throttle_mb * 1000000}"]}


def move_round(work: str, size_mb: int, pacing: str, options: list[str]) -> dict:
    d1, d2, mnt = (os.path.join(work, n) for n in ("disk1", "disk2", "mnt"))
    for d in (d1, d2, mnt):
        os.makedirs(d, exist_ok=True)
    source = f"{d1},{d2}"
    mount_logfs(source, mnt, "num.partitions=1", *options)
    try:
        os.mkdir(os.path.join(mnt, "t"))
        part = os.path.join(mnt, "t", "0")
        data = os.path.join(work, "data.txt")
        make_lines(data, size_mb << 20)
        append_file(data, part, fsync=True)
        os.unlink(data)
        idle: list[float] = []
        stop = threading.Event()
        writer = threading.Thread(target=_latencies, args=(part, stop, idle))
        writer.start()
        time.sleep(10)
        stop.set()
        writer.join()
        during: list[float] = []
        stop = threading.Event()
        writer = threading.Thread(target=_latencies, args=(part, stop, during))
        writer.start()
        start = time.perf_counter()
        os.setxattr(part, "user.logfs.log_dir", d2.encode())  # starts it (it runs in the background)
        wait_for(lambda: not _moving(part), 3600, "the move")
        took = time.perf_counter() - start
        stop.set()
        writer.join()
        assert os.getxattr(part, "user.logfs.log_dir").decode() == d2
        size = int(os.getxattr(part, "user.logfs.size_bytes"))
    finally:
        unmount(mnt, source)
    return {"pacing": pacing, "idle_p50_ms": _pct(idle, 0.5), "idle_p99_ms": _pct(idle, 0.99), "idle_max_ms": _pct(idle, 1.0),
            "move_p50_ms": _pct(during, 0.5), "move_p99_ms": _pct(during, 0.99), "move_max_ms": _pct(during, 1.0),
            "move_s": took, "move_mb_s": size / took / 1e6, "appends_during": len(during), "bytes": size}


def _throughput(mnt: str, topics: list[str], src: str, size: int) -> float:
    """MB/s of one ``cat`` per partition, all at once."""
    threads = [threading.Thread(target=append_file, args=(src, os.path.join(mnt, t, "0"), True)) for t in topics]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(topics) * size / (time.perf_counter() - start) / 1e6


def _faultfs(source: str, mnt: str, control: str) -> None:
    """The rig's fault-injecting passthrough (logfs.testing.faultfs) as a daemon of its own: ``source`` seen at
    ``mnt``, driven through the unix socket ``control``."""
    os.makedirs(source, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([PY, "-m", "logfs.testing.faultfs", source, mnt + "/", "--control", control], check=True, env=env())
    wait_for(lambda: mounted_at(mnt) and os.path.exists(control), 15, "faultfs")


def _fail_everything(control: str) -> None:
    """Every write, fsync, create, mkdir and rename below the faultfs mount fails with EIO from now on."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(control)
        sock.sendall(json.dumps({"cmd": "add", "op": ["write", "fsync", "create", "mkdir", "rename"], "path": "",
                                 "errno": "EIO", "count": -1}).encode() + b"\n")
        reply = json.loads(sock.makefile("rb").readline())
        assert reply.get("ok"), reply


def faulted_round(work: str) -> dict:
    d1, lower, d2, mnt = (os.path.join(work, n) for n in ("disk1", "lower2", "disk2", "mnt"))
    control = os.path.join(work, "faultfs.sock")
    for d in (d1, mnt):
        os.makedirs(d, exist_ok=True)
    _faultfs(lower, d2, control)
    source = f"{d1},{d2}"
    src = os.path.join(work, "chunk.txt")
    size = 64 << 20
    make_lines(src, size)
    size = os.path.getsize(src)
    try:
        mount_logfs(source, mnt, "num.partitions=1")
        try:
            topics = [f"a{i}" for i in range(8)]  # placed alternately: a0 disk1, a1 disk2, ...
            for t in topics:
                os.mkdir(os.path.join(mnt, t))
            first = [t for t in topics if os.getxattr(os.path.join(mnt, t, "0"), "user.logfs.log_dir").decode()
                     == d1][:4]
            second = [t for t in topics if t not in first]
            healthy = _throughput(mnt, first, src, size)
            _fail_everything(control)
            try:
                with open(os.path.join(mnt, second[0], "0"), "ab") as f:
                    f.write(b"x\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                pass
            wait_for(lambda: _offline(os.path.join(mnt, second[1], "0")), 10, "the second directory to go offline")
            faulted = _throughput(mnt, first, src, size)
        finally:
            unmount(mnt, source)
    finally:
        subprocess.run(["fusermount3", "-u", d2], check=False)
        os.unlink(src)
    return {"healthy_mb_s": healthy, "faulted_mb_s": faulted, "ratio": faulted / healthy}


def _moving(path: str) -> bool:
    try:
        os.getxattr(path, "user.logfs.future_log_dir")
        return True
    except OSError:
        return False


def _offline(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError:
        return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--throttle-mb", type=int, default=200,
                    help="each round moves three times: with logfs's default pacing, unthrottled, and with "
                         "replica.alter.log.dirs.io.max.bytes.per.second at this MB/s")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", choices=["move", "faulted"], default=None)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    base = args.workdir or tempfile.mkdtemp(prefix="logfs-bench-dirs-", dir="/var/tmp")
    report: dict = {"machine": machine(), "size_mb": args.size_mb, "move": [], "faulted": []}
    for r in range(args.rounds):
        if args.only in (None, "move"):
            for pacing, options in pacings(args.throttle_mb).items():
                work = os.path.join(base, f"move{r}")
                res = move_round(work, args.size_mb, pacing, options)
                subprocess.run(["rm", "-rf", work], check=False)
                print(f"move round {r}: " + ", ".join(f"{k} {fmt(v)}" for k, v in res.items()), flush=True)
                report["move"].append(res)
        if args.only in (None, "faulted"):
            work = os.path.join(base, f"faulted{r}")
            res = faulted_round(work)
            subprocess.run(["rm", "-rf", work], check=False)
            print(f"faulted round {r}: " + ", ".join(f"{k} {fmt(v)}" for k, v in res.items()), flush=True)
            report["faulted"].append(res)
    rows = []
    for how in pacings(args.throttle_mb):
        moves = [m for m in report["move"] if m["pacing"] == how]
        if not moves:
            continue
        ratios = [m["move_p99_ms"] / m["idle_p99_ms"] for m in moves]
        rows.append([f"append p99 during a move / idle, {how}",
                     f"{fmt(statistics.median(ratios))} ({fmt(min(ratios))}-{fmt(max(ratios))})", "<= 2",
                     met(statistics.median(ratios) <= 2)])
        rows.append([f"move of {args.size_mb} MB, {how}: MB/s",
                     fmt(statistics.median(m["move_mb_s"] for m in moves)), "", ""])
    if report["faulted"]:
        ratios = [f["ratio"] for f in report["faulted"]]
        rows.append(["first directory's append MB/s, second offline / healthy",
                     f"{fmt(statistics.median(ratios))} ({fmt(min(ratios))}-{fmt(max(ratios))})", "within noise",
                     ""])
    text = "\n".join(table(["figure", "result", "target", "met?"], rows)) + "\n"
    write_report(report, text, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

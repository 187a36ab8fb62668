"""Readers that stay open, soaked (issue 32's acceptance): a mount with retention every few seconds, writers
appending to a few partitions, and a reader holding each partition open from the start for the whole run (a log
shipper: it reads what is there, sleeps, reads again; ``fstat`` between reads, as ``tail -f``).

    python tools/soak_readers.py [--minutes 10] [--partitions 4] [--rate-kb 256]

Every few seconds it samples the daemon's descriptors, those on deleted files in DATA_DIR, and the bytes those
pin; at the end it checks that every reader saw every line of its partition once, in order, and prints the
samples' summary and a markdown row for docs/benchmarks.md. The bound: what a reader has not read yet plus a small
margin (a few segments); descriptors flat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEGMENT = 256 * 1024


def daemon_pid(data: str) -> int:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                args = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if os.fsencode(data) in args and any(b"logfs" in a for a in args):
                return int(name)
    raise RuntimeError("no daemon")


def sample(pid: int, data: str) -> tuple[int, int, int]:
    """(descriptors, of them on deleted files under data, bytes those files hold)."""
    total = deleted = pinned = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        total += 1
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(data) and target.endswith(" (deleted)"):
                deleted += 1
                pinned += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            pass
    return total, deleted, pinned


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate-kb", type=int, default=256, help="appended per partition per second")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="logfs-soak-")
    data, mnt = os.path.join(work, "data"), os.path.join(work, "mnt")
    os.makedirs(mnt)
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-m", "logfs.cli", data, mnt, "-o",
                    f"log.segment.bytes={SEGMENT},log.retention.check.interval.ms=2000,"
                    f"log.segment.delete.delay.ms=0,num.partitions={args.partitions}"], check=True, env=env)
    stop = threading.Event()
    errors: list[str] = []
    seen: dict[int, list[bytes]] = {}
    written: dict[int, int] = {}
    try:
        os.mkdir(os.path.join(mnt, "s"))
        os.setxattr(os.path.join(mnt, "s"), "user.logfs.config.retention.bytes", str(4 * SEGMENT).encode())
        pid = daemon_pid(data)

        def writer(p: int) -> None:
            fd = os.open(os.path.join(mnt, "s", str(p)), os.O_WRONLY | os.O_APPEND)
            n, per_tick = 0, max(1, args.rate_kb * 1024 // 10 // 100)
            while not stop.is_set():
                os.write(fd, b"".join(b"%d-%09d-%s\n" % (p, n + i, b"y" * 85) for i in range(per_tick)))
                n += per_tick
                written[p] = n
                time.sleep(0.1)
            os.close(fd)

        def reader(p: int) -> None:
            got, rest = [], b""
            with open(os.path.join(mnt, "s", str(p)), "rb", buffering=0) as f:
                while True:
                    done = stop.is_set()
                    while chunk := f.read(1 << 20):
                        lines = (rest + chunk).split(b"\n")
                        rest = lines.pop()
                        got.extend(lines)
                    if done:
                        break
                    os.fstat(f.fileno())
                    time.sleep(0.5)
            seen[p] = got

        threads = [threading.Thread(target=reader, args=(p,)) for p in range(args.partitions)]
        threads += [threading.Thread(target=writer, args=(p,)) for p in range(args.partitions)]
        for t in threads:
            t.start()
        samples = []
        started = time.monotonic()
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(5)
            samples.append((time.monotonic() - started,) + sample(pid, data))
            s = samples[-1]
            print(f"{s[0]:7.0f} s  descriptors {s[1]:4d}  on deleted files {s[2]:3d}  pinned {s[3] / 1e6:7.2f} MB  "
                  f"log start {os.getxattr(os.path.join(mnt, 's', '0'), 'user.logfs.log_start_offset').decode()}",
                  flush=True)
        stop.set()
        for t in threads:
            t.join(120)
        time.sleep(1)
        for p in range(args.partitions):
            got = seen.get(p, [])
            first = int(got[0].split(b"-")[1]) if got else 0
            want = [b"%d-%09d-%s" % (p, i, b"y" * 85) for i in range(first, written.get(p, 0))]
            if got != want:
                errors.append(f"partition {p}: read {len(got)} lines, expected {len(want)} in order")
        half = samples[len(samples) // 2:]
        fds = [s[1] for s in half]
        pinned = max(s[3] for s in samples)
        deleted = max(s[2] for s in samples)
        print(f"\n| soak | result |\n| --- | --- |\n| run | {args.minutes:g} min, {args.partitions} partitions, "
              f"{args.rate_kb} KiB/s each, retention.bytes {4 * SEGMENT >> 10} KiB, segments {SEGMENT >> 10} KiB |\n"
              f"| descriptors in the second half | {min(fds)}-{max(fds)} |\n"
              f"| most descriptors on deleted files / bytes they pinned | {deleted} / {pinned / 1e6:.2f} MB |\n"
              f"| every line read once, in order | {'yes' if not errors else 'no: ' + '; '.join(errors)} |")
    finally:
        stop.set()
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        time.sleep(1)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

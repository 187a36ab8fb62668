"""Readers that stay open on a tiered partition (CONTRACT section 3; issue 42), against a real SeaweedFS: the soak
of tools/soak_readers.py --tiered, made small enough for the suite and its windows wide.

Writers append to partitions of 4 KiB segments, tiered every 50 ms, each local copy deleted once in the bucket,
none of them cached by the mount (every tiered read is a fetch, in a worker thread): a ``write()`` of a line or
three (it grows the active segment's last batch in place), then at once one of 50 lines (it rolls the segment
once it is half full), again and again. Monitors stat the partitions and ask their log end offsets in a loop, so
that the request thread is never idle. Meanwhile:

- GNU ``tail -f`` from the start, and a reader of its own that polls as ``tail -f`` does (read until a read returns
  nothing, ``fstat``, sleep), follow each partition: every line once, in order, and each poll that reaches the end
  of the file has every line appended before the poll began (``log_end_offset``, asked of the descriptor first);
- shippers resuming from a stored offset open the partition again and again, seek (``position.`` asked of the
  descriptor) to a line that is only in the bucket, and read from there to the end: in a worker thread, while
  the writers append and roll. A read there that left its cursor inside a batch grown meanwhile stopped its reader
  for good (issue 42: a ``tail -f`` 94 lines short of the end, and nothing more).

Once the writers stop, every reader reaches the last line within seconds.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

from harness import wait_for
from remote_store import s3_tiering

SEGMENT = 4096
DURATION = 20.0  # seconds of writing
PARTITIONS = 2
SHIPPERS = 3  # per partition
MONITORS = 2


def opts(seaweed, prefix):
    return s3_tiering(seaweed, prefix, segment_bytes=SEGMENT, interval_ms=50) + ("logfs.remote.cache.bytes=1",)


def line(p: int, n: int) -> bytes:
    return b"%d-%08d-%s" % (p, n, b"x" * (10 + n * 7 % 40))


class Follower:
    """One reader checking every line as it reads; ``problems`` says what went wrong, and where."""

    def __init__(self, name: str, path: str, p: int):
        self.name, self.path, self.p = name, path, p
        self.expect: int | None = None
        self.rest = b""
        self.position = 0
        self.problems: list[str] = []

    def check(self, data: bytes) -> bool:
        rows = (self.rest + data).split(b"\n")
        self.rest = rows.pop()
        for row in rows:
            if self.expect is None:
                self.expect = int(row.split(b"-")[1])
            if row != line(self.p, self.expect):
                self.problems.append(f"{self.name}: at offset {self.expect}, byte {self.position}: got {row[:40]!r}")
                return False
            self.expect += 1
        return True

    def poll(self, fd: int) -> bool | None:
        """Read until a read returns nothing: whether that reached every line there when it began (None: a wrong
        line)."""
        end = int(os.getxattr(fd, "user.logfs.log_end_offset"))
        while chunk := os.read(fd, 1 << 20):
            self.position += len(chunk)
            if not self.check(chunk):
                return None
        return self.expect is None or self.expect >= end

    def facts(self, fd: int) -> str:
        x = {n: os.getxattr(self.path, "user.logfs." + n).decode()
             for n in ("log_end_offset", "local_log_start_offset", "remote_log_end_offset", "segment_count")}
        return f"fstat size {os.fstat(fd).st_size}, position {self.position}, next line {self.expect}, {x}"


def test_readers_that_stay_open_on_a_tiered_partition(mount_logfs, creds):
    fs = mount_logfs(*opts(creds, "readers-" + uuid.uuid4().hex[:8]), f"num.partitions={PARTITIONS}",
                     foreground=True)
    os.mkdir(fs.path("t"))
    for key, value in (("remote.storage.enable", "true"), ("local.retention.bytes", "0"),
                       ("retention.bytes", str(256 * SEGMENT))):
        os.setxattr(fs.path("t"), f"user.logfs.config.{key}", value.encode())
    stop, done = threading.Event(), threading.Event()
    written = [0] * PARTITIONS
    problems: list[str] = []
    shipped = [0]

    def recorded(fn):
        """``fn`` in a thread of its own: an exception it raises (an EIO...) is the test's failure."""
        def run(*args):
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{fn.__name__}{args}: {exc!r}")
        return run

    @recorded
    def writer(p: int) -> None:
        fd = os.open(fs.path("t", p), os.O_WRONLY | os.O_APPEND)
        try:
            while not stop.is_set():
                for k in (1 + written[p] % 3, 50):  # (a growth in place, then a roll when half full)
                    os.write(fd, b"".join(line(p, written[p] + i) + b"\n" for i in range(k)))
                    written[p] += k
                time.sleep(0.05)
        finally:
            os.close(fd)

    @recorded
    def follower(p: int) -> None:  # from the start, as tail -f: read to the end, fstat, sleep, read again
        r = Follower(f"reader {p}", fs.path("t", p), p)
        fd = os.open(r.path, os.O_RDONLY)
        try:
            r.expect, short = 0, 0
            while not r.problems:
                complete = r.poll(fd)
                short = 0 if complete else short + 1
                if short == 3:  # (a read racing an append may end one short; three in a row is a stall)
                    r.problems.append(f"{r.name}: stalled: {r.facts(fd)}")
                if done.is_set() and r.expect >= written[p]:
                    break
                os.fstat(fd)
                time.sleep(0.05)
        finally:
            problems.extend(r.problems)
            os.close(fd)

    @recorded
    def shipper(p: int, k: int) -> None:  # opens again and again, resuming from a line only in the bucket
        while not stop.is_set() and not problems:
            r = Follower(f"shipper {p}.{k}", fs.path("t", p), p)
            fd = os.open(r.path, os.O_RDONLY)
            try:
                local = int(os.getxattr(r.path, "user.logfs.local_log_start_offset"))
                start = int(os.getxattr(fd, "user.logfs.log_start_offset"))
                r.expect = max(start, local - 20)
                r.position = int(os.getxattr(fd, f"user.logfs.position.{r.expect}"))
                os.lseek(fd, r.position, os.SEEK_SET)
                short = polls = 0
                while True:  # two polls at least, and it ends only on a poll that got everything
                    complete = r.poll(fd)
                    if complete is None:
                        break  # (a wrong line: its problem says where)
                    polls += 1
                    short = 0 if complete else short + 1
                    if short == 3:
                        r.problems.append(f"{r.name}: stalled: {r.facts(fd)}")
                        break
                    if complete and polls >= 2:
                        break
                    time.sleep(0.02)
                shipped[0] += 1
            finally:
                problems.extend(r.problems)
                os.close(fd)

    @recorded
    def monitor() -> None:  # (a monitoring agent: the request thread is never idle)
        while not stop.is_set():
            for p in range(PARTITIONS):
                os.stat(fs.path("t", p))
                os.getxattr(fs.path("t", p), "user.logfs.log_end_offset")

    tails = []
    for p in range(PARTITIONS):
        out = open(fs.root / f"tail{p}.out", "wb")
        tails.append((subprocess.Popen(["tail", "-n", "+1", "-s", "0.05", "-f", fs.path("t", p)], stdout=out),
                      out))
    threads = [threading.Thread(target=writer, args=(p,)) for p in range(PARTITIONS)]
    threads += [threading.Thread(target=follower, args=(p,)) for p in range(PARTITIONS)]
    threads += [threading.Thread(target=shipper, args=(p, k)) for p in range(PARTITIONS) for k in range(SHIPPERS)]
    threads += [threading.Thread(target=monitor) for _ in range(MONITORS)]
    try:
        for t in threads:
            t.start()
        time.sleep(DURATION)
    finally:
        stop.set()
        for t in threads[:PARTITIONS]:
            t.join(30)
        done.set()
        for t in threads[PARTITIONS:]:
            t.join(30)
        try:
            for p, (tail, out) in enumerate(tails):
                size = sum(len(line(p, n)) + 1 for n in range(written[p]))
                wait_for(lambda: (fs.root / f"tail{p}.out").stat().st_size >= size or problems, 15,
                         what=f"tail -f of t/{p} to show the last line")
        finally:
            for tail, out in tails:
                tail.terminate()
                tail.wait(10)
                out.close()
    assert not problems, problems
    assert not any(t.is_alive() for t in threads), "a reader did not reach the end"
    for p in range(PARTITIONS):
        assert (fs.root / f"tail{p}.out").read_bytes() == b"".join(line(p, n) + b"\n" for n in range(written[p]))
    assert int(fs.getx("t/0", "remote_segment_count")) > 10 and int(fs.getx("t/0", "local_log_start_offset")) > 0
    assert shipped[0] > 20  # (opens that read from the bucket up to the end)

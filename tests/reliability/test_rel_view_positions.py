"""Open, ask, seek, read under load (issue 42; CONTRACT section 4, "Positions belong to a view").

Readers loop: open a partition, ask the descriptor (``fgetxattr``) for its log start, its end and the
``position.<N>`` of a random offset in between, seek there and read one line, which must be record N's (or, on the
compacted topic, the first record kept after N, whose own offset the line names, and which
``offset.<position>`` names too). Meanwhile writers append, retention runs every 100 ms, DeleteRecords moves the
start of one partition, and the cleaner compacts a keyed topic. Every read is checked; the profile sets the
duration (SHORT: 40 s, LONG: 300 s).
"""

from __future__ import annotations

import os
import random
import threading
import time

from rel_helpers import record_stats, scale

PX = "user.logfs."
KEYS = 40


def plain_line(i: int) -> bytes:
    return b"r%09d-%s\n" % (i, b"p" * (i % 97))


def keyed_line(i: int) -> bytes:
    return b"k%02d=v%09d-%s\n" % (i % KEYS, i, b"c" * (i % 31))


def offset_of(line: bytes) -> int:
    """The offset a line says it has (both formats carry it as 9 digits after 'r' or '=v')."""
    if line.startswith(b"r"):
        return int(line[1:10])
    return int(line[line.index(b"=v") + 2:][:9])


def test_open_ask_seek_read_under_retention_delete_records_and_compaction(mount_logfs, profile):
    seconds = scale(40, 300)
    fs = mount_logfs("log.segment.bytes=16384", "log.index.interval.bytes=1024", "log.retention.check.interval.ms=100",
                     "log.segment.delete.delay.ms=0", "log.cleaner.backoff.ms=100",
                     "log.cleaner.min.cleanable.ratio=0.05", "num.partitions=2")
    os.mkdir(fs.path("t"))  # two partitions: 0 under retention.bytes, 1 under DeleteRecords too
    os.setxattr(fs.path("t"), PX + "config.retention.bytes", b"131072")
    os.mkdir(fs.path("k"))
    os.setxattr(fs.path("k"), PX + "config.cleanup.policy", b"compact")
    os.setxattr(fs.path("k"), PX + "config.logfs.key.separator", b"=")
    files = {fs.path("t", 0): plain_line, fs.path("t", 1): plain_line, fs.path("k", 0): keyed_line}
    stop = threading.Event()
    failures: list[str] = []
    counts = {"reads": 0, "appended": 0, "delete_records": 0}

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 (every failure is reported by the test)
                import traceback; failures.append(f"{fn.__name__}: {exc!r} {traceback.format_exc()}")
                stop.set()
        return threading.Thread(target=run, name=fn.__name__)

    def writer():
        fds = {path: os.open(path, os.O_WRONLY | os.O_APPEND) for path in files}
        nexts = dict.fromkeys(files, 0)
        try:
            while not stop.is_set():
                for path, make in files.items():
                    first = nexts[path]
                    os.write(fds[path], b"".join(make(i) for i in range(first, first + 200)))
                    nexts[path] = first + 200
                    counts["appended"] += 200
                time.sleep(0.005)
        finally:
            for fd in fds.values():
                os.close(fd)

    def delete_records():
        path = fs.path("t", 1)
        while not stop.wait(0.15):
            end = int(os.getxattr(path, PX + "log_end_offset"))
            start = int(os.getxattr(path, PX + "log_start_offset"))
            if end - start > 3000:
                os.setxattr(path, PX + "log_start_offset", str(end - 2000).encode())
                counts["delete_records"] += 1

    def reader(seed: int):
        rnd = random.Random(seed)
        paths = list(files)
        while not stop.is_set():
            path = rnd.choice(paths)
            fd = os.open(path, os.O_RDONLY)
            try:
                start = int(os.getxattr(fd, PX + "log_start_offset"))
                end = int(os.getxattr(fd, PX + "log_end_offset"))
                if end <= start:
                    continue
                time.sleep(rnd.random() * 0.01)  # (room for retention and the cleaner between open and read)
                n = rnd.randrange(start, end)
                pos = int(os.getxattr(fd, PX + f"position.{n}"))
                os.lseek(fd, pos, os.SEEK_SET)
                got = os.read(fd, 256)
                line = got[: got.index(b"\n") + 1]
                found = offset_of(line)
                make = files[path]
                if line != make(found):
                    failures.append(f"{path}: position.{n}={pos} read {got[:80]!r}")
                elif path.endswith("/k/0") and found < n:
                    failures.append(f"{path}: position.{n} led to the earlier record {found}")
                elif not path.endswith("/k/0") and found != n:
                    failures.append(f"{path}: position.{n} led to record {found}")
                elif int(os.getxattr(fd, PX + f"offset.{pos}")) != found:
                    failures.append(f"{path}: offset.{pos} is not {found}")
                counts["reads"] += 1
            finally:
                os.close(fd)

    threads = [guard(writer), guard(delete_records)] + [guard(lambda s=s: reader(s)) for s in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    # The load did what it was there for: retention, DeleteRecords and the cleaner all ran under the readers.
    starts = {path: int(os.getxattr(path, PX + "log_start_offset")) for path in files}
    record_stats("view_positions", seconds=seconds, **counts)
    assert not failures, failures[:10]
    assert counts["reads"] > 1000, counts
    assert starts[fs.path("t", 0)] > 0 and counts["delete_records"] > 3, (starts, counts)
    compacted = os.path.getsize(fs.path("k", 0))
    appended_k = counts["appended"] // 3
    assert compacted < sum(len(keyed_line(i)) for i in range(appended_k)) // 2, "the cleaner compacted k"

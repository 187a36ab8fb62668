"""CONTRACT section 4, "Positions belong to a view", through a real mount: ``fgetxattr`` on an open descriptor
answers in that descriptor's view, so open, ask, seek, read gives the record asked for, whatever retention,
DeleteRecords or compaction did between the open and the question; ``getxattr`` on the path answers for a new open.
(The stress run of the same is tests/reliability/test_rel_view_positions.py.)"""

from __future__ import annotations

import os
import re
import threading
import time

from harness import wait_for

PX = "user.logfs."


def line(i: int) -> bytes:
    return b"rec-%06d-%s\n" % (i, b"v" * (i % 23))


def fget(fd_or_path, key: str) -> int:
    return int(os.getxattr(fd_or_path, PX + key))


def check_descriptor(fd: int, offsets) -> None:
    for n in offsets:
        pos = fget(fd, f"position.{n}")
        want = line(n)
        os.lseek(fd, pos, os.SEEK_SET)
        assert os.read(fd, len(want)) == want, n
        assert fget(fd, f"offset.{pos}") == n


def test_descriptors_opened_at_different_starts(mount_logfs):
    fs = mount_logfs("log.segment.bytes=2048", "log.index.interval.bytes=256", "log.retention.check.interval.ms=50",
                     "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("t"))
    p = fs.path("t", 0)
    with open(p, "ab") as f:
        f.write(b"".join(line(i) for i in range(600)))
    fds = []
    try:
        for start in (0, 150, 320, 480):
            if start:
                os.setxattr(p, PX + "log_start_offset", str(start).encode())  # DeleteRecords
            fds.append((os.open(p, os.O_RDONLY), start))
        # Retention deletes the segments wholly below the start meanwhile (every 50 ms).
        wait_for(lambda: fget(p, "segment_count") < 20, 10, what="retention of the deleted segments")
        inodes = {os.fstat(fd).st_ino for fd, _ in fds}
        assert len(inodes) == 4, "each log start a descriptor was opened at is an inode of its own"
        for fd, start in fds:
            assert fget(fd, "log_start_offset") == start
            assert fget(fd, "time.0") == start
            assert fget(fd, f"position.{start}") == 0
            check_descriptor(fd, range(start, 600, 7))
        # The path answers in the view a new open gets.
        assert fget(p, "log_start_offset") == 480
        assert fget(p, "position.480") == 0
        # Appended since the opens: positioned in every descriptor's view.
        with open(p, "ab") as f:
            f.write(b"".join(line(i) for i in range(600, 650)))
        for fd, _ in fds:
            check_descriptor(fd, range(600, 650, 3))
            assert fget(fd, "position.650") == os.fstat(fd).st_size
    finally:
        for fd, _ in fds:
            os.close(fd)


def test_descriptor_after_compaction(mount_logfs):
    fs = mount_logfs("log.segment.bytes=1024", "log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.01",
                     "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("k"))
    os.setxattr(fs.path("k"), PX + "config.cleanup.policy", b"compact")
    os.setxattr(fs.path("k"), PX + "config.logfs.key.separator", b"=")
    p = fs.path("k", 0)
    written = [b"key%d=value-%05d\n" % (i % 5, i) for i in range(400)]
    fd = os.open(p, os.O_RDONLY)
    try:
        with open(p, "ab") as f:
            for i in range(0, 400, 20):
                f.write(b"".join(written[i:i + 20]))
                f.flush()
        wait_for(lambda: os.path.getsize(p) < len(b"".join(written)) // 2, 20, what="compaction")
        for n in range(0, 400, 9):
            pos = fget(fd, f"position.{n}")
            os.lseek(fd, pos, os.SEEK_SET)
            assert os.read(fd, len(written[n])) == written[n], n
        # The path positions the view a new open gets (the cleaner may still be at work: asked until an open
        # right after the question has the same view).
        for _attempt in range(20):
            pos = fget(p, "position.399")
            new = os.open(p, os.O_RDONLY)
            try:
                if fget(new, "position.399") == pos:
                    assert pos < len(b"".join(written)) // 2  # (the compacted view's)
                    assert os.pread(new, len(written[399]), pos) == written[399]
                    break
            finally:
                os.close(new)
        else:
            raise AssertionError("the path's position.399 never matched a new open's")
    finally:
        os.close(fd)


def test_open_racing_delete_records_reads_its_own_view(mount_logfs, tmp_path):
    """Opens while DeleteRecords moves the start as fast as it can: every open succeeds (an open that lands on an
    inode whose view moved gets a twin of the view of the readers there, or, with none to copy, ESTALE, and the
    kernel looks the name up again), and each descriptor answers in its own view."""
    prom = tmp_path / "logfs.prom"
    fs = mount_logfs("log.segment.bytes=4096", "log.retention.check.interval.ms=20", "log.segment.delete.delay.ms=0",
                     f"logfs.metrics.file={prom}", "logfs.metrics.interval.ms=100")
    os.mkdir(fs.path("t"))
    p = fs.path("t", 0)
    with open(p, "ab") as f:
        f.write(b"".join(line(i) for i in range(3000)))
    stop = threading.Event()

    failed = []

    def move_start():
        start = 0
        try:
            while not stop.is_set() and start < 2900:
                start += 3
                os.setxattr(p, PX + "log_start_offset", str(start).encode())
        except OSError as exc:
            failed.append(exc)

    mover = threading.Thread(target=move_start)
    held = []
    mover.start()
    try:
        while mover.is_alive() and len(held) < 400:
            fd = os.open(p, os.O_RDONLY)
            held.append(fd)  # (kept open: the next opens race handles open on the name's inode)
            start = fget(fd, "log_start_offset")
            check_descriptor(fd, (start, min(start + 50, 2999)))
    finally:
        stop.set()
        mover.join()
        for fd in held:
            os.close(fd)
    assert not failed
    assert len(held) > 20
    # (How often an open met a moved view and was retried by the kernel: printed, as a race decides it.)
    time.sleep(0.3)
    stale = re.search(r'logfs_fuse_errors_total\{[^}]*errno="ESTALE"[^}]*\} (\S+)', prom.read_text())
    print(f"{len(held)} opens, ESTALE answered (and retried by the kernel): {stale.group(1) if stale else 0}")

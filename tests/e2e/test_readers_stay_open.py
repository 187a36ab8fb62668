"""Readers that stay open (CONTRACT section 3): ``tail -f`` and log shippers across retention.

- GNU ``tail -f`` across many retention events shows every line once, in order, with no "file truncated" and no
  stall: the handle's inode keeps its own size, which never shrinks (the name gets a new inode when retention
  moves the log start while handles are open), and every segment rolled after the open stays pinned for the
  handle until it has read it.
- ``tail -F`` follows the name: after a retention event it says the file was replaced and prints the new file from
  its start (the lines retention kept, again), as after a log rotation whose new file holds the old lines.
- A handle holds no disk that retention freed beyond what it has not read yet: the daemon's descriptors on
  deleted segment files stay bounded while a reader keeps a partition open for the whole run.
- Seeking back into a range the handle passed and retention removed gives EIO or the right bytes, never others.
"""

from __future__ import annotations

import errno
import contextlib
import os
import subprocess
import time

from harness import deleted_files_held, wait_for

OPTS = ("log.segment.bytes=2048", "log.retention.check.interval.ms=20", "log.segment.delete.delay.ms=0")


def line(i: int) -> bytes:
    return b"line-%06d-%s" % (i, b"x" * 30)


def _retention_topic(fs, retention_bytes: int = 4096) -> None:
    os.mkdir(fs.path("t"))
    os.setxattr(fs.path("t"), "user.logfs.config.retention.bytes", str(retention_bytes).encode())


def _append_counting_starts(fs, first: int, n: int, *, pause_every: int = 0, fd: int | None = None) -> set[int]:
    """Append lines ``first``..``first + n - 1`` one write each (through ``fd`` if given, kept open); returns the log
    start offsets seen meanwhile."""
    starts = set()
    own = fd is None
    if own:
        fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(first, first + n):
            os.write(fd, line(i) + b"\n")
            if i % 10 == 0:
                starts.add(int(os.getxattr(fs.path("t", 0), "user.logfs.log_start_offset")))
            if pause_every and i % pause_every == 0:
                time.sleep(0.01)
    finally:
        if own:
            os.close(fd)
    return starts


def _deleted_fds(pid: int) -> tuple[int, int]:
    """(descriptors of the daemon on deleted files of its data directory, their bytes)."""
    count = size = 0
    for fd, path in deleted_files_held(pid).items():
        if "/data/" in path:
            try:
                size += os.stat(f"/proc/{pid}/fd/{fd}").st_size
            except OSError:
                continue
            count += 1
    return count, size


def _deleted_names(pid: int) -> list[str]:
    return sorted(os.path.basename(path) for path in deleted_files_held(pid).values())


@contextlib.contextmanager
def _tail(fs, follow: str, name: str):
    """``tail -n +1 FOLLOW`` of t/0 while the block runs: its output and errors in fs.root/NAME.out, NAME.err."""
    out = fs.root / f"{name}.out"
    err = fs.root / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        tail = subprocess.Popen(["tail", "-n", "+1", "-s", "0.05", follow, fs.path("t", 0)], stdout=o, stderr=e)
    try:
        yield out, err
    finally:
        tail.terminate()
        tail.wait(10)


def test_tail_f_shows_every_line_once_across_retention(mount_logfs):
    fs = mount_logfs(*OPTS)
    _retention_topic(fs)
    with _tail(fs, "-f", "tail") as (out, err):
        n = 10000
        starts = _append_counting_starts(fs, 0, n, pause_every=200)
        assert len(starts) >= 50, f"only {len(starts)} retention events"
        wait_for(lambda: out.stat().st_size >= n * (len(line(0)) + 1), 90, what="tail -f to show every line")
    shown = out.read_bytes().splitlines()
    assert shown == [line(i) for i in range(n)]  # every line once, in order
    assert b"truncated" not in err.read_bytes(), err.read_bytes()


def test_tail_F_says_the_file_was_replaced(mount_logfs):
    fs = mount_logfs(*OPTS)
    _retention_topic(fs)
    with _tail(fs, "-F", "tailF") as (out, err):
        _append_counting_starts(fs, 0, 1000, pause_every=100)
        wait_for(lambda: b"replaced" in err.read_bytes(), 10, what="tail -F to follow the new file")
        time.sleep(0.5)
    shown = out.read_bytes().splitlines()
    # Every line it prints is one that was written; after a replacement it starts again at the new log start,
    # so the retained lines show again (the README says so); it ends with the file's last line.
    assert set(shown) <= {line(i) for i in range(1000)}
    assert shown[-1] == line(999)
    assert b"has been replaced" in err.read_bytes()


def test_an_open_reader_pins_no_freed_disk_beyond_a_margin(mount_logfs):
    fs = mount_logfs(*OPTS)
    _retention_topic(fs)
    pid = fs.pid()
    _append_counting_starts(fs, 0, 200)
    writer = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)  # a writer that keeps its file open, too
    with open(fs.path("t", 0), "rb", buffering=0) as reader, os.fdopen(writer, "wb", buffering=0):
        got = b""
        peak = (0, 0)
        first = 200
        for _ in range(30):  # a shipper: reads what is there, the writer goes on, retention goes on
            _append_counting_starts(fs, first, 200, fd=writer)
            first += 200
            while chunk := reader.read(65536):
                got += chunk
            time.sleep(0.05)  # (a retention pass)
            os.fstat(reader.fileno())  # (what tail -f does between reads)
            count, size = _deleted_fds(pid)
            peak = max(peak, (count, size))
        # Everything it read is what was written from the log start at its open, once, in order.
        lines = got.splitlines()
        opened_at = int(lines[0].split(b"-")[1])
        assert lines == [line(i) for i in range(opened_at, first)]
        # Retention ran all along; the handle pins at most a few segments it has not left yet.
        assert int(os.getxattr(fs.path("t", 0), "user.logfs.log_start_offset")) > 5000
        # (~110 segments were deleted under it; at a check, retention may just have deleted a few that the reader
        # had passed, or the writer had written, and not yet let go: a segment's four files, 2 KiB of .log and its
        # trimmed indexes, each; at most one retention pass's worth)
        assert peak[0] <= 32 and peak[1] <= 8 * (2048 + 2048), peak
        # What the last retention pass removed is let go at the reader's next read or fstat (tail -f's poll), and
        # at the writer's next write (or the next roll, whoever writes)
        written = [first]

        def let_go() -> bool:
            os.write(writer, line(written[0]) + b"\n")
            written[0] += 1
            os.fstat(reader.fileno())
            return _deleted_fds(pid)[0] <= 4

        wait_for(let_go, 5, interval=0.1, what=f"freed segments to be let go ({_deleted_names(pid)})")


def test_seeking_back_into_a_removed_range_is_eio_or_the_same_bytes(mount_logfs):
    fs = mount_logfs(*OPTS)
    _retention_topic(fs)
    _append_counting_starts(fs, 0, 300)
    with open(fs.path("t", 0), "rb", buffering=0) as reader:
        text = reader.read(1 << 20)
        _append_counting_starts(fs, 300, 600)
        wait_for(lambda: int(os.getxattr(fs.path("t", 0), "user.logfs.log_start_offset")) > 300, 10,
                 what="retention past what was read")
        rest = b""
        while chunk := reader.read(65536):
            rest += chunk
        lines = (text + rest).splitlines()
        opened_at = int(lines[0].split(b"-")[1])
        assert lines == [line(i) for i in range(opened_at, 900)]
        for position in (0, len(text) // 2, len(text) - 10):
            reader.seek(position)
            try:
                again = reader.read(100)
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
            else:
                assert again == (text + rest)[position: position + 100]

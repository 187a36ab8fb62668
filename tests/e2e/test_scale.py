"""Reads at any position resolve through the indexes: after a million lines, a read (and the xattrs locating
it) in the middle costs about what it costs at the start, not a scan of the segment."""

from __future__ import annotations

import os
import time

N = 1_000_000
CHUNK = 100_000
REPS = 7


def line(i: int) -> bytes:
    return b"%07d\n" % i


def best_of(fn, reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def test_million_lines_middle_read_costs_like_start(fs):
    os.mkdir(fs.path("big"))
    path = fs.path("big", 0)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for start in range(0, N, CHUNK):
            data = b"".join(line(i) for i in range(start, start + CHUNK))
            assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    assert os.stat(path).st_size == N * 8
    assert fs.getx("big/0", "log_end_offset") == str(N)

    middle = 543_210
    pos = int(os.getxattr(path, "user.logfs.position.%d" % middle))
    assert pos == middle * 8
    assert os.getxattr(path, "user.logfs.offset.%d" % (pos + 3)) == b"%d" % middle

    def read_at(at: int) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, 100, at)
        finally:
            os.close(fd)

    got = read_at(pos)
    assert got.startswith(line(middle)), got[:16]
    assert got == b"".join(line(i) for i in range(middle, middle + 13))[:100]
    assert read_at(0) == b"".join(line(i) for i in range(13))[:100]
    last = (N - 1) * 8
    assert read_at(last) == line(N - 1)

    read_at(0), read_at(pos)  # warm both paths
    t_start = best_of(lambda: read_at(0))
    t_middle = best_of(lambda: read_at(pos))
    t_end = best_of(lambda: read_at(last))
    assert t_middle <= 20 * t_start, f"middle read {t_middle * 1e3:.2f} ms vs start {t_start * 1e3:.2f} ms"
    assert t_end <= 20 * t_start, f"end read {t_end * 1e3:.2f} ms vs start {t_start * 1e3:.2f} ms"

    x_start = best_of(lambda: os.getxattr(path, "user.logfs.position.1"))
    x_middle = best_of(lambda: os.getxattr(path, "user.logfs.position.%d" % middle))
    o_middle = best_of(lambda: os.getxattr(path, "user.logfs.offset.%d" % pos))
    assert x_middle <= 20 * x_start, f"position xattr {x_middle * 1e3:.2f} ms vs {x_start * 1e3:.2f} ms"
    assert o_middle <= 20 * x_start, f"offset xattr {o_middle * 1e3:.2f} ms vs {x_start * 1e3:.2f} ms"

    # stat stays cheap too (no counting of the view), and is exact.
    s = best_of(lambda: os.stat(path))
    assert s <= 20 * t_start, f"stat {s * 1e3:.2f} ms vs read {t_start * 1e3:.2f} ms"

"""Reads at any position resolve through the indexes: after a million lines, a read (and the xattrs locating it)
in the middle and at the end returns exactly the lines there. What such a read costs against one at the start is a
benchmark, not a test: ``python tools/bench.py --only read_at_offset`` (a big log against a small one)."""

from __future__ import annotations

import os

N = 1_000_000
CHUNK = 100_000


def line(i: int) -> bytes:
    return b"%07d\n" % i


def test_million_lines_read_anywhere_through_the_indexes(mount):
    os.mkdir(mount.path("big"))
    path = mount.path("big", 0)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for start in range(0, N, CHUNK):
            data = b"".join(line(i) for i in range(start, start + CHUNK))
            assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    assert os.stat(path).st_size == N * 8
    assert mount.getx("big/0", "log_end_offset") == str(N)

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

    # stat is exact without counting the view.
    assert os.stat(path).st_size == N * 8

"""DeleteRecords through the mount (CONTRACT section 4): ``setfattr -n user.logfs.log_start_offset -v N``.

N up to the log end offset (-1: the log end offset) moves the log start; at or below the current start it changes
nothing; past the log end offset, or not a number, it is EINVAL; on a read-only mount, EROFS. When it returns the
new start is in ``log-start-offset-checkpoint`` (so a kill -9 right after never brings the records back); new
opens, xattrs and the Spark source's reader start at N; open handles keep their view; retention's own mechanism
deletes the segments wholly below N.
"""

from __future__ import annotations

import errno
import os

from harness import expect_errno, wait_for

from logfs.storage.local.reader import PartitionReader

OPTS = ("log.segment.bytes=2048", "log.retention.check.interval.ms=50", "log.segment.delete.delay.ms=0")
START = "user.logfs.log_start_offset"


def lines(prefix: str, n: int, first: int = 0) -> list[bytes]:
    return [b"%s-%05d-%s" % (prefix.encode(), i, b"d" * 20) for i in range(first, first + n)]


def checkpointed_start(fs, topic: str = "t", partition: int = 0) -> int | None:
    text = (fs.data / "log-start-offset-checkpoint").read_text().split("\n")[2:]
    found = {tuple(line.split()[:2]): int(line.split()[2]) for line in text if line.strip()}
    return found.get((topic, str(partition)))


def test_delete_records_moves_the_log_start_durably(mount_logfs):
    fs = mount_logfs(*OPTS)
    os.mkdir(fs.path("t"))
    path = fs.path("t", 0)
    written = lines("a", 500)
    fs.append("t/0", b"".join(line + b"\n" for line in written))
    segments = int(fs.getx("t/0", "segment_count"))
    assert segments > 5
    with open(path, "rb", buffering=0) as held:
        os.setxattr(path, START, b"120")
        # Durable before the call returned: the checkpoint names the new start.
        assert checkpointed_start(fs) == 120
        assert int(fs.getx("t/0", "log_start_offset")) == 120
        assert fs.read("t/0").splitlines() == written[120:]
        assert os.stat(path).st_size == sum(len(line) + 1 for line in written[120:])
        assert fs.getx("t/0", "position.120") == "0"
        # The Spark source's reader (no daemon, the checkpoint and the segments) starts there too.
        reader = PartitionReader(str(fs.data), "t", 0)
        assert reader.offsets() == (120, 500)
        # An open handle keeps the view it opened.
        assert held.read().splitlines() == written
    # Retention deletes the segments wholly below the new start.
    wait_for(lambda: int(fs.getx("t/0", "segment_count")) < segments, 60, what="retention to delete segments")
    assert fs.read("t/0").splitlines() == written[120:]
    # At or below the current start: nothing changes.
    os.setxattr(path, START, b"50")
    os.setxattr(path, START, b"120")
    assert int(fs.getx("t/0", "log_start_offset")) == 120
    # A kill -9 right after the call never brings the records back.
    os.setxattr(path, START, b"300")
    fs.kill9()
    fs.mount(*OPTS)
    assert int(fs.getx("t/0", "log_start_offset")) == 300
    assert fs.read("t/0").splitlines() == written[300:]
    # -1: the log end offset; appends go on from there.
    os.setxattr(path, START, b"-1")
    assert os.stat(path).st_size == 0
    assert int(fs.getx("t/0", "log_start_offset")) == int(fs.getx("t/0", "log_end_offset")) == 500
    more = lines("b", 3, 500)
    fs.append("t/0", b"".join(line + b"\n" for line in more))
    assert fs.read("t/0").splitlines() == more
    fs.remount()
    assert fs.read("t/0").splitlines() == more


def test_delete_records_inside_a_batch_shows_from_that_record(mount_logfs):
    fs = mount_logfs()
    os.mkdir(fs.path("t"))
    written = lines("c", 50)
    fs.append("t/0", b"".join(line + b"\n" for line in written))  # one write: one batch
    os.setxattr(fs.path("t", 0), START, b"17")
    assert fs.read("t/0").splitlines() == written[17:]
    assert fs.getx("t/0", "offset.0") == "17"


def test_delete_records_errors(mount_logfs):
    fs = mount_logfs()
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"x\ny\n")
    path = fs.path("t", 0)
    expect_errno(errno.EINVAL, os.setxattr, path, START, b"3")  # past the log end offset
    for bad in (b"abc", b"", b"1.5", b"-2", b" 1x", "\u00b2".encode()):
        expect_errno(errno.EINVAL, os.setxattr, path, START, bad)
    expect_errno(errno.EPERM, os.removexattr, path, START)
    expect_errno(errno.EPERM, os.setxattr, path, "user.logfs.log_end_offset", b"1")
    assert fs.read("t/0") == b"x\ny\n"
    fs.remount("ro")
    expect_errno(errno.EROFS, os.setxattr, path, START, b"1")
    assert fs.read("t/0") == b"x\ny\n"

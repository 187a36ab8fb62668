"""A disk that returns errors (issue 30, CONTRACT section 12): one regression test per defect found on 931e199.

DATA_DIR is a real FUSE layer that fails chosen operations (logfs/testing/faultfs.py); a real logfs daemon is
mounted over it and driven with syscalls. What the contract promises:

- an I/O error takes the data directory offline: its partitions answer EIO until the next mount, the daemon lives,
  the metrics say so, and the error is logged once;
- a full disk (ENOSPC) fails the write alone, and appends go on once there is room;
- writers see only EIO or ENOSPC, whatever the disk said;
- a failed fsync is never followed by a successful one over the same bytes;
- after the fault clears, a remount comes up on its first start with every acknowledged line once, in order.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from harness import append_synced
from rel_helpers import expect_errno, parse_partition_dir_records, wait_for

# Logged as ERRORs by design: a directory taken offline (storage/failure.py, the manager at shutdown), and a
# write the disk refused (fuse/errors.py).
pytestmark = [pytest.mark.mount, pytest.mark.daemon_errors(
    "is offline", "was offline", "No space left on device", "Disk quota exceeded")]

SMALL = ["log.segment.bytes=4096", "log.index.interval.bytes=256", "log.segment.delete.delay.ms=0",
         "log.retention.check.interval.ms=100", "log.flush.offset.checkpoint.interval.ms=100"]


def _read(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines()


def _offsets_once_in_order(directory) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of a partition directory's .log files (an independent parser), asserting each offset appears
    once and offsets increase across the segments."""
    records = parse_partition_dir_records(str(directory))
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets)), "an offset appears twice, or out of order, on disk"
    return records


def _daemon_alive(fs) -> bool:
    try:
        os.kill(fs.pid(), 0)
        return True
    except (ProcessLookupError, AssertionError):
        return False


def _remount_first_try(fs, *options):
    """Unmount (or find the daemon gone), then mount once: it must come up on its first start."""
    fs.unmount()
    fs.mount(*(options or fs.options))


# -- defect 3: a failed read of an index is EIO for that request, never SIGBUS for the daemon ------------------
def test_an_index_read_error_is_eio_and_the_daemon_lives(faultfs, mount_logfs):
    fs = mount_logfs(*SMALL, name=".", foreground=True)
    os.mkdir(fs.path("t"))
    lines = [b"line %05d %s" % (i, b"x" * 60) for i in range(400)]
    append_synced(fs.path("t", 0), lines)
    when = int(time.time() * 1000)
    fs.remount(foreground=True)  # a new daemon: its index pages are read from the disk again
    faultfs.fail("read", r"\.timeindex$", errno="EIO", count=-1)
    # On 931e199 the lookup read a memory-mapped .timeindex page: SIGBUS, the daemon died (ENOTCONN here).
    expect_errno(errno.EIO, os.getxattr, fs.path("t", 0), f"user.logfs.time.{when - 60_000}")
    assert _daemon_alive(fs), fs.stderr()
    # The directory is offline: the partition answers EIO (reads, appends, fsync), the daemon serves on.
    expect_errno(errno.EIO, _read, fs.path("t", 0))
    expect_errno(errno.EIO, append_synced, fs.path("t", 0), [b"more"])
    assert os.listdir(fs.path()) == ["t"]
    assert "is offline" in fs.stderr() and "Traceback" not in fs.stderr()
    faultfs.clear()
    _remount_first_try(fs)
    assert _read(fs.path("t", 0)) == lines
    append_synced(fs.path("t", 0), [b"after"])
    assert _read(fs.path("t", 0)) == lines + [b"after"]


# -- defect 1: a failed rename in the cleaner's swap never duplicates records -------------------------------
def test_a_failed_swap_rename_leaves_each_record_once(faultfs, mount_logfs):
    opts = SMALL + ["log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.01"]
    fs = mount_logfs(*opts, name=".", foreground=True)
    os.mkdir(fs.path("k"))
    os.setxattr(fs.path("k"), "user.logfs.config.cleanup.policy", b"compact")
    os.setxattr(fs.path("k"), "user.logfs.config.logfs.key.separator", b"=")
    # The index renames of the swap (.cleaned -> .swap) come after the commit point (the .log's rename).
    faultfs.fail("rename", r"\.viewindex\.cleaned$", errno="EIO", nth=1)
    latest: dict[bytes, bytes] = {}  # each key's value in the last batch whose fsync returned 0
    unacked: dict[bytes, bytes] = {}  # ... in the batch whose write or fsync failed (it may or may not be there)
    try:
        for round_ in range(200):
            batch = [b"key%02d=v%d-%d" % (i % 20, round_, i) for i in range(20)]
            unacked = dict(line.split(b"=", 1) for line in batch)
            append_synced(fs.path("k", 0), batch)
            latest.update(unacked)
            unacked = {}
            if faultfs.injected():
                break
    except OSError as exc:
        assert exc.errno == errno.EIO, exc  # the directory went offline between two appends
    wait_for(lambda: faultfs.injected(), 30, what="the swap's rename to fail")
    wait_for(lambda: "is offline" in fs.stderr(), 10, what="the directory to go offline")
    assert _daemon_alive(fs)
    expect_errno(errno.EIO, append_synced, fs.path("k", 0), [b"key00=late"])
    faultfs.clear()
    fs.kill9()
    fs.mount(*opts, foreground=True)
    records = _offsets_once_in_order(faultfs.source / "k-0")
    values: dict[bytes, bytes] = {}
    for _, key, value in records:
        values[key] = value
    for key, value in latest.items():  # the newest acknowledged value of every key survived, and is the newest
        assert values.get(key) in (value, unacked.get(key)), (key, values.get(key), value)
    shown = _read(fs.path("k", 0))
    assert len(shown) == len(set(shown)), "a line shows twice"


# -- defect 2: a failed retirement rename never brings a superseded segment back -----------------------------
def test_a_failed_rename_to_deleted_keeps_the_log_in_order(faultfs, mount_logfs):
    opts = SMALL + ["log.retention.bytes=16384"]
    fs = mount_logfs(*opts, name=".", foreground=True)
    os.mkdir(fs.path("r"))
    faultfs.fail("rename", r"\.log\.deleted$", errno="EIO", nth=1)
    written = []  # lines whose fsync returned 0
    attempted = []  # lines written, including the batch whose write or fsync failed
    try:
        for i in range(300):
            batch = [b"r%06d %s" % (i * 10 + j, b"y" * 80) for j in range(10)]
            attempted += batch
            append_synced(fs.path("r", 0), batch)
            written += batch
            if faultfs.injected():
                break
            time.sleep(0.005)
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
    wait_for(lambda: faultfs.injected(), 30, what="retention's rename to fail")
    wait_for(lambda: "is offline" in fs.stderr(), 10, what="the directory to go offline")
    faultfs.clear()
    fs.unmount()  # a clean unmount of an offline directory: no clean-shutdown marker
    assert not (faultfs.source / ".kafka_cleanshutdown").exists()
    fs.mount(*opts, foreground=True)
    _offsets_once_in_order(faultfs.source / "r-0")
    shown = _read(fs.path("r", 0))
    # A run of what was written, in order, holding every acknowledged line retention kept (and perhaps lines of
    # the batch whose fsync failed: written, never acknowledged, and never twice).
    assert shown and shown[0] in attempted, shown[:1]
    first = attempted.index(shown[0])
    assert shown == attempted[first: first + len(shown)], "the log is not a run of what was written, in order"
    assert first + len(shown) >= len(written), "an acknowledged line is missing at the end"


# -- defect 4: an append whose undo fails never wedges the partition ----------------------------------------
def test_a_failed_undo_takes_the_partition_offline_and_a_remount_heals_it(faultfs, mount_logfs):
    # (one segment: no roll, and the index's disk blocks are reserved already, so the failing append opens nothing
    # before its rollback)
    opts = ["log.index.interval.bytes=256"]
    fs = mount_logfs(*opts, name=".", foreground=True)
    os.mkdir(fs.path("u"))
    first = [b"first %04d %s" % (i, b"z" * 40) for i in range(200)] + [b"pre " + b"z" * 400]
    append_synced(fs.path("u", 0), first)  # (the last line is over index.interval.bytes: the next append adds entries)
    # The next append's .log write fails with ENOSPC, and from now on every open of an index and every truncation
    # of a .log fails with EIO. On 931e199 the rollback of the failed append opened each index to write it back,
    # raised half-way, and every later append failed ("non-increasing offset index entry") until a remount. Now
    # the indexes' descriptors are open already: the append is undone completely (the next ones work), or, if the
    # undo fails (a truncation, or a roll that opens a new index), the directory goes offline (EIO) until a remount.
    faultfs.fail("write", r"\.log$", errno="ENOSPC", nth=1)
    faultfs.fail("open", r"\.(index|timeindex|viewindex)$", errno="EIO", count=-1)
    fd = os.open(fs.path("u", 0), os.O_WRONLY | os.O_APPEND)
    try:
        outcomes = []
        for i in range(30):
            try:
                os.write(fd, b"second %04d %s\n" % (i, b"w" * 300))
                outcomes.append(0)
            except OSError as exc:
                outcomes.append(exc.errno)
    finally:
        os.close(fd)
    assert set(outcomes) <= {0, errno.ENOSPC, errno.EIO}, outcomes
    assert errno.ENOSPC in outcomes or errno.EIO in outcomes
    faultfs.clear()
    stderr = fs.stderr()
    assert "non-increasing" not in stderr and "below last entry" not in stderr, stderr[-3000:]
    fs.unmount()
    fs.mount(*opts, foreground=True)
    shown = _read(fs.path("u", 0))
    assert shown[: len(first)] == first
    append_synced(fs.path("u", 0), [b"after the fault"])
    assert _read(fs.path("u", 0))[-1] == b"after the fault"
    _offsets_once_in_order(faultfs.source / "u-0")


# -- defect 5: a remount whose first fsync of an index reports an old error comes up, rebuilding it -----------
def test_a_remount_rebuilds_an_index_whose_fsync_fails(faultfs, mount_logfs):
    # (the default checkpoint interval: no recovery point is written before the kill, so every segment is
    # recovered, and its rebuilt indexes fsynced)
    opts = ["log.segment.bytes=4096", "log.index.interval.bytes=256"]
    fs = mount_logfs(*opts, name=".", foreground=True)
    os.mkdir(fs.path("f"))
    lines = [b"f %05d %s" % (i, b"q" * 50) for i in range(300)]
    append_synced(fs.path("f", 0), lines)
    fs.kill9()
    # The first fsync of each index after the restart reports an error (as Linux does for a write-back that
    # failed before it): recovery fsyncs the indexes it rebuilt.
    faultfs.fail("fsync", r"\.(index|timeindex|viewindex)$", errno="EIO", count=1)
    fs.mount(*opts, foreground=True)  # on 931e199: "cannot open DATA_DIR: Input/output error", exit 1
    assert faultfs.injected(), "recovery never fsynced an index"
    assert "rebuilding its indexes" in fs.stderr()
    assert _read(fs.path("f", 0)) == lines
    append_synced(fs.path("f", 0), [b"more"])
    assert _read(fs.path("f", 0)) == lines + [b"more"]


# -- defect 6: a roll whose new index cannot be created fails that write, and the next ones work -------------
def test_a_roll_that_cannot_create_its_time_index_is_enospc_then_appends_go_on(faultfs, mount_logfs):
    fs = mount_logfs(*SMALL, name=".", foreground=True)
    os.mkdir(fs.path("o"))
    # Lines of ~100 bytes, and every 20th of ~2,000: a long line rolls a segment that short ones would not, so
    # after the failed roll the next short lines fit the segment that failed to roll (on 931e199 it had been
    # sealed before the new one failed, and appending to it failed with "mmap length is greater than file size").
    faultfs.fail("create", r"\.timeindex$", errno="ENOSPC", nth=1)
    fd = os.open(fs.path("o", 0), os.O_WRONLY | os.O_APPEND)
    acked, failures = [], []
    try:
        for i in range(200):
            line = b"o %05d %s\n" % (i, b"p" * (2000 if i % 20 == 19 else 100))
            try:
                os.write(fd, line)
                acked.append(line[:-1])
            except OSError as exc:
                failures.append(exc.errno)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert faultfs.injected(), "no roll created a time index"
    assert failures == [errno.ENOSPC], failures  # the one write, nothing after it
    assert "internal error" not in fs.stderr() and "mmap length" not in fs.stderr()
    assert _read(fs.path("o", 0)) == acked
    assert int(os.getxattr(fs.path("o", 0), "user.logfs.segment_count")) > 1
    fs.remount(foreground=True)
    assert _read(fs.path("o", 0)) == acked
    _offsets_once_in_order(faultfs.source / "o-0")


# -- defect 7: writers see EIO or ENOSPC, whatever the disk answered ----------------------------------------
@pytest.mark.parametrize("disk_errno, seen", [
    ("EFBIG", errno.EIO), ("EINVAL", errno.EIO), ("EPIPE", errno.EIO), ("EFAULT", errno.EIO),
    ("EROFS", errno.EIO), ("EAGAIN", errno.EIO), ("EDQUOT", errno.ENOSPC), ("ENOSPC", errno.ENOSPC),
])
def test_writers_see_only_eio_or_enospc(faultfs, mount_logfs, disk_errno, seen):
    fs = mount_logfs(name=".", foreground=True)
    os.mkdir(fs.path("e"))
    append_synced(fs.path("e", 0), [b"before"])
    faultfs.fail("write", r"\.log$", errno=disk_errno, nth=1)
    expect_errno(seen, append_synced, fs.path("e", 0), [b"refused"])
    faultfs.clear()
    if seen == errno.ENOSPC:  # a full disk is not a failure: the next append works
        append_synced(fs.path("e", 0), [b"after"])
        assert _read(fs.path("e", 0)) == [b"before", b"after"]
    else:  # a failing disk takes the directory offline until the next mount
        expect_errno(errno.EIO, append_synced, fs.path("e", 0), [b"after"])
        fs.unmount()
        fs.mount(foreground=True)
        assert _read(fs.path("e", 0)) in ([b"before"], [b"before", b"refused"])
        append_synced(fs.path("e", 0), [b"after"])
        assert _read(fs.path("e", 0))[-1] == b"after"


# -- fsyncgate: after a failed fsync, no later fsync of those bytes returns 0 until a remount ----------------
def test_no_fsync_succeeds_after_a_failed_one(faultfs, mount_logfs):
    metrics = faultfs.source.parent / "metrics.prom"
    opts = [f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100"]
    fs = mount_logfs(*opts, name=".", foreground=True)
    os.mkdir(fs.path("s"))
    append_synced(fs.path("s", 0), [b"durable"])
    fd = os.open(fs.path("s", 0), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"covered by the failed fsync\n")
        faultfs.fail("fsync", r"\.log$", errno="EIO", nth=1)
        expect_errno(errno.EIO, os.fsync, fd)
        faultfs.clear()
        # Linux may have dropped the pages and would answer 0 now; logfs never does.
        for _ in range(3):
            expect_errno(errno.EIO, os.fsync, fd)
        expect_errno(errno.EIO, os.write, fd, b"more\n")
    finally:
        os.close(fd)
    wait_for(lambda: _offline_metric(metrics) == "1", 10, what="the metrics to show the directory offline")
    assert fs.stderr().count("ERROR logfs.storage.failure") == 1  # logged once
    fs.unmount()
    assert not (faultfs.source / ".kafka_cleanshutdown").exists()
    fs.mount(*opts, foreground=True)
    shown = _read(fs.path("s", 0))
    assert shown in ([b"durable"], [b"durable", b"covered by the failed fsync"]), shown
    wait_for(lambda: _offline_metric(metrics) == "0", 10, what="the metrics to show the directory online again")


def _offline_metric(path) -> str | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("logfs_log_dir_offline{")]
    return values[0] if values else None

"""Several log directories over the disk-faults harness (CONTRACT section 12, issue 35).

- **One directory faulted while the others are driven**: a log directory on faultfs fails every write; its
  partitions answer EIO, the metrics say which directory is offline, and the other directory's partitions take
  appends, reads and new partitions as before. A remount after the fault clears brings it back, every line whose
  fsync returned there once.
- **Each crash point of a move, and each failed syscall of it**: both directories on faultfs; each step of the move
  protocol (storage/moves.py) fails with EIO (the move fails, logged; a fault of the target before the commit point
  leaves the partition serving from its source), or is held while the daemon is killed with SIGKILL. After a
  remount the partition is in exactly one directory, with no ``-future`` copy left, and holds every line written
  before the move, once, in order.
"""

from __future__ import annotations

import errno
import os
import re
import time

import pytest

from harness import append_synced
from rel_helpers import mount_over_two_dirs

pytestmark = [pytest.mark.mount, pytest.mark.daemon_errors(
    "is offline", "was offline", "Input/output error", "No space left on device",
    "clean shutdown of .* incomplete",
    r"fuse_reply_\* failed with No such file or directory")]

OPTIONS = ["num.partitions=1", "log.segment.bytes=4096", "log.index.interval.bytes=256",
           "log.flush.offset.checkpoint.interval.ms=3600000", "log.retention.check.interval.ms=3600000"]
LOG_DIR = "user.logfs.log_dir"
LINES = [f"line {i:05d} of the partition that moves".encode() for i in range(600)]  # ~6 segments


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _errno_of(fn) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return 0


def _moving(path: str) -> bool:
    """Whether a move of the partition is under way (``user.logfs.future_log_dir`` names its target)."""
    try:
        os.getxattr(path, "user.logfs.future_log_dir")
        return True
    except OSError as exc:
        assert exc.errno == errno.ENODATA, exc
        return False


def _seen(faultfs, rule_id: int) -> int:
    """Calls the faultfs rule matched so far."""
    return next(r["seen"] for r in faultfs.stats()["rules"] if r["id"] == rule_id)


def _metrics(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_one_directory_faulted_while_the_other_serves(faultfs, mount_logfs, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    faulty = faultfs.mountpoint / "d2"
    faulty.mkdir()
    metrics = tmp_path / "metrics.prom"

    def prepare(m):
        m.source = f"{plain},{faulty}"

    fs = mount_logfs("num.partitions=2", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100",
                     name="fs", prepare=prepare, foreground=True)
    os.mkdir(fs.path("t"))
    assert os.getxattr(fs.path("t", 0), LOG_DIR).decode() == str(plain)
    assert os.getxattr(fs.path("t", 1), LOG_DIR).decode() == str(faulty)
    kept = [f"kept {i}".encode() for i in range(200)]
    append_synced(fs.path("t", 0), kept)
    append_synced(fs.path("t", 1), kept)
    faultfs.fail(["write", "fsync", "create", "mkdir", "rename"], r"^d2/", errno="EIO", count=-1)
    assert _errno_of(lambda: append_synced(fs.path("t", 1), [b"lost"])) == errno.EIO
    assert _errno_of(lambda: _read(fs.path("t", 1))) == errno.EIO  # the whole directory is offline
    # The other directory goes on: appends, reads, a new topic (placed there: the only one online).
    more = [f"more {i}".encode() for i in range(2000)]
    append_synced(fs.path("t", 0), more)
    assert _read(fs.path("t", 0)) == b"".join(line + b"\n" for line in kept + more)
    os.mkdir(fs.path("u"))
    assert os.getxattr(fs.path("u", 0), LOG_DIR).decode() == str(plain)
    append_synced(fs.path("u", 0), more)

    def offline_in_metrics():
        text = _metrics(metrics) if metrics.exists() else ""
        return (f'logfs_log_dir_offline{{log_dir="{faulty}"}} 1' in text
                and f'logfs_log_dir_offline{{log_dir="{plain}"}} 0' in text)

    deadline = time.monotonic() + 10
    while not offline_in_metrics():
        assert time.monotonic() < deadline, _metrics(metrics) if metrics.exists() else "no metrics file"
        time.sleep(0.1)
    faultfs.clear()
    fs.unmount()
    assert ".kafka_cleanshutdown" in os.listdir(plain)
    assert ".kafka_cleanshutdown" not in os.listdir(faulty)  # offline: recovered at the next mount
    fs.mount(*fs.options, foreground=True)
    assert _read(fs.path("t", 1)) == b"".join(line + b"\n" for line in kept)  # every fsynced line, once
    assert _read(fs.path("t", 0)) == b"".join(line + b"\n" for line in kept + more)
    append_synced(fs.path("t", 1), [b"again"])  # back in service
    assert _read(fs.path("t", 1)).endswith(b"again\n")


# (op, path regex relative to faultfs's source, nth call, whose disk: the move's source d1 or its target d2)
FUTURE = r"^d2/t-0\.[0-9a-f]{32}-future"
STEPS = {
    "mkdir-future": ("mkdir", FUTURE + "$", 1, "d2"),
    "create-copy": ("create", FUTURE + r"/0+\.log$", 1, "d2"),
    "write-copy": ("write", FUTURE + r"/0+\.log$", 1, "d2"),
    "write-copy-later": ("write", FUTURE + r"/\d+\.timeindex$", 3, "d2"),
    "fsync-copy": ("fsync", FUTURE + r"/0+\.log$", 1, "d2"),
    "fsync-future-dir": ("fsyncdir", FUTURE + "$", 1, "d2"),
    "target-checkpoint": ("rename", r"^d2/log-start-offset-checkpoint", 1, "d2"),
    "commit-rename": ("rename", r"^d1/t-0$", 1, "d1"),
    "fsync-source-dir": ("fsyncdir", r"^d1$", 1, "d1"),
    "rename-live": ("rename", FUTURE + "$", 1, "d2"),
    "fsync-target-dir-1": ("fsyncdir", r"^d2$", 1, "d2"),
    "fsync-target-dir-3": ("fsyncdir", r"^d2$", 3, "d2"),  # (1 and 2: its checkpoints; 3: after the rename)
}
AFTER_COMMIT = {"fsync-source-dir", "rename-live", "fsync-target-dir-3"}


@pytest.mark.parametrize("variant", ["eio", "kill"])
@pytest.mark.parametrize("step", list(STEPS))
def test_each_step_of_a_move(faultfs, mount_logfs, step, variant):
    fs, d1, d2 = mount_over_two_dirs(faultfs, mount_logfs, *OPTIONS)
    os.mkdir(fs.path("t"))
    os.mkdir(fs.path("other"))  # a partition of d2 that the move never touches
    path = fs.path("t", 0)
    assert os.getxattr(path, LOG_DIR).decode() == str(d1)
    append_synced(path, LINES)
    expected = b"".join(line + b"\n" for line in LINES)
    op, regex, nth, disk = STEPS[step]
    if variant == "eio":
        rule = faultfs.fail(op, regex, errno="EIO", nth=nth)
    else:
        rule = faultfs.delay(op, regex, delay_ms=600, nth=nth)  # (long enough to kill the daemon inside it)
    os.setxattr(path, LOG_DIR, str(d2).encode())  # the move starts (in the background)
    deadline = time.monotonic() + 20
    while _seen(faultfs, rule) < nth:  # (the held or failed call has begun)
        if not _moving(path):  # ended meanwhile: by that call, or without it
            assert _seen(faultfs, rule) >= nth, f"{step}: the move never made that call"
            break
        assert time.monotonic() < deadline, f"{step}: the move never made that call"
        time.sleep(0.01)
    if variant == "kill":
        fs.kill9()  # in the middle of the step
        time.sleep(0.7)  # (faultfs completes the held call meanwhile)
    else:
        deadline = time.monotonic() + 60
        while _moving(path):
            assert time.monotonic() < deadline, f"{step}: the move did not end"
            time.sleep(0.02)
        assert re.search(r"ERROR .*moving t-0 to .* failed: .*Input/output error", fs.stderr()), fs.stderr()
        if step not in AFTER_COMMIT and disk == "d2":
            # A fault of the target before the commit point: the partition stays where it was, and serves.
            assert os.getxattr(path, LOG_DIR).decode() == str(d1)
            assert _read(path) == expected
            append_synced(path, [b"after the failed move"])
            expected += b"after the failed move\n"
            assert _errno_of(lambda: os.listdir(fs.path("other"))) == 0
        else:
            assert _errno_of(lambda: _read(path)) == errno.EIO  # its directory went offline
        fs.kill9()
    faultfs.clear()
    fs.mount(*OPTIONS, foreground=True)
    where = [d for d in (d1, d2) if (d / "t-0").is_dir()]
    assert len(where) == 1, f"{step}/{variant}: t-0 live in {where}"
    assert not [n for d in (d1, d2) for n in os.listdir(d) if re.search(r"-future$", n)], \
        f"{step}/{variant}: a -future copy survived the mount"
    assert os.getxattr(path, LOG_DIR).decode() == str(where[0])
    assert _read(path) == expected, f"{step}/{variant}: the partition after the remount"
    if variant == "eio" and step not in AFTER_COMMIT and disk == "d2":
        assert where[0] == d1
    if step in AFTER_COMMIT:
        assert where[0] == d2  # past the commit point the move completes
    append_synced(path, [b"served"])
    assert _read(path).endswith(b"served\n")


def test_a_full_target_fails_the_move_and_keeps_both_directories_online(faultfs, mount_logfs):
    """ENOSPC writing the copy is not a failing disk: the move fails, its copy is removed, the partition stays
    where it was, and the target directory stays online (its other partitions serve)."""
    fs, d1, d2 = mount_over_two_dirs(faultfs, mount_logfs, *OPTIONS)
    os.mkdir(fs.path("t"))
    os.mkdir(fs.path("other"))  # in d2
    path = fs.path("t", 0)
    append_synced(path, LINES)
    append_synced(fs.path("other", 0), [b"in the target"])
    rule = faultfs.fail("write", FUTURE + r"/0+\.log$", errno="ENOSPC", nth=1)
    os.setxattr(path, LOG_DIR, str(d2).encode())
    deadline = time.monotonic() + 30
    while _moving(path) or _seen(faultfs, rule) < 1:
        assert time.monotonic() < deadline, "the move did not end"
        time.sleep(0.02)
    assert re.search(r"ERROR .*moving t-0 to .* failed: .*No space left on device", fs.stderr()), fs.stderr()
    assert os.getxattr(path, LOG_DIR).decode() == str(d1)
    assert not [n for n in os.listdir(d2) if n.endswith("-future")]
    assert _read(fs.path("other", 0)) == b"in the target\n"  # the target is online
    append_synced(fs.path("other", 0), [b"still"])
    append_synced(path, [b"after"])
    faultfs.clear()
    os.setxattr(path, LOG_DIR, str(d2).encode())  # with room again, the move goes through
    deadline = time.monotonic() + 30
    while _moving(path):
        assert time.monotonic() < deadline, "the second move did not end"
        time.sleep(0.02)
    assert os.getxattr(path, LOG_DIR).decode() == str(d2)
    assert _read(path) == b"".join(line + b"\n" for line in LINES) + b"after\n"

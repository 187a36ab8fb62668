"""Power cuts under DATA_DIR, in CI (issues 21 and 35): what an fsync acknowledged, and what a setfattr that
returned committed, survive losing every byte that was not fsynced.

DATA_DIR is on faultfs (logfs/testing/faultfs.py) with a gate on every file, so that faultfs remembers what
was written since each file's last successful fsync; a "power cut" is the daemon's SIGKILL, then faultfs undoing
those writes (LazyFS's ``clear-cache`` model: file bytes not fsynced are lost, names are kept), then a new mount.
kill -9 alone cannot show a missing fsync: the kernel's page cache keeps what the dead process wrote.
tests/reliability/test_rel_powercut_lazyfs.py is the same idea on LazyFS, by hand, for long runs.

- DeleteRecords (``setfattr -n user.logfs.log_start_offset``, CONTRACT section 4): the new start is checkpointed
  before the call returns, so a power cut right after it never brings the deleted records back.
- Appends: every line whose fsync returned is there after the cut, once and in order, and what follows it is a
  valid prefix of what was written without an fsync.
- A move between log directories (section 12) that finished: the partition is whole in its new directory.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from harness import append_synced
from rel_helpers import mount_over_two_dirs, wait_for

pytestmark = [pytest.mark.mount, pytest.mark.daemon_errors("clean shutdown of .* incomplete")]

OPTIONS = ["num.partitions=1", "log.segment.bytes=4096", "log.index.interval.bytes=256",
           "log.flush.offset.checkpoint.interval.ms=3600000", "log.retention.check.interval.ms=3600000",
           "log.segment.delete.delay.ms=0"]


def _lines(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines()


def _power_cut(faultfs, fs) -> dict:
    """The machine loses power: the daemon dies with everything it had not fsynced."""
    fs.kill9()
    return faultfs.power_cut()


def _append_unsynced(path: str, lines: list[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for line in lines:
            os.write(fd, line + b"\n")
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["mid-segment", "log-end", "high-watermark", "unsynced-high-watermark"])
def test_delete_records_survives_a_power_cut_right_after_it(faultfs, mount_logfs, where):
    faultfs.fsyncgate("")
    fs = mount_logfs(*OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path("t"))
    lines = [b"record %04d %s" % (i, b"p" * 40) for i in range(400)]  # ~5 segments of 4 KiB
    if where.startswith("unsynced"):  # the last 100 lines were never fsynced by their writer
        append_synced(fs.path("t", 0), lines[:300])
        _append_unsynced(fs.path("t", 0), lines[300:])
    else:
        append_synced(fs.path("t", 0), lines)
    start = {"mid-segment": 157, "log-end": 400}.get(where, -1)
    os.setxattr(fs.path("t", 0), "user.logfs.log_start_offset", str(start).encode())
    expected_start = 400 if start == -1 else start
    assert fs.getx("t/0", "log_start_offset") == str(expected_start)
    cut = _power_cut(faultfs, fs)
    assert cut["files"] > 0, cut  # the cut had something to drop (the gate saw the daemon's writes)
    fs.mount(*OPTIONS, foreground=True)
    assert fs.getx("t/0", "log_start_offset") == str(expected_start)
    assert _lines(fs.path("t", 0)) == lines[expected_start:]
    # The deleted records stay deleted for every reader: an offset below the start is not found.
    with pytest.raises(OSError) as exc:
        os.getxattr(fs.path("t", 0), f"user.logfs.position.{max(expected_start - 1, 0)}")
    assert exc.value.errno in (errno.ENODATA, errno.ERANGE, errno.EINVAL), exc.value
    append_synced(fs.path("t", 0), [b"after the cut"])
    assert _lines(fs.path("t", 0)) == lines[expected_start:] + [b"after the cut"]


def test_fsynced_appends_survive_a_power_cut_and_the_rest_is_a_prefix(faultfs, mount_logfs):
    faultfs.fsyncgate("")
    fs = mount_logfs(*OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path("a"))
    acked: list[bytes] = []
    for rnd in range(3):
        batch = [b"round %d line %04d %s" % (rnd, i, b"q" * (i % 50)) for i in range(150)]
        append_synced(fs.path("a", 0), batch)
        acked += batch
        tail = [b"round %d unsynced %04d" % (rnd, i) for i in range(60)]
        _append_unsynced(fs.path("a", 0), tail)
        cut = _power_cut(faultfs, fs)
        assert cut["writes"] > 0, cut
        fs.mount(*OPTIONS, foreground=True)
        got = _lines(fs.path("a", 0))
        assert got[:len(acked)] == acked, f"round {rnd}: an fsynced line is missing or out of place"
        rest = got[len(acked):]
        assert rest == tail[:len(rest)], f"round {rnd}: not a prefix of what was written: {rest[:3]}"
        acked += rest  # what survived is the log now; the next round appends after it
    # The offsets are contiguous and the indexes agree with the text: each line's position is where it is.
    data = open(fs.path("a", 0), "rb").read()
    for offset in (0, len(acked) // 2, len(acked) - 1):
        pos = int(os.getxattr(fs.path("a", 0), f"user.logfs.position.{offset}"))
        assert data[pos:].split(b"\n", 1)[0] == acked[offset]


def test_a_finished_move_survives_a_power_cut(faultfs, mount_logfs):
    fs, d1, d2 = mount_over_two_dirs(faultfs, mount_logfs, *OPTIONS)
    faultfs.fsyncgate("")  # after the directories were made: mkdir is metadata, kept in any case
    os.mkdir(fs.path("m"))
    lines = [b"moving line %04d %s" % (i, b"m" * 30) for i in range(500)]
    append_synced(fs.path("m", 0), lines)
    source = os.getxattr(fs.path("m", 0), "user.logfs.log_dir").decode()
    target = str(d2 if source == str(d1) else d1)
    os.setxattr(fs.path("m", 0), "user.logfs.log_dir", target.encode())

    def moved():
        try:
            os.getxattr(fs.path("m", 0), "user.logfs.future_log_dir")
            return False
        except OSError as exc:
            assert exc.errno == errno.ENODATA, exc
            return os.getxattr(fs.path("m", 0), "user.logfs.log_dir").decode() == target

    wait_for(moved, 60, what="the move to finish")
    time.sleep(0.2)
    cut = _power_cut(faultfs, fs)
    # Reported finished, the move had synced all it wrote: the cut takes nothing from the partition's new home.
    moved = os.path.relpath(os.path.join(target, "m-0"), faultfs.mountpoint)
    assert not [p for p in cut["paths"] if p.startswith(moved + "/")], cut
    fs.mount(*OPTIONS, foreground=True)
    assert os.getxattr(fs.path("m", 0), "user.logfs.log_dir").decode() == target
    assert _lines(fs.path("m", 0)) == lines
    assert not [n for n in os.listdir(source) if n.startswith("m-0")], os.listdir(source)


@pytest.mark.parametrize("failing", ["segment", "checkpoint"])
@pytest.mark.daemon_errors("is offline", "setxattr: .*Input/output error")
def test_delete_records_whose_fsync_fails_is_not_reported_and_loses_nothing(faultfs, mount_logfs, failing):
    """DeleteRecords over unsynced appends must fsync the records below the new start, then its checkpoint. When
    either fsync fails (EIO): the setfattr fails with EIO, the directory goes offline (section 12), and after a
    power cut and a remount the log is one a writer could have left: every fsynced line is there once, the start is
    the old one or the new one, and nothing appears that no writer wrote."""
    faultfs.fsyncgate("")
    fs = mount_logfs(*OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path("t"))
    lines = [b"record %04d %s" % (i, b"f" * 40) for i in range(400)]
    append_synced(fs.path("t", 0), lines[:300])
    _append_unsynced(fs.path("t", 0), lines[300:])
    pattern = r"\.log$" if failing == "segment" else r"log-start-offset-checkpoint"
    faultfs.fail("fsync", pattern, errno="EIO", count=-1)
    with pytest.raises(OSError) as exc:
        os.setxattr(fs.path("t", 0), "user.logfs.log_start_offset", b"-1")
    assert exc.value.errno == errno.EIO, exc.value
    wait_for(lambda: "is offline" in fs.stderr(), 10, what="the directory to go offline")
    with pytest.raises(OSError) as exc:  # offline: the partition answers EIO until the next mount
        os.getxattr(fs.path("t", 0), "user.logfs.log_start_offset")
    assert exc.value.errno == errno.EIO, exc.value
    faultfs.clear()
    _power_cut(faultfs, fs)
    fs.mount(*OPTIONS, foreground=True)
    start = int(fs.getx("t/0", "log_start_offset"))
    got = _lines(fs.path("t", 0))
    if start == 0:  # the delete did not survive: every fsynced line, and a prefix of the rest
        assert got[:300] == lines[:300]
        assert got == lines[:len(got)], "not a prefix of what was written"
    else:  # it did: only after the fsync of everything below it
        assert start == 400 and got == [], (start, got[:3])
    append_synced(fs.path("t", 0), [b"after the cut"])
    assert _lines(fs.path("t", 0)) == got + [b"after the cut"]

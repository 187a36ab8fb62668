"""The fault-injection harness itself (logfs/testing/faultfs.py, issue 30), through real syscalls on its mount.

- It is a faithful passthrough: files, offsets, renames (over a file, of a directory, NOREPLACE/EXCHANGE),
  truncate/chmod/utime, fsync, mmap both ways, posix_fallocate, flock, an open file renamed or unlinked.
- Rules fail exactly what they name: the 3rd write to a .log, ENOSPC on fsync, a rename to .swap, and nothing
  else; probability mode repeats itself with the same seed; clear() stops it; stats count the calls.
- It reproduces the bug classes of issue 30: a failed read of an mmap'd page is SIGBUS in the reader; with the
  fsyncgate rule a failed fsync drops its writes and the next fsync returns 0.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import subprocess
import sys
import textwrap
import time

import pytest

from logfs.testing.faultfs_client import FaultFS, FaultFSError

pytestmark = pytest.mark.mount


def tree(root) -> dict:
    """{relative path: bytes, or "dir"} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            out[os.path.normpath(os.path.join(rel, name))] = "dir"
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.normpath(os.path.join(rel, name))] = f.read()
    return out


def append(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def renameat2(old, new, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), ctypes.c_uint(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), old)


def test_passthrough_round_trip(faultfs):
    data, lower = faultfs.mountpoint, faultfs.source
    os.mkdir(data / "topic-0")
    log = data / "topic-0" / "00000000000000000000.log"
    fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
    assert os.write(fd, b"a" * 10000) == 10000
    assert os.pwrite(fd, b"XYZ", 4095) == 3  # across a page boundary
    assert os.pwrite(fd, b"tail", 20000) == 4  # past the end: a hole
    os.fsync(fd)
    os.fdatasync(fd)
    assert os.pread(fd, 5, 4094) == b"aXYZa"
    assert os.fstat(fd).st_size == 20004
    with pytest.raises(FileExistsError):
        os.open(log, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)

    # renamed and unlinked while open: the descriptor keeps working
    os.rename(log, data / "topic-0" / "renamed.log")
    os.pwrite(fd, b"!", 0)
    assert os.fstat(fd).st_size == 20004
    os.close(fd)
    assert (lower / "topic-0" / "renamed.log").read_bytes()[:1] == b"!"
    (data / "topic-0" / "gone").write_bytes(b"gone")
    fd = os.open(data / "topic-0" / "gone", os.O_RDWR)
    os.unlink(data / "topic-0" / "gone")
    os.write(fd, b"still")
    assert os.fstat(fd).st_size == 5 and os.pread(fd, 10, 0) == b"still"
    os.close(fd)
    assert not (lower / "topic-0" / "gone").exists()

    # a rename over a file, the temporary + fsync + rename + directory fsync of a checkpoint
    (data / "checkpoint").write_bytes(b"old")
    tmp = data / "checkpoint.tmp"
    with open(tmp, "wb") as f:
        f.write(b"new")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data / "checkpoint")
    dfd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    assert (data / "checkpoint").read_bytes() == b"new"

    # a directory renamed with its files, then used by the new names (the inode table follows)
    (data / "topic-0" / "00000000000000000000.index").write_bytes(b"\0" * 64)
    os.rename(data / "topic-0", data / "topic-0.abc-delete")
    assert sorted(os.listdir(data / "topic-0.abc-delete")) == ["00000000000000000000.index", "renamed.log"]
    append(data / "topic-0.abc-delete" / "renamed.log", b"more")
    assert os.stat(data / "topic-0.abc-delete" / "renamed.log").st_size == 20008

    # RENAME_NOREPLACE and RENAME_EXCHANGE
    (data / "a").write_bytes(b"A")
    (data / "b").write_bytes(b"B")
    with pytest.raises(FileExistsError):
        renameat2(data / "a", data / "b", 1)
    renameat2(data / "a", data / "b", 2)
    assert (data / "a").read_bytes() == b"B" and (data / "b").read_bytes() == b"A"
    renameat2(data / "a", data / "c", 1)
    assert not (data / "a").exists() and (data / "c").read_bytes() == b"B"
    for name in ("d1", "d2"):
        os.mkdir(data / name)
        (data / name / "f").write_bytes(name.encode())
    fd = os.open(data / "d1" / "f", os.O_RDONLY)
    renameat2(data / "d1", data / "d2", 2)  # directories exchanged with what is in them
    assert (data / "d1" / "f").read_bytes() == b"d2" and (data / "d2" / "f").read_bytes() == b"d1"
    append(data / "d2" / "f", b"+")
    assert os.pread(fd, 10, 0) == b"d1+"
    os.close(fd)
    with pytest.raises(OSError) as exc:
        os.rename(data / "d1", data / "d2")  # over a directory that is not empty: refused
    assert exc.value.errno == errno.ENOTEMPTY
    os.unlink(data / "d2" / "f")
    os.rename(data / "d1", data / "d2")  # over an empty one
    assert os.listdir(data / "d2") == ["f"] and (data / "d2" / "f").read_bytes() == b"d2"

    # truncate, chmod, utime, links
    path = data / "c"
    os.truncate(path, 4096)
    assert os.stat(path).st_size == 4096 and os.stat(lower / "c").st_size == 4096
    os.chmod(path, 0o600)
    assert os.stat(path).st_mode & 0o777 == 0o600 == os.stat(lower / "c").st_mode & 0o777
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    assert os.stat(path).st_mtime_ns == 2_000_000_000 == os.stat(lower / "c").st_mtime_ns
    os.symlink("c", data / "link")
    assert os.readlink(data / "link") == "c" and (data / "link").read_bytes()[:1] == b"B"
    os.link(data / "c", data / "hard")
    assert os.stat(data / "hard").st_ino == os.stat(data / "c").st_ino and os.stat(data / "c").st_nlink == 2
    os.unlink(data / "hard")
    os.mkdir(data / "empty")
    os.rmdir(data / "empty")

    # mmap both ways: stores reach the lower file on msync, the lower file's bytes are what a mapping reads
    index = data / "00000000000000000000.timeindex"
    with open(index, "wb") as f:
        f.truncate(3 * mmap.PAGESIZE)
    fd = os.open(index, os.O_RDWR)
    m = mmap.mmap(fd, 3 * mmap.PAGESIZE)
    m[mmap.PAGESIZE : mmap.PAGESIZE + 8] = b"12345678"
    m.flush()
    assert (lower / index.name).read_bytes()[mmap.PAGESIZE : mmap.PAGESIZE + 8] == b"12345678"
    m.close()
    os.pwrite(fd, b"written", 2 * mmap.PAGESIZE)
    os.close(fd)
    fd = os.open(index, os.O_RDONLY)
    m = mmap.mmap(fd, 3 * mmap.PAGESIZE, access=mmap.ACCESS_READ)
    assert m[2 * mmap.PAGESIZE : 2 * mmap.PAGESIZE + 7] == b"written"
    m.close()
    os.close(fd)

    assert os.statvfs(data).f_blocks == os.statvfs(lower).f_blocks
    assert tree(data) == tree(lower)


def test_posix_fallocate_and_flock(faultfs):
    data = faultfs.mountpoint
    fd = os.open(data / "x.index", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"head")
    os.posix_fallocate(fd, 0, 1 << 20)  # no FUSE fallocate: glibc writes a byte per block
    assert os.fstat(fd).st_size == 1 << 20
    assert os.pread(fd, 4, 0) == b"head"
    assert os.stat(faultfs.source / "x.index").st_size == 1 << 20
    os.close(fd)

    # the daemon's DATA_DIR/.lock: flock is exclusive across descriptors (kernel-local locking)
    a = os.open(data / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open(data / ".lock", os.O_RDWR)
    fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(BlockingIOError):
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(a, fcntl.LOCK_UN)
    fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.lockf(a, fcntl.LOCK_EX | fcntl.LOCK_NB)  # POSIX record locks too
    os.close(a)
    os.close(b)


def test_third_write_to_a_log_fails_and_no_other(faultfs):
    data = faultfs.mountpoint
    (data / "other.txt").write_bytes(b"")
    rule = faultfs.fail("write", r"\.log$", errno="EIO", nth=3)
    outcomes = []
    fd = os.open(data / "p.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(6):
        append(data / "other.txt", b"o%d" % i)  # writes to another file are not counted
        try:
            os.write(fd, b"line %d\n" % i)
            outcomes.append("ok")
        except OSError as exc:
            outcomes.append(errno.errorcode[exc.errno])
    os.fsync(fd)
    os.close(fd)
    assert outcomes == ["ok", "ok", "EIO", "ok", "ok", "ok"]
    expected = b"line 0\nline 1\nline 3\nline 4\nline 5\n"
    assert (faultfs.source / "p.log").read_bytes() == expected  # the failed write did nothing
    assert (data / "p.log").read_bytes() == expected
    assert (data / "other.txt").read_bytes() == b"o0o1o2o3o4o5"
    injected = faultfs.injected()
    assert [(f["op"], f["path"], f["errno"], f["rule"]) for f in injected] == [("write", "p.log", "EIO", rule)]
    [desc] = faultfs.stats()["rules"]
    assert desc["seen"] == 3 and desc["fired"] == 1 and desc["exhausted"]  # spent: it stops counting


def test_enospc_on_fsync(faultfs):
    data = faultfs.mountpoint
    faultfs.fail("fsync", r"seg/.*\.index$", errno="ENOSPC")
    fd = os.open(data / "seg.index", os.O_RDWR | os.O_CREAT, 0o644)  # not under seg/: not matched
    os.write(fd, b"x")
    os.fsync(fd)
    os.close(fd)
    os.mkdir(data / "seg")
    fd = os.open(data / "seg" / "1.index", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"y")
    with pytest.raises(OSError) as exc:
        os.fsync(fd)
    assert exc.value.errno == errno.ENOSPC
    os.fdatasync(fd)  # count=1: the next one passes
    os.close(fd)
    assert [(f["op"], f["path"], f["errno"]) for f in faultfs.injected()] == [("fsync", "seg/1.index", "ENOSPC")]


def test_rename_to_swap_fails(faultfs):
    data, lower = faultfs.mountpoint, faultfs.source
    for name in ("9107.log.cleaned", "9107.viewindex.cleaned", "x.tmp"):
        (data / name).write_bytes(name.encode())
    faultfs.fail("rename", r"\.swap$", errno="EIO")
    os.rename(data / "x.tmp", data / "x.log")  # no .swap in either name
    with pytest.raises(OSError) as exc:
        os.rename(data / "9107.viewindex.cleaned", data / "9107.viewindex.swap")
    assert exc.value.errno == errno.EIO
    assert sorted(os.listdir(lower)) == ["9107.log.cleaned", "9107.viewindex.cleaned", "x.log"]  # nothing moved
    os.rename(data / "9107.viewindex.cleaned", data / "9107.viewindex.swap")  # count=1: the retry works
    assert (data / "9107.viewindex.swap").read_bytes() == b"9107.viewindex.cleaned"
    [fault] = faultfs.injected()
    assert (fault["op"], fault["path"], fault["path2"]) == ("rename", "9107.viewindex.cleaned", "9107.viewindex.swap")


def test_probability_mode_is_reproducible(faultfs):
    data = faultfs.mountpoint
    fd = os.open(data / "r.log", os.O_WRONLY | os.O_CREAT, 0o644)

    def run(seed):
        rule = faultfs.fail("write", r"r\.log$", errno="EIO", probability=0.3, seed=seed)
        failed = []
        for i in range(60):
            try:
                os.pwrite(fd, b"z" * 100, i * 100)
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed.append(i)
        faultfs.clear(rule)
        return failed

    first, again, other = run(1234), run(1234), run(99)
    os.close(fd)
    assert 5 <= len(first) <= 35, first
    assert again == first
    assert other != first


def test_clear_stops_injection(faultfs):
    data = faultfs.mountpoint
    a = faultfs.fail("write", r"c\.log$", errno="EROFS", count=-1)
    b = faultfs.fail("open", r"never$", errno=errno.EACCES)
    for _ in range(3):
        with pytest.raises(OSError) as exc:
            append(data / "c.log", b"no")
        assert exc.value.errno == errno.EROFS
    assert faultfs.clear(a) == [a]
    append(data / "c.log", b"yes")
    assert (faultfs.source / "c.log").read_bytes() == b"yes"
    faultfs.fail("fsync", "", count=-1)
    assert sorted(faultfs.clear()) == [b, b + 1]
    assert faultfs.stats()["rules"] == []
    fd = os.open(data / "c.log", os.O_RDWR)
    os.fsync(fd)
    os.close(fd)
    assert faultfs.clear() == []


def test_stats_count_calls(faultfs):
    data = faultfs.mountpoint
    fd = os.open(data / "s.log", os.O_WRONLY | os.O_CREAT, 0o644)
    before = faultfs.stats()["ops"]
    for i in range(10):
        os.pwrite(fd, b"%d" % i, i)
    os.fsync(fd)
    os.fsync(fd)
    after = faultfs.stats()["ops"]
    os.close(fd)
    assert after["write"]["calls"] - before.get("write", {}).get("calls", 0) == 10
    assert after["fsync"]["calls"] - before.get("fsync", {}).get("calls", 0) == 2
    assert after["write"]["faults"] == 0

    faultfs.fail("write", "", nth=2, count=2)
    fd = os.open(data / "s.log", os.O_WRONLY)
    results = []
    for i in range(4):
        try:
            os.pwrite(fd, b"x", i)
            results.append(True)
        except OSError:
            results.append(False)
    os.close(fd)
    assert results == [True, False, False, True]
    stats = faultfs.stats()
    assert stats["ops"]["write"]["faults"] == 2
    assert len(stats["injected"]) == 2


def test_each_kind_of_call_can_fail(faultfs):
    data = faultfs.mountpoint
    os.mkdir(data / "d")
    (data / "d" / "f").write_bytes(b"f")

    def fails(op, path, errno_name, call, *args, count=1):
        rule = faultfs.fail(op, path, errno=errno_name, count=count)
        with pytest.raises(OSError) as exc:
            call(*args)
        assert errno.errorcode[exc.value.errno] == errno_name, (op, exc.value)
        assert faultfs.stats()["rules"][-1]["fired"] == count, op
        faultfs.clear(rule)

    fails("open", r"d/f$", "EACCES", os.open, data / "d" / "f", os.O_RDONLY)
    fails("create", r"new$", "EDQUOT", os.open, data / "d" / "new", os.O_WRONLY | os.O_CREAT, 0o644)
    fails("getattr", r"^d/f$", "EIO", os.stat, data / "d" / "f")
    fails("lookup", r"^d/g$", "EIO", os.stat, data / "d" / "g")
    fails("setattr", r"^d/f$", "EPERM", os.chmod, data / "d" / "f", 0o600)
    fails("setattr", r"^d/f$", "EFBIG", os.truncate, data / "d" / "f", 10)
    fails("mkdir", r"^e$", "ENOSPC", os.mkdir, data / "e")
    fails("unlink", r"^d/f$", "EROFS", os.unlink, data / "d" / "f")
    fails("rmdir", r"^d$", "EBUSY", os.rmdir, data / "d")
    fails("opendir", r"^d$", "EIO", os.listdir, data / "d")
    fails("readdir", r"^d$", "EIO", os.listdir, data / "d")
    fails("statfs", "", "EIO", os.statvfs, data)

    def close_after_open(path):
        fd = os.open(path, os.O_RDONLY)
        os.close(fd)

    fails("close", r"^d/f$", "EIO", close_after_open, data / "d" / "f")

    def fsync_dir(path):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    fails("fsyncdir", r"^d$", "EIO", fsync_dir, data / "d")

    def read(path):
        with open(path, "rb") as f:
            f.read()

    # A page-cache read that fails is retried once by the kernel (after a failed readahead): two to fail read(2).
    fails("read", r"^d/f$", "EIO", read, data / "d" / "f", count=2)
    fails(["write", "fsync"], r"^d/f$", "EIO", (data / "d" / "f").write_bytes, b"x")
    assert (data / "d" / "f").read_bytes() == b""  # opened with O_TRUNC, then the write failed
    assert sorted(os.listdir(data / "d")) == ["f"] and os.listdir(data) == ["d"]


def test_delay_slows_without_failing(faultfs):
    data = faultfs.mountpoint
    faultfs.delay("fsync", r"slow$", delay_ms=300)
    fd = os.open(data / "slow", os.O_WRONLY | os.O_CREAT, 0o644)
    started = time.monotonic()
    os.fsync(fd)
    assert time.monotonic() - started >= 0.29
    os.close(fd)
    assert faultfs.injected() == []  # delays are not faults
    assert faultfs.stats()["ops"]["fsync"]["delays"] == 1


def test_bad_requests_are_refused(faultfs):
    with pytest.raises(FaultFSError, match="unknown op"):
        faultfs.fail("frobnicate", "")
    with pytest.raises(FaultFSError, match="unknown errno"):
        faultfs.fail("write", "", errno="ENOTANERRNO")
    with pytest.raises(FaultFSError):
        faultfs.fail("write", "(unbalanced")
    assert faultfs.ping() == faultfs.proc.pid  # and the daemon is still there


def test_failed_read_of_a_mapped_page_is_sigbus(faultfs):
    """The class of issue 30's defect 3: a process reading an mmap'd page whose read fails dies of SIGBUS."""
    data = faultfs.mountpoint
    (data / "00000000000000000000.timeindex").write_bytes(b"\1" * (2 * mmap.PAGESIZE))
    child = textwrap.dedent(
        """
        import mmap, os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        print("read", m[mmap.PAGESIZE], flush=True)
        """)
    path = str(data / "00000000000000000000.timeindex")
    ok = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout == "read 1\n", ok.stderr
    faultfs.fail("read", r"\.timeindex$", errno="EIO", count=-1)  # every read: readahead may retry
    died = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, timeout=60)
    assert died.returncode == -7, (died.returncode, died.stdout, died.stderr)  # SIGBUS, no traceback
    assert died.stdout == ""
    assert {f["op"] for f in faultfs.injected()} == {"read"}
    faultfs.clear()
    again = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr


def test_fsyncgate_drops_the_writes_of_a_failed_fsync(faultfs):
    data, lower = faultfs.mountpoint, faultfs.source
    faultfs.fsyncgate(r"\.log$")
    fd = os.open(data / "g.log", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"A" * 100, 0)
    os.fsync(fd)  # durable
    os.pwrite(fd, b"B" * 100, 100)
    os.pwrite(fd, b"b" * 10, 50)  # an overwrite of durable bytes
    assert (lower / "g.log").read_bytes() == b"A" * 50 + b"b" * 10 + b"A" * 40 + b"B" * 100  # in the "cache"
    faultfs.fail("fsync", r"g\.log$", errno="EIO")
    with pytest.raises(OSError) as exc:
        os.fsync(fd)
    assert exc.value.errno == errno.EIO
    os.fsync(fd)  # the next fsync succeeds: nothing is dirty any more ...
    assert (lower / "g.log").read_bytes() == b"A" * 100  # ... because the writes were dropped
    assert os.fstat(fd).st_size == 100
    assert os.pread(fd, 300, 0) == b"A" * 100  # the kernel's cached pages were dropped too
    os.pwrite(fd, b"C" * 100, 100)
    os.fsync(fd)
    assert (lower / "g.log").read_bytes() == b"A" * 100 + b"C" * 100
    os.close(fd)
    # files outside the gate keep their writes after a failed fsync
    faultfs.fail("fsync", r"plain$", errno="EIO")
    fd = os.open(data / "plain", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"kept")
    with pytest.raises(OSError):
        os.fsync(fd)
    os.close(fd)
    assert (lower / "plain").read_bytes() == b"kept"
    assert [f["op"] for f in faultfs.injected()] == ["fsync", "fsyncgate", "fsync"]


def test_a_power_cut_keeps_only_what_was_fsynced(faultfs):
    data, lower = faultfs.mountpoint, faultfs.source
    faultfs.fsyncgate("")
    fd = os.open(data / "a", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"synced ")
    os.fdatasync(fd)
    os.write(fd, b"lost")
    os.ftruncate(fd, 3)  # a truncate after the fsync is lost too
    os.write(fd, b"again")
    os.close(fd)
    fd = os.open(data / "b.tmp", os.O_RDWR | os.O_CREAT, 0o644)  # new, written, renamed, never fsynced
    os.write(fd, b"never synced")
    os.close(fd)
    os.rename(data / "b.tmp", data / "b")
    fd = os.open(data / "c.tmp", os.O_RDWR | os.O_CREAT, 0o644)  # the checkpoint protocol: fsync, then rename
    os.write(fd, b"checkpoint")
    os.fsync(fd)
    os.close(fd)
    os.rename(data / "c.tmp", data / "c")
    with open(data / "a", "rb") as f:
        assert f.read() == b"syn" + b"\0" * 8 + b"again"  # what the "cache" held
    reply = faultfs.power_cut()
    assert (reply["files"], reply["writes"]) == (2, 4), reply  # a: write + truncate + write; b: one write
    assert (lower / "a").read_bytes() == b"synced "
    assert (lower / "b").read_bytes() == b""  # the name survived, its bytes did not
    assert (lower / "c").read_bytes() == b"checkpoint"
    with open(data / "a", "rb") as f:  # the kernel's pages of the files were dropped
        assert f.read() == b"synced "
    assert [f["op"] for f in faultfs.injected()] == ["powercut", "powercut"]
    assert faultfs.power_cut()["files"] == 0  # nothing dirty any more
    # A file removed before the cut is no file's business: nothing of it is remembered (nor a descriptor kept).
    (data / "gone").write_bytes(b"written, never fsynced")
    os.unlink(data / "gone")
    assert faultfs.power_cut()["files"] == 0


def test_start_stop_and_kill(tmp_path):
    fs = FaultFS(tmp_path / "lower", tmp_path / "mnt")
    with fs:
        (fs.mountpoint / "f").write_bytes(b"x")
        pid = fs.proc.pid
    assert fs.proc is None and not os.path.ismount(tmp_path / "mnt")
    assert (tmp_path / "lower" / "f").read_bytes() == b"x"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    fs.start()
    fs.kill()  # a dead daemon: stop() still cleans the mount away
    assert fs.stop() == -9
    assert not os.path.ismount(tmp_path / "mnt")


def test_a_logfs_daemon_runs_on_it(faultfs, mount_logfs, tmp_path):
    """What a logfs daemon does in its DATA_DIR (the .lock, mmap'd indexes, rolls, checkpoints) works on the
    harness, across a kill -9 and a remount. ``name="."``: the LogfsMount's DATA_DIR is tmp_path/"data"."""
    fs = mount_logfs("num.partitions=1", "log.segment.bytes=16384", "log.index.interval.bytes=512",
                     "log.flush.offset.checkpoint.interval.ms=200", name=".")
    assert fs.data == faultfs.mountpoint
    os.mkdir(fs.path("t"))
    batches = [b"".join(b"line %05d %s\n" % (i, b"x" * 90) for i in range(j, j + 50)) for j in range(0, 1000, 50)]
    for batch in batches:
        fs.append("t/0", batch)
    lines = b"".join(batches)
    assert fs.read("t/0") == lines
    segments = sorted(n for n in os.listdir(faultfs.source / "t-0") if n.endswith(".log"))
    assert len(segments) > 3  # rolled
    fs.kill9()
    fs.mount("num.partitions=1", "log.segment.bytes=16384")
    assert fs.read("t/0") == lines
    ops = faultfs.stats()["ops"]
    assert ops["write"]["calls"] and ops["fsync"]["calls"] and ops["read"]["calls"]
    fs.unmount()

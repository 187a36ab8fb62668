"""What stat and friends show on a real mount: times after kill -9, fstat of a removed partition's descriptor,
touch, topic times, and mmap."""

from __future__ import annotations

import errno
import mmap
import os
import shlex
import time

import pytest

from harness import expect_errno, sh, wait_for


def test_fstat_of_a_removed_partition_still_open(mount_logfs):
    """`exec 7< t/1; rm t/1; cat <&7`: cat fstats the descriptor first; that works as for any unlinked file."""
    fs = mount_logfs("num.partitions=2")
    os.mkdir(fs.path("t"))
    fs.append("t/1", b"one\ntwo\n")
    p = shlex.quote(fs.path("t", 1))
    r = sh(f"exec 7< {p}; rm {p}; stat -L -c '%s %h' /dev/fd/7; cat <&7")
    assert r.stdout == b"8 0\none\ntwo\n", r.stdout
    expect_errno(errno.ENOENT, os.stat, fs.path("t", 1))


def test_mtime_after_kill9_is_the_newest_record(mount_logfs):
    """A time-based roll leaves the active segment empty; after kill -9 and a remount, st_mtime is still the
    last append's time, not the remount's."""
    fs = mount_logfs("log.roll.ms=300")
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"a\n")
    appended = os.stat(fs.path("t", 0)).st_mtime_ns
    wait_for(lambda: fs.getx("t/0", "segment_count") == "2", timeout=10, what="a time-based roll")
    time.sleep(1.1)
    fs.kill9()
    fs.remount()
    assert os.stat(fs.path("t", 0)).st_mtime_ns == appended
    assert os.stat(fs.path("t")).st_mtime_ns == appended


def test_touch_with_a_date_is_eperm_and_plain_touch_works(mount):
    os.mkdir(mount.path("t"))
    mount.append("t/0", b"a\n")
    before = os.stat(mount.path("t", 0)).st_mtime_ns
    for path in (mount.path("t", 0), mount.path("t")):
        r = sh(f"touch -d 2000-01-01 {shlex.quote(path)}", check=False)
        assert r.returncode != 0 and b"Operation not permitted" in r.stderr, r.stderr
        expect_errno(errno.EPERM, os.utime, path, (946684800, 946684800))
        sh(f"touch {shlex.quote(path)}")
        os.utime(path)
    assert os.stat(mount.path("t", 0)).st_mtime_ns == before


def test_topic_mtime_is_its_newest_append(mount_logfs):
    fs = mount_logfs("num.partitions=2")
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"a\n")
    time.sleep(1.1)  # the directory's attributes are cached for 1 s
    fs.append("t/1", b"b\n")
    newest = os.stat(fs.path("t", 1)).st_mtime_ns
    wait_for(lambda: os.stat(fs.path("t")).st_mtime_ns == newest, timeout=3, what="the topic's mtime")


def test_shared_mmap_is_enodev(mount):
    """Partitions are direct_io (every read reaches logfs): the kernel refuses shared mappings (README)."""
    os.mkdir(mount.path("t"))
    mount.append("t/0", b"a\n" * 100)
    with open(mount.path("t", 0), "rb") as f:
        with pytest.raises(OSError) as info:
            mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        assert info.value.errno == errno.ENODEV

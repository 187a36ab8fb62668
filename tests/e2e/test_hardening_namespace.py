"""Issue 13, the namespace through a real mount: strays in DATA_DIR, deletes on a full disk, colliding names,
holes in partition numbers, num.partitions, SIGTERM during a long mkdir, and the refused mount paths.

Every step that could hang on a broken build runs under a subprocess timeout, so a regression fails the test
instead of hanging it."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from harness import LogfsMount, daemon_env, expect_errno, mkdir_refused, mounted_at, sh, wait_for
from logfs.service.mountpoint import mount_table

CLI_TIMEOUT = 30


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "logfs.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=CLI_TIMEOUT, env=daemon_env())


def mount_count(path) -> int:
    """How many mounts are stacked on ``path``."""
    target = os.path.abspath(path)
    return sum(point == target for point, _ in mount_table())


def detach(path) -> None:
    """Teardown for a mount the old code made although it should have refused it."""
    while mounted_at(path):
        subprocess.run(["fusermount3", "-uz", str(path)], capture_output=True, timeout=30)


# -- item 9: strays ------------------------------------------------------------------------------------------

def test_strays_in_data_dir_are_ignored_logged_once_and_kept(mount_logfs, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    strays = ["t-²", "t-01", "lost+found", "x-0-delete", "__cluster_metadata-0", "notes.txt", "link-0"]

    def prepare(m: LogfsMount):
        for d in ("t-²", "t-01", "lost+found", "x-0-delete", "__cluster_metadata-0"):
            (m.data / d).mkdir(parents=True)
            (m.data / d / "keep").write_text(d)
        (m.data / "notes.txt").write_text("mine")
        os.symlink(outside, m.data / "link-0")
        (m.data / "y-1").mkdir()  # a legal partition dir: topic y, partition 1 only

    fs = mount_logfs(foreground=True, prepare=prepare)  # (t-² crashed the startup with a ValueError)
    assert os.listdir(fs.mnt) == ["y"]  # no t, no __cluster_metadata
    assert os.listdir(fs.path("y")) == ["1"]
    expect_errno(errno.EINVAL, os.mkdir, fs.path("__cluster_metadata"))
    os.mkdir(fs.path("t"))
    assert os.listdir(fs.path("t")) == ["0"]
    fs.unmount()
    log = fs.stderr()
    for name in strays:
        assert log.count(f"ignoring {name} ") == 1, (name, log)
    for d in ("t-²", "t-01", "lost+found", "x-0-delete", "__cluster_metadata-0"):
        assert os.listdir(fs.data / d) == ["keep"], d
    assert (fs.data / "notes.txt").read_text() == "mine" and os.path.islink(fs.data / "link-0")
    assert os.listdir(outside) == []


# -- item 11: holes ------------------------------------------------------------------------------------------

def test_missing_partition_numbers_can_be_created_again(mount_logfs):
    fs = mount_logfs("num.partitions=3", prepare=lambda m: (m.data / "y-1").mkdir(parents=True))
    assert os.listdir(fs.path("y")) == ["1"]
    sh(f"touch {fs.path('y', 0)}")  # (was EINVAL: only 2 could be added)
    assert sorted(os.listdir(fs.path("y"))) == ["0", "1"]
    expect_errno(errno.EINVAL, os.open, fs.path("y", 3), os.O_WRONLY | os.O_CREAT, 0o644)  # past the next
    os.mkdir(fs.path("t"))
    fs.append("t/0", "old\n")
    sh(f"rm {fs.path('t', 0)} && touch {fs.path('t', 0)}")  # (partition 0 could never come back)
    assert sorted(os.listdir(fs.path("t"))) == ["0", "1", "2"]
    assert fs.read("t/0") == b""
    fs.append("t/0", "new\n")
    fs.remount()
    assert fs.read("t/0") == b"new\n"
    assert sorted(os.listdir(fs.path("y"))) == ["0", "1"]


# -- item 10: colliding names --------------------------------------------------------------------------------

def test_colliding_topic_is_einval(mount):
    os.mkdir(mount.path("a.b"))
    mkdir_refused(mount.path("a_b"), errno.EINVAL, b"Invalid argument")
    assert os.listdir(mount.mnt) == ["a.b"]
    sh(f"rm -r {mount.path('a.b')}")
    os.mkdir(mount.path("a_b"))
    assert os.listdir(mount.mnt) == ["a_b"]


# -- item 4: deletes -----------------------------------------------------------------------------------------

def test_rm_r_on_a_full_disk_succeeds_and_the_topic_stays_gone(small_tmpfs, mount_logfs):
    fs = mount_logfs("num.partitions=2", "log.segment.bytes=1048576", root=small_tmpfs.path)
    os.mkdir(fs.path("keep"))
    fs.append("keep/0", "kept\n")
    os.mkdir(fs.path("big"))
    line = b"z" * 4000 + b"\n"
    with pytest.raises(OSError) as full:
        fd = os.open(fs.path("big", 1), os.O_WRONLY | os.O_APPEND)
        try:
            for _ in range(10_000):
                os.write(fd, line * 16)
            os.fsync(fd)
        finally:
            os.close(fd)
    assert full.value.errno == errno.ENOSPC
    small_tmpfs.top_up()
    sh(f"rm -r {fs.path('big')}", timeout=CLI_TIMEOUT)  # (was ENOSPC, half done)
    assert os.listdir(fs.mnt) == ["keep"]
    fs.unmount()
    assert os.path.exists(fs.data / ".kafka_cleanshutdown")  # the clean shutdown was complete
    assert not [n for n in os.listdir(fs.data) if n.startswith("big")]
    fs.mount("num.partitions=2", "log.segment.bytes=1048576")
    assert os.listdir(fs.mnt) == ["keep"]
    assert fs.read("keep/0") == b"kept\n"


@pytest.mark.parametrize("length", [214, 249])
def test_rm_r_of_the_longest_topic_names(mount_logfs, length):
    fs = mount_logfs("num.partitions=2")
    topic = "t" * length
    os.mkdir(fs.path(topic))
    fs.append(f"{topic}/1", "data\n")
    sh(f"rm -r {fs.path(topic)}")  # (was ENAMETOOLONG: the -delete name passed 255 bytes)
    assert os.listdir(fs.mnt) == []
    fs.remount()
    assert os.listdir(fs.mnt) == []


# -- item 8: num.partitions and SIGTERM ------------------------------------------------------------------------

def test_huge_num_partitions_is_refused_at_mount(tmp_path):
    (tmp_path / "mnt").mkdir()
    try:
        r = run_cli(str(tmp_path / "data"), str(tmp_path / "mnt"), "-o", "num.partitions=2147483647")
        assert r.returncode != 0
        message = r.stderr.decode().strip()
        assert message.count("\n") == 0 and "num.partitions" in message and "10000" in message, message
        assert not mounted_at(tmp_path / "mnt")
    finally:
        detach(tmp_path / "mnt")


def test_sigterm_stops_the_daemon_during_a_long_mkdir(mount_logfs):
    fs = mount_logfs("num.partitions=10000", foreground=True)
    mkdir = subprocess.Popen(["mkdir", fs.path("t")], stderr=subprocess.PIPE)
    try:
        wait_for(lambda: any(n.startswith("t-") for n in os.listdir(fs.data)), 20, what="the creation to start")
        os.kill(fs.proc.pid, signal.SIGTERM)
        fs.proc.wait(timeout=20)  # (the daemon ignored SIGTERM until the creation was over)
        assert fs.proc.returncode == 0
        assert mkdir.wait(timeout=20) != 0
    finally:
        if mkdir.poll() is None:
            mkdir.kill()
        detach(fs.mnt)
    assert not [n for n in os.listdir(fs.data) if n.startswith("t-")]  # undone
    assert os.path.exists(fs.data / ".kafka_cleanshutdown")


# -- item 7: the mount's paths -----------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["same", "same-via-symlink", "mnt-inside-data", "data-inside-mnt"])
def test_overlapping_data_dir_and_mountpoint_are_refused(tmp_path, layout):
    base = tmp_path / "base"
    base.mkdir()
    data, mnt = {
        "same": (base, base),
        "same-via-symlink": (base, tmp_path / "alias"),
        "mnt-inside-data": (base, base / "mnt"),
        "data-inside-mnt": (base / "data", base),
    }[layout]
    if layout == "same-via-symlink":
        os.symlink(base, mnt)
    os.makedirs(mnt, exist_ok=True)
    try:
        r = run_cli(str(data), str(mnt))
        assert r.returncode != 0
        message = r.stderr.decode().strip()
        assert message.startswith("logfs: error: ") and "\n" not in message, message
        assert not mounted_at(base) and not mounted_at(base / "mnt")
    finally:
        detach(base)
        detach(base / "mnt")


def test_mounting_over_an_existing_logfs_mount_is_refused(mount, tmp_path):
    before = mount_count(mount.mnt)
    try:
        r = run_cli(str(tmp_path / "other-data"), str(mount.mnt))
        assert r.returncode != 0
        message = r.stderr.decode().strip()
        assert "already a logfs mount" in message and "\n" not in message, message
        assert mount_count(mount.mnt) == before  # nothing stacked over it
        os.mkdir(mount.path("still-served"))  # the first mount is untouched
        assert os.path.isdir(mount.data / "still-served-0")
    finally:
        while mount_count(mount.mnt) > before:
            subprocess.run(["fusermount3", "-u", str(mount.mnt)], capture_output=True, timeout=30)
            time.sleep(0.1)

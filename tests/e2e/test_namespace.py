"""CONTRACT section 2: topics as directories, partitions as files, and the refused operations."""

from __future__ import annotations

import errno
import os
import shlex

import pytest

from harness import expect_errno, mkdir_refused, sh, wait_for


def test_mkdir_creates_topic_with_num_partitions(mount_logfs):
    fs = mount_logfs("num.partitions=3")
    assert os.listdir(fs.mnt) == []
    os.mkdir(fs.path("orders"))
    sh(f"mkdir {shlex.quote(fs.path('clicks'))}")
    assert sorted(os.listdir(fs.mnt)) == ["clicks", "orders"]
    assert sorted(os.listdir(fs.path("orders"))) == ["0", "1", "2"]
    assert sh(f"ls {shlex.quote(fs.path('clicks'))}").stdout.decode().split() == ["0", "1", "2"]
    assert fs.getx("orders", "partitions") == "3"
    for p in range(3):
        st = os.stat(fs.path("orders", p))
        assert st.st_size == 0
        assert os.path.isfile(fs.path("orders", p))
    assert os.path.isdir(fs.path("orders"))
    # On disk: Kafka's <topic>-<partition> directories.
    assert {d for d in os.listdir(fs.data) if d.startswith("orders-")} == {"orders-0", "orders-1", "orders-2"}


def test_mkdir_default_one_partition_and_valid_names(mount):
    names = ["a", "A-b_c.d", "x" * 249, "0", "..."]
    for name in names:
        os.mkdir(mount.path(name))
    assert sorted(os.listdir(mount.mnt)) == sorted(names)
    for name in names:
        assert os.listdir(mount.path(name)) == ["0"]


@pytest.mark.parametrize("name", ["x" * 250, "a b", "tópic", "ümlaut", "a\\b", "a:b", "a*", "é"])
def test_mkdir_invalid_topic_name_is_einval(mount, name):
    expect_errno(errno.EINVAL, os.mkdir, mount.path(name))
    assert os.listdir(mount.mnt) == []


@pytest.mark.parametrize("name", ["..", "."])
def test_mkdir_dot_names_refused(mount, name):
    # `mkdir MNT/..` and `mkdir MNT/.` never reach a FUSE filesystem: the kernel's VFS answers EEXIST for them
    # itself (the names always exist). The contract's EINVAL is unreachable for these two; what matters is
    # that they are refused and create nothing.
    with pytest.raises(OSError) as info:
        os.mkdir(mount.path(name))
    assert info.value.errno in (errno.EINVAL, errno.EEXIST)
    assert os.listdir(mount.mnt) == []


def test_mkdir_existing_is_eexist(mount):
    os.mkdir(mount.path("t"))
    mkdir_refused(mount.path("t"), errno.EEXIST, b"exists")
    assert os.listdir(mount.mnt) == ["t"]


def test_create_next_partition_adds_it(mount):
    os.mkdir(mount.path("t"))
    sh(f"touch {shlex.quote(mount.path('t', 1))}")
    assert sorted(os.listdir(mount.path("t"))) == ["0", "1"]
    sh(f"echo hello >> {shlex.quote(mount.path('t', 2))}")
    assert sorted(os.listdir(mount.path("t"))) == ["0", "1", "2"]
    assert mount.read("t/2") == b"hello\n"
    assert mount.getx("t", "partitions") == "3"
    with open(mount.path("t", 3), "a") as f:
        f.write("via python\n")
    assert mount.read("t/3") == b"via python\n"
    assert os.path.isdir(os.path.join(mount.data, "t-3"))


@pytest.mark.parametrize("name", ["5", "foo", "01", "-1", "1.log", "00"])
def test_create_other_name_in_topic_is_einval(mount, name):
    os.mkdir(mount.path("t"))
    expect_errno(errno.EINVAL, os.open, mount.path("t", name), os.O_WRONLY | os.O_CREAT, 0o644)
    r = sh(f"touch {shlex.quote(mount.path('t', name))}", check=False)
    assert r.returncode != 0 and b"Invalid argument" in r.stderr
    assert os.listdir(mount.path("t")) == ["0"]


def test_create_file_in_root_refused(mount):
    with pytest.raises(OSError):
        os.open(mount.path("file"), os.O_WRONLY | os.O_CREAT, 0o644)
    assert os.listdir(mount.mnt) == []


def test_mkdir_inside_topic_refused(mount):
    os.mkdir(mount.path("t"))
    with pytest.raises(OSError):
        os.mkdir(mount.path("t", "sub"))
    assert os.listdir(mount.path("t")) == ["0"]


def test_rename_link_symlink_mknod_are_eperm(mount):
    os.mkdir(mount.path("t"))
    os.mkdir(mount.path("u"))
    mount.append("t/0", "a\n")
    expect_errno(errno.EPERM, os.rename, mount.path("t", 0), mount.path("t", 1))
    expect_errno(errno.EPERM, os.rename, mount.path("t", 0), mount.path("u", 0))  # onto an existing file
    expect_errno(errno.EPERM, os.rename, mount.path("t"), mount.path("v"))
    expect_errno(errno.EPERM, os.link, mount.path("t", 0), mount.path("t", 1))
    expect_errno(errno.EPERM, os.symlink, "0", mount.path("t", 1))
    expect_errno(errno.EPERM, os.symlink, "t", mount.path("link"))
    expect_errno(errno.EPERM, os.mkfifo, mount.path("t", 1))
    expect_errno(errno.EPERM, os.mknod, mount.path("t", 1), 0o644 | 0o100000)
    for cmd in (f"mv {mount.path('t', 0)} {mount.path('t', 1)}", f"mv {mount.path('t')} {mount.path('w')}",
                f"ln {mount.path('t', 0)} {mount.path('t', 1)}", f"ln -s 0 {mount.path('t', 1)}",
                f"mkfifo {mount.path('t', 1)}"):
        r = sh(cmd, check=False)
        assert r.returncode != 0, cmd
        assert b"Operation not permitted" in r.stderr, (cmd, r.stderr)
    assert sorted(os.listdir(mount.mnt)) == ["t", "u"]
    assert os.listdir(mount.path("t")) == ["0"]
    assert mount.read("t/0") == b"a\n"


def test_rm_partition_rmdir_topic_and_rm_r(mount_logfs):
    fs = mount_logfs("num.partitions=3", "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("t"))
    fs.append("t/1", "x\n")
    expect_errno(errno.ENOTEMPTY, os.rmdir, fs.path("t"))
    r = sh(f"rmdir {fs.path('t')}", check=False)
    assert r.returncode != 0 and b"not empty" in r.stderr
    os.unlink(fs.path("t", 2))
    assert sorted(os.listdir(fs.path("t"))) == ["0", "1"]
    expect_errno(errno.ENOENT, os.stat, fs.path("t", 2))
    expect_errno(errno.ENOTEMPTY, os.rmdir, fs.path("t"))
    os.unlink(fs.path("t", 1))
    os.unlink(fs.path("t", 0))
    assert os.listdir(fs.path("t")) == []
    os.rmdir(fs.path("t"))
    assert os.listdir(fs.mnt) == []
    # rm -r deletes a whole topic with data in it.
    os.mkdir(fs.path("big"))
    for p in range(3):
        fs.append(f"big/{p}", f"line {p}\n" * 10)
    sh(f"rm -r {fs.path('big')}")
    assert os.listdir(fs.mnt) == []
    # The name can be used again, and the new topic starts empty.
    os.mkdir(fs.path("big"))
    assert fs.read("big/0") == b""
    assert fs.getx("big/0", "log_end_offset") == "0"
    # Deletion survives a remount: the deleted topic t does not come back.
    fs.remount()
    assert os.listdir(fs.mnt) == ["big"]
    assert not any(d.startswith("t-") and not d.endswith("-delete") for d in os.listdir(fs.data))


def test_unlink_missing_partition_is_enoent(mount):
    os.mkdir(mount.path("t"))
    expect_errno(errno.ENOENT, os.unlink, mount.path("t", 7))
    expect_errno(errno.ENOENT, os.rmdir, mount.path("nosuch"))


def test_many_topics_and_partitions_list_completely(mount):
    # Enough entries that readdir needs several kernel buffers (resumed by cookie).
    names = [f"topic-{i:04d}-" + "n" * 40 for i in range(300)]
    for name in names:
        os.mkdir(mount.path(name))
    listed = os.listdir(mount.mnt)
    assert sorted(listed) == sorted(names) and len(listed) == len(set(listed))
    assert sh(f"ls {shlex.quote(str(mount.mnt))} | wc -l").stdout.strip() == b"300"
    for p in range(1, 200):
        os.close(os.open(mount.path(names[0], p), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    parts = os.listdir(mount.path(names[0]))
    assert sorted(parts, key=int) == [str(p) for p in range(200)]
    assert mount.getx(names[0], "partitions") == "200"


def test_touch_existing_partition_is_harmless(mount):
    os.mkdir(mount.path("t"))
    mount.append("t/0", "x\n")
    sh(f"touch {shlex.quote(mount.path('t', 0))}")
    os.utime(mount.path("t", 0))
    assert mount.read("t/0") == b"x\n"
    assert os.listdir(mount.path("t")) == ["0"]


def test_partition_deletion_is_asynchronous_and_survives_kill9(mount_logfs):
    fs = mount_logfs("num.partitions=3")  # log.segment.delete.delay.ms defaults to 60 s
    os.mkdir(fs.path("t"))
    for p in range(3):
        fs.append(f"t/{p}", f"data of {p}\n" * 100)
    os.unlink(fs.path("t", 1))
    on_disk = os.listdir(fs.data)
    assert "t-1" not in on_disk
    pending = [d for d in on_disk if d.startswith("t-1.") and d.endswith("-delete")]
    assert len(pending) == 1, on_disk
    # With the topic's file.delete.delay.ms at 0 the renamed directory goes away promptly.
    sh(f"setfattr -n user.logfs.config.file.delete.delay.ms -v 0 {shlex.quote(fs.path('t'))}")
    os.unlink(fs.path("t", 2))
    wait_for(lambda: not any(d.startswith("t-2") for d in os.listdir(fs.data)), 10,
             what="t-2...-delete to be removed")
    assert any(d.startswith("t-1.") for d in os.listdir(fs.data)), "the 60 s delay of t-1 was not honoured"
    # A crash before the delayed removal: the deletion still holds after recovery.
    fs.kill9()
    fs.mount()
    assert os.listdir(fs.path("t")) == ["0"]
    assert fs.read("t/0") == b"data of 0\n" * 100
    assert not any(d.startswith(("t-1", "t-2")) for d in os.listdir(fs.data))
    assert fs.getx("t", "partitions") == "1"

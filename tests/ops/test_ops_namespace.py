"""The namespace through Operations, with no kernel: topics, partitions, their names and the refused calls."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from ops_helpers import APPEND, each_fails, fuse_errno


async def test_mkdir_creates_topic_with_num_partitions(ops_fs):
    fs = ops_fs(num_partitions=3)
    attrs = await fs.mkdir("t")
    assert stat.S_ISDIR(attrs.st_mode)
    assert await fs.listdir() == ["t"]
    assert await fs.listdir("t") == ["0", "1", "2"]
    assert await fs.getx("t", "partitions") == "3"
    for n in range(3):
        a = await fs.lookup(f"t/{n}")
        assert stat.S_ISREG(a.st_mode) and a.st_size == 0


@pytest.mark.parametrize("name", ["a" * 249, "A.b_c-9", "..."])
async def test_legal_topic_names(ops, name):
    await ops.mkdir(name)
    assert name in await ops.listdir()


@pytest.mark.parametrize("name", ["a" * 250, "a b", "a\\b", "é", "a:b", "", ".", "..", "t\n"])
async def test_mkdir_invalid_topic_name_is_einval(ops, name):
    with fuse_errno(errno.EINVAL):
        await ops.ops.mkdir(1, name.encode(), 0o755, None)
    assert await ops.listdir() == []


async def test_mkdir_undecodable_name_is_einval(ops):
    with fuse_errno(errno.EINVAL):
        await ops.ops.mkdir(1, b"\xff\xfe", 0o755, None)


async def test_create_next_partition_adds_it(ops):
    await ops.mkdir("t")
    fh = await ops.create("t/1")
    assert await ops.write(fh, b"hello\n") == 6
    await ops.release(fh)
    assert await ops.listdir("t") == ["0", "1"]
    assert await ops.cat("t/1") == b"hello\n"
    assert await ops.getx("t", "partitions") == "2"


@pytest.mark.parametrize("call,path,code", [
    ("mkdir", "t", errno.EEXIST),
    ("mkdir", "t/sub", errno.EINVAL),  # no directory inside a topic
    ("create", "file", errno.EPERM),  # no file in the root
    *[("create", f"t/{name}", errno.EINVAL) for name in ["x", "01", "-1", "1.0", "+1", "²", "0x1", " 1"]],
], ids=lambda v: repr(v) if isinstance(v, str) else None)
async def test_refused_names_change_nothing(ops, call, path, code):
    """A name the namespace refuses: its errno, and the tree as it was (one topic ``t``, partition 0)."""
    await ops.mkdir("t")
    with fuse_errno(code):
        await getattr(ops, call)(path)
    assert await ops.listdir() == ["t"] and await ops.listdir("t") == ["0"]


async def test_create_under_a_partition_is_enotdir(ops):
    await ops.mkdir("t")
    await each_fails(errno.ENOTDIR, ops.create("t/0/x"), ops.lookup("t/0/x"),
                     ops.ops.opendir(await ops.inode("t/0"), None))


async def test_lookup_missing_is_enoent(ops):
    await ops.mkdir("t")
    for path in ("nosuch", "t/1", "t/x", "t/01"):
        with fuse_errno(errno.ENOENT):
            await ops.lookup(path)


async def test_unknown_inode_is_enoent(ops):
    with fuse_errno(errno.ENOENT):
        await ops.ops.getattr(10_000, None)


async def test_open_topic_directory_as_file_is_eisdir(ops):
    await ops.mkdir("t")
    with fuse_errno(errno.EISDIR):
        await ops.open("t", os.O_RDONLY)


async def test_rename_link_symlink_mknod_are_eperm(ops):
    await ops.mkdir("t")
    await ops.mkdir("u")
    t, root, p0 = await ops.inode("t"), await ops.inode(""), await ops.inode("t/0")
    with fuse_errno(errno.EPERM):
        await ops.ops.rename(t, b"0", t, b"1", 0, None)
    with fuse_errno(errno.EPERM):
        await ops.ops.rename(t, b"0", await ops.inode("u"), b"0", 0, None)
    with fuse_errno(errno.EPERM):
        await ops.ops.rename(root, b"t", root, b"v", 0, None)
    with fuse_errno(errno.EPERM):
        await ops.ops.link(p0, t, b"1", None)
    with fuse_errno(errno.EPERM):
        await ops.ops.symlink(t, b"1", b"0", None)
    with fuse_errno(errno.EPERM):
        await ops.ops.symlink(root, b"link", b"t", None)
    with fuse_errno(errno.EPERM):
        await ops.ops.mknod(t, b"1", stat.S_IFIFO | 0o644, 0, None)
    with fuse_errno(errno.EPERM):
        await ops.ops.mknod(t, b"1", stat.S_IFREG | 0o644, 0, None)
    assert await ops.listdir("t") == ["0"] and sorted(await ops.listdir()) == ["t", "u"]


async def test_rm_partition_rmdir_topic(ops_fs):
    fs = ops_fs(num_partitions=2)
    await fs.mkdir("t")
    await fs.append("t/0", b"a\n")
    with fuse_errno(errno.ENOTEMPTY):
        await fs.rmdir("t")
    await fs.unlink("t/1")
    with fuse_errno(errno.ENOENT):
        await fs.lookup("t/1")
    await fs.unlink("t/0")
    await fs.rmdir("t")
    assert await fs.listdir() == []
    with fuse_errno(errno.ENOENT):
        await fs.lookup("t")


async def test_unlink_and_rmdir_errors(ops):
    await ops.mkdir("t")
    root = await ops.inode("")
    await each_fails(errno.ENOENT, ops.unlink("t/7"), ops.unlink("t/x"), ops.rmdir("nosuch"),
                     ops.ops.unlink(root, b"nosuch", None))
    await each_fails(errno.EISDIR, ops.ops.unlink(root, b"t", None))  # unlink of a topic directory
    await each_fails(errno.ENOTDIR, ops.ops.rmdir(await ops.inode("t"), b"0", None))


async def test_read_only_refuses_every_change(ops_fs, open_manager):
    writer = ops_fs()
    await writer.mkdir("t")
    await writer.append("t/0", b"kept\n")
    writer.ops.release_all()
    writer.manager.close()
    fs = ops_fs(read_only=True, manager=open_manager())
    with fuse_errno(errno.EROFS):
        await fs.mkdir("u")
    with fuse_errno(errno.EROFS):
        await fs.create("t/1")
    with fuse_errno(errno.EROFS):
        await fs.open("t/0", APPEND)
    with fuse_errno(errno.EROFS):
        await fs.unlink("t/0")
    with fuse_errno(errno.EROFS):
        await fs.setconfig("t", "retention.ms", "1000")
    with fuse_errno(errno.EROFS):
        await fs.removexattr("t", "user.logfs.config.retention.ms")
    assert await fs.cat("t/0") == b"kept\n"
    assert stat.S_IMODE((await fs.getattr("t/0")).st_mode) == 0o444


async def test_readdir_is_sorted_and_stable(ops_fs):
    fs = ops_fs(num_partitions=12)
    for name in ("b", "a", "c"):
        await fs.mkdir(name)
    assert sorted(await fs.listdir()) == ["a", "b", "c"]
    assert await fs.listdir("a") == [str(n) for n in range(12)]


async def test_chmod_chown_persist(ops_fs, open_manager):
    fs = ops_fs()
    await fs.mkdir("t")
    attr = await fs.getattr("t/0")
    attr.st_mode = stat.S_IFREG | 0o600
    attr.st_uid, attr.st_gid = 1234, 5678
    out = await fs.setattr("t/0", attr, update_mode=True, update_uid=True, update_gid=True)
    assert stat.S_IMODE(out.st_mode) == 0o600 and (out.st_uid, out.st_gid) == (1234, 5678)
    fs.ops.release_all()
    fs.manager.close()
    again = ops_fs(manager=open_manager())
    a = await again.getattr("t/0")
    assert stat.S_IMODE(a.st_mode) == 0o600 and (a.st_uid, a.st_gid) == (1234, 5678)

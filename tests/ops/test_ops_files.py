"""Partition files through Operations, with no kernel: appends, reads, refused writes, fsync and stat."""

from __future__ import annotations

import errno
import os
import time

from ops_helpers import APPEND, fuse_errno


async def test_lines_become_records_and_read_back(ops):
    await ops.mkdir("t")
    assert await ops.append("t/0", b"one\ntwo\n") == 8
    await ops.append("t/0", b"three\n")
    assert await ops.cat("t/0") == b"one\ntwo\nthree\n"
    assert await ops.getx("t/0", "log_end_offset") == "3"
    assert (await ops.getattr("t/0")).st_size == 14


async def test_write_visible_to_other_handle_as_soon_as_it_returns(ops):
    await ops.mkdir("t")
    reader = await ops.open("t/0")
    writer = await ops.open("t/0", APPEND)
    await ops.write(writer, b"a\n")
    assert await ops.read(reader, 0, 100) == b"a\n"
    await ops.write(writer, b"b\n")
    assert await ops.read(reader, 2, 100) == b"b\n"
    await ops.release(writer)
    await ops.release(reader)


async def test_reads_at_any_position(ops):
    await ops.mkdir("t")
    lines = b"".join(f"line-{i:04d}\n".encode() for i in range(500))
    await ops.append("t/0", lines)
    fh = await ops.open("t/0")
    for offset in (0, 1, 10, 2999, len(lines) - 1):
        assert await ops.read(fh, offset, 37) == lines[offset:offset + 37]
    assert await ops.read(fh, len(lines), 10) == b""
    assert await ops.read(fh, len(lines) + 100, 10) == b""
    await ops.release(fh)


async def test_partial_line_is_held_until_newline_or_close(ops):
    await ops.mkdir("t")
    fh = await ops.open("t/0", APPEND)
    await ops.write(fh, b"a\npart")
    assert await ops.cat("t/0") == b"a\n"
    await ops.write(fh, b"ial\nrest")
    assert await ops.cat("t/0") == b"a\npartial\n"
    await ops.release(fh)
    assert await ops.cat("t/0") == b"a\npartial\nrest\n"


async def test_a_positioned_write_appends_at_the_end_and_is_eperm_anywhere_else(ops):
    """Without O_APPEND: a write at the end is an append; at any other offset, EPERM and nothing written."""
    await ops.mkdir("t")
    await ops.append("t/0", b"abc\n")
    fh = await ops.open("t/0", os.O_WRONLY)
    for offset in (0, 2, 3, 5, 100):
        with fuse_errno(errno.EPERM):
            await ops.write(fh, b"x\n", offset=offset)
    assert await ops.cat("t/0") == b"abc\n"
    assert await ops.write(fh, b"def\n", offset=4) == 4
    await ops.release(fh)
    assert await ops.cat("t/0") == b"abc\ndef\n"


async def test_truncate_and_o_trunc_are_eperm(ops):
    await ops.mkdir("t")
    await ops.append("t/0", b"abc\n")
    for size in (0, 2, 100):
        attr = await ops.getattr("t/0")
        attr.st_size = size
        with fuse_errno(errno.EPERM):
            await ops.setattr("t/0", attr, update_size=True)
    with fuse_errno(errno.EPERM):
        await ops.open("t/0", os.O_WRONLY | os.O_TRUNC)
    attr = await ops.getattr("t/0")
    assert (await ops.setattr("t/0", attr, update_size=True)).st_size == 4  # to its own size: a no-op
    assert await ops.cat("t/0") == b"abc\n"


async def test_o_trunc_on_an_empty_partition_is_allowed(ops):
    await ops.mkdir("t")
    fh = await ops.open("t/0", os.O_WRONLY | os.O_TRUNC)
    await ops.write(fh, b"x\n")
    await ops.release(fh)
    assert await ops.cat("t/0") == b"x\n"


async def test_line_over_max_message_bytes_is_efbig_and_nothing_appended(ops_fs):
    fs = ops_fs(message_max_bytes=100)
    await fs.mkdir("t")
    fh = await fs.open("t/0", APPEND)
    await fs.write(fh, b"before\n")
    with fuse_errno(errno.EFBIG):
        await fs.write(fh, b"ok\n" + b"x" * 101 + b"\n")
    await fs.write(fh, b"y" * 100 + b"\n")  # exactly the limit
    await fs.release(fh)
    assert await fs.cat("t/0") == b"before\n" + b"y" * 100 + b"\n"


async def test_fsync_makes_appends_durable(ops):
    await ops.mkdir("t")
    fh = await ops.open("t/0", APPEND)
    await ops.write(fh, b"a\nb\n")
    assert await ops.getx("t/0", "recovery_point") == "0"
    await ops.fsync(fh)
    assert await ops.getx("t/0", "recovery_point") == "2"
    await ops.release(fh)


async def test_unknown_handle_is_ebadf(ops):
    with fuse_errno(errno.EBADF):
        await ops.read(999)
    with fuse_errno(errno.EBADF):
        await ops.write(999, b"x\n")


async def test_write_after_partition_removed_is_enoent(ops):
    await ops.mkdir("t")
    fh = await ops.open("t/0", APPEND)
    await ops.unlink("t/0")
    with fuse_errno(errno.ENOENT):
        await ops.write(fh, b"x\n")
    await ops.release(fh)


async def test_open_handle_keeps_its_view_after_removal(ops):
    await ops.mkdir("t")
    await ops.append("t/0", b"kept\n")
    fh = await ops.open("t/0")
    await ops.unlink("t/0")
    assert await ops.read(fh, 0, 100) == b"kept\n"
    await ops.release(fh)


async def test_stat_size_and_mtime_follow_appends(ops, clock):
    await ops.mkdir("t")
    clock.advance(5_000)
    await ops.append("t/0", b"12345\n")
    attr = await ops.getattr("t/0")
    assert attr.st_size == 6 and attr.st_mtime_ns == clock.now_ms * 1_000_000
    assert attr.st_blocks == 1 and attr.st_blksize == 1 << 20


async def test_getattr_of_a_removed_partition_answers_from_the_open_handle(ops_fs, clock):
    """`exec 7< t/1; rm t/1; cat <&7`: cat fstats the descriptor (getattr of the removed inode) before reading."""
    fs = ops_fs(num_partitions=2)
    await fs.mkdir("t")
    await fs.append("t/1", b"kept\nlines\n")
    appended = clock.now_ms
    inode = await fs.inode("t/1")
    fh = await fs.open("t/1")
    clock.advance(60_000)
    await fs.unlink("t/1")
    attr = await fs.ops.getattr(inode, None)
    assert attr.st_size == 11 and attr.st_nlink == 0 and attr.st_mtime_ns == appended * 1_000_000
    assert await fs.read(fh, 0, 100) == b"kept\nlines\n"
    await fs.release(fh)
    with fuse_errno(errno.ENOENT):
        await fs.ops.getattr(inode, None)  # no handle left: gone
    with fuse_errno(errno.ENOENT):
        await fs.lookup("t/1")


async def test_mtime_after_crash_and_restart_is_the_newest_record(ops_fs, open_manager, clock):
    fs = ops_fs()
    await fs.mkdir("t")
    clock.advance(1000)
    await fs.append("t/0", b"a\nb\n")
    appended = clock.now_ms
    fs.manager.get_log("t", 0).roll()  # a time-based roll leaves the active segment empty
    fs.ops.release_all()
    fs.manager.abandon()  # kill -9
    clock.advance(3_600_000)
    again = ops_fs(manager=open_manager())
    assert (await again.getattr("t/0")).st_mtime_ns == appended * 1_000_000


async def test_setting_a_given_time_is_eperm_and_now_is_accepted(ops, clock):
    """st_mtime is the last append's time. touch (the times set to "now") is accepted and changes nothing;
    touch -d, cp -p, rsync -t (a given time) fail with EPERM instead of returning 0 and changing nothing."""
    await ops.mkdir("t")
    await ops.append("t/0", b"a\n")
    before = (await ops.getattr("t/0")).st_mtime_ns
    for path in ("t/0", "t"):
        attr = await ops.getattr(path)
        attr.st_mtime_ns = attr.st_atime_ns = 946_684_800 * 10**9  # 2000-01-01
        with fuse_errno(errno.EPERM):
            await ops.setattr(path, attr, update_mtime=True, update_atime=True)
        with fuse_errno(errno.EPERM):
            await ops.setattr(path, attr, update_atime=True)
        attr.st_mtime_ns = attr.st_atime_ns = time.time_ns()  # what pyfuse3 passes for UTIME_NOW
        await ops.setattr(path, attr, update_mtime=True, update_atime=True)
    assert (await ops.getattr("t/0")).st_mtime_ns == before


async def test_topic_mtime_is_its_newest_append(ops_fs, clock):
    fs = ops_fs(num_partitions=2)
    await fs.mkdir("t")
    await fs.mkdir("u")
    clock.advance(10_000)
    await fs.append("t/0", b"a\n")
    first = clock.now_ms
    clock.advance(10_000)
    await fs.append("t/1", b"b\n")
    assert (await fs.getattr("t")).st_mtime_ns == clock.now_ms * 1_000_000
    assert (await fs.lookup("t")).st_mtime_ns == clock.now_ms * 1_000_000
    clock.advance(10_000)
    await fs.append("u/0", b"c\n")
    await fs.append("u/1", b"d\n")
    assert (await fs.getattr("t")).st_mtime_ns == (first + 10_000) * 1_000_000
    listed = await fs.readdir()  # the listing gives the same times
    assert {name: attrs.st_mtime_ns for name, attrs in listed.items()} == {
        "t": (first + 10_000) * 1_000_000, "u": clock.now_ms * 1_000_000}


async def test_key_separator_and_null_marker(ops):
    await ops.mkdir("t")
    await ops.setconfig("t", "logfs.key.separator", "=")
    await ops.setconfig("t", "logfs.null.marker", "NULL")
    await ops.append("t/0", b"k1=v1\nnokey\nk2=NULL\nk3=a=b\n")
    records = ops.manager.get_log("t", 0).read(0, 1 << 20)
    assert [(r.key, r.value) for r in records] == [(b"k1", b"v1"), (None, b"nokey"), (b"k2", None),
                                                   (b"k3", b"a=b")]
    assert await ops.cat("t/0") == b"k1=v1\nnokey\nk2=NULL\nk3=a=b\n"


async def test_open_handle_keeps_its_view_across_retention(ops_fs, clock):
    from logfs.storage.local.retention import delete_old_segments

    fs = ops_fs(log_segment_bytes=300, log_retention_ms=1000)
    await fs.mkdir("t")
    lines = b"".join(b"line-%03d\n" % i for i in range(60))
    await fs.append("t/0", lines)
    fh = await fs.open("t/0")
    clock.advance(5000)
    await fs.append("t/0", b"late\n")
    plog = fs.manager.get_log("t", 0)
    assert delete_old_segments(plog, clock.now_ms) > 0 and plog.log_start_offset > 0
    assert await fs.read_all(fh, size=100) == lines + b"late\n"  # the handle's view, plus what came since
    fresh = await fs.cat("t/0")
    assert fresh.endswith(b"late\n") and len(fresh) < len(lines)  # new opens start at the new log start
    assert (await fs.getattr("t/0")).st_size == len(fresh)
    await fs.release(fh)


async def test_a_refused_time_change_changes_nothing_else(ops):
    await ops.mkdir("t")
    attr = await ops.getattr("t/0")
    attr.st_mode = attr.st_mode & ~0o777 | 0o600
    attr.st_mtime_ns = 946_684_800 * 10**9
    with fuse_errno(errno.EPERM):
        await ops.setattr("t/0", attr, update_mode=True, update_mtime=True)
    assert (await ops.getattr("t/0")).st_mode & 0o777 == 0o644

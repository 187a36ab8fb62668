"""Partition files through Operations, with no kernel: appends, reads, refused writes, fsync and stat."""

from __future__ import annotations

import errno
import os

from conftest import APPEND, fuse_errno


async def test_lines_become_records_and_read_back(fs):
    await fs.mkdir("t")
    assert await fs.append("t/0", b"one\ntwo\n") == 8
    await fs.append("t/0", b"three\n")
    assert await fs.cat("t/0") == b"one\ntwo\nthree\n"
    assert await fs.getx("t/0", "log_end_offset") == "3"
    assert (await fs.getattr("t/0")).st_size == 14


async def test_write_visible_to_other_handle_as_soon_as_it_returns(fs):
    await fs.mkdir("t")
    reader = await fs.open("t/0")
    writer = await fs.open("t/0", APPEND)
    await fs.write(writer, b"a\n")
    assert await fs.read(reader, 0, 100) == b"a\n"
    await fs.write(writer, b"b\n")
    assert await fs.read(reader, 2, 100) == b"b\n"
    await fs.release(writer)
    await fs.release(reader)


async def test_reads_at_any_position(fs):
    await fs.mkdir("t")
    lines = b"".join(f"line-{i:04d}\n".encode() for i in range(500))
    await fs.append("t/0", lines)
    fh = await fs.open("t/0")
    for offset in (0, 1, 10, 2999, len(lines) - 1):
        assert await fs.read(fh, offset, 37) == lines[offset:offset + 37]
    assert await fs.read(fh, len(lines), 10) == b""
    assert await fs.read(fh, len(lines) + 100, 10) == b""
    await fs.release(fh)


async def test_partial_line_is_held_until_newline_or_close(fs):
    await fs.mkdir("t")
    fh = await fs.open("t/0", APPEND)
    await fs.write(fh, b"a\npart")
    assert await fs.cat("t/0") == b"a\n"
    await fs.write(fh, b"ial\nrest")
    assert await fs.cat("t/0") == b"a\npartial\n"
    await fs.release(fh)
    assert await fs.cat("t/0") == b"a\npartial\nrest\n"


async def test_write_at_end_without_o_append_is_an_append(fs):
    await fs.mkdir("t")
    await fs.append("t/0", b"abc\n")
    fh = await fs.open("t/0", os.O_WRONLY)
    assert await fs.write(fh, b"def\n", offset=4) == 4
    await fs.release(fh)
    assert await fs.cat("t/0") == b"abc\ndef\n"


async def test_write_anywhere_but_the_end_is_eperm(fs):
    await fs.mkdir("t")
    await fs.append("t/0", b"abc\n")
    fh = await fs.open("t/0", os.O_WRONLY)
    for offset in (0, 2, 3, 5, 100):
        with fuse_errno(errno.EPERM):
            await fs.write(fh, b"x\n", offset=offset)
    await fs.release(fh)
    assert await fs.cat("t/0") == b"abc\n"


async def test_truncate_and_o_trunc_are_eperm(fs):
    await fs.mkdir("t")
    await fs.append("t/0", b"abc\n")
    for size in (0, 2, 100):
        attr = await fs.getattr("t/0")
        attr.st_size = size
        with fuse_errno(errno.EPERM):
            await fs.setattr("t/0", attr, update_size=True)
    with fuse_errno(errno.EPERM):
        await fs.open("t/0", os.O_WRONLY | os.O_TRUNC)
    attr = await fs.getattr("t/0")
    assert (await fs.setattr("t/0", attr, update_size=True)).st_size == 4  # to its own size: a no-op
    assert await fs.cat("t/0") == b"abc\n"


async def test_o_trunc_on_an_empty_partition_is_allowed(fs):
    await fs.mkdir("t")
    fh = await fs.open("t/0", os.O_WRONLY | os.O_TRUNC)
    await fs.write(fh, b"x\n")
    await fs.release(fh)
    assert await fs.cat("t/0") == b"x\n"


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


async def test_fsync_makes_appends_durable(fs):
    await fs.mkdir("t")
    fh = await fs.open("t/0", APPEND)
    await fs.write(fh, b"a\nb\n")
    assert await fs.getx("t/0", "recovery_point") == "0"
    await fs.fsync(fh)
    assert await fs.getx("t/0", "recovery_point") == "2"
    await fs.release(fh)


async def test_unknown_handle_is_ebadf(fs):
    with fuse_errno(errno.EBADF):
        await fs.read(999)
    with fuse_errno(errno.EBADF):
        await fs.write(999, b"x\n")


async def test_write_after_partition_removed_is_enoent(fs):
    await fs.mkdir("t")
    fh = await fs.open("t/0", APPEND)
    await fs.unlink("t/0")
    with fuse_errno(errno.ENOENT):
        await fs.write(fh, b"x\n")
    await fs.release(fh)


async def test_open_handle_keeps_its_view_after_removal(fs):
    await fs.mkdir("t")
    await fs.append("t/0", b"kept\n")
    fh = await fs.open("t/0")
    await fs.unlink("t/0")
    assert await fs.read(fh, 0, 100) == b"kept\n"
    await fs.release(fh)


async def test_stat_size_and_mtime_follow_appends(fs, clock):
    await fs.mkdir("t")
    clock.advance(5_000)
    await fs.append("t/0", b"12345\n")
    attr = await fs.getattr("t/0")
    assert attr.st_size == 6 and attr.st_mtime_ns == clock.now_ms * 1_000_000
    assert attr.st_blocks == 1 and attr.st_blksize == 1 << 20

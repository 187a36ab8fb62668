"""CONTRACT section 4, "Positions belong to a view", at the handler level: an xattr asked of the inode an open
descriptor holds (``fgetxattr``: FUSE's GETXATTR carries the inode) answers in that descriptor's view, after
DeleteRecords, compaction and a change of the line format; the path answers in the view a new open gets; an open
whose view would differ from the readers already on its inode gets a twin of their view, or, when there is none to
copy, ESTALE (the kernel looks the name up again)."""

from __future__ import annotations

import errno
import types

import pytest

from logfs.storage.cleaner.compaction import OffsetMap, clean, cleanable_range
from logfs.storage.local.retention import delete_old_segments
from ops_helpers import fuse_errno

PX = "user.logfs."


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b"rec-%05d-%s\n" % (i, b"v" * (i % 17)) for i in range(start, start + n)]


async def fgetx(fs, fh: int, key: str) -> str:
    """``fgetxattr``: the kernel sends GETXATTR for the inode the descriptor holds."""
    inode = fs.ops.handles.open[fh].inode
    return (await fs.ops.getxattr(inode, (PX + key).encode(), None)).decode()


async def check_positions(fs, fh: int, written: list[bytes], offsets) -> None:
    for n in offsets:
        pos = int(await fgetx(fs, fh, f"position.{n}"))
        line = written[n]
        assert await fs.read(fh, pos, len(line)) == line, n
        assert int(await fgetx(fs, fh, f"offset.{pos}")) == n
        assert int(await fgetx(fs, fh, f"offset.{pos + len(line) - 1}")) == n


@pytest.fixture
async def loaded(ops_fs):
    fs = ops_fs(num_partitions=1, log_segment_bytes=1024, log_index_interval_bytes=256,
                log_segment_delete_delay_ms=0)
    await fs.mkdir("t")
    written = lines(400)
    for i in range(0, 400, 20):
        await fs.append("t/0", b"".join(written[i:i + 20]))
    return fs, written


async def test_descriptor_answers_in_its_view_after_delete_records(loaded):
    fs, written = loaded
    first = await fs.open("t/0")
    await fs.setxattr("t/0", PX + "log_start_offset", "100")
    second = await fs.open("t/0")
    await fs.setxattr("t/0", PX + "log_start_offset", "250")
    third = await fs.open("t/0")
    # Three descriptors, three inodes, three views; each answers in its own.
    inodes = {fs.ops.handles.open[fh].inode for fh in (first, second, third)}
    assert len(inodes) == 3
    for fh, start in ((first, 0), (second, 100), (third, 250)):
        assert await fgetx(fs, fh, "log_start_offset") == str(start)
        assert await fgetx(fs, fh, f"position.{start}") == "0"
        await check_positions(fs, fh, written, range(start, 400, 7))
        with fuse_errno(errno.ENODATA):
            await fgetx(fs, fh, f"position.{start - 1}") if start else await fgetx(fs, fh, "position.401")
    # The path answers for a new open.
    assert await fs.getx("t/0", "log_start_offset") == "250"
    assert await fs.getx("t/0", "position.250") == "0"
    # Appends after the opens have positions in every view.
    more = lines(30, start=400)
    await fs.append("t/0", b"".join(more))
    written += more
    for fh in (first, second, third):
        await check_positions(fs, fh, written, range(400, 430, 3))
        assert int(await fgetx(fs, fh, "position.430")) == len(await fs.read_all(fh))
    for fh in (first, second, third):
        await fs.release(fh)


async def test_descriptor_time_lookup_in_its_view(ops_fs, clock):
    fs = ops_fs(num_partitions=1, log_segment_bytes=1024, log_segment_delete_delay_ms=0)
    await fs.mkdir("t")
    written = lines(200)
    for i in range(0, 200, 10):
        await fs.append("t/0", b"".join(written[i:i + 10]))
        clock.advance(1000)
    fh = await fs.open("t/0")
    at_50 = await fs.getx("t/0", "time.0")
    assert at_50 == "0"
    await fs.setxattr("t/0", PX + "log_start_offset", "150")
    assert await fs.getx("t/0", "time.0") == "150"  # a new open starts at 150
    assert await fgetx(fs, fh, "time.0") == "0"  # the descriptor's view still starts at 0
    await fs.release(fh)


async def keyed_topic(fs, key: bytes, keys: int, count: int, chunk: int) -> list[bytes]:
    """Topic ``t`` keyed by ``=``: ``count`` lines ``<key><i % keys>=value-<i>``, appended ``chunk`` at a time."""
    await fs.mkdir("t")
    await fs.setconfig("t", "logfs.key.separator", "=")
    written = [b"%s%d=value-%04d\n" % (key, i % keys, i) for i in range(count)]
    for i in range(0, count, chunk):
        await fs.append("t/0", b"".join(written[i:i + chunk]))
    return written


async def test_descriptor_answers_in_its_view_after_compaction(ops_fs, clock):
    fs = ops_fs(num_partitions=1, log_segment_bytes=600, log_cleanup_policy="compact",
                log_segment_delete_delay_ms=0, log_cleaner_delete_retention_ms=0)
    written = await keyed_topic(fs, b"k", keys=5, count=300, chunk=10)
    fh = await fs.open("t/0")
    plog = fs.manager.logs[("t", 0)]
    result = clean(plog, cleanable_range(plog, None, clock.time_ms()), OffsetMap(10_000), clock.time_ms())
    assert result.end_offset > 0
    compacted = await fs.cat("t/0")
    assert len(compacted) < len(b"".join(written))
    # The descriptor still reads (and positions) the log as it was when opened.
    await check_positions(fs, fh, written, range(0, 300, 11))
    # The path answers in the compacted view: a position there leads to the same record in a new open.
    new = await fs.open("t/0")
    assert fs.ops.handles.open[new].inode != fs.ops.handles.open[fh].inode
    for n in range(280, 300):
        pos = int(await fs.getx("t/0", f"position.{n}"))
        assert await fs.read(new, pos, len(written[n])) == written[n]
    await fs.release(fh)
    await fs.release(new)


async def test_descriptor_keeps_its_line_format(ops_fs):
    fs = ops_fs(num_partitions=1, log_segment_bytes=1024, log_index_interval_bytes=256)
    written = await keyed_topic(fs, b"key", keys=7, count=300, chunk=15)
    fh = await fs.open("t/0")
    await fs.setconfig("t", "logfs.key.separator", "::")  # every line one byte longer from now on
    assert (await fs.cat("t/0")).startswith(b"key0::value-0000\nkey1::")
    await check_positions(fs, fh, written, range(0, 300, 13))  # the descriptor reads, and positions, "="
    assert int(await fs.getx("t/0", "position.10")) == int(await fgetx(fs, fh, "position.10")) + 10
    await fs.release(fh)


async def test_open_of_an_inode_whose_view_moved_gets_its_readers_view(loaded):
    """The view moves between the kernel's lookup and its open: the open gets a twin of the view of the readers
    already on that inode (the file it looked up), and the name a new inode for later lookups."""
    fs, written = loaded
    inode = await fs.inode("t/0")  # the kernel's lookup
    held = (await fs.ops.open(inode, 0, None)).fh
    await fs.setxattr("t/0", PX + "log_start_offset", "100")  # between another open's lookup and its open
    late = (await fs.ops.open(inode, 0, None)).fh
    assert fs.ops.handles.open[late].inode == inode
    assert await fgetx(fs, late, "log_start_offset") == "0"
    assert (await fs.read_all(late)).startswith(written[0])
    await check_positions(fs, late, written, range(0, 400, 9))
    await fs.release(held)  # (the twin pins its segments itself)
    await check_positions(fs, late, written, range(3, 400, 9))
    again = await fs.inode("t/0")
    assert again != inode
    fresh = (await fs.ops.open(again, 0, None)).fh
    assert await fgetx(fs, fresh, "log_start_offset") == "100"
    await fs.release(late)
    await fs.release(fresh)
    # With no handle left on it, the name's inode serves the new view to whoever opens it.
    await fs.setxattr("t/0", PX + "log_start_offset", "200")
    last = (await fs.ops.open(again, 0, None)).fh
    assert await fgetx(fs, last, "log_start_offset") == "200"
    await fs.release(last)


async def test_open_is_estale_when_the_readers_view_cannot_be_copied(loaded, clock):
    """The readers on the inode let segments go (read past them, and retention removed them): a twin could not
    read from its start, so the open is ESTALE and the kernel looks the name up again (a new inode, the new view)."""
    fs, written = loaded
    inode = await fs.inode("t/0")
    held = (await fs.ops.open(inode, 0, None)).fh
    assert await fs.read_all(held) == b"".join(written)  # read to the end
    await fs.setxattr("t/0", PX + "log_start_offset", "300")
    plog = fs.manager.logs[("t", 0)]
    assert delete_old_segments(plog, clock.time_ms()) > 0
    await fs.read(held, 0, 10)  # (a read after the layout changed lets the passed segments go)
    assert fs.ops.handles.open[held].view._dropped
    with fuse_errno(errno.ESTALE):
        await fs.ops.open(inode, 0, None)
    again = await fs.inode("t/0")
    assert again != inode
    fresh = (await fs.ops.open(again, 0, None)).fh
    assert await fgetx(fs, fresh, "log_start_offset") == "300"
    await check_positions(fs, fresh, written, range(300, 400, 7))
    with fuse_errno(errno.EIO):  # the held descriptor's own view: a removed range it had passed
        await fgetx(fs, held, "position.5")
    await fs.release(held)
    await fs.release(fresh)


async def test_asking_process_gets_its_own_handle(loaded):
    """Handles of one inode have the same positions; the asker's own handle answers when it has one."""
    fs, written = loaded
    inode = await fs.inode("t/0")
    a = (await fs.ops.open(inode, 0, types.SimpleNamespace(pid=111, uid=0))).fh
    b = (await fs.ops.open(inode, 0, types.SimpleNamespace(pid=222, uid=0))).fh
    assert fs.ops.xattrs.handle_for(inode, types.SimpleNamespace(pid=222)) is fs.ops.handles.open[b]
    assert fs.ops.xattrs.handle_for(inode, types.SimpleNamespace(pid=111)) is fs.ops.handles.open[a]
    await fs.release(a)
    await fs.release(b)


async def test_write_only_descriptor_answers_for_the_log(loaded):
    """A handle that cannot read has no view to seek in: its inode answers as the path does."""
    fs, written = loaded
    fh = await fs.open("t/0", flags=0o1 | 0o2000)  # O_WRONLY | O_APPEND
    await fs.setxattr("t/0", PX + "log_start_offset", "100")
    assert await fgetx(fs, fh, "log_start_offset") == "100"
    await fs.release(fh)


async def test_the_log_moving_while_an_answer_is_made_never_shrinks_an_open_file(loaded):
    """Retention (or DeleteRecords) runs in the engine's threads: the log start can move between a request's check
    of an inode held by open handles and its answer. A ``getattr`` of that inode (``fstat`` of ``tail -f``) still
    answers its handles' size, never the moved log's smaller one (GNU tail then says "file truncated", reads again
    from 0 and gets EIO: seen in a clean-clone run under load); a lookup of the name answers a new inode with the
    moved log's size. The move is made at the very point of the window, each time."""
    fs, written = loaded
    inode = await fs.inode("t/0")
    held = (await fs.ops.open(inode, 0, None)).fh
    size = (await fs.ops.getattr(inode, None)).st_size
    assert size == len(b"".join(written))
    plog = fs.manager.logs[("t", 0)]
    inodes = fs.ops.inodes
    checked = inodes.retire_if_moved

    def then_retention(ino):  # the request's check, then retention moves the start before the answer is made
        checked(ino)
        plog.increment_log_start_offset(100)

    inodes.retire_if_moved = then_retention
    try:
        attrs = await fs.ops.getattr(inode, None)
    finally:
        del inodes.retire_if_moved
    assert (attrs.st_ino, attrs.st_size, attrs.st_nlink) == (inode, size, 0)  # the handle's file, as it was
    assert inode not in inodes  # ... and the name has a new inode, with the moved log
    named = await fs.lookup("t/0")
    assert named.st_ino != inode and named.st_size == len(b"".join(written[100:]))

    # The same window in a lookup: between the name's inode and its attributes.
    again = named.st_ino
    late = (await fs.ops.open(again, 0, None)).fh
    given = inodes.partition

    def then_delete_records(topic, partition):
        ino = given(topic, partition)
        plog.increment_log_start_offset(200)
        return ino

    inodes.partition = then_delete_records
    try:
        named = await fs.lookup("t/0")
    finally:
        del inodes.partition
    assert named.st_ino not in (inode, again) and named.st_size == len(b"".join(written[200:]))
    assert (await fs.ops.getattr(again, None)).st_size == len(b"".join(written[100:]))  # the late handle's file
    assert (await fs.ops.getattr(inode, None)).st_size == size
    for fh in (held, late):
        await fs.release(fh)

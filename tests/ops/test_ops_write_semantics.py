"""What write(), fsync() and release() do, through the Operations class itself (no kernel, no mount): refused
lines are refused whole however they are split, fsync leaves a held partial line held, a compacted topic refuses
keyless lines, and the blocking work of the write path (flush.messages, the rollback of a failed append) never
runs on the trio thread. The kernel's part (a write() over 1 MiB cut into requests) is in
tests/e2e/test_hardening_write.py."""

from __future__ import annotations

import errno
import os
import subprocess
import threading

import pytest

from ops_helpers import APPEND


# -- a line over max.message.bytes is refused whole ---------------------------------------------------------
async def test_the_issues_sequence_appends_no_byte_of_the_refused_line(ops_fs):
    """Issue 13.1: max.message.bytes=100; `before\\n`, 60 bytes (taken), 60 more (EFBIG), `\\n`, `after\\n`."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"before\n") == 7
    assert await f.write(fh, b"a" * 60) == 60
    assert await f.write_errno(fh, b"b" * 60) == errno.EFBIG
    assert await f.write(fh, b"\n") == 1  # the end of the refused line: taken, dropped
    assert await f.write(fh, b"after\n") == 6
    await f.ops.release(fh)
    assert f.values() == [b"before", b"after"]


async def test_the_rest_of_a_refused_line_fails_until_its_newline(ops_fs):
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"a" * 90) == 90
    assert await f.write_errno(fh, b"b" * 20) == errno.EFBIG
    assert await f.write_errno(fh, b"c" * 5) == errno.EFBIG  # still the refused line
    assert await f.write(fh, b"ccc\nnext\nheld") == 13  # its newline ends it; what follows is appended
    assert f.values() == [b"next"]
    await f.ops.release(fh)
    assert f.values() == [b"next", b"held"]


async def test_a_writer_resending_after_efbig_appends_no_fragment(ops_fs):
    """Python's BufferedWriter keeps what a failed write() did not take and sends it again with what comes
    next; a loop writer (cat, dd, os.write loops) resends the rest after the short write the kernel makes of
    a request that failed after earlier requests of the same write() were taken."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"x" * 60) == 60
    assert await f.write_errno(fh, b"y" * 60) == errno.EFBIG
    assert await f.write(fh, b"y" * 60 + b"\n") == 61  # resent, with the newline now
    assert await f.write(fh, b"after\n") == 6
    # The kernel's split: the refused write carried the line's end and more lines; the caller resends it.
    assert await f.write(fh, b"z" * 80) == 80
    tail = b"z" * 40 + b"\nok1\nok2\n"
    assert await f.write_errno(fh, tail) == errno.EFBIG
    assert await f.write(fh, tail) == len(tail)
    await f.ops.release(fh)
    assert f.values() == [b"after", b"ok1", b"ok2"]


async def test_a_held_line_refused_with_a_long_line_after_it(ops_fs):
    """Both the held line and the partial line after it are too long: the held bytes are dropped all the
    same (they were never appended at close, whichever check failed first)."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"a" * 60) == 60
    refused = b"b" * 60 + b"\n" + b"c" * 101
    assert await f.write_errno(fh, refused) == errno.EFBIG
    assert await f.write_errno(fh, refused) == errno.EFBIG  # resent: its "\n" ends the line, the rest fails
    await f.ops.release(fh)
    assert f.values() == []


async def test_a_refused_write_that_starts_the_line_leaves_the_handle_as_it_was(ops_fs):
    """Nothing of the line was taken before: the writer knows nothing of it was written, and the next write
    starts a new line (Python's logging drops a message whose write failed and goes on with the next)."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", APPEND)
    assert await f.write_errno(fh, b"x" * 101) == errno.EFBIG
    assert await f.write(fh, b"after\n") == 6
    assert await f.write(fh, b"p" * 50) == 50
    # A long line after a complete one: all of the write refused; the held 50 bytes stay held.
    assert await f.write_errno(fh, b"q\n" + b"r" * 101) == errno.EFBIG
    assert await f.write_errno(fh, b"q\n" + b"r" * 101 + b"\nok\n") == errno.EFBIG
    assert await f.write(fh, b"q\n") == 2
    assert await f.write(fh, b"e" * 100 + b"\n") == 101  # exactly the limit
    await f.ops.release(fh)
    assert f.values() == [b"after", b"p" * 50 + b"q", b"e" * 100]


async def test_a_positioned_writer_keeps_its_offset_across_a_refused_line(ops_fs):
    """Without O_APPEND a write must land at the end of the file; bytes taken and dropped move the writer's
    file position (the kernel's) without growing the file, and are counted."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 100})
    fh = await f.open("t/0", os.O_WRONLY)
    pos = 0
    for data, ok in [(b"one\n", True), (b"a" * 60, True), (b"b" * 60, False), (b"b\n", True), (b"two\n", True)]:
        if ok:
            pos += await f.write(fh, data, offset=pos)
        else:
            assert await f.write_errno(fh, data, offset=pos) == errno.EFBIG
    assert await f.write_errno(fh, b"x\n", offset=0) == errno.EPERM
    await f.ops.release(fh)
    assert f.values() == [b"one", b"two"]


async def test_one_size_rule_key_plus_value(ops_fs):
    """Issue 14.2: what counts against max.message.bytes is the record (key + value), as the log counts it,
    not the line (the handle used to count the separator too, and refused a record the log accepts)."""
    f = ops_fs()
    await f.topic(**{"max.message.bytes": 9, "logfs.key.separator": "=", "logfs.null.marker": "NULL"})
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"k=" + b"v" * 8 + b"\n") == 11
    assert await f.write_errno(fh, b"kk=" + b"v" * 8 + b"\n") == errno.EFBIG
    # A partial line is refused only once no ending can fit: "k=NUL" may still end as a tombstone.
    assert await f.write(fh, b"kkkkkkkkk=NU") == 12
    assert await f.write(fh, b"LL\n") == 3
    assert await f.write(fh, b"kkkkkkkk") == 8
    assert await f.write(fh, b"=") == 1
    assert await f.write_errno(fh, b"xy") == errno.EFBIG
    assert await f.write(fh, b"\n") == 1
    await f.ops.release(fh)
    assert f.records() == [(b"k", b"v" * 8), (b"k" * 9, None)]


# -- fsync ----------------------------------------------------------------------------------------------------
async def test_fsync_leaves_a_partial_line_held(ops_fs):
    """Issue 13.2: write("a\\npart"), fsync, write("ial\\n") gives records `a` and `partial`."""
    f = ops_fs()
    await f.topic()
    fh = await f.open("t/0", APPEND)
    await f.write(fh, b"a\npart")
    await f.ops.fsync(fh, False)
    assert f.values() == [b"a"]
    assert f.log().recovery_point == 1  # the complete lines are durable
    await f.write(fh, b"ial\n")
    await f.ops.release(fh)
    assert f.values() == [b"a", b"partial"]


# -- keyless lines on a compacted topic -----------------------------------------------------------------------
async def test_a_compacted_topic_refuses_keyless_lines(ops_fs, caplog):
    """Issue 13.3: EINVAL, and nothing of the write appended (Kafka: "Compacted topic cannot accept message
    without key")."""
    f = ops_fs()
    await f.topic(**{"cleanup.policy": "compact", "logfs.key.separator": "="})
    fh = await f.open("t/0", APPEND)
    assert await f.write_errno(fh, b"k1=v1\nno key\nk2=v2\n") == errno.EINVAL
    assert await f.write(fh, b"k1=v1\n") == 6
    # A keyless line begun in earlier writes: refused at its newline, its held start dropped with it.
    assert await f.write(fh, b"no") == 2
    assert await f.write_errno(fh, b" key\n") == errno.EINVAL
    assert await f.write(fh, b"k2=v2\n") == 6  # no skipping: any ending of a keyless line is keyless
    assert await f.write(fh, b"held") == 4
    await f.ops.release(fh)  # an unterminated keyless line at close: not appended, and logged
    assert "not appended" in caplog.text
    assert f.records() == [(b"k1", b"v1"), (b"k2", b"v2")]


async def test_a_held_line_over_a_limit_lowered_meanwhile_is_not_appended_at_close(ops_fs, caplog):
    f = ops_fs()
    ino = await f.topic()
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"a" * 50) == 50
    await f.ops.setxattr(ino, b"user.logfs.config.max.message.bytes", b"10", None)
    await f.ops.release(fh)
    assert "not appended" in caplog.text and f.values() == []


async def test_a_compacted_topic_without_separator_refuses_every_line(ops_fs):
    f = ops_fs()
    await f.topic(**{"cleanup.policy": "compact,delete"})
    fh = await f.open("t/0", APPEND)
    assert await f.write_errno(fh, b"value\n") == errno.EINVAL
    assert await f.write_errno(fh, b"partial") == errno.EINVAL  # no ending of it can have a key
    await f.ops.release(fh)
    assert f.values() == []


# -- blocking work off the trio thread ------------------------------------------------------------------------
async def test_flush_messages_fsyncs_in_a_worker_thread_before_write_returns(ops_fs, monkeypatch):
    """Issue 13.17 / 14.7: with flush.messages=1 every write() is durable when it returns, and its fsync runs
    in a worker thread, not on the trio thread that serves every FUSE request."""
    f = ops_fs(log_flush_interval_messages=1)
    await f.topic()
    trio_thread = threading.get_ident()
    threads = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        threads.append(threading.get_ident())
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    fh = await f.open("t/0", APPEND)
    assert await f.write(fh, b"a\nb\n") == 4
    assert f.log().recovery_point == 2
    assert await f.write(fh, b"c") == 1  # a held partial line: nothing to flush yet
    await f.ops.release(fh)  # committed at close, and flushed
    assert f.log().recovery_point == 3
    assert threads and trio_thread not in threads


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
async def test_a_failed_append_unlinks_nothing_on_the_trio_thread(ops_fs, open_manager, tmp_path):
    """A write that fills the disk in the middle is taken back whole (ENOSPC, nothing appended); the segments
    it rolled to are renamed .deleted and left for the service's purge (a worker thread), not unlinked in the
    request."""
    data = tmp_path / "small"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], check=True)
    try:
        f = ops_fs(manager=open_manager(data_dir=data / "store"))
        await f.topic(**{"segment.bytes": 16384, "segment.index.bytes": 4096})
        fh = await f.open("t/0", APPEND)
        assert await f.write(fh, b"first\n") == 6
        st = os.statvfs(data)
        with open(data / "filler", "wb") as filler:
            filler.write(b"\0" * (st.f_bavail * st.f_frsize - 64 * 1024))
        lines = b"".join(b"%06d" % i + b"." * 193 + b"\n" for i in range(1000))  # 200 KB: many segments
        assert await f.write_errno(fh, lines) == errno.ENOSPC
        plog = f.log()
        assert plog.log_end_offset == 1 and f.values() == [b"first"]
        deleted = [n for n in os.listdir(plog.directory) if n.endswith(".deleted")]
        assert deleted and plog.deleted_segments  # renamed at once, unlinked later
        os.unlink(data / "filler")
        queued = len(plog.deleted_segments)
        assert plog.purge_deleted() == queued
        assert not [n for n in os.listdir(plog.directory) if n.endswith(".deleted")]
        assert await f.write(fh, b"again\n") == 6
        await f.ops.release(fh)
        assert f.values() == [b"first", b"again"]
    finally:
        f.ops.release_all()
        f.manager.close()
        subprocess.run(["umount", str(data)], check=True)

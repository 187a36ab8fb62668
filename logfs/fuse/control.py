"""The mount's own entries beside the topics: the Spark sink's staging directory and its commit file.

``MOUNT/.logfs-staging/``
    A directory of plain files (kept in ``DATA_DIR/.logfs-staging``, :mod:`logfs.storage.publish.staging`): the sink's
    tasks create a file each (never an existing name), write it (anywhere: the kernel may send pieces of a large
    write out of order), and may read, fsync, list and remove them. No subdirectories, renames or truncation.

``MOUNT/.logfs-commit``
    The daemon's one interface for publishing them (:mod:`logfs.storage.publish.transactions`). A request is one JSON line
    written to it: ``{"op": "commit", "app": ..., "version": ..., "parts": [[topic, partition, [[file, position,
    length], ...]], ...], "cleanup": "prefix.", "close": true}``, ``{"op": "abort", "prefix": "prefix."}`` or
    ``{"op": "status", "app": ..., "version": ...}`` (``abort`` takes ``"close": false`` to leave the prefix open). The ``write()`` that completes the line returns once the
    request is answered: its full length on success, else the request's errno (EINVAL for a malformed request or
    staged data, ENOENT for a topic, partition or staged file that does not exist, EFBIG for a record over
    ``max.message.bytes`` or a partition's share over ``segment.bytes``, ENOSPC, EIO...). Then ``pread(fd, n, 0)``
    returns the answer as one JSON line: ``{"ok": true, "duplicate": false, "offsets": {"topic": {"0": [first,
    last]}}}`` or ``{"ok": false, "errno": "EFBIG", "error": "the reason"}``. The answer reads as from a pipe
    (each read goes on where the last ended, whatever its offset, until the answer's end), so ``exec 3<>
    .logfs-commit; echo "$request" >&3; head -n1 <&3`` works from a shell. One answer per open file: each writer
    opens its own.

Neither is listed by a ``readdir`` of the root (``ls``, globs and Spark's listing of ``MOUNT/*`` see topics only);
both answer ``lookup``, and ``getfattr -n user.logfs.sink.protocol MOUNT`` answers ``1`` on a logfs mount.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat

import pyfuse3

from ..storage.errors import LogfsError, RecordTooLargeError
from ..storage.publish.transactions import MAX_REQUEST_BYTES
from .errors import errno_for, fail

# As the partition files' (logfs.fuse.operations): attributes are never cached, 1 MiB preferred I/O size.
ATTR_TIMEOUT = 0.0
BLOCK_SIZE = 1 << 20

log = logging.getLogger(__name__)

SINK_PROTOCOL_XATTR = "user.logfs.sink.protocol"
SINK_PROTOCOL = b"1"


class StagedFileHandle:
    """An open staged file: its descriptor in DATA_DIR/.logfs-staging."""

    __slots__ = ("name", "fd", "writable")

    def __init__(self, name: str, fd: int, writable: bool):
        self.name, self.fd, self.writable = name, fd, writable

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, offset: int, data) -> int:
        if not self.writable:
            fail(errno.EBADF)
        return os.pwrite(self.fd, data, offset)

    def sync(self) -> None:
        os.fsync(self.fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class CommitHandle:
    """An open commit file: the bytes of a request line not yet complete, and the last answer."""

    __slots__ = ("pending", "answer", "read_at", "writable")

    def __init__(self, writable: bool):
        self.pending = bytearray()
        self.answer = b""
        self.read_at = 0  # bytes of the answer already read
        self.writable = writable

    def take(self, data) -> list[bytes]:
        """Add written bytes; returns the request lines they complete. EFBIG past MAX_REQUEST_BYTES."""
        if len(self.pending) + len(data) > MAX_REQUEST_BYTES + 1:
            self.pending.clear()
            raise RecordTooLargeError(f"a request line is at most {MAX_REQUEST_BYTES} bytes")
        self.pending += data
        if b"\n" not in data:
            return []
        *done, rest = bytes(self.pending).split(b"\n")
        self.pending = bytearray(rest)
        return [line for line in done if line.strip()]

    async def run(self, run_blocking, transactions, line: bytes) -> None:
        """Answer one request (in a worker thread); the answer is kept for reads, an error re-raised for its
        errno."""
        self.answer, self.read_at = b"", 0
        try:
            answer = await run_blocking(transactions.request, line)
        except (LogfsError, OSError) as exc:
            self.answer = _error_answer(errno_for(exc), str(exc))
            raise
        except Exception as exc:  # a bug: the translate wrapper logs it and answers EIO
            self.answer = _error_answer(errno.EIO, f"internal error: {exc}")
            raise
        self.answer = (json.dumps(answer, separators=(",", ":")) + "\n").encode()

    def read(self, offset: int, size: int) -> bytes:
        """The answer, read as from a pipe: whatever the offset, each read continues where the last one ended,
        and ends at the answer's end (so ``head``, ``cat`` or a ``pread`` at 0 all read it once)."""
        data = self.answer[self.read_at : self.read_at + size]
        self.read_at += len(data)
        return data

    def release(self) -> None:
        pass


def _error_answer(code: int, message: str) -> bytes:
    return (json.dumps({"ok": False, "errno": errno.errorcode.get(code, str(code)), "error": message},
                       separators=(",", ":")) + "\n").encode()


class ControlEntries:
    """The sink's entries, held by :class:`~logfs.fuse.operations.Operations` (its handlers ask these): their inodes
    (the staging directory's and the commit file's, fixed at start; a staged file's, on first sight, from the
    mount's ``inodes``), their attributes, their open handles (``handles``: fh -> :class:`StagedFileHandle` or
    :class:`CommitHandle`, numbered from the mount's ``next_fh``), opening them and writing requests."""

    def __init__(self, manager, inodes, next_fh, *, read_only: bool, run_blocking, owner: tuple[int, int],
                 started_ns: int):
        self.manager = manager
        self.inodes = inodes
        self._next_fh = next_fh
        self.read_only = read_only
        self.run_blocking = run_blocking
        self._uid, self._gid = owner
        self._started_ns = started_ns
        self.staging_ino = inodes.allocate()
        self.commit_ino = inodes.allocate()
        self._staged_ino: dict[str, int] = {}
        self._staged_name: dict[int, str] = {}
        self.handles: dict = {}

    def is_control(self, inode: int) -> bool:
        return inode == self.staging_ino or inode == self.commit_ino or inode in self._staged_name

    def attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.generation = 0
        entry.entry_timeout = 0.0
        entry.attr_timeout = ATTR_TIMEOUT
        entry.st_uid, entry.st_gid = self._uid, self._gid
        entry.st_blksize = BLOCK_SIZE
        mtime_ns = self._started_ns
        if inode == self.staging_ino:
            entry.st_mode = stat.S_IFDIR | (0o555 if self.read_only else 0o755)
            entry.st_nlink = 2
        elif inode == self.commit_ino:
            entry.st_mode = stat.S_IFREG | (0o444 if self.read_only else 0o644)
            entry.st_nlink = 1
        else:
            st = self.manager.transactions.staging.stat(self._staged_name[inode])
            entry.st_mode = stat.S_IFREG | 0o644
            entry.st_nlink = 1
            entry.st_size = st.st_size
            mtime_ns = st.st_mtime_ns
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = mtime_ns
        return entry

    def staged_inode(self, name: str) -> int:
        ino = self._staged_ino.get(name)
        if ino is None:
            ino = self._staged_ino[name] = self.inodes.allocate()
            self._staged_name[ino] = name
        return ino

    def forget_staged(self, name: str) -> None:
        ino = self._staged_ino.pop(name, None)
        self._staged_name.pop(ino, None)

    def open(self, inode: int, flags: int) -> pyfuse3.FileInfo:
        writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        if writable and self.read_only:
            fail(errno.EROFS)
        if inode == self.commit_ino:
            handle = CommitHandle(writable)
        elif inode in self._staged_name:
            if flags & os.O_TRUNC:
                fail(errno.EPERM)
            name = self._staged_name[inode]
            handle = StagedFileHandle(name, self.manager.transactions.staging.open(name, writable), writable)
        else:
            fail(errno.EISDIR)
        fh = next(self._next_fh)
        self.handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False, nonseekable=False)

    async def write(self, handle, buf) -> int:
        if not handle.writable:
            fail(errno.EBADF)
        if isinstance(handle, StagedFileHandle):
            raise AssertionError("staged files are written by write() itself")
        for line in handle.take(buf):
            await handle.run(self.run_blocking, self.manager.transactions, line)
        return len(buf)


"""The mount's own entries beside the topics: the Spark sink's staging directory and its commit file.

``MOUNT/.logfs-staging/``
    A directory of plain files (kept in ``DATA_DIR/.logfs-staging``, :mod:`logfs.storage.staging`): the sink's
    tasks create a file each (never an existing name), write it (anywhere: the kernel may send pieces of a large
    write out of order), and may read, fsync, list and remove them. No subdirectories, renames or truncation.

``MOUNT/.logfs-commit``
    The daemon's one interface for publishing them (:mod:`logfs.storage.transactions`). A request is one JSON line
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

from ..storage.errors import LogfsError, RecordTooLargeError
from ..storage.transactions import MAX_REQUEST_BYTES
from .errors import errno_for, fail

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

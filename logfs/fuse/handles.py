"""Open partition files: each handle's consistent view and its line buffer.

A handle reads through its own pinned :class:`~logfs.view.text.SegmentView`: the view as it was at ``open()``
plus everything appended since, unaffected by retention or compaction. Writes are cut at their last ``\\n``:
the complete lines go to ``Log.append_lines`` at once (one call per ``write()``, so lines of concurrent writers
never interleave), and a trailing partial line waits in the handle until its newline arrives or the handle is
closed (released: the last close of the open file, not a forked child's close of its copy). What a line means
and which lines are refused is :mod:`logfs.storage.format.lines`; the handle only buffers bytes.

A refused line is refused whole, however the writer splits it (the kernel cuts a large ``write()`` into
1 MiB requests). A failed write is never taken, so the handle stays as it was, except when the refused line
began in earlier writes that were taken (the held partial line): those bytes are dropped. A line refused as
too large is then also skipped up to the next ``\\n`` that arrives: its writer is still sending the rest of it,
and a write that carries the end of it again (a writer resending after a short write or an error) must not
append that end as a line of its own. Until that ``\\n``, writes fail with ``EFBIG``; the write that carries
it succeeds, and the lines after it in that write are appended as usual. (A line refused for having no key
needs no skipping: any ending of it has no key either.)

With the topic setting ``logfs.writer.headers``, each record the handle appends carries the headers
``logfs.pid``, ``logfs.uid`` and ``logfs.comm``: the process that opened the file (pyfuse3 hands the FUSE
request's pid and uid to ``open()``/``create()``, not to ``write()``), and that process's command name, read from
``/proc/<pid>/comm`` at the handle's first append and again when it is more than a second old (so the ``comm`` of
``cmd >> file`` is ``cmd``: the shell's child opens the file, then execs the command).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from concurrent.futures import Executor

import trio

from ..storage.format import lines
from ..storage.errors import InvalidRecordError, LogfsError, RecordTooLargeError
from ..storage.local.log import Log
from ..view.text import SegmentView, open_view, view_positions
from .errors import fail

log = logging.getLogger(__name__)

#: Reads in worker threads at once (those stalled on the store never take the threads flushes and unlinks need).
WORKER_READS = 8

class PartitionHandle:
    __slots__ = ("log", "counters", "view", "append_mode", "writable", "pending", "skipping", "dropped", "inode",
                 "pid", "uid", "_headers", "_headers_at", "_layout_seen", "readable", "fh", "positions",
                 "known_length", "sink")

    def __init__(self, log: Log, inode: int, flags: int, pid: int = 0, uid: int = 0, fh: int = 0,
                 view: SegmentView | None = None, ahead_pool: Executor | None = None, sink=None):
        self.log = log
        # Where the lines go: the log itself, or on a Kafka cluster mount the partition's producer
        # (storage/cluster/appends.PartitionAppender: the same append_lines; the log is the replica, read only).
        self.sink = sink if sink is not None else log
        self.fh = fh
        self.pid, self.uid = pid, uid  # the opener (the FUSE request of open/create)
        self._headers: tuple | None = None  # the writer headers, as last built
        self._headers_at = 0.0
        self.counters = log.counters  # the partition's traffic counters (Operations adds to them)
        self.inode = inode
        self.readable = (flags & os.O_ACCMODE) != os.O_WRONLY
        self.view: SegmentView = view if view is not None else open_view(log, write_only=not self.readable,
                                                                          ahead_pool=ahead_pool)
        # Which positions this view has, for ever (appends add to its end only): what the inode table compares
        # (fuse/inodes.py), equal to Operations._positions of the log when it was opened.
        self.positions = view_positions(self.view.start_offset, self.view.rewrite_count, self.view.fmt)
        self._layout_seen = log.layout_version  # the layout release_passed() last looked at
        # The view's length when last measured: what an fstat answers while a read of this handle runs in a worker
        # thread (the view is that thread's meanwhile)
        self.known_length = self.view.length()
        self.append_mode = bool(flags & os.O_APPEND)
        self.writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        self.pending = b""
        self.skipping = False  # inside a line refused as too large: dropping bytes up to its "\n"
        self.dropped = 0  # bytes taken from the writer but never appended (refused lines), for its file offset

    def length(self) -> int:
        """This handle's view length, picking up segments rolled since open."""
        view = self.view
        if view.segments and view.segments[-1].next_offset < self.log.log_end_offset:
            view.extend()
        self.known_length = length = view.length()
        return length

    def read(self, offset: int, size: int) -> tuple[bytes, int]:
        """(the bytes, how many records' lines end in them). On the request thread, only what the view says it
        has in memory (``view.in_memory``); at the end of the view, the segments rolled since are taken in (local
        ones, written by appends: plain)."""
        view = self.view
        data = view.read(offset, size)
        if not data and size > 0 and self.length() > offset:
            data = view.read(offset, size)
        if self.log.layout_version != self._layout_seen:
            self.release_passed()
        return data, view.lines

    def release_passed(self) -> None:
        """Let go of the segments retention or compaction removed that this handle has read past (their disk is
        freed now, not when the handle closes): checked once per change of the log's layout."""
        self._layout_seen = self.log.layout_version
        self.view.release_passed(everything=not self.readable)

    def write(self, offset: int, data: bytes, *, reading: bool = False) -> int:
        """``reading``: a read of this handle runs in a worker thread (its view is that thread's meanwhile)."""
        if not self.append_mode and self.sink is self.log and (
                offset != self.length() + len(self.pending) + self.dropped):
            # Only appends: a write must land at the end of the file. (On a Kafka cluster mount every write is an
            # append to the partition: the file's end there is the replica's, behind the lines still in flight.)
            fail(errno.EPERM)
        if self.log.layout_version != self._layout_seen and not reading:
            self.release_passed()  # (a writer that keeps its file open pins nothing retention removed)
        if not self.skipping:
            self._take(data)
            return len(data)
        newline = data.find(b"\n")
        if newline < 0:
            raise RecordTooLargeError("the rest of a line over max.message.bytes")
        self._take(data[newline + 1 :])
        self.skipping = False
        self.dropped += newline + 1
        # Its writer may have had no error for it (the kernel turns a refused request into a short write).
        log.warning("%s-%d: a line over max.message.bytes was dropped", self.log.topic, self.log.partition)
        return len(data)

    def _take(self, data: bytes) -> None:
        """Append the complete lines of ``pending + data`` and hold the rest, or raise and change nothing (but
        a refused held line, :meth:`_refuse`)."""
        config = self.log.config
        cut = data.rfind(b"\n")
        if cut < 0:
            if data:
                head = self.pending + data
                try:
                    lines.check_partial(config, head)
                except LogfsError as exc:
                    self._refuse(exc)
                self.pending = head
            return
        rest = data[cut + 1 :]
        try:
            if rest:
                lines.check_partial(config, rest)
            if config.writer_headers:
                self.sink.append_lines(self.pending, data, cut + 1, self.writer_headers())
            else:
                self.sink.append_lines(self.pending, data, cut + 1)
        except (RecordTooLargeError, InvalidRecordError):
            if self.pending:  # is the refused line (also) the held one?
                try:
                    lines.check_line(config, self.pending + data[: data.find(b"\n")])
                except LogfsError as first:
                    self._refuse(first)
            raise
        self.pending = rest

    def _refuse(self, exc: LogfsError) -> None:
        """The line of the held bytes is refused: drop them (they were taken from the writer), and skip the rest
        of a line too large. Raises ``exc``."""
        if self.pending:
            self.dropped += len(self.pending)
            self.pending = b""
            self.skipping = isinstance(exc, RecordTooLargeError)
        raise exc

    def commit_pending(self) -> None:
        """Append the held partial line as a record (the handle is closing)."""
        if self.pending:
            line, self.pending = self.pending, b""
            headers = self.writer_headers() if self.log.config.writer_headers else None
            self.sink.append_lines(line, b"\n", 1, headers)

    def writer_headers(self) -> tuple:
        """``((logfs.pid, b"<pid>"), (logfs.uid, b"<uid>"), (logfs.comm, b"<comm>"))``, rebuilt at most once a
        second (the command name may change with an exec; a process gone keeps the last name read, or "")."""
        now = time.monotonic()
        headers = self._headers
        if headers is None or now - self._headers_at > 1.0:
            try:
                with open(f"/proc/{self.pid}/comm", "rb") as f:
                    comm = f.read().rstrip(b"\n")
            except OSError:
                comm = headers[2][1] if headers is not None else b""
            headers = self._headers = (("logfs.pid", b"%d" % self.pid), ("logfs.uid", b"%d" % self.uid),
                                       ("logfs.comm", comm))
            self._headers_at = now
        return headers

    def release(self) -> None:
        self.view.release()


class HandleTable:
    """The open partition files (``open``: fh -> :class:`PartitionHandle`) and their reads in worker threads
    (:meth:`in_worker`): one at a time per handle, since a view is not thread-safe (``fetching`` holds the handles a
    worker reads through: meanwhile the request thread leaves their views alone), at most :data:`WORKER_READS` at
    once (``slots``, which the xattr lookups in worker threads share). Used on the trio thread."""

    def __init__(self, run_blocking):
        self.open: dict[int, PartitionHandle] = {}
        self.fetching: dict[int, trio.Lock] = {}
        self.slots = trio.CapacityLimiter(WORKER_READS)
        self._run_blocking = run_blocking

    def get(self, fh: int) -> PartitionHandle:
        try:
            return self.open[fh]
        except KeyError:
            fail(errno.EBADF)

    async def in_worker(self, fh: int, fn, *args):
        """``fn(*args)`` for handle ``fh`` (a read that needs the store or a decompression) in a worker thread: the
        store may take up to its time bound; every other request goes on meanwhile."""
        lock = self.fetching.setdefault(fh, trio.Lock())
        try:
            async with lock, self.slots:
                return await self._run_blocking(fn, *args)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self.fetching.pop(fh, None)

    async def settled(self, fh: int) -> None:
        """Return once no worker thread reads through handle ``fh``."""
        fetching = self.fetching.get(fh)
        if fetching is not None:
            async with fetching:
                pass

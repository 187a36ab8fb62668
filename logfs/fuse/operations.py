"""pyfuse3 Operations: topics as directories, partitions as append-only files.

Inodes: 1 is the mount root; topics and partitions get numbers on first sight, never reused while mounted.
Partition files are opened with ``direct_io``: every read and write reaches logfs (no page cache), so each
handle sees its own consistent view, a ``write()`` that returned is visible to every reader, and ``st_size``
(attr timeout 0) is always the exact current view length.

This module holds the attributes, partition files and shutdown: the pyfuse3 boundary. Collaborators it holds, one
idea each (its other handlers forward to them): the directories and the refused namespace operations
(``namespace``, :class:`~logfs.fuse.namespace.Namespace`), the sink's entries (``control``,
:class:`~logfs.fuse.control.ControlEntries`: the staging directory, its files and the commit file, their inodes,
attributes and handles), the extended attributes (``xattrs``, :class:`~logfs.fuse.xattrs.Xattrs`), the open
partition files and their reads in worker threads (``handles``, :class:`~logfs.fuse.handles.HandleTable`), the
inode table (:mod:`logfs.fuse.inodes`) and the partitions' live views (``live_views``). Errors become errno in
one place, :mod:`logfs.fuse.errors`.

Everything here runs on the trio thread; fsync-class work (including the flush that ``flush.messages`` makes
due after an append) goes to worker threads (``run_blocking``). So does a read that needs the object store or a
decompression: the view says so before the read (``SegmentView.in_memory``), and the read is made here or in a
worker thread, once.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import time
from typing import Callable

import pyfuse3
import trio

from ..storage.errors import InvalidRecordError, LogfsError, RecordTooLargeError, StorageIOError
from ..storage.manager import LogManager
from ..storage.names import MOUNT_COMMIT, MOUNT_STAGING, parse_partition_number
from ..view.readahead import decompress_pool
from ..view.text import LiveViews, log_positions, measure_start, start_measured, view_positions
from .control import ControlEntries, StagedFileHandle
from .errors import disk_failed, fail, translate
from .handles import HandleTable, PartitionHandle
from .inodes import ROOT, InodeTable
from .namespace import Namespace, decode_name
from .xattrs import Xattrs

log = logging.getLogger(__name__)

FILE_ATTR_TIMEOUT = 0.0
DIR_ATTR_TIMEOUT = 1.0
ENTRY_TIMEOUT = 1.0
# A partition's name is looked up again on every path operation: when retention moves its start while handles are
# open, the name gets a new inode (below), and a cached entry would send a new open() to the old one.
FILE_ENTRY_TIMEOUT = 0.0
# st_blksize, the "preferred I/O size": cat, cp and Java size their buffers from it, and a 1 MiB read is one FUSE
# request (max_pages 256) instead of eight, which amortises the per-request cost (docs/benchmarks.md).
BLOCK_SIZE = 1 << 20
# setattr of the times to "now" (touch, utime(path, None)) reaches us as the current time, taken by pyfuse3
# just before; any other time is an explicit one.
NOW_SLACK_NS = 2_000_000_000



def _to(collaborator: str, handler: str):
    """The pyfuse3 handler ``handler`` of :class:`Operations`, answered by ``self.<collaborator>.<handler>``."""
    async def forward(self, *args, **kwargs):
        return await getattr(getattr(self, collaborator), handler)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = handler
    return forward


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, manager: LogManager, *, read_only: bool = False, run_blocking: Callable | None = None):
        super().__init__()
        self.manager = manager
        self.read_only = read_only
        self.run_blocking = run = run_blocking or (lambda fn, *a: trio.to_thread.run_sync(fn, *a))
        self.inodes = InodeTable(self._positions)  # (inode generations: logfs.fuse.inodes)
        self.handles = HandleTable(self.run_blocking)  # the open partition files, and their reads in worker threads
        self.live_views = LiveViews()  # each partition's view as a new open sees it (its size)
        self.decompress_pool = decompress_pool()  # the handles' read-ahead of compressed batches (until close())
        self._next_fh = itertools.count(1)
        self._started_ns = time.time_ns()
        self._uid, self._gid = os.getuid(), os.getgid()
        # (the sink's entries number their handles from the same counter as the partition files)
        self.control = ControlEntries(manager, self.inodes, self._next_fh, read_only=read_only,
                                      run_blocking=self.run_blocking, owner=(self._uid, self._gid),
                                      started_ns=self._started_ns)
        self.xattrs = Xattrs(manager, self.inodes, self.handles, self.control, self.live_views, resolve=self._resolve,
                             measured=self._measured, read_only=read_only, run_blocking=self.run_blocking)
        self.namespace = Namespace(manager, self.inodes, self.control, resolve=self._resolve, attrs=self._attrs,
                                   name_attrs=self.name_attrs, read_only=read_only, run_blocking=run)
        for topic in manager.list_topics():
            self.inodes.topic(topic)

    @property
    def open_files(self) -> int:
        """Partition files open through the mount (for the metrics)."""
        return len(self.handles.open)

    # -- inode bookkeeping ---------------------------------------------------------------------------
    def _positions(self, key: tuple[str, int]) -> tuple | None:
        """Which positions a new open of the partition gets now (view.text.log_positions), None once it is gone."""
        plog = self.manager.logs.get(key)
        return log_positions(plog) if plog is not None else None

    def _resolve(self, inode: int) -> tuple[str, int | None]:
        try:
            topic, partition = self.inodes.entry(inode)  # (or an earlier inode, through a handle open on it)
        except KeyError:
            fail(errno.ENOENT)
        if topic not in self.manager.topics:
            fail(errno.ENOENT)
        if partition is not None and (topic, partition) not in self.manager.logs:
            fail(errno.ENOENT)
        return topic, partition

    def _attr_name(self, inode: int) -> str:
        """The persistent name of a mount entry for chmod/chown: "" (root), "topic" or "topic/N"."""
        if inode == ROOT:
            return ""
        topic, partition = self._resolve(inode)
        return topic if partition is None else f"{topic}/{partition}"

    # -- attributes ------------------------------------------------------------------------------------
    def _newest_append(self, topic: str) -> int | None:
        """The newest append (ms) to any of the topic's partitions, None without partitions (O(partitions))."""
        return max((plog.last_append_ms for plog in self.manager.topic_logs(topic)), default=None)

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.generation = 0
        entry.entry_timeout = ENTRY_TIMEOUT
        entry.st_uid, entry.st_gid = self._uid, self._gid
        entry.st_blksize = BLOCK_SIZE
        if inode == ROOT:
            entry.st_mode = stat.S_IFDIR | 0o755
            entry.st_nlink = 2 + len(self.manager.topics)
            entry.attr_timeout = DIR_ATTR_TIMEOUT
            mtime_ns = self._started_ns
            entry.st_size = 0
        else:
            topic, partition = self._resolve(inode)
            if partition is None:
                entry.st_mode = stat.S_IFDIR | 0o755
                entry.st_nlink = 2
                entry.attr_timeout = DIR_ATTR_TIMEOUT
                entry.st_size = 0
                # The newest append to any of its partitions (an empty partition counts from its creation).
                newest = self._newest_append(topic)
                mtime_ns = self._started_ns if newest is None else newest * 1_000_000
            else:
                plog = self.manager.logs[(topic, partition)]
                view = self.live_views.get(plog)
                reader = self.inodes.reader(inode)
                if reader is not None and reader.positions != view_positions(view.start_offset, view.rewrite_count,
                                                                              view.fmt):
                    # The log moved (retention, a rewrite: the engine's threads) since the caller's check of this
                    # inode: its handles keep it, with their view's size; the live view's would shrink the file
                    # under them (``tail -f``: "file truncated").
                    self.inodes.retire_if_moved(inode)
                    removed = self._removed_attrs(inode)
                    if removed is not None:
                        return removed
                entry.st_mode = stat.S_IFREG | (0o444 if self.read_only else 0o644)
                entry.st_nlink = 1
                entry.attr_timeout = FILE_ATTR_TIMEOUT
                entry.entry_timeout = FILE_ENTRY_TIMEOUT
                entry.st_size = view.length()
                mtime_ns = plog.last_append_ms * 1_000_000
        custom = self.manager.get_attrs(self._attr_name(inode))
        if custom is not None:
            bits, entry.st_uid, entry.st_gid = custom
            entry.st_mode = stat.S_IFMT(entry.st_mode) | bits
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = mtime_ns
        return entry

    def _removed_attrs(self, inode: int) -> pyfuse3.EntryAttributes | None:
        """Attributes of a removed partition that still has an open handle, from that handle's view (as an
        unlinked open file: ``exec 7< t/1; rm t/1; cat <&7`` fstats before it reads). None for other inodes."""
        if inode == ROOT or inode in self.inodes:
            return None  # a live entry: only unlink forgets a partition's inode while handles may stay open
        handles = self.inodes.handles(inode)
        if not handles:
            return None
        # A handle whose read runs in a worker thread (tiered data, a decompression) is that thread's until it ends:
        # its view is neither changed nor measured here (its size is the one last measured).
        idle = [h for h in handles if h.fh not in self.handles.fetching]
        for h in idle:  # (fstat of a ``tail -f`` or shipper: a moment to free what retention removed behind it)
            if h.log.layout_version != h._layout_seen:
                h.release_passed()
        # The largest of their views (handles opened at the same start see the same; a size never shrinks for the
        # one that reads furthest)
        sizes = {h.fh: h.length() if h in idle else h.known_length for h in handles}
        handle = max(handles, key=lambda h: sizes[h.fh])
        entry = pyfuse3.EntryAttributes()
        entry.st_ino, entry.generation, entry.entry_timeout, entry.attr_timeout = inode, 0, 0, FILE_ATTR_TIMEOUT
        entry.st_mode = stat.S_IFREG | (0o444 if self.read_only else 0o644)
        entry.st_nlink = 0
        entry.st_uid, entry.st_gid, entry.st_blksize = self._uid, self._gid, BLOCK_SIZE
        entry.st_size = sizes[handle.fh]
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = handle.log.last_append_ms * 1_000_000
        return entry

    async def _partition_attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        """:meth:`_attrs`; a partition's log start measured first in a worker thread when that needs a fetch."""
        if inode != ROOT:
            topic, partition = self._resolve(inode)
            if partition is not None:
                await self._measured(self.manager.logs[(topic, partition)])
        return self._attrs(inode)

    async def _measured(self, plog) -> None:
        """A view of ``plog`` made after this (its length, its lookups) needs no fetch for the bytes before the log
        start (a log start inside a tiered batch, set by DeleteRecords): measured in a worker thread if not yet."""
        if not start_measured(plog):
            await self.run_blocking(measure_start, plog)

    async def forget(self, inode_list):
        # (Never raises: pyfuse3's rule for FORGET, which has no reply.)
        for inode, _ in inode_list:
            self.inodes.forget(inode)

    @translate
    async def getattr(self, inode, ctx=None):
        if self.control.is_control(inode):
            return self.control.attrs(inode)
        if self.inodes.is_open(inode):
            self.inodes.retire_if_moved(inode)  # (an fstat of a handle whose file shrank from the front since)
        return self._removed_attrs(inode) or await self._partition_attrs(inode)

    @translate
    async def lookup(self, parent_inode, name, ctx=None):
        text = decode_name(name)
        if parent_inode == ROOT:
            if text in self.manager.topics:
                return self._attrs(self.inodes.topic(text))
            if text == MOUNT_STAGING:
                return self.control.attrs(self.control.staging_ino)
            if text == MOUNT_COMMIT:
                return self.control.attrs(self.control.commit_ino)
            fail(errno.ENOENT)
        if parent_inode == self.control.staging_ino:
            ino = self.control.staged_inode(text)
            try:
                return self.control.attrs(ino)
            except LogfsError:
                self.control.forget_staged(text)
                raise
        if self.control.is_control(parent_inode):
            fail(errno.ENOTDIR)
        topic, partition = self._resolve(parent_inode)
        if partition is not None:
            fail(errno.ENOTDIR)
        number = parse_partition_number(text)
        if number is not None and (topic, number) in self.manager.logs:
            return await self.name_attrs(topic, number)
        fail(errno.ENOENT)

    async def name_attrs(self, topic: str, partition: int) -> pyfuse3.EntryAttributes:
        """The attributes of a partition's name (lookup, readdirplus): its inode now, a new one if the log moved
        under the handles open on the one it had, also while the answer was made (a retention in the engine's
        threads: :meth:`_attrs` retires the inode then)."""
        inode = self.inodes.partition(topic, partition)
        attrs = await self._partition_attrs(inode)
        if inode not in self.inodes:
            attrs = await self._partition_attrs(self.inodes.partition(topic, partition))
        return attrs

    @translate
    async def setattr(self, inode, attr, fields, fh, ctx):
        if self.control.is_control(inode):
            current = self.control.attrs(inode)
            if fields.update_size and attr.st_size != current.st_size:
                fail(errno.EPERM)  # staged files only grow by writes
            return current
        if (fields.update_mtime and abs(attr.st_mtime_ns - time.time_ns()) > NOW_SLACK_NS) or (
                fields.update_atime and abs(attr.st_atime_ns - time.time_ns()) > NOW_SLACK_NS):
            fail(errno.EPERM)  # st_mtime is the last append's time: a given time (touch -d, cp -p) cannot be set
        if fields.update_size:
            plog = self.manager.logs[self._resolve_partition(inode)]
            await self._measured(plog)
            size = self.live_views.get(plog).length()
            if attr.st_size != size:
                fail(errno.EPERM)  # truncation (or extension with zeros) is not an append
        if fields.update_mode or fields.update_uid or fields.update_gid:
            current = self._attrs(inode)
            bits = stat.S_IMODE(attr.st_mode) if fields.update_mode else stat.S_IMODE(current.st_mode)
            uid = attr.st_uid if fields.update_uid else current.st_uid
            gid = attr.st_gid if fields.update_gid else current.st_gid
            await self.run_blocking(self.manager.set_attrs, self._attr_name(inode), bits, uid, gid)
        return self._attrs(inode)  # "now" (touch) is accepted: the times stay those of the last append

    def _resolve_partition(self, inode: int) -> tuple[str, int]:
        topic, partition = self._resolve(inode)
        if partition is None:
            fail(errno.EISDIR)
        return topic, partition

    @translate
    async def statfs(self, ctx):
        # The log directories' file systems together (each counted once), in the first one's block size.
        first = os.statvfs(self.manager.data_dir)
        out = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                      "f_favail"):
            setattr(out, field, getattr(first, field))
        seen = {os.stat(self.manager.data_dir).st_dev}
        for d in self.manager.dirs[1:]:
            try:
                dev = os.stat(d.path).st_dev
                if dev in seen:
                    continue
                seen.add(dev)
                st = os.statvfs(d.path)
            except OSError:
                continue  # (a failed disk's space is not counted)
            for field in ("f_blocks", "f_bfree", "f_bavail"):
                setattr(out, field, getattr(out, field) + getattr(st, field) * st.f_frsize // first.f_frsize)
            for field in ("f_files", "f_ffree", "f_favail"):
                setattr(out, field, getattr(out, field) + getattr(st, field))
        out.f_namemax = 255
        return out

    # -- partition files -------------------------------------------------------------------------------
    @translate
    async def create(self, parent_inode, name, mode, flags, ctx):
        if self.read_only:
            fail(errno.EROFS)
        text = decode_name(name)
        if parent_inode == self.control.staging_ino:
            if self.read_only:
                fail(errno.EROFS)
            # (a worker thread: the first file creates the directory, and fsyncs DATA_DIR)
            fd = await self.run_blocking(self.manager.transactions.staging.create, text)
            ino = self.control.staged_inode(text)
            fh = next(self._next_fh)
            self.control.handles[fh] = StagedFileHandle(text, fd, True)
            return (pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False, nonseekable=False),
                    self.control.attrs(ino))
        if self.control.is_control(parent_inode):
            fail(errno.ENOTDIR)
        if parent_inode == ROOT:
            fail(errno.EPERM)  # the root holds only topic directories
        topic, partition = self._resolve(parent_inode)
        if partition is not None:
            fail(errno.ENOTDIR)
        number = parse_partition_number(text)
        if number is None:
            fail(errno.EINVAL)
        if self.manager.cluster is not None:
            fail(errno.EPERM)  # a Kafka cluster's partitions are its topics' (mkdir, num.partitions)
        await self.run_blocking(self.manager.create_partition, topic, number)
        inode = self.inodes.partition(topic, number)
        info = self._open_handle(inode, topic, number, flags & ~os.O_TRUNC, ctx)
        return info, self._attrs(inode)

    @translate
    async def open(self, inode, flags, ctx):
        if self.control.is_control(inode):
            return self.control.open(inode, flags)
        topic, partition = self._resolve_partition(inode)
        writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        if writable and self.read_only:
            fail(errno.EROFS)
        plog = self.manager.logs[(topic, partition)]
        plog.log_dir.check()  # a partition of an offline directory: EIO until the next mount
        cluster = self.manager.cluster
        if cluster is not None:  # (a Kafka cluster that refuses this user its records, or writes to them: EACCES)
            if (flags & os.O_ACCMODE) != os.O_WRONLY and plog.log_end_offset <= plog.log_start_offset:
                cluster.check_readable(topic, partition)  # (nothing of it fetched; what was fetched reads)
            if writable:
                if cluster.write_grant_known(topic):
                    cluster.check_writable(topic)
                else:
                    await self.run_blocking(cluster.check_writable, topic)
        await self._measured(plog)
        if flags & os.O_TRUNC and self.live_views.get(plog).length() > 0:
            fail(errno.EPERM)
        return self._open_handle(inode, topic, partition, flags, ctx)

    def _open_handle(self, inode: int, topic: str, partition: int, flags: int, ctx) -> pyfuse3.FileInfo:
        # The opener's identity, for logfs.writer.headers (handler calls without a kernel pass no context: then
        # this process is the opener).
        pid, uid = (ctx.pid, ctx.uid) if ctx is not None else (os.getpid(), os.getuid())
        fh = next(self._next_fh)
        plog = self.manager.logs[(topic, partition)]
        sink = None
        cluster = self.manager.cluster
        if cluster is not None and (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR):
            sink = cluster.appender(topic, partition)  # (a Kafka cluster mount: lines go to its producer)
        handle = PartitionHandle(plog, inode, flags, pid, uid, fh, ahead_pool=self.decompress_pool, sink=sink)
        if not self.inodes.opened(inode, handle):
            # Its view has other positions than the readers open on this inode (retention, DeleteRecords or a
            # compaction ran since the kernel looked the name up): it gets a twin of theirs, the file it looked up
            # (fuse/inodes.py). Without one to copy, ESTALE: the inode is retired, and the kernel looks the name up
            # again and opens the new inode.
            handle.release()
            reader = self.inodes.reader(inode)
            twin = reader.view.clone() if reader is not None else None
            if twin is None:
                fail(errno.ESTALE)
            handle = PartitionHandle(plog, inode, flags, pid, uid, fh, view=twin, ahead_pool=self.decompress_pool,
                                     sink=sink)
            if not self.inodes.opened(inode, handle):  # (cannot be: the same positions)
                handle.release()
                fail(errno.ESTALE)
        self.handles.open[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False, nonseekable=False)

    @translate
    async def read(self, fh, off, size):
        control = self.control.handles.get(fh)
        if control is not None:
            return control.read(off, size)
        handles = self.handles
        handle = handles.get(fh)
        log_dir = handle.log.log_dir
        log_dir.check()
        try:
            # Decided once: served here from what is cached and decompressed, or in a worker thread (one at a time
            # per handle, while the request thread leaves its view alone).
            if fh not in handles.fetching and handle.view.in_memory(off, size):
                data, lines = handle.read(off, size)
            else:
                data, lines = await handles.in_worker(fh, handle.read, off, size)
        except (OSError, StorageIOError) as exc:  # the disk failed a read: the directory goes offline
            disk_failed(handle.log, exc, "read")
        if not data and size and self.manager.cluster is not None:
            # (the file's end: where it would grow, the cluster refusing its records says so rather than idling)
            self.manager.cluster.check_readable(handle.log.topic, handle.log.partition)
        counters = handle.counters  # (here, on the trio thread, also after a read in a worker thread)
        counters.read_bytes += len(data)
        counters.read_records += lines
        return data

    @translate
    async def write(self, fh, off, buf):
        handle = self.handles.open.get(fh)  # (as handles.get(), inlined on the per-write() path)
        if handle is None:
            control = self.control.handles.get(fh)
            if control is None:
                fail(errno.EBADF)
            if isinstance(control, StagedFileHandle):
                return control.write(off, buf)  # (a page-cache write, as an append's)
            return await self.control.write(control, buf)
        if handle.log.closed:
            fail(errno.ENOENT)  # the partition was deleted while open
        handle.log.log_dir.check()
        sink = handle.sink
        if sink is not handle.log:  # a Kafka cluster mount: a failed delivery fails this write; a full queue waits
            sink.check()
            if sink.needs_room():
                await self.run_blocking(sink.wait_room)
        written = handle.write(off, buf, reading=fh in self.handles.fetching)
        handle.counters.appended_bytes += written
        if handle.log.flush_due:  # flush.messages: durable before the write() returns, as Kafka's flush
            await self.run_blocking(handle.log.flush)
        return written

    async def flush(self, fh):
        """A Kafka cluster mount: close() returns once every line written through the open file is acknowledged
        (CONTRACT section 15), and a failed delivery is its EIO. Every other mount: ENOSYS, below."""
        if self.manager.cluster is None:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        await self.flush_appends(fh)

    @translate
    async def flush_appends(self, fh):
        handle = self.handles.open.get(fh)
        if handle is not None and handle.sink is not handle.log:
            await self.run_blocking(handle.sink.sync)

    # No flush() but on a Kafka cluster mount: pyfuse3's default answers ENOSYS, after which the kernel stops
    # sending FLUSH on this mount.
    # FLUSH would not be a commit point anyway: the kernel sends it for every close() of any descriptor sharing
    # an open file, including a forked child's (exit, exec of a CLOEXEC fd). The held partial line belongs to
    # the handle and is appended when the handle itself is released (below), which the kernel queues before
    # the last close() returns, so a later open or read sees it. Without FLUSH, every close() saves a round
    # trip: `echo x >> t/0` takes 4 requests instead of 6.

    @translate
    async def release(self, fh):
        control = self.control.handles.pop(fh, None)
        if control is not None:
            control.release()
            return
        await self.handles.settled(fh)  # (a worker thread may still read through this handle's view)
        handle = self.handles.open.pop(fh, None)
        if handle is None:
            return
        self.inodes.closed(handle.inode, handle)
        try:
            if handle.pending and not handle.log.closed:
                self._commit_pending(handle)
                if handle.log.flush_due:
                    await self.run_blocking(handle.log.flush)
        finally:
            handle.release()

    @staticmethod
    def _commit_pending(handle: PartitionHandle) -> None:
        try:
            handle.commit_pending()
        except (RecordTooLargeError, InvalidRecordError) as exc:
            # The kernel does not pass a RELEASE error to close(): say in the log what became of the line.
            log.warning("%s-%d: the unterminated last line of a closed file was not appended: %s",
                        handle.log.topic, handle.log.partition, exc)

    @translate
    async def fsync(self, fh, datasync):
        control = self.control.handles.get(fh)
        if isinstance(control, StagedFileHandle):
            await self.run_blocking(control.sync)
            return
        if control is not None:
            return
        # A held partial line is not a record yet (it ends at its newline or at close), so fsync leaves it held.
        handle = self.handles.get(fh)
        if handle.log.closed:
            return
        handle.log.log_dir.check()  # (never a success over bytes whose fsync failed: the directory is offline)
        if handle.sink is not handle.log:  # a Kafka cluster mount: every line written before is acknowledged
            await self.run_blocking(handle.sink.sync)
            return
        await self.run_blocking(handle.log.flush)

    # -- handled by the collaborators ----------------------------------------------------------------------
    opendir, readdir, releasedir, mkdir, rmdir, unlink, rename, link, symlink, mknod = (_to("namespace", h) for h in (
        "opendir", "readdir", "releasedir", "mkdir", "rmdir", "unlink", "rename", "link", "symlink", "mknod"))
    getxattr, listxattr, setxattr, removexattr = (_to("xattrs", h) for h in (
        "getxattr", "listxattr", "setxattr", "removexattr"))

    # -- shutdown --------------------------------------------------------------------------------------
    def release_all(self) -> None:
        """Commit pending partial lines of every handle still open (clean shutdown)."""
        for fh, control in list(self.control.handles.items()):
            control.release()
            del self.control.handles[fh]
        for fh, handle in list(self.handles.open.items()):
            try:
                if handle.pending and not handle.log.closed:
                    self._commit_pending(handle)
            finally:
                handle.release()
            del self.handles.open[fh]

    def close(self) -> None:
        """At unmount: :meth:`release_all`, then the read-ahead's threads end (each after the batch it is on)."""
        try:
            self.release_all()
        finally:
            self.decompress_pool.shutdown(wait=True)

"""A running Kafka broker's log directories, read in place (CONTRACT.md section 14; issue 45).

``logfs -o ro,logfs.cache.dir=CACHE KAFKA_LOG_DIR MOUNTPOINT``: the mount's :class:`~logfs.storage.manager.LogManager`
runs on ``CACHE`` (its lock, checkpoints, settings and each partition's directory are there, logfs's own), and its
logs are the broker's partitions, whose segments are :class:`BrokerSegment`: the broker's ``.log`` read by pread
through a read-only descriptor, with indexes of logfs's own under the cache. Nothing under the broker's directory
is ever created, changed, renamed or removed, and its ``.lock`` is never taken: the broker owns it.

- **Indexes.** Kafka's active ``.index``/``.timeindex`` are 10 MiB of zeros written through a memory map, and a
  broker writes no ``.viewindex``: every segment is indexed by logfs, into ``CACHE/<topic>-<n>/``, in files named
  by the segment's base offset AND the ``.log``'s inode. The cleaner's swap puts a new file at the same base
  offset; it gets new indexes, never the old file's. Each mount builds them afresh (the cache's partition
  directories are emptied at start: :func:`clear_cache`).
- **An unfinished batch** (shorter than its length field says, or failing its CRC: the broker is still writing it)
  is neither shown nor cut: the segment's published size stops before it, and the next look tries again.
- **Following.** :meth:`BrokerLogs.sync_once`, every ``logfs.broker.poll.ms`` (250; the service's task, in a
  worker thread), looks at the partitions inotify (``storage/inotify``, ctypes; one watch per partition directory:
  it reports the ``IN_MODIFY`` of the ``.log`` the broker appends to, new segments, renames and removals, by name)
  says changed since the last look, at new and removed topics (a watch on each broker directory), and at the
  partitions it could not watch. A look at a partition: one ``stat`` of its directory (listed only when its mtime
  moved, or is recent), then the active segment's new batches. Every ``logfs.broker.full.look.ms`` (30 s), and
  after the kernel dropped events (``IN_Q_OVERFLOW``: past ``fs.inotify.max_queued_events``, as under a busy broker
  with many partitions), every partition is looked at: the bound of an event missed. ``logfs.broker.inotify=false``
  polls every partition at every look (two stats each). Measured (``tools/bench_broker.py --only idle``, 10,000
  partitions, 2 shared cores, the daemon's utime+stime): polling at 250 ms cost 27-29% of one core (80,000 stats a
  second in Python; 30 s); with inotify 0.77% over 30 s and 0.87% over 60 s (the 4 looks a second that find no
  event, and a full look every 30 s: about 70 ms), and an append then showed in 0.04-0.2 s; with a real broker at
  200 records/s, CreateTime to the line read on the mount was 264-270 ms at p99 (docs/benchmarks.md; the poll
  interval bounds it). Other choices: a look at every partition at a slower pace costs the same per look and
  delays appends; a C loop of stats would still be 80,000 syscalls a second. A busy broker's cost is its events:
  one per append, merged by the kernel while a repeat of the last one is unread; at worst (the queue overflowing
  every look) it is a full look per look, the polling cost, never more.
- **Transactions** (CONTRACT sections 13 and 14: what a ``read_committed`` consumer reads). The broker appends a
  transaction's records long before its marker, and its ``.txnindex`` entry with the abort marker, so both come
  from the data as it is indexed (``local/txn_index.TransactionState``, one per partition, seeing every whole batch
  once, in offset order): per producer id, the first offset of its open transaction; a control batch closes it, an
  abort adding its range to the partition's ``AbortedRanges`` (which the segments' readers share). A scanned batch
  is published (indexed, its lines counted, ``size`` moved past it) only below the last stable offset (the first
  offset of the oldest open transaction): the view's end stops there, as a ``read_committed`` consumer's fetch
  does, and a batch behind it waits in its segment's ``pending`` (position, header and lines; no bytes). An open
  transaction across a roll: the segments the broker rolled to are scanned (``BrokerPartition.ahead``) but the log
  rolls to one only once its predecessor is shown whole. The ``.txnindex`` files are not read: the data says the
  same, sooner. With ``logfs.isolation.level=read_uncommitted`` (``-o``: this mount's settings are read-only) a
  partition has no TransactionState: every whole batch is published as it is scanned, to the log end offset, as a
  ``read_uncommitted`` consumer's fetch reads.
- **Retention.** A segment the broker renamed ``.deleted`` leaves the log (which then starts at its first
  remaining segment); a reader still reading it reads it by its new name, opening it for each read and closing it
  after (no descriptor is held on a file the broker deletes; the ``kafka://`` replica's files are this mount's own,
  and one a reader pins keeps a descriptor until the reader lets it go: :meth:`BrokerSegment.hold`). A file that is
  no longer the segment's inode is never read as it: the segment's reads fail with ``ENOENT`` instead of giving
  another file's bytes.
- **Log start offsets** moved inside a segment (DeleteRecords) are followed from the broker's
  ``log-start-offset-checkpoint`` (:meth:`BrokerLogs._follow_starts`: one ``stat`` a look), as the broker writes it
  every ``log.flush.start.offset.checkpoint.interval.ms``; the ``kafka://`` replica writes its own at once.
- **The cleaner's swaps.** While a ``.swap`` file exists the swap is half done, and the directory is looked at
  again later; once done, the new file at a shown segment's base offset (another inode) replaces the sealed
  segments up to the next live file, as logfs's own compaction does (:meth:`Log.forget` with ``replaced_by``).
- **Topics and partitions.** When a broker directory's watch reports a directory created, renamed or removed in it
  (and at each full look), it is ``stat``ed and, when its mtime moved, listed: a partition directory that is new is
  served once its first segment is there, one that is gone (a topic deleted: renamed ``-delete``) is served no more
  (a reader keeps what it pinned while the files exist).
- **A broker restart.** A clean one changes no segment: the mount goes on as before (an open file too). After a
  crash the broker's recovery truncates what it finds torn; this mount never showed a torn batch, but a tail the
  page cache lost (a power cut), or a follower's truncation after a leader change, removes batches it showed, and
  later appends reuse their offsets. Each scan checks that the file is not shorter than what was scanned and that
  the last batch scanned still has its CRC (one 4-byte pread); a segment gone or replaced in the middle of the log
  is the same news. The partition is then loaded again from its files (``BrokerTruncated``: a fresh read shows what
  they hold); a file already open reads the old log's segments, whose reads fail with ``ESTALE`` where their bytes
  are gone (a short pread is never shown).
- **Partition moves** between the broker's directories (AlterReplicaLogDirs: a copy in
  ``<topic>-<n>.<uuid>-future``, ignored while it is built; then the source renamed ``-delete`` and the copy
  ``<topic>-<n>``): the watch of each broker directory sees both renames. When the copy holds the same segments
  (:meth:`BrokerLogs._move`: each base offset, each file at least as long as what was scanned, the last batch
  scanned with the same CRC at the same place; Kafka's copy appends the same batches and, in the tests, rolled
  where the source did), the log's segments are pointed at the new files (:meth:`BrokerSegment.repoint`) and the
  same log goes on: an open file keeps reading, the appends after the move too. Else the partition is loaded from
  its new directory, and the old log's segments learn where their directory went (:func:`_renamed_to`: the
  ``-delete`` directory holding the same inode), so a file opened before the move reads what it read, without an
  error, until the broker removes that directory (``file.delete.delay.ms``).

Not followed yet: a file opened before a truncation, or before a move whose copy rolled elsewhere, does not see the
appends after it (reopening the file does).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import shutil
import threading
import time

from . import checkpoints as ckpt
from .errors import LogfsError, StorageIOError
from .format import records as rec
from .local.index import ViewIndex
from .local.log import Log
from .local.open_files import OpenFiles, open_unit, release_unit
from .local.segment import LogSegment
from .local.segments import close_if_unused
from .local.segment_recovery import SegmentRecovery
from .format.lines import ZERO_STATS
from .inotify import IN_DELETE_SELF, IN_ISDIR, IN_MOVE_SELF, IN_Q_OVERFLOW, Inotify
from .local.segment import batch_stats  # (segment_recovery's, as segment.py re-exports it)
from .local.txn_index import NO_OPEN_TRANSACTION, TransactionState
from .names import (
    DELETE_DIR_SUFFIX, DELETED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, DataDirScan, collision_key, filename_prefix,
    partition_dir_name,
)

log = logging.getLogger(__name__)

# A directory whose mtime is this recent is listed again at the next look even if its mtime did not move: a change
# in the same clock tick as the last listing leaves the same mtime (the racy case git's index has too).
RACY_NS = 2_000_000_000
# How much of a growing segment one read takes while indexing what the broker appended.
SCAN_CHUNK = 1 << 20
CRC_AT = 17  # a batch's CRC: after baseOffset, batchLength, partitionLeaderEpoch and magic


class BrokerTruncated(StorageIOError):
    """The broker removed batches this mount showed (its recovery truncating a tail after a crash, a follower's
    truncation after a leader change): the partition is loaded again from its files."""

    def __init__(self, message: str):
        super().__init__(message, errno.ESTALE)


def _live_bases(names) -> dict[int, str]:
    """base offset -> name of every live ``.log`` among ``names`` (no ``.deleted``/``.cleaned``/``.swap``)."""
    out = {}
    for name in names:
        if name.endswith(LOG_SUFFIX) and len(name) == 20 + len(LOG_SUFFIX) and name[:20].isdigit():
            out[int(name[:20])] = name
    return out


class BrokerSegment(LogSegment):
    """One segment of the broker's, read in place: its ``.log`` by a read-only descriptor (never created, never
    written), its indexes logfs's own under the cache, named by base offset and inode. It shows the whole,
    CRC-valid batches :meth:`scan` found below the LSO (:meth:`publish`), and grows as the broker appends."""

    def __init__(self, log_path: str, base: int, index_dir: str, config, open_files: OpenFiles, *, aborted=None):
        self.inode = os.stat(log_path).st_ino
        self._reads_lock = threading.Lock()
        self._reads = 0  # reads using the shared descriptor now
        self._repointed = False  # moved to another file while a read used the old one's descriptor
        super().__init__(
            os.path.dirname(log_path), base, index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes, active=True, create=False, read_only=True,
            max_view_index_size=ViewIndex.bytes_for(config.segment_index_bytes, config.segment_bytes,
                                                    config.index_interval_bytes),
            index_stem=os.path.join(index_dir, f"{filename_prefix(base)}-{self.inode}"), open_files=open_files)
        if os.fstat(self.fd).st_ino != self.inode:  # (renamed between the stat and the open: gone already)
            self.close()
            raise FileNotFoundError(errno.ENOENT, "segment replaced while opened", log_path)
        for index in (self.offset_index, self.time_index, self.view_index):
            index.reset()
        self.size = 0  # nothing is shown until scan and publish have checked it
        self.scanned, self.scan_next = 0, base  # the end of the batches scanned, and the offset after them
        self.last_crc: tuple[int, bytes] | None = None  # the last batch scanned: its position and CRC bytes
        self.renamed_dir: str | None = None  # where the broker renamed its directory (``-delete``), once it did
        self.pending: collections.deque = collections.deque()  # scanned, not yet published: (pos, header, stats)
        self.aborted = aborted
        self.has_txn_index = False  # (the broker's .txnindex is never renamed or removed by logfs)
        self.held = -1  # a descriptor kept for the snapshots that pin it once it left the log (:meth:`hold`)

    # -- the descriptor: this inode's, under the name it has now ------------------------------------------
    # While the segment is in the log, reads share one descriptor (``fd``, in the mount's open-file budget). Once
    # the broker removed it (``deleted``: retention renamed it ``.deleted``, and unlinks it soon), each read opens
    # the file for itself and closes it after; the shared descriptor is closed as soon as no read is using it.
    def _path_now(self) -> str:
        paths = [self.log_path, self.log_path + DELETED_SUFFIX]
        if self.renamed_dir is not None:  # (its directory renamed -delete: the partition moved, or was deleted)
            moved = os.path.join(self.renamed_dir, os.path.basename(self.log_path))
            paths += [moved, moved + DELETED_SUFFIX]
        for path in paths:
            try:
                if os.stat(path).st_ino == self.inode:
                    return path
            except FileNotFoundError:
                continue
        raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT)

    def _opened(self, open_path):
        """``open_path(path)`` of this inode's name now. The broker may rename the file between the look and the
        open (retention's ``.deleted``, seen in a clean-clone run as a read's ENOENT): then it is looked for again
        under its new name; ENOENT only once no name of it is left."""
        for _ in range(3):
            try:
                return open_path(self._path_now())
            except FileNotFoundError:
                continue
            except StorageIOError as exc:
                if exc.errno != errno.ENOENT:
                    raise
        raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT)

    def __getattr__(self, name: str):
        if name == "fd":
            fd = self._opened(lambda path: open_unit(self, path))
            if os.fstat(fd).st_ino == self.inode:
                return fd
            release_unit(self)
            raise StorageIOError(f"segment {self.log_path} was replaced by the broker", errno.ENOENT)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _enter_read(self) -> bool:
        """Count a read of the shared descriptor in; False (nothing counted) once the segment left the log."""
        with self._reads_lock:
            if self.deleted:
                return False
            self._reads += 1
            return True

    def _exit_read(self) -> None:
        with self._reads_lock:
            self._reads -= 1
            if self._reads == 0 and (self.deleted or self._repointed):
                self._repointed = False
                release_unit(self)

    def repoint(self, log_path: str, inode: int) -> None:
        """The broker moved the partition to another of its directories, and this segment's file there holds the
        same batches (:meth:`BrokerLogs._move` checked): read that one from now on. The shared descriptor (on the
        old file) closes now, or when the read using it ends; the next use opens the new file (``_path_now``)."""
        with self._reads_lock:
            self.directory, self.log_path, self.inode = os.path.dirname(log_path), log_path, inode
            if self._reads == 0:
                release_unit(self)
            else:
                self._repointed = True

    def let_go(self) -> None:
        """The segment left the log (its log's lock held): the shared descriptor closes now, or when the read
        using it ends."""
        with self._reads_lock:
            if self._reads == 0:
                release_unit(self)

    def hold(self) -> None:
        """It leaves the log (its log's lock held) while snapshots pin it, and its file is not the broker's but this
        mount's own (the ``kafka://`` replica's, :attr:`BrokerLogs.hold_removed`): keep a descriptor for their reads
        until the last of them lets it go (:meth:`close`), as a local log's retention holds a removed segment's files
        (``LogSegment.hold_files``). The file's removal (the replica unlinks it 30 s after the rename) then frees its
        disk only once no reader that has not passed it is left."""
        if self.held < 0 and self.refs > 0 and not self.closed:
            try:
                self.held = self._own_fd()
            except StorageIOError:
                pass  # (gone already: its reads fail as before)

    def _own_fd(self) -> int:
        fd = self._opened(lambda path: os.open(path, os.O_RDONLY))
        if os.fstat(fd).st_ino != self.inode:
            os.close(fd)
            raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT)
        return fd

    def read(self, position: int, length: int) -> bytes:
        length = min(length, self.size - position)
        if length <= 0:
            return b""
        if self._enter_read():
            try:
                data = super().read(position, length)
            finally:
                self._exit_read()
        elif self.held >= 0:
            try:
                data = os.pread(self.held, length, position)
            except OSError as exc:
                raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        else:
            fd = self._own_fd()
            try:
                data = os.pread(fd, length, position)
            except OSError as exc:
                raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
            finally:
                os.close(fd)
        if len(data) < length:
            raise self._gone(position + len(data))
        return data

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        length = min(length, self.size - position)
        if self._enter_read():
            try:
                view = super().read_into(scratch, position, length)
            finally:
                self._exit_read()
            if len(view) < max(length, 0):
                raise self._gone(position + len(view))
            return view
        return memoryview(self.read(position, length))

    def _gone(self, end: int) -> StorageIOError:
        """Bytes shown are no longer in the file (the broker truncated it: its recovery after a crash, or a
        follower's truncation): never shown as something else."""
        return StorageIOError(f"{self.log_path}: the broker truncated it at {end} (shown up to {self.size})",
                              errno.ESTALE)

    # -- following the broker's appends ----------------------------------------------------------------
    # Two steps, so that a transaction decides what is shown: ``scan`` reads each whole, CRC-valid batch the broker
    # appended once and shows it to the partition's TransactionState; ``publish`` indexes and shows the scanned
    # batches below the last stable offset (LSO). Without an open transaction a batch is published as it is
    # scanned; behind one it waits in ``pending`` (position, header, lines: no bytes kept) until its fate is known.
    def scan(self, txns: TransactionState | None, lock=None) -> tuple[bool, bool]:
        """Read the whole batches appended since the last scan (a batch still being written waits for the next
        look), each shown to ``txns``; publish at once those below the LSO with nothing waiting before them, under
        ``lock`` (None: the segment is not in the log yet: scanned only). ``txns`` None: a segment of the past (the
        cleaner's swap), all published. Returns (whether any was published, whether the scan reached the file's
        end)."""
        try:
            end = os.fstat(self.fd).st_size
            if end < self.scanned or (self.last_crc is not None
                                      and os.pread(self.fd, 4, self.last_crc[0] + CRC_AT) != self.last_crc[1]):
                raise BrokerTruncated(f"{self.log_path}: the broker truncated it to {end} bytes (scanned: "
                                      f"{self.scanned})")
        except OSError as exc:
            raise StorageIOError(f"stat of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        added = False
        pos, want = self.scanned, SCAN_CHUNK
        while pos < end:
            try:
                buf = os.pread(self.fd, min(want, end - pos), pos)
            except OSError as exc:
                raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
            at = size = 0
            while True:
                size = rec.peek_size(buf, at)
                if size is None or size < rec.HEADER_SIZE or at + size > len(buf):
                    break
                batch = memoryview(buf)[at: at + size]
                try:
                    header = rec.validate(batch)
                    stats = ZERO_STATS if header.is_control else batch_stats(batch, 0, size)
                except Exception:  # CRC, or a structure not yet whole: the broker is writing it
                    return added, False
                if header.base_offset < self.scan_next:
                    return added, False
                if txns is not None:
                    txns.see(batch, header)
                self.scanned, self.scan_next = pos + at + size, header.next_offset
                self.last_crc = (pos + at, bytes(batch[CRC_AT: CRC_AT + 4]))
                if lock is not None and not self.pending and (txns is None or header.base_offset < txns.stable()):
                    self._publish(pos + at, header, stats, txns, lock)
                    added = True
                else:
                    self.pending.append((pos + at, header, stats))
                at += size
            if at == 0:
                if size is not None and want < size <= end - pos:
                    want = size  # one batch larger than the chunk: read it whole
                    continue
                return added, False
            pos, want = pos + at, SCAN_CHUNK
        return added, True

    def publish(self, txns: TransactionState | None, lock) -> bool:
        """Publish the scanned batches now below the LSO (all of them when ``txns`` is None). Whether any was."""
        stable = txns.stable() if txns is not None else NO_OPEN_TRANSACTION
        added = False
        while self.pending and self.pending[0][1].base_offset < stable:
            self._publish(*self.pending[0], txns, lock)
            self.pending.popleft()
            added = True
        return added

    def _publish(self, pos: int, header, stats, txns, lock) -> None:
        if txns is not None and txns.aborted and self.aborted is None:
            self.aborted = txns.aborted  # (before the batch shows: its readers check each transactional batch)
        if self.is_aborted(header):
            stats = ZERO_STATS
        with lock:
            SegmentRecovery(self)._index_recovered(pos, header, stats)
            self.size = pos + header.size  # publish last: readers never see a batch before its index

    def flush(self) -> None:
        for index in (self.offset_index, self.time_index, self.view_index):
            index.flush()

    # Nothing of the broker's is ever renamed, cut or removed by logfs.
    def change_suffix(self, new_suffix: str) -> None:
        raise StorageIOError(f"{self.log_path} is the broker's: never renamed", errno.EROFS)

    def truncate_to(self, offset: int) -> int:
        raise StorageIOError(f"{self.log_path} is the broker's: never truncated", errno.EROFS)

    def delete_files(self) -> None:
        """Only logfs's own indexes of it (in the cache)."""
        for index in (self.offset_index, self.time_index, self.view_index):
            try:
                os.unlink(index.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self.closed:
            return
        if self.held >= 0:
            os.close(self.held)
            self.held = -1
        self.close_readonly()
        self.delete_files()


class BrokerPartition:
    """One partition of the broker's: its directory there, its log (segments read in place), its transactions as
    the data shows them, the segments the broker rolled to that the log does not show yet (``ahead``: behind an
    open transaction), and what the last look saw."""

    def __init__(self, directory: str, plog: Log, txns: TransactionState | None, ahead: list[BrokerSegment],
                 hold_removed: bool = False):
        """``txns`` None: the topic's ``logfs.isolation.level`` is read_uncommitted, and every whole batch shows as
        it is scanned, up to the log end offset, aborted or not (what such a consumer reads). ``hold_removed``:
        :attr:`BrokerLogs.hold_removed`."""
        self.hold_removed = hold_removed
        self.directory = directory
        self.log = plog
        self.txns = txns
        self.ahead = ahead
        self.dir_mtime_ns = -1

    def sync(self) -> bool:
        """One look at the broker's partition: swaps and new segments (when the directory changed), the appends
        (scanned, then published up to the LSO: a roll is shown once the sealed segment is whole), then retention.
        Whether anything new is shown."""
        st = os.stat(self.directory)
        changed = False
        inodes = None
        if st.st_mtime_ns != self.dir_mtime_ns or time.time_ns() - st.st_mtime_ns < RACY_NS:
            self.dir_mtime_ns = st.st_mtime_ns
            inodes = self._relist()
            changed = inodes is None  # (None: a swap half done; looked at again later)
        changed = self._advance() or changed
        if inodes:
            changed = self._retire(inodes) or changed
        return changed

    def _advance(self) -> bool:
        """Scan the active segment's appends and, once it is whole, those of the segments the broker rolled to;
        then publish up to the LSO, rolling the log on as each sealed segment is shown whole."""
        plog = self.log
        chain = [plog.segments.active, *self.ahead]
        changed = False
        whole = 0  # how many of the chain were scanned to their file's end
        for i, segment in enumerate(chain):
            try:
                added, to_end = segment.scan(self.txns, plog.lock if i == 0 else None)
            except StorageIOError as exc:
                if exc.errno != errno.ENOENT or i + 1 == len(chain):
                    raise
                added, to_end = False, True  # (sealed, and retention took it already: it leaves in _retire)
            changed = changed or added
            if not to_end:
                break  # (its successors are scanned once it is: a partition's batches go in offset order)
            whole += 1
        while True:
            active = plog.segments.active
            changed = active.publish(self.txns, plog.lock) or changed
            if active.pending or not self.ahead or whole < 1:
                return changed
            # The broker rolled past it, and it is shown whole: the next becomes the log's active segment.
            whole -= 1
            segment = self.ahead.pop(0)
            with plog.lock:
                active.on_become_inactive()
                plog.add_rolled(segment)
            active.release()
            changed = True

    def _relist(self) -> dict[int, int] | None:
        """The directory changed: the cleaner's swaps, and new segments (rolls; shown by :meth:`_advance`). The
        live files' inodes by base offset; None while a swap is half done."""
        plog = self.log
        names = os.listdir(self.directory)
        if any(n.endswith(SWAP_SUFFIX) for n in names):
            self.dir_mtime_ns = -1  # a swap half done (Kafka renames the old segments, then the .swap live): later
            return None
        live = _live_bases(names)
        inodes = {}
        for base, name in live.items():
            try:
                inodes[base] = os.stat(os.path.join(self.directory, name)).st_ino
            except FileNotFoundError:
                pass
        bases = sorted(inodes)
        # The cleaner's swaps: a new file at the base of a segment shown replaces the sealed segments from there
        # to the next live file; the view's positions after it change (as after logfs's own compaction). The
        # cleaner works below the LSO only: the new file's batches are all decided (``txns`` None).
        for i, base in enumerate(bases):
            segments = plog.segments.as_list()
            shown = next((s for s in segments if s.base_offset == base), None)
            if shown is None or shown.inode == inodes[base] or shown is plog.segments.active:
                continue
            end = bases[i + 1] if i + 1 < len(bases) else None
            old = [s for s in segments[:-1] if s.base_offset >= base and (end is None or s.base_offset < end)]
            new = _open(self.directory, base, plog, (self.txns.aborted or None) if self.txns is not None else None)
            if new is None:
                continue
            new.scan(None, contextlib.nullcontext())  # (no reader sees it yet)
            new.on_become_inactive()
            with plog.lock:
                plog.forget(old, replaced_by=new)
                for segment in old:
                    segment.let_go()
            new.release()
        last = (self.ahead or [plog.segments.active])[-1].base_offset
        for base in (b for b in bases if b > last):
            segment = _open(self.directory, base, plog, None)
            if segment is None:
                break
            self.ahead.append(segment)
        return inodes

    def _retire(self, inodes: dict[int, int]) -> bool:
        """Retention takes sealed segments from the front (the active one too, once the broker rolled past it)."""
        plog = self.log
        segments = plog.segments.as_list()
        front = []
        for segment in segments[:-1]:
            if inodes.get(segment.base_offset) == segment.inode:
                break
            front.append(segment)
        if front:
            with plog.lock:
                if self.hold_removed:
                    for segment in front:
                        segment.hold()
                plog.forget(front)
                for segment in front:
                    segment.let_go()
        gone = [s for s in plog.segments.as_list() if inodes.get(s.base_offset) != s.inode]
        if gone:  # (not retention's, not the cleaner's: the broker truncated the log, whole segments gone with it)
            raise BrokerTruncated(f"{self.directory}: segments {', '.join(str(s.base_offset) for s in gone)} are "
                                  f"gone or replaced")
        return bool(front)


def _renamed_to(directory: str, segment: BrokerSegment) -> str | None:
    """The name the broker gave ``directory`` when it moved the partition to another of its directories, or
    deleted it (Kafka renames it ``<topic>-<n>.<uuid>-delete`` and removes it ``file.delete.delay.ms`` later): the
    ``-delete`` directory holding ``segment``'s file (its inode), or None."""
    parent, name = os.path.split(directory)
    stem = name.rpartition("-")[0][:200]  # (the topic part; Kafka cuts a long one)
    try:
        names = [n for n in os.listdir(parent) if n.endswith(DELETE_DIR_SUFFIX) and n.startswith(stem)]
    except OSError:
        return None
    for candidate in names:
        path = os.path.join(parent, candidate, os.path.basename(segment.log_path))
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == segment.inode:
                return os.path.join(parent, candidate)
    return None


def _open(directory: str, base: int, plog: Log, aborted) -> BrokerSegment | None:
    try:
        return BrokerSegment(os.path.join(directory, filename_prefix(base) + LOG_SUFFIX), base, plog.directory,
                             plog.config, plog.open_files, aborted=aborted)
    except FileNotFoundError:
        return None  # (removed since the listing: the next look sees it gone)


class BrokerLogs:
    """The broker's partitions, served by ``manager`` (whose own directory is the cache): loaded once
    (:meth:`load`), then followed (:meth:`sync_once`, from the service)."""

    def __init__(self, manager, broker_dirs: list[str]):  # (a LogManager: not imported, it imports nothing of this)
        self.manager = manager
        self.broker_dirs = broker_dirs
        self.partitions: dict[tuple[str, int], BrokerPartition] = {}
        self.looks = 0
        self.full_looks = 0
        self.full_look_s = manager.broker.get("logfs.broker.full.look.ms") / 1000
        self._last_full = -float("inf")
        # inotify (see the module's docstring): watch descriptor -> partition key, or a broker directory (a str)
        self.watch: Inotify | None = None
        self.watched: dict[int, tuple[str, int] | str] = {}
        self.wd_of: dict[tuple[str, int] | str, int] = {}
        self.unwatched: set[tuple[str, int]] = set()  # partitions the kernel refused a watch: looked at each time
        self.again: set[tuple[str, int]] = set()  # partitions to look at next time without an event (a failure, a
        # swap half done)
        # The log start offsets of the broker's log-start-offset-checkpoint (:meth:`_follow_starts`): what each
        # directory's file was when last read (inode, mtime, size), and the starts not applied yet (a start past
        # the end this mount shows waits for the appends)
        self._start_files: dict[str, tuple[int, int, int]] = {}
        self._starts_waiting: dict[tuple[str, int], int] = {}
        # The directories' files are this mount's own (the kafka:// replica's), not a broker's: a segment removed
        # from the front while a reader pins it keeps a descriptor for it (BrokerSegment.hold), as on a local log.
        # A broker's files are never held (their disk is the broker's to free).
        self.hold_removed = False

    def load(self) -> None:
        self.dir_mtimes = {d: -1 for d in self.broker_dirs}
        self.pending: dict[tuple[str, int], str] = {}  # partition directories without a segment yet
        if self.manager.broker.get("logfs.broker.inotify"):
            try:
                self.watch = Inotify()
            except OSError as exc:
                log.warning("inotify unavailable (%s): every partition is looked at every time", exc)
        for broker_dir in self.broker_dirs:
            self._watch(broker_dir, broker_dir)
        self._rescan(initial=True)
        for part in self.partitions.values():
            part.sync()
        self._last_full = time.monotonic()

    def _watch(self, target, directory: str) -> None:
        """Watch ``directory`` for ``target`` (a partition's key, or a broker directory), before it is read: what
        changes after the watch is an event; what changed before, the read sees."""
        if self.watch is None:
            if not isinstance(target, str):
                self.unwatched.add(target)
            return
        try:
            wd = self.watch.add(directory)
        except OSError as exc:
            if not isinstance(target, str):
                self.unwatched.add(target)
            if exc.errno == errno.ENOSPC and not getattr(self, "_said_enospc", False):
                log.warning("inotify: %s (fs.inotify.max_user_watches): partitions past it are looked at each time",
                            exc.strerror)
                self._said_enospc = True
            return
        self.watched[wd] = target
        self.wd_of[target] = wd

    def _unwatch(self, target) -> None:
        self.unwatched.discard(target)
        self.again.discard(target)
        wd = self.wd_of.pop(target, None)
        if wd is not None:
            self.watched.pop(wd, None)
            with contextlib.suppress(OSError):
                self.watch.remove(wd)

    def hold_removed_segments(self) -> None:
        """The directories' files are this mount's own (the ``kafka://`` replica's), not a broker's: from now on a
        segment removed from the front while a reader pins it keeps a descriptor (:meth:`BrokerSegment.hold`)."""
        self.hold_removed = True
        for part in self.partitions.values():
            part.hold_removed = True

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    def _rescan(self, initial: bool = False) -> bool:
        """New partitions (a topic created, a partition added, one moved here from another of the broker's
        directories) are served; ones whose directory is gone (a topic deleted: renamed ``-delete``; moved away)
        are served no more. Each directory is listed only when its mtime moved (or is recent)."""
        m = self.manager
        found: dict[tuple[str, int], str] = {}
        listed = False
        for broker_dir in self.broker_dirs:
            st = os.stat(broker_dir)
            if st.st_mtime_ns == self.dir_mtimes[broker_dir] and time.time_ns() - st.st_mtime_ns >= RACY_NS:
                found.update((k, p.directory) for k, p in self.partitions.items()
                             if os.path.dirname(p.directory) == broker_dir)
                found.update((k, d) for k, d in self.pending.items() if os.path.dirname(d) == broker_dir)
                continue
            self.dir_mtimes[broker_dir] = st.st_mtime_ns
            listed = True
            for key, directory in DataDirScan(broker_dir).partitions:
                if key in found:
                    log.warning("%s: partition %s-%d is in another of the broker's directories too (%s)", directory,
                                key[0], key[1], found[key])
                    continue
                found[key] = directory
        changed = False
        if listed:
            for key in [k for k, p in self.partitions.items() if found.get(k) != p.directory]:
                if key not in found or not self._move(key, found[key]):
                    self._drop(key)
                changed = True
            new = [(k, d) for k, d in found.items() if k not in self.partitions]
        else:
            new = list(self.pending.items())  # (their directories listed again: each look until a segment shows)
        if not new:
            self.pending = {}
            return changed
        starts = {}
        for broker_dir in {os.path.dirname(d) for _, d in new}:
            starts.update(ckpt.read_checkpoint(os.path.join(broker_dir, ckpt.LOG_START_OFFSET)))
        pending = {}
        for (topic, partition), directory in sorted(new):
            if (topic, partition) not in self.wd_of:
                self._watch((topic, partition), directory)
            try:
                loaded = self._load_partition(directory, topic, partition, starts.get((topic, partition), 0))
            except FileNotFoundError:
                self._unwatch((topic, partition))
                continue  # (gone since the listing)
            if loaded is None:
                pending[(topic, partition)] = directory  # (Kafka makes the directory, then its first segment)
                continue
            plog, txns, ahead = loaded
            with m.lock:
                m.topics.setdefault(topic, {})
                m.add_log(plog)
                m.settings.collisions = {collision_key(t): t for t in m.topics}
            self.partitions[(topic, partition)] = part = BrokerPartition(directory, plog, txns, ahead,
                                                                         self.hold_removed)
            if not initial:
                part.sync()
            changed = True
        for key in self.pending.keys() - pending.keys() - self.partitions.keys():
            self._unwatch(key)  # (a directory that went before its first segment came)
        self.pending = pending
        return changed

    def _move(self, key: tuple[str, int], directory: str) -> bool:
        """The partition is now in ``directory`` (the broker moved it to another of its directories: Kafka's copy,
        built as ``-future``, swapped in). When the copy holds the same segments (each base offset there, each file
        at least as long as what was scanned of it, the last batch scanned with the same CRC at the same place:
        Kafka's copy appends the same batches, and rolls where the source rolled), the log's segments are pointed
        at the new files: the same log goes on, open files included. Else False (the caller loads it afresh)."""
        part = self.partitions[key]
        plog = part.log
        try:
            live = _live_bases(os.listdir(directory))
            segments = [*plog.segments.as_list(), *part.ahead]
            moved = []
            for segment in segments:
                name = live.get(segment.base_offset)
                if name is None:
                    return False
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    if st.st_size < segment.scanned or (
                            segment.last_crc is not None
                            and os.pread(f.fileno(), 4, segment.last_crc[0] + CRC_AT) != segment.last_crc[1]):
                        return False
                moved.append((segment, path, st.st_ino))
        except OSError:
            return False
        with plog.lock:
            for segment, path, inode in moved:
                segment.repoint(path, inode)
        self._unwatch(key)
        self._watch(key, directory)
        part.directory = directory
        part.dir_mtime_ns = -1  # (listed at its next look: segments the copy has beyond these)
        self.again.add(key)
        log.info("%s-%d: moved to %s, followed there", key[0], key[1], os.path.dirname(directory))
        return True

    def _drop(self, key: tuple[str, int]) -> None:
        """A partition whose directory the broker removed (or moved) is served no more; a reader of it keeps the
        segments it pinned while their files exist."""
        m = self.manager
        part = self.partitions.pop(key)
        self._unwatch(key)
        plog = part.log
        with m.lock:
            m.unserve(*key)
            if not m.served.count(key[0]):
                m.topics.pop(key[0], None)
                m.settings.collisions = {collision_key(t): t for t in m.topics}
        renamed = _renamed_to(part.directory, plog.segments.active)
        with plog.lock:
            for segment in plog.segments.as_list():
                segment.renamed_dir = renamed
                segment.deleted = segment.purged = True
                segment.let_go()
                close_if_unused(segment)

    def _load_partition(self, directory: str, topic: str, partition: int,
                        start: int) -> tuple[Log, TransactionState | None, list[BrokerSegment]] | None:
        """The partition's log (its segments scanned in offset order, shown up to the LSO), its transactions (None
        at read_uncommitted: everything shown), and the segments after the one the LSO is in (shown once the
        transaction there ends); None without a segment."""
        m = self.manager
        cache = m.data_dir
        live = _live_bases(os.listdir(directory))
        if not live:
            return None
        config = m.topic_config(topic)
        index_dir = os.path.join(cache, partition_dir_name(topic, partition))
        os.makedirs(index_dir, exist_ok=True)
        # read_uncommitted (logfs.isolation.level): no transaction decides what shows, every whole batch does (as a
        # segment of the past's: ``txns`` None), to the log end offset. Fixed for the mount: its settings are
        # read-only (setfattr answers EROFS), so -o sets it.
        txns = None if config.read_uncommitted else TransactionState()
        segments: list[BrokerSegment] = []
        nolock = contextlib.nullcontext()  # (no reader sees them yet)
        waiting = False  # a batch behind an open transaction: every later one waits too
        for base in sorted(live):
            try:
                segment = BrokerSegment(os.path.join(directory, live[base]), base, index_dir, config, m.open_files)
            except FileNotFoundError:
                continue  # (retention took it since the listing)
            segment.scan(txns, None if waiting else nolock)
            waiting = waiting or bool(segment.pending)
            segments.append(segment)
        if not segments:
            return None
        shown = len(segments)
        for k, segment in enumerate(segments):
            segment.publish(txns, nolock)
            if segment.pending:
                shown = k + 1
                break
        segments, ahead = segments[:shown], segments[shown:]
        for segment in segments[:-1]:
            segment.on_become_inactive()
            segment.release()
        plog = Log(index_dir, topic, partition, config, segments, log_start_offset=segments[0].base_offset,
                   recovery_point=0, clock=m.clock, log_dir=m.dirs[0].log_dir, open_files=m.open_files)
        plog.log_start_offset = min(max(start, segments[0].base_offset), plog.log_end_offset)
        plog.recovery_point = plog.log_end_offset
        return plog, txns, ahead

    def sync_once(self) -> int:
        """One look (see the module's docstring): the partitions inotify says changed (and those it cannot say
        about), or, every ``logfs.broker.full.look.ms`` and after the kernel dropped events, every partition. How
        many showed something new."""
        self.looks += 1
        now = time.monotonic()
        full = self.watch is None or now - self._last_full >= self.full_look_s
        rescan = full or bool(self.pending)
        dirty: set[tuple[str, int]] = set()
        if self.watch is not None:
            for event in self.watch.drain():
                if event.mask & IN_Q_OVERFLOW:
                    full = rescan = True
                    continue
                target = self.watched.get(event.wd)
                if isinstance(target, str):
                    if event.mask & (IN_ISDIR | IN_DELETE_SELF | IN_MOVE_SELF):
                        # Listed whatever its mtime says: a directory made in the same clock tick as the last
                        # listing leaves the mtime it had, and a look more than RACY_NS later would trust it.
                        rescan = True
                        self.dir_mtimes[target] = -1
                elif target is not None:
                    dirty.add(target)
        if full:
            self._last_full = now
            self.full_looks += 1
        changed = 0
        failed: Exception | None = None
        if rescan:
            try:
                changed += self._rescan()
            except (OSError, LogfsError) as exc:
                failed = exc
        if full:
            keys = list(self.partitions)
        else:
            keys = [k for k in (dirty | self.again | self.unwatched) if k in self.partitions]
        self.again = set()
        reload = False
        for key in keys:
            part = self.partitions.get(key)
            if part is None:
                continue
            try:
                if part.sync():
                    changed += 1
                    plog = part.log
                    newest = plog.segments.active.max_timestamp
                    if newest > plog.last_append_ms:
                        plog.last_append_ms = newest
                if part.dir_mtime_ns == -1:
                    self.again.add(key)  # (a swap half done: looked at again)
            except FileNotFoundError:
                continue
            except BrokerTruncated as exc:
                log.warning("%s: loaded again (an open file's read of what is gone: ESTALE)", exc)
                self._drop(key)
                self.pending[key] = part.directory
                reload = True
            except (OSError, LogfsError) as exc:  # one partition's trouble stops no other's following
                self.again.add(key)
                failed = failed or exc
        if reload:
            try:
                changed += self._rescan()
            except (OSError, LogfsError) as exc:
                failed = failed or exc
        try:
            changed += self._follow_starts()
        except (OSError, LogfsError) as exc:
            failed = failed or exc
        if failed is not None:
            raise failed  # (the service logs it, once until following works again)
        return changed

    def _follow_starts(self) -> int:
        """Log start offsets moved without a segment removed (DeleteRecords inside a segment; the ``kafka://``
        replica following its cluster's start): each broker directory's ``log-start-offset-checkpoint`` is
        ``stat``ed at every look and read again when it changed (a new file each time: Kafka and the replica write
        it whole and rename it), and a partition's start moves up to the one it names once the log this mount shows
        reaches it (the appends up to there are scanned first). The broker writes the file every
        ``log.flush.start.offset.checkpoint.interval.ms`` (60 s), the replica at once. How many starts moved."""
        for broker_dir in self.broker_dirs:
            path = os.path.join(broker_dir, ckpt.LOG_START_OFFSET)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._start_files.get(broker_dir) == seen and time.time_ns() - st.st_mtime_ns >= RACY_NS:
                continue
            self._start_files[broker_dir] = seen
            for key, start in ckpt.read_checkpoint(path).items():
                if key in self.partitions and start > self._starts_waiting.get(key, -1):
                    self._starts_waiting[key] = start
        moved = 0
        for key, start in list(self._starts_waiting.items()):
            part = self.partitions.get(key)
            if part is None:  # (not served: a partition loaded later reads the checkpoint itself)
                del self._starts_waiting[key]
                continue
            plog = part.log
            with plog.lock:
                if start > plog.log_end_offset:
                    continue  # (the appends up to it are not shown yet)
                if start > plog.log_start_offset:
                    plog.increment_log_start_offset(start)
                    moved += 1
            del self._starts_waiting[key]
        return moved


def clear_cache(cache_dir: str) -> None:
    """Empty the cache's partition directories (the indexes of an earlier mount: rebuilt by this one), before the
    manager loads the cache. Only the cache's: it never names the broker's directory."""
    if not os.path.isdir(cache_dir):
        return
    for _, path in DataDirScan(cache_dir).partitions:
        shutil.rmtree(path, ignore_errors=True)

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
- **Following.** :meth:`BrokerLogs.sync_once`, every ``logfs.follow.interval.ms`` (the service's task), per
  partition: one ``stat`` of the partition directory (its mtime moves when the broker rolls, renames to
  ``.deleted``, swaps or removes a segment; only then is it listed) and one ``stat`` of the active segment's
  ``.log`` (it grew: the new whole batches are indexed and published). Polling, not inotify: its cost is bounded
  and known (two stats per partition per interval; 10,000 partitions at 1 s is 20,000 stats a second, no reading),
  it needs no watch per directory (``fs.inotify.max_user_watches``) and no event queue that overflows under a busy
  broker (every append is an ``IN_MODIFY``), and it sees what happened on a file system inotify does not report
  (NFS). Whether inotify's idle cost is needed for the 2%-of-a-core target on 10,000 partitions is the benchmark's
  to say.
- **Retention.** A segment the broker renamed ``.deleted`` leaves the log (which then starts at its first
  remaining segment); a reader still reading it reads it by its new name, opening it for each read and closing it
  after (no descriptor is held on a file the broker deletes). A file that is no longer the segment's inode is
  never read as it: the segment's reads fail with ``ENOENT`` instead of giving another file's bytes.
- **The cleaner's swaps.** While a ``.swap`` file exists the swap is half done, and the directory is looked at
  again later; once done, the new file at a shown segment's base offset (another inode) replaces the sealed
  segments up to the next live file, as logfs's own compaction does (:meth:`Log.forget` with ``replaced_by``).

- **Topics and partitions.** Each look ``stat``s every broker directory; when its mtime moved it is listed: a
  partition directory that is new is served once its first segment is there, one that is gone (a topic deleted:
  renamed ``-delete``) is served no more (a reader keeps what it pinned while the files exist).

Not followed yet (issue 45's next steps): partition moves between the broker's directories as such (``-future``:
the partition is served again from its new directory, open files do not follow it), a broker restart's recovery
truncation, and aborted transactions written after a segment was indexed (``.txnindex`` files are read at mount
and at each change of the directory).
"""

from __future__ import annotations

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
from .local.txn_index import aborted_by_segment
from .names import (
    DELETED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TXN_INDEX_SUFFIX, DataDirScan, collision_key, filename_prefix,
    partition_dir_name,
)

log = logging.getLogger(__name__)

# A directory whose mtime is this recent is listed again at the next look even if its mtime did not move: a change
# in the same clock tick as the last listing leaves the same mtime (the racy case git's index has too).
RACY_NS = 2_000_000_000
# How much of a growing segment one read takes while indexing what the broker appended.
SCAN_CHUNK = 1 << 20


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
    CRC-valid batches :meth:`catch_up` found, and grows as the broker appends."""

    def __init__(self, log_path: str, base: int, index_dir: str, config, open_files: OpenFiles, *, aborted=None):
        self.inode = os.stat(log_path).st_ino
        self._reads_lock = threading.Lock()
        self._reads = 0  # reads using the shared descriptor now
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
        self.size = 0  # nothing is shown until catch_up has checked it
        self.aborted = aborted
        self.has_txn_index = False  # (the broker's .txnindex is never renamed or removed by logfs)

    # -- the descriptor: this inode's, under the name it has now ------------------------------------------
    # While the segment is in the log, reads share one descriptor (``fd``, in the mount's open-file budget). Once
    # the broker removed it (``deleted``: retention renamed it ``.deleted``, and unlinks it soon), each read opens
    # the file for itself and closes it after; the shared descriptor is closed as soon as no read is using it.
    def _path_now(self) -> str:
        for path in (self.log_path, self.log_path + DELETED_SUFFIX):
            try:
                if os.stat(path).st_ino == self.inode:
                    return path
            except FileNotFoundError:
                continue
        raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT)

    def __getattr__(self, name: str):
        if name == "fd":
            fd = open_unit(self, self._path_now())
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
            if self._reads == 0 and self.deleted:
                release_unit(self)

    def let_go(self) -> None:
        """The segment left the log (its log's lock held): the shared descriptor closes now, or when the read
        using it ends."""
        with self._reads_lock:
            if self._reads == 0:
                release_unit(self)

    def _own_fd(self) -> int:
        try:
            fd = os.open(self._path_now(), os.O_RDONLY)
        except FileNotFoundError:
            raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT) from None
        if os.fstat(fd).st_ino != self.inode:
            os.close(fd)
            raise StorageIOError(f"segment {self.log_path} was removed by the broker", errno.ENOENT)
        return fd

    def read(self, position: int, length: int) -> bytes:
        if self._enter_read():
            try:
                return super().read(position, length)
            finally:
                self._exit_read()
        length = min(length, self.size - position)
        if length <= 0:
            return b""
        fd = self._own_fd()
        try:
            return os.pread(fd, length, position)
        except OSError as exc:
            raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        finally:
            os.close(fd)

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        if self._enter_read():
            try:
                return super().read_into(scratch, position, length)
            finally:
                self._exit_read()
        return memoryview(self.read(position, length))

    # -- following the broker's appends ----------------------------------------------------------------
    def catch_up(self, lock) -> bool:
        """Index and publish the whole, CRC-valid batches appended since the last look, under ``lock`` (the
        log's) batch by batch; a batch still being written waits for the next look. Whether any was added."""
        try:
            end = os.fstat(self.fd).st_size
        except OSError as exc:
            raise StorageIOError(f"stat of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        added = False
        pos, want = self.size, SCAN_CHUNK
        recovery = SegmentRecovery(self)
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
                batch = bytes(buf[at: at + size])
                try:
                    header = rec.validate(batch)
                    stats = self.visible_stats(batch, 0, header)
                except Exception:  # CRC, or a structure not yet whole: the broker is writing it
                    return added
                if header.base_offset < self.next_offset:
                    return added
                with lock:
                    recovery._index_recovered(pos + at, header, stats)
                    self.size = pos + at + size  # publish last: readers never see a batch before its index
                at += size
                added = True
            if at == 0:
                if size is not None and want < size <= end - pos:
                    want = size  # one batch larger than the chunk: read it whole
                    continue
                return added
            pos, want = pos + at, SCAN_CHUNK
        return added

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
        self.close_readonly()
        self.delete_files()


class BrokerPartition:
    """One partition of the broker's: its directory there, its log (segments read in place), and what the last
    look saw."""

    def __init__(self, directory: str, plog: Log):
        self.directory = directory
        self.log = plog
        self.dir_mtime_ns = -1
        self.warned = False

    def sync(self) -> bool:
        """One look at the broker's partition: rolls and removals (when the directory changed), then the active
        segment's appends. Whether anything new is shown."""
        plog = self.log
        st = os.stat(self.directory)
        changed = False
        if st.st_mtime_ns != self.dir_mtime_ns or time.time_ns() - st.st_mtime_ns < RACY_NS:
            self.dir_mtime_ns = st.st_mtime_ns
            changed = self._relist()
        return plog.segments.active.catch_up(plog.lock) or changed

    def _relist(self) -> bool:
        """The directory changed: the cleaner's swaps, retention's removals, and rolls, in that order."""
        plog = self.log
        names = os.listdir(self.directory)
        if any(n.endswith(SWAP_SUFFIX) for n in names):
            self.dir_mtime_ns = -1  # a swap half done (Kafka renames the old segments, then the .swap live): later
            return False
        live = _live_bases(names)
        inodes = {}
        for base, name in live.items():
            try:
                inodes[base] = os.stat(os.path.join(self.directory, name)).st_ino
            except FileNotFoundError:
                pass
        bases = sorted(inodes)
        aborted = aborted_by_segment(self.directory, names, bases) if any(
            n.endswith(TXN_INDEX_SUFFIX) for n in names) else {}
        changed = False
        # The cleaner's swaps: a new file at the base of a segment shown replaces the sealed segments from there
        # to the next live file; the view's positions after it change (as after logfs's own compaction).
        for i, base in enumerate(bases):
            segments = plog.segments.as_list()
            shown = next((s for s in segments if s.base_offset == base), None)
            if shown is None or shown.inode == inodes[base] or shown is plog.segments.active:
                continue
            end = bases[i + 1] if i + 1 < len(bases) else None
            old = [s for s in segments[:-1] if s.base_offset >= base and (end is None or s.base_offset < end)]
            new = _open(self.directory, base, plog, aborted.get(base))
            if new is None:
                continue
            new.catch_up(contextlib.nullcontext())  # (no reader sees it yet)
            new.on_become_inactive()
            with plog.lock:
                plog.forget(old, replaced_by=new)
                for segment in old:
                    segment.let_go()
            new.release()
            changed = True
        active = plog.segments.active
        for base in (b for b in bases if b > active.base_offset):
            try:
                active.catch_up(plog.lock)  # the broker finished it before it rolled
            except StorageIOError as exc:
                if exc.errno != errno.ENOENT:
                    raise  # (ENOENT: its retention took it already, after the roll; it goes below)
            segment = _open(self.directory, base, plog, aborted.get(base))
            if segment is None:
                break
            with plog.lock:
                active.on_become_inactive()
                plog.add_rolled(segment)
            active.release()
            active = segment
            changed = True
        # Retention takes sealed segments from the front (the active one too, once the broker rolled past it).
        segments = plog.segments.as_list()
        front = []
        for segment in segments[:-1]:
            if inodes.get(segment.base_offset) == segment.inode:
                break
            front.append(segment)
        if front:
            with plog.lock:
                plog.forget(front)
                for segment in front:
                    segment.let_go()
            changed = True
        gone = [s for s in plog.segments.as_list() if inodes.get(s.base_offset) != s.inode]
        if gone and not self.warned:
            log.warning("%s: segments %s changed in a way not followed yet (shown as they were)", self.directory,
                        ", ".join(str(s.base_offset) for s in gone))
            self.warned = True
        return changed


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

    def load(self) -> None:
        self.dir_mtimes = {d: -1 for d in self.broker_dirs}
        self.pending: dict[tuple[str, int], str] = {}  # partition directories without a segment yet
        self._rescan(initial=True)
        for part in self.partitions.values():
            part.sync()

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
            try:
                plog = self._load_partition(directory, topic, partition, starts.get((topic, partition), 0))
            except FileNotFoundError:
                continue  # (gone since the listing)
            if plog is None:
                pending[(topic, partition)] = directory  # (Kafka makes the directory, then its first segment)
                continue
            with m.lock:
                m.topics.setdefault(topic, {})
                m.add_log(plog)
                m.settings.collisions = {collision_key(t): t for t in m.topics}
            self.partitions[(topic, partition)] = part = BrokerPartition(directory, plog)
            if not initial:
                part.sync()
            changed = True
        self.pending = pending
        return changed

    def _drop(self, key: tuple[str, int]) -> None:
        """A partition whose directory the broker removed (or moved) is served no more; a reader of it keeps the
        segments it pinned while their files exist."""
        m = self.manager
        part = self.partitions.pop(key)
        plog = part.log
        with m.lock:
            m.unserve(*key)
            if not m.served.count(key[0]):
                m.topics.pop(key[0], None)
                m.settings.collisions = {collision_key(t): t for t in m.topics}
        with plog.lock:
            for segment in plog.segments.as_list():
                segment.deleted = segment.purged = True
                segment.let_go()
                close_if_unused(segment)

    def _load_partition(self, directory: str, topic: str, partition: int, start: int) -> Log | None:
        m = self.manager
        cache = m.data_dir
        names = os.listdir(directory)
        live = _live_bases(names)
        if not live:
            return None
        config = m.topic_config(topic)
        index_dir = os.path.join(cache, partition_dir_name(topic, partition))
        os.makedirs(index_dir, exist_ok=True)
        bases = sorted(live)
        aborted = aborted_by_segment(directory, names, bases)
        segments: list[BrokerSegment] = []
        for base in bases:
            try:
                segment = BrokerSegment(os.path.join(directory, live[base]), base, index_dir, config, m.open_files,
                                        aborted=aborted.get(base))
            except FileNotFoundError:
                continue  # (retention took it since the listing)
            segment.catch_up(contextlib.nullcontext())  # (no reader sees it yet)
            segments.append(segment)
        if not segments:
            return None
        for segment in segments[:-1]:
            segment.on_become_inactive()
            segment.release()
        plog = Log(index_dir, topic, partition, config, segments, log_start_offset=segments[0].base_offset,
                   recovery_point=0, clock=m.clock, log_dir=m.dirs[0].log_dir, open_files=m.open_files)
        plog.log_start_offset = min(max(start, segments[0].base_offset), plog.log_end_offset)
        plog.recovery_point = plog.log_end_offset
        return plog

    def sync_once(self) -> int:
        """One look at every partition (see the module's docstring); how many showed something new. A partition
        whose directory the broker removed is left as it was (not followed yet)."""
        self.looks += 1
        changed = 0
        failed: Exception | None = None
        try:
            changed += self._rescan()
        except (OSError, LogfsError) as exc:
            failed = exc
        for part in list(self.partitions.values()):
            try:
                if part.sync():
                    changed += 1
                    plog = part.log
                    newest = plog.segments.active.max_timestamp
                    if newest > plog.last_append_ms:
                        plog.last_append_ms = newest
            except FileNotFoundError:
                continue
            except (OSError, LogfsError) as exc:  # one partition's trouble stops no other's following
                failed = failed or exc
        if failed is not None:
            raise failed  # (the service logs it, once until following works again)
        return changed


def clear_cache(cache_dir: str) -> None:
    """Empty the cache's partition directories (the indexes of an earlier mount: rebuilt by this one), before the
    manager loads the cache. Only the cache's: it never names the broker's directory."""
    if not os.path.isdir(cache_dir):
        return
    for _, path in DataDirScan(cache_dir).partitions:
        shutil.rmtree(path, ignore_errors=True)

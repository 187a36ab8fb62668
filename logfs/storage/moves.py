"""Moving a partition between log directories while it is appended to and read (Kafka's intra-broker move,
``kafka-reassign-partitions.sh`` with ``log_dirs``; here ``setfattr -n user.logfs.log_dir -v DIR MNT/t/0``).

The protocol, crash-safe at every step:

  1. ``<topic>-<n>.<id>-future`` is made in the target directory, and the partition's segments are copied into it
     while appends and reads go on: sealed segments whole (immutable), the active segment's bytes as they come
     (catching up until little is left). Each copied file is fsynced. The cleaner is held off the partition
     (its ``rewrite_lock``); retention goes on (a segment it removes meanwhile is left out).
  2. Under the log's lock (appends wait; readers do not): what changed since is copied (the active segment's new
     bytes, and its last batch again, since a small append rewrites that batch's header in place; the indexes of
     every segment that was copied while active), the other files of the partition, and everything fsynced. The
     target directory's checkpoints are written with the partition in them (its log start offset, its recovery
     point: the end, all of it being synced now).
  3. The source directory is renamed ``<topic>-<n>.<id>-delete`` and the source log directory fsynced: the commit
     point. Before it the partition lives in the source (a crash leaves a ``-future`` copy, which the next mount
     removes); after it, in the target (a crash leaves the ``-future`` copy alone, which the next mount renames
     live: :meth:`~logfs.storage.loading.LogDirsLoader._settle_moves`).
  4. The copy is renamed ``<topic>-<n>`` and the target directory fsynced. The log's segments then use the new
     files: each open descriptor is replaced by one of the copy with ``dup2`` (the same number, so a reader in the
     middle of a ``pread`` reads the same bytes from either), the paths change, and the log's directory and
     failure channel are the target's. Handles, snapshots and ``tail -f`` readers go on as they were. The source
     is purged after ``file.delete.delay.ms``.

A failure before the commit point removes the copy and leaves the partition where it was; an I/O error takes the
directory it came from offline (reads of the source, writes of the target). From the commit point on, a failure
takes the target offline: the next mount completes the move.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from typing import ContextManager, Protocol

from . import checkpoints as ckpt
from .clock import Clock
from .config import BrokerConfig
from .errors import InvalidConfigError, LogfsError, NotSupportedError, PartitionBusyError
from .local.log import Log
from .local.segment import LogSegment
from .log_dirs import DataDir
from .names import REMOTE_CACHE_DIR, delete_dir_name, future_dir_name, parse_segment_file, partition_dir_name

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes per copy_file_range of the copy
CATCH_UP_BYTES = 4 << 20  # the copy catches up outside the lock until less than this is left
CATCH_UP_ROUNDS = 64
SYNC_EVERY = 8 << 20  # bytes of a copy written back at a time
REWRITE_WINDOW = 64 << 10  # copied again each time: a tail batch grows in place within its last TAIL_BATCH_CAP


class _Source(Exception):
    """An OSError met reading the source (its directory's disk), as opposed to writing the copy."""

    def __init__(self, exc: OSError):
        super().__init__(str(exc))
        self.exc = exc


def _copy_range(src_path: str, dst_fd: int, start: int, end: int, stop: threading.Event | None = None,
                throttle: "_Throttle | None" = None) -> None:
    """Bytes [start, end) of ``src_path`` to the same place of ``dst_fd`` (abandoned when ``stop`` is set; paced
    by ``throttle``).

    By ``copy_file_range``: the kernel copies, one call per chunk, without the GIL (a Python loop of pread and
    pwrite held it between its calls long enough to double the partition's append p99). Where the kernel cannot
    (between file systems, or on one without it) a chunk is copied by pread and pwrite; an error of a disk is the
    source's if the source cannot be read, else the target's."""
    try:
        src = os.open(src_path, os.O_RDONLY)
    except OSError as exc:
        raise _Source(exc) from exc
    try:
        at = start
        while at < end:
            if stop is not None and stop.is_set():
                raise LogfsError("the move was abandoned: logfs is stopping")
            want = min(CHUNK, end - at)
            began = time.monotonic()
            try:
                done = os.copy_file_range(src, dst_fd, want, at, at)
            except OSError as exc:
                if exc.errno not in _NO_COPY_FILE_RANGE:
                    # An error of a disk: the source's if reading it fails too, else the target's. Never written
                    # again (a failed write is the target disk's failure, not something to retry).
                    try:
                        os.pread(src, min(want, 4096), at)
                    except OSError as read_error:
                        raise _Source(read_error) from read_error
                    raise
                done = _copy_slowly(src, src_path, dst_fd, at, want)
            if done <= 0:
                raise _Source(OSError(5, f"{src_path} is shorter than {end} bytes"))
            at += done
            if (at - start) % SYNC_EVERY < done:
                # Written back as it goes: a copy that leaves a gigabyte dirty makes the kernel throttle every
                # writer of the machine (the partition's appends too) while it flushes it.
                os.fdatasync(dst_fd)
            if throttle is not None:
                throttle.spent(done, time.monotonic() - began)
    finally:
        os.close(src)


class _Throttle:
    """At most ``rate`` bytes a second (Kafka's ``replica.alter.log.dirs.io.max.bytes.per.second``), and copying
    at most ``share`` of the time (``logfs.move.disk.share``), both on average since the move began.

    The share adapts to the disk: a chunk's copy and write-back take what the disks make them take, and the copy
    then sleeps the rest of its share. At 0.2 a move uses a fifth of the time of whatever disks it runs on (about
    220 MB/s on the 1.1 GB/s copy measured here, 20 MB/s on a disk that copies at 100), and the partition's
    appends keep their latency (docs/benchmarks.md, "Several log directories"); a fixed rate cannot do both."""

    def __init__(self, rate: int, share: float = 1.0, *, clock=time.monotonic, sleep=time.sleep):
        self.rate, self.share, self.clock, self.sleep = rate, share, clock, sleep
        self.bytes, self.busy, self.began = 0, 0.0, clock()

    def spent(self, n: int, busy: float = 0.0) -> None:
        self.bytes += n
        self.busy += busy
        due = max(self.bytes / self.rate, self.busy / self.share)  # seconds since the move began
        ahead = due - (self.clock() - self.began)
        if ahead > 0:
            self.sleep(ahead)


# copy_file_range not available between these files (another file system, an old kernel, FUSE without it): the
# chunk is copied by pread and pwrite.
_NO_COPY_FILE_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


def _copy_slowly(src: int, src_path: str, dst_fd: int, at: int, want: int) -> int:
    try:
        data = os.pread(src, want, at)
    except OSError as exc:
        raise _Source(exc) from exc
    if not data:
        raise _Source(OSError(5, f"{src_path} is shorter than expected"))
    os.pwrite(dst_fd, data, at)
    return len(data)


class _SegmentCopy:
    """One segment's four files in the copy, and how much of them is copied."""

    def __init__(self, directory: str, segment: LogSegment, lock, stop: threading.Event, throttle: _Throttle):
        self.lock, self.stop, self.throttle = lock, stop, throttle
        self.base = segment.base_offset
        self.sealed = False  # copied whole while sealed: nothing more to do
        self.log_bytes = 0
        self.fds: dict[str, int] = {}
        self.paths = {}
        for src in _files(segment):
            path = os.path.join(directory, os.path.basename(src))
            self.paths[src] = path
            self.fds[src] = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def copy(self, segment: LogSegment, *, final: bool) -> int:
        """Copy what is new of ``segment``; returns the bytes of its .log still to copy after this."""
        sealed_now = not segment.active  # (set once its indexes are final: on_become_inactive)
        size = segment.size
        log_fd = self.fds[segment.log_path]
        # The last batch of an active segment may have grown in place since (its header rewritten: at most
        # TAIL_BATCH_CAP from the end), and an undone append or a truncation rewrites from where it cut.
        with self.lock:  # (the log's: an undo sets the mark under it)
            rewritten, segment.rewritten = segment.rewritten, LogSegment.rewritten
        start = min(max(0, self.log_bytes - REWRITE_WINDOW), rewritten)
        _copy_range(segment.log_path, log_fd, start, size, None if final else self.stop,
                    None if final else self.throttle)
        self.log_bytes = size
        if final or sealed_now:
            for index in (segment.offset_index, segment.time_index, segment.view_index):
                fd = self.fds[index.path]
                _copy_range(index.path, fd, 0, index.entries * index.entry_size)
                try:
                    length = os.stat(index.path).st_size
                except OSError as exc:
                    raise _Source(exc) from exc
                os.ftruncate(fd, length)
            os.ftruncate(log_fd, size)
            self.sealed = sealed_now
        return max(0, segment.size - size)

    def sync(self) -> None:
        for fd in self.fds.values():
            os.fsync(fd)


def _files(segment: LogSegment) -> list[str]:
    return [segment.log_path, segment.offset_index.path, segment.time_index.path, segment.view_index.path]


class MovedLogs(Protocol):
    """What a move needs of the LogManager: its directories and logs, its lock and stop flag, its settings."""

    dirs: list[DataDir]
    logs: dict
    lock: threading.RLock
    stopping: threading.Event
    broker: BrokerConfig
    clock: Clock
    remote: object  # tiered storage's RemoteLogManager, or None (a tiered partition is not moved)

    def get_log(self, topic: str, partition: int) -> Log: ...
    def dir_of(self, plog: Log) -> DataDir: ...
    def dir_by_path(self, path: str) -> DataDir | None: ...
    def on_disk_of(self, d: DataDir, what: str) -> ContextManager[None]: ...
    def defer_removal(self, path: str, delay_ms: int) -> None: ...
    def checkpoint(self) -> None: ...


class PartitionMover:
    """The moves between the log directories of one LogManager (its ``mover``): those under way (``moving``: each
    partition's target directory), their threads, and how many ended each way."""

    def __init__(self, manager: MovedLogs):
        self.manager = manager
        self.moving: dict[tuple[str, int], str] = {}  # partitions being moved -> their target directory
        self.threads: set[_MoveThread] = set()
        self.done = self.failed = 0

    def move_partition(self, topic: str, partition: int, target: str) -> bool:
        """Move the partition to the log directory ``target`` and wait for the move to end; raises what it failed
        with. False when the partition is there already."""
        thread = self.start_move(topic, partition, target)
        if thread is None:
            return False
        thread.join()
        if thread.failure is not None:
            raise thread.failure
        return True

    def start_move(self, topic: str, partition: int, target: str) -> "_MoveThread | None":
        """Start moving the partition to the log directory ``target`` (one of the mount's) by the protocol above,
        in a thread of its own, and return it (None when the partition is there already). What cannot be moved is
        refused here: a directory that is not the mount's (InvalidConfigError), a partition already moving
        (PartitionBusyError), a tiered one (NotSupportedError), an offline directory (LogDirOfflineError).

        The move runs in the background, as Kafka's reassignment does: a FUSE ``setxattr`` holds the file's inode
        lock until it returns, and the kernel would hold every ``write()`` to the partition that long."""
        m = self.manager
        plog = m.get_log(topic, partition)
        target_dir = m.dir_by_path(os.path.abspath(target.rstrip("/") or "/"))
        if target_dir is None:
            raise InvalidConfigError(f"{target!r} is not a log directory of this mount (they are "
                                     f"{', '.join(d.path for d in m.dirs)})")
        source_dir = m.dir_of(plog)
        if target_dir is source_dir:
            return None
        if m.remote is not None and plog.config.remote_storage_enable:
            raise NotSupportedError(f"{plog.name} is tiered: moving a tiered partition between log directories is "
                                    "not supported (its remote cache and tiering state live in its directory)")
        source_dir.log_dir.check()
        target_dir.log_dir.check()
        key = (topic, partition)
        with m.lock:
            if key in self.moving:
                raise PartitionBusyError(f"{plog.name} is already being moved to {self.moving[key]}")
            self.moving[key] = target_dir.path
            thread = _MoveThread(self, key, plog, source_dir, target_dir)
            self.threads.add(thread)
        log.info("moving %s from %s to %s", plog.name, source_dir.path, target_dir.path)
        thread.start()
        return thread

    def wait_for_moves(self) -> None:
        """Stop the moves under way (``stopping`` is set) and wait for them: each ends at its next step, its copy
        removed (or, past its commit point, done)."""
        m = self.manager
        m.stopping.set()
        for thread in list(self.threads):
            thread.join()

    def _move(self, plog, source_dir: DataDir, target_dir: DataDir) -> None:
        m = self.manager
        try:
            future = os.path.join(target_dir.path, future_dir_name(plog.topic, plog.partition))
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
        copies: dict[int, _SegmentCopy] = {}
        throttle = _Throttle(m.broker.get("replica.alter.log.dirs.io.max.bytes.per.second"),
                             m.broker.get("logfs.move.disk.share"))
        committed = relocated = False
        try:
            with m.on_disk_of(target_dir, f"moving {plog.name}"):
                os.mkdir(future)
            self._copy_until_close(plog, future, copies, target_dir, throttle)
            with plog.lock:
                if plog.closed:
                    raise LogfsError(f"{plog.name} was deleted while it was being moved")
                self._final_copy(plog, future, copies, target_dir, throttle)
                # The commit point: the source renamed for deletion, in its own log directory.
                gone = os.path.join(source_dir.path, delete_dir_name(plog.topic, plog.partition))
                with m.on_disk_of(source_dir, f"moving {plog.name}"):
                    plog.hold_pinned()  # (segments that left the log but are still read: their files stay open)
                    os.rename(plog.directory, gone)
                    committed = True
                    ckpt.fsync_dir(source_dir.path)
                live = os.path.join(target_dir.path, partition_dir_name(plog.topic, plog.partition))
                try:
                    os.rename(future, live)
                    ckpt.fsync_dir(target_dir.path)
                except OSError as exc:
                    plog.log_dir = target_dir.log_dir  # (its partition answers EIO; the next mount completes it)
                    target_dir.log_dir.io_error(exc, f"moving {plog.name} into {target_dir.path}", space_ok=False)
                    raise
                try:
                    self._relocate(plog, gone, live, target_dir)
                except BaseException as exc:
                    # Half relocated (a descriptor that would not open, EMFILE...): appends could go on into the
                    # source's files, which are purged with it. The target goes offline instead (EIO until the
                    # next mount, which finds the partition whole in it).
                    plog.directory, plog.log_dir = live, target_dir.log_dir
                    relocated = True  # (it is the target's now, offline: counted below, outside the log's lock)
                    target_dir.log_dir.take_offline(f"moving {plog.name}: its files could not be switched: {exc}")
                    raise
        except BaseException as exc:
            for copy in copies.values():
                copy.close()
            if relocated:
                with m.lock:
                    source_dir.partitions -= 1
                    target_dir.partitions += 1
            if not committed:
                if not target_dir.offline:  # (nothing more is written to a failed disk)
                    shutil.rmtree(future, ignore_errors=True)
                if isinstance(exc, _Source):
                    raise source_dir.log_dir.io_error(exc.exc, f"moving {plog.name}: reading it") from exc.exc
            raise
        for copy in copies.values():
            copy.close()
        with m.lock:
            source_dir.partitions -= 1
            target_dir.partitions += 1
            m.defer_removal(gone, plog.config.file_delete_delay_ms)
        try:
            m.checkpoint()  # the source's checkpoints without it
        except (OSError, LogfsError) as exc:
            log.warning("checkpoints not rewritten after moving %s: %s (they are at the next checkpoint)",
                        plog.name, exc)
        log.info("moved %s from %s to %s", plog.name, source_dir.path, target_dir.path)

    def _copy_until_close(self, plog, future: str, copies: dict, target_dir: DataDir, throttle: _Throttle) -> None:
        """Step 1: copy outside the log's lock until what is left is small."""
        m = self.manager
        for _ in range(CATCH_UP_ROUNDS):
            if m.stopping.is_set():
                raise LogfsError(f"moving {plog.name} abandoned: logfs is stopping")
            with plog.snapshot() as snap:
                left = 0
                for segment in snap.segments:
                    copy = copies.get(segment.base_offset)
                    if copy is not None and copy.sealed:
                        continue
                    try:
                        with m.on_disk_of(target_dir, f"moving {plog.name}"):
                            if copy is None:
                                copy = copies[segment.base_offset] = _SegmentCopy(
                                    future, segment, plog.lock, m.stopping, throttle)
                            left += copy.copy(segment, final=False)
                            copy.sync()  # (outside the lock: the final step then syncs only what changed since)
                    except _Source as exc:
                        if segment.deleted:
                            continue  # (retention took it meanwhile: it is left out)
                        raise exc
                behind = snap.segments[-1].size - copies[snap.segments[-1].base_offset].log_bytes if snap.segments \
                    else 0
            if behind + left < CATCH_UP_BYTES:
                return

    def _final_copy(self, plog, future: str, copies: dict, target_dir: DataDir, throttle: _Throttle) -> None:
        """Step 2, under the log's lock."""
        m = self.manager
        live = {s.base_offset for s in plog.segments}
        for base in [b for b in copies if b not in live]:  # removed by retention meanwhile
            copy = copies.pop(base)
            for path in copy.paths.values():
                os.unlink(path)
            copy.close()
        with m.on_disk_of(target_dir, f"moving {plog.name}"):
            for segment in plog.segments:
                copy = copies.get(segment.base_offset)
                if copy is None:
                    copy = copies[segment.base_offset] = _SegmentCopy(future, segment, plog.lock, m.stopping,
                                                                      throttle)
                if not copy.sealed:
                    copy.copy(segment, final=True)
                    copy.sync()
            for name in os.listdir(plog.directory):  # the partition's other files (not its segments, not caches)
                src = os.path.join(plog.directory, name)
                if parse_segment_file(name) is not None or name == REMOTE_CACHE_DIR or not os.path.isfile(src):
                    continue
                shutil.copyfile(src, os.path.join(future, name))
                fd = os.open(os.path.join(future, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            ckpt.fsync_dir(future)
            plog.recovery_point = plog.log_end_offset  # (every byte of the copy is synced)
            logs = {k: v for k, v in m.logs.items() if m.dir_of(v) is target_dir}
            logs[(plog.topic, plog.partition)] = plog
            target_dir.write_checkpoints(logs)

    def _relocate(self, plog, gone: str, live: str, target_dir: DataDir) -> None:
        """Step 4: the log's segments on the copy's files, under the log's lock."""
        old = plog.directory
        for segment in plog.segments:
            with segment.open_files.lock:
                _switch(segment.__dict__, "fd", segment.log_path, old, live)
                segment.log_path = os.path.join(live, os.path.basename(segment.log_path))
                for index in (segment.offset_index, segment.time_index, segment.view_index):
                    _switch(index.__dict__, "_fd", index.path, old, live)
                    index.path = os.path.join(live, os.path.basename(index.path))
            segment.directory = live
        for _, segment in plog.deleted_segments:  # (their files went with the source: purged with it)
            segment.directory = gone
            segment.log_path = os.path.join(gone, os.path.basename(segment.log_path))
            for index in (segment.offset_index, segment.time_index, segment.view_index):
                index.path = os.path.join(gone, os.path.basename(index.path))
        plog.directory = live
        plog.log_dir = target_dir.log_dir
        plog._layout_changed()


class _MoveThread(threading.Thread):
    """One move in the background; ``failure`` is what it failed with (logged; an error of a disk was reported to
    its directory)."""

    def __init__(self, mover: PartitionMover, key, plog, source_dir: DataDir, target_dir: DataDir):
        super().__init__(name=f"move {plog.name}", daemon=True)
        self.mover, self.key, self.plog = mover, key, plog
        self.source_dir, self.target_dir = source_dir, target_dir
        self.failure: BaseException | None = None

    def run(self) -> None:
        mover, plog = self.mover, self.plog
        try:
            # A background copy: the lowest CPU priority (Linux's nice is per thread), so that on a busy machine the
            # copy's own CPU (copy_file_range runs in this thread, in the kernel) waits for the appends and reads.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        try:
            with plog.rewrite_lock:  # the cleaner and compression keep off it meanwhile
                mover._move(plog, self.source_dir, self.target_dir)
            mover.done += 1
        except BaseException as exc:  # noqa: BLE001 (logged, and kept for move_partition)
            self.failure = exc
            if mover.manager.stopping.is_set() and not isinstance(exc, OSError):
                log.info("moving %s to %s stopped with logfs: %s", plog.name, self.target_dir.path, exc)
            else:
                mover.failed += 1
                log.error("moving %s to %s failed: %s", plog.name, self.target_dir.path, exc)
        finally:
            with mover.manager.lock:
                mover.moving.pop(self.key, None)
                mover.threads.discard(self)


def _switch(attrs: dict, name: str, path: str, old_dir: str, new_dir: str) -> None:
    """Point the open descriptor ``attrs[name]`` (if open) at the copy of ``path``: the same number, the new file."""
    fd = attrs.get(name)
    if fd is None or fd < 0:
        return
    new = os.open(os.path.join(new_dir, os.path.basename(path)), os.O_RDWR)
    try:
        os.dup2(new, fd)
    finally:
        os.close(new)


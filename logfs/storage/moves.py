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
     live: :meth:`~logfs.storage.manager.LogManager._settle_moves`).
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

import logging
import os
import shutil

from . import checkpoints as ckpt
from .errors import InvalidConfigError, LogfsError, NotSupportedError, PartitionBusyError
from .local.open_files import OPEN_FILES
from .local.segment import LogSegment
from .log_dirs import DataDir
from .names import REMOTE_CACHE_DIR, delete_dir_name, future_dir_name, parse_segment_file, partition_dir_name

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes per pread/pwrite of the copy
CATCH_UP_BYTES = 4 << 20  # the copy catches up outside the lock until less than this is left
CATCH_UP_ROUNDS = 64
REWRITE_WINDOW = 64 << 10  # copied again each time: a tail batch grows in place within its last TAIL_BATCH_CAP


class _Source(Exception):
    """An OSError met reading the source (its directory's disk), as opposed to writing the copy."""

    def __init__(self, exc: OSError):
        super().__init__(str(exc))
        self.exc = exc


def _copy_range(src_path: str, dst_fd: int, start: int, end: int) -> None:
    """Bytes [start, end) of ``src_path`` to the same place of ``dst_fd``."""
    try:
        src = os.open(src_path, os.O_RDONLY)
    except OSError as exc:
        raise _Source(exc) from exc
    try:
        at = start
        while at < end:
            try:
                data = os.pread(src, min(CHUNK, end - at), at)
            except OSError as exc:
                raise _Source(exc) from exc
            if not data:
                raise _Source(OSError(5, f"{src_path} is shorter than {end} bytes"))
            os.pwrite(dst_fd, data, at)
            at += len(data)
    finally:
        os.close(src)


class _SegmentCopy:
    """One segment's four files in the copy, and how much of them is copied."""

    def __init__(self, directory: str, segment: LogSegment, lock):
        self.lock = lock
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
        _copy_range(segment.log_path, log_fd, start, size)
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


class PartitionMoves:
    """Moves between the log directories (a mixin of LogManager)."""

    def log_dir_of(self, topic: str, partition: int) -> str:
        """The log directory holding the partition (``user.logfs.log_dir``)."""
        return self.dir_of(self.get_log(topic, partition)).path

    def move_partition(self, topic: str, partition: int, target: str) -> bool:
        """Move the partition to the log directory ``target`` (one of the mount's) by the protocol above; returns
        False when it is there already. Blocks until the move is done (appends and reads go on meanwhile)."""
        plog = self.get_log(topic, partition)
        target_dir = self._dirs_by_path.get(os.path.abspath(target.rstrip("/") or "/"))
        if target_dir is None:
            raise InvalidConfigError(f"{target!r} is not a log directory of this mount (they are "
                                     f"{', '.join(d.path for d in self.dirs)})")
        source_dir = self.dir_of(plog)
        if target_dir is source_dir:
            return False
        if self.remote is not None and plog.config.remote_storage_enable:
            raise NotSupportedError(f"{plog.name} is tiered: moving a tiered partition between log directories is "
                                    "not supported (its remote cache and tiering state live in its directory)")
        source_dir.log_dir.check()
        target_dir.log_dir.check()
        key = (topic, partition)
        with self.lock:
            if key in self.moving:
                raise PartitionBusyError(f"{plog.name} is already being moved to {self.moving[key]}")
            self.moving[key] = target_dir.path
        try:
            with plog.rewrite_lock:  # the cleaner and compression keep off it meanwhile
                self._move(plog, source_dir, target_dir)
        finally:
            with self.lock:
                self.moving.pop(key, None)
        return True

    def _move(self, plog, source_dir: DataDir, target_dir: DataDir) -> None:
        try:
            future = os.path.join(target_dir.path, future_dir_name(plog.topic, plog.partition))
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
        copies: dict[int, _SegmentCopy] = {}
        committed = False
        try:
            with self._on(target_dir, f"moving {plog.name}"):
                os.mkdir(future)
            self._copy_until_close(plog, future, copies, source_dir, target_dir)
            with plog.lock:
                if plog.closed:
                    raise LogfsError(f"{plog.name} was deleted while it was being moved")
                self._final_copy(plog, future, copies, source_dir, target_dir)
                # The commit point: the source renamed for deletion, in its own log directory.
                gone = os.path.join(source_dir.path, delete_dir_name(plog.topic, plog.partition))
                with self._on(source_dir, f"moving {plog.name}"):
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
                self._relocate(plog, gone, live, target_dir)
        except BaseException as exc:
            for copy in copies.values():
                copy.close()
            if not committed:
                if not target_dir.offline:  # (nothing more is written to a failed disk)
                    shutil.rmtree(future, ignore_errors=True)
                if isinstance(exc, _Source):
                    raise source_dir.log_dir.io_error(exc.exc, f"moving {plog.name}: reading it") from exc.exc
            raise
        for copy in copies.values():
            copy.close()
        with self.lock:
            source_dir.partitions -= 1
            target_dir.partitions += 1
            self._deleted_dirs.append((self.clock.time_ms() + plog.config.file_delete_delay_ms, gone))
        try:
            self.checkpoint()  # the source's checkpoints without it
        except (OSError, LogfsError) as exc:
            log.warning("checkpoints not rewritten after moving %s: %s (they are at the next checkpoint)",
                        plog.name, exc)
        log.info("moved %s from %s to %s", plog.name, source_dir.path, target_dir.path)

    def _copy_until_close(self, plog, future: str, copies: dict, source_dir: DataDir, target_dir: DataDir) -> None:
        """Step 1: copy outside the log's lock until what is left is small."""
        for _ in range(CATCH_UP_ROUNDS):
            if self.stopping.is_set():
                raise LogfsError(f"moving {plog.name} abandoned: logfs is stopping")
            with plog.snapshot() as snap:
                left = 0
                for segment in snap.segments:
                    copy = copies.get(segment.base_offset)
                    if copy is not None and copy.sealed:
                        continue
                    try:
                        with self._on(target_dir, f"moving {plog.name}"):
                            if copy is None:
                                copy = copies[segment.base_offset] = _SegmentCopy(future, segment, plog.lock)
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

    def _final_copy(self, plog, future: str, copies: dict, source_dir: DataDir, target_dir: DataDir) -> None:
        """Step 2, under the log's lock."""
        live = {s.base_offset for s in plog.segments}
        for base in [b for b in copies if b not in live]:  # removed by retention meanwhile
            copy = copies.pop(base)
            for path in copy.paths.values():
                os.unlink(path)
            copy.close()
        with self._on(target_dir, f"moving {plog.name}"):
            for segment in plog.segments:
                copy = copies.get(segment.base_offset)
                if copy is None:
                    copy = copies[segment.base_offset] = _SegmentCopy(future, segment, plog.lock)
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
            logs = {k: v for k, v in self.logs.items() if self.dir_of(v) is target_dir}
            logs[(plog.topic, plog.partition)] = plog
            target_dir.write_checkpoints(logs)

    def _relocate(self, plog, gone: str, live: str, target_dir: DataDir) -> None:
        """Step 4: the log's segments on the copy's files, under the log's lock."""
        old = plog.directory
        for segment in plog.segments:
            with OPEN_FILES.lock:
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


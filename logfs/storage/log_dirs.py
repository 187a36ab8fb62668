"""The log directories of a mount (Kafka's ``log.dirs``): each one a Kafka log directory of its own.

A :class:`DataDir` is one directory's state: its path, its health (:class:`~logfs.storage.failure.LogDir`, the
failure channel: an I/O error takes that directory offline and no other), its ``.lock``, its clean-shutdown
marker and its checkpoint files (``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint``), which name only the partitions it holds. The topics file
(:mod:`~logfs.storage.topics`) is written to every directory, so that any one of them describes the topics.

Placement is Kafka's ``LogManager.nextLogDirs``: a new partition goes to the online directory holding the fewest
partitions, the first named on a tie. The first directory also holds the mount's own state: the Spark sink's
staging and transaction log, and tiering's pending deletions.

A single DATA_DIR is the one-directory case: the same files, where they always were.

A broker's log directory also holds partitions logfs never serves (Kafka's internal topics): their entries in the
checkpoint files are kept as found and written back with every checkpoint (``keep_entries``), so that the broker
given the directory again finds its own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading

from . import checkpoints as ckpt
from .errors import LockedError
from .failure import LogDir
from .names import LOCK_FILE


_MARKER_MAX_BYTES = 4096  # (Kafka's marker is a line of JSON; anything longer is not one, and is cut)


def parse_log_dirs(spec: str) -> list[str]:
    """``DIR1,DIR2,...`` (as ``log.dirs`` and the mount's first field give them) -> absolute paths, in order;
    ValueError for an empty entry or a directory named twice."""
    parts = [p.strip() for p in spec.split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError(f"log directories {spec!r}: an empty entry (give DIR or DIR1,DIR2,...)")
    paths = [os.path.abspath(p) for p in parts]
    real = [os.path.realpath(p) for p in paths]
    for i, path in enumerate(real):
        for other in real[:i]:
            if path == other or path.startswith(other + os.sep) or other.startswith(path + os.sep):
                raise ValueError(f"log directories {spec!r}: {paths[i]} and {paths[real.index(other)]} overlap "
                                 "(each log directory must be a directory of its own)")
    return paths


class DataDir:
    """One log directory: its path, health, lock, clean-shutdown marker and checkpoints."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.log_dir = LogDir(self.path)
        self.lock_fd: int | None = None
        self.had_clean_shutdown = False
        self.clean_marker_content = b""  # (take_clean_marker)
        self.partitions = 0  # the partitions it holds (placement)
        # One writer of this directory's checkpoint files at a time (as Kafka's CheckpointFile.write holds a lock):
        # they are written through one temporary name each, and two writers at once (DeleteRecords in a worker
        # thread, the periodic checkpoint, retention) renamed each other's file away: ENOENT, the directory offline.
        self._checkpoint_lock = threading.Lock()
        # The checkpoint entries of the partitions here that logfs leaves alone (keep_entries).
        self.kept: tuple[dict, dict, dict] = ({}, {}, {})

    def __repr__(self) -> str:
        return f"DataDir({self.path!r})"

    @property
    def offline(self) -> bool:
        return self.log_dir.offline

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def holds(self, directory: str) -> bool:
        """Whether ``directory`` (a partition's) is in this log directory."""
        return os.path.dirname(directory) == self.path

    # -- the lock and the clean-shutdown marker ------------------------------------------------------------
    def acquire_lock(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.file(LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockedError(f"{self.path} is in use by another logfs or Kafka process (.lock is held)")
        try:
            # Kafka's broker locks .lock with FileChannel.tryLock: a POSIX record lock, which flock() neither sees
            # nor takes. Both, so that neither a logfs nor a Kafka broker gets a directory the other one uses.
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise LockedError(f"{self.path} is in use by another process, a Kafka broker perhaps (.lock is held)")
        self.lock_fd = fd

    def release_lock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def take_clean_marker(self) -> bool:
        """Whether the last shutdown was clean; the marker is removed (it is written again at the next one)."""
        marker = self.file(ckpt.CLEAN_SHUTDOWN)
        try:
            with open(marker, "rb") as f:
                # A broker's marker holds its epoch (Kafka's CleanShutdownFileHandler: {"version":0,
                # "brokerEpoch":N}), which it sends the controller when it registers again: without it the
                # controller takes the restart for an unclean shutdown. Written back as found (mark_clean).
                self.clean_marker_content = f.read(_MARKER_MAX_BYTES)
            self.had_clean_shutdown = True
        except OSError:  # (missing; or there, but unreadable: clean all the same, its content lost)
            self.clean_marker_content = b""
            self.had_clean_shutdown = os.path.exists(marker)
        return self.had_clean_shutdown

    def drop_clean_marker(self) -> None:
        if self.had_clean_shutdown:
            try:
                os.unlink(self.file(ckpt.CLEAN_SHUTDOWN))
            except FileNotFoundError:
                pass

    def mark_clean(self) -> None:
        """The clean-shutdown marker, with what the one found at mount held (a broker's epoch; empty when this
        directory was not shut down cleanly before, or by logfs)."""
        ckpt.atomic_write(self.file(ckpt.CLEAN_SHUTDOWN), self.clean_marker_content)

    # -- checkpoints -----------------------------------------------------------------------------------
    def read_checkpoints(self) -> tuple[dict, dict, dict]:
        """(recovery points, log start offsets, cleaner offsets) by (topic, partition)."""
        return (ckpt.read_checkpoint(self.file(ckpt.RECOVERY_POINT)),
                ckpt.read_checkpoint(self.file(ckpt.LOG_START_OFFSET)),
                ckpt.read_checkpoint(self.file(ckpt.CLEANER_OFFSET)))

    def keep_entries(self, partitions, checkpoints: tuple[dict, dict, dict]) -> None:
        """Keep, for every checkpoint written from now on, the entries that ``checkpoints`` (recovery points, log
        start offsets, cleaner offsets, as :meth:`read_checkpoints` gives them) hold for ``partitions`` ((topic,
        partition) pairs here that logfs does not serve, such as Kafka's internal topics in a broker's directory).
        Kafka reads a missing entry as offset 0 (recovery from the first segment, compaction from the start)."""
        wanted = set(partitions)
        self.kept = tuple({k: v for k, v in entries.items() if k in wanted} for entries in checkpoints)

    def write_checkpoints(self, logs: dict) -> None:
        """The recovery points and log start offsets of ``logs`` ((topic, partition) -> Log), this directory's,
        and the entries kept for the partitions logfs leaves alone."""
        recovery, starts, _ = self.kept
        with self._checkpoint_lock:  # (the offsets are read inside: a later writer never writes older ones)
            ckpt.write_checkpoint(self.file(ckpt.RECOVERY_POINT),
                                  {**recovery, **{k: v.recovery_point for k, v in logs.items()}})
            ckpt.write_checkpoint(self.file(ckpt.LOG_START_OFFSET),
                                  {**starts, **{k: v.log_start_offset for k, v in logs.items()}})

    def write_cleaner_checkpoint(self, offsets: dict) -> None:
        """``offsets`` (this directory's cleaned partitions), and the entries kept for the partitions logfs leaves
        alone."""
        with self._checkpoint_lock:
            ckpt.write_checkpoint(self.file(ckpt.CLEANER_OFFSET), {**self.kept[2], **offsets})


def next_log_dir(dirs: list[DataDir]) -> DataDir | None:
    """Kafka's placement: the online directory with the fewest partitions (the first named on a tie); None when
    every directory is offline."""
    online = [d for d in dirs if not d.offline]
    return min(online, key=lambda d: d.partitions) if online else None

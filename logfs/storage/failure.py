"""A log directory whose disk fails: Kafka's LogDirFailureChannel, for one directory.

Kafka sends every ``IOException`` of log I/O to ``LogDirFailureChannel``; the directory goes offline, its logs
stop, and it stays offline until the broker restarts, which recovers it from its checkpoints as after a crash.
logfs does the same (CONTRACT section 12):

- **Any I/O error takes the directory offline**: ``EIO``, ``EROFS`` (a file system remounted read-only), an
  error of any kind from ``fsync`` or from a step of a multi-file protocol (roll, retirement, swap, undo of a
  failed append). From then on every operation on its partitions answers ``EIO``
  (:class:`LogDirOfflineError`), nothing more is written there (no flush, checkpoint or clean-shutdown marker),
  and the error is logged once, with the directory. The next mount recovers it: without the marker, every
  partition is re-validated from its recovery point.
- **A full disk is not a failure** (``ENOSPC``, and ``EDQUOT``, its per-user form): the write that met it fails
  with ``ENOSPC`` and is undone; appends work again as soon as there is room. Only when the undo itself fails,
  or the step was past a protocol's commit point, does a full disk take the directory offline.
- **Why a failed fsync is never retried**: after a failed write-back Linux may mark the pages clean and drop
  them, and a later ``fsync`` then returns 0 for data that never reached the disk (PostgreSQL's "fsyncgate",
  2018). An offline directory is never fsynced again by this process, and its recovery point never moves over
  the bytes the failed fsync covered; the next mount re-reads from the last point known good.

Writers therefore see only ``EIO`` or ``ENOSPC`` from a failing disk, whatever the disk said (glibc's emulated
``posix_fallocate`` turns a failed ``fstat`` into ``EBADF``; a disk may say ``EFBIG``, ``EINVAL``...): on a logfs
file those numbers mean other things (a line too long, a keyless line on a compacted topic).
"""

from __future__ import annotations

import errno
import functools
import logging
import threading

from .errors import StorageIOError

log = logging.getLogger(__name__)

# What a full disk answers: the write fails, the directory stays online.
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Not the disk failing: a name that exists or not (a stray directory where a partition is created), and the
# process's own limits (descriptors, memory). They pass through with their errno and change nothing.
# Permissions (an immutable directory refuses a rename even to root) are the operator's, not the disk's.
NOT_DISK_ERRNOS = frozenset({errno.EEXIST, errno.ENOENT, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EPERM,
                             errno.EACCES})


class LogDirOfflineError(StorageIOError):
    """The partition's log directory went offline after an I/O error: every operation on it fails (EIO) until the
    next mount recovers it."""

    def __init__(self, message: str):
        super().__init__(message, errno.EIO)


def disk_errno(exc: BaseException) -> int:
    """The errno a caller sees for an error of the disk: ENOSPC for a full disk, EIO for a failing one, and the
    errors that are not the disk's (:data:`NOT_DISK_ERRNOS`) as they are."""
    code = getattr(exc, "errno", None)
    if code in SPACE_ERRNOS:
        return errno.ENOSPC
    if code in NOT_DISK_ERRNOS:
        return code
    return errno.EIO


class LogDir:
    """One log directory's health. ``check()`` before touching it; ``io_error()`` when the disk failed."""

    def __init__(self, path: str):
        self.path = path
        self.offline_reason: str | None = None
        self.failures = 0  # I/O errors reported (the first took it offline)
        self._lock = threading.Lock()

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    def check(self) -> None:
        """Raise LogDirOfflineError if the directory is offline."""
        if self.offline_reason is not None:
            raise LogDirOfflineError(f"log directory {self.path} is offline after an I/O error "
                                     f"({self.offline_reason}); remount to recover it")

    def take_offline(self, reason: str) -> None:
        with self._lock:
            self.failures += 1
            if self.offline_reason is not None:
                return
            self.offline_reason = reason
        log.error("log directory %s is offline: %s. Its partitions answer EIO until the next mount, which "
                  "recovers them", self.path, reason)

    def io_error(self, exc: BaseException, what: str, *, space_ok: bool = True) -> StorageIOError:
        """The error to raise for the disk failure ``exc`` met while doing ``what``. A full disk (``space_ok``:
        the step was undone, or changed nothing) gives StorageIOError(ENOSPC) and the directory stays online;
        anything else takes it offline and gives LogDirOfflineError."""
        code = getattr(exc, "errno", None)
        owner = getattr(exc, "log_dir", None)
        if isinstance(exc, LogDirOfflineError) or code in NOT_DISK_ERRNOS or (owner is not None and owner is not self):
            return exc  # (an error of another directory of the mount was reported to it, where it happened)
        try:
            exc.log_dir = self  # each error is reported once, to the directory whose disk it came from
        except AttributeError:
            pass
        if space_ok and code in SPACE_ERRNOS:
            if isinstance(exc, StorageIOError) and code == errno.ENOSPC:
                return exc
            return StorageIOError(f"{what}: {exc}", errno.ENOSPC)
        self.take_offline(f"{what}: {exc}")
        return LogDirOfflineError(f"{what} failed, log directory {self.path} is offline: {exc}")

    def report(self, exc: BaseException, what: str) -> None:
        """A background step failed with ``exc``: a disk failure other than a full disk takes the directory
        offline (a full disk is retried later)."""
        if isinstance(exc, (OSError, StorageIOError)):
            self.io_error(exc, what)


def offline_by(exc: BaseException, log_dir: LogDir) -> bool:
    """Whether ``exc`` took a directory offline, or met one offline: ``log_dir`` (where the step ran), or the
    directory the error was reported to. Such an error is logged once, by the failure channel."""
    owner = getattr(exc, "log_dir", None)
    return log_dir.offline or isinstance(exc, LogDirOfflineError) or (owner is not None and owner.offline)


def guarded(what: str, *, space_ok: bool = True, convert: bool = True):
    """Decorate a method of an object with ``log_dir`` and ``name``: refused (EIO) while the directory is offline,
    and a disk failure it meets goes through :meth:`LogDir.io_error` (``space_ok``: a full disk leaves the object
    as it was, so the directory stays online). ``convert=False`` re-raises the original error after reporting
    it (the manager's namespace operations, whose callers tell OSErrors apart)."""

    def decorate(fn):
        @functools.wraps(fn)
        def method(self, *args, **kwargs):
            log_dir = self.log_dir
            if log_dir.offline_reason is not None:
                log_dir.check()
            try:
                return fn(self, *args, **kwargs)
            except (OSError, StorageIOError) as exc:
                error = log_dir.io_error(exc, f"{what} of {self.name}", space_ok=space_ok)
                if error is exc or not convert:
                    raise
                raise error from exc

        return method

    return decorate

"""Engine exceptions -> errno, in exactly one place, and the count of errors answered, by handler and errno.

Every Operations handler is wrapped by :func:`translate`; handlers raise engine errors (or ``FUSEError``
directly for purely FUSE-level refusals) and never pick an errno for an engine condition themselves. Each
errno a handler answers is counted here (:func:`error_counts`, the metrics' ``logfs_fuse_errors_total``): an
element of a list the wrapper holds, indexed by errno, so counting costs no lookup. The counts are per process,
for every Operations object in it.
"""

from __future__ import annotations

import errno
import functools
import logging

import pyfuse3

from ..remote.api import RemoteStoreError
from ..storage import errors as e
from ..storage.failure import LogDirOfflineError, disk_errno

log = logging.getLogger(__name__)

_ERRNO_SLOTS = 256  # Linux errno values are below 134; a larger one would be counted in the last slot
# handler name -> its counts, indexed by errno (filled in when a handler is wrapped)
_ERRORS: dict[str, list[int]] = {}


def error_counts() -> dict[tuple[str, int], int]:
    """{(handler, errno): errors answered} for every non-zero count (safe to call from another thread)."""
    return {(op, code): n for op, counts in list(_ERRORS.items()) for code, n in enumerate(list(counts)) if n}

ERRNO_OF: list[tuple[type[BaseException], int]] = [
    (e.InvalidTopicError, errno.EINVAL),
    (e.InvalidPartitionError, errno.EINVAL),
    (e.InvalidConfigError, errno.EINVAL),
    (e.TopicExistsError, errno.EEXIST),
    (e.NoSuchTopicError, errno.ENOENT),
    (e.TopicNotEmptyError, errno.ENOTEMPTY),
    (e.OffsetOutOfRangeError, errno.ENODATA),
    (e.InvalidOffsetError, errno.EINVAL),
    (e.RecordTooLargeError, errno.EFBIG),
    (e.InvalidRecordError, errno.EINVAL),
    (e.CorruptRecordError, errno.EIO),
    (e.LockedError, errno.EBUSY),
    (e.ShuttingDownError, errno.EINTR),
    (e.InvalidRequestError, errno.EINVAL),
    (e.NoSuchStagedFileError, errno.ENOENT),
    (e.StagingClosedError, errno.ECANCELED),
    (e.PartitionBusyError, errno.EBUSY),
    (e.NotSupportedError, errno.EOPNOTSUPP),
]


def errno_for(exc: BaseException) -> int:
    if isinstance(exc, e.ClusterError):
        return exc.errno  # (the cluster's answer, not a disk's)
    # An error of the disk is EIO or ENOSPC, whatever the disk said (storage/failure.disk_errno): on a logfs file
    # EFBIG means a line too long and EINVAL a keyless line on a compacted topic, not a disk's EFBIG or EINVAL.
    if isinstance(exc, (e.StorageIOError, OSError)):
        return disk_errno(exc)
    for cls, code in ERRNO_OF:
        if isinstance(exc, cls):
            return code
    return errno.EIO


def translate(fn):
    """Wrap an async handler: FUSEError passes through, engine errors map to their errno, anything else is
    logged with its traceback (a bug, not a user error) and becomes EIO."""

    counts = _ERRORS.setdefault(fn.__name__, [0] * _ERRNO_SLOTS)

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError as exc:
            counts[min(exc.errno, _ERRNO_SLOTS - 1)] += 1
            raise
        except e.LogfsError as exc:
            code = errno_for(exc)
            if isinstance(exc, LogDirOfflineError):
                log.debug("%s: %s", fn.__name__, exc)  # (logged once, when the directory went offline)
            elif code in (errno.EIO, errno.ENOSPC):
                log.error("%s: %s", fn.__name__, exc)
            else:
                log.debug("%s: %s -> %s", fn.__name__, exc, errno.errorcode.get(code))
        except RemoteStoreError as exc:
            # A tiered range the store could not give (down, stalled past its time bound, refusing, corrupt).
            log.error("%s: %s", fn.__name__, exc)
            code = errno.EIO
        except OSError as exc:
            log.error("%s: %s", fn.__name__, exc)
            code = errno_for(exc)
        except Exception:
            log.exception("internal error in %s", fn.__name__)
            code = errno.EIO
        counts[min(code, _ERRNO_SLOTS - 1)] += 1
        raise pyfuse3.FUSEError(code)

    return wrapper


def fail(code: int):
    """Raise a FUSE-level refusal (rename, links, non-appends detected by the FUSE layer)."""
    raise pyfuse3.FUSEError(code)


def disk_failed(plog, exc: BaseException, what: str):
    """Raise for a disk error ``exc`` met serving ``what`` on ``plog``: its log directory goes offline unless the
    error is not the disk's (storage/failure.py)."""
    error = plog.log_dir.io_error(exc, f"{what} of {plog.name}")
    if error is exc:
        raise exc
    raise error from exc

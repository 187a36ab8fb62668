"""The Spark sink's staging area: ``DATA_DIR/.logfs-staging/``, served by the mount as ``MOUNT/.logfs-staging/``.

The sink's tasks write each task attempt's rows there as Kafka v2 batches, one plain file per attempt, named
``<writer prefix><attempt>`` (``logfs.spark.sink`` chooses the names: a batch job's prefix is its job id, a
streaming query's is its query id and batch id). Nothing there is visible as records: only a commit
(:mod:`.transactions`) appends the batches of the files it names. What no commit names is removed: the losing
attempts' files by the commit's ``cleanup`` prefix, an aborted write's by its prefix, anything left by a crash when
the daemon starts again (after the commits in flight are completed), and anything untouched for
``logfs.staging.retention.ms`` (a driver that died without aborting).

Once a commit or an abort *closes* its prefix, no new file may be created under it (a task attempt still running
late would otherwise leave one behind): :class:`~.errors.StagingClosedError`. Closed prefixes are remembered in
memory (the most recent 10,000); after a restart the age limit covers a late one.

Plain files, no structure: the daemon only creates, writes, reads, lists and removes them; a commit maps the ones
it names read-only (:class:`StagedFiles`). No locking of its own;
:mod:`.transactions` serialises what must not interleave (a commit and a cleanup).
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import re
import time

from ..checkpoints import fsync_dir
from ..errors import InvalidRequestError, NoSuchStagedFileError, StagingClosedError
from ..names import STAGING_DIR

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,199}")
MAX_CLOSED = 10_000


def check_name(name: str) -> str:
    """A staged file's name: 1-200 characters of ``[A-Za-z0-9._=-]``, not starting with ``.``, ``_``, ``-`` or
    ``=``."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidRequestError(f"invalid staged file name {name!r}")
    return name


class StagingArea:
    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, STAGING_DIR)
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()

    def path_of(self, name: str) -> str:
        return os.path.join(self.path, check_name(name))

    def _ensure(self) -> None:
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            fsync_dir(os.path.dirname(self.path))

    # -- the files ---------------------------------------------------------------------------------
    def create(self, name: str) -> int:
        """A new staged file, open for reading and writing (O_EXCL: FileExistsError if it exists)."""
        check_name(name)
        if self.is_closed(name):
            raise StagingClosedError(f"staged file {name!r}: its write was already committed or aborted")
        self._ensure()
        return os.open(self.path_of(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def open(self, name: str, writable: bool) -> int:
        try:
            return os.open(self.path_of(name), (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchStagedFileError(f"no staged file {name!r}") from None

    def stat(self, name: str) -> os.stat_result:
        try:
            return os.stat(self.path_of(name))
        except FileNotFoundError:
            raise NoSuchStagedFileError(f"no staged file {name!r}") from None

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.path) if _NAME.fullmatch(n))
        except FileNotFoundError:
            return []

    def unlink(self, name: str) -> None:
        try:
            os.unlink(self.path_of(name))
        except FileNotFoundError:
            raise NoSuchStagedFileError(f"no staged file {name!r}") from None

    def remove(self, names, keep=frozenset()) -> int:
        """Unlink ``names`` (those still there) but those in ``keep``; returns how many went."""
        removed = 0
        for name in names:
            if name in keep:
                continue
            try:
                os.unlink(self.path_of(name))
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def remove_prefix(self, prefix: str, keep=frozenset()) -> int:
        return self.remove([n for n in self.names() if n.startswith(prefix)], keep)

    def sweep(self, retention_ms: int, keep=frozenset(), now_s: float | None = None) -> int:
        """Unlink staged files not modified for ``retention_ms`` (but those in ``keep``)."""
        now_s = time.time() if now_s is None else now_s
        old = []
        for name in self.names():
            try:
                if (now_s - os.stat(self.path_of(name)).st_mtime) * 1000 >= retention_ms:
                    old.append(name)
            except FileNotFoundError:
                pass
        removed = self.remove(old, keep)
        if removed:
            log.info("removed %d staged file(s) untouched for %d ms", removed, retention_ms)
        return removed

    # -- closed prefixes -----------------------------------------------------------------------------
    def close_prefix(self, prefix: str) -> None:
        """No file whose name starts with ``prefix`` (which ends with ``.``) may be created from now on."""
        if not prefix.endswith("."):
            raise InvalidRequestError(f"a closed prefix ends with '.': {prefix!r}")
        self._closed[prefix] = None
        self._closed.move_to_end(prefix)
        while len(self._closed) > MAX_CLOSED:
            self._closed.popitem(last=False)

    def is_closed(self, name: str) -> bool:
        at = name.find(".")
        while at >= 0:
            if name[: at + 1] in self._closed:
                return True
            at = name.find(".", at + 1)
        return False


class StagedFiles:
    """The staged files one commit reads: each opened once and mapped read-only (the batches' records go from the
    page cache straight into the segment; only their 61-byte headers are copied, to be restamped)."""

    def __init__(self, staging: StagingArea):
        self.staging = staging
        self.files: dict[str, tuple[int, mmap.mmap | None, memoryview | None]] = {}
        self.views: list[memoryview] = []

    def view(self, name: str, position: int, length: int) -> memoryview:
        if name not in self.files:
            fd = self.staging.open(name, writable=False)
            try:
                size = os.fstat(fd).st_size
                mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
            except BaseException:
                os.close(fd)
                raise
            self.files[name] = (fd, mapped, memoryview(mapped) if mapped is not None else None)
        _, mapped, whole = self.files[name]
        size = len(mapped) if mapped is not None else 0
        if position + length > size:
            raise InvalidRequestError(f"staged file {name!r} has {size} bytes, a span ends at {position + length}")
        view = whole[position : position + length]
        self.views.append(view)
        return view

    def sync(self) -> None:
        for fd, _, _ in self.files.values():
            os.fdatasync(fd)

    def close(self) -> None:
        for view in self.views:
            view.release()
        self.views.clear()
        for fd, mapped, whole in self.files.values():
            if whole is not None:
                whole.release()
            if mapped is not None:
                try:
                    mapped.close()
                except BufferError:
                    pass  # a view of it still referenced (by an exception's frames): unmapped once it goes
            os.close(fd)
        self.files.clear()

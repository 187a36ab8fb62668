"""The segment files a mount holds open, bounded across all its partitions: one LRU (CLOCK) of descriptors; and
the open-on-use protocol its units follow (:func:`open_unit`, :func:`release_unit`), written once.

A *unit* is one open resource of a segment: its ``.log`` descriptor (the :class:`~logfs.storage.local.segment.LogSegment`
itself) or the descriptor of one of its indexes (an :class:`~logfs.storage.local.index._FileIndex`, read and written with
pread/pwrite: no memory map). Each unit keeps its descriptor as an attribute (its ``fd_attr``) while open, so a use
while open costs an attribute read and nothing more; reading it while closed opens the file again by path
(the unit's ``__getattr__`` calls :func:`open_unit`). Units open on first use, as Kafka's ``LazyIndex`` maps an index on first use
(KAFKA-7283), and register here. Once more than :attr:`OpenFiles.budget`
are open, opening one closes another, least recently used first; a closed unit opens again, by path, the next
time it is used. So descriptors and maps grow with the partitions in use, not with the segments on disk. Kafka
keeps every ``.log`` open and asks operators to raise ``ulimit -n``; a mount here must serve 20,000 partitions
within a fixed ``LimitNOFILE``.

Recency is a CLOCK, the page cache's approximation of LRU: a use sets the unit's ``recent`` flag (an attribute
store, no call on the append and read paths); the sweep skips and clears a set flag once (a second chance) and
closes the first unit whose flag is clear and that may be closed.

**When a unit may be closed.** Only when nothing can be using it, which is the engine's rule for reading a
segment: every access happens either under the owning log's lock or through a
:class:`~logfs.storage.local.segments.LogSnapshot` that pins the segment. So a unit closes only when its segment

- belongs to a log (``owner``, the log's lock; a segment being loaded, cleaned or tested alone has none and is
  closed by whoever owns it),
- is pinned by no snapshot (``refs == 0``): a handle, a flush, the cleaner, an upload read pinned segments
  outside the lock,
- has not left its log (``deleted``): its files are renamed away or unlinked and could not be opened again (a
  pinned segment's files are opened before they go, :meth:`LogSegment.hold_files`),
- and its log's lock can be taken without waiting (a writer holds it while it appends).

The sweep takes the log's lock without blocking while holding this module's lock, and a thread holding a log's
lock may wait for the budget's lock, never the other way round: no deadlock. A thread that holds a log's lock
may close a unit of that same log (the lock is reentrant): code never keeps a segment's descriptor or map in a
local variable across a call that may open another unit; it reads ``segment.fd`` / ``index._fd`` at each use.

The budget is an object, not the process's: the :class:`~logfs.storage.manager.LogManager` owns one
(``open_files``) and hands it to its logs, their segments and indexes, and tiering's segments. A segment or log
made alone (a tool, a test, the cleaner's child process) gets a budget of its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from ..errors import StorageIOError

# Never fewer than this many units open, whatever the limit (a reopen per use would make every append slow).
MIN_BUDGET = 64
# Units looked at per eviction at most (each at most twice): a sweep past many pinned units gives up, leaving
# the count over the budget for a while, rather than scanning every open file on each open.
_SWEEP = 1024


class OpenFiles:
    """Open units of one mount, with the budget. ``lock`` guards the set and every open and close of a unit.

    Complexity: opening a unit is O(1) amortised (a sweep skips units used since it last passed them, each
    at most once per pass, and at most ``_SWEEP`` pinned ones)."""

    def __init__(self, budget: int = 4096):
        self.lock = threading.Lock()
        self.budget = max(MIN_BUDGET, budget)
        self._units: OrderedDict = OrderedDict()  # the clock: its front is where the hand is
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._units)

    def set_budget_from_limit(self, nofile_soft: int, max_map_count: int | None = None) -> int:
        """Half of the soft ``RLIMIT_NOFILE`` (-1: unlimited), and never more than half of ``vm.max_map_count``
        (every unit may be a map): the rest is left to the mount itself, sockets, the cleaner's pipes, worker
        threads' short-lived opens, the interpreter's own maps, and units over budget while pinned."""
        limits = [(_max_map_count() if max_map_count is None else max_map_count) // 2]
        if nofile_soft > 0:
            limits.append(nofile_soft // 2)
        self.budget = max(MIN_BUDGET, min(limits))
        return self.budget

    def admit(self, unit) -> None:
        """Register ``unit``, just opened; close others first while over budget. Caller holds ``lock``."""
        units = self._units
        while len(units) >= self.budget and self._evict_one():
            pass
        unit.recent = False
        units[unit] = None

    def forget(self, unit) -> bool:
        """Unregister ``unit`` (its owner closes it). Caller holds ``lock``. Whether it was registered."""
        return self._units.pop(unit, False) is None

    def _evict_one(self) -> bool:
        units = self._units
        for _ in range(2 * min(len(units), _SWEEP)):
            unit = next(iter(units))
            units.move_to_end(unit)
            if unit.recent:
                unit.recent = False
                continue
            if self._close(unit):
                return True
        return False

    def _close(self, unit) -> bool:
        segment = unit.segment
        lock = None if segment is None else segment.owner
        if lock is None or segment.refs > 0 or segment.deleted:
            return False
        if not lock.acquire(blocking=False):
            return False
        try:
            if segment.refs > 0 or segment.deleted:  # (pins and deletions happen under that lock)
                return False
            close_unit(unit)
            del self._units[unit]
            self.evictions += 1
            return True
        finally:
            lock.release()


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # the kernel's default


def open_unit(unit, path: str, what: str = "") -> int:
    """The open-on-use protocol: the descriptor of ``unit`` (a segment's ``.log``, an index) opened again by ``path``
    and admitted to its budget (``unit.open_files``), unless another thread did so meanwhile. Called by the unit's
    ``__getattr__`` when its ``fd_attr`` is missing."""
    files = unit.open_files
    with files.lock:
        fd = unit.__dict__.get(unit.fd_attr)
        if fd is not None:
            return fd
        try:
            fd = os.open(path, getattr(unit, "open_flags", os.O_RDWR))
        except OSError as exc:
            raise StorageIOError(f"cannot open {what}{path}: {exc.strerror}", exc.errno) from exc
        files.admit(unit)
        unit.__dict__[unit.fd_attr] = fd
        return fd


def close_unit(unit) -> None:
    """Close the unit's descriptor if open (the budget's call, under its lock); the next use opens it again."""
    fd = unit.__dict__.pop(unit.fd_attr, -1)
    if fd >= 0:
        os.close(fd)


def release_unit(unit) -> None:
    """Close the unit's descriptor now, and take it out of its budget (its owner's call)."""
    with unit.open_files.lock:
        unit.open_files.forget(unit)
        close_unit(unit)


def raise_fd_limit(files: OpenFiles) -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as the JVM does for Kafka), and give half of it
    (at most half of ``vm.max_map_count``) to the segment files of ``files`` (opened on use, the idle ones closed
    past that budget). Returns the soft limit now in force."""
    soft = _raise_soft_limit()
    files.set_budget_from_limit(soft)
    return soft


def _raise_soft_limit() -> int:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        return soft
    except (ImportError, ValueError, OSError):
        return -1

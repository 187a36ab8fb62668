"""Sparse, fixed-width segment indexes, read and written with pread/pwrite.

Owns the byte layout of ``.index`` (8-byte entries: relative offset i32, position i32), ``.timeindex`` (12-byte
entries: timestamp i64, relative offset i32) and logfs's own ``.viewindex`` (36-byte entries, see
:class:`ViewIndex`). Like Kafka's AbstractIndex, an active index is preallocated to its maximum size (the view
index to what its segment can need, at most as much) and trimmed to its entries when the segment rolls or
closes; lookups binary-search for the greatest entry <= target. As Kafka's LazyIndex, a file is opened only when
an entry is first read or stored, and the process's open-file budget may close it again
(:mod:`~logfs.storage.local.open_files`).

**No memory map.** Kafka maps its indexes; logfs reads them with ``pread`` and stores entries with ``pwrite``.
A read of a mapped page that the disk fails to return is SIGBUS, which kills the whole daemon (every partition,
every mount of the process); ``pread`` returns the error, which takes the log directory offline
(:mod:`~logfs.storage.failure`) and fails that request alone. A store into a sparse preallocated file on a full
disk is SIGBUS through a map too; ``pwrite`` returns ENOSPC. The binary search reads one entry per probe with
``pread``, in one C call (``_speedups.index_floor``, ~0.2 us a probe: faster than the Python probes of a map it
replaced); the Python twin (:func:`~logfs.storage.format.twins.index_floor`) gives the same slot.

Thread safety: mutation (append, truncate, resize) requires the owning log's writer lock. Lookups only read
entries below the published entry count and may run concurrently with appends.
"""

from __future__ import annotations

import errno
import operator
import os
import struct
from typing import NamedTuple

from ..errors import CorruptRecordError, StorageIOError
from ..format.lines import LineStats
from .open_files import OpenFiles, open_unit, release_unit

from ..format import twins
from ..format.speedups import C as _speedups  # index_ok: every entry in one pass; index_floor: search by pread


# Disk blocks are reserved for an index one page ahead of its entries (see _FileIndex._reserve): one
# posix_fallocate per 512 offset index entries, and no more disk than the entries need.
_RESERVE_BYTES = 4096
_U32 = struct.Struct(">I")


def _increasing(column) -> bool:
    return all(map(operator.lt, column, column[1:]))


def _non_decreasing(column) -> bool:
    return all(map(operator.le, column, column[1:]))


class _FileIndex:
    """One index file, opened on first use and closed when the process's open-file budget needs its descriptor
    (:mod:`~logfs.storage.local.open_files`): ``_fd`` is an attribute while open; reading it while closed opens the
    file again (:meth:`__getattr__`). Entry counts and sizes live in memory, so checking whether an index is
    full, or how many entries it has, never opens it."""

    ENTRY: struct.Struct
    KIND: int  # the layout's number for _speedups (index_ok, index_floor)
    fd_attr = "_fd"  # the descriptor's attribute while open (open_files.open_unit)

    def __init__(self, path: str, base_offset: int, max_index_size: int, *, active: bool = True,
                 create: bool = True, open_files: OpenFiles | None = None):
        self.path = path
        self.open_files = open_files if open_files is not None else OpenFiles()  # the budget it opens within
        self.base_offset = base_offset
        self.entry_size = self.ENTRY.size
        self.max_index_size = max(self.entry_size, max_index_size - max_index_size % self.entry_size)
        self.segment = None  # the segment this index belongs to (set by it): the open-file budget asks it
        self.recent = False  # used since the open-file budget's clock last passed it
        self.dirty = False  # entries stored since the last flush (the descriptor may have closed meanwhile)
        # No descriptor is kept open until an entry is read or stored: an idle partition holds none.
        self.open = True
        exists = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            length = os.fstat(fd).st_size
            self.entries = self._count_entries(length - length % self.entry_size, fd) if exists else 0
            self._backed = self.entries * self.entry_size  # bytes known to have disk blocks behind them
            if active:
                # Never below the entries already there (segment.index.bytes may have been lowered since).
                size = max(self.max_index_size, self.entries * self.entry_size)
            else:
                size = max(length - length % self.entry_size, self.entries * self.entry_size)
            if size != length:
                os.ftruncate(fd, size)
            self.max_entries = size // self.entry_size
        finally:
            os.close(fd)

    # -- the descriptor --------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name == "_fd":  # not open (yet, or any more): open it
            return self._open_fd()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _open_fd(self) -> int:
        """The file's descriptor, registered with the budget."""
        if not self.open:
            raise StorageIOError(f"index {self.path} is closed", errno.EBADF)
        return open_unit(self, self.path, "index ")

    def release(self) -> None:
        """Close the descriptor now (it opens again on the next use) and leave the budget."""
        release_unit(self)

    def hold(self) -> None:
        """Open the descriptor before the file is renamed away or unlinked while a snapshot still reads it."""
        self._fd  # noqa: B018 (opens it)

    def _set_length(self, length: int) -> None:
        """Set the file's length (preallocate or trim)."""
        try:
            os.ftruncate(self._fd, length)
        except OSError as exc:
            raise StorageIOError(f"cannot resize index {self.path}: {exc.strerror}", exc.errno) from exc
        self.max_entries = length // self.entry_size
        self._backed = min(self._backed, length)

    def _reserve(self, end: int) -> None:
        """Give the file disk blocks up to ``end`` (and a page ahead) before storing into it: a preallocated index
        is a sparse file, and entries stored into its reserve still fit once the disk is full (the end entries a
        roll or a clean shutdown writes)."""
        length = self.max_entries * self.entry_size
        start = self._backed
        stop = min(max(end, start + _RESERVE_BYTES), length)
        if stop <= start:
            return
        try:
            os.posix_fallocate(self._fd, start, stop - start)
        except OSError as exc:
            raise StorageIOError(f"cannot extend index {self.path}: {exc.strerror}", exc.errno) from exc
        self._backed = stop

    def _count_entries(self, length: int, fd: int) -> int:
        """Entries in an existing file: a preallocated file ends in all-zero slots (never a valid entry past
        slot 0, since offsets and positions strictly increase). A binary search reading one slot per probe: an
        active segment's index left preallocated by a crash is ``segment.index.bytes`` (10 MiB) of mostly holes,
        and reading it whole cost ~25 ms per index at startup."""
        n = length // self.entry_size
        if n == 0:
            return 0
        size, zero = self.entry_size, bytes(self.entry_size)
        slot = lambda i: os.pread(fd, size, i * size)  # noqa: E731
        lo, hi = 1, n
        while lo < hi:  # first all-zero slot at index >= 1
            mid = (lo + hi) // 2
            if slot(mid) == zero:
                hi = mid
            else:
                lo = mid + 1
        if lo == 1 and slot(0) == zero:
            return 0
        return lo

    def _entries_bytes(self) -> bytes:
        """Every entry's bytes, in one read (loading checks them all)."""
        return self._pread(0, self.entries * self.entry_size) if self.entries else b""

    def _checked_in_c(self, log_size: int, what: str) -> bool:
        """Check every entry in one C pass (``_speedups.index_ok``), raising CorruptRecordError on a bad one.
        False without the accelerator: the caller checks in Python."""
        if _speedups is None:
            return False
        if self.entries and not _speedups.index_ok(self.KIND, self._entries_bytes(), self.entries, log_size):
            raise CorruptRecordError(f"corrupt {what} {self.path}")
        return True

    def _columns(self) -> list[tuple]:
        """The entries' fields as columns (one tuple per field), unpacked in C."""
        if not self.entries:
            return [() for _ in range(len(self.ENTRY.format) - 1)]
        return list(zip(*self.ENTRY.iter_unpack(self._entries_bytes())))

    def entry(self, i: int):
        return self.ENTRY.unpack(self._pread(i * self.entry_size, self.entry_size))

    _entry_at = entry

    def _pread(self, at: int, length: int) -> bytes:
        try:
            data = os.pread(self._fd, length, at)
        except OSError as exc:
            raise StorageIOError(f"read of index {self.path} failed: {exc.strerror}", exc.errno) from exc
        if len(data) != length:
            raise CorruptRecordError(f"index {self.path} is shorter than its entries")
        return data

    def _pwrite(self, at: int, data: bytes) -> None:
        self.dirty = True  # (before the write: a failed one may have changed the page cache all the same)
        try:
            if os.pwrite(self._fd, data, at) != len(data):
                raise OSError(errno.EIO, "short write")
        except OSError as exc:
            raise StorageIOError(f"write to index {self.path} failed: {exc.strerror}", exc.errno) from exc

    def _put(self, values) -> None:
        if self.entries >= self.max_entries:
            raise CorruptRecordError(f"index {self.path} is full")
        at = self.entries * self.entry_size
        if at + self.entry_size > self._backed:
            self._reserve(at + self.entry_size)
        self._pwrite(at, self.ENTRY.pack(*values))
        self.entries += 1
        self.recent = True

    def mark(self) -> tuple[int, bytes]:
        """The entry count and the last entry's bytes, for :meth:`rollback` (an append that failed)."""
        if not self.entries:
            return 0, b""
        return self.entries, self._pread((self.entries - 1) * self.entry_size, self.entry_size)

    def rollback(self, mark: tuple[int, bytes]) -> None:
        """Back to ``mark``. The count is set first: if the disk refuses the writes below, the entries past the
        mark are not counted (the caller then takes the log directory offline, and recovery rebuilds the index
        from the ``.log``), so the index never refuses later entries as non-increasing."""
        entries, last = mark
        stale = self.entries
        self.entries = entries  # (a time index entry overwritten in place left the count one lower)
        if stale > entries:
            self._pwrite(entries * self.entry_size, bytes((stale - entries) * self.entry_size))
        if entries:
            self._pwrite((entries - 1) * self.entry_size, last)

    # The search: by field, as index_floor numbers them (in C, or its twin below).
    def _search(self, target: int, field: int, sep_len: int = 0, marker_len: int = 0) -> int:
        """Slot of the greatest entry whose key <= target, or -1."""
        self.recent = True
        if not self.entries:
            return -1
        try:
            floor = twins.index_floor if _speedups is None else _speedups.index_floor
            slot = floor(self._fd, self.KIND, field, self.entries, target, sep_len, marker_len)
        except OSError as exc:
            raise StorageIOError(f"read of index {self.path} failed: {exc.strerror}", exc.errno) from exc
        if slot == -2:
            raise CorruptRecordError(f"index {self.path} is shorter than its entries")
        return slot

    def _truncate_entries(self, n: int) -> None:
        if n < self.entries:
            stale, self.entries = self.entries, n  # (counted first, as in rollback)
            self._pwrite(n * self.entry_size, bytes((stale - n) * self.entry_size))

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def trim_to_valid_size(self) -> None:
        """Shrink the file to its entries (on roll and close)."""
        if self.max_entries != self.entries:  # (a sealed segment's: nothing to do)
            self._set_length(self.entries * self.entry_size)

    def resize(self, max_index_size: int) -> None:
        self.max_index_size = max(self.entry_size, max_index_size - max_index_size % self.entry_size)
        self._set_length(max(self.max_index_size, self.entries * self.entry_size))

    def reset(self) -> None:
        self._truncate_entries(0)

    def flush(self) -> None:
        """Make the stored entries durable: an fsync of the file if entries were stored since the last one. A
        failed fsync leaves it dirty (and takes the directory offline: it is never retried as if it succeeded)."""
        if not self.dirty:
            return
        self.dirty = False
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self.dirty = True
            raise StorageIOError(f"fsync of index {self.path} failed: {exc.strerror}", exc.errno) from exc

    def close(self) -> None:
        if self.open:
            try:
                self.trim_to_valid_size()
            finally:
                self.release()
                self.open = False

    def close_handler(self) -> None:
        """Release the descriptor without trimming (the file is being deleted or renamed away, or was only read)."""
        self.release()
        self.open = False

    def relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if not 0 <= rel <= 0x7FFFFFFF:
            raise CorruptRecordError(f"offset {offset} does not fit segment {self.base_offset}")
        return rel


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(_FileIndex):
    """Maps an offset to the file position of the batch holding it (sparse, one entry per interval)."""

    ENTRY = struct.Struct(">ii")
    KIND = 0

    def append(self, offset: int, position: int) -> None:
        rel = self.relative(offset)
        if self.entries:
            last_rel, last_pos = self._entry_at(self.entries - 1)
            if rel <= last_rel or position < last_pos:
                raise CorruptRecordError(
                    f"non-increasing offset index entry {offset} after {self.base_offset + last_rel}"
                )
        self._put((rel, position))

    def lookup(self, target: int) -> OffsetPosition:
        """Greatest entry with offset <= target, else (base_offset, 0)."""
        slot = self._search(target - self.base_offset, 0)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        rel, pos = self.entry(slot)
        return OffsetPosition(self.base_offset + rel, pos)

    def last_entry(self) -> OffsetPosition:
        if not self.entries:
            return OffsetPosition(self.base_offset, 0)
        rel, pos = self._entry_at(self.entries - 1)
        return OffsetPosition(self.base_offset + rel, pos)

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        self._truncate_entries(self._search(offset - self.base_offset - 1, 0) + 1)

    def sanity_check(self, log_size: int) -> None:
        """Offsets strictly increasing, positions non-decreasing and inside the log (every entry: loading a
        store checks them all, in one C pass)."""
        if self._checked_in_c(log_size, "offset index"):
            return
        rels, positions = self._columns()
        if rels and (not _increasing(rels) or not _non_decreasing(positions) or positions[-1] >= max(log_size, 1)
                     or rels[0] < 0 or positions[0] < 0):
            raise CorruptRecordError(f"corrupt offset index {self.path}")


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(_FileIndex):
    """Maps a timestamp to the offset at or before which it is the largest seen. The last slot is reserved
    for the entry written when the segment becomes inactive."""

    ENTRY = struct.Struct(">qi")
    KIND = 1

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries - 1

    def last_entry(self) -> TimestampOffset:
        if not self.entries:
            return TimestampOffset(-1, self.base_offset)
        ts, rel = self._entry_at(self.entries - 1)
        return TimestampOffset(ts, self.base_offset + rel)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        if not skip_full_check and self.is_full:
            raise CorruptRecordError(f"time index {self.path} is full")
        last = self.last_entry()
        if self.entries and offset < last.offset:
            raise CorruptRecordError(f"time index offset {offset} below last entry {last.offset}")
        if timestamp > last.timestamp:
            if self.entries and offset == last.offset:
                # Same offset, larger timestamp: overwrite the last entry rather than add a duplicate.
                self.entries -= 1
            if self.entries >= self.max_entries:
                self.resize((self.entries + 1) * self.entry_size)
            self._put((timestamp, self.relative(offset)))

    def lookup(self, target_ts: int) -> TimestampOffset:
        """Greatest entry with timestamp <= target, else (-1, base_offset)."""
        slot = self._search(target_ts, 0)
        if slot < 0:
            return TimestampOffset(-1, self.base_offset)
        ts, rel = self.entry(slot)
        return TimestampOffset(ts, self.base_offset + rel)

    def truncate_to(self, offset: int) -> None:
        self._truncate_entries(self._search(offset - self.base_offset - 1, 1) + 1)

    def sanity_check(self, log_size: int) -> None:
        if self._checked_in_c(log_size, "time index"):
            return
        timestamps, rels = self._columns()
        if timestamps and (not _non_decreasing(timestamps) or not _non_decreasing(rels) or rels[0] < 0):
            raise CorruptRecordError(f"corrupt time index {self.path}")


class ViewEntry(NamedTuple):
    offset: int  # base offset of the batch the entry points at (or the segment's next offset, at the end)
    position: int  # its position in the .log
    stats: LineStats  # sizes of all records in the segment before that position


class ViewIndex(_FileIndex):
    """logfs's own sparse index from text-view length to batch position, kept beside Kafka's indexes.

    Entry: relative offset u32, position u32, then the :class:`LineStats` of every record in the segment
    before that position (records, keyed, nulls u32; key_bytes, value_bytes u64). Entries are added at the
    same cadence as offset index entries. When a segment becomes inactive, one final entry at the segment's
    end (position = log size, offset = next offset) records its totals, so a sealed segment's view length
    and next offset are known without reading it.
    """

    ENTRY = struct.Struct(">IIIIIQQ")
    KIND = 2

    @classmethod
    def bytes_for(cls, max_index_size: int, segment_bytes: int | None = None,
                  index_interval_bytes: int | None = None) -> int:
        """What an active segment's view index is preallocated to: one entry per offset index entry the segment
        can get, plus its end entry, and never more than ``segment.index.bytes`` (Kafka's own preallocation;
        a 36-byte entry against the offset index's 8 would otherwise make it 4.5 times larger). An entry needs
        more than ``index.interval.bytes`` since the previous one, so a segment of ``segment.bytes`` gets at
        most ``segment.bytes // (interval + 1)``: 9 MiB with the defaults. A view index that fills anyway grows."""
        entries = max_index_size // OffsetIndex.ENTRY.size
        if segment_bytes is not None and index_interval_bytes is not None:
            entries = min(entries, segment_bytes // (index_interval_bytes + 1))
        size = (entries + 2) * cls.ENTRY.size
        return max(cls.ENTRY.size, min(size, max_index_size - max_index_size % cls.ENTRY.size))

    def get(self, i: int) -> ViewEntry:
        rel, pos, *stats = self.entry(i)
        return ViewEntry(self.base_offset + rel, pos, LineStats(*stats))

    def append(self, offset: int, position: int, stats: LineStats) -> None:
        if self.entries >= self.max_entries:
            # Grown by half (a segment whose segment.bytes was raised, or one made active again): a view index
            # is preallocated only to what its segment can need (:func:`view_index_bytes`).
            self.resize((self.entries + max(1, self.entries // 2)) * self.entry_size)
        if self.entries and self._entry_at(self.entries - 1)[1] >= position:
            raise CorruptRecordError(f"non-increasing view index position {position}")
        self._put((self.relative(offset), position, *stats))

    def last(self) -> ViewEntry | None:
        if not self.entries:
            return None
        rel, pos, *stats = self._entry_at(self.entries - 1)
        return ViewEntry(self.base_offset + rel, pos, LineStats(*stats))

    def floor_by_view(self, target: int, fmt) -> ViewEntry | None:
        """Greatest entry whose view length before it, in the line format ``fmt`` (a
        :class:`~logfs.storage.format.lines.LineFormat`: its separator and null marker), is <= target."""
        sep, marker = fmt.separator, fmt.null_marker
        slot = self._search(target, 2, len(sep) if sep else 0, len(marker) if marker else 0)
        return self.get(slot) if slot >= 0 else None

    def ends_after_view(self, target: int, fmt, count: int = 16) -> tuple[int, list[int], list[int]] | None:
        """For a reader going forward: the view length ``low`` before the floor entry of ``target`` (in ``fmt``),
        then the view lengths and positions of up to ``count`` entries after it, from one search and one read.
        For any target in ``[low, lengths[-1])``, the position of the first of them whose length is > target is where
        the batch holding view byte ``target`` ends at the latest, so a reader asks again only past the last one.
        None: no entry after the floor (that batch may end at the segment's end)."""
        sep, marker = fmt.separator, fmt.null_marker
        sep_len, marker_len = len(sep) if sep else 0, len(marker) if marker else 0
        floor = self._search(target, 2, sep_len, marker_len)
        first = max(floor, 0)
        n = min(self.entries - first, count + 1)
        if floor + 1 >= self.entries or n <= 0:
            return None
        lengths, positions = [], []
        for _, pos, records, keyed, nulls, key_bytes, value_bytes in self.ENTRY.iter_unpack(
                self._pread(first * self.entry_size, n * self.entry_size)):
            lengths.append(records + value_bytes + nulls * marker_len + (key_bytes + keyed * sep_len if sep else 0))
            positions.append(pos)
        if floor < 0:
            return 0, lengths, positions
        return lengths[0], lengths[1:], positions[1:]

    def floor_by_offset(self, target: int) -> ViewEntry | None:
        slot = self._search(target - self.base_offset, 0)
        return self.get(slot) if slot >= 0 else None

    def floor_by_position(self, position: int) -> ViewEntry | None:
        slot = self._search(position, 1)
        return self.get(slot) if slot >= 0 else None

    def sanity_check(self, log_size: int) -> None:
        """Entries strictly increasing in offset and position, inside the log (only an end entry at its size),
        their stats non-decreasing and possible: no more records than offsets before each entry (key and value
        bytes are not bounded by the position: a compressed segment holds more than its size)."""
        if not self.entries:
            return
        if self._checked_in_c(log_size, "view index"):
            return
        rels, positions, records, keyed, nulls, key_bytes, value_bytes = self._columns()
        le = operator.le
        ok = (
            positions[-1] <= log_size and (len(positions) < 2 or positions[-2] < log_size)
            and all(map(le, records, rels)) and all(map(le, keyed, records)) and all(map(le, nulls, records))
            and _increasing(rels) and _increasing(positions)
            and all(_non_decreasing(column) for column in (records, keyed, nulls, key_bytes, value_bytes))
        )
        if not ok:
            raise CorruptRecordError(f"corrupt view index {self.path}")

    def truncate_to_position(self, position: int) -> None:
        """Remove entries at positions >= ``position``."""
        self._truncate_entries(self._search(position - 1, 1) + 1)

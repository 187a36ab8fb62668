"""Sparse, fixed-width, memory-mapped segment indexes.

Owns the byte layout of ``.index`` (8-byte entries: relative offset i32, position i32), ``.timeindex`` (12-byte
entries: timestamp i64, relative offset i32) and logfs's own ``.viewindex`` (36-byte entries, see
:class:`ViewIndex`). Like Kafka's AbstractIndex, an active index is preallocated to its maximum size and trimmed
to its entries when the segment rolls or closes; lookups binary-search for the greatest entry <= target.

Thread safety: mutation (append, truncate, resize) requires the owning log's writer lock. Lookups only read
entries below the published entry count and may run concurrently with appends.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from typing import NamedTuple

from .errors import CorruptRecordError


class _Entries:
    """Sequence view over the first ``n`` entries' key field, for :mod:`bisect`."""

    __slots__ = ("index", "n", "key")

    def __init__(self, index: "_MappedIndex", n: int, key):
        self.index, self.n, self.key = index, n, key

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.key(self.index.entry(i))


class _MappedIndex:
    ENTRY: struct.Struct

    def __init__(self, path: str, base_offset: int, max_index_size: int, *, active: bool = True):
        self.path = path
        self.base_offset = base_offset
        self.entry_size = self.ENTRY.size
        self.max_index_size = max(self.entry_size, max_index_size - max_index_size % self.entry_size)
        self._mmap: mmap.mmap | None = None
        self._fd = -1
        exists = os.path.exists(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        length = os.fstat(self._fd).st_size
        if length % self.entry_size:
            length -= length % self.entry_size
        self.entries = self._count_entries(length) if exists else 0
        if active:
            # Never below the entries already there (segment.index.bytes may have been lowered since).
            self._remap(max(self.max_index_size, self.entries * self.entry_size))
        else:
            self._remap(max(length, self.entries * self.entry_size))

    # -- mapping ---------------------------------------------------------------------------------
    def _remap(self, length: int) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        os.ftruncate(self._fd, length)
        self._mmap = mmap.mmap(self._fd, length) if length else None
        self.max_entries = length // self.entry_size

    def _count_entries(self, length: int) -> int:
        """Entries in an existing file: a preallocated file ends in all-zero slots (never a valid entry past
        slot 0, since offsets and positions strictly increase)."""
        n = length // self.entry_size
        if n == 0:
            return 0
        with open(self.path, "rb") as f:
            data = f.read(length)
        zero = bytes(self.entry_size)
        slot = lambda i: data[i * self.entry_size : (i + 1) * self.entry_size]  # noqa: E731
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

    def entry(self, i: int):
        return self.ENTRY.unpack_from(self._mmap, i * self.entry_size)

    def _put(self, values) -> None:
        if self.entries >= self.max_entries:
            raise CorruptRecordError(f"index {self.path} is full")
        self.ENTRY.pack_into(self._mmap, self.entries * self.entry_size, *values)
        self.entries += 1

    def _search(self, target, key) -> int:
        """Slot of the greatest entry whose key <= target, or -1."""
        return bisect.bisect_right(_Entries(self, self.entries, key), target) - 1

    def _truncate_entries(self, n: int) -> None:
        if n < self.entries and self._mmap is not None:
            start = n * self.entry_size
            self._mmap[start : self.entries * self.entry_size] = bytes((self.entries - n) * self.entry_size)
        self.entries = min(self.entries, n)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def trim_to_valid_size(self) -> None:
        """Shrink the file to its entries (on roll and close)."""
        self._remap(self.entries * self.entry_size)

    def resize(self, max_index_size: int) -> None:
        self.max_index_size = max(self.entry_size, max_index_size - max_index_size % self.entry_size)
        self._remap(max(self.max_index_size, self.entries * self.entry_size))

    def reset(self) -> None:
        self._truncate_entries(0)

    def flush(self) -> None:
        if self._mmap is not None:
            self._mmap.flush()

    def close(self) -> None:
        if self._fd >= 0:
            self.trim_to_valid_size()
            if self._mmap is not None:
                self._mmap.close()
                self._mmap = None
            os.close(self._fd)
            self._fd = -1

    def close_handler(self) -> None:
        """Release the mapping without trimming (the file is being deleted or renamed away)."""
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def rename(self, new_path: str) -> None:
        os.rename(self.path, new_path)
        self.path = new_path

    def relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if not 0 <= rel <= 0x7FFFFFFF:
            raise CorruptRecordError(f"offset {offset} does not fit segment {self.base_offset}")
        return rel


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(_MappedIndex):
    """Maps an offset to the file position of the batch holding it (sparse, one entry per interval)."""

    ENTRY = struct.Struct(">ii")

    def append(self, offset: int, position: int) -> None:
        rel = self.relative(offset)
        if self.entries:
            last_rel, last_pos = self.entry(self.entries - 1)
            if rel <= last_rel or position < last_pos:
                raise CorruptRecordError(
                    f"non-increasing offset index entry {offset} after {self.base_offset + last_rel}"
                )
        self._put((rel, position))

    def lookup(self, target: int) -> OffsetPosition:
        """Greatest entry with offset <= target, else (base_offset, 0)."""
        slot = self._search(target - self.base_offset, lambda e: e[0])
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        rel, pos = self.entry(slot)
        return OffsetPosition(self.base_offset + rel, pos)

    def last_entry(self) -> OffsetPosition:
        if not self.entries:
            return OffsetPosition(self.base_offset, 0)
        rel, pos = self.entry(self.entries - 1)
        return OffsetPosition(self.base_offset + rel, pos)

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        self._truncate_entries(self._search(offset - self.base_offset - 1, lambda e: e[0]) + 1)

    def sanity_check(self, log_size: int) -> None:
        prev = (-1, -1)
        for i in range(self.entries):
            rel, pos = self.entry(i)
            if rel <= prev[0] or pos < prev[1] or pos >= max(log_size, 1):
                raise CorruptRecordError(f"corrupt offset index {self.path} at entry {i}")
            prev = (rel, pos)


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(_MappedIndex):
    """Maps a timestamp to the offset at or before which it is the largest seen. The last slot is reserved
    for the entry written when the segment becomes inactive."""

    ENTRY = struct.Struct(">qi")

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries - 1

    def last_entry(self) -> TimestampOffset:
        if not self.entries:
            return TimestampOffset(-1, self.base_offset)
        ts, rel = self.entry(self.entries - 1)
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
        slot = self._search(target_ts, lambda e: e[0])
        if slot < 0:
            return TimestampOffset(-1, self.base_offset)
        ts, rel = self.entry(slot)
        return TimestampOffset(ts, self.base_offset + rel)

    def truncate_to(self, offset: int) -> None:
        self._truncate_entries(self._search(offset - self.base_offset - 1, lambda e: e[1]) + 1)

    def sanity_check(self, log_size: int) -> None:
        prev = (-1, -1)
        for i in range(self.entries):
            ts, rel = self.entry(i)
            if ts < prev[0] or rel < prev[1]:
                raise CorruptRecordError(f"corrupt time index {self.path} at entry {i}")
            prev = (ts, rel)


class LineStats(NamedTuple):
    """Config-independent sizes of a run of records, from which a view length is computed for any key
    separator and null marker: records + value_bytes + [key_bytes + keyed * len(sep)] + nulls * len(marker)."""

    records: int = 0
    keyed: int = 0
    nulls: int = 0
    key_bytes: int = 0
    value_bytes: int = 0

    def __add__(self, other):  # type: ignore[override]
        return LineStats(*(a + b for a, b in zip(self, other)))

    def __sub__(self, other):
        return LineStats(*(a - b for a, b in zip(self, other)))


ZERO_STATS = LineStats()


class ViewEntry(NamedTuple):
    offset: int  # base offset of the batch the entry points at (or the segment's next offset, at the end)
    position: int  # its position in the .log
    stats: LineStats  # sizes of all records in the segment before that position


class ViewIndex(_MappedIndex):
    """logfs's own sparse index from text-view length to batch position, kept beside Kafka's indexes.

    Entry: relative offset u32, position u32, then the :class:`LineStats` of every record in the segment
    before that position (records, keyed, nulls u32; key_bytes, value_bytes u64). Entries are added at the
    same cadence as offset index entries. When a segment becomes inactive, one final entry at the segment's
    end (position = log size, offset = next offset) records its totals, so a sealed segment's view length
    and next offset are known without reading it.
    """

    ENTRY = struct.Struct(">IIIIIQQ")

    def get(self, i: int) -> ViewEntry:
        rel, pos, *stats = self.entry(i)
        return ViewEntry(self.base_offset + rel, pos, LineStats(*stats))

    def append(self, offset: int, position: int, stats: LineStats) -> None:
        if self.entries >= self.max_entries:
            self.resize((self.entries + 1) * self.entry_size)
        if self.entries and self.entry(self.entries - 1)[1] >= position:
            raise CorruptRecordError(f"non-increasing view index position {position}")
        self._put((self.relative(offset), position, *stats))

    def last(self) -> ViewEntry | None:
        return self.get(self.entries - 1) if self.entries else None

    def floor_by_view(self, target: int, length_of) -> ViewEntry | None:
        """Greatest entry whose view length before it, per ``length_of(stats)``, is <= target."""
        slot = self._search(target, lambda e: length_of(LineStats(*e[2:])))
        return self.get(slot) if slot >= 0 else None

    def floor_by_offset(self, target: int) -> ViewEntry | None:
        slot = self._search(target - self.base_offset, lambda e: e[0])
        return self.get(slot) if slot >= 0 else None

    def floor_by_position(self, position: int) -> ViewEntry | None:
        slot = self._search(position, lambda e: e[1])
        return self.get(slot) if slot >= 0 else None

    def truncate_to_position(self, position: int) -> None:
        """Remove entries at positions >= ``position``."""
        self._truncate_entries(self._search(position - 1, lambda e: e[1]) + 1)

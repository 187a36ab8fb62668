"""One log segment: a ``.log`` file of v2 batches and its three sparse indexes.

Owns appending batches at the end of one file, the sparse index cadence (an entry once more than
``index.interval.bytes`` have been appended since the last one), translating an offset or a timestamp to a
file position (index lookup, then a forward scan bounded by the interval), recovery (CRC validation, truncation
of an invalid tail, index rebuild), and the roll-time bookkeeping. It never decides *when* to roll; the log does.

Thread safety: mutation requires the owning log's writer lock. ``read``/``batches_from``/``translate_offset``
only touch bytes below the published ``size`` and may run in other threads concurrently with an append.
"""

from __future__ import annotations

import errno as _errno
import os
import random
import struct
from typing import Iterator

from . import records as rec
from .records import _speedups
from .errors import CorruptRecordError, StorageIOError
from .index import ZERO_STATS, LineStats, OffsetIndex, TimeIndex, ViewIndex

from .names import (  # noqa: F401 (re-exported: the segment's own file names)
    ALL_SUFFIXES, CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, SWAP_SUFFIX,
    TIME_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix,
)

_READ_CHUNK = 64 * 1024


def batch_stats(buf, pos: int = 0, size: int | None = None) -> tuple[LineStats, int]:
    """LineStats of the records in one batch (C for uncompressed batches: recovery and cleaning call this for
    every batch they read)."""
    if _speedups is not None:
        if size is None:
            size = rec.peek_size(buf, pos) or 0
        try:
            return LineStats(*_speedups.batch_stats(memoryview(buf)[pos : pos + size]))
        except ValueError:
            pass  # compressed or malformed: the generic decoder decides
    records = keyed = nulls = key_bytes = value_bytes = 0
    for r in rec.decode(buf, pos, size):
        records += 1
        if r.key is not None:
            keyed += 1
            key_bytes += len(r.key)
        if r.value is None:
            nulls += 1
        else:
            value_bytes += len(r.value)
    return LineStats(records, keyed, nulls, key_bytes, value_bytes)


class LogSegment:
    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        roll_jitter_ms: int = 0,
        created_ms: int = 0,
        suffix: str = "",
        active: bool = True,
    ):
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self.created_ms = created_ms
        self.suffix = suffix
        stem = os.path.join(directory, filename_prefix(base_offset))
        self.log_path = stem + LOG_SUFFIX + suffix
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        opened = []
        try:  # (on EMFILE, ENOSPC...: release what was opened, never leak descriptors)
            self.size = os.fstat(self.fd).st_size
            self.offset_index = OffsetIndex(stem + INDEX_SUFFIX + suffix, base_offset, max_index_size, active=active)
            opened.append(self.offset_index)
            self.time_index = TimeIndex(stem + TIME_INDEX_SUFFIX + suffix, base_offset, max_index_size,
                                        active=active)
            opened.append(self.time_index)
            self.view_index = ViewIndex(
                stem + VIEW_INDEX_SUFFIX + suffix, base_offset, (max_index_size // 8 + 2) * ViewIndex.ENTRY.size,
                active=active,
            )
        except BaseException:
            for index in opened:
                index.close_handler()
            os.close(self.fd)
            raise
        self.active = active
        self.bytes_since_last_index_entry = 0
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.rolling_based_timestamp: int | None = None
        self.stats = ZERO_STATS
        self.next_offset = base_offset
        self.refs = 0  # open file handles pinning this segment's fds after it leaves the log
        self.deleted = False  # retired from its log (renamed .deleted)
        self.purged = False  # its files are unlinked

    # -- loading ---------------------------------------------------------------------------------
    def load_state(self) -> None:
        """Derive in-memory state (next offset, totals, max timestamp) from the indexes, reading at most the
        tail after the last index entry. Raises CorruptRecordError if the indexes disagree with the log."""
        self.offset_index.sanity_check(self.size)
        self.time_index.sanity_check(self.size)
        self.view_index.sanity_check(self.size)
        last_ts = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
        end = self.view_index.last()
        if end is not None and end.position == self.size and self.size > 0:
            # A sealed segment's totals: checked against the entry before them plus the batches after it (at
            # most one index interval), so a damaged .viewindex is rebuilt instead of serving a wrong view.
            n = self.view_index.entries
            before = self.view_index.get(n - 2) if n >= 2 else None
            start = (before.position, before.stats, before.offset) if before else (0, ZERO_STATS, self.base_offset)
            stats, next_offset, _ = self._scan_tail(*start, expect_base=before is not None)
            if (stats, next_offset) != (end.stats, end.offset):
                raise CorruptRecordError(f"view index totals of {self.log_path} disagree with the log")
            self.stats, self.next_offset = end.stats, end.offset
            if self.active:  # the end entry is only for sealed segments
                self.view_index._truncate_entries(self.view_index.entries - 1)
        else:
            start_pos, stats, next_offset = 0, ZERO_STATS, self.base_offset
            if end is not None:
                start_pos, stats, next_offset = end.position, end.stats, end.offset
            self.stats, self.next_offset, tail_max = self._scan_tail(start_pos, stats, next_offset,
                                                                     expect_base=end is not None)
            if tail_max is not None and tail_max[0] > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = tail_max
            if not self.active and self.size > 0:
                self.view_index.append(self.next_offset, self.size, self.stats)
        if self.size > 0:
            first = self.read(0, rec.HEADER_SIZE)
            self.rolling_based_timestamp = rec.parse_header(first).max_timestamp
        last_index = self.offset_index.last_entry()
        self.bytes_since_last_index_entry = self.size - last_index.position if self.offset_index.entries else self.size
        self._check_last_entries()

    def _check_last_entries(self) -> None:
        """The offset and time indexes' last entries name offsets of this segment, and the time index's names the
        batch whose max timestamp it records (one bounded read). A damaged index is rebuilt, instead of failing
        every later append ("time index offset below last entry") or skewing time-based retention."""
        if self.offset_index.entries:
            last = self.offset_index.last_entry()
            found = self.translate_offset(last.offset)
            if last.offset >= self.next_offset or found is None or found[0] != last.position:
                raise CorruptRecordError(f"offset index of {self.log_path} names a batch that is not there")
        if self.time_index.entries:
            last_ts = self.time_index.last_entry()
            found = self.translate_offset(last_ts.offset) if last_ts.offset < self.next_offset else None
            if found is None or found[1].max_timestamp != last_ts.timestamp:
                raise CorruptRecordError(f"time index of {self.log_path} disagrees with the log")

    def _scan_tail(self, position: int, stats: LineStats, next_offset: int, expect_base: bool):
        """(stats, next offset, (max timestamp, its offset) or None) after the batches from ``position`` to the
        end, starting from the given ``stats``/``next_offset`` (a view index entry's). With ``expect_base``, the
        first batch must start at ``position`` with base offset ``next_offset`` (the entry's). Raises
        CorruptRecordError if the bytes there are not whole batches."""
        reached, max_ts = position, None
        try:
            for pos, header, buf, at in self.batches_from(position):
                if (header.magic != rec.MAGIC or header.size < rec.HEADER_SIZE
                        or (expect_base and pos == position and header.base_offset != next_offset)):
                    break
                stats = stats + batch_stats(buf, at, header.size)
                next_offset = header.next_offset
                if max_ts is None or header.max_timestamp > max_ts[0]:
                    max_ts = (header.max_timestamp, header.last_offset)
                reached = pos + header.size
        except Exception as exc:  # garbage where a batch should start
            raise CorruptRecordError(f"{self.log_path}: no batch at a position its indexes name ({exc})") from None
        if reached != self.size:
            raise CorruptRecordError(f"{self.log_path}: indexes name a position that is not a batch start")
        return stats, next_offset, max_ts

    # -- appending -------------------------------------------------------------------------------
    def append(self, batch: bytes, header: rec.BatchHeader, stats: LineStats) -> None:
        position = self.size
        indexes = (self.offset_index, self.time_index, self.view_index)
        # What a failed append (ENOSPC...) rolls back: index entries added for this batch, and the bookkeeping.
        saved = ([index.mark() for index in indexes], self.max_timestamp, self.offset_of_max_timestamp,
                 self.bytes_since_last_index_entry)
        try:
            if self.bytes_since_last_index_entry > self.index_interval_bytes:
                self.offset_index.append(header.last_offset, position)
                if self.max_timestamp < header.max_timestamp:
                    self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
                self.view_index.append(header.base_offset, position, self.stats)
                self.bytes_since_last_index_entry = 0
            written = os.pwrite(self.fd, batch, position)
            while written < len(batch):  # a short write: the next call reports why (ENOSPC, EIO...)
                n = os.pwrite(self.fd, memoryview(batch)[written:], position + written)
                if n <= 0:
                    raise OSError(_errno.EIO, "short write")
                written += n
        except (OSError, StorageIOError) as exc:
            marks, self.max_timestamp, self.offset_of_max_timestamp, self.bytes_since_last_index_entry = saved
            for index, mark in zip(indexes, marks):
                index.rollback(mark)
            try:
                os.ftruncate(self.fd, position)
            except OSError:
                pass
            if isinstance(exc, StorageIOError):
                raise
            raise StorageIOError(f"write to {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        self._account(header, stats)
        self.size = position + len(batch)  # publish last: readers never see a half-written batch

    def _account(self, header: rec.BatchHeader, stats: LineStats) -> None:
        """In-memory bookkeeping for one batch appended (or recovered) at the end of the segment."""
        if self.rolling_based_timestamp is None:
            self.rolling_based_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
        self.stats = self.stats + stats
        self.next_offset = header.next_offset
        self.bytes_since_last_index_entry += header.size

    def should_roll(self, batch_size: int, max_segment_bytes: int, segment_ms: int, now_ms: int,
                    last_offset: int) -> bool:
        waited = now_ms - (self.rolling_based_timestamp if self.rolling_based_timestamp is not None
                           else self.created_ms)
        return (
            self.size > max_segment_bytes - batch_size
            or (self.size > 0 and waited > segment_ms - self.roll_jitter_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or last_offset - self.base_offset > 0x7FFFFFFF
        )

    def on_become_inactive(self) -> None:
        """Roll-time bookkeeping: the time index's reserved last slot gets the max timestamp; the view index
        gets its end entry; every index is trimmed to its entries."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        if self.size > 0:
            last = self.view_index.last()
            if last is None or last.position < self.size:
                self.view_index.append(self.next_offset, self.size, self.stats)
        for index in (self.offset_index, self.time_index, self.view_index):
            index.trim_to_valid_size()
        self.active = False

    def become_active(self, max_index_size: int) -> None:
        # The end entry written when the segment became inactive is only for sealed segments: the next
        # indexed append lands at that very position.
        end = self.view_index.last()
        if end is not None and end.position >= self.size:
            self.view_index._truncate_entries(self.view_index.entries - 1)
        self.offset_index.resize(max_index_size)
        self.time_index.resize(max_index_size)
        self.active = True

    # -- reading ---------------------------------------------------------------------------------
    def read(self, position: int, length: int) -> bytes:
        length = min(length, self.size - position)
        if length <= 0:
            return b""
        try:
            return os.pread(self.fd, length, position)
        except OSError as exc:
            raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        """Like :meth:`read`, into a reusable buffer (no allocation, no page faults on a fresh 1 MiB object);
        the view is valid until ``scratch`` is reused."""
        length = min(length, self.size - position)
        if length <= 0:
            return memoryview(b"")
        if len(scratch) < length:  # callers size it; never resize it here (a caller's view may be alive)
            return memoryview(self.read(position, length))
        view = memoryview(scratch)[:length]
        try:
            got = os.preadv(self.fd, [view], position)
        except OSError as exc:
            raise StorageIOError(f"read of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        return view[:got]

    def batches_from(self, position: int, end: int | None = None, chunk: int = _READ_CHUNK,
                     scratch: bytearray | None = None) -> Iterator[tuple[int, rec.BatchHeader, bytes, int]]:
        """Complete batches from ``position`` up to ``end`` (default: the size now), as
        (file position, header, buffer, position of the batch within buffer). No CRC check. With ``scratch``,
        the buffer is a view of it, valid only until the next batch is requested."""
        limit = self.size if end is None else min(end, self.size)
        pos = position
        while pos < limit:
            length = min(max(chunk, rec.HEADER_SIZE), limit - pos)
            buf = self.read(pos, length) if scratch is None else self.read_into(scratch, pos, length)
            at = 0
            while True:
                size = rec.peek_size(buf, at)
                if size is None or len(buf) - at < rec.HEADER_SIZE:
                    break
                if size > len(buf) - at:
                    if at == 0:  # one batch larger than the chunk: read it whole
                        buf = self.read(pos, size)
                        if len(buf) < size:
                            return
                        continue
                    break
                header = rec.parse_header(buf, at)
                yield pos + at, header, buf, at
                at += size
            if at == 0:
                return  # a partial batch at the end
            pos += at

    def translate_offset(self, offset: int, start_position: int = 0) -> tuple[int, rec.BatchHeader] | None:
        """Position and header of the first batch whose last offset >= ``offset``, scanning forward from the
        offset index entry (a scan bounded by the index interval)."""
        entry = self.offset_index.lookup(offset)
        for pos, header, _, _ in self.batches_from(max(entry.position, start_position)):
            if header.last_offset >= offset:
                return pos, header
        return None

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> int | None:
        entry = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(entry.offset, starting_offset)).position
        for _, header, buf, at in self.batches_from(position):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                for r in rec.decode(buf, at, header.size):
                    if r.timestamp >= timestamp and r.offset >= starting_offset:
                        return r.offset
        return None

    @property
    def largest_timestamp(self) -> int:
        return self.max_timestamp if self.max_timestamp >= 0 else self.created_ms

    # -- recovery and truncation -----------------------------------------------------------------
    def recover(self, flushed_offset: int | None = None) -> int:
        """Validate batches, rebuild indexes and state, truncate at the first invalid byte. Returns the number
        of bytes truncated.

        With ``flushed_offset`` (the recovery point, inside this segment), everything below the last view index
        entry at or before it is known durable with its index entries (a flush syncs the log, then the
        indexes), so only the tail from that entry is validated and re-indexed: recovery costs the unflushed
        tail plus one index interval, not the segment."""
        start = None
        if flushed_offset is not None and flushed_offset > self.base_offset:
            try:
                for index in (self.offset_index, self.time_index, self.view_index):
                    index.sanity_check(self.size)
                entry = self.view_index.floor_by_offset(flushed_offset)
            except (CorruptRecordError, struct.error):
                entry = None
            if entry is not None and 0 < entry.position <= self.size:
                start = entry
        for index in (self.offset_index, self.time_index, self.view_index):
            if start is None:
                index.reset()
            index.resize(index.max_index_size)
        saved_size, valid = self.size, 0
        self.rolling_based_timestamp = None
        if start is None:
            self.bytes_since_last_index_entry = 0
            self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
            self.stats, self.next_offset = ZERO_STATS, self.base_offset
            pos = 0
        else:
            self.offset_index.truncate_to(start.offset)
            self.time_index.truncate_to(start.offset)
            self.view_index.truncate_to_position(start.position)
            last_ts = self.time_index.last_entry()
            self.max_timestamp, self.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
            self.stats, self.next_offset = start.stats, start.offset
            last_index = self.offset_index.last_entry()
            self.bytes_since_last_index_entry = start.position - (last_index.position if self.offset_index.entries else 0)
            first = self.read(0, rec.HEADER_SIZE)
            self.rolling_based_timestamp = rec.parse_header(first).max_timestamp if len(first) == rec.HEADER_SIZE else None
            pos = valid = start.position
        while pos < saved_size:
            size = rec.peek_size(self.read(pos, rec.LOG_OVERHEAD))
            if size is None or size < rec.HEADER_SIZE or pos + size > saved_size:
                break
            buf = self.read(pos, size)
            try:
                header = rec.validate(buf)
                stats = batch_stats(buf, 0, size)
            except Exception:  # CRC, structure, or a codec error on corrupt compressed data
                break
            if header.base_offset < self.next_offset or header.last_offset - self.base_offset > 0x7FFFFFFF:
                break
            self._index_recovered(pos, header, stats)
            pos += size
            valid = pos
        truncated = saved_size - valid
        if truncated:
            os.ftruncate(self.fd, valid)
        self.size = valid
        return truncated

    def _index_recovered(self, pos: int, header: rec.BatchHeader, stats: LineStats) -> None:
        if self.bytes_since_last_index_entry > self.index_interval_bytes and not self.offset_index.is_full:
            self.offset_index.append(header.last_offset, pos)
            if self.max_timestamp < header.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
            if not self.time_index.is_full:
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.view_index.append(header.base_offset, pos, self.stats)
            self.bytes_since_last_index_entry = 0
        self._account(header, stats)

    def truncate_to(self, offset: int) -> int:
        """Remove records with offset >= ``offset``; a batch straddling it is rewritten with its earlier
        records. Returns bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position, header = found
        kept = []
        if header.base_offset < offset:
            buf = self.read(position, header.size)
            kept = [r for r in rec.decode(buf, 0, header.size) if r.offset < offset]
        old_size = self.size
        for index in (self.offset_index, self.time_index):
            index.truncate_to(offset if not kept else header.base_offset)
        self.view_index.truncate_to_position(position)
        os.ftruncate(self.fd, position)
        self.size = position
        # Re-derive the in-memory state from what remains (bounded: from the last index entry).
        self.stats, self.next_offset = ZERO_STATS, self.base_offset
        last_view = self.view_index.last()
        start = 0
        if last_view is not None:
            start, self.stats, self.next_offset = last_view.position, last_view.stats, last_view.offset
        self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        last_ts = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
        self.rolling_based_timestamp = None
        for _, h, buf, at in self.batches_from(start):
            self.stats = self.stats + batch_stats(buf, at, h.size)
            self.next_offset = h.next_offset
            if h.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = h.max_timestamp, h.last_offset
        if self.size > 0:
            self.rolling_based_timestamp = rec.parse_header(self.read(0, rec.HEADER_SIZE)).max_timestamp
        last_index = self.offset_index.last_entry()
        self.bytes_since_last_index_entry = self.size - (last_index.position if self.offset_index.entries else 0)
        if kept:
            # Original offsets are kept: a compacted batch has gaps between its records' offsets.
            batch = rec.build_batch(
                header.base_offset, 0, [r.value for r in kept], [r.key for r in kept], [r.headers for r in kept],
                [r.timestamp for r in kept], [r.offset - header.base_offset for r in kept],
            )
            stats = batch_stats(batch)
            self.append(batch, rec.parse_header(batch), stats)
        return old_size - self.size

    # -- durability and files ----------------------------------------------------------------------
    def flush(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise StorageIOError(f"fsync of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        for index in (self.offset_index, self.time_index, self.view_index):
            index.flush()

    def _paths(self) -> list[str]:
        return [self.log_path, self.offset_index.path, self.time_index.path, self.view_index.path]

    def change_suffix(self, new_suffix: str) -> None:
        """Rename all files from the current suffix to ``new_suffix`` (open fds stay valid)."""
        stem = os.path.join(self.directory, filename_prefix(self.base_offset))
        for old, kind in zip(self._paths(), ALL_SUFFIXES):
            new = stem + kind + new_suffix
            if os.path.exists(old):
                os.rename(old, new)
        self.log_path = stem + LOG_SUFFIX + new_suffix
        self.offset_index.path = stem + INDEX_SUFFIX + new_suffix
        self.time_index.path = stem + TIME_INDEX_SUFFIX + new_suffix
        self.view_index.path = stem + VIEW_INDEX_SUFFIX + new_suffix
        self.suffix = new_suffix

    def delete_files(self) -> None:
        for path in self._paths():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Close fds; indexes of an active segment are trimmed and its view index gets its end entry."""
        if self.fd < 0:
            return
        if self.active and not self.deleted:
            if self.max_timestamp >= 0:
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp,
                                             skip_full_check=True)
            if self.size > 0:
                last = self.view_index.last()
                if last is None or last.position < self.size:
                    self.view_index.append(self.next_offset, self.size, self.stats)
        for index in (self.offset_index, self.time_index, self.view_index):
            if self.deleted:
                index.close_handler()
            else:
                index.close()
        os.close(self.fd)
        self.fd = -1

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"


def random_jitter(segment_jitter_ms: int, segment_ms: int) -> int:
    if segment_jitter_ms <= 0:
        return 0
    return random.randrange(min(segment_jitter_ms, segment_ms))

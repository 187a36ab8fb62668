"""The recovery and validation half of a log segment: deriving its state from its indexes, checking them
against the log, and recovering (CRC validation, truncation at the first invalid byte, index rebuild).

:class:`SegmentRecovery` is a base of :class:`~logfs.storage.local.segment.LogSegment`; the loader calls
``load_state`` (after a clean shutdown) or ``recover`` (after an unclean one, or when an index is damaged).
Recovery is the one place allowed to read a whole segment.
"""

from __future__ import annotations

import os
import struct

from ..format import records as rec
from ..errors import CorruptRecordError
from ..format.lines import ZERO_STATS, LineStats
from ..format.speedups import C as _speedups



def batch_stats(buf, pos: int = 0, size: int | None = None) -> tuple[LineStats, int]:
    """LineStats of the records in one batch (C for uncompressed batches: recovery and cleaning call this for
    every batch they read)."""
    if _speedups is not None:
        if size is None:
            size = rec.peek_size(buf, pos) or 0
        batch = memoryview(buf)[pos : pos + size]
        try:
            if size >= rec.HEADER_SIZE and batch[22] & rec.ATTR_COMPRESSION_MASK:
                batch = rec.decompress_batch(batch)  # once, then the same C count as a plain batch
            return LineStats(*_speedups.batch_stats(batch))
        except (ValueError, CorruptRecordError):
            pass  # malformed: the generic decoder decides (and reports)
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


class SegmentRecovery:
    """State from indexes, and recovery, for :class:`LogSegment` (which owns the attributes used here)."""

    aborted = None  # AbortedRanges of Kafka's aborted transactions reaching into this segment (txn_index.py)
    has_txn_index = False  # a .txnindex of its own beside it (a Kafka broker wrote it; the loader says so)

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        """Whether the batch holds records of an aborted transaction (a ``read_committed`` reader skips it)."""
        return (self.aborted is not None and bool(header.attributes & rec.ATTR_TRANSACTIONAL)
                and self.aborted.covers(header.producer_id, header.base_offset))

    def visible_stats(self, buf, pos: int, header: rec.BatchHeader) -> LineStats:
        """The LineStats of the batch's lines in the text view: none for an aborted transaction's batch."""
        return ZERO_STATS if self.is_aborted(header) else batch_stats(buf, pos, header.size)

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
                stats = stats + self.visible_stats(buf, at, header)
                next_offset = header.next_offset
                if max_ts is None or header.max_timestamp > max_ts[0]:
                    max_ts = (header.max_timestamp, header.last_offset)
                reached = pos + header.size
        except Exception as exc:  # garbage where a batch should start
            raise CorruptRecordError(f"{self.log_path}: no batch at a position its indexes name ({exc})") from None
        if reached != self.size:
            raise CorruptRecordError(f"{self.log_path}: indexes name a position that is not a batch start")
        return stats, next_offset, max_ts

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
                stats = self.visible_stats(buf, 0, header)
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

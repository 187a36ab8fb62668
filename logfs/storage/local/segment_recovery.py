"""A log segment's recovery routine: deriving its state from its indexes, checking them against the log, and
recovering (CRC validation, truncation at the first invalid byte, index rebuild); and the batch statistics it
counts with.

:class:`SegmentRecovery` holds the :class:`~logfs.storage.local.segment.LogSegment` it recovers; the loader calls
the segment's ``load_state`` (after a clean shutdown) or ``recover`` (after an unclean one, or when an index is
damaged), which run it. Recovery is the one place allowed to read a whole segment.
"""

from __future__ import annotations

import os
import struct

from ..format import records as rec
from ..format import twins
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
    return LineStats(*twins.record_stats(rec.decode(buf, pos, size)))


class SegmentRecovery:
    """The recovery routine of one :class:`~logfs.storage.local.segment.LogSegment`: its state derived from its
    indexes (:meth:`load_state`), or rebuilt from its batches (:meth:`recover`). It sets the segment's own
    attributes; the segment calls it (``LogSegment.load_state``, ``LogSegment.recover``)."""

    def __init__(self, segment):  # (a LogSegment: not imported, it imports this module)
        self.segment = segment

    def load_state(self) -> None:
        """Derive in-memory state (next offset, totals, max timestamp) from the indexes, reading at most the
        tail after the last index entry. Raises CorruptRecordError if the indexes disagree with the log."""
        seg = self.segment
        seg.offset_index.sanity_check(seg.size)
        seg.time_index.sanity_check(seg.size)
        seg.view_index.sanity_check(seg.size)
        last_ts = seg.time_index.last_entry()
        seg.max_timestamp, seg.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
        end = seg.view_index.last()
        if end is not None and end.position == seg.size and seg.size > 0:
            # A sealed segment's totals: checked against the entry before them plus the batches after it (at
            # most one index interval), so a damaged .viewindex is rebuilt instead of serving a wrong view.
            n = seg.view_index.entries
            before = seg.view_index.get(n - 2) if n >= 2 else None
            start = (before.position, before.stats, before.offset) if before else (0, ZERO_STATS, seg.base_offset)
            stats, next_offset, _ = self._scan_tail(*start, expect_base=before is not None)
            if (stats, next_offset) != (end.stats, end.offset):
                raise CorruptRecordError(f"view index totals of {seg.log_path} disagree with the log")
            seg.stats, seg.next_offset = end.stats, end.offset
            if seg.active:  # the end entry is only for sealed segments
                seg.view_index._truncate_entries(seg.view_index.entries - 1)
        else:
            start_pos, stats, next_offset = 0, ZERO_STATS, seg.base_offset
            if end is not None:
                start_pos, stats, next_offset = end.position, end.stats, end.offset
            seg.stats, seg.next_offset, tail_max = self._scan_tail(start_pos, stats, next_offset,
                                                                     expect_base=end is not None)
            if tail_max is not None and tail_max[0] > seg.max_timestamp:
                seg.max_timestamp, seg.offset_of_max_timestamp = tail_max
            if not seg.active and seg.size > 0:
                seg.view_index.append(seg.next_offset, seg.size, seg.stats)
        if seg.size > 0:
            first = seg.read(0, rec.HEADER_SIZE)
            seg.rolling_based_timestamp = rec.parse_header(first).max_timestamp
        last_index = seg.offset_index.last_entry()
        seg.bytes_since_last_index_entry = seg.size - last_index.position if seg.offset_index.entries else seg.size
        self._check_last_entries()

    def _check_last_entries(self) -> None:
        """The offset and time indexes' last entries name offsets of this segment, and the time index's names the
        batch whose max timestamp it records (one bounded read). A damaged index is rebuilt, instead of failing
        every later append ("time index offset below last entry") or skewing time-based retention."""
        seg = self.segment
        if seg.offset_index.entries:
            last = seg.offset_index.last_entry()
            found = seg.translate_offset(last.offset)
            if last.offset >= seg.next_offset or found is None or found[0] != last.position:
                raise CorruptRecordError(f"offset index of {seg.log_path} names a batch that is not there")
        if seg.time_index.entries:
            last_ts = seg.time_index.last_entry()
            found = seg.translate_offset(last_ts.offset) if last_ts.offset < seg.next_offset else None
            if found is None or found[1].max_timestamp != last_ts.timestamp:
                raise CorruptRecordError(f"time index of {seg.log_path} disagrees with the log")

    def _scan_tail(self, position: int, stats: LineStats, next_offset: int, expect_base: bool):
        """(stats, next offset, (max timestamp, its offset) or None) after the batches from ``position`` to the
        end, starting from the given ``stats``/``next_offset`` (a view index entry's). With ``expect_base``, the
        first batch must start at ``position`` with base offset ``next_offset`` (the entry's). Raises
        CorruptRecordError if the bytes there are not whole batches."""
        seg = self.segment
        reached, max_ts = position, None
        try:
            for pos, header, buf, at in seg.batches_from(position):
                if (header.magic != rec.MAGIC or header.size < rec.HEADER_SIZE
                        or (expect_base and pos == position and header.base_offset != next_offset)):
                    break
                stats = stats + seg.visible_stats(buf, at, header)
                next_offset = header.next_offset
                if max_ts is None or header.max_timestamp > max_ts[0]:
                    max_ts = (header.max_timestamp, header.last_offset)
                reached = pos + header.size
        except Exception as exc:  # garbage where a batch should start
            raise CorruptRecordError(f"{seg.log_path}: no batch at a position its indexes name ({exc})") from None
        if reached != seg.size:
            raise CorruptRecordError(f"{seg.log_path}: indexes name a position that is not a batch start")
        return stats, next_offset, max_ts

    def recover(self, flushed_offset: int | None = None) -> int:
        """Validate batches, rebuild indexes and state, truncate at the first invalid byte. Returns the number
        of bytes truncated.

        With ``flushed_offset`` (the recovery point, inside this segment), everything below the last view index
        entry at or before it is known durable with its index entries (a flush syncs the log, then the
        indexes), so only the tail from that entry is validated and re-indexed: recovery costs the unflushed
        tail plus one index interval, not the segment."""
        seg = self.segment
        start = None
        if flushed_offset is not None and flushed_offset > seg.base_offset:
            try:
                for index in (seg.offset_index, seg.time_index, seg.view_index):
                    index.sanity_check(seg.size)
                entry = seg.view_index.floor_by_offset(flushed_offset)
            except (CorruptRecordError, struct.error):
                entry = None
            if entry is not None and 0 < entry.position <= seg.size:
                start = entry
        for index in (seg.offset_index, seg.time_index, seg.view_index):
            if start is None:
                index.reset()
            index.resize(index.max_index_size)
        saved_size, valid = seg.size, 0
        seg.rolling_based_timestamp = None
        if start is None:
            seg.bytes_since_last_index_entry = 0
            seg.max_timestamp, seg.offset_of_max_timestamp = -1, seg.base_offset
            seg.stats, seg.next_offset = ZERO_STATS, seg.base_offset
            pos = 0
        else:
            seg.offset_index.truncate_to(start.offset)
            seg.time_index.truncate_to(start.offset)
            seg.view_index.truncate_to_position(start.position)
            last_ts = seg.time_index.last_entry()
            seg.max_timestamp, seg.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
            seg.stats, seg.next_offset = start.stats, start.offset
            last_index = seg.offset_index.last_entry()
            seg.bytes_since_last_index_entry = start.position - (last_index.position if seg.offset_index.entries else 0)
            first = seg.read(0, rec.HEADER_SIZE)
            seg.rolling_based_timestamp = rec.parse_header(first).max_timestamp if len(first) == rec.HEADER_SIZE else None
            pos = valid = start.position
        while pos < saved_size:
            size = rec.peek_size(seg.read(pos, rec.LOG_OVERHEAD))
            if size is None or size < rec.HEADER_SIZE or pos + size > saved_size:
                break
            buf = seg.read(pos, size)
            try:
                header = rec.validate(buf)
                stats = seg.visible_stats(buf, 0, header)
            except Exception:  # CRC, structure, or a codec error on corrupt compressed data
                break
            if header.base_offset < seg.next_offset or header.last_offset - seg.base_offset > 0x7FFFFFFF:
                break
            self._index_recovered(pos, header, stats)
            pos += size
            valid = pos
        truncated = saved_size - valid
        if truncated:
            os.ftruncate(seg.fd, valid)
        seg.size = valid
        return truncated

    def _index_recovered(self, pos: int, header: rec.BatchHeader, stats: LineStats) -> None:
        seg = self.segment
        if seg.bytes_since_last_index_entry > seg.index_interval_bytes and not seg.offset_index.is_full:
            seg.offset_index.append(header.last_offset, pos)
            if seg.max_timestamp < header.max_timestamp:
                seg.max_timestamp, seg.offset_of_max_timestamp = header.max_timestamp, header.last_offset
            if not seg.time_index.is_full:
                seg.time_index.maybe_append(seg.max_timestamp, seg.offset_of_max_timestamp)
            seg.view_index.append(header.base_offset, pos, seg.stats)
            seg.bytes_since_last_index_entry = 0
        seg._account(header, stats)

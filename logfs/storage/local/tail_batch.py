"""Growing the active segment's last batch in place: a small append adds its records to that batch and rewrites its
header, so a line per ``write()`` costs its record (~9 bytes over the line), not a batch header each.

Owns when a batch may grow (above the recovery point: synced bytes are never rewritten; under
:data:`TAIL_BATCH_CAP`; no roll due; the clock not behind the batch; its header not across a page boundary) and
the grow itself; :meth:`LogSegment.grow_tail` writes it (records first, header last). Called by
:meth:`Log.append_lines` under the log's lock.
"""

from __future__ import annotations

import mmap

from ..format import lines
from ..format import records as rec
from ..format import twins
from ..format.speedups import C as _speedups
from ..errors import LogfsError

# The cap bounds the bytes rewritten per append (the CRC covers the whole batch) and a reader's skip into it.
TAIL_BATCH_CAP = 4 * 1024
PAGE_SIZE = mmap.PAGESIZE


class TailBatch:
    """The last batch of the active segment while appends may still grow it in place: its bytes (a bytearray of
    ``encode_lines``'s making), where it starts, its base offset, base timestamp and max timestamp."""

    __slots__ = ("batch", "position", "base_offset", "base_timestamp", "max_timestamp")

    def __init__(self, batch: bytearray, position: int, base_offset: int, timestamp: int):
        self.batch, self.position, self.base_offset = batch, position, base_offset
        self.base_timestamp = self.max_timestamp = timestamp


def keep(log, batch: bytearray, count: int, last: int) -> None:
    """After a bulk append, remember its last batch (``count`` records ending at ``last``) as the one later small
    appends may grow, if it qualifies."""
    active = log.segments.active
    position = active.size - len(batch)
    if (len(batch) < TAIL_BATCH_CAP and active.next_offset == last + 1 and position >= 0
            and position % PAGE_SIZE <= PAGE_SIZE - rec.HEADER_SIZE and not _indexed(active, position, last)):
        # (A header across a page boundary is never rewritten: a kill can cut a write between pages, and a torn
        # header would take the batch's earlier lines with it.)
        active.tail = TailBatch(batch, position, last + 1 - count, log.last_append_ms)


def _indexed(segment, position: int, last: int) -> bool:
    """Whether an index entry names the batch at ``position`` (last offset ``last``): Kafka's rule is that an offset
    index entry names the last offset of the batch at its position, and a time index entry a batch's last offset
    (DumpLogSegments --verify-index-only checks both), so such a batch never grows: one more batch header per
    index interval."""
    offsets, times = segment.offset_index, segment.time_index
    return ((offsets.entries and offsets.last_entry().position == position)
            or (times.entries and times.last_entry().offset >= last))


def grow(log, prefix: bytes, data, end: int) -> tuple[int, int] | None:
    """The lines appended to the active segment's last batch, if it may grow (:class:`TailBatch`: above the
    recovery point, room under TAIL_BATCH_CAP, no roll due, the clock not behind the batch): (first offset,
    last offset), else None and nothing changed. Under the lock."""
    active = log.segments.active
    tail = active.tail
    if tail is None or tail.base_offset < log.recovery_point:
        return None
    now = log.clock.time_ms()
    if now < tail.base_timestamp:
        return None
    batch = tail.batch
    old_length, old_header = len(batch), batch[: rec.HEADER_SIZE]
    grown = (_speedups or twins).grow_lines(batch, prefix, data, end, now - tail.base_timestamp, TAIL_BATCH_CAP)
    if grown is None:
        return None
    count, payload, longest = grown
    first = active.next_offset
    c = log.config
    # (Only a line the size rule or the key rule may refuse goes through the checks and their messages: this
    # runs once per write().)
    if longest > lines.max_record_size(c) or c.compact:
        try:
            lines.check_record_size(c, longest)
            lines.check_keys(c, None)
        except LogfsError:
            _undo(batch, old_length, old_header)
            raise
    last = first + count - 1
    if active.should_roll(len(batch) - old_length, c.segment_bytes, c.segment_ms, now, last):
        _undo(batch, old_length, old_header)
        return None  # the bulk path rolls
    max_timestamp = now if now > tail.max_timestamp else tail.max_timestamp
    rec.restamp_batch(batch, last - tail.base_offset, max_timestamp)
    active.grow_tail(old_length, old_header, count, payload, max_timestamp)
    log.last_append_ms = now
    return first, last


def _undo(batch: bytearray, old_length: int, old_header: bytearray) -> None:
    del batch[old_length:]
    batch[: rec.HEADER_SIZE] = old_header

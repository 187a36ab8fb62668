"""A ``.log`` file read by ``pread`` alone: its bytes up to the published size, and the walk over its whole batches;
and the segment a view reads (:class:`ReadableSegment`), with the lookups all such segments share.

:class:`SegmentFile` is shared by the log's segments, the tiered segments
(:mod:`~logfs.storage.tiered.remote_segment`), the read-only :mod:`~logfs.storage.local.reader` and the Spark
source's bucket reader, so the batch framing is read in one place. :class:`ReadableSegment` is the seam between a
segment and its readers (the view, the log's reads, tiering): a local :class:`~logfs.storage.local.segment.LogSegment`
and a tiered :class:`~logfs.storage.tiered.remote_segment.RemoteLogSegment` are its two implementations, and
:func:`translate_offset` and :func:`find_offset_by_timestamp` are written once over it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterator, Protocol

from ..errors import StorageIOError
from ..format import records as rec
from ..format.lines import LineStats

if TYPE_CHECKING:
    from .index import OffsetIndex, TimeIndex, ViewIndex

_READ_CHUNK = 64 * 1024
MIN_TIMESTAMP_CHUNK = 4 << 20  # bytes per pread of min_timestamp's scan (one reused buffer)


class SegmentFile:
    """A ``.log`` file read by ``pread`` up to its published ``size``: bytes, and the walk over whole batches.
    Subclasses set ``fd``, ``log_path`` and ``size``."""

    fd: int
    log_path: str
    size: int

    def read(self, position: int, length: int) -> bytes:
        length = min(length, self.size - position)
        if length <= 0:
            return b""
        self.recent = True
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
        self.recent = True
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

    def min_timestamp(self, position: int = 0, end: int | None = None, chunk: int = MIN_TIMESTAMP_CHUNK) -> int:
        """The smallest record timestamp of the batches from ``position`` to ``end`` (default: the size now), -1
        when they hold no record: what tiering records per segment (the manifest's ``min_timestamp``). Kafka's
        indexes hold only the largest timestamp so far, and timestamps may go back (another producer's
        CreateTime, a batch whose records are out of order), so every batch is looked at: a LogAppendTime one by
        its header, a CreateTime one by its records' timestamp deltas (:func:`~logfs.storage.format.records.
        min_timestamp`, in C). Reads by ``pread`` in ``chunk``-sized pieces into one reused buffer. Raises
        CorruptRecordError for a batch whose records cannot be walked."""
        lowest = None
        scratch = bytearray(chunk)
        for _, header, buf, at in self.batches_from(position, end, chunk, scratch):
            if header.records_count <= 0:
                continue
            ts = (header.max_timestamp if header.timestamp_type else
                  rec.min_timestamp(header, memoryview(buf)[at : at + header.size]))
            if ts is not None and (lowest is None or ts < lowest):
                lowest = ts
        return -1 if lowest is None else lowest



class ReadableSegment(Protocol):
    """A segment as its readers see it: local (:class:`~logfs.storage.local.segment.LogSegment`) or tiered
    (:class:`~logfs.storage.tiered.remote_segment.RemoteLogSegment`). Read under its log's lock or pinned by a
    snapshot (``refs``)."""

    base_offset: int
    next_offset: int
    size: int
    stats: LineStats
    max_timestamp: int
    active: bool
    refs: int
    deleted: bool
    purged: bool
    closed: bool
    aborted: object  # Kafka's aborted transactions reaching into it (txn_index.AbortedRanges), or None

    @property
    def offset_index(self) -> "OffsetIndex": ...
    @property
    def time_index(self) -> "TimeIndex": ...
    @property
    def view_index(self) -> "ViewIndex": ...
    @property
    def largest_timestamp(self) -> int: ...

    def read(self, position: int, length: int) -> bytes: ...
    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview: ...
    def batches_from(self, position: int, end: int | None = None, chunk: int = _READ_CHUNK,
                     scratch: bytearray | None = None) -> Iterator[tuple[int, rec.BatchHeader, bytes, int]]: ...
    def min_timestamp(self, position: int = 0, end: int | None = None, chunk: int = MIN_TIMESTAMP_CHUNK) -> int: ...
    def translate_offset(self, offset: int, start_position: int = 0) -> tuple[int, rec.BatchHeader] | None: ...
    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> int | None: ...
    def is_aborted(self, header: rec.BatchHeader) -> bool: ...
    def hold_files(self) -> None: ...
    def close(self) -> None: ...


def translate_offset(segment: ReadableSegment, offset: int, start_position: int = 0
                     ) -> tuple[int, rec.BatchHeader] | None:
    """Position and header of the first batch whose last offset >= ``offset``, scanning forward from the offset
    index entry (a scan bounded by the index interval). A method of both segments a view reads."""
    entry = segment.offset_index.lookup(offset)
    for pos, header, _, _ in segment.batches_from(max(entry.position, start_position)):
        if header.last_offset >= offset:
            return pos, header
    return None


def find_offset_by_timestamp(segment: ReadableSegment, timestamp: int, starting_offset: int) -> int | None:
    """Kafka's ``LogSegment.findOffsetByTimestamp``: the first offset >= ``starting_offset`` of a record whose
    timestamp is >= ``timestamp``. A transaction marker counts (a control batch's one record, at the coordinator's
    time), as in Kafka's ``FileRecords.searchForTimestamp``; so do aborted records. A method of both segments."""
    entry = segment.time_index.lookup(timestamp)
    position = segment.offset_index.lookup(max(entry.offset, starting_offset)).position
    for _, header, buf, at in segment.batches_from(position):
        if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
            if header.is_control:
                return max(header.base_offset, starting_offset)
            for r in rec.decode(buf, at, header.size):
                if r.timestamp >= timestamp and r.offset >= starting_offset:
                    return r.offset
    return None

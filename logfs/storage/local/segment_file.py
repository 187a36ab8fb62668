"""A ``.log`` file read by ``pread`` alone: its bytes up to the published size, and the walk over its whole batches.

Shared by the log's segments, the tiered segments (:mod:`~logfs.storage.tiered.remote_segment`), the read-only
:mod:`~logfs.storage.local.reader` and the Spark source's bucket reader, so the batch framing is read in one place.
"""

from __future__ import annotations

import os
from typing import Iterator

from ..errors import StorageIOError
from ..format import records as rec

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


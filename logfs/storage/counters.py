"""Per-partition traffic counters: what the metrics report as ``logfs_partition_*_total``.

A :class:`PartitionCounters` lives on its :class:`~logfs.storage.local.log.Log` (``log.counters``), where every layer
already has it at hand. The request path increments its fields in place: plain integer additions on the trio
thread only (the FUSE layer does them after a read or write returns there, also when the work ran in a worker
thread), no lock and no lookup. The metrics writer reads them from another thread; a value it reads may be one
request old, never torn. Records appended are not counted at all: they are the log end offset's advance since the
log was loaded (every record appended gets the next offset, and nothing else moves the log end offset forward).
"""

from __future__ import annotations


class PartitionCounters:
    __slots__ = ("end_offset_at_load", "appended_bytes", "read_bytes", "read_records")

    def __init__(self, end_offset_at_load: int):
        self.end_offset_at_load = end_offset_at_load
        self.appended_bytes = 0  # bytes of text that write() calls on the partition's files took
        self.read_bytes = 0  # bytes read() returned
        self.read_records = 0  # records whose line (its "\n") a read() returned

    def appended_records(self, log_end_offset: int) -> int:
        return max(0, log_end_offset - self.end_offset_at_load)

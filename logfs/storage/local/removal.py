"""How segments leave a partition's log: the ``.deleted`` rename, and the purge after ``file.delete.delay.ms``.

:class:`RetiredSegments` is held by a :class:`~logfs.storage.local.log.Log` (its ``retired``), which decides what
leaves (truncation, retention's deletion, the cleaner's swap) under its lock. A segment leaves in two steps: its
files are renamed ``.deleted`` and it leaves the segment list (:meth:`RetiredSegments.retire`, under the log's
lock), then after ``file.delete.delay.ms`` its files are unlinked (:meth:`RetiredSegments.purge_due`). A segment a
reader's snapshot pins keeps its files open until the last snapshot lets it go, so readers that stay open go on
reading what they began, and a purged segment's disk space is freed when they move on (CONTRACT section 3).
"""

from __future__ import annotations

from ..clock import Clock
from .segment import DELETED_SUFFIX, LogSegment
from .segments import LogSegments, close_if_unused


class RetiredSegments:
    """The segments that left one log and wait for their purge: (unlink due ms, segment), in the order they left."""

    def __init__(self, segments: LogSegments, clock: Clock):
        self.segments = segments  # the log's list, which a retired segment leaves
        self.clock = clock
        self.pending: list[tuple[int, LogSegment]] = []

    def retire(self, segment: LogSegment, delay_ms: int, unlink_later: bool = False) -> None:
        """Take ``segment`` out of the log: its files renamed ``.deleted`` FIRST, then out of the segment list (a
        rename that fails leaves it in the log, live on disk, as it is in memory). Under the log's lock."""
        # A segment a snapshot pins keeps reading its files after they are renamed and unlinked: they are opened
        # now, and stay open until it is purged and unpinned. One nobody pins is read by no one any more.
        if segment.refs > 0:
            segment.hold_files()
        else:
            segment.release()
        segment.change_suffix(DELETED_SUFFIX)
        self.segments.remove(segment)
        segment.deleted = True
        if delay_ms <= 0 and not unlink_later:
            self.purge(segment)
        else:
            self.pending.append((self.clock.time_ms() + delay_ms, segment))

    def purge_due(self, now_ms: int, lock) -> int:
        """Unlink the files of the segments whose delay has passed by ``now_ms``, each under ``lock`` (the log's);
        how many."""
        with lock:
            due = [s for t, s in self.pending if t <= now_ms]
            self.pending = [(t, s) for t, s in self.pending if t > now_ms]
        for segment in due:
            with lock:
                self.purge(segment)
        return len(due)

    @staticmethod
    def purge(segment: LogSegment) -> None:
        """Unlink a retired segment's files now; it closes once no snapshot pins it."""
        segment.delete_files()
        segment.purged = True
        close_if_unused(segment)

"""How segments leave a partition's log: truncation, retention's deletion, the cleaner's swap, and the purge.

A mixin of :class:`~logfs.storage.local.log.Log` (it uses the log's lock, segment list, config, clock and offsets).
A segment leaves in two steps: its files are renamed ``.deleted`` and it leaves the segment list (:meth:`_retire`,
under the lock), then after ``file.delete.delay.ms`` its files are unlinked (:meth:`purge_deleted`). A segment a
reader's snapshot pins keeps its files open until the last snapshot lets it go, so readers that stay open go on
reading what they began, and a purged segment's disk space is freed when they move on (CONTRACT section 3).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import LogfsError, OffsetOutOfRangeError
from ..failure import guarded
from .lifecycle import discard, replace_segments
from .segment import DELETED_SUFFIX, LogSegment
from .segments import close_if_unused


class SegmentRemoval:
    """Truncation, deletion and swaps of a log's segments (a mixin of Log)."""

    @guarded("truncation", space_ok=False)
    def truncate_to(self, offset: int, *, unlink_later: bool = False) -> None:
        """Remove every record with offset >= ``offset``. Segments wholly removed are renamed ``.deleted`` and
        unlinked now, or with ``unlink_later`` by the next :meth:`purge_deleted` (which the service runs in a
        worker thread)."""
        with self.lock:
            if offset >= self.log_end_offset:
                return
            if offset < self.log_start_offset:
                raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
            for segment in list(self.segments):
                if segment.base_offset >= offset and segment is not self.segments.first:
                    self._retire(segment, delay_ms=0, unlink_later=unlink_later)
            last = self.segments.active
            if not last.active:
                last.become_active(self.config.segment_index_bytes)
            last.truncate_to(offset)
            if last.size == 0 and last.base_offset != offset:
                # Emptied: restart the active segment exactly at the new end (created before the old one goes).
                segment = self._new_segment(offset)
                self._retire(last, delay_ms=0, unlink_later=unlink_later)
                self.segments.add(segment)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self._rewritten()

    @guarded("retention", space_ok=False)
    def delete_segments(self, segments: Sequence[LogSegment], *, tiered: bool = False) -> None:
        """Remove sealed segments from the log: renamed ``.deleted`` now, unlinked after
        ``file.delete.delay.ms`` by :meth:`purge_deleted`. The log start offset moves past removed prefix,
        unless they are ``tiered`` (local retention: the whole log still starts where it did)."""
        with self.lock:
            for segment in segments:
                if segment is self.segments.active:
                    raise ValueError("the active segment is never deleted")
            try:
                for segment in segments:
                    self._retire(segment, self.config.file_delete_delay_ms)
            finally:
                self._layout_changed()
            if not tiered:
                self.log_start_offset = max(self.log_start_offset, self.segments.first.base_offset)
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
            self._layout_changed()

    @guarded("segment swap", space_ok=False)
    def replace_segments(self, old: Sequence[LogSegment], new: LogSegment) -> None:
        """Swap ``new`` (a cleaned segment, ``.cleaned``) in for the sealed segments ``old`` whose offsets it
        covers, by the crash-safe protocol of :func:`~logfs.storage.local.lifecycle.replace_segments`. If the log
        changed meanwhile (retention or a truncation removed one of ``old``, or it closed), ``new`` is discarded
        and LogfsError raised: the log is as it was."""
        with self.lock:
            if self.closed or any(s not in self.segments or s is self.segments.active for s in old):
                discard(new)
                raise LogfsError("log changed during cleaning; group skipped")

            def retire(segment: LogSegment) -> None:
                self._retire(segment, self.config.file_delete_delay_ms)

            # A failure from the commit point on (the .log renamed .swap) takes the directory offline (guarded):
            # the segments retired so far have left the list with their files, the others are still in it and
            # live on disk, and the next mount completes the swap from the .swap files. Before it, nothing
            # changed on disk but .cleaned files, which the next load (or the next cleaning) removes.
            try:
                replace_segments(self.directory, new, old, retire)
            finally:
                self._rewritten()
            self.segments.add(new)

    def _retire(self, segment: LogSegment, delay_ms: int, unlink_later: bool = False) -> None:
        """Take ``segment`` out of the log: its files renamed ``.deleted`` FIRST, then out of the segment list (a
        rename that fails leaves it in the log, live on disk, as it is in memory). Under the lock."""
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
            self._purge(segment)
        else:
            self.deleted_segments.append((self.clock.time_ms() + delay_ms, segment))

    @guarded("unlinking deleted segments", space_ok=False)
    def purge_deleted(self, now_ms: int | None = None) -> int:
        """Unlink ``.deleted`` files whose delay has passed; returns how many segments were purged."""
        now = self.clock.time_ms() if now_ms is None else now_ms
        with self.lock:
            due = [s for t, s in self.deleted_segments if t <= now]
            self.deleted_segments = [(t, s) for t, s in self.deleted_segments if t > now]
        for segment in due:
            with self.lock:
                self._purge(segment)
        return len(due)

    def _purge(self, segment: LogSegment) -> None:
        segment.delete_files()
        segment.purged = True
        close_if_unused(segment)

    def hold_pinned(self) -> None:
        """Open the files of every segment a snapshot pins (local and tiered), before the partition's directory is
        renamed for deletion: those snapshots go on reading them. Under the lock."""
        with self.lock:
            for segment in list(self.segments) + self.remote_segments:
                if segment.refs > 0:
                    segment.hold_files()

    def close_deleted(self) -> None:
        """Close a log whose directory is being deleted: each segment closes now, or when the last snapshot
        pinning it is released (open handles keep reading it)."""
        with self.lock:
            for segment in self.segments:
                segment.deleted = segment.purged = True
                close_if_unused(segment)
            for segment in self.remote_segments:
                segment.deleted = segment.purged = True
                close_if_unused(segment)
            self.closed = True

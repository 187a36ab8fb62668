"""A log's segments as an ordered set, and the one way to hold on to segments: :class:`LogSnapshot`.

Owns segment lifetimes. A segment that leaves its log (retention, compaction, truncation, a deleted partition)
is renamed, and later its files are unlinked; if a snapshot pins it, its files are opened before they go
(:meth:`LogSegment.hold_files`) and stay open while any snapshot pins it, so a reader that took a snapshot keeps
reading the bytes it saw. Everything that reads segments outside the log lock (a file handle's view, the
cleaner's pass, a flush, an upload) takes a snapshot and releases it; nothing else touches a segment's reference
count. That rule is also what lets the open-file budget close an idle segment's files
(:mod:`~logfs.storage.local.open_files`): one under neither its log's lock nor a pin is used by no one.
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterator, Protocol, Sequence

from .segment import LogSegment
from .segment_file import ReadableSegment


class PinnedLog(Protocol):
    """What a snapshot reads of its log (:class:`~logfs.storage.local.log.Log`, which imports this module)."""

    lock: threading.RLock
    closed: bool
    segments: "LogSegments"
    log_start_offset: int
    rewrite_count: int


class LogSegments:
    """Segments ordered by base offset, with floor/higher navigation (O(log n)). Each segment added gets
    ``owner``, its log's lock: from then on the open-file budget may close its files while it is idle."""

    def __init__(self, segments: Sequence[LogSegment] = (), owner=None):
        self._owner = owner
        self._list: list[LogSegment] = sorted(segments, key=lambda s: s.base_offset)
        self._bases = [s.base_offset for s in self._list]
        for segment in self._list:
            segment.owner = owner

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(list(self._list))

    def __contains__(self, segment: LogSegment) -> bool:
        i = bisect.bisect_left(self._bases, segment.base_offset)
        return i < len(self._list) and self._list[i] is segment

    def add(self, segment: LogSegment) -> None:
        segment.owner = self._owner
        i = bisect.bisect_left(self._bases, segment.base_offset)
        if i < len(self._bases) and self._bases[i] == segment.base_offset:
            self._list[i] = segment
        else:
            self._list.insert(i, segment)
            self._bases.insert(i, segment.base_offset)

    def remove(self, segment: LogSegment) -> None:
        i = bisect.bisect_left(self._bases, segment.base_offset)
        if i < len(self._list) and self._list[i] is segment:
            del self._list[i], self._bases[i]

    def floor(self, offset: int) -> LogSegment | None:
        i = bisect.bisect_right(self._bases, offset) - 1
        return self._list[i] if i >= 0 else None

    def higher(self, offset: int) -> LogSegment | None:
        i = bisect.bisect_right(self._bases, offset)
        return self._list[i] if i < len(self._list) else None

    def from_offset(self, offset: int) -> list[LogSegment]:
        """Segments that may hold offsets >= ``offset`` (the floor segment and all after it)."""
        i = max(0, bisect.bisect_right(self._bases, offset) - 1)
        return self._list[i:]

    @property
    def first(self) -> LogSegment:
        return self._list[0]

    @property
    def active(self) -> LogSegment:
        return self._list[-1]

    def as_list(self) -> list[LogSegment]:
        return list(self._list)


class LogSnapshot:
    """Segments of one log pinned at a moment (:meth:`Log.snapshot`), with the log start offset then.

    Pinned segments stay readable after retention or compaction removes them from the log: their descriptors
    are closed only once their files are unlinked and the last snapshot holding them is released. A snapshot
    can only grow, at its end (:meth:`extend`: segments rolled since). Release it once (a context manager
    does); releasing again does nothing. Its methods take the log lock; they are safe from any thread.
    """

    __slots__ = ("log", "segments", "log_start_offset", "rewrite_count", "rolled", "write_only", "__weakref__")

    def __init__(self, log: PinnedLog, segments: list[ReadableSegment], log_start_offset: int,
                 rewrite_count: int = 0):
        self.log = log
        self.segments = segments  # already pinned, under the log lock, by whoever made this
        self.log_start_offset = log_start_offset
        self.rewrite_count = rewrite_count  # the log's then: with the start, which positions this view has
        # A following snapshot (a file handle's): segments the log rolled since, pinned by the roll itself
        # (:meth:`on_roll`) and not yet taken by :meth:`extend`. So retention can never delete a segment a reader
        # has not reached yet, however fast segments roll and retention runs between its reads.
        self.rolled: list[LogSegment] | None = None
        self.write_only = False  # a handle that never reads: it needs lengths, never bytes

    def follow(self, *, write_only: bool = False) -> "LogSnapshot":
        """Make this snapshot pin every segment the log rolls from now on (caller holds the log lock)."""
        self.rolled = []
        self.write_only = write_only
        self.log.followers.add(self)
        return self

    def on_roll(self, segment: LogSegment) -> None:
        """The log rolled ``segment`` (under its lock): pin it for this snapshot, to be taken by :meth:`extend`. A
        write-only snapshot lets go, at each roll, of the segments that left the log (it never reads them: their
        lengths are known from memory), so a writer that keeps its file open pins no freed disk."""
        segment.refs += 1
        self.rolled.append(segment)
        if self.write_only:
            for pinned in [s for s in self.segments[:-1] + self.rolled[:-1] if s.deleted]:
                if any(pinned is s for s in self.segments[:-1]):
                    self.segments.remove(pinned)
                else:
                    self.rolled.remove(pinned)
                unpin(pinned)

    def catch_up(self, segments: list[ReadableSegment]) -> None:
        """Pin, for :meth:`extend`, the segments of ``segments`` (the log's view now) that start at or after the end
        of this snapshot's last one: a follower mount's log grows by tiered segments, not by rolls. Under the log
        lock."""
        known = self.rolled or self.segments
        end = known[-1].next_offset if known else -1
        for segment in segments:
            if segment.base_offset >= end and not any(segment is k for k in known[-2:]):
                segment.refs += 1
                self.rolled.append(segment)

    def extend(self) -> list[LogSegment]:
        """Pin the log's segments that start after this snapshot's last one (rolled since); returns them."""
        log = self.log
        with log.lock:
            if log.closed and not self.rolled:
                return []
            if self.rolled:
                newer, self.rolled = self.rolled, []
            else:
                newer = []
            last = (newer or self.segments)[-1].base_offset if (newer or self.segments) else -1
            more = [] if log.closed else [s for s in log.segments.from_offset(last) if s.base_offset > last]
            for segment in more:
                segment.refs += 1
            newer += more
            self.segments.extend(newer)  # (under the lock: :meth:`clone` reads the list from another thread)
        return newer

    def clone(self, *, write_only: bool = False) -> "LogSnapshot":
        """A second snapshot of the same segments and start (its own pins, following the log's rolls from now
        on): a handle opened with the positions of handles already open (fuse/inodes.py)."""
        log = self.log
        with log.lock:
            segments = list(self.segments) + list(self.rolled or ())
            for segment in segments:
                segment.refs += 1
            twin = LogSnapshot(log, segments, self.log_start_offset, self.rewrite_count)
            return twin.follow(write_only=write_only) if self.rolled is not None else twin

    def drop(self, segment: LogSegment) -> bool:
        """Unpin one segment that left the log, before the whole snapshot is released (a reader that has read past
        it: its disk is freed now). Never the last one (:meth:`extend` goes on from it). Whether it was dropped."""
        with self.log.lock:
            for i, pinned in enumerate(self.segments[:-1]):
                if pinned is segment:
                    del self.segments[i]
                    unpin(segment)
                    return True
        return False

    def release(self) -> None:
        with self.log.lock:
            segments, self.segments = self.segments, []
            if self.rolled is not None:
                self.log.followers.discard(self)
                segments += self.rolled
                self.rolled = []
            for segment in segments:
                unpin(segment)

    def __enter__(self) -> "LogSnapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def pin(log: PinnedLog, segments: list[LogSegment]) -> LogSnapshot:
    """A snapshot of ``segments`` (a selection of ``log``'s segments). Caller holds the log lock."""
    for segment in segments:
        segment.refs += 1
    return LogSnapshot(log, segments, log.log_start_offset, log.rewrite_count)


def unpin(segment: LogSegment) -> None:
    segment.refs -= 1
    close_if_unused(segment)


def close_if_unused(segment: LogSegment) -> None:
    """Close a segment whose files are gone once no snapshot pins it (caller holds the log lock)."""
    if segment.refs <= 0 and segment.purged and not segment.closed:
        segment.close()

"""One partition: an ordered set of segments, its offsets, and the append/read/roll/flush/truncate paths.

Owns offset assignment (contiguous, from the log end offset), batching of appended records (and when a small
append grows the active segment's last batch in place instead), the roll
decision (size, time minus jitter, full index, relative-offset overflow), the ``flush.messages`` policy (as
:attr:`Log.flush_due`: an append never fsyncs), the log start offset and recovery point, and what leaves it
(truncation, retention's deletion, the cleaner's swap), under its lock. The ``.deleted`` rename and the later
unlink are its :class:`~logfs.storage.local.removal.RetiredSegments`' (``retired``).

Thread safety: one writer at a time (``lock``) for append, roll, truncate, delete and config changes.
``flush`` takes the lock only to snapshot and to publish the recovery point, so an fsync never blocks an
append. Reads outside the lock go through a :class:`~logfs.storage.local.segments.LogSnapshot` (:meth:`snapshot`)
and only touch published bytes. :attr:`layout_version` changes whenever the segment list or the log start offset
does, so a reader may cache what it derives from the layout.

The module is longer than 500 lines because one partition's offsets, append batching, roll, flush, snapshots and
the segments leaving it (truncation, deletion, swaps) share one lock and one set of invariants (the log end offset,
the log start offset, the recovery point, the pins of the segments); what keeps state of its own is a collaborator
(the retired segments, the tail batch, the segment list) or a module of functions (lifecycle). Kafka's UnifiedLog
and LocalLog hold the same together.
"""

from __future__ import annotations

import bisect
import operator
import os
import struct
from itertools import accumulate, repeat
import threading
import weakref
from typing import Callable, Iterator, Sequence

from ..format import lines
from . import tail_batch
from ..format import records as rec
from ..format import twins
from ..format.speedups import C as _speedups
from ..clock import SYSTEM_CLOCK, Clock
from ..config import LogConfig
from ..counters import PartitionCounters
from ..errors import LogfsError, NoSuchTopicError, OffsetOutOfRangeError, RecordTooLargeError, StorageIOError
from ..failure import SPACE_ERRNOS, LogDir, guarded
from ..format.lines import LineStats
from .open_files import OpenFiles
from .lifecycle import discard, open_segment, remove_segment_files, replace_segments
from .segment import LogSegment
from .segment_file import ReadableSegment
from .removal import RetiredSegments
from .segments import LogSegments, LogSnapshot, close_if_unused, pin
from .tail_batch import PAGE_SIZE, TAIL_BATCH_CAP  # noqa: F401 (PAGE_SIZE: re-exported for tests)
from .txn_index import AbortedRanges

# Appended lines are grouped into batches of about this many bytes: small enough that a read positioned inside
# a batch renders little (64 KiB renders in ~20 us with the C accelerator), large enough that per-batch costs
# (header, CRC call, pwrite, index check) stay small: 16 KiB -> 64 KiB took the engine's append from 230 to
# 295 MB/s here.
TARGET_BATCH_BYTES = 64 * 1024
_RECORD_OVERHEAD = 12
_BASE_OFFSET = struct.Struct(">q")


class Log:
    def __init__(
        self,
        directory: str,
        topic: str,
        partition: int,
        config: LogConfig,
        segments: Sequence[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        clock: Clock = SYSTEM_CLOCK,
        log_dir: LogDir | None = None,
        open_files: OpenFiles | None = None,
    ):
        self.directory = directory
        # The open-file budget its segments open their files within (the manager's; alone, its segments' own).
        self.open_files = open_files if open_files is not None else (
            segments[0].open_files if segments else OpenFiles())
        # The log directory's health (storage/failure.py): a disk error takes it offline, and every method that
        # touches the disk is refused (EIO) from then on, until the next mount recovers it.
        self.log_dir = log_dir if log_dir is not None else LogDir(os.path.dirname(os.path.abspath(directory)))
        self.topic = topic
        self.partition = partition
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.segments = LogSegments(segments, owner=self.lock)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        # Held by whatever rewrites sealed segments (the cleaner, the compression of sealed segments) for a whole
        # pass: they write the same .cleaned names, so one at a time per log.
        self.rewrite_lock = threading.Lock()
        self.last_append_ms = max((s.largest_timestamp for s in segments), default=clock.time_ms())
        self.last_flush_ms = clock.time_ms()
        self.on_roll: Callable[[LogSegment], None] | None = None
        self.retired = RetiredSegments(self.segments, clock)  # segments that left, until their purge
        self.closed = False
        self._layout_version = 0
        # Bumped whenever records already in the log change their place in its text view without the log start
        # moving: a segment swap (compaction: records removed from the middle) or a truncation. With the log
        # start offset and the line format, it says whether two views give the same positions (``positions_key``).
        self.rewrite_count = 0
        # Tiered segments (read-only, logfs.storage.tiered.manager publishes them): the view shows those below the first
        # local segment, then the local ones; the log start offset is then the whole log's.
        self.remote_segments: list[ReadableSegment] = []
        # The snapshots of open file handles: each pins the segments the log rolls, until its reader reaches them
        self.followers: weakref.WeakSet = weakref.WeakSet()
        # A follower mount's log (service/follower.py): every record is tiered, and the one local segment is empty,
        # at the tiered log's end (so the log end offset is the writer's remote_log_end_offset): set_remote moves it.
        self.follower = False
        self.counters = PartitionCounters(self.log_end_offset)  # traffic, for the metrics

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def layout_version(self) -> int:
        """Changes whenever the segment list or the log start offset changes (not on appends)."""
        return self._layout_version

    def _layout_changed(self) -> None:
        self._layout_version += 1

    def _rewritten(self) -> None:
        """Records already in the log were removed or replaced (a swap, a truncation): under the lock."""
        self.rewrite_count += 1
        self._layout_version += 1

    # -- offsets -----------------------------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return self.segments.active.next_offset

    @property
    def active_segment(self) -> LogSegment:
        return self.segments.active

    @property
    def unflushed_messages(self) -> int:
        return self.log_end_offset - self.recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending ---------------------------------------------------------------------------------
    @guarded("append")
    def append(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[rec.Headers] | None = None,
        *,
        has_nulls: bool | None = None,
        require_keys: bool = False,
    ) -> tuple[int, int]:
        """Append records; returns (first offset, last offset). All-or-nothing validation happens before any
        byte is written: a record over ``max.message.bytes`` (or one that cannot fit a segment) raises
        :class:`RecordTooLargeError` and nothing is appended. ``has_nulls=False`` promises no value is None
        (saves a scan on the bulk path); None means "find out". ``require_keys``: :func:`lines.check_keys` too."""
        if not values:
            raise ValueError("nothing to append")
        if has_nulls is None:
            has_nulls = None in values
        # Record sizes (value + key bytes), with C-level map/accumulate. (Plain lines take append_lines.)
        sizes = list(map(_len_or_zero, values)) if has_nulls else list(map(len, values))
        if keys:
            sizes = [a + b for a, b in zip(sizes, map(_len_or_zero, keys))]
        lines.check_record_size(self.config, max(sizes))
        if require_keys:
            lines.check_keys(self.config, keys)
        target = self._batch_target()
        # Cut points from cumulative record sizes (payload + per-record overhead, summed in C): each batch takes
        # records up to ``target`` bytes (at least one record).
        cumulative = list(accumulate(map(operator.add, sizes, repeat(_RECORD_OVERHEAD)), initial=0))
        n = len(values)

        def batches(now: int) -> Iterator[tuple[Callable[[int], bytes], LineStats]]:
            start = 0
            while start < n:
                end = bisect.bisect_right(cumulative, cumulative[start] + target, start + 1) - 1
                end = min(max(end, start + 1), n)
                vals = values[start:end]
                ks = keys[start:end] if keys else None
                hs = headers[start:end] if headers else None
                if not has_nulls and not keys:  # the common case: plain lines
                    payload = cumulative[end] - cumulative[start] - (end - start) * _RECORD_OVERHEAD
                    stats = LineStats(end - start, 0, 0, 0, payload)
                else:
                    stats = lines.line_stats(vals, ks)
                yield (lambda base, v=vals, k=ks, h=hs: rec.build_batch(base, now, v, k, headers=h)), stats
                start = end

        return self._append_batches(batches, timestamp_ms)

    @guarded("append")
    def append_lines(self, prefix: bytes, data, end: int, headers: rec.Headers | None = None) -> tuple[int, int]:
        """Append the lines of ``prefix + data[:end]`` (``data[end - 1]`` is the last line's ``\n``; ``prefix``,
        the start of the first line, holds none), one record per line in the topic's line format
        (:mod:`logfs.storage.format.lines`), the ``\n`` not included, each with the record ``headers`` if given. All-or-
        nothing like :meth:`append`; a compacted topic also refuses the whole call if a line has no key
        (:class:`InvalidRecordError`). Plain lines without headers take the bulk path: with the C accelerator,
        one call cuts and encodes whole batches straight from ``data`` (no list of lines, no copy of the input;
        without it, its twin gives the same bytes); the others go through :meth:`append` (which never grows a tail batch: that is for headerless records)."""
        c = self.config
        if headers or c.key_separator or c.null_marker is not None:  # not the bulk path
            fmt = lines.LineFormat.of(c)
            values, keys = fmt.parse_lines((prefix + bytes(data[: end - 1])).split(b"\n"))
            has_nulls = None if fmt.null_marker is not None else False
            return self.append(values, keys, headers=[headers] * len(values) if headers else None,
                               has_nulls=has_nulls, require_keys=True)
        if end + len(prefix) < TAIL_BATCH_CAP:
            with self.lock:
                grown = tail_batch.grow(self, prefix, data, end)
                if grown is not None:
                    return grown
        encoded, longest = (_speedups or twins).encode_lines(prefix, data, end, self._batch_target())
        lines.check_record_size(self.config, longest)
        lines.check_keys(self.config, None)

        def batches(now: int):
            for buf, count, payload in encoded:
                stats = LineStats(count, 0, 0, 0, payload)
                yield (lambda base, b=buf, c=count: rec.finish_batch(b, base, c, now)), stats

        with self.lock:
            first, last = self._append_batches(batches, None)
            batch, count, _ = encoded[-1]
            tail_batch.keep(self, batch, count, last)
            return first, last

    def _batch_target(self) -> int:
        return min(TARGET_BATCH_BYTES, max(self.config.segment_bytes // 2, 1))

    def _append_batches(self, batches, timestamp_ms: int | None) -> tuple[int, int]:
        """The write loop of both append paths: under the lock, ``batches(now)`` yields ``(build(base_offset) ->
        batch, stats)`` per batch; each is stamped with the log end offset, rolled for, and written. A disk error
        takes back the batches of this call already written (unlinking nothing: that is for :meth:`purge_deleted`)."""
        with self.lock:
            now = self.clock.time_ms() if timestamp_ms is None else timestamp_ms
            first = self.log_end_offset
            try:
                for build, stats in batches(now):
                    batch = build(self.log_end_offset)
                    header = rec.parse_header(batch)
                    if len(batch) > self.config.segment_bytes:
                        raise RecordTooLargeError(f"batch of {len(batch)} bytes exceeds segment.bytes")
                    self._maybe_roll(len(batch), header.last_offset)
                    self.segments.active.append(batch, header, stats)
            except (StorageIOError, OSError) as exc:
                # All or nothing: batches of this call already written (a disk that filled up in the middle, a
                # roll that could not create its segment) are taken back, so a caller that retries never
                # duplicates records. (Any other disk error takes the directory offline: nothing is undone, the
                # next mount recovers the log from its recovery point.)
                if exc.errno in SPACE_ERRNOS and self.log_end_offset > first:
                    self.truncate_to(first, unlink_later=True)
                raise
            self.last_append_ms = now  # the records' own timestamp, so st_mtime is the same after a reload
            return first, self.log_end_offset - 1

    @property
    def flush_due(self) -> bool:
        """``flush.messages`` records are unflushed: the appender calls :meth:`flush` next, in a thread that may
        block (an append never fsyncs itself)."""
        return self.segments.active.next_offset - self.recovery_point >= self.config.flush_messages

    @guarded("append")
    def append_raw_batch(self, batch: bytes) -> tuple[int, int]:
        """Append an already-encoded v2 batch (validated), re-stamping its base offset (tests, tools)."""
        with self.lock:
            base = self.log_end_offset
            batch = rec.with_base_offset(batch, base)
            header = rec.validate(batch)
            from .segment import batch_stats

            self._maybe_roll(len(batch), header.last_offset)
            self.segments.active.append(batch, header, batch_stats(batch))
            self.last_append_ms = self.clock.time_ms()
            return base, header.last_offset

    @guarded("append")
    def append_staged(self, batches, timestamp_ms: int) -> tuple[int, int]:
        """Append whole plain batches as one publish (the Spark sink's commit: :mod:`.transactions`); returns
        (first offset, last offset). ``batches`` is a list of (writable copy of a batch's 61-byte header, its
        records, its LineStats), each batch final but for its base offset, which is stamped here (the CRC does not
        cover it), so that the records get contiguous offsets from the log end offset. The batches go into ONE
        segment (rolled first if they do not fit the active one), and no reader sees part of them
        (:meth:`LogSegment.append_group`). Raises RecordTooLargeError, before anything is written, if they cannot
        fit any one segment."""
        total = sum(len(h) + len(b) for h, b, _ in batches)
        records = sum(rec.parse_header(h).records_count for h, _, _ in batches)
        if total > self.config.segment_bytes:
            raise RecordTooLargeError(f"{total} bytes of batches for one partition exceed segment.bytes="
                                      f"{self.config.segment_bytes}")
        with self.lock:
            if self.closed:
                raise NoSuchTopicError(f"partition {self.topic}/{self.partition} was deleted")
            self._maybe_roll(total, self.log_end_offset + records - 1)
            if not self._group_fits(len(batches)):
                self.roll()
                if not self._group_fits(len(batches)):
                    raise RecordTooLargeError(f"{len(batches)} batches need more index entries than a segment "
                                              f"holds (segment.index.bytes={self.config.segment_index_bytes})")
            first = offset = self.log_end_offset
            group = []
            for head, body, stats in batches:
                _BASE_OFFSET.pack_into(head, 0, offset)
                header = rec.parse_header(head)
                group.append((head, body, header, stats))
                offset = header.next_offset
            self.segments.active.append_group(group)
            self.last_append_ms = timestamp_ms
            return first, offset - 1

    def _group_fits(self, count: int) -> bool:
        """Whether the active segment's indexes have room for the entries of ``count`` more batches."""
        active = self.segments.active
        return (active.offset_index.max_entries - active.offset_index.entries >= count
                and active.time_index.max_entries - 1 - active.time_index.entries >= count)

    def _maybe_roll(self, batch_size: int, last_offset: int) -> None:
        active = self.segments.active
        c = self.config
        if active.should_roll(batch_size, c.segment_bytes, c.segment_ms, self.clock.time_ms(), last_offset):
            self.roll()

    @guarded("roll")
    def roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the log end offset (no-op on an empty active
        segment). Returns the new active segment.

        The new segment's files are created first: if that fails (a full disk), they are removed and the active
        segment is as it was. Sealing the old one comes next; if that fails, the new segment's files are
        removed and the directory goes offline (the next mount seals the old segment again)."""
        with self.lock:
            old = self.segments.active
            if old.size == 0:
                return old
            new_base = old.next_offset
            segment = self._new_segment(new_base, jittered=True)
            try:
                old.on_become_inactive()
            except (OSError, StorageIOError) as exc:
                _discard_quietly(segment)
                raise self.log_dir.io_error(exc, f"sealing segment {old.base_offset} of {self.name}",
                                            space_ok=False) from exc
            self.add_rolled(segment)
            if self.on_roll is not None:
                self.on_roll(old)
            return segment

    def add_rolled(self, segment: LogSegment) -> None:
        """``segment`` (its predecessor sealed) becomes the active one, and open handles get it: a roll of this log's
        own, or one a running broker made (its directory read in place, :mod:`logfs.storage.broker`). Under the
        lock."""
        self.segments.add(segment)
        for snapshot in list(self.followers):
            snapshot.on_roll(segment)
        self._layout_changed()

    def forget(self, segments: Sequence[LogSegment], replaced_by: LogSegment | None = None) -> None:
        """Sealed segments that another writer removed (a running broker's retention, read in place) leave the log,
        which starts at its first remaining segment then; with ``replaced_by``, its cleaner swapped that segment in
        for them (records removed from the middle: positions after them change). Their files are not this log's to
        rename or unlink. One a snapshot pins stays readable for it, and closes when released. Under the lock."""
        for segment in segments:
            self.segments.remove(segment)
            segment.deleted = segment.purged = True
            close_if_unused(segment)
        if replaced_by is not None:
            self.segments.add(replaced_by)
            self._rewritten()
        self.log_start_offset = max(self.log_start_offset, self.segments.first.base_offset)
        self._layout_changed()

    def _new_segment(self, base: int, *, jittered: bool = False) -> LogSegment:
        """A new segment's files at ``base``. On failure none of them stays (an empty segment left on disk past
        the log end would be loaded as the log's end); if they cannot be removed, the directory goes offline."""
        try:
            return open_segment(self.directory, base, self.config, created_ms=self.clock.time_ms(),
                                jittered=jittered, open_files=self.open_files)
        except (OSError, StorageIOError) as exc:
            try:
                remove_segment_files(self.directory, base)
            except OSError as again:
                raise self.log_dir.io_error(again, f"removing the half-created segment {base} of {self.name}",
                                            space_ok=False) from exc
            raise

    @guarded("time-based roll")
    def maybe_roll_for_time(self, now_ms: int | None = None) -> bool:
        """Roll an idle active segment whose age passed ``segment.ms`` minus jitter (the service calls this, for
        every partition on every tick, with the time of the tick: the common case, not due, is decided without
        the lock)."""
        active = self.segments.active
        based = active.rolling_based_timestamp
        now = self.clock.time_ms() if now_ms is None else now_ms
        if active.size == 0 or (now - (active.created_ms if based is None else based)
                                <= self.config.segment_ms - active.roll_jitter_ms):
            return False  # (read without the lock: an append meanwhile only makes the segment younger)
        with self.lock:
            active = self.segments.active
            c = self.config
            if active.size > 0 and active.should_roll(0, c.segment_bytes, c.segment_ms, self.clock.time_ms(),
                                                       active.next_offset):
                self.roll()
                return True
            return False

    # -- durability --------------------------------------------------------------------------------
    @guarded("flush", space_ok=False)
    def flush(self, up_to: int | None = None) -> int:
        """fsync every segment holding offsets below ``up_to`` (default: the log end offset), then advance
        the recovery point. The lock is held only to snapshot and publish, never during the fsync."""
        with self.lock:
            target = self.log_end_offset if up_to is None else min(up_to, self.log_end_offset)
            if target <= self.recovery_point:
                return self.recovery_point
            pinned = pin(self, [s for s in self.segments.from_offset(self.recovery_point) if s.base_offset < target])
            self.segments.active.tail = None  # the bytes about to be synced are never rewritten
        with pinned:
            for s in pinned.segments:
                if not s.closed:
                    s.flush()
        with self.lock:
            self.recovery_point = max(self.recovery_point, target)
            self.last_flush_ms = self.clock.time_ms()
            return self.recovery_point

    # -- tiers -------------------------------------------------------------------------------------
    def set_remote(self, segments: list[ReadableSegment], log_start_offset: int) -> None:
        """Publish the tiered segments (ascending) and the whole log's start offset. On a follower's log, also move
        its empty local segment to the tiered log's end, and hand the new segments to open handles, in one step."""
        with self.lock:
            for segment in segments:
                segment.owner = self.lock
            self.remote_segments = list(segments)
            self.log_start_offset = log_start_offset
            if self.follower:
                self._follow_to(segments[-1].next_offset if segments else log_start_offset)
            self._layout_changed()

    def _follow_to(self, end: int) -> None:
        active = self.segments.active
        if active.size or len(self.segments) != 1 or end <= active.base_offset:
            return
        segment = self._new_segment(end)
        self.segments.add(segment)
        self.retired.retire(active, delay_ms=0)
        for snapshot in list(self.followers):
            snapshot.catch_up(self.view_segments())

    def view_segments(self) -> list[ReadableSegment]:
        """What the whole log reads from: tiered segments below the first local one, then the local ones (a
        segment both tiered and local is read locally). Caller holds the lock."""
        local = self.segments.as_list()
        if not self.remote_segments:
            return local
        first = local[0].base_offset
        return [s for s in self.remote_segments if s.next_offset <= first] + local

    # -- reading -----------------------------------------------------------------------------------
    def measure_aborted(self) -> None:
        """Ready the ``read_uncommitted`` view (``logfs.isolation.level``): each segment that Kafka's aborted
        transactions reach into counts the lines of their batches (:meth:`LogSegment.measure_aborted`), through a
        snapshot that pins them, the tiered ones too (through the block cache). It reads those segments whole: the
        loader calls it, or a worker thread before the setting is applied, never a request."""
        with self.snapshot(tiers=True) as snapshot:
            for segment in snapshot.segments:
                if segment.aborted is not None:
                    segment.measure_aborted()

    def snapshot(self, *, sealed_only: bool = False, tiers: bool = False, follow: bool = False,
                 write_only: bool = False) -> LogSnapshot:
        """The segments now (only the sealed ones with ``sealed_only``; tiered ones too with ``tiers``), pinned
        until the snapshot is released: they stay readable whatever retention, compaction or truncation does
        meanwhile. With ``follow`` (a file handle's view), every segment rolled from now on is pinned too, at the
        roll, until the snapshot takes it (:meth:`LogSnapshot.extend`) or is released."""
        with self.lock:
            segments = self.view_segments() if tiers else self.segments.as_list()
            snapshot = pin(self, segments[:-1] if sealed_only else segments)
            return snapshot.follow(write_only=write_only) if follow else snapshot

    def read(self, offset: int, max_bytes: int = 1 << 20, max_records: int | None = None) -> list[rec.Record]:
        """Records from ``offset`` (or the first retained one after it, at a compacted gap), up to about
        ``max_bytes`` of batches; at least one record if any remains. Raises OffsetOutOfRangeError below the
        log start offset or past the log end offset."""
        with self.lock:
            start, end = self.log_start_offset, self.log_end_offset
            if offset < start or offset > end:
                raise OffsetOutOfRangeError(offset, start, end)
            segments = [s for s in self.view_segments() if s.next_offset > offset] or self.segments.as_list()[-1:]
            pinned = pin(self, segments)
        out: list[rec.Record] = []
        read_bytes = 0
        with pinned:
            for segment in segments:
                found = segment.translate_offset(offset)
                if found is None:
                    continue
                for _, header, buf, at in segment.batches_from(found[0]):
                    for r in rec.decode(buf, at, header.size):
                        if r.offset >= offset:
                            out.append(r)
                    read_bytes += header.size
                    if out and (read_bytes >= max_bytes or (max_records and len(out) >= max_records)):
                        return out[:max_records] if max_records else out
        return out[:max_records] if max_records else out

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Earliest offset whose timestamp >= ``timestamp`` (time index, then a bounded scan), or None."""
        with self.lock:
            start = self.log_start_offset
            pinned = pin(self, [s for s in self.view_segments() if s.size and s.max_timestamp >= timestamp])
        with pinned:
            for segment in pinned.segments:
                found = segment.find_offset_by_timestamp(timestamp, start)
                if found is not None:
                    return found
        return None

    # -- start offset and closing -----------------------------------------------------------------
    def increment_log_start_offset(self, offset: int) -> None:
        with self.lock:
            if offset > self.log_end_offset:
                raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
            self.log_start_offset = max(self.log_start_offset, offset)
            self.recovery_point = max(self.recovery_point, self.log_start_offset)  # as Kafka, and as loaded
            self._layout_changed()

    # -- segments leaving (truncation, retention, the cleaner's swap; the purge is RetiredSegments') --------
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
                    self.retired.retire(segment, delay_ms=0, unlink_later=unlink_later)
            last = self.segments.active
            if not last.active:
                last.become_active(self.config.segment_index_bytes)
            last.truncate_to(offset)
            if last.size == 0 and last.base_offset != offset:
                # Emptied: restart the active segment exactly at the new end (created before the old one goes).
                segment = self._new_segment(offset)
                self.retired.retire(last, delay_ms=0, unlink_later=unlink_later)
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
                    self.retired.retire(segment, self.config.file_delete_delay_ms)
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
        and LogfsError raised: the log is as it was.

        ``new`` spans the offsets of ``old``: Kafka's aborted transactions reaching into them reach into it (the
        compressor keeps their batches; compaction removed them, and the ranges then cover nothing). A
        ``read_uncommitted`` log measures its aborted batches now, before the lock, as the loader does."""
        new.aborted = AbortedRanges.union(s.aborted for s in old)
        if self.config.read_uncommitted:
            new.measure_aborted()
        with self.lock:
            if self.closed or any(s not in self.segments or s is self.segments.active for s in old):
                discard(new)
                raise LogfsError("log changed during cleaning; group skipped")

            def retire(segment: LogSegment) -> None:
                self.retired.retire(segment, self.config.file_delete_delay_ms)

            # A failure from the commit point on (the .log renamed .swap) takes the directory offline (guarded):
            # the segments retired so far have left the list with their files, the others are still in it and
            # live on disk, and the next mount completes the swap from the .swap files. Before it, nothing
            # changed on disk but .cleaned files, which the next load (or the next cleaning) removes.
            try:
                replace_segments(self.directory, new, old, retire)
            finally:
                self._rewritten()
            self.segments.add(new)

    @guarded("unlinking deleted segments", space_ok=False)
    def purge_deleted(self, now_ms: int | None = None) -> int:
        """Unlink ``.deleted`` files whose delay has passed; returns how many segments were purged."""
        return self.retired.purge_due(self.clock.time_ms() if now_ms is None else now_ms, self.lock)

    @property
    def deleted_segments(self) -> list[tuple[int, LogSegment]]:
        """The segments that left the log and wait for their purge: (unlink due ms, segment)."""
        return self.retired.pending

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

    def close(self) -> None:
        """Flush and close every segment (the active one's indexes are trimmed). A log of an offline directory
        is closed without touching its disk: the next mount recovers it."""
        with self.lock:
            if self.closed:
                return
            if self.log_dir.offline:
                for segment in self.segments:
                    segment.close_readonly()
                self.closed = True
                return
            self.flush()
            for segment in self.segments:
                segment.close()
            self.purge_deleted(now_ms=1 << 62)
            self.closed = True

    def close_without_flush(self) -> None:
        with self.lock:
            for segment in self.segments:
                segment.close()
            self.closed = True


def _discard_quietly(segment: LogSegment) -> None:
    """Remove a segment just created that the log will not use (its removal failing changes nothing more)."""
    try:
        discard(segment)
    except (OSError, StorageIOError):
        pass


def _len_or_zero(value: bytes | None) -> int:
    return 0 if value is None else len(value)



"""One log segment: a ``.log`` file of v2 batches and its three sparse indexes.

Owns appending batches at the end of one file (and writing the last one grown in place: :class:`~logfs.storage.local.tail_batch.TailBatch`,
:meth:`LogSegment.grow_tail`), the sparse index cadence (an entry once more than
``index.interval.bytes`` have been appended since the last one), translating an offset or a timestamp to a
file position (index lookup, then a forward scan bounded by the interval), truncation, and the roll-time
bookkeeping. It never decides *when* to roll; the log does. Loading and recovery are its recovery routine's
(:mod:`~logfs.storage.local.segment_recovery`); segments are opened through :mod:`~logfs.storage.local.lifecycle`.
The reading of its ``.log`` by ``pread`` (the walk over its batches) is
:class:`~logfs.storage.local.segment_file.SegmentFile`'s, and its readers see it through
:class:`~logfs.storage.local.segment_file.ReadableSegment`, as a tiered segment.

Thread safety: mutation requires the owning log's writer lock. ``read``/``batches_from``/``translate_offset``
only touch bytes below the published ``size`` and may run in other threads concurrently with an append.
"""

from __future__ import annotations

import errno as _errno
import os

from ..format import records as rec
from ..errors import StorageIOError
from ..format.lines import ZERO_STATS, LineStats
from .index import OffsetIndex, TimeIndex, ViewIndex
from .open_files import OpenFiles, open_unit, release_unit
from .segment_file import SegmentFile, find_offset_by_timestamp, translate_offset
from .tail_batch import TailBatch
from .txn_index import AbortedBatches
from .segment_recovery import SegmentRecovery, batch_stats  # noqa: F401  (batch_stats: its callers import it here)

from ..names import (  # noqa: F401 (re-exported: the segment's own file names)
    ALL_SUFFIXES, CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, SWAP_SUFFIX,
    TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix,
)


class LogSegment(SegmentFile):
    """One segment of a log: its ``.log`` (read as a :class:`SegmentFile`, by pread), its three indexes, and its
    in-memory state; recovered by a :class:`SegmentRecovery` routine. Read through the :class:`ReadableSegment`
    seam, as a tiered segment is."""

    aborted = None  # AbortedRanges of Kafka's aborted transactions reaching into this segment (txn_index.py)
    # AbortedBatches: the batches those transactions hold in it and their lines, once measured
    # (:meth:`measure_aborted`, for a read_uncommitted view)
    uncommitted = None
    # A .txnindex of its own beside it (a Kafka broker wrote it, or the cleaner wrote it for a segment it rewrote; the
    # loader says so, the cleaner sets it on what it writes)
    has_txn_index = False
    # The lowest position whose bytes were rewritten other than by a tail batch's growth (an undone append, a
    # truncation) since a copy of the segment last looked (storage/moves.py, which resets it): it copies again from
    # there. Under the log's lock.
    rewritten = 1 << 62
    open_flags = os.O_RDWR  # how its .log opens (read-only: a broker's segment, read in place)

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        roll_jitter_ms: int = 0,
        created_ms: int = 0,
        suffix: str = "",
        active: bool = True,
        max_view_index_size: int | None = None,
        create: bool = True,
        open_files: OpenFiles | None = None,
        read_only: bool = False,
        index_stem: str | None = None,
    ):
        """``read_only``: a segment another process writes (a running broker's, :mod:`logfs.storage.broker`): its
        ``.log`` is opened read-only and never created, and its indexes live at ``index_stem`` (logfs's cache)
        instead of beside it."""
        self.directory = directory
        # The open-file budget its .log and indexes open within (its log's; alone, one of its own).
        self.open_files = files = open_files if open_files is not None else OpenFiles()
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self.created_ms = created_ms
        self.suffix = suffix
        self.owner = None  # its log's lock, once a log holds it (LogSegments sets it): lets the budget close it
        self.refs = 0  # snapshots pinning it (segment_set: the only code that counts them)
        self.deleted = False  # retired from its log (renamed .deleted)
        self.purged = False  # its files are unlinked
        self.closed = False  # closed for good (its log closed, or it was purged and unpinned)
        stem = os.path.join(directory, filename_prefix(base_offset))
        self.log_path = stem + LOG_SUFFIX + suffix
        with files.lock:
            # (create=False: a segment that must exist, opened by another process than its log's: were it renamed
            # away meanwhile, creating it again would leave an empty segment where the log has none)
            if read_only:
                self.open_flags = os.O_RDONLY
            fd = os.open(self.log_path, self.open_flags | (os.O_CREAT if create and not read_only else 0), 0o644)
            files.admit(self)
            self.fd = fd
        if max_view_index_size is None:
            max_view_index_size = ViewIndex.bytes_for(max_index_size)
        opened = []
        try:  # (on EMFILE, ENOSPC...: release what was opened, never leak descriptors)
            self.size = os.fstat(fd).st_size
            istem, icreate = (index_stem, True) if index_stem is not None else (stem, create)
            self.offset_index = OffsetIndex(istem + INDEX_SUFFIX + suffix, base_offset, max_index_size, active=active,
                                            create=icreate, open_files=files)
            opened.append(self.offset_index)
            self.time_index = TimeIndex(istem + TIME_INDEX_SUFFIX + suffix, base_offset, max_index_size,
                                        active=active, create=icreate, open_files=files)
            opened.append(self.time_index)
            self.view_index = ViewIndex(istem + VIEW_INDEX_SUFFIX + suffix, base_offset, max_view_index_size,
                                        active=active, create=icreate, open_files=files)
        except BaseException:
            for index in opened:
                index.close_handler()
            release_unit(self)
            self.fd, self.closed = -1, True
            raise
        for index in opened + [self.view_index]:
            index.segment = self
        self.active = active
        self.bytes_since_last_index_entry = 0
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.rolling_based_timestamp: int | None = None
        self.stats = ZERO_STATS
        self.next_offset = base_offset
        self.tail: TailBatch | None = None  # the last batch, while it may grow (set by the log, which decides)

    # -- the descriptor, opened on use ---------------------------------------------------------------
    # ``fd`` is an attribute while the .log is open (-1 once closed for good). The open-file budget
    # (:mod:`~logfs.storage.local.open_files`) may close it while the segment is idle; the next use of ``fd`` opens
    # the file again by its path (:meth:`__getattr__`), at no cost to a use while it is open.
    fd_attr = "fd"

    def __getattr__(self, name: str):
        if name == "fd":
            return open_unit(self, self.log_path)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def segment(self) -> "LogSegment":
        """The segment a unit of the open-file budget belongs to: this one, for its .log descriptor."""
        return self

    def release(self) -> None:
        """Close the descriptor and unmap the indexes now; they open again on their next use. For the segment's
        owner only (the loader, or a caller holding its log's lock, with no snapshot pinning it)."""
        if self.closed:
            return
        release_unit(self)
        for index in (self.offset_index, self.time_index, self.view_index):
            index.release()

    def hold_files(self) -> None:
        """Open the descriptors of the .log and of the indexes that have entries, before the files are renamed away or
        unlinked while a snapshot pins the segment: it keeps reading them through these. Under the log's
        lock; the caller then marks it ``deleted``, so the budget never closes them."""
        if self.closed:
            return
        self.fd  # noqa: B018 (opens it)
        for index in (self.offset_index, self.time_index, self.view_index):
            if index.entries:
                index.hold()

    # -- appending -------------------------------------------------------------------------------
    def append(self, batch: bytes, header: rec.BatchHeader, stats: LineStats) -> None:
        self.tail = None
        self.recent = True
        position = self.size
        indexes = (self.offset_index, self.time_index, self.view_index)
        # What a failed append (ENOSPC...) rolls back: index entries added for this batch, and the bookkeeping.
        # (An index is read for its mark only when an entry is added: an append without one maps nothing.)
        saved = (None, self.max_timestamp, self.offset_of_max_timestamp, self.bytes_since_last_index_entry)
        try:
            if self.bytes_since_last_index_entry > self.index_interval_bytes:
                saved = ([index.mark() for index in indexes],) + saved[1:]
                self.offset_index.append(header.last_offset, position)
                if self.max_timestamp < header.max_timestamp:
                    self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
                self.view_index.append(header.base_offset, position, self.stats)
                self.bytes_since_last_index_entry = 0
            self._pwrite(batch, position)
        except (OSError, StorageIOError) as exc:
            marks, self.max_timestamp, self.offset_of_max_timestamp, self.bytes_since_last_index_entry = saved
            self._undo_write(indexes, marks or (), position, exc)
        self._account(header, stats)
        self.size = position + len(batch)  # publish last: readers never see a half-written batch

    def append_group(self, batches) -> None:
        """Append many whole batches as ONE publish (the Spark sink's commit, :meth:`Log.append_staged`):
        ``batches`` are (61-byte header, records, parsed header, LineStats) in order.

        No reader sees part of them. The bytes go in first, except the first batch's header, which is written last
        over what until then reads as no batch at all (a hole: zeros, no magic): a reader of the file stops
        there, as at any batch still being written, and recovery after a kill cuts everything from there. Index
        entries follow the header (a reader positioned by one finds whole batches from there on), and the
        segment's published state (totals, next offset, then ``size``) is set once, at the end. On a disk error
        nothing of the group stays (indexes rolled back, the file cut back)."""
        self.tail = None
        self.recent = True
        start = self.size
        indexes = (self.offset_index, self.time_index, self.view_index)
        marks = [index.mark() for index in indexes]
        max_ts, off_max = self.max_timestamp, self.offset_of_max_timestamp
        stats, since = self.stats, self.bytes_since_last_index_entry
        try:
            first_head, first_body = batches[0][0], batches[0][1]
            position = start + rec.HEADER_SIZE
            self._pwritev([first_body], position)
            position += len(first_body)
            for head, body, _, _ in batches[1:]:
                self._pwritev([head, body], position)
                position += len(head) + len(body)
            self._pwrite(first_head, start)
            position = start
            for _, _, header, batch_stats_ in batches:
                if since > self.index_interval_bytes:
                    self.offset_index.append(header.last_offset, position)
                    if max_ts < header.max_timestamp:
                        max_ts, off_max = header.max_timestamp, header.last_offset
                    self.time_index.maybe_append(max_ts, off_max)
                    self.view_index.append(header.base_offset, position, stats)
                    since = 0
                if header.max_timestamp > max_ts:
                    max_ts, off_max = header.max_timestamp, header.last_offset
                stats = stats + batch_stats_
                since += header.size
                position += header.size
        except (OSError, StorageIOError) as exc:
            self._undo_write(indexes, marks, start, exc)
        if self.rolling_based_timestamp is None:
            self.rolling_based_timestamp = batches[0][2].max_timestamp
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, off_max
        self.bytes_since_last_index_entry = since
        self.stats = stats
        self.next_offset = batches[-1][2].next_offset
        self.size = position  # publish last

    def _undo_write(self, indexes, marks, position: int, exc: BaseException) -> None:
        """After a failed append (ENOSPC, EIO...): index entries rolled back to ``marks``, the file cut back to
        ``position``; raises the failure as StorageIOError. If the undo fails too, raises an EIO StorageIOError
        (the log directory then goes offline: :mod:`~logfs.storage.failure`): the in-memory state is the one before
        the append either way (each rollback sets its count first), and recovery cuts what the disk kept."""
        self.rewritten = min(self.rewritten, position)
        try:
            for index, mark in zip(indexes, marks):
                index.rollback(mark)
            os.ftruncate(self.fd, position)
        except (OSError, StorageIOError) as undo:
            raise StorageIOError(f"write to {self.log_path} failed ({exc}), and so did its undo ({undo})",
                                 _errno.EIO) from exc
        if isinstance(exc, StorageIOError):
            raise exc
        raise StorageIOError(f"write to {self.log_path} failed: {exc.strerror}", exc.errno) from exc

    def _pwritev(self, buffers, position: int) -> None:
        """All of ``buffers`` at ``position`` (os.pwritev, finishing a short write)."""
        total = sum(len(b) for b in buffers)
        written = os.pwritev(self.fd, buffers, position)
        if written < total:
            self._pwrite(b"".join(bytes(b) for b in buffers)[written:], position + written)

    def _pwrite(self, data, position: int) -> None:
        written = os.pwrite(self.fd, data, position)
        while written < len(data):  # a short write: the next call reports why (ENOSPC, EIO...)
            n = os.pwrite(self.fd, memoryview(data)[written:], position + written)
            if n <= 0:
                raise OSError(_errno.EIO, "short write")
            written += n

    def grow_tail(self, old_length: int, old_header: bytearray, count: int, payload: int, max_timestamp: int) -> None:
        """Write the tail batch grown in memory from ``old_length`` bytes (``_speedups.grow_lines`` appended
        ``count`` records of ``payload`` value bytes, ``records.restamp_batch`` rewrote its header, ``old_header``
        is the header before): the new records after the end first, then the header. A kill between the two
        leaves the old header, which still describes a whole shorter batch, and bytes past it that recovery cuts.
        No index entry, and none names this batch (:func:`tail_batch.keep` keeps no batch an entry names: Kafka's
        entries name a batch's last offset, which growing changes). On a disk error the batch, in memory and on
        disk, is as it was."""
        tail = self.tail
        self.recent = True
        batch, position = tail.batch, tail.position
        end = position + old_length
        added = len(batch) - old_length
        try:
            with memoryview(batch) as view:
                # (os.pwrite itself, not _pwrite, on this once-per-write() path; _pwrite finishes a short write.)
                written = os.pwrite(self.fd, view[old_length:], end)
                if written < added:
                    self._pwrite(view[old_length + written :], end + written)
                written = os.pwrite(self.fd, view[: rec.HEADER_SIZE], position)
                if written < rec.HEADER_SIZE:
                    self._pwrite(view[written : rec.HEADER_SIZE], position + written)
        except OSError as exc:
            # A fresh buffer, not ``del batch[...]``: the failed write's frames (held by the traceback) still
            # export views of ``batch``, and a bytearray with live exports cannot be resized.
            restored = bytearray(memoryview(batch)[:old_length])
            restored[: rec.HEADER_SIZE] = old_header
            tail.batch = restored
            try:  # the new records go first (needs no space), each step apart: one failing must not skip the other
                os.ftruncate(self.fd, end)
            except OSError:
                pass
            try:  # (only needed if the header write itself failed part way; the old header is then rewritten)
                os.pwrite(self.fd, old_header, position)
            except OSError:
                pass
            raise StorageIOError(f"write to {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        s = self.stats
        self.stats = LineStats(s.records + count, s.keyed, s.nulls, s.key_bytes, s.value_bytes + payload)
        self.next_offset += count
        self.bytes_since_last_index_entry += added
        tail.max_timestamp = max_timestamp
        if max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, self.next_offset - 1
        self.size = end + added  # publish last

    def _account(self, header: rec.BatchHeader, stats: LineStats) -> None:
        """In-memory bookkeeping for one batch appended (or recovered) at the end of the segment."""
        if self.rolling_based_timestamp is None:
            self.rolling_based_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
        self.stats = self.stats + stats
        self.next_offset = header.next_offset
        self.bytes_since_last_index_entry += header.size

    def should_roll(self, batch_size: int, max_segment_bytes: int, segment_ms: int, now_ms: int,
                    last_offset: int) -> bool:
        waited = now_ms - (self.rolling_based_timestamp if self.rolling_based_timestamp is not None
                           else self.created_ms)
        return (
            self.size > max_segment_bytes - batch_size
            or (self.size > 0 and waited > segment_ms - self.roll_jitter_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or last_offset - self.base_offset > 0x7FFFFFFF
        )

    def on_become_inactive(self) -> None:
        """Roll-time bookkeeping: the time index's reserved last slot gets the max timestamp; the view index
        gets its end entry; every index is trimmed to its entries."""
        self.tail = None
        self._end_entries()
        for index in (self.offset_index, self.time_index, self.view_index):
            index.trim_to_valid_size()
        self.active = False

    def _end_entries(self) -> None:
        """A sealed segment's last index entries: the time index's reserved slot gets the max timestamp, the view
        index its end entry."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        if self.size > 0:
            last = self.view_index.last()
            if last is None or last.position < self.size:
                self.view_index.append(self.next_offset, self.size, self.stats)

    def sealed_on_disk(self) -> bool:
        """Whether the files are in the shape a roll leaves them: every index trimmed to its entries, and the
        view index ending with its end entry (a segment with records)."""
        for index in (self.offset_index, self.time_index, self.view_index):
            if os.path.getsize(index.path) != index.entries * index.entry_size:
                return False
        last = self.view_index.last() if self.size > 0 else None
        return self.size == 0 or (last is not None and last.position == self.size)

    def become_active(self, max_index_size: int) -> None:
        # The end entry written when the segment became inactive is only for sealed segments: the next
        # indexed append lands at that very position.
        end = self.view_index.last()
        if end is not None and end.position >= self.size:
            self.view_index._truncate_entries(self.view_index.entries - 1)
        self.offset_index.resize(max_index_size)
        self.time_index.resize(max_index_size)
        self.active = True

    # -- reading ---------------------------------------------------------------------------------
    # The bounded lookups every segment a view reads shares (index entry, then a scan of at most one interval).
    translate_offset = translate_offset
    find_offset_by_timestamp = find_offset_by_timestamp

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        """Whether the batch holds records of an aborted transaction (a ``read_committed`` reader skips it)."""
        return (self.aborted is not None and bool(header.attributes & rec.ATTR_TRANSACTIONAL)
                and self.aborted.covers(header.producer_id, header.base_offset))

    def measure_aborted(self) -> None:
        """Find the batches of aborted transactions in this segment and count their lines (:attr:`uncommitted`:
        what a ``read_uncommitted`` view adds to its view index). A walk over the whole segment: the loader's, or a
        worker thread's when the topic's ``logfs.isolation.level`` changes, never a request's. Once: the
        segment's aborted ranges are fixed when it is loaded. Readers pin it or hold its log's lock."""
        if self.aborted is None or self.uncommitted is not None:
            return
        self.uncommitted = AbortedBatches((position, batch_stats(buf, at, header.size))
                                          for position, header, buf, at in self.batches_from(0)
                                          if not header.is_control and self.is_aborted(header))

    def visible_stats(self, buf, pos: int, header: rec.BatchHeader) -> LineStats:
        """The LineStats of the batch's lines in the text view: none for an aborted transaction's batch."""
        return ZERO_STATS if self.is_aborted(header) else batch_stats(buf, pos, header.size)

    # -- loading ---------------------------------------------------------------------------------
    def load_state(self) -> None:
        """State from the indexes, after a clean shutdown (:meth:`SegmentRecovery.load_state`)."""
        SegmentRecovery(self).load_state()

    def recover(self, flushed_offset: int | None = None) -> int:
        """Batches validated and indexes rebuilt, from ``flushed_offset`` on (:meth:`SegmentRecovery.recover`);
        the bytes truncated."""
        return SegmentRecovery(self).recover(flushed_offset)

    @property
    def largest_timestamp(self) -> int:
        return self.max_timestamp if self.max_timestamp >= 0 else self.created_ms

    # -- truncation -------------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove records with offset >= ``offset``; a batch straddling it is rewritten with its earlier
        records. Returns bytes removed."""
        self.tail = None
        self.rewritten = 0
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position, header = found
        kept = []
        if header.base_offset < offset:
            buf = self.read(position, header.size)
            kept = [r for r in rec.decode(buf, 0, header.size) if r.offset < offset]
        old_size = self.size
        for index in (self.offset_index, self.time_index):
            index.truncate_to(offset if not kept else header.base_offset)
        self.view_index.truncate_to_position(position)
        os.ftruncate(self.fd, position)
        self.size = position
        # Re-derive the in-memory state from what remains (bounded: from the last index entry).
        self.stats, self.next_offset = ZERO_STATS, self.base_offset
        last_view = self.view_index.last()
        start = 0
        if last_view is not None:
            start, self.stats, self.next_offset = last_view.position, last_view.stats, last_view.offset
        self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        last_ts = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp = last_ts.timestamp, last_ts.offset
        self.rolling_based_timestamp = None
        for _, h, buf, at in self.batches_from(start):
            self.stats = self.stats + self.visible_stats(buf, at, h)
            self.next_offset = h.next_offset
            if h.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = h.max_timestamp, h.last_offset
        if self.size > 0:
            self.rolling_based_timestamp = rec.parse_header(self.read(0, rec.HEADER_SIZE)).max_timestamp
        last_index = self.offset_index.last_entry()
        self.bytes_since_last_index_entry = self.size - (last_index.position if self.offset_index.entries else 0)
        if kept:
            # Original offsets are kept: a compacted batch has gaps between its records' offsets.
            batch = rec.build_batch(
                header.base_offset, 0, [r.value for r in kept], [r.key for r in kept],
                headers=[r.headers for r in kept], timestamps=[r.timestamp for r in kept],
                offset_deltas=[r.offset - header.base_offset for r in kept],
            )
            stats = batch_stats(batch)
            self.append(batch, rec.parse_header(batch), stats)
        return old_size - self.size

    # -- durability and files ----------------------------------------------------------------------
    def flush(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise StorageIOError(f"fsync of {self.log_path} failed: {exc.strerror}", exc.errno) from exc
        for index in (self.offset_index, self.time_index, self.view_index):
            index.flush()

    @property
    def txn_index_path(self) -> str:
        """Its Kafka ``.txnindex`` under its current suffix (a file only with :attr:`has_txn_index`)."""
        return os.path.join(self.directory, filename_prefix(self.base_offset)) + TXN_INDEX_SUFFIX + self.suffix

    def _paths(self) -> list[str]:
        paths = [self.log_path, self.offset_index.path, self.time_index.path, self.view_index.path]
        if self.has_txn_index:  # (Kafka's .txnindex: kept beside its segment, renamed and deleted with it, last)
            paths.append(self.txn_index_path)
        return paths

    def change_suffix(self, new_suffix: str) -> None:
        """Rename all files from the current suffix to ``new_suffix`` (open fds stay valid)."""
        stem = os.path.join(self.directory, filename_prefix(self.base_offset))
        for old, kind in zip(self._paths(), ALL_SUFFIXES + (TXN_INDEX_SUFFIX,)):
            new = stem + kind + new_suffix
            if os.path.exists(old):
                os.rename(old, new)
        self.log_path = stem + LOG_SUFFIX + new_suffix
        self.offset_index.path = stem + INDEX_SUFFIX + new_suffix
        self.time_index.path = stem + TIME_INDEX_SUFFIX + new_suffix
        self.view_index.path = stem + VIEW_INDEX_SUFFIX + new_suffix
        self.suffix = new_suffix

    def delete_files(self) -> None:
        for path in self._paths():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Close for good; indexes of an active segment are trimmed and its view index gets its end entry."""
        if self.closed:
            return
        if self.active and not self.deleted:
            self._end_entries()
        for index in (self.offset_index, self.time_index, self.view_index):
            if self.deleted:
                index.close_handler()
            else:
                index.close()
        self.close_readonly()

    def close_readonly(self) -> None:
        """Close for good without trimming or writing anything (a segment only read, or going away)."""
        for index in (self.offset_index, self.time_index, self.view_index):
            index.close_handler()
        release_unit(self)
        self.fd, self.closed = -1, True

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

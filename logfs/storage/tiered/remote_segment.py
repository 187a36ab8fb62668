"""A tiered segment, read like a local one.

:class:`RemoteLogSegment` is the second implementation of the segment a view reads
(:class:`~logfs.storage.local.segment_file.ReadableSegment`: ``size``, ``stats``, the three indexes,
``read``/``read_into``/``batches_from``, ``translate_offset``, ``find_offset_by_timestamp``), so the view layer
and the log read a tiered range exactly as a local one. Its ``.index``, ``.timeindex`` and
``.viewindex`` are small: they are kept whole on local disk (copied at upload, fetched once otherwise) and read
like a local segment's. Its ``.log`` is read through the :class:`~logfs.storage.tiered.block_cache.BlockCache`.

The FUSE request loop must never wait for the store: it asks :meth:`RemoteLogSegment.cached` (through the view,
logfs.view.text.SegmentView.in_memory) before it reads, and a read of blocks not cached runs in a worker thread,
where the fetch happens (bounded by the store's own timeouts: a store that is down or stalled fails the read with
a :class:`~logfs.remote.api.RemoteStoreError`).
"""
from __future__ import annotations

import os
import shutil
import uuid
from typing import Callable

from ...remote.api import RemoteCorruptError, RemoteStore
from ...remote.manifest import TXN_INDEX_EXT, RemoteSegment
from ..checkpoints import fsync_dir
from ..errors import CorruptRecordError
from ..format.lines import LineStats
from ..local.index import OffsetIndex, TimeIndex, ViewIndex
from ..local.open_files import OpenFiles
from ..names import INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix
from ..local.segment import LogSegment
from ..local.segment_file import SegmentFile, find_offset_by_timestamp, translate_offset
from ..local.txn_index import AbortedRanges, read_txn_index
from .block_cache import BLOCK_BYTES, READ_AHEAD_AFTER, READ_AHEAD_FIRST, READ_AHEAD_GET, READ_AHEAD_MAX, Block, BlockCache


def index_paths(index_dir: str, base_offset: int, objects=()) -> dict[str, str]:
    """Where a tiered segment's indexes are kept locally, by object kind: its three, and its ``.txnindex`` when
    ``objects`` (its manifest entry's) names one."""
    stem = os.path.join(index_dir, filename_prefix(base_offset))
    paths = {"index": stem + INDEX_SUFFIX, "timeindex": stem + TIME_INDEX_SUFFIX, "viewindex": stem + VIEW_INDEX_SUFFIX}
    if TXN_INDEX_EXT in objects:
        paths[TXN_INDEX_EXT] = stem + TXN_INDEX_SUFFIX
    return paths


def install_index(path: str, source: str | None = None, data: bytes | None = None) -> None:
    """Put a file of the tiered state (an index copy, the manifest copy) in place, durably: written to a
    temporary from ``source`` or ``data``, fsynced, renamed over ``path``, directory fsynced. A power cut leaves
    the old file or the new one, never a torn or empty one that the next start would trust."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            if source is not None:
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
            else:
                f.write(data or b"")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class RemoteLogSegment(SegmentFile):
    """One tiered segment (read-only): a :class:`~logfs.storage.local.segment_file.ReadableSegment` whose ``.log`` is
    read through the block cache. Its indexes (and its ``.txnindex``, when the manifest names one) must already be in
    ``index_dir`` (:func:`index_paths`)."""

    active = False
    fd = -1  # never a local descriptor: close_if_unused leaves it alone

    def __init__(self, meta: RemoteSegment, index_dir: str, store: RemoteStore, cache: BlockCache,
                 open_files: OpenFiles | None = None):
        self.meta = meta
        self.open_files = open_files if open_files is not None else OpenFiles()  # its indexes' budget
        self.base_offset = meta.base_offset
        self.next_offset = meta.next_offset
        self.size = meta.size
        self.max_timestamp = meta.max_timestamp
        self.key = meta.objects["log"].key
        self.log_path = f"remote object {self.key}"
        self.store = store
        self.cache = cache
        self.blocks_dir = os.path.join(index_dir, "blocks")
        self.refs = 0
        self.deleted = self.purged = self.broken = self.closed = False
        self.owner = None  # its log's lock, once published (Log.set_remote): the open-file budget asks it
        # Read-ahead state (shared by every reader of this segment; a race only resets the window).
        self._prev_first: int | None = None
        self._next_block = 0
        self._window = 0
        self._ahead_to = -1  # the last block read-ahead was asked for
        self._run = 0  # blocks a forward run of reads has moved on by
        self._handed_on = False  # this run's read-ahead went on into the successor
        #: The next tiered segment of the partition (set by the tiered manager at each publish): a forward run's
        #: read-ahead goes on into it, so the window does not start again from nothing at each segment.
        self.successor: RemoteLogSegment | None = None
        self._paths = index_paths(index_dir, meta.base_offset, meta.objects)
        for ext, path in self._paths.items():
            if os.path.getsize(path) != meta.objects[ext].size:
                raise RemoteCorruptError(f"{path}: {os.path.getsize(path)} bytes, the manifest says "
                                         f"{meta.objects[ext].size}")
        # Kafka's aborted transactions reaching into it (its .txnindex object: read whole, it is a few entries);
        # none known for a segment tiered without one. Fixed once opened, as a loaded local segment's.
        txns = read_txn_index(self._paths[TXN_INDEX_EXT]) if TXN_INDEX_EXT in self._paths else []
        self.aborted = AbortedRanges(txns) if txns else None
        self.uncommitted = None  # its aborted batches and their lines, once measured (a read_uncommitted view)
        # The view length needs only the view index's end entry: the indexes are mapped on first lookup, so a
        # tiered segment nobody reads holds no descriptor (and the open-file budget unmaps idle ones).
        entry = ViewIndex.ENTRY
        with open(self._paths["viewindex"], "rb") as f:
            f.seek(max(0, meta.objects["viewindex"].size - entry.size))
            raw = f.read(entry.size)
        if len(raw) != entry.size:
            raise RemoteCorruptError(f"{self._paths['viewindex']}: no end entry")
        rel, position, *stats = entry.unpack(raw)
        if position != self.size or self.base_offset + rel != self.next_offset:
            raise RemoteCorruptError(f"{self._paths['viewindex']}: no end entry for {self.size} bytes, offset "
                                     f"{self.next_offset}")
        self.stats = LineStats(*stats)
        self._indexes: tuple | None = None

    def _mapped(self) -> tuple:
        if self._indexes is None:
            if self.broken:
                raise RemoteCorruptError(f"{self._paths['index']}: the local copies of {self.key}'s indexes failed "
                                         "their check; fetched again at the next tiering pass")
            size = self.meta.objects
            indexes = (
                OffsetIndex(self._paths["index"], self.base_offset, size["index"].size, active=False,
                            open_files=self.open_files),
                TimeIndex(self._paths["timeindex"], self.base_offset, size["timeindex"].size, active=False,
                          open_files=self.open_files),
                ViewIndex(self._paths["viewindex"], self.base_offset, size["viewindex"].size, active=False,
                          open_files=self.open_files))
            for index in indexes:
                index.segment = self
            try:
                for index in indexes:  # one C pass each, on first use only: a copy that fails is never used
                    index.sanity_check(self.size)
            except CorruptRecordError as exc:
                for index in indexes:
                    index.close_handler()
                self.broken = True
                raise RemoteCorruptError(f"{exc} (the local copy of a tiered segment's index; fetched again at "
                                         "the next tiering pass)") from None
            self._indexes = indexes
        return self._indexes

    @property
    def offset_index(self) -> OffsetIndex:
        return self._mapped()[0]

    @property
    def time_index(self) -> TimeIndex:
        return self._mapped()[1]

    @property
    def view_index(self) -> ViewIndex:
        return self._mapped()[2]

    @property
    def largest_timestamp(self) -> int:
        return self.max_timestamp

    def _block_length(self, block: int) -> int:
        return min(BLOCK_BYTES, self.size - block * BLOCK_BYTES)

    def _fetch(self, first: int, last: int, ready: Callable[[int, Block], None] | None = None) -> list[Block]:
        """Blocks ``first..last`` of the .log object by one ranged GET: read-only views of the one buffer the
        body was read into (no copy per block; nothing writes to that buffer once it is returned). With
        ``ready``, ``ready(i, block)`` is called for block ``first + i`` as soon as its bytes have arrived, while
        the rest of the body is still being received: a sequential reader follows a large read-ahead GET as it
        arrives instead of waiting for all of it."""
        start = first * BLOCK_BYTES
        want = min((last + 1) * BLOCK_BYTES, self.size) - start
        progress = None
        if ready is not None:
            told = [0]  # blocks handed to ``ready`` so far

            def progress(buffer, got: int) -> None:
                whole = -(-want // BLOCK_BYTES) if got >= want else got // BLOCK_BYTES
                if whole > told[0]:
                    view = memoryview(buffer).toreadonly()
                    for i in range(told[0], whole):
                        ready(i, view[i * BLOCK_BYTES:min((i + 1) * BLOCK_BYTES, want)])
                    told[0] = whole

        data = self.store.get_range_buffer(self.key, start, want, progress)
        if len(data) != want:
            raise RemoteCorruptError(f"{self.key}: {len(data)} bytes at {start}, expected {want}")
        view = memoryview(data).toreadonly()
        return [view[i:i + BLOCK_BYTES] for i in range(0, want, BLOCK_BYTES)]

    def read(self, position: int, length: int) -> bytes:
        end = min(position + length, self.size)
        if end <= position:
            return b""
        data = self._blocks(position, end)
        return data if isinstance(data, bytes) else bytes(data)

    def _blocks(self, position: int, end: int, scratch: bytearray | None = None) -> memoryview | bytes:
        """Bytes position..end (end <= size, position < end) as a view: of the block itself when one block holds
        them (no copy), else of the slices joined (one copy of only those bytes, not of the whole blocks), into
        ``scratch`` when given and large enough."""
        first, last = position // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        skip = position - first * BLOCK_BYTES
        if first == last:
            # Small reads go on in the block read last (32 requests of 8 KiB per block): no cache lookup for them.
            memo = self.cache.last_block
            if memo is not None and memo[0] is self and memo[1] == first:
                data = memo[2]
            else:
                data = self.cache.get_blocks(self.blocks_dir, self.key, first, last, self._block_length,
                                             self._fetch)[0]
                self.cache.last_block = (self, first, data)
            self._read_ahead(first, last)
            return memoryview(data)[skip:skip + end - position]
        blocks = self.cache.get_blocks(self.blocks_dir, self.key, first, last, self._block_length, self._fetch)
        self._read_ahead(first, last)
        tail = end - last * BLOCK_BYTES
        parts = [memoryview(blocks[0])[skip:], *blocks[1:-1], memoryview(blocks[-1])[:tail]]
        if scratch is None or len(scratch) < end - position:
            return b"".join(parts)
        out = memoryview(scratch)
        at = 0
        for part in parts:
            out[at:at + len(part)] = part
            at += len(part)
        return out[:at]

    def cached(self, position: int, end: int) -> bool:
        """Whether bytes ``position..end`` of the ``.log`` are in the block cache: a read of them sends no request
        (:meth:`BlockCache.cached`). No I/O. (Not the block read last alone: another thread may replace it before
        the read.)"""
        end = min(end, self.size)
        if end <= position:
            return True
        first, last = position // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        return self.cache.cached(self.blocks_dir, self.key, first, last)

    def _read_ahead(self, first: int, last: int) -> None:
        """A read of blocks first..last was served: if it continues the previous one (from the block that one
        ended in), widen the read-ahead window and fetch that far ahead in the background; anything else (a
        jump) ends the window, so a random read fetches only what it needs."""
        prev_first, prev_last = self._prev_first, self._next_block - 1
        if prev_first is not None and prev_first <= first <= prev_last + 1 and last > prev_last:
            self._run += last - prev_last  # moving forward from where the last read was
            if self._run >= READ_AHEAD_AFTER:  # (a random read and its neighbour, e.g. a position lookup, are not)
                window = max(READ_AHEAD_FIRST, self._window * 2)
                self._window = min(window, READ_AHEAD_MAX, max(BLOCK_BYTES, self.cache.limit // 4))
        elif prev_first is None or not prev_first <= first <= last <= prev_last:
            # A jump (reading inside the last range is not): what was fetched ahead for it and not read goes first.
            if self._ahead_to > prev_last:
                self.cache.demote(self.blocks_dir, self.key, prev_last + 1, self._ahead_to)
            self._window, self._ahead_to, self._run, self._handed_on = 0, -1, 0, False
        self._prev_first, self._next_block = first, last + 1
        if not self._window:
            return
        blocks = -(-self._window // BLOCK_BYTES)
        end_block = (self.size - 1) // BLOCK_BYTES
        # At least one GET's worth, but never more than a quarter of the cache: blocks of one GET must not evict
        # each other before the reader gets to them.
        per_get = max(1, min(READ_AHEAD_GET, self.cache.limit // 4) // BLOCK_BYTES)
        if self._ahead_to < end_block:
            if self._ahead_to - last >= blocks // 2:
                return  # enough is on its way: read-ahead goes in large GETs, not one block per read
            start = max(last + 1, self._ahead_to + 1)
            stop = min(max(last + blocks, start + per_get - 1), end_block)
            if stop >= start:
                self.cache.prefetch(self.blocks_dir, self.key, start, stop, self._fetch)
                self._ahead_to = stop
        over = last + blocks - end_block  # blocks of the window past this segment's end
        if over > 0 and self._ahead_to >= end_block and not self._handed_on:
            self._hand_on(over, per_get)

    def _hand_on(self, over: int, per_get: int) -> None:
        """The window reaches past this segment's end: fetch the successor's first blocks ahead (what the window
        overhangs, at least one GET's worth) and let its first read continue this run, with this window (no
        demand fetch, no new ramp at each segment). Not when another reader's run is under way in the successor
        (its read-ahead state is shared): that reader keeps its window."""
        self._handed_on = True
        after = self.successor
        if after is None or after.deleted or after.closed or after.broken or after.size <= 0:
            return
        after_end = (after.size - 1) // BLOCK_BYTES
        if after._window and after._next_block <= after_end:
            return  # being read ahead for someone in the middle of it
        stop = min(max(over, per_get) - 1, after_end)
        after.cache.prefetch(after.blocks_dir, after.key, 0, stop, after._fetch)
        after._window, after._ahead_to, after._run, after._handed_on = self._window, stop, self._run, False
        after._prev_first, after._next_block = 0, 0  # as if a read had ended just before block 0

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        """As :meth:`read`, as a view: of the cached block when one block holds the range (no copy), else of
        ``scratch`` with the blocks' bytes copied in (the caller's reused buffer: a fresh one per read would cost
        a page fault per 4 KiB on top of the copy, 11% of the request thread in a cold sequential read)."""
        end = min(position + length, self.size)
        if end <= position:
            return memoryview(b"")
        return self._blocks(position, end, scratch)

    # The bounded lookups every segment a view reads shares: index entry, then a scan of at most one interval.
    translate_offset = translate_offset
    find_offset_by_timestamp = find_offset_by_timestamp
    # Kafka's aborted transactions (``aborted``, from its .txnindex object): skipped by a read_committed view as in a
    # local segment; a read_uncommitted view counts their lines once measured (the tiering pass's worker thread
    # does it when the topic is read_uncommitted: it reads the whole .log through the block cache).
    is_aborted = LogSegment.is_aborted
    measure_aborted = LogSegment.measure_aborted

    def hold_files(self) -> None:
        """Open the indexes before their files are unlinked while a snapshot pins this segment (as
        :meth:`LogSegment.hold_files`; the caller then marks it ``deleted``)."""
        for index in self._mapped():
            if index.entries:
                index.hold()

    def close(self) -> None:
        indexes, self._indexes = self._indexes, None
        for index in indexes or ():
            index.close_handler()
        self.closed = True

    def __repr__(self) -> str:
        return f"RemoteLogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

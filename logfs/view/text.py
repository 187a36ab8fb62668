"""Addressing the rendered view of a partition by byte position (the line format: ``logfs.storage.format.lines``).

A partition's view is, for every record from the log start offset to the log end offset in offset order,
``[key + separator] + (value | null marker | "") + "\\n"``. Its length is never counted by reading records:
each segment's ``.viewindex`` stores, at sparse batch positions, the :class:`~logfs.storage.format.lines.LineStats`
of the records before them, and a segment's totals; a length is a linear function of those stats for the
current separator and marker. Locating a byte position is: bisect the segments' cumulative lengths, bisect
the segment's view index, then render forward at most one index interval of batches.

A :class:`SegmentView` is over a fixed list of segments: a file handle's is a
:class:`~logfs.storage.local.segments.LogSnapshot` (pinned by the storage, grown at the end by segments rolled since,
released with the handle); the live view (:func:`live_view`, what a new open would see) is over the log's
segments now, unpinned, kept per log by the mount's :class:`LiveViews` until the storage's ``layout_version`` or
the format changes.
Not thread-safe; one per handle.

Compressed batches (sealed segments rewritten in the topic's codec, CONTRACT section 8) are decompressed whole, once
each. Reading one line decompresses the batch that holds it and nothing else. A sequential reader gets the
compressed batches after its own decompressed ahead of it, and the last batches decompressed are shared:
:mod:`logfs.view.readahead`. Neither a decompression nor a wait for the object store belongs on the FUSE request
thread: the view answers beforehand whether a read or a lookup can be served from what is at hand
(:meth:`SegmentView.in_memory`, :meth:`SegmentView.lookup_in_memory`, :func:`start_measured`), and the FUSE layer
runs it in a worker thread otherwise.

The module is longer than 500 lines because one idea, a view addressed by byte position, needs its layout
(segment starts, the prefix before the log start), its reading (cursor, decompressed batches, read-ahead) and its
lookups (offset <-> position, time) over the same segment list and the same pins: split apart, each part would
reach into the others' state.
"""

from __future__ import annotations

import bisect
import weakref
from concurrent.futures import Executor

from ..storage.format import records as rec
from ..storage.errors import DataLossError
from ..storage.format.speedups import C as _speedups
from ..storage.format.lines import ZERO_STATS
from ..storage.format.lines import LineFormat
from ..storage.local.log import Log
from ..storage.local.segment import LogSegment
from ..storage.local.segments import LogSnapshot
from ..storage.tiered.remote_segment import RemoteLogSegment
from .isolation import uncommitted, unwrapped
from .readahead import READ_SLACK, ReadAhead, decompress, plain_batches, whole_compressed


# The batch attributes the C renderer leaves to this module: compressed and control batches, and, in a segment that
# Kafka's aborted transactions reach into, transactional ones (render_window's ``stop``).
_STOP = rec.ATTR_COMPRESSION_MASK | rec.ATTR_CONTROL
_STOP_TRANSACTIONAL = _STOP | rec.ATTR_TRANSACTIONAL
# How far from the batch where a read starts it may look without the C accelerator (SegmentView.in_memory: the
# generic path reads segment_file's chunk of batches); with it, the read's own window (its lines * 9/8 + slack) or
# up to the index entry after its last byte, whichever is further.
WINDOW_MARGIN = 64 << 10


def _header_at(segment, file_pos: int):
    """The header of the batch at ``file_pos`` (None past the segment's published bytes)."""
    head = segment.read(file_pos, rec.HEADER_SIZE)
    return rec.parse_header(head) if len(head) == rec.HEADER_SIZE else None


class SegmentView:
    """The view over ``segments`` starting at ``start_offset``, in format ``fmt``; with ``snapshot`` (which
    pinned them), it can :meth:`extend` and must be released; with ``ahead_pool`` (the owner's
    :func:`~logfs.view.readahead.decompress_pool`), a sequential reader's compressed batches are decompressed
    ahead in its threads."""

    def __init__(self, segments: list[LogSegment], start_offset: int, fmt: LineFormat,
                 snapshot: LogSnapshot | None = None, ahead_pool: Executor | None = None):
        self._snapshot = snapshot
        self._ahead_pool = ahead_pool
        # With the start offset and the format, which positions the view has (:func:`view_positions`): the log's
        # rewrite count when the snapshot was taken (a live view is made for the log as it is now).
        self.rewrite_count = snapshot.rewrite_count if snapshot is not None else 0
        # Segments wholly below the start offset are not part of the view (but stay pinned until release).
        kept = [s for s in segments if s.next_offset > start_offset]
        self.segments = kept if kept else list(segments[-1:])
        if fmt.uncommitted:  # (logfs.isolation.level=read_uncommitted: aborted records have lines, view/isolation)
            self.segments = [uncommitted(s) for s in self.segments]
        self.start_offset = start_offset
        self.fmt = fmt
        self._starts: list[int] = [0]  # view start of segments[0..k]; extended lazily
        self._prefix = self._prefix_length(self.segments[0], start_offset) if self.segments else 0
        self._cursor: tuple[int, int, int, int] | None = None  # (view pos, segment idx, batch position, skip)
        # What in_memory() found for the read that follows it: (view pos, view length, (segment idx, batch position,
        # skip) or None where the cursor is), so that the read looks nothing up again.
        self._located: tuple | None = None
        self._ends: tuple | None = None  # (segment, view length, the next entries' view lengths, their positions)
        # Segment index -> whether its batches are compressed, as far as known: a local segment's from its first
        # batch, a tiered one's from the first batch a read met in it (a compressed one met later says True).
        self._codecs: dict[int, bool] = {}
        self._scratch = bytearray()  # reused read buffer for sequential reads
        # (segment, position) -> (the batch decompressed, its size as stored): the compressed batches the read in
        # progress used (a read repeated in a worker thread finds them), then only the one the cursor is in
        self._batches: dict = {}
        self._ahead: ReadAhead | None = None  # decompression ahead of a sequential reader (views with a snapshot)
        # Segments this view let go: they left the log (retention, compaction) and the reader had read past them,
        # so their disk is freed (:meth:`release_passed`); reading one again is DataLossError (EIO), never bytes
        # of another segment. Their lengths stay known: a segment's view length is in memory (its stats).
        self._dropped: set[int] = set()
        # The furthest segment a read of this view began in: the segments before it are behind the reader. (Not
        # the one a read ended in: a reader that just read a line may ask the offset of its position, which lies
        # in the segment it began in; one segment is the margin.)
        self._reached = 0
        self.lines = 0  # records whose line ends in what the last read() returned (the metrics' read counter)

    # -- layout ------------------------------------------------------------------------------------
    def _prefix_length(self, segment: LogSegment, offset: int) -> int:
        """View bytes of the segment's records with offset < ``offset`` (log start inside the segment). Made with
        the view, wherever it is made (an open, on the request thread): a compressed batch holding ``offset`` is
        decompressed here, once (one batch at most, as a read of its line would)."""
        if offset <= segment.base_offset:
            return 0
        known = _PREFIXES.get(segment)
        key = (offset, self.fmt)
        if known is not None and key in known:
            return known[key]
        length = self._measure_prefix(segment, offset)
        known = _PREFIXES.setdefault(segment, {})
        if len(known) >= 4:  # (a start moves forward: the older ones are of no use)
            known.clear()
        known[key] = length
        return length

    def _measure_prefix(self, segment: LogSegment, offset: int) -> int:
        entry = segment.view_index.floor_by_offset(offset)
        position, stats = (entry.position, entry.stats) if entry else (0, ZERO_STATS)
        length = self.fmt.length(stats)
        for file_pos, header, buf, at in segment.batches_from(position):
            if header.base_offset >= offset:
                break
            if header.compression and not header.is_control and _speedups is not None:
                key = (segment, file_pos, header.crc)
                plain = plain_batches.get(key)
                if plain is None:
                    plain = decompress(buf, at)
                    plain_batches.put(key, plain)
                buf, at = plain, 0
            passed, found = self._seek(segment, file_pos, rec.parse_header(buf, at), buf, at,
                                       offset=-1 if header.last_offset < offset else offset)
            length += passed
            if found is not None:
                return length
        return length

    def _segment_length(self, i: int) -> int:
        segment = self.segments[i]
        n = self.fmt.length(segment.stats)
        return n - self._prefix if i == 0 else n

    def _start(self, i: int) -> int:
        starts = self._starts
        if len(starts) <= i:
            # Grown in a copy, published by one assignment: a handle's view read in a worker thread may be asked
            # its length on the request thread at the same moment (both compute the same starts: the segments
            # before the last are sealed), and a list grown by both at once would hold a start twice.
            starts = list(starts)
            while len(starts) <= i:
                k = len(starts) - 1
                starts.append(starts[k] + self._segment_length(k))
            self._starts = starts
        return starts[i]

    def length(self) -> int:
        if not self.segments:
            return 0
        last = len(self.segments) - 1
        return self._start(last) + self._segment_length(last)

    def clone(self, *, write_only: bool = False) -> "SegmentView | None":
        """A view with the same positions, over the same segments (pinned again), for another handle; None if this
        view has let segments go (:meth:`release_passed`: a reader from the start could not read them) or has no
        snapshot."""
        if self._snapshot is None or self._dropped:
            return None
        snapshot = self._snapshot.clone(write_only=write_only)
        return SegmentView(snapshot.segments, self.start_offset, self.fmt, snapshot, self._ahead_pool)

    def extend(self) -> bool:
        """Take in segments rolled since this view was made (appends continue into them); its snapshot pins
        them. Returns whether any."""
        if self._snapshot is None:
            return False
        newer = self._snapshot.extend()
        self.segments.extend(map(uncommitted, newer) if self.fmt.uncommitted else newer)
        return bool(newer)

    def release_passed(self, *, everything: bool = False) -> int:
        """Let go of the segments that left the log (retention, compaction, tiering's local deletes) and lie wholly
        behind the furthest point a read reached (with ``everything``, all but the last: a handle that cannot
        read): no ``tail -f`` or log shipper reads behind itself, so their disk is freed now rather than when the
        handle closes. Returns how many were let go."""
        snapshot = self._snapshot
        if snapshot is None:
            return 0
        if everything:
            self.extend()  # (a writer's view takes the segments rolled since only here)
        upto = len(self.segments) - 1 if everything else self._reached
        self._start(upto)  # (lengths up to there known: a view position never moves)
        dropped = 0
        for j in range(upto):
            if j not in self._dropped and self.segments[j].deleted and snapshot.drop(unwrapped(self.segments[j])):
                self._dropped.add(j)
                dropped += 1
        return dropped

    def _locate(self, pos: int) -> tuple[int, int]:
        """(segment index, position within that segment's own view) for a view position < length()."""
        self._start(len(self.segments) - 1)
        i = bisect.bisect_right(self._starts, pos) - 1
        while i + 1 < len(self.segments) and pos >= self._start(i) + self._segment_length(i):
            i += 1  # skip empty segments
        local = pos - self._start(i)
        return i, local + (self._prefix if i == 0 else 0)

    # -- what a read needs ------------------------------------------------------------------------------
    def in_memory(self, pos: int, size: int) -> bool:
        """Whether :meth:`read` of ``size`` bytes at ``pos`` can be served from what is at hand: no request to the
        object store (its tiered bytes in the block cache) and no decompression (its compressed batches kept by
        this view or decompressed ahead). The FUSE layer asks it on its request thread and reads there, or else in
        a worker thread, where both are allowed. No I/O but the local indexes (and once per local segment, the
        header of its first batch); what it located is kept for the read that follows (no second lookup).

        The bytes a read touches are bounded by the view index: the read renders up to the batch holding its last
        byte, which ends at or before the next entry, and its window reaches at most one window further. A block
        found is made the most recently used, so the read that follows on the same thread finds it unless the whole
        cache turned over meanwhile (a torn block file, which only a power cut leaves, is fetched again there: one
        GET of one block). Which segments are compressed is known from a local segment's first batch, and for a
        tiered one from the first batch a read met in it (unknown until then: such a read goes to a worker). A
        segment that mixes plain and compressed batches (a Kafka directory's, from producers with different
        codecs) can so have a compressed batch decompressed on the request thread, once: that read marks it."""
        total = self.length()
        if pos >= total or size <= 0:
            return True
        cursor = self._cursor
        if cursor is not None and cursor[0] == pos:
            _, i, file_pos, skip = cursor
            self._located = (pos, total, None)
        else:
            i, local = self._locate(pos)
            if i in self._dropped:
                return True  # (the read fails at once: DataLossError)
            entry = self.segments[i].view_index.floor_by_view(local, self.fmt)
            file_pos, cum = (entry.position, self.fmt.length(entry.stats)) if entry else (0, 0)
            skip = local - cum
            self._located = (pos, total, (i, file_pos, skip))
        end = min(pos + size, total)
        window = (skip + size) * 9 // 8 + READ_SLACK  # what the C path's first read of the batch covers
        margin = window if _speedups is not None else max(WINDOW_MARGIN, window)
        starts = self._starts  # (every segment's: length() measured them)
        while True:
            segment = self.segments[i]
            last = i + 1 >= len(self.segments) or end <= starts[i + 1]
            if i in self._dropped:
                return True  # (the read stops there, or fails)
            compressed = self._codecs.get(i)
            if compressed is None:
                compressed = self._compressed(i)
                if compressed is None:
                    return False
            tiered = isinstance(segment, RemoteLogSegment)
            if compressed or tiered:
                bound = segment.size
                if last:
                    local_last = end - 1 - starts[i] + (self._prefix if i == 0 else 0)
                    after = self._end_after(segment, local_last)
                    bound = bound if after is None else after
                if compressed:
                    if not self._decompressed(i, file_pos, bound):
                        return False
                elif not segment.cached(file_pos, max(bound, file_pos + margin)):
                    return False
            elif self._ahead is not None and self._ahead.pending(i, file_pos):
                return False  # (the read-ahead is on this batch: the read would wait for it)
            if last:
                return True
            i, file_pos, skip = i + 1, 0, 0

    def _end_after(self, segment, local_last: int) -> int | None:
        """Where the batch holding view byte ``local_last`` of ``segment`` ends at the latest: the position of the
        first view index entry past it (None: the segment's end). Asked on every read of a tiered or compressed
        segment, so the entries ahead of a reader are kept (:meth:`ViewIndex.ends_after_view`: one search and one
        read per 16 entries, not one search per read). An entry kept that a truncation removed since can only make
        the answer 'not in memory' (the read goes to a worker thread, which reads what is there)."""
        kept = self._ends
        if kept is not None and kept[0] is segment and kept[1] <= local_last < kept[2][-1]:
            return kept[3][bisect.bisect_right(kept[2], local_last)]
        found = segment.view_index.ends_after_view(local_last, self.fmt)
        if found is None:
            self._ends = None
            return None
        low, lengths, positions = found
        self._ends = (segment, low, lengths, positions)
        return positions[bisect.bisect_right(lengths, local_last)]

    def _compressed(self, i: int) -> bool | None:
        """Whether segment ``i``'s batches are compressed (None: not known yet, a tiered segment no read met)."""
        known = self._codecs.get(i)
        if known is None and not isinstance(self.segments[i], RemoteLogSegment):
            header = _header_at(self.segments[i], 0)
            known = self._codecs[i] = bool(header is not None and header.compression and not header.is_control)
        return known

    def _decompressed(self, i: int, file_pos: int, bound: int) -> bool:
        """Whether every batch of segment ``i`` from ``file_pos`` to ``bound`` is decompressed at hand: kept by this
        view, or done by its read-ahead (only this view's reads take those: none goes before the read)."""
        segment, ahead = self.segments[i], self._ahead
        while file_pos < bound:
            ready = self._batches.get((segment, file_pos))
            if ready is None and ahead is not None:
                ready = ahead.done(i, file_pos)
            if ready is None:
                return False
            file_pos += ready[1]
        return True

    def lookup_in_memory(self, *, offset: int | None = None, position: int | None = None,
                         timestamp: int | None = None) -> bool:
        """Whether the lookup :meth:`position_of` (``offset``), :meth:`offset_at` (``position``) or
        :meth:`offset_for_timestamp` (``timestamp``) needs neither the store nor a decompression: the segment it
        looks in, and the next (where a lookup goes on past a gap), are local and plain. No I/O but the local
        indexes. (A lookup that passes over more segments than that, only over empty or aborted ones, could
        decompress on the request thread.)"""
        if not self.segments:
            return True
        if position is not None:
            if position < 0 or position >= self.length():
                return True
            i, _ = self._locate(position)
        elif offset is not None:
            if offset < self.start_offset or offset >= self.segments[-1].next_offset:
                return True
            i = max(0, bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1)
        else:
            i = next((k for k, s in enumerate(self.segments) if s.size and s.max_timestamp >= timestamp), None)
            if i is None:
                return True
        return all(self._compressed(k) is False and not isinstance(self.segments[k], RemoteLogSegment)
                   for k in range(i, min(i + 2, len(self.segments))) if k not in self._dropped)

    # -- reading -----------------------------------------------------------------------------------
    def read(self, pos: int, size: int) -> bytes:
        """``size`` bytes of the view from ``pos`` (fewer at the end). A sequential read resumes from the cursor
        the previous read left: (segment, position of the batch it ended in, bytes of that batch's lines already
        returned), so it neither looks anything up nor keeps rendered bytes between calls. Each request is one
        read of the segment and one C call that copies only the requested bytes of lines."""
        located, self._located = self._located, None
        if located is None or located[0] != pos:
            located = None
            total = self.length()
        else:
            total = located[1]
        self.lines = 0
        if pos >= total or size <= 0:
            if pos >= total and self.segments:
                self._reached = len(self.segments) - 1  # (a reader at the end has passed every segment before it)
            return b""
        size = min(size, total - pos)
        cursor = self._cursor
        sequential = cursor is not None and cursor[0] == pos
        if sequential:
            _, i, file_pos, skip = cursor
        elif located is not None and located[2] is not None:
            i, file_pos, skip = located[2]
        else:
            i, local = self._locate(pos)
            if i in self._dropped:
                raise DataLossError(f"{self.segments[i].log_path}: removed by retention or compaction after this "
                                    f"reader had read past it")
            entry = self.segments[i].view_index.floor_by_view(local, self.fmt)
            file_pos, cum = (entry.position, self.fmt.length(entry.stats)) if entry else (0, 0)
            skip = local - cum  # bytes of lines to pass over from file_pos: at most an index interval's worth
        first = i
        parts: list = []
        got = lines = 0
        # The segment whose size this read looked at last, that size, and whether it was active then.
        seen_at, seen, active = -1, -1, False
        while got < size and i < len(self.segments):
            if i in self._dropped:  # (a reader gone back, now reading on into a range it had passed)
                if got:
                    break
                raise DataLossError(f"{self.segments[i].log_path}: removed after this reader had read past it")
            segment = self.segments[i]
            # Active or not, looked at BEFORE its size: a segment sealed then has its final size, whereas the end of
            # an active one is the end of a batch that an append may still grow in place (tail_batch), so that no
            # batch need ever start there. A read in a worker thread (a tiered range, a decompression) races the
            # request thread's appends and rolls: asking ``active`` once the bytes were read is too late.
            seen_at, active = i, segment.active
            seen = segment.size
            if file_pos >= seen:
                if (active and seen) or i + 1 >= len(self.segments):
                    break  # the end of what an active segment had published (or of the view)
                i, file_pos, skip = i + 1, 0, 0  # (an empty one is passed over: a follower's, retired, is active)
                continue
            out, advanced, skip_after, ended = self._render(i, file_pos, skip, size - got)
            if not out and not advanced and skip_after == skip:
                break  # only an incomplete batch remains (an append in progress)
            if out:
                parts.append(out)
                got += len(out)
                lines += ended
            file_pos, skip = file_pos + advanced, skip_after
        self._reached = max(self._reached, first)
        if seen_at == i and active and file_pos >= seen:
            # The end of what an active segment had published: the end of its last batch, which an append may grow
            # in place, before or after a roll. No cursor: the next read locates its position again (by the view
            # index and the line lengths, which such a growth never changes).
            self._cursor = None
        else:
            self._cursor = (pos + got, i, file_pos, skip)
        if self._batches:
            current = self._batches.get((self.segments[i], file_pos)) if i < len(self.segments) else None
            self._batches.clear()  # only the batch the next read may go on in is kept
            if current is not None:
                self._batches[(self.segments[i], file_pos)] = current
            if sequential and self._snapshot is not None and self._cursor is not None:
                self._read_ahead(i, file_pos)
        self.lines = lines
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _render(self, i: int, file_pos: int, skip: int, want: int) -> tuple[bytes, int, int, int]:
        """At most ``want`` bytes of lines of the batches from ``file_pos``, after passing over ``skip`` bytes of
        their lines: (lines, file bytes advanced, skip from there, records whose line ends in them). Reads only as
        far as the window needs."""
        segment = self.segments[i]
        stop = _STOP
        if segment.aborted is not None:  # Kafka's aborted transactions reach into it: their batches have no lines
            header = _header_at(segment, file_pos)
            if header is not None and segment.is_aborted(header):
                return b"", header.size, skip, 0
            stop = _STOP_TRANSACTIONAL  # (each transactional batch comes back here, to be checked)
        if self._batches or self._ahead is not None:
            ready = self._ready(i, file_pos)
            if ready is not None:  # a batch decompressed already: the one the last read was in, or read ahead
                return self._render_plain(ready[0], ready[1], skip, want)
        if _speedups is not None:
            length = (skip + want) * 9 // 8 + READ_SLACK
            for _attempt in range(2):
                if len(self._scratch) < length:
                    self._scratch = bytearray(length)
                buf = segment.read_into(self._scratch, file_pos, length)
                short = len(buf) < length
                out, advanced, skip_after, need, ended = _speedups.render_window(
                    buf, skip, want, self.fmt.separator, self.fmt.null_marker, stop)
                if need < 0 and not (out or advanced or skip_after != skip) and whole_compressed(buf):
                    # A compressed batch, whole in what was read (most are: it is a tenth of its lines' size).
                    self._codecs[i] = True
                    try:
                        header = rec.parse_header(buf)
                        plain = self._plain(segment, file_pos, header, buf, 0)
                    finally:
                        del buf  # release the scratch buffer's export
                    self._keep(segment, file_pos, plain, header.size)
                    return self._render_plain(plain, header.size, skip, want)
                del buf  # release the scratch buffer's export
                if out or advanced or skip_after != skip or need == 0:
                    if i not in self._codecs:
                        self._codecs[i] = False  # (a tiered segment's first batch met: plain)
                    return out, advanced, skip_after, ended
                if need < 0 or short or need <= length:
                    break  # a compressed or control batch (rendered below), or nothing more to read
                length = need  # a batch larger than the window's guess: read it whole
        # A compressed or control batch, or no accelerator: one batch the generic way.
        for _, header, buf, at in segment.batches_from(file_pos):
            if header.compression and _speedups is not None:
                self._codecs[i] = True
                return self._render_compressed(segment, file_pos, header, buf, at, skip, want)
            if i not in self._codecs:
                self._codecs[i] = bool(header.compression)
            lines, _ = self.fmt.render(buf, at, header.size)
            if skip >= len(lines):
                return b"", header.size, skip - len(lines), 0
            end = min(len(lines), skip + want)
            ended = self._line_ends(buf, at, header.size, skip, end)
            if end == len(lines):
                return lines[skip:end], header.size, 0, ended
            return lines[skip:end], 0, end, ended
        return b"", 0, skip, 0

    def _line_ends(self, buf, at: int, size: int, start: int, end: int) -> int:
        """Records of the batch whose line ends within its rendered bytes [start, end) (the slow path's count: a
        value may hold "\n", so the bytes are not counted)."""
        ended, position = 0, 0
        for _, n in self.fmt.records_with_lines(buf, at, size):
            position += n
            if position > end:
                break
            ended += position > start
        return ended

    def _render_compressed(self, segment, file_pos: int, header, buf, at: int, skip: int, want: int
                           ) -> tuple[bytes, int, int, int]:
        """One compressed batch: decompressed once (kept while reads go on inside it: a reader of 8 KiB requests
        does not decompress a 256 KiB batch 32 times), then the same C renderer as plain batches."""
        plain = self._plain(segment, file_pos, header, buf, at)
        self._keep(segment, file_pos, plain, header.size)
        return self._render_plain(plain, header.size, skip, want)

    def _plain(self, segment, file_pos: int, header, buf, at: int) -> bytes:
        """The compressed batch at ``file_pos`` (``buf[at:]`` holds it whole) decompressed: from the batches
        decompressed last, or now (CPU work: the FUSE layer reads in a worker thread what :meth:`in_memory` does
        not find decompressed)."""
        key = (segment, file_pos, header.crc)
        plain = plain_batches.get(key)
        if plain is None:
            plain = decompress(buf, at)
            plain_batches.put(key, plain)
        return plain

    def _keep(self, segment, file_pos: int, plain: bytes, stored_size: int) -> None:
        """Keep a decompressed batch until the read that uses it is done (a read the request thread could not
        finish is repeated in a worker thread, from its start) and, if the next read goes on inside it, longer."""
        self._batches[(segment, file_pos)] = (plain, stored_size)

    def _ready(self, i: int, file_pos: int) -> tuple[bytes, int] | None:
        """(the batch at ``file_pos`` of segment ``i`` decompressed, its size as stored) if it is at hand: kept
        from an earlier read, or read ahead (waited for while a worker decompresses it: :meth:`in_memory` says
        whether it is done). None otherwise: the caller's own path renders the batch, or reports what is wrong."""
        segment = self.segments[i]
        ready = self._batches.get((segment, file_pos))
        if ready is not None or self._ahead is None:
            return ready
        ready = self._ahead.take(i, file_pos)
        if ready is not None:
            self._keep(segment, file_pos, *ready)
        return ready

    def _read_ahead(self, i: int, file_pos: int) -> None:
        """A sequential reader is in the batch at ``file_pos`` of segment ``i``: if that is a compressed batch,
        the ones after it are decompressed ahead (:class:`ReadAhead`)."""
        segment = self.segments[i]
        if file_pos >= segment.size and not segment.active and i + 1 < len(self.segments):
            i, file_pos = i + 1, 0  # (the next read goes on in the next segment)
            segment = self.segments[i]
        current = self._batches.get((segment, file_pos))
        if current is None:
            return
        if self._ahead is None:
            if self._ahead_pool is None:
                return
            self._ahead = ReadAhead(self.segments, self._ahead_pool)
        self._ahead.follow(i, file_pos, current[1], len(current[0]))

    def _render_plain(self, plain: bytes, stored_size: int, skip: int, want: int) -> tuple[bytes, int, int, int]:
        out, advanced, skip_after, _, ended = _speedups.render_window(plain, skip, want, self.fmt.separator,
                                                                      self.fmt.null_marker)
        if advanced >= len(plain):
            return out, stored_size, skip_after, ended  # the batch is done: on to the next one, in the file
        return out, 0, skip_after, ended

    def _seek(self, segment, file_pos: int, header, buf, at: int, offset: int = -1, position: int = -1
              ) -> tuple[int, int | None]:
        """In the batch at ``file_pos`` (``buf[at:]`` holds it whole): (bytes of the lines before the first record
        whose offset is ``offset`` or more, or whose line holds byte ``position`` of the batch's lines; that
        record's offset), or (all the batch's lines, None). In C, no Python object per record; a compressed batch
        is decompressed once (:meth:`_plain`: kept for the read of the line looked up; the FUSE layer looks up in a
        worker thread what :meth:`lookup_in_memory` does not find plain and local)."""
        if header.is_control or segment.is_aborted(header):
            return 0, None
        if _speedups is None:
            passed = 0
            for rec_offset, n in self.fmt.records_with_lines(buf, at, header.size):
                if (0 <= offset <= rec_offset) or (0 <= position < passed + n):
                    return passed, rec_offset
                passed += n
            return passed, None
        if header.compression:
            batch = self._plain(segment, file_pos, header, buf, at)
        else:
            batch = memoryview(buf)[at : at + header.size]
        passed, found = _speedups.seek_line(batch, self.fmt.separator, self.fmt.null_marker, offset, position)
        return passed, (found if found >= 0 else None)

    def _readable(self, i: int) -> LogSegment:
        """Segment ``i``, unless this view let it go (:meth:`release_passed`): then DataLossError (EIO), as a read
        of it would be, never an answer from another segment."""
        if i in self._dropped:
            raise DataLossError(f"{self.segments[i].log_path}: removed by retention or compaction after this "
                                f"reader had read past it")
        return self.segments[i]

    def offset_at(self, pos: int) -> int | None:
        """Offset of the record whose line holds byte ``pos``, or None if out of range."""
        if pos < 0 or pos >= self.length():
            return None
        i, local = self._locate(pos)
        segment = self._readable(i)
        entry = segment.view_index.floor_by_view(local, self.fmt)
        file_pos, cum = (entry.position, self.fmt.length(entry.stats)) if entry else (0, 0)
        for batch_pos, header, buf, at in segment.batches_from(file_pos):
            passed, found = self._seek(segment, batch_pos, header, buf, at, position=local - cum)
            if found is not None:
                return found
            cum += passed
        return None

    def position_of(self, offset: int) -> int | None:
        """View position where record ``offset`` (or the first retained one after it) starts; the view
        length for the log end offset; None below the start offset or past the end."""
        if not self.segments or offset < self.start_offset:
            return None
        end_offset = self.segments[-1].next_offset
        if offset > end_offset:
            return None
        if offset == end_offset:
            return self.length()
        bases = [s.base_offset for s in self.segments]
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        while i < len(self.segments):
            segment = self.segments[i]
            if offset < segment.next_offset:
                self._readable(i)
                entry = segment.view_index.floor_by_offset(offset)
                file_pos, cum = (entry.position, self.fmt.length(entry.stats)) if entry else (0, 0)
                for batch_pos, header, buf, at in segment.batches_from(file_pos):
                    passed, found = self._seek(segment, batch_pos, header, buf, at,
                                               offset=-1 if header.last_offset < offset else offset)
                    if found is not None:
                        return self._start(i) + cum + passed - (self._prefix if i == 0 else 0)
                    cum += passed
            i += 1
            offset = max(offset, self.segments[i].base_offset) if i < len(self.segments) else offset
        return self.length()

    def offset_for_timestamp(self, timestamp: int) -> int:
        """The earliest offset of this view whose record's timestamp is at or after ``timestamp`` (each segment's
        time index, then a bounded scan, as :meth:`Log.offset_for_timestamp`), or the view's end offset."""
        for i, segment in enumerate(self.segments):
            if not segment.size or segment.max_timestamp < timestamp:
                continue
            found = self._readable(i).find_offset_by_timestamp(timestamp, self.start_offset)
            if found is not None:
                return found
        return self.segments[-1].next_offset if self.segments else self.start_offset

    def release(self) -> None:
        """Let the storage close the segments this view pinned (once its files are gone), after any read-ahead
        still reading them."""
        self._batches.clear()
        snapshot, ahead = self._snapshot, self._ahead
        self._ahead = None
        self.segments = []
        if snapshot is None:
            return
        if ahead is None:
            snapshot.release()
        else:
            ahead.stop(snapshot.release)


# segment -> {(offset, format): view bytes of its records below offset}: a log start inside a batch is measured once
# per segment (a view made on the request thread finds it here; measuring may need a tiered fetch, which only a
# worker thread may do: :func:`measure_start`).
_PREFIXES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def measure_start(log: Log) -> None:
    """Measure the view bytes before the log start when it lies inside a batch (DeleteRecords), in a worker
    thread: a view made on the request thread then needs no fetch or decompression for it."""
    with log.snapshot(tiers=True) as snapshot:
        SegmentView(snapshot.segments, snapshot.log_start_offset, LineFormat.of(log.config))


def start_measured(log: Log) -> bool:
    """Whether a view of ``log`` made now finds the view bytes before its start without a fetch: the start is at
    a segment's base, in a local segment (measured there: at most one batch decompressed), or inside a tiered
    segment and measured already (:func:`measure_start`). No I/O. (A DeleteRecords in a worker thread between this
    answer and the view's making measures the new start itself, right after; a view made in between fetches.)"""
    start = log.log_start_offset
    if not log.remote_segments:
        return True
    first_local = log.segments.as_list()[0].base_offset  # (as Log.view_segments: the tiered ones below it are read)
    for segment in log.remote_segments:
        if segment.next_offset > first_local:
            return True
        if segment.next_offset > start:
            if start <= segment.base_offset:
                return True
            known = _PREFIXES.get(segment)
            return known is not None and (start, LineFormat.of(log.config)) in known
    return True


def view_positions(start_offset: int, rewrite_count: int, fmt: LineFormat) -> tuple:
    """A value equal for two views of a log exactly when they give every record the same position: the same log
    start, no rewrite of the log's records between them (:attr:`Log.rewrite_count`), the same line format."""
    return (start_offset, rewrite_count, fmt)


def log_positions(log: Log) -> tuple:
    """:func:`view_positions` of the view a new open of ``log`` gets now."""
    return view_positions(log.log_start_offset, log.rewrite_count, LineFormat.of(log.config))


def live_view(log: Log) -> SegmentView:
    """The view as a new open would see it now, made now (:class:`LiveViews` keeps one per log for a mount). Its
    segments are not pinned: its length needs no file, but anything that reads them (a lookup) holds the log's
    lock, and none of it is kept across awaits."""
    with log.lock:
        return SegmentView(log.view_segments(), log.log_start_offset, LineFormat.of(log.config))


class LiveViews:
    """Each log's live view (:func:`live_view`), kept until the log's segment list, start or format changes: the
    mount's (the FUSE operations hold one), asked for every ``stat``. An entry goes with its log. Used on the
    request thread only."""

    def __init__(self) -> None:
        self._views: "weakref.WeakKeyDictionary[Log, tuple[tuple, SegmentView]]" = weakref.WeakKeyDictionary()

    def get(self, log: Log) -> SegmentView:
        fmt = LineFormat.of(log.config)
        key = (log.layout_version, log.log_start_offset, fmt)
        cached = self._views.get(log)
        if cached is not None and cached[0] == key:
            return cached[1]
        view = live_view(log)
        self._views[log] = (key, view)
        return view


def open_view(log: Log, *, write_only: bool = False, ahead_pool: Executor | None = None) -> SegmentView:
    """A pinned view for a file handle: consistent under retention and compaction until released; the segments
    rolled from now on are pinned at the roll. ``write_only``: a handle that never reads (its view gives lengths),
    which lets go of removed segments at every roll. ``ahead_pool``: :class:`SegmentView`'s."""
    snapshot = log.snapshot(tiers=True, follow=True, write_only=write_only)
    return SegmentView(snapshot.segments, snapshot.log_start_offset, LineFormat.of(log.config), snapshot,
                       ahead_pool)

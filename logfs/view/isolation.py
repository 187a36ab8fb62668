"""The ``read_uncommitted`` view of a segment that Kafka's aborted transactions reach into
(``logfs.isolation.level=read_uncommitted``, CONTRACT section 13: aborted records are lines, as such a consumer reads
them; control batches never are).

A segment's ``.viewindex`` is written once, for ``read_committed``: its entries and totals count the batches of
aborted transactions as no lines. Rather than a second index file per isolation level (written, renamed, tiered and
deleted with the segment), the segment measures those batches once (:meth:`LogSegment.measure_aborted`, the loader's
or a worker thread's walk, never a request's: :class:`~logfs.storage.local.txn_index.AbortedBatches`), and a
read_uncommitted view reads it through :class:`UncommittedSegment`: the same segment, no aborted ranges, and a view
index whose entries are the stored ones plus the aborted batches before their positions. Segments without aborted
transactions (every segment logfs writes itself) read the same at both levels and are not wrapped.

Costs: a lookup by view length bisects the entries one ``pread`` each (``ViewIndex.floor_by_view`` searches its file
in one call), about 20 reads for a full 1 GiB segment; reads that go on from a cursor look nothing up.
Nothing here imports pyfuse3 or trio.
"""

from __future__ import annotations

from ..storage.format import records as rec
from ..storage.format.lines import LineStats
from ..storage.local.index import ViewEntry, ViewIndex
from ..storage.local.txn_index import AbortedBatches


class UncommittedIndex:
    """``index`` (a segment's :class:`ViewIndex`) as a read_uncommitted view reads it: each entry's stats plus those
    of ``aborted`` batches before its position. The methods the text view uses, with ViewIndex's meaning."""

    def __init__(self, index: ViewIndex, aborted: AbortedBatches):
        self.index = index
        self.aborted = aborted

    def _entry(self, entry: ViewEntry | None) -> ViewEntry | None:
        if entry is None:
            return None
        return ViewEntry(entry.offset, entry.position, entry.stats + self.aborted.before(entry.position))

    def get(self, i: int) -> ViewEntry:
        return self._entry(self.index.get(i))

    @property
    def entries(self) -> int:
        return self.index.entries

    def last(self) -> ViewEntry | None:
        return self._entry(self.index.last())

    def floor_by_offset(self, target: int) -> ViewEntry | None:
        return self._entry(self.index.floor_by_offset(target))

    def floor_by_position(self, position: int) -> ViewEntry | None:
        return self._entry(self.index.floor_by_position(position))

    def _floor_slot(self, target: int, fmt) -> int:
        """The greatest entry whose view length before it (in ``fmt``) is <= ``target``; -1 if none. O(log n)
        reads (the lengths grow with the entries: both summands do)."""
        lo, hi = 0, self.index.entries  # invariant: slots < lo qualify, slots >= hi do not
        while lo < hi:
            mid = (lo + hi) // 2
            if fmt.length(self.get(mid).stats) <= target:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def floor_by_view(self, target: int, fmt) -> ViewEntry | None:
        slot = self._floor_slot(target, fmt)
        return self.get(slot) if slot >= 0 else None

    def ends_after_view(self, target: int, fmt, count: int = 16) -> tuple[int, list[int], list[int]] | None:
        """As :meth:`ViewIndex.ends_after_view`."""
        floor = self._floor_slot(target, fmt)
        first = max(floor, 0)
        n = min(self.index.entries - first, count + 1)
        if floor + 1 >= self.index.entries or n <= 0:
            return None
        lengths, positions = [], []
        for slot in range(first, first + n):
            entry = self.get(slot)
            lengths.append(fmt.length(entry.stats))
            positions.append(entry.position)
        if floor < 0:
            return 0, lengths, positions
        return lengths[0], lengths[1:], positions[1:]


class UncommittedSegment:
    """A segment with aborted transactions as a read_uncommitted view reads it: no aborted ranges (every batch but
    the control batches has lines), its view index and totals with the aborted batches' lines. Everything else is
    the segment's (attributes read through, live: size, active, reads). The view keeps one per segment it holds, and
    gives the storage the segment itself (:func:`unwrapped`) where identity matters (a snapshot's pins)."""

    aborted = None

    def __init__(self, segment):
        self.inner = segment
        self.view_index = UncommittedIndex(segment.view_index, segment.uncommitted)
        self._extra = segment.uncommitted.total

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        return False

    @property
    def stats(self) -> LineStats:
        return self.inner.stats + self._extra

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"UncommittedSegment({self.inner!r})"


def uncommitted(segment):
    """``segment`` as a read_uncommitted view reads it: wrapped if Kafka's aborted transactions reach into it. Its
    aborted batches are measured already (the loader, or the setting's change, did it in a worker thread); a segment
    not measured yet (a partition that came in another way, such as a move between log directories, after the
    setting) is measured here, once."""
    if segment.aborted is None:
        return segment
    if segment.uncommitted is None:
        segment.measure_aborted()
    return UncommittedSegment(segment)


def unwrapped(segment):
    """The storage's segment behind a view's (itself if not wrapped)."""
    return segment.inner if isinstance(segment, UncommittedSegment) else segment

"""Kafka's transaction index (``<base>.txnindex``, ``TransactionIndex``): the aborted transactions of a partition, so
that a reader shows what a ``read_committed`` consumer reads (CONTRACT section 13).

A Kafka broker appends one 34-byte entry to the ``.txnindex`` of the segment that receives an abort marker:
``version`` (int16, 0), ``producerId``, ``firstOffset`` (the transaction's first record), ``lastOffset`` (the
abort marker's offset) and ``lastStableOffset`` (int64 each, big-endian). A transactional batch of producer P whose
base offset lies in ``[firstOffset, lastOffset]`` of one of P's entries holds aborted records: a
``read_committed`` consumer never sees them (Kafka's fetch hands it these entries, and its consumer skips P's
batches from ``firstOffset`` to the marker). An entry may sit in a later segment than the records it aborts, so
the loader reads every ``.txnindex`` of a partition and gives each segment the entries that reach into it.

logfs never writes transactional batches itself (appends and the sink's publish are not transactional): these
files come with segments a Kafka broker wrote, and logfs keeps each one beside its segment (renamed, moved and
deleted with it). A segment the cleaner rewrites gets its own (:func:`write_txn_index`, written as
``.txnindex.cleaned`` with the other files and swapped in with them): the compressor keeps every batch, so the
same entries; compaction keeps the entries of the abort markers it keeps (``cleaner/compaction``). Ongoing
transactions (no marker yet, above Kafka's last stable offset) are not hidden: a stopped broker's log rarely has
one, and the next broker to load it aborts it.

A RUNNING broker's log (``storage/broker``) is read while its transactions are open, and its ``.txnindex`` entry
comes after the records it aborts. There :class:`TransactionState` derives both from the data as it is indexed,
as Kafka's own ``ProducerStateManager`` does: per producer id, the first offset of its open transaction; a control
batch closes it (an abort adds the range to :class:`AbortedRanges`); the last stable offset (LSO) is the first
offset of the oldest open transaction, and a ``read_committed`` consumer reads nothing from there on.

``logfs.isolation.level=read_uncommitted`` shows the aborted records too: :class:`AbortedBatches` is what a segment
measures of its aborted batches (positions, lines) so that its one ``.viewindex`` serves both levels
(:mod:`logfs.view.isolation`); a running broker's partition at that level keeps no :class:`TransactionState`.
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import Iterable, NamedTuple

from ..format import records as rec
from ..format.lines import ZERO_STATS, LineStats
from ..names import TXN_INDEX_SUFFIX

ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset
    last_stable_offset: int


def read_txn_index(path: str) -> list[AbortedTxn]:
    """The entries of one ``.txnindex`` (a partial entry at the end, a crash's, is ignored; an unknown version
    stops the read, as Kafka's reader fails there)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return parse_txn_index(data)


def parse_txn_index(data: bytes) -> list[AbortedTxn]:
    """The entries of a ``.txnindex``'s bytes (as :func:`read_txn_index`): a tiered segment's object."""
    out = []
    for at in range(0, len(data) - ENTRY.size + 1, ENTRY.size):
        version, producer_id, first, last, stable = ENTRY.unpack_from(data, at)
        if version != 0:
            break
        out.append(AbortedTxn(producer_id, first, last, stable))
    return out


def encode_txn_index(txns: Iterable[AbortedTxn]) -> bytes:
    """A ``.txnindex``'s bytes, in Kafka's format (version 0 entries, in the order given)."""
    return b"".join(ENTRY.pack(0, *txn) for txn in txns)


def write_txn_index(path: str, txns: Iterable[AbortedTxn]) -> None:
    """Write (and fsync) a ``.txnindex`` of ``txns``, in Kafka's format: a rewritten segment's (the cleaner's
    ``.cleaned`` file, which the swap renames with the segment's others)."""
    data = encode_txn_index(txns)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:  # (a write may take part of it)
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


class AbortedRanges:
    """The aborted transactions that reach into one segment (or, on a broker mount, a partition's):
    ``covers(producer_id, offset)`` in O(log n) per producer. Shared by the segment's readers on any thread;
    :meth:`add` (one writer) replaces a producer's lists whole, so a reader sees the old ones or the new ones."""

    __slots__ = ("_by_producer", "_stable", "count")

    def __init__(self, txns: Iterable[AbortedTxn]):
        by_producer: dict[int, tuple[list[int], list[int]]] = {}
        stable: dict[tuple[int, int], int] = {}  # (producer, first offset) -> the entry's last stable offset
        for txn in sorted(txns, key=lambda t: (t.producer_id, t.first_offset)):
            firsts, lasts = by_producer.setdefault(txn.producer_id, ([], []))
            if firsts and firsts[-1] == txn.first_offset:
                continue  # (the same transaction, named twice)
            firsts.append(txn.first_offset)
            lasts.append(txn.last_offset)
            stable[(txn.producer_id, txn.first_offset)] = txn.last_stable_offset
        self._by_producer = by_producer
        self._stable = stable
        self.count = sum(len(f) for f, _ in by_producer.values())

    def covers(self, producer_id: int, offset: int) -> bool:
        """Whether a transactional batch of ``producer_id`` at base offset ``offset`` belongs to an aborted
        transaction. (A producer's transactions do not overlap: the last one that starts at or before ``offset``
        is the only candidate.)"""
        ranges = self._by_producer.get(producer_id)
        if ranges is None:
            return False
        firsts, lasts = ranges
        i = bisect.bisect_right(firsts, offset) - 1
        return i >= 0 and offset <= lasts[i]

    def add(self, txn: AbortedTxn) -> None:
        """One more aborted transaction (learned from an abort marker as the log is read). Copy-on-write: the
        producer's two lists are rebuilt and swapped in as one tuple."""
        firsts, lasts = self._by_producer.get(txn.producer_id, ((), ()))
        i = bisect.bisect_left(firsts, txn.first_offset)
        if i < len(firsts) and firsts[i] == txn.first_offset:
            return  # (known already)
        self._stable[(txn.producer_id, txn.first_offset)] = txn.last_stable_offset
        self._by_producer[txn.producer_id] = ([*firsts[:i], txn.first_offset, *firsts[i:]],
                                              [*lasts[:i], txn.last_offset, *lasts[i:]])
        self.count += 1

    def txns(self, first_offset: int = 0, end_offset: int = 1 << 63) -> list[AbortedTxn]:
        """The aborted transactions that reach into offsets ``[first_offset, end_offset)``, in the order of their
        abort markers (a ``.txnindex``'s order): what tiering uploads as a segment's ``.txnindex`` object."""
        out = [AbortedTxn(producer_id, first, last, self._stable.get((producer_id, first), -1))
               for producer_id, (firsts, lasts) in list(self._by_producer.items())
               for first, last in zip(firsts, lasts) if first < end_offset and last >= first_offset]
        return sorted(out, key=lambda t: (t.last_offset, t.producer_id))

    @classmethod
    def union(cls, ranges: Iterable["AbortedRanges | None"]) -> "AbortedRanges | None":
        """The aborted transactions of several segments' ranges together (a segment that replaces them, which
        spans their offsets); None when none has any. One range set is returned as it is (shared: it is never
        changed once a stopped broker's log is loaded)."""
        present = [r for r in ranges if r is not None]
        if len(present) <= 1:
            return present[0] if present else None
        out = cls(())
        for r in present:
            for txn in r.txns():
                out.add(txn)
        return out

    def __bool__(self) -> bool:
        return self.count > 0

    def __repr__(self) -> str:
        return f"AbortedRanges({self.count})"


class AbortedBatches:
    """The batches of one segment that Kafka's aborted transactions hold, by position, with the
    :class:`~logfs.storage.format.lines.LineStats` of their records: what a ``read_uncommitted`` view
    (``logfs.isolation.level``, :mod:`logfs.view.isolation`) adds to the segment's view index, whose entries and
    totals count these batches as no lines. So one ``.viewindex`` serves both isolation levels: an entry's stats
    for read_uncommitted are its own plus :meth:`before` its position. Immutable (a segment's aborted ranges are
    fixed once it is loaded); shared by any thread."""

    __slots__ = ("positions", "_before", "total")

    def __init__(self, found: Iterable[tuple[int, LineStats]]):
        positions, before = [], [ZERO_STATS]
        for position, stats in found:
            positions.append(position)
            before.append(before[-1] + stats)
        self.positions = positions
        self._before = before
        self.total = before[-1]  # (the lines of all of them)

    def before(self, position: int) -> LineStats:
        """The stats of the aborted batches that start before ``position`` (O(log n))."""
        return self._before[bisect.bisect_left(self.positions, position)]

    def __repr__(self) -> str:
        return f"AbortedBatches({len(self.positions)})"


def aborted_by_segment(directory: str, names: Iterable[str], bases: list[int]) -> dict[int, AbortedRanges]:
    """base offset -> the aborted transactions reaching into that segment (offsets from its base to the next
    segment's), for the segments of ``bases`` (ascending) of the partition in ``directory``, from every live
    ``.txnindex`` among ``names``. Segments no aborted transaction reaches are left out."""
    txns: list[AbortedTxn] = []
    for name in names:
        if name.endswith(TXN_INDEX_SUFFIX):
            txns += read_txn_index(os.path.join(directory, name))
    if not txns:
        return {}
    out = {}
    for i, base in enumerate(bases):
        end = bases[i + 1] if i + 1 < len(bases) else 1 << 63
        reaching = [t for t in txns if t.first_offset < end and t.last_offset >= base]
        if reaching:
            out[base] = AbortedRanges(reaching)
    return out


# Kafka's control record (ControlRecordType): its key is version (int16) and type (int16): 0 ABORT, 1 COMMIT.
ABORT, COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
NO_OPEN_TRANSACTION = 1 << 63


def _varint(buf, at: int) -> tuple[int, int]:
    """A zigzag varint at ``at``: (value, position after it)."""
    shift = raw = 0
    while True:
        b = buf[at]
        at += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), at
        shift += 7


class ControlRecord(NamedTuple):
    timestamp_delta: int
    offset_delta: int
    key: bytes
    value: bytes


def control_record(batch) -> ControlRecord:
    """The one record of the control batch ``batch`` (one whole batch, uncompressed as Kafka writes them; the
    record decoder yields nothing for control batches): what the cleaner needs to write it again with a delete
    horizon."""
    _length, at = _varint(batch, rec.HEADER_SIZE)
    at += 1  # attributes
    timestamp_delta, at = _varint(batch, at)
    offset_delta, at = _varint(batch, at)
    fields = []
    for _ in range(2):  # key, value
        length, at = _varint(batch, at)
        fields.append(bytes(batch[at : at + max(length, 0)]))
        at += max(length, 0)
    return ControlRecord(timestamp_delta, offset_delta, *fields)


def control_type(batch) -> int:
    """The type of the control batch ``batch`` (one whole batch, uncompressed as Kafka writes them): ABORT or
    COMMIT (another value for a type logfs does not know)."""
    key = control_record(batch).key
    if len(key) < _CONTROL_KEY.size:
        return -1
    return _CONTROL_KEY.unpack_from(key, 0)[1]


class TransactionState:
    """A partition's transactions as its batches show them, read in offset order (:meth:`see`, each whole batch
    once): ``open`` maps a producer id to the first offset of its open transaction; a control batch closes it, an
    abort adding ``[first, marker]`` to ``aborted``. :meth:`stable` is the last stable offset: what starts there or
    later is not yet what a ``read_committed`` consumer reads. One writer (the follower); readers use ``aborted``."""

    __slots__ = ("open", "aborted")

    def __init__(self, aborted: AbortedRanges | None = None):
        self.open: dict[int, int] = {}
        self.aborted = aborted if aborted is not None else AbortedRanges(())

    def see(self, batch, header) -> None:
        """Account one whole batch (``batch`` holds it from its first byte; ``header`` its parsed header)."""
        if not header.attributes & rec.ATTR_TRANSACTIONAL:
            return
        pid = header.producer_id
        if header.attributes & rec.ATTR_CONTROL:  # a control batch: the transaction's end
            first = self.open.pop(pid, None)
            if first is not None and control_type(batch) == ABORT:
                self.aborted.add(AbortedTxn(pid, first, header.base_offset, self.stable()))
        elif pid not in self.open:
            self.open[pid] = header.base_offset

    def stable(self) -> int:
        """The last stable offset: the first offset of the oldest open transaction (NO_OPEN_TRANSACTION: none)."""
        return min(self.open.values()) if self.open else NO_OPEN_TRANSACTION

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
deleted with it). Ongoing transactions (no marker yet, above Kafka's last stable offset) are not hidden: a stopped
broker's log rarely has one, and the next broker to load it aborts it.
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import Iterable, NamedTuple

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
    out = []
    for at in range(0, len(data) - ENTRY.size + 1, ENTRY.size):
        version, producer_id, first, last, stable = ENTRY.unpack_from(data, at)
        if version != 0:
            break
        out.append(AbortedTxn(producer_id, first, last, stable))
    return out


class AbortedRanges:
    """The aborted transactions that reach into one segment: ``covers(producer_id, offset)`` in O(log n) per
    producer. Immutable; shared by the segment's readers on any thread."""

    __slots__ = ("_by_producer", "count")

    def __init__(self, txns: Iterable[AbortedTxn]):
        by_producer: dict[int, tuple[list[int], list[int]]] = {}
        for txn in sorted(txns, key=lambda t: (t.producer_id, t.first_offset)):
            firsts, lasts = by_producer.setdefault(txn.producer_id, ([], []))
            firsts.append(txn.first_offset)
            lasts.append(txn.last_offset)
        self._by_producer = by_producer
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

    def __bool__(self) -> bool:
        return self.count > 0

    def __repr__(self) -> str:
        return f"AbortedRanges({self.count})"


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

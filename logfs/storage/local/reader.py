"""Read-only access to a partition directory, for processes other than the daemon (the Spark source).

It never takes ``.lock`` (the daemon holds it), never writes, renames, truncates or creates anything, and never
mmaps (the daemon truncates a rolled segment's indexes, and touching a mapping past a truncated end would be
SIGBUS): only ``listdir``, ``open(O_RDONLY)`` and ``pread``. The batch framing is read by the same code as the
daemon's (:class:`~logfs.storage.local.segment_file.SegmentFile`), and the offset index by its entry layout in
:mod:`~logfs.storage.local.index`, so a change of format lands once.

What it relies on, all part of the on-disk contract:

- ``<20-digit base offset>.log`` live segments. Files ending in ``.deleted`` (retention), ``.cleaned`` and
  ``.swap`` (compaction in progress) are never read.
- ``.index``: an entry names the last offset of the batch starting at that position. An active index is
  preallocated, so it ends in all-zero slots. The index is only a hint: every position it gives is checked
  against the log, and a missing or inconsistent index means a scan from the segment start.
- A batch is complete once all ``batchLength + 12`` bytes are in the file and its CRC holds. The daemon writes a
  new batch with one ``pwrite``, and grows the last batch of the active segment in place: the new records past
  the end first, then the rewritten header. So at the tail of the last segment an invalid batch is one being
  written: it is read again, and if still not whole, reading stops before it (it is read on the next call).
  Elsewhere an invalid batch ends what is read of that segment (the daemon's recovery would truncate it).

Concurrent retention and compaction: a segment that is open keeps its bytes (the fd stays valid after the
rename to ``.deleted`` and the unlink). A segment that disappeared between listing and opening makes the reader
list again and continue with the next live segment. While a ``.log.swap`` file exists (a compaction swap in
flight: replaced segments renamed away, the swap not yet live) listings are retried briefly so the records
being swapped are not skipped.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from typing import Iterator

from ..format import records as rec
from ..checkpoints import LOG_START_OFFSET, read_checkpoint
from ..errors import CorruptRecordError, DataLossError
from .index import OffsetIndex, TimeIndex
from ..names import (
    INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, filename_prefix, parse_segment_file,
)
from .segment_file import SegmentFile
from .txn_index import AbortedRanges, read_txn_index

log = logging.getLogger(__name__)

_ENTRY = OffsetIndex.ENTRY
_TIME_ENTRY = TimeIndex.ENTRY
_READ_CHUNK = 256 * 1024
SWAP_WAIT_SECONDS = 1.0  # how long a listing waits for an in-flight compaction swap to finish
_MAX_RELISTS = 1000
_TAIL_RETRIES = 5  # re-reads of an invalid last batch of the last segment (being grown in place) before stopping
_TAIL_REGROWS = 50  # times one walk of the last segment takes its size again because its last batch grew


def _base_of(name: str) -> int | None:
    """Base offset of a live ``.log`` file's name, else None."""
    parsed = parse_segment_file(name)
    return parsed[0] if parsed is not None and parsed[1] == LOG_SUFFIX and not parsed[2] else None


class _IndexEntries:
    """A ``.index`` as a sequence of entries read with pread (never read whole: an active index is preallocated
    to segment.index.bytes). Slots past the entries are all-zero; so is a slot past the end of a file the daemon
    just trimmed. (0, 0) is never a real entry: the first entry comes only after index.interval.bytes.) An
    empty slot is None and sorts after every entry."""

    def __init__(self, path: str, entry=_ENTRY):
        self.entry = entry
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.slots = os.fstat(self.fd).st_size // entry.size

    def close(self) -> None:
        os.close(self.fd)

    def __len__(self) -> int:
        return self.slots

    def __getitem__(self, i: int) -> tuple[int, int] | None:
        data = os.pread(self.fd, self.entry.size, i * self.entry.size)
        if len(data) < self.entry.size:
            return None
        entry = self.entry.unpack(data)
        return None if entry == (0, 0) else entry

    def floor(self, rel_target: int) -> int:
        """Slot of the greatest entry whose first field (relative offset; timestamp in a ``.timeindex``) is
        <= ``rel_target``, or -1."""
        return bisect.bisect_left(self, True, key=lambda e: e is None or e[0] > rel_target) - 1

    def count(self) -> int:
        """Number of entries (slots before the first empty one)."""
        return bisect.bisect_left(self, True, key=lambda e: e is None)


def time_index_floor(data: bytes, timestamp: int) -> int | None:
    """Relative offset of the greatest entry of a ``.timeindex`` (its bytes) whose timestamp is <= ``timestamp``,
    or None. Entries are (max timestamp so far, relative offset), appended only when the segment's largest
    timestamp grew; an all-zero slot ends them (an active index is preallocated). Used only as a place to start
    a scan: every record before the entry's offset has a timestamp below the entry's, hence below ``timestamp``."""
    out = None
    for ts, rel in _TIME_ENTRY.iter_unpack(data[: len(data) - len(data) % _TIME_ENTRY.size]):
        if (ts, rel) == (0, 0) or ts > timestamp:
            break
        out = rel
    return out


def first_offset_at_or_after(batches, timestamp: int, start: int) -> int | None:
    """Kafka's ``offsetsForTimes`` over ``batches`` ((header, batch bytes) pairs in offset order): the first
    offset >= ``start`` of a record whose timestamp is >= ``timestamp``, or None. Timestamps are not assumed to
    grow: a batch is skipped only when its max timestamp is below, and a batch is searched record by record (a
    LogAppendTime batch's records all have its max timestamp). A transaction marker counts, as in Kafka (a
    control batch's one record, at the coordinator's time); so do aborted records."""
    for header, data in batches:
        if header.max_timestamp < timestamp or header.last_offset < start:
            continue
        if header.is_control:
            return max(header.base_offset, start)
        append_time = header.timestamp_type == 1
        for r in rec.decode_raw(data):
            if r.offset >= start and (header.max_timestamp if append_time else r.timestamp) >= timestamp:
                return r.offset
    return None


class SegmentReader(SegmentFile):
    """One live segment opened read-only: its ``.log`` by a read-only fd (``FileNotFoundError`` if it is gone
    already), its ``.index`` consulted by path as a hint. The size is the file's when opened."""

    def __init__(self, directory: str, base: int):
        self.base = base
        stem = os.path.join(directory, filename_prefix(base))
        self.log_path = stem + LOG_SUFFIX
        self.index_path = stem + INDEX_SUFFIX
        self.fd = os.open(self.log_path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the sparse offset index: only a hint, every position is checked against the log ---------------
    def _checked(self, entry: tuple[int, int] | None) -> bool:
        """Whether the batch at the entry's position is there and can hold the entry's offset (Kafka's own
        writer indexes the last offset of a whole append, which may span several batches)."""
        if entry is None or entry[1] >= self.size:
            return False
        try:
            header = rec.parse_header(self.read(entry[1], rec.HEADER_SIZE))
        except CorruptRecordError:
            return False
        return self.base <= header.base_offset <= self.base + entry[0]

    def _position_from(self, pick) -> int:
        try:
            index = _IndexEntries(self.index_path)
        except FileNotFoundError:
            return 0
        try:
            i = pick(index)
            for _ in range(64):
                entry = index[i] if i >= 0 else None
                if i < 0:
                    break
                if self._checked(entry):
                    return entry[1]
                i -= 1  # indexed before its batch was written, or an index we cannot trust: an earlier one
            return 0
        finally:
            index.close()

    def seek_position(self, offset: int) -> int:
        """A file position at or before the batch holding ``offset`` (the greatest usable index entry whose
        offset is <= it), else 0."""
        return self._position_from(lambda index: index.floor(offset - self.base))

    def time_index_floor(self, timestamp: int) -> int | None:
        """Relative offset of the greatest ``.timeindex`` entry whose timestamp is <= ``timestamp`` (binary
        search by pread), or None (no entry, or no time index)."""
        try:
            index = _IndexEntries(self.index_path[: -len(INDEX_SUFFIX)] + TIME_INDEX_SUFFIX, _TIME_ENTRY)
        except FileNotFoundError:
            return None
        try:
            slot = index.floor(timestamp)
            entry = index[slot] if slot >= 0 else None
            return entry[1] if entry is not None else None
        finally:
            index.close()

    def last_entry_position(self) -> int:
        """The position of the last usable index entry's batch, else 0."""
        return self._position_from(lambda index: index.count() - 1)

    # -- batches -------------------------------------------------------------------------------------
    def batches(self, position: int, *, tail: bool = False) -> Iterator[tuple[rec.BatchHeader, bytes]]:
        """Complete, CRC-valid batches from ``position`` to the end, each as (header, its bytes).

        The daemon grows the last batch of the active segment in place (records past the end first, then the
        header), so ``tail`` (this is the partition's last segment) makes an invalid batch there "not complete
        yet": it is read again a few times (with the file's size now), and if it is still not whole what is read
        of the segment ends before it, quietly. Elsewhere an invalid batch is reported and ends the segment."""
        pos, attempts, regrows = position, 0, 0
        while True:
            try:
                for pos, header, buf, at in self.batches_from(pos, chunk=_READ_CHUNK):
                    rec.validate(buf, at)
                    data = bytes(buf[at : at + header.size])
                    attempts = 0
                    yield header, data
                    pos += header.size
                if tail and regrows < _TAIL_REGROWS:
                    # The walk stops at a batch longer than the size this reader knows: a header rewritten
                    # after that size was taken (the batch grew; its records are written before its header, so
                    # they are there). Take the size again and go on from that batch.
                    size = os.fstat(self.fd).st_size
                    if size > self.size and size > pos:
                        self.size = size
                        regrows += 1
                        continue
                return
            except CorruptRecordError as exc:
                if tail and attempts < _TAIL_RETRIES:
                    attempts += 1
                    time.sleep(0.001 * attempts)
                    self.size = os.fstat(self.fd).st_size
                    continue
                if tail:
                    log.debug("%s at %s:%d, the last batch being written; reading no further", exc, self.log_path,
                              pos)
                else:
                    log.warning("%s at %s:%d; reading no further in it", exc, self.log_path, pos)
                return


class PartitionReader:
    """Read-only access to one ``<topic>-<partition>`` directory of ``data_dir`` (or of the log directory that holds
    it, ``data_dir`` being several: ``DIR1,DIR2``)."""

    def __init__(self, data_dir: str, topic: str, partition: int, directory: str | None = None):
        self.topic, self.partition = topic, partition
        self.name = f"{topic}-{partition}"
        if directory is None:
            candidates = [os.path.join(d, self.name) for d in data_dir.split(",")]
            directory = next((c for c in candidates if os.path.isdir(c)), candidates[0])
        self.directory = directory
        self.data_dir = os.path.dirname(os.path.abspath(directory))  # (its log directory: its checkpoints)
        self._aborted: AbortedRanges | None = None  # Kafka's aborted transactions (read at first need)

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        """Whether a batch holds records of an aborted transaction (Kafka's ``.txnindex``): a ``read_committed``
        reader, and so the text view and the Spark source, skips it."""
        if not header.attributes & rec.ATTR_TRANSACTIONAL:
            return False
        if self._aborted is None:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                names = []
            self._aborted = AbortedRanges(t for n in names if n.endswith(TXN_INDEX_SUFFIX)
                                          for t in read_txn_index(os.path.join(self.directory, n)))
        return self._aborted.covers(header.producer_id, header.base_offset)

    # -- listing -------------------------------------------------------------------------------------
    def segment_bases(self) -> list[int]:
        """Base offsets of the live segments, ascending. While a compaction swap is in flight (a
        ``.log.swap`` exists) the listing is retried for up to SWAP_WAIT_SECONDS."""
        deadline = None
        while True:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return []  # the partition was deleted
            if any(n.endswith(LOG_SUFFIX + SWAP_SUFFIX) for n in names):
                now = time.monotonic()
                if deadline is None:
                    deadline = now + SWAP_WAIT_SECONDS
                if now < deadline:
                    time.sleep(0.01)
                    continue
                log.warning("%s: a compaction swap is still in flight; reading the live segments as they are",
                            self.directory)
            return sorted(b for b in map(_base_of, names) if b is not None)

    def _open(self, base: int) -> SegmentReader | None:
        try:
            return SegmentReader(self.directory, base)
        except FileNotFoundError:
            return None

    # -- offsets -------------------------------------------------------------------------------------
    def log_end_offset(self, bases: list[int] | None = None) -> int:
        """The offset the next record will get: the next offset of the last complete batch of the last
        segment (its base offset when it is empty)."""
        for _ in range(_MAX_RELISTS):
            bases = bases if bases is not None else self.segment_bases()
            if not bases:
                return 0
            segment = self._open(bases[-1])
            if segment is None:
                bases = None  # swapped away between listing and opening: list again
                continue
            with segment:
                end = segment.base
                for header, _ in segment.batches(segment.last_entry_position(), tail=True):
                    end = header.next_offset
                return end
        raise RuntimeError(f"{self.directory}: segments keep disappearing")

    def log_start_offset(self, bases: list[int] | None = None, end: int | None = None) -> int:
        """The first retained offset: the first live segment's base offset, or the daemon's checkpointed log
        start offset when that is higher (never above the log end offset)."""
        bases = bases if bases is not None else self.segment_bases()
        if not bases:
            return 0
        start = bases[0]
        checkpointed = read_checkpoint(os.path.join(self.data_dir, LOG_START_OFFSET)).get(
            (self.topic, self.partition))
        if checkpointed is not None and checkpointed > start:
            start = checkpointed
        if end is None:
            end = self.log_end_offset(bases)
        return min(start, end)

    def offsets(self) -> tuple[int, int]:
        """(log start offset, log end offset), from one listing."""
        bases = self.segment_bases()
        end = self.log_end_offset(bases)
        return self.log_start_offset(bases, end), end

    # -- records -------------------------------------------------------------------------------------
    def batches(self, start: int, end: int, *, fail_on_data_loss: bool = False
                ) -> Iterator[tuple[rec.BatchHeader, bytes]]:
        """Complete batches holding offsets in [start, end), in order (the first and last may also hold
        offsets outside the range).

        Offset-based like a Kafka fetch: each step lists the live segments and reads the one holding the next
        offset, so a segment replaced by compaction meanwhile is read in its cleaned form. Records removed by
        retention before they were read are skipped (reading continues at the first live segment), or, with
        ``fail_on_data_loss``, raise DataLossError."""
        next_offset = start
        relists = 0
        while next_offset < end:
            bases = self.segment_bases()
            if not bases:
                return  # the partition was deleted
            if next_offset < bases[0]:
                if fail_on_data_loss:
                    raise DataLossError(
                        f"{self.name}: offsets {next_offset}..{min(bases[0], end) - 1} were removed (retention) "
                        f"before they could be read; the log now starts at {bases[0]}")
                log.info("%s: offsets %d..%d were removed before they could be read", self.name, next_offset,
                         min(bases[0], end) - 1)
                next_offset = bases[0]
                continue
            i = bisect.bisect_right(bases, next_offset) - 1
            segment = self._open(bases[i])
            if segment is None:
                relists += 1
                if relists > _MAX_RELISTS:
                    raise RuntimeError(f"{self.directory}: segments keep disappearing")
                continue  # renamed .deleted, or replaced by a swap, after the listing: list again
            progressed = False
            with segment:
                position = segment.seek_position(next_offset) if next_offset > segment.base else 0
                for header, data in segment.batches(position, tail=i == len(bases) - 1):
                    if header.base_offset >= end:
                        return
                    if header.last_offset < next_offset:
                        continue
                    yield header, data
                    next_offset = header.next_offset
                    progressed = True
                    if next_offset >= end:
                        return
            # The end of this segment. Offsets up to the next segment's base are not in the log (the tail of a
            # compacted segment); without a next segment, the rest of the range does not exist any more.
            if i + 1 < len(bases):
                next_offset = max(next_offset, bases[i + 1])
            elif not progressed:
                later = [b for b in self.segment_bases() if b > bases[i]]
                if not later:
                    return
                next_offset = max(next_offset, later[0])

    def offset_for_timestamp(self, timestamp: int, start: int | None = None) -> int | None:
        """Kafka's ``offsetsForTimes``: the earliest offset >= ``start`` (default: the log start offset) whose
        record timestamp is >= ``timestamp``, or None when there is none. Per segment, the time index gives the
        place to start (every record before its greatest entry at or below ``timestamp`` is older), then batches
        are scanned: a bounded scan, since an entry is written every ``index.interval.bytes`` and when a segment
        rolls."""
        bases = self.segment_bases()
        if not bases:
            return None
        if start is None:
            start = self.log_start_offset(bases)
        for i, base in enumerate(bases):
            if i + 1 < len(bases) and bases[i + 1] <= start:
                continue  # wholly below start
            segment = self._open(base)
            if segment is None:
                continue  # deleted since the listing: retention moved the log start past it
            with segment:
                rel = segment.time_index_floor(timestamp)
                begin = max(start, base + rel if rel is not None else base)
                position = segment.seek_position(begin) if begin > base else 0
                found = first_offset_at_or_after(segment.batches(position, tail=i == len(bases) - 1), timestamp,
                                                 start)
            if found is not None:
                return found
        return None

    def end_for_timestamp_at_most(self, timestamp: int, start: int, end: int) -> int:
        """Where offsets [start, end) can end for records with timestamps at or before ``timestamp``: here always
        ``end``. Cutting the tail needs each segment's smallest timestamp, which Kafka's indexes do not hold
        (only the largest so far) and which a local log keeps nowhere; finding it means reading the segments, the
        very cost the cut would save. The bucket's manifest records it per tiered segment
        (:meth:`logfs.spark.bucket.BucketPartitionReader.end_for_timestamp_at_most`)."""
        return end

    def records(self, start: int, end: int, *, fail_on_data_loss: bool = False) -> Iterator[rec.Record]:
        """Records with offsets in [start, end) (a compacted log has gaps), in offset order."""
        for header, data in self.batches(start, end, fail_on_data_loss=fail_on_data_loss):
            if header.is_control or self.is_aborted(header):
                continue
            ts_type = header.timestamp_type
            for r in rec.decode_raw(data):
                if start <= r.offset < end:
                    yield rec.Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers), ts_type)

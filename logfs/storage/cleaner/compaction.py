"""The log cleaner (compaction): policy (which log, which range) apart from mechanism (how to clean).

Policy, as LogCleanerManager: for each log whose ``cleanup.policy`` contains ``compact``, the dirty section runs
from its cleaner checkpoint (reset to the log start offset when out of range) to the first uncleanable offset:
the active segment's base, or earlier the first segment younger than ``min.compaction.lag.ms``. The filthiest
log whose dirty ratio exceeds ``min.cleanable.dirty.ratio`` is cleaned, or any log whose oldest dirty record is
older than ``max.compaction.lag.ms``.

Mechanism, as Cleaner: build a key -> latest offset map over the dirty section, bounded to ``capacity`` keys
(a pass that fills it stops at a batch boundary and still makes progress); then rewrite every segment from the
log start to the end of the mapped range, grouped into segments of at most ``segment.bytes``, keeping a record
only if it is the latest for its key (keyless records are dropped, as Kafka does). A tombstone batch gets a
delete horizon (now + ``delete.retention.ms``) the first time it is cleaned, stored in the batch header as
Kafka v2 does (attribute bit 0x40, baseTimestamp = horizon); a later pass past the horizon drops it.

Kafka's transactions (a broker's log mounted read-write), as Kafka's cleaner treats them (``Cleaner`` and its
``CleanedTransactionMetadata``; :class:`CleanedTransactions`): a record of an aborted transaction is never a key's
latest (the offset map skips aborted and control batches) and is removed; a marker stays while the pass saw
batches of its transaction (an abort's: the batches it removed; a commit's: the batches still there), and
otherwise gets a delete horizon like a tombstone and goes once it has passed. The cleaned segment's ``.txnindex``
holds the entries of the abort markers it keeps. (Kafka's writes an entry only when the pass removed batches of
that transaction, and a later pass leaves it out while the marker waits for its horizon; logfs keeps the entry as
long as the marker: it covers nothing left in the log, and a group whose swap was skipped keeps what it covers.)
Kafka's cleaner also keeps the last batch of each producer, emptied, for its sequence numbers: logfs keeps no
producer state, and a broker started on the directory takes it from its ``.snapshot`` files.

Each cleaned group goes in by :meth:`Log.replace_segments`, the crash-safe swap of
:mod:`~logfs.storage.local.lifecycle` that recovery also completes; the pass reads a snapshot of the sealed segments,
so retention removing one meanwhile only makes that group's swap be skipped.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from ..format import records as rec
from .compression import codec_of
from ..local.lifecycle import discard, open_cleaned
from ..local.log import Log
from ..local.segment import LogSegment, batch_stats
from ..local.txn_index import (
    ABORT, COMMIT, AbortedTxn, control_record, control_type, read_txn_index, write_txn_index,
)

log = logging.getLogger(__name__)
ENTRY_BYTES = 24  # MD5 digest + offset, as Kafka's SkimpyOffsetMap


# -- policy ---------------------------------------------------------------------------------------------
@dataclass
class CleanableLog:
    log: Log
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    forced: bool

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_range(plog: Log, checkpoint: int | None, now_ms: int) -> CleanableLog:
    with plog.lock:
        segments = plog.segments.as_list()
        start, end = plog.log_start_offset, plog.log_end_offset
        config = plog.config
    first_dirty = checkpoint if checkpoint is not None and start <= checkpoint <= end else start
    uncleanable = segments[-1].base_offset
    dirty_sealed = [s for s in segments[:-1] if s.next_offset > first_dirty]
    if config.min_compaction_lag_ms > 0:
        for s in dirty_sealed:
            if s.largest_timestamp > now_ms - config.min_compaction_lag_ms:
                uncleanable = min(uncleanable, s.base_offset)
                break
    first_dirty = min(first_dirty, uncleanable)
    clean = sum(s.size for s in segments[:-1] if s.next_offset <= first_dirty)
    dirty = sum(s.size for s in dirty_sealed if s.base_offset < uncleanable)
    forced = False
    if config.max_compaction_lag_ms < (1 << 62) and dirty_sealed and dirty:
        first = dirty_sealed[0]
        earliest = first.rolling_based_timestamp if first.rolling_based_timestamp is not None else first.largest_timestamp
        forced = now_ms - earliest > config.max_compaction_lag_ms
    return CleanableLog(plog, first_dirty, uncleanable, clean, dirty, forced)


def grab_filthiest(logs: list[Log], checkpoints: dict[tuple[str, int], int], now_ms: int,
                   busy: set | None = None) -> CleanableLog | None:
    """The compacted log most in need of cleaning, or None."""
    candidates = []
    for plog in logs:
        if plog.closed or not plog.config.compact or (busy and (plog.topic, plog.partition) in busy):
            continue
        c = cleanable_range(plog, checkpoints.get((plog.topic, plog.partition)), now_ms)
        if c.dirty_bytes > 0 and (c.forced or c.ratio > plog.config.min_cleanable_dirty_ratio):
            candidates.append(c)
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.forced, c.ratio))


# -- mechanism ------------------------------------------------------------------------------------------
class OffsetMap:
    """key digest -> latest offset, bounded to ``capacity`` entries (Kafka: buffer / 24 bytes * load factor)."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1

    @classmethod
    def for_buffer(cls, buffer_bytes: int, load_factor: float = 0.9) -> "OffsetMap":
        return cls(int(buffer_bytes // ENTRY_BYTES * load_factor))

    @staticmethod
    def digest(key: bytes) -> bytes:
        return hashlib.md5(key).digest()

    def __len__(self) -> int:
        return len(self._map)

    def put(self, key: bytes, offset: int) -> None:
        self._map[self.digest(key)] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        return self._map.get(self.digest(key), -1)


def build_offset_map(segments: list[LogSegment], start: int, end: int, offset_map: OffsetMap) -> int:
    """Map keys of records in [start, end) of ``segments``; stops early at a batch boundary once the map would
    overflow. Returns the offset just past the last mapped batch (always > start if any batch was there)."""
    mapped_end = start
    for segment in [s for s in segments if s.next_offset > start and s.base_offset < end]:
        for _, header, buf, at in segment.batches_from(0):
            if header.next_offset <= start:
                continue
            if header.base_offset >= end:
                return mapped_end
            if len(offset_map) + header.records_count > offset_map.capacity and mapped_end > start:
                return mapped_end
            if header.is_control or segment.is_aborted(header):
                # (Kafka's buildOffsetMap: a marker's key is no record's, and an aborted record never supersedes a
                # committed one)
                mapped_end = min(header.next_offset, end)
                continue
            for r in rec.decode(buf, at, header.size):
                if r.key is not None and start <= r.offset < end:
                    offset_map.put(r.key, r.offset)
            mapped_end = min(header.next_offset, end)
    return mapped_end


def group_segments(segments: list[LogSegment], max_bytes: int, max_index_bytes: int) -> list[list[LogSegment]]:
    groups: list[list[LogSegment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        index_size = segments[i].offset_index.entries * 8
        i += 1
        while i < len(segments):
            s = segments[i]
            if (size + s.size > max_bytes or index_size + s.offset_index.entries * 8 > max_index_bytes
                    or s.next_offset - 1 - group[0].base_offset > 0x7FFFFFFF):
                break
            group.append(s)
            size += s.size
            index_size += s.offset_index.entries * 8
            i += 1
        groups.append(group)
    return groups


def encode_batch(header: rec.BatchHeader, records: list[rec.Record], delete_horizon: int | None) -> bytes:
    """Re-encode kept records of a batch, keeping its base offset and last offset delta (as Kafka's cleaner
    does), uncompressed; with ``delete_horizon`` the header carries it as Kafka v2 does."""
    attributes = header.attributes & ~rec.ATTR_DELETE_HORIZON
    if delete_horizon is not None:
        attributes |= rec.ATTR_DELETE_HORIZON
    return rec.build_batch_generic(
        header.base_offset, 0, [r.value for r in records], [r.key for r in records], [r.headers for r in records],
        [r.timestamp for r in records], [r.offset - header.base_offset for r in records],
        base_timestamp=delete_horizon, last_offset_delta=header.last_offset_delta, attributes=attributes,
        producer=(header.producer_id, header.producer_epoch, header.base_sequence),
        leader_epoch=header.partition_leader_epoch)


def marker_with_horizon(header: rec.BatchHeader, batch: bytes, delete_horizon: int) -> bytes:
    """A transaction marker (a control batch: the record decoder yields nothing for it) written again with a
    delete horizon, its record, producer fields and offsets kept, as Kafka's cleaner writes it."""
    record = control_record(batch)
    return rec.build_batch_generic(
        header.base_offset, 0, [record.value], [record.key], [()], [header.base_timestamp + record.timestamp_delta],
        [record.offset_delta], base_timestamp=delete_horizon, last_offset_delta=header.last_offset_delta,
        attributes=header.attributes | rec.ATTR_DELETE_HORIZON,
        producer=(header.producer_id, header.producer_epoch, header.base_sequence),
        leader_epoch=header.partition_leader_epoch)


def empty_batch(offset: int) -> bytes:
    """A v2 batch without records that spans just ``offset``. Its timestamps are Kafka's NO_TIMESTAMP (-1), so
    it never makes its segment look younger to time-based retention."""
    return rec.build_batch_generic(offset, -1, [], last_offset_delta=0)


class CleanedTransactions:
    """What one group's cleaning does with Kafka's transactions (Kafka's ``CleanedTransactionMetadata``), fed its
    batches in offset order: an aborted transaction's batches go (:meth:`discards`); a marker must stay while the
    group showed batches of its transaction (:meth:`marker_needed`), else its delete horizon decides; the entries of
    the abort markers kept (:meth:`keep_marker`) are the cleaned segment's ``.txnindex`` (:attr:`kept`)."""

    def __init__(self, group: list[LogSegment]):
        self._aborted_seen: set[int] = set()  # producers whose aborted batches this group removed, until the marker
        self._committed_seen: set[int] = set()  # producers whose (not aborted) transactional batches it kept
        # The entries of the group's own .txnindex files, by (producer, marker offset)
        self._entries = {(t.producer_id, t.last_offset): t for s in group if s.has_txn_index
                         for t in read_txn_index(s.txn_index_path)}
        self.kept: list[AbortedTxn] = []

    def discards(self, segment: LogSegment, header: rec.BatchHeader) -> bool:
        """Whether a data batch goes: one of an aborted transaction (its marker then stays, this pass)."""
        if not header.attributes & rec.ATTR_TRANSACTIONAL:
            return False
        if segment.is_aborted(header):
            self._aborted_seen.add(header.producer_id)
            return True
        self._committed_seen.add(header.producer_id)
        return False

    def marker_needed(self, batch, header: rec.BatchHeader) -> bool:
        """Whether a control batch (``batch``: its bytes) must stay whatever its delete horizon: an abort whose
        batches this group removed, a commit whose batches it kept, a control type logfs does not know."""
        if not header.records_count:
            return False  # (a control batch emptied by an earlier cleaning)
        kind, producer = control_type(batch), header.producer_id
        if kind == ABORT:
            needed = producer in self._aborted_seen
            self._aborted_seen.discard(producer)
        elif kind == COMMIT:
            needed = producer in self._committed_seen
            self._committed_seen.discard(producer)
        else:
            needed = True
        return needed

    def keep_marker(self, header: rec.BatchHeader) -> None:
        """A control batch the cleaned segment keeps: an abort's entry goes into its ``.txnindex``."""
        entry = self._entries.get((header.producer_id, header.base_offset))
        if entry is not None:
            self.kept.append(entry)


@dataclass
class CleanResult:
    end_offset: int
    segments_replaced: int
    bytes_before: int
    bytes_after: int
    records_removed: int


def write_cleaned(directory: str, config, sealed: list[LogSegment], first_dirty: int, first_uncleanable: int,
                  offset_map: OffsetMap, now_ms: int):
    """The file work of one pass, touching no live state: map the dirty section, then write one ``.cleaned``
    segment per group of the sealed segments below the mapped end. Returns (end offset, [(group, cleaned
    segment, records dropped)]). Runs in a worker thread or in the cleaner process."""
    end = build_offset_map(sealed, first_dirty, first_uncleanable, offset_map)
    segments = [s for s in sealed if s.base_offset < end]
    # A segment partly mapped is cleaned too: its unmapped records are kept, as no later offset is known for them.
    out = []
    for group in group_segments(segments, config.segment_bytes, config.segment_index_bytes):
        cleaned, dropped = _clean_group(directory, config, group, offset_map, end, now_ms)
        out.append((group, cleaned, dropped))
    return end, out


def clean(plog: Log, target: CleanableLog, offset_map: OffsetMap, now_ms: int) -> CleanResult:
    """One cleaning pass in this process. Reads and writes files without the log lock (the segments read are
    pinned by a snapshot); takes it only for each swap."""
    with plog.snapshot(sealed_only=True) as sealed:
        end, written = write_cleaned(plog.directory, plog.config, sealed.segments, target.first_dirty,
                                     target.first_uncleanable, offset_map, now_ms)
        before = after = removed = 0
        for group, cleaned, dropped in written:
            before += sum(s.size for s in group)
            after += cleaned.size
            removed += dropped
            plog.replace_segments(group, cleaned)
    return CleanResult(end, sum(len(g) for g, _, _ in written), before, after, removed)


def _clean_group(directory: str, config, group: list[LogSegment], offset_map: OffsetMap, end: int, now_ms: int):
    cleaned = open_cleaned(directory, group[0].base_offset, config, now_ms, group[0].open_files)
    dropped = 0
    codec, level = codec_of(config)
    transactions = CleanedTransactions(group)
    try:
        for segment in group:
            for _, header, buf, at in segment.batches_from(0):
                if header.is_control:
                    batch = bytes(buf[at : at + header.size])
                    if not transactions.marker_needed(batch, header):
                        horizon = header.base_timestamp if header.attributes & rec.ATTR_DELETE_HORIZON else None
                        if horizon is not None and now_ms >= horizon:
                            dropped += header.records_count
                            continue
                        if horizon is None:  # (its horizon starts now, as a tombstone's)
                            batch = marker_with_horizon(header, batch, now_ms + config.delete_retention_ms)
                    transactions.keep_marker(header)
                    cleaned.append(batch, rec.parse_header(batch), batch_stats(batch))
                    continue
                if transactions.discards(segment, header):
                    dropped += header.records_count
                    continue
                horizon = header.base_timestamp if header.attributes & rec.ATTR_DELETE_HORIZON else None
                kept = []
                for r in rec.decode(buf, at, header.size):
                    if r.offset >= end:
                        kept.append(r)
                        continue
                    if r.key is None:
                        dropped += 1
                        continue
                    latest = offset_map.get(r.key)
                    if latest >= 0 and r.offset < latest:
                        dropped += 1
                        continue
                    if r.value is None and horizon is not None and now_ms >= horizon:
                        dropped += 1
                        continue
                    kept.append(r)
                if not kept:
                    continue
                if horizon is None and any(r.value is None for r in kept):
                    horizon = now_ms + config.delete_retention_ms
                batch = encode_batch(header, kept, horizon)
                stats = batch_stats(batch)
                target = header.compression or codec  # as Kafka's cleaner, a batch keeps its own codec
                if target:
                    batch = rec.compress_batch(batch, target, level if target == codec else None)
                cleaned.append(batch, rec.parse_header(batch), stats)
        group_end = group[-1].next_offset
        if cleaned.next_offset < group_end:
            # The group's last records were all removed: keep an empty batch at its last offset (as Kafka's
            # cleaner keeps empty batches, RETAIN_EMPTY), so the cleaned segment still spans the whole offset
            # range it replaces. Completing an interrupted swap removes the live segments inside that range:
            # without it, the replaced segments past the last kept record came back after a crash (superseded
            # values, keyless records, deleted keys).
            batch = empty_batch(group_end - 1)
            cleaned.append(batch, rec.parse_header(batch), batch_stats(batch))
        if transactions.kept:
            cleaned.has_txn_index = True
            write_txn_index(cleaned.txn_index_path, transactions.kept)
        cleaned.on_become_inactive()
        cleaned.flush()
    except BaseException:
        discard(cleaned)
        raise
    return cleaned, dropped


"""Where compression happens (CONTRACT section 8): sealed segments rewritten in the topic's codec, in the
background, through the cleaner's crash-safe swap.

Appends stay uncompressed: a small append keeps growing the active segment's last batch in place, and a bulk
append keeps writing whole batches straight from the write buffer, at the cost they have without compression.
Once a segment is sealed (rolled) and the topic has a codec, :func:`write_compressed` reads it and writes it again
as ``<base>.log.cleaned`` (+ indexes): runs of plain batches (no producer id, not transactional, not control, no
delete horizon, one timestamp type) merged into batches of about :data:`TARGET_BATCH_BYTES` of records, each
compressed as one standard Kafka v2 batch (:func:`~logfs.storage.format.records.compress_batch`: the codecs' framing
lives in :mod:`~logfs.storage.format.codecs` alone); other batches are kept as they are, and control batches are never
compressed. Every record keeps its offset, timestamp, key, value and headers; the new segment spans exactly the
offsets of the old one (its last batch keeps the old last offset). The log then swaps it in for the old one by
:meth:`~logfs.storage.local.log.Log.replace_segments` (``.cleaned`` -> ``.swap`` -> live, the commit point being the
``.log.swap`` rename): after a crash at any point each offset is in exactly one segment.

Kafka's transactions (a broker's log mounted read-write, CONTRACT section 13): transactional batches are compressed
one by one with their producer fields and offsets, and markers are kept as they are, so the rewritten segment holds
the same aborted transactions as the old one: it gets the old one's aborted ranges (its view index counts no lines
for their batches, as the old one's did) and a copy of its ``.txnindex``, swapped in with its other files.

The file work runs in the cleaner's child process (:mod:`~logfs.storage.cleaner.process`), so neither the
re-encoding nor the codec competes with request handling for the GIL. Tiering waits for a segment's rewrite, so
the bucket holds compressed segments.

Which segments: sealed, not yet tiered, whose first batch is uncompressed while the topic's codec is set; a
segment already in some codec is never rewritten (a change of ``compression.type`` applies to what is sealed from
then on, as Kafka never recompresses what is on disk).
"""

from __future__ import annotations

import logging

from ..format import records as rec
from ..format import twins
from ..format.speedups import C as _speedups
from ..local.lifecycle import discard, open_cleaned
from ..local.segment import LogSegment
from ..local.txn_index import read_txn_index, write_txn_index

log = logging.getLogger(__name__)

#: Bytes of records (uncompressed) per rewritten batch. zstd on log lines gains little past this (docs/compression.md)
#: and a read of one line decompresses at most one batch.
TARGET_BATCH_BYTES = 256 << 10

_NOT_MERGED = rec.ATTR_CONTROL | rec.ATTR_TRANSACTIONAL | rec.ATTR_DELETE_HORIZON | rec.ATTR_COMPRESSION_MASK


def codec_of(config) -> tuple[int, int]:
    """(Kafka codec id, level) the topic's sealed segments are written in; (0, 0) for none."""
    return getattr(config, "codec", 0), getattr(config, "codec_level", 0)


def first_header(segment) -> rec.BatchHeader | None:
    """The header of a segment's first batch (one small read), or None when it has none."""
    if segment.size < rec.HEADER_SIZE:
        return None
    try:
        return rec.parse_header(segment.read(0, rec.HEADER_SIZE))
    except Exception:  # noqa: BLE001 - a damaged header is recovery's business, not this one's
        return None


def needs_rewrite(segment, config) -> bool:
    """Whether a sealed segment is still to be written in the topic's codec."""
    codec, _ = codec_of(config)
    if not codec or segment.active or segment.size == 0:
        return False
    first = getattr(segment, "first_codec", None)  # a sealed segment's first batch never changes: read once
    if first is None:
        header = first_header(segment)
        first = segment.first_codec = -1 if header is None or header.is_control else header.compression
    return first == 0


def give_up(segment) -> None:
    """A segment whose rewrite failed stays as it is: not tried again, and tiering does not wait for it."""
    segment.first_codec = -1


def _mergeable(header: rec.BatchHeader) -> bool:
    return not header.attributes & _NOT_MERGED and header.producer_id < 0


class _Pending:
    """Consecutive plain batches waiting to become one compressed batch."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.bytes = 0
        self.records = 0
        self.last_offset = -1
        self.ts_type = 0

    def take(self, header: rec.BatchHeader, batch: bytes) -> None:
        if not self.batches:
            self.ts_type = header.attributes & rec.ATTR_TIMESTAMP_TYPE
        self.batches.append(batch)
        self.bytes += len(batch)
        self.records += header.records_count
        self.last_offset = header.last_offset

    def fits(self, header: rec.BatchHeader, limit: int) -> bool:
        return not self.batches or (self.bytes + header.size <= limit
                                    and header.attributes & rec.ATTR_TIMESTAMP_TYPE == self.ts_type)

    def merged(self) -> bytes:
        """One uncompressed batch of all the records (C: no Python object per record)."""
        return rec.stamp_crc((_speedups or twins).merge_batches(self.batches, self.last_offset))


def write_compressed(directory: str, config, segment: LogSegment, now_ms: int) -> LogSegment:
    """Write ``segment`` again in the topic's codec as a ``.cleaned`` segment (flushed, sealed), touching no live
    state. Runs in the cleaner process (or a worker thread)."""
    codec, level = codec_of(config)
    limit = max(1, min(TARGET_BATCH_BYTES, config.max_message_bytes))
    cleaned = open_cleaned(directory, segment.base_offset, config, now_ms, segment.open_files)
    cleaned.aborted = segment.aborted  # (the same batches at the same offsets: the same aborted transactions)

    def put(batch: bytes, compress: bool) -> None:
        stats = cleaned.visible_stats(batch, 0, rec.parse_header(batch))  # (none for an aborted batch's records)
        if compress:
            batch = rec.compress_batch(batch, codec, level)
        cleaned.append(batch, rec.parse_header(batch), stats)

    pending = _Pending()

    def flush_pending() -> None:
        nonlocal pending
        if pending.batches:
            put(pending.merged(), pending.records > 0)  # (empty batches, kept for the range they span, stay plain)
        pending = _Pending()

    try:
        for _, header, buf, at in segment.batches_from(0):
            batch = bytes(buf[at : at + header.size])
            if _mergeable(header):
                if not pending.fits(header, limit):
                    flush_pending()
                pending.take(header, batch)
                continue
            flush_pending()
            if header.compression or header.is_control or header.records_count == 0:
                put(batch, False)  # kept as it is: already in a codec, or a control or empty batch
            else:
                put(batch, True)  # a producer's or transactional batch: compressed alone, its fields kept
        flush_pending()
        if cleaned.next_offset != segment.next_offset:
            raise ValueError(f"{segment.log_path}: the rewrite ends at {cleaned.next_offset}, the segment at "
                             f"{segment.next_offset}")
        if segment.has_txn_index:  # every marker is kept: so is every entry of Kafka's index of aborts
            cleaned.has_txn_index = True
            write_txn_index(cleaned.txn_index_path, read_txn_index(segment.txn_index_path))
        cleaned.on_become_inactive()
        cleaned.flush()
    except BaseException:
        discard(cleaned)
        raise
    return cleaned

"""The ``logfs`` source reading a tiered log straight from its bucket (``load("s3://BUCKET/PREFIX")``): no
daemon, no mount, no DATA_DIR.

What it reads is what the daemon's tiering wrote (:mod:`logfs.remote.manifest` owns the key names and the
manifest format): a partition is a ``<prefix>/<topic>-<partition>/manifest.json``; its offsets are the
manifest's ``log_start_offset`` up to ``remote_log_end_offset``. An executor reads an offset range of one
partition with ranged GETs of only the bytes that hold it: per segment it overlaps, the segment's remote
``.index`` (small: one entry per ``index.interval.bytes``) gives the byte positions of the range's first and
last batches, and only the bytes between are fetched, in bounded chunks. Batches are parsed by the storage's one
framing code (:class:`~logfs.storage.local.segment_file.SegmentFile`) and CRC-checked.

Credentials come from the AWS chain of each process (driver and every executor), through
:class:`~logfs.remote.s3.S3Store`; the options carry only the endpoint and the region. Store errors keep their
types (:mod:`logfs.remote.api`), with messages naming the operation, key and endpoint.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

from ..remote.api import RemoteCorruptError, RemoteNotFoundError, RemoteStore
from ..remote.manifest import MANIFEST_NAME, TXN_INDEX_EXT, ManifestStore, PartitionManifest, RemoteSegment
from ..storage import names
from ..storage.format import records as rec
from ..storage.errors import CorruptRecordError, DataLossError
from ..storage.local.index import OffsetIndex
from ..storage.local.reader import first_offset_at_or_after, time_index_floor
from ..storage.local.segment_file import SegmentFile
from ..storage.local.txn_index import AbortedRanges, parse_txn_index

log = logging.getLogger(__name__)

SCHEME = "s3://"
READ_CHUNK = 16 << 20  # bytes per ranged GET of a .log (a range smaller than this is fetched in one)
LOOKUP_CHUNK = 64 << 10  # bytes per ranged GET while looking for a timestamp (a scan of about one index interval)
# A reader gives up sooner than the daemon's store would: a wrong endpoint should fail the query fast.
MAX_ATTEMPTS = 2


def is_bucket_path(path: str) -> bool:
    return str(path).startswith(SCHEME)


def parse_bucket_path(path: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    bucket, _, prefix = str(path)[len(SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {path!r} (expected s3://BUCKET/PREFIX)")
    return bucket, prefix.strip("/")


def open_store(path: str, endpoint: str | None, region: str | None) -> RemoteStore:
    """The bucket of ``path`` as a store (credentials from this process's AWS chain)."""
    from ..remote.s3 import DEFAULT_REGION, S3Store

    bucket, _ = parse_bucket_path(path)
    return S3Store(bucket, endpoint=endpoint, region=region or DEFAULT_REGION, max_attempts=MAX_ATTEMPTS)


SHARED_STORE_SECONDS = 300.0  # how long a process reuses one client of a bucket for the source's reads
_shared: dict = {}


class _SharedStore:
    """A store kept for this process's later reads of the same bucket: ``close`` leaves it open."""

    def __init__(self, inner: RemoteStore):
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def close(self) -> None:
        pass


def reading_store(path: str, endpoint: str | None, region: str | None):
    """The source's client of the bucket of ``path``, shared by the reads of this process for up to
    SHARED_STORE_SECONDS (then a new one: credentials of the AWS chain are looked up again; at once when an
    ``AWS_*`` variable of the environment changed). A new boto3 client
    costs 0.1-0.2 s (its session loads the S3 service model), which was most of a narrow query's time from the
    bucket: a planning call opened two, each task one. Spark's Python workers run one task at a time and are
    reused, so a worker creates one client; the clients are thread-safe (the prefetch threads share it)."""
    now = time.monotonic()
    pid = os.getpid()
    # (the AWS variables of the environment are part of the key: a process whose credentials or profile
    # changed gets a new client at once)
    chain = hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))).encode())
    key = (pid, open_store, parse_bucket_path(path)[0], endpoint, region, chain.hexdigest())
    hit = _shared.get(key)
    if hit is not None and now - hit[1] < SHARED_STORE_SECONDS:
        return hit[0]
    for k, (store, since) in list(_shared.items()):
        if k[0] != pid or now - since >= SHARED_STORE_SECONDS:
            del _shared[k]
            if k[0] == pid:
                try:
                    store.inner.close()
                except Exception:  # (a client that cannot close cleanly is dropped all the same)
                    pass
    store = _SharedStore(open_store(path, endpoint, region))
    _shared[key] = (store, now)
    return store


def list_bucket_partitions(store: RemoteStore, prefix: str) -> dict:
    """Every partition directory under ``prefix`` -> its manifest key. One listing with a delimiter (the
    partitions, not their segments); a partition whose manifest is not there (yet, or no longer: a deletion in
    progress) reads as empty."""
    from .segments import TopicPartition

    root = f"{prefix}/" if prefix else ""
    out = {}
    for directory in store.list_dirs(root):
        parsed = names.parse_partition_dir(directory)
        if parsed is None or names.is_internal_topic(parsed[0]):
            continue
        out[TopicPartition(*parsed)] = f"{root}{directory}/{MANIFEST_NAME}"
    return out


class _RangeFile(SegmentFile):
    """Bytes [lo, hi) of one remote ``.log``, fetched by ranged GETs of at most READ_CHUNK as the framing code
    asks for them (never past ``hi``, so a small range never downloads the segment). While the framing code works
    through one chunk, the next is already being fetched (one worker thread), so the store's latency overlaps the
    decoding. ``close()`` when done."""

    def __init__(self, store: RemoteStore, key: str, lo: int, hi: int, chunk: int = READ_CHUNK,
                 prefetch: bool = True):
        self.store, self.key, self.chunk, self.prefetch = store, key, chunk, prefetch
        self.size = hi
        self.log_path = f"remote object {key}"
        self._at, self._buf = lo, b""
        self._next: tuple[int, Future] | None = None  # (position, the fetch of the chunk there)
        self._pool: ThreadPoolExecutor | None = None

    def _fetch(self, position: int, want: int) -> bytes:
        data = self.store.get_range(self.key, position, want)
        if len(data) != want:
            raise RemoteCorruptError(f"{self.key}: {len(data)} bytes at {position}, the manifest says "
                                     f"the object has {self.size}")
        return data

    def read(self, position: int, length: int) -> memoryview:
        end = min(position + length, self.size)
        held = self._at + len(self._buf)
        if position < self._at or end > held:
            if self._next is not None and self._next[0] == held and self._at <= position <= held:
                tail = memoryview(self._buf)[position - self._at:]
                self._buf, self._at = tail.tobytes() + self._next[1].result(), position
                self._next = None
            if position < self._at or end > self._at + len(self._buf):
                want = min(max(end, position + self.chunk), self.size) - position
                self._buf, self._at = self._fetch(position, want), position
            held = self._at + len(self._buf)
            if self.prefetch and held < self.size and (self._next is None or self._next[0] != held):
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="logfs-prefetch")
                self._next = (held, self._pool.submit(self._fetch, held, min(self.chunk, self.size - held)))
        return memoryview(self._buf)[position - self._at : end - self._at]

    def close(self) -> None:
        if self._pool is not None:
            if self._next is not None:
                self._next[1].cancel()
            self._pool.shutdown(wait=True)
            self._pool = None
        self._next = None


def byte_range(index: bytes, seg: RemoteSegment, start: int, end: int) -> tuple[int, int]:
    """The bytes of ``seg``'s .log that hold offsets [start, end), from its offset index: an entry names the
    last offset of the batch (of the append) at its position, so the range starts at the greatest entry below
    ``start`` and ends where the entry after the first one reaching ``end - 1`` starts."""
    entries = [e for e in OffsetIndex.ENTRY.iter_unpack(index[: len(index) - len(index) % OffsetIndex.ENTRY.size])
               if e != (0, 0)]
    last = [seg.base_offset + rel for rel, _ in entries]
    i = bisect.bisect_left(last, start) - 1  # entries[i]'s batch ends below start; unindexed ones after it may not
    lo = entries[i][1] if i >= 0 else 0
    hi = seg.size
    j = bisect.bisect_left(last, end - 1)  # entries[j]'s batch holds end - 1 or ends after it
    if j + 1 < len(entries):
        hi = entries[j + 1][1]
    if not (0 <= lo <= hi <= seg.size):
        raise RemoteCorruptError(f"{seg.objects['index'].key}: positions {lo}..{hi} outside the segment's "
                                 f"{seg.size} bytes")
    return lo, hi


class BucketPartitionReader:
    """One partition of the bucket, with the local :class:`~logfs.storage.local.reader.PartitionReader`'s interface
    (``offsets()``, ``batches(start, end)``, ``is_aborted(header)``).

    Kafka's aborted transactions: a tiered segment that they reach into has a ``.txnindex`` object holding all of
    them (:mod:`logfs.remote.manifest`). :meth:`batches` reads it (one small GET) before it yields the segment's
    first batch, so :meth:`is_aborted` of a batch it yielded knows every abort that holds it, as a
    ``read_committed`` consumer's fetch does. A segment tiered without one has none known."""

    def __init__(self, store: RemoteStore, prefix: str, tp):
        self.store, self.tp = store, tp
        self.manifests = ManifestStore(store, prefix)
        self.name = str(tp)
        self._last: PartitionManifest | None = None  # the manifest read last
        self._aborted = AbortedRanges(())  # the aborted transactions of the segments read so far
        self._txn_read: set[str] = set()  # the .txnindex objects read into it

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        """Whether a batch :meth:`batches` yielded holds records of an aborted transaction."""
        return (bool(header.attributes & rec.ATTR_TRANSACTIONAL)
                and self._aborted.covers(header.producer_id, header.base_offset))

    def _read_txn_index(self, seg: RemoteSegment) -> None:
        """Learn the aborted transactions of ``seg`` (once per object; nothing for a segment without one)."""
        obj = seg.objects.get(TXN_INDEX_EXT)
        if obj is None or obj.key in self._txn_read:
            return
        data = self.store.get_bytes(obj.key)
        if len(data) != obj.size:
            raise RemoteCorruptError(f"{obj.key}: {len(data)} bytes, the manifest says {obj.size}")
        for txn in parse_txn_index(data):
            self._aborted.add(txn)
        self._txn_read.add(obj.key)

    def manifest(self) -> PartitionManifest:
        self._last = self.manifests.read(self.tp.topic, self.tp.partition)
        return self._last

    def offsets(self) -> tuple[int, int]:
        return self.layout()[:2]

    def layout(self) -> tuple[int, int, list[int]]:
        """(first offset, remote log end offset, the tiered segments' base offsets), from one manifest read."""
        m = self.manifest()
        end = m.remote_log_end_offset
        start = max(m.log_start_offset, m.segments[0].base_offset) if m.segments else end
        return min(start, end), end, [s.base_offset for s in m.segments]

    def offset_for_timestamp(self, timestamp: int, start: int | None = None) -> int | None:
        """Kafka's ``offsetsForTimes`` over the tiered log: the earliest offset >= ``start`` (default: the tiered
        log start) whose timestamp is >= ``timestamp``, or None. A segment whose largest timestamp (the
        manifest's) is below is skipped without a GET; in the first one that is not, the remote ``.timeindex``
        and ``.index`` give the byte position to start at, and batches are fetched from there in small ranged
        GETs until the record is found (a scan of about one index interval)."""
        m = self.manifest()
        if start is None:
            start = self.layout()[0]
        for seg in m.segments:
            if seg.next_offset <= start or seg.max_timestamp < timestamp:
                continue
            try:
                rel = time_index_floor(self.store.get_bytes(seg.objects["timeindex"].key), timestamp)
                begin = max(start, seg.base_offset + rel if rel is not None else seg.base_offset)
                lo = byte_range(self.store.get_bytes(seg.objects["index"].key), seg, begin, begin + 1)[0] \
                    if begin > seg.base_offset else 0
            except RemoteNotFoundError:
                continue  # deleted by the bucket's retention since the manifest was read
            found = first_offset_at_or_after(self._batches_of(seg, lo, seg.size, LOOKUP_CHUNK), timestamp, start)
            if found is not None:
                return found
        return None

    def end_for_timestamp_at_most(self, timestamp: int, start: int, end: int) -> int:
        """Where offsets [start, end) can end for records with timestamps at or before ``timestamp`` (ms): the base
        offset of the first of the longest run of tiered segments, up to ``end``, whose smallest record
        timestamp (the manifest's ``min_timestamp``) is after ``timestamp``; ``end`` itself when the segment
        holding ``end - 1`` has none or an earlier one, or when ``end`` is past the tiered log. Every record of
        such a run is later than ``timestamp``, whatever the order of timestamps in the log, so the cut drops no
        matching row. From the manifest read last (the planner's :meth:`layout`: no request), read again only if
        it does not reach ``end``; a tiered segment never changes, so an older copy gives the same answer."""
        m = self._last
        if m is None or m.remote_log_end_offset < end:
            m = self.manifest()
        if m.remote_log_end_offset < end:
            return end  # offsets past the tiered log: nothing known about them
        cut = end
        for seg in reversed(m.segments):
            if seg.base_offset >= cut:
                continue  # wholly at or after the range's end
            if seg.next_offset <= start or seg.min_timestamp == -1 or seg.min_timestamp <= timestamp:
                break
            cut = seg.base_offset
        return cut

    def _batches_of(self, seg: RemoteSegment, lo: int, hi: int, chunk: int = READ_CHUNK
                    ) -> Iterator[tuple[rec.BatchHeader, bytes]]:
        """CRC-checked batches of ``seg``'s .log between byte positions ``lo`` and ``hi``, fetched by ranged GETs
        of ``chunk`` bytes."""
        segment_log = _RangeFile(self.store, seg.objects["log"].key, lo, hi, chunk, prefetch=chunk >= READ_CHUNK)
        covered = lo
        try:
            for pos, header, buf, at in segment_log.batches_from(lo, hi, chunk=chunk):
                rec.validate(buf, at)
                covered = pos + header.size
                yield header, bytes(buf[at : at + header.size])
        except CorruptRecordError as exc:
            raise RemoteCorruptError(f"{segment_log.key}: {exc} (after position {covered})") from None
        finally:
            segment_log.close()
        if covered < hi:  # a tiered segment holds complete batches only, up to the size the manifest gives
            raise RemoteCorruptError(f"{segment_log.key}: no complete batch at position {covered} of {hi}")

    def batches(self, start: int, end: int, *, fail_on_data_loss: bool = False
                ) -> Iterator[tuple[rec.BatchHeader, bytes]]:
        m = self.manifest()
        first = m.segments[0].base_offset if m.segments else m.remote_log_end_offset
        if start < first and start < end:
            message = (f"{self.name}: offsets {start}..{min(first, end) - 1} were removed from the bucket "
                       f"(retention) before they could be read; the tiered log now starts at {first}")
            if fail_on_data_loss:
                raise DataLossError(message)
            log.info("%s", message)
        for seg in m.segments:
            if seg.next_offset <= start or seg.base_offset >= end:
                continue
            try:
                index = self.store.get_bytes(seg.objects["index"].key)
                self._read_txn_index(seg)
            except RemoteNotFoundError:
                # Deleted by the bucket's retention since the manifest was read (the manifest drops a segment
                # before its objects are deleted): as records removed before they could be read.
                message = f"{self.name}: segment {seg.base_offset} was removed from the bucket before it was read"
                if fail_on_data_loss:
                    raise DataLossError(message) from None
                log.info("%s", message)
                continue
            lo, hi = byte_range(index, seg, max(start, seg.base_offset), min(end, seg.next_offset))
            for header, data in self._batches_of(seg, lo, hi):
                if header.last_offset < start:
                    continue
                if header.base_offset >= end:
                    return
                yield header, data


class TieredPartitionReader:
    """The whole log of one partition: the tiered part from the bucket, the rest from the daemon's DATA_DIR
    (option ``localDataDir``), joined at the manifest's ``remote_log_end_offset`` as read when each part starts.

    Segments are tiered and then deleted locally while this reads: the manifest is read again at each switch,
    and the local part is read with data-loss detection on, so offsets deleted locally under the read (always
    tiered first) are read from the bucket instead: no gap and no duplicate at the seam."""

    def __init__(self, remote: BucketPartitionReader, local):
        self.remote, self.local = remote, local
        self.name = remote.name

    def is_aborted(self, header: rec.BatchHeader) -> bool:
        """Aborted as the part that yielded the batch knows it: the bucket's ``.txnindex`` objects, or the local
        partition directory's ``.txnindex`` files."""
        return self.remote.is_aborted(header) or self.local.is_aborted(header)

    def offsets(self) -> tuple[int, int]:
        return self.layout()[:2]

    def layout(self) -> tuple[int, int, list[int]]:
        start, remote_end, remote_bases = self.remote.layout()
        local_start, local_end, local_bases = self.local.layout()
        if remote_end == 0 and start == 0:  # nothing tiered: the local log alone
            return local_start, local_end, local_bases
        # The seam is a boundary too: below it the bucket's segments, above it the local ones.
        return start, max(remote_end, local_end), sorted({*remote_bases, remote_end,
                                                          *(b for b in local_bases if b > remote_end)})

    def offset_for_timestamp(self, timestamp: int, start: int | None = None) -> int | None:
        """``offsetsForTimes`` over the whole log: the tiered part first, then the local segments after the
        seam."""
        if start is None:
            start = self.layout()[0]
        seam = self.remote.manifest().remote_log_end_offset
        if start < seam:
            found = self.remote.offset_for_timestamp(timestamp, start)
            if found is not None:
                return found
        return self.local.offset_for_timestamp(timestamp, max(start, seam))

    def end_for_timestamp_at_most(self, timestamp: int, start: int, end: int) -> int:
        """:meth:`BucketPartitionReader.end_for_timestamp_at_most` over the whole log: the part after the seam
        (the local segments') must be cut first, which the local reader cannot do (it keeps no smallest
        timestamps: :meth:`~logfs.storage.local.reader.PartitionReader.end_for_timestamp_at_most`); so a range
        reaching past the seam keeps its end, and one ending at or before it is cut from the manifest. The seam is
        the manifest's read last (no request): it only moves up, so an older one can only keep an end."""
        seam = (self.remote._last or self.remote.manifest()).remote_log_end_offset
        if end > seam:
            cut = self.local.end_for_timestamp_at_most(timestamp, max(start, seam), end)
            if cut > max(start, seam):
                return cut
            end = max(start, cut)
        return self.remote.end_for_timestamp_at_most(timestamp, start, end) if start < end else end

    def batches(self, start: int, end: int, *, fail_on_data_loss: bool = False
                ) -> Iterator[tuple[rec.BatchHeader, bytes]]:
        next_offset = start
        while next_offset < end:
            seam = self.remote.manifest().remote_log_end_offset
            if next_offset < seam:
                for header, data in self.remote.batches(next_offset, min(end, seam),
                                                        fail_on_data_loss=fail_on_data_loss):
                    next_offset = max(next_offset, header.next_offset)
                    yield header, data
                next_offset = max(next_offset, min(end, seam))
                continue
            try:
                for header, data in self.local.batches(next_offset, end, fail_on_data_loss=True):
                    next_offset = max(next_offset, header.next_offset)
                    yield header, data
                return
            except DataLossError:
                m = self.remote.manifest()
                if m.remote_log_end_offset > next_offset:
                    continue  # tiered, then deleted locally under the read: read from the bucket
                bases = self.local.segment_bases()
                if m.log_start_offset <= next_offset and bases and bases[0] > next_offset:
                    # Neither tiering nor retention removed these offsets: they were never written (a batch lost
                    # unflushed in a power cut before a roll). A gap in offsets at the seam, as Kafka's can have.
                    next_offset = bases[0]
                    continue
                if fail_on_data_loss:
                    raise
                return  # removed by whole-log retention, not by tiering: as a local read, skip the rest

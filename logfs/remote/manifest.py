"""Object naming and the per-partition manifest (KIP-405's RemoteLogMetadataManager, kept in the bucket).

Keys
----
A tiered segment is four objects, named as the contract fixes them, and a fifth when Kafka's aborted transactions
reach into it::

    <prefix>/<topic>-<partition>/<20-digit base offset>.log        the Kafka segment, byte for byte
    <prefix>/<topic>-<partition>/<20-digit base offset>.index      Kafka offset index
    <prefix>/<topic>-<partition>/<20-digit base offset>.timeindex  Kafka time index
    <prefix>/<topic>-<partition>/<20-digit base offset>.viewindex  logfs's view index (line positions)
    <prefix>/<topic>-<partition>/<20-digit base offset>.txnindex   Kafka transaction index (only with aborts)

The ``.txnindex`` object (KIP-405's ``TRANSACTION_INDEX``) is in Kafka's format (34-byte entries,
:mod:`logfs.storage.local.txn_index`) and holds every aborted transaction that reaches into the segment's offsets,
wherever its abort marker lies. (Kafka uploads a segment's own ``.txnindex``, the entries of the markers in it, and
its fetch of a tiered range looks through the later segments' indexes too, RemoteLogManager's
``collectAbortedTransactions``; logfs puts an abort that spans segments into each of them, so that a reader of one
tiered segment, a follower or one Spark task, needs that segment's objects alone.) Segments into which no aborted
transaction reaches, and every segment tiered before logfs uploaded these, have none: none is known.

and each partition has one manifest, ``<prefix>/<topic>-<partition>/manifest.json``. With an empty prefix the
keys start at ``<topic>-<partition>/``. The prefix is used as given, less leading and trailing slashes.

Manifest (JSON, UTF-8)
----------------------
::

    {"format": "logfs-remote-manifest", "version": 1,
     "topic": "orders", "partition": 0,
     "generation": 7,                  # +1 at every write: tells a stale copy from a fresh one in logs
     "log_start_offset": 0,            # whole-log start: retention advances it before deleting objects
     "segments": [                     # ascending, never overlapping: each base_offset is at or after the
                                       # previous next_offset (offsets may skip: records lost unflushed in a
                                       # power cut, or removed by compaction)
       {"base_offset": 0,              # first offset in the segment
        "next_offset": 1000,           # the offset after its last record (Kafka's end offset + 1)
        "size": 1048576,               # bytes of the .log
        "max_timestamp": 1700000000123,  # largest record timestamp (ms), -1 when none
        "min_timestamp": 1699999990000,  # smallest record timestamp (ms); optional: -1 or absent = unknown
        "objects": {"log":       {"key": "<prefix>/orders-0/00000000000000000000.log", "size": 1048576},
                    "index":     {"key": "...index", "size": 8192},
                    "timeindex": {"key": "...timeindex", "size": 12288},
                    "viewindex": {"key": "...viewindex", "size": 36000},
                    "txnindex":  {"key": "...txnindex", "size": 68}}}]}   # only with aborted transactions

``remote_log_end_offset`` is the last segment's ``next_offset`` (0 with no segment). Readers reject an unknown
``format`` or a higher ``version``, and a manifest whose segments overlap, as corrupt; they ignore fields they do
not know, so a field added later without a new ``version`` is harmless to older readers.

Version 2 added the optional ``txnindex`` object. A manifest is written as version 1 when none of its segments has
one (older logfs reads it as before) and as version 2 when one has: an older reader refuses it (a higher
``version``) rather than show the records of aborted transactions as if they were committed.

``min_timestamp`` was added that way (still version 1): the smallest timestamp of any record of the segment, as a
reader sees them (a LogAppendTime batch's records all have its max timestamp; a CreateTime batch's records may go
back in time, so tiering walks every record's timestamp delta when it uploads the segment). Kafka's indexes give
only the largest timestamp so far; this is what lets a reader skip the tail of a log that holds no record at or
before a time (the Spark source's upper bound on ``timestamp``, :mod:`logfs.spark.pushdown`). Manifests written
before it, and segments whose scan failed, have none (-1 on reading): they are never skipped that way.

What a crash at each step leaves
--------------------------------
Uploading segment S: (1) put S's objects (each put is atomic; order does not matter); (2) write the
manifest listing S; (3) only then, and only past local retention, delete S locally.

- Crash during or after (1), before (2): the manifest does not list S, so S is not tiered; it is still on local
  disk (local deletes wait for (2)); its objects already uploaded are orphans. After restart S is uploaded again
  under the same keys (the names derive from the base offset), overwriting them: no gap, no duplicate.
- Crash after (2), before (3): S is both tiered and local; reads prefer the local copy, local retention deletes
  it later. The bucket holds S once.
- The upload task starts from the manifest: a local segment below ``remote_log_end_offset`` is already tiered
  and is never uploaded again, so a crash right after (2) cannot make a second copy.
- Whole-log retention: (1) write the manifest without the expired segments and with ``log_start_offset``
  advanced; (2) delete their objects. A crash between leaves only orphans.

Orphans are the keys under the partition's prefix that the manifest names nowhere (manifest.json aside):
:meth:`ManifestStore.orphans` lists them; they are deleted at startup, before the partition's upload task runs
(while it runs, an unlisted key may be an upload in progress). The manifest has no conditional-write guard: one
daemon owns a prefix (the DATA_DIR lock makes that one daemon per data directory; two data directories must not
share a bucket prefix).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from .api import RemoteCorruptError, RemoteNotFoundError, RemoteStore

FORMAT = "logfs-remote-manifest"
VERSION = 2
MANIFEST_NAME = "manifest.json"
#: The object kinds every tiered segment has, in upload order (the .log last keeps a listing readable mid-upload).
SEGMENT_EXTS = ("index", "timeindex", "viewindex", "log")
#: The optional kind: Kafka's transaction index, only for a segment that aborted transactions reach into (uploaded
#: before the .log). A manifest that names one is written as version 2 (1 otherwise).
TXN_INDEX_EXT = "txnindex"
OBJECT_EXTS = SEGMENT_EXTS + (TXN_INDEX_EXT,)


def partition_prefix(prefix: str, topic: str, partition: int) -> str:
    """``<prefix>/<topic>-<partition>/`` (no leading slash; just ``<topic>-<partition>/`` with no prefix)."""
    prefix = prefix.strip("/")
    return f"{prefix}/{topic}-{partition}/" if prefix else f"{topic}-{partition}/"


def segment_key(prefix: str, topic: str, partition: int, base_offset: int, ext: str) -> str:
    if ext not in OBJECT_EXTS:
        raise ValueError(f"unknown segment object kind {ext!r}")
    return f"{partition_prefix(prefix, topic, partition)}{base_offset:020d}.{ext}"


def manifest_key(prefix: str, topic: str, partition: int) -> str:
    return partition_prefix(prefix, topic, partition) + MANIFEST_NAME


@dataclass(frozen=True)
class RemoteFile:
    key: str
    size: int


@dataclass(frozen=True)
class RemoteSegment:
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    objects: dict[str, RemoteFile]
    min_timestamp: int = -1  # smallest record timestamp (ms); -1: unknown (an older writer, or no record)

    def keys(self) -> list[str]:
        return [f.key for f in self.objects.values()]


@dataclass(frozen=True)
class PartitionManifest:
    topic: str
    partition: int
    generation: int = 0
    log_start_offset: int = 0
    segments: tuple[RemoteSegment, ...] = field(default_factory=tuple)

    @property
    def remote_log_end_offset(self) -> int:
        return self.segments[-1].next_offset if self.segments else 0

    @property
    def remote_size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def with_segment(self, seg: RemoteSegment) -> PartitionManifest:
        """The next manifest, with ``seg`` appended: it must start at or after the end of the tiered log (no
        overlap). It may start after it: offsets can skip (records lost in a power cut before they were
        flushed, or removed by compaction), and a gap in offsets is not a gap in data."""
        if self.segments and seg.base_offset < self.remote_log_end_offset:
            raise ValueError(f"segment {seg.base_offset} overlaps the remote log, which ends at "
                             f"{self.remote_log_end_offset}")
        if seg.next_offset <= seg.base_offset:
            raise ValueError(f"segment {seg.base_offset} is empty")
        start = self.log_start_offset if self.segments else max(self.log_start_offset, seg.base_offset)
        return replace(self, generation=self.generation + 1, log_start_offset=start,
                       segments=self.segments + (seg,))

    def without_segments_below(self, offset: int) -> tuple[PartitionManifest, list[RemoteSegment]]:
        """Retention: drop the segments wholly below ``offset``; returns the next manifest and the dropped ones."""
        dropped = tuple(s for s in self.segments if s.next_offset <= offset)
        nxt = replace(self, generation=self.generation + 1, log_start_offset=max(self.log_start_offset, offset),
                      segments=self.segments[len(dropped):])
        return nxt, list(dropped)

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """The tiered segment holding ``offset`` (None below the start or at/after the remote end)."""
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].next_offset <= offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.segments) and self.segments[lo].base_offset <= offset:
            return self.segments[lo]
        return None


def encode(m: PartitionManifest) -> bytes:
    version = VERSION if any(TXN_INDEX_EXT in s.objects for s in m.segments) else 1
    return json.dumps({
        "format": FORMAT, "version": version, "topic": m.topic, "partition": m.partition,
        "generation": m.generation, "log_start_offset": m.log_start_offset,
        "segments": [{
            "base_offset": s.base_offset, "next_offset": s.next_offset, "size": s.size,
            "max_timestamp": s.max_timestamp,
            "min_timestamp": s.min_timestamp,
            "objects": {ext: {"key": f.key, "size": f.size} for ext, f in s.objects.items()},
        } for s in m.segments],
    }, indent=1).encode()


def _int(d: dict, name: str) -> int:
    v = d[name]
    if type(v) is not int:
        raise TypeError(f"{name} is not an integer")
    return v


def decode(data: bytes, where: str = "manifest") -> PartitionManifest:
    """Parse and validate a manifest; RemoteCorruptError (naming ``where``) if it is not one logfs can use."""
    try:
        d = json.loads(data)
        if d.get("format") != FORMAT:
            raise ValueError(f"format is {d.get('format')!r}, not {FORMAT!r}")
        if _int(d, "version") > VERSION:
            raise ValueError(f"version {d['version']} is newer than this logfs reads ({VERSION})")
        segs = []
        for s in d["segments"]:
            objects = {ext: RemoteFile(str(o["key"]), _int(o, "size")) for ext, o in s["objects"].items()}
            if set(objects) - {TXN_INDEX_EXT} != set(SEGMENT_EXTS):
                raise ValueError(f"segment {s.get('base_offset')} names objects {sorted(objects)}")
            seg = RemoteSegment(_int(s, "base_offset"), _int(s, "next_offset"), _int(s, "size"),
                                _int(s, "max_timestamp"), objects,
                                _int(s, "min_timestamp") if "min_timestamp" in s else -1)
            if seg.next_offset <= seg.base_offset or (segs and seg.base_offset < segs[-1].next_offset):
                raise ValueError(f"segment {seg.base_offset}..{seg.next_offset} is empty or overlaps")
            segs.append(seg)
        topic, partition = d["topic"], _int(d, "partition")
        if not isinstance(topic, str):
            raise TypeError("topic is not a string")
        return PartitionManifest(topic, partition, _int(d, "generation"), _int(d, "log_start_offset"),
                                 tuple(segs))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise RemoteCorruptError(f"{where}: not a valid logfs manifest: {e}") from None


class ManifestStore:
    """Reads and writes the partition manifests of one store under one key prefix."""

    def __init__(self, store: RemoteStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix

    def read(self, topic: str, partition: int) -> PartitionManifest:
        """The partition's manifest; an empty one (generation 0) when none was written yet."""
        key = manifest_key(self.prefix, topic, partition)
        try:
            data = self.store.get_bytes(key)
        except RemoteNotFoundError:
            return PartitionManifest(topic, partition)
        m = decode(data, key)
        if (m.topic, m.partition) != (topic, partition):
            raise RemoteCorruptError(f"{key}: names {m.topic}-{m.partition}")
        return m

    def write(self, m: PartitionManifest) -> None:
        self.store.put_bytes(manifest_key(self.prefix, m.topic, m.partition), encode(m))

    def segment_keys(self, topic: str, partition: int, base_offset: int) -> dict[str, str]:
        """The keys of a segment's objects, by kind (the optional ``txnindex`` among them)."""
        return {ext: segment_key(self.prefix, topic, partition, base_offset, ext) for ext in OBJECT_EXTS}

    def orphans(self, m: PartitionManifest) -> list[str]:
        """Keys under the partition's prefix that ``m`` does not name (nor the manifest itself)."""
        named = {k for s in m.segments for k in s.keys()}
        named.add(manifest_key(self.prefix, m.topic, m.partition))
        objs = self.store.list(partition_prefix(self.prefix, m.topic, m.partition))
        return [o.key for o in objs if o.key not in named]


# -- what a follower reads first: the index of the prefix -------------------------------------------------------
INDEX_NAME = "logfs-index.json"
INDEX_FORMAT = "logfs-follower-index"
INDEX_VERSION = 2


def index_key(prefix: str) -> str:
    """``<prefix>/logfs-index.json`` (``logfs-index.json`` with no prefix): not a partition's name (``<topic>-<n>``
    is a directory), so no partition's keys ever clash with it."""
    prefix = prefix.strip("/")
    return f"{prefix}/{INDEX_NAME}" if prefix else INDEX_NAME


@dataclass(frozen=True)
class FollowerIndex:
    """What a follower mount needs to find changes with one request: every tiered topic, its settings as the writer
    has them (``logfs.key.separator`` and ``logfs.null.marker`` shape the text), and per partition the generation
    of its manifest and its ``remote_log_end_offset``. Written by the writer after the manifests it names (a
    follower that reads it then finds manifests at least that new), rewritten only when something in it changed.
    Format (JSON, UTF-8)::

        {"format": "logfs-follower-index", "version": 2, "generation": 12,
         "published_ms": 1700000000123,
         "topics": {"orders": {"config": {"logfs.key.separator": "=", ...},
                               "partitions": {"0": 7, "1": 3},
                               "end_offsets": {"0": 120000, "1": 4000}}}}

    Version 2 added ``published_ms`` (the writer's wall clock when it wrote this index) and ``end_offsets`` (each
    partition's ``remote_log_end_offset`` in the manifest generation named): a follower's lag in offsets and
    seconds. A version-1 index (an older writer) reads with ``published_ms`` -1 and no end offsets. A reader
    ignores fields it does not know (a newer writer may add some) and refuses another ``format``; a higher
    ``version`` is read for the fields above, which every version keeps."""

    generation: int = 0
    #: topic -> {"config": {key: value}, "partitions": {int: generation}, "end_offsets": {int: offset}}
    topics: dict = field(default_factory=dict)
    published_ms: int = -1  # the writer's time.time() in ms when it wrote the index; -1 when not given


def encode_index(index: FollowerIndex) -> bytes:
    topics = {t: {"config": dict(sorted(v["config"].items())),
                  "partitions": {str(p): g for p, g in sorted(v["partitions"].items())},
                  "end_offsets": {str(p): e for p, e in sorted(v.get("end_offsets", {}).items())}}
              for t, v in sorted(index.topics.items())}
    return json.dumps({"format": INDEX_FORMAT, "version": INDEX_VERSION, "generation": index.generation,
                       "published_ms": index.published_ms, "topics": topics}, sort_keys=True).encode()


def decode_index(data: bytes, where: str = INDEX_NAME) -> FollowerIndex:
    try:
        d = json.loads(data)
        if d.get("format") != INDEX_FORMAT:
            raise ValueError(f"format {d.get('format')!r}")
        topics = {}
        for topic, v in d.get("topics", {}).items():
            config = {str(k): str(x) for k, x in v.get("config", {}).items()}
            partitions = {int(p): int(g) for p, g in v.get("partitions", {}).items()}
            ends = {int(p): int(e) for p, e in v.get("end_offsets", {}).items()}
            topics[str(topic)] = {"config": config, "partitions": partitions, "end_offsets": ends}
        return FollowerIndex(int(d.get("generation", 0)), topics, int(d.get("published_ms", -1)))
    except (ValueError, TypeError, AttributeError) as e:
        raise RemoteCorruptError(f"{where}: not a valid logfs follower index: {e}") from None

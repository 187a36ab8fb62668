"""Time ranges and pushed-down filters in the ``logfs`` source (CONTRACT section 11).

The data: a topic written by the engine (no mount) from batches built by kafka-python's builder with chosen
record timestamps: gaps between batches, a batch older than the ones before it, a batch whose records go back in
time, many small segments. The ground truth is kafka-python parsing the very ``.log`` files: Kafka's
``offsetsForTimes`` is "the earliest offset whose timestamp is at or after T", computed here by brute force.
"""

from __future__ import annotations

import glob
import json
import operator
import os
import random
import uuid

import pytest

pytest.importorskip("pyspark")
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

from logfs.remote.manifest import ManifestStore, PartitionManifest, RemoteFile, RemoteSegment, segment_key  # noqa: E402
from logfs.spark import bucket as bucket_mod  # noqa: E402
from logfs.spark import datasource as ds  # noqa: E402
from logfs.spark.bucket import BucketPartitionReader, TieredPartitionReader  # noqa: E402
from logfs.spark.options import OffsetRange, OptionError, SourceOptions, plan_batch  # noqa: E402
from logfs.spark.pushdown import Narrowing, narrow_union, remember  # noqa: E402
from logfs.spark.segments import PartitionReader, TopicPartition  # noqa: E402
from logfs.storage import ManualClock  # noqa: E402
from logfs.storage.local.reader import SegmentReader  # noqa: E402
from logfs.testing.stores import CountingStore  # noqa: E402
from log_helpers import log_file_records  # noqa: E402

T0 = 1_700_000_000_000
TOPIC = "ev"


def _batch(records) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (value, ts) in enumerate(records):
        builder.append(i, timestamp=ts, key=None, value=value, headers=[])
    return bytes(builder.build())


def batch_plan(p: int) -> list[list[int]]:
    """The record timestamps of each batch of partition ``p``."""
    out = []
    t = T0 + p * 100
    for i in range(70):
        n = 4 + (i * 7 + p) % 9
        if i % 11 == 5:
            t += 5_000  # a gap: timestamps between batches
        if i == 20:
            out.append([t - 7_000 + j for j in range(n)])  # a batch older than the ones before it
            continue
        if i == 33:
            out.append([t + 900 - 100 * j for j in range(n)])  # records going back in time within a batch
            t += 1000
            continue
        out.append([t + j * 10 for j in range(n)])
        t += 1000
    return out


@pytest.fixture
def timed(open_manager):
    """DATA_DIR with topic ``ev`` (2 partitions, ~12 small segments each); the manager stays open."""
    m = open_manager({"num.partitions": "2", "log.segment.bytes": "2048", "log.index.interval.bytes": "256",
                      "log.segment.delete.delay.ms": "0"}, clock=ManualClock())
    m.create_topic(TOPIC)
    for p in range(2):
        for i, stamps in enumerate(batch_plan(p)):
            m.get_log(TOPIC, p).append_raw_batch(_batch([(b"p%d-b%d-r%d-%s" % (p, i, j, b"x" * (j * 13 % 40)), ts)
                                                         for j, ts in enumerate(stamps)]))
    return m


def truth(data_dir: str, p: int) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record of partition ``p``, parsed by kafka-python."""
    return [(r.offset, r.timestamp) for r in log_file_records(os.path.join(data_dir, f"{TOPIC}-{p}"))]


def offsets_for_times(records, ts: int, start: int = 0) -> int | None:
    """Kafka's offsetsForTimes by brute force."""
    return min((o for o, t in records if t >= ts and o >= start), default=None)


def probe_times(records) -> list[int]:
    stamps = sorted({t for _, t in records})
    return sorted({T0 - 50_000, stamps[-1] + 1, *stamps, *(t - 1 for t in stamps), *(t + 1 for t in stamps)})


def test_the_timestamps_are_not_monotonic_and_segments_are_many(timed):
    for p in range(2):
        recs = truth(timed.data_dir, p)
        assert any(b[1] < a[1] for a, b in zip(recs, recs[1:]))
        assert len(glob.glob(os.path.join(timed.data_dir, f"{TOPIC}-{p}", "*.log"))) > 8


def test_offset_for_timestamp_locally_equals_kafka_semantics(timed):
    """Every timestamp of the log, one ms on each side, before the first and after the last record, from the log
    start and from later starts: the reader's answer is the brute-force one."""
    for p in range(2):
        recs = truth(timed.data_dir, p)
        reader = PartitionReader(timed.data_dir, TopicPartition(TOPIC, p))
        for ts in probe_times(recs)[::3] + [T0 - 50_000, max(t for _, t in recs) + 1]:
            for start in (0, 137):
                assert reader.offset_for_timestamp(ts, start) == offsets_for_times(recs, ts, start), (p, ts, start)


# -- a bucket made of the engine's segments ------------------------------------------------------------------
def upload(store, prefix: str, data_dir: str, p: int, count: int | None = None, *,
           min_timestamps: bool = True) -> int:
    """Put the first ``count`` sealed segments of partition ``p`` (all sealed ones by default) and a manifest
    listing them, as the daemon's tiering does (each segment's smallest timestamp by the same scan, unless
    ``min_timestamps`` is false: a manifest of a logfs from before it). Returns the remote log end offset."""
    reader = PartitionReader(data_dir, TopicPartition(TOPIC, p))
    bases = reader.segment_bases()
    sealed = bases[:-1][:count]
    m = PartitionManifest(TOPIC, p)
    for i, base in enumerate(sealed):
        stem = os.path.join(data_dir, f"{TOPIC}-{p}", f"{base:020d}")
        headers = [h for h, _ in reader.batches(base, bases[i + 1])]
        objects = {}
        for ext in ("index", "timeindex", "viewindex", "log"):
            key = segment_key(prefix, TOPIC, p, base, ext)
            body = b""
            if os.path.exists(f"{stem}.{ext}"):
                with open(f"{stem}.{ext}", "rb") as f:
                    body = f.read()
            store.put_bytes(key, body)
            objects[ext] = RemoteFile(key, len(body))
        with SegmentReader(os.path.dirname(stem), base) as segment:
            lowest = segment.min_timestamp() if min_timestamps else -1
        m = m.with_segment(RemoteSegment(base, headers[-1].next_offset, objects["log"].size,
                                         max(h.max_timestamp for h in headers), objects, lowest))
    ManifestStore(store, prefix).write(m)
    return m.remote_log_end_offset


@pytest.fixture
def bucket(timed, creds):
    """The whole sealed log of both partitions in the bucket, and partition 0's first 4 segments under a second
    prefix (the rest only local: for localDataDir)."""
    from logfs.remote.s3 import S3Store

    store = S3Store(creds.bucket, endpoint=creds.endpoint)
    full, part = "t-" + uuid.uuid4().hex[:8], "p-" + uuid.uuid4().hex[:8]
    ends = {p: upload(store, full, timed.data_dir, p) for p in range(2)}
    seam = upload(store, part, timed.data_dir, 0, count=4)
    upload(store, part, timed.data_dir, 1, count=0)
    yield {"store": store, "full": full, "part": part, "ends": ends, "seam": seam, "creds": creds}
    store.close()


def test_offset_for_timestamp_from_the_bucket_and_across_the_seam(timed, bucket):
    store = bucket["store"]
    for p in range(2):
        recs = truth(timed.data_dir, p)
        tiered = [r for r in recs if r[0] < bucket["ends"][p]]
        remote = BucketPartitionReader(store, bucket["full"], TopicPartition(TOPIC, p))
        for ts in probe_times(tiered)[::4]:
            assert remote.offset_for_timestamp(ts) == offsets_for_times(tiered, ts), (p, ts)
    recs = truth(timed.data_dir, 0)
    whole = TieredPartitionReader(BucketPartitionReader(store, bucket["part"], TopicPartition(TOPIC, 0)),
                                  PartitionReader(timed.data_dir, TopicPartition(TOPIC, 0)))
    assert 0 < bucket["seam"] < recs[-1][0]
    for ts in probe_times(recs)[::4]:
        assert whole.offset_for_timestamp(ts) == offsets_for_times(recs, ts), ts


def _read_rows(options: SourceOptions, narrowings=None) -> list[tuple[int, int, int]]:
    """(partition, offset, timestamp ms) of what the source's planner and executors' read return (in this
    process: the code Spark runs, without Spark)."""
    rows = []
    for r in plan_batch(options, narrowings):
        for b in ds.read_range(options, r, ds.KAFKA_SCHEMA):
            d = b.to_pydict()
            rows += [(p, o, int(t.timestamp() * 1000)) for p, o, t in zip(d["partition"], d["offset"],
                                                                             d["timestamp"])]
    return sorted(rows)


def test_bucket_fetches_only_the_byte_ranges_of_a_narrow_window(timed, bucket, monkeypatch):
    """A window of a few percent of partition 0's time range, from the bucket: through the options
    (startingTimestamp/endingTimestamp) and through a pushed-down lower bound with an offset upper bound. The
    rows are the ground truth's; the .log bytes fetched are a small fraction of the partition's."""
    counting = CountingStore(bucket["store"])
    monkeypatch.setattr(bucket_mod, "open_store", lambda *a, **k: counting)
    recs = [r for r in truth(timed.data_dir, 0) if r[0] < bucket["ends"][0]]
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(timed.data_dir, f"{TOPIC}-0", "*.log")))
    lo_ts, hi_ts = T0 + 40_000, T0 + 43_000
    path = f"s3://{bucket['creds'].bucket}/{bucket['full']}"
    opts = SourceOptions.parse({"path": path, "s3.endpoint": bucket["creds"].endpoint, "assign": '{"ev":[0]}',
                                "startingTimestamp": str(lo_ts), "endingTimestamp": str(hi_ts)})
    got = _read_rows(opts)
    first, last = offsets_for_times(recs, lo_ts), offsets_for_times(recs, hi_ts)
    assert [(o, t) for _, o, t in got] == [r for r in recs if first <= r[0] < last] and got
    # (Segments of 2 KB here: the two timestamp look-ups scan up to a segment's end. tools/bench.py measures a
    # realistic log.)
    assert counting.log_bytes < 0.25 * total, (counting.log_bytes, total)
    windowed = counting.log_bytes
    # Pushed down: timestamp >= lo_ts and offset < last.
    counting.log_bytes = 0
    plain = SourceOptions.parse({"path": path, "s3.endpoint": bucket["creds"].endpoint, "assign": '{"ev":[0]}'})
    got = _read_rows(plain, [Narrowing(min_timestamp=lo_ts, offset_hi=last)])
    assert [(o, t) for _, o, t in got] == [r for r in recs if first <= r[0] < last]
    assert counting.log_bytes <= windowed + 4096
    counting.log_bytes = 0
    assert len(_read_rows(plain)) == len(recs)
    assert counting.log_bytes > 0.8 * total


def test_timestamp_options_from_the_bucket_with_and_without_local_data_dir(timed, bucket):
    recs = truth(timed.data_dir, 0)
    creds = bucket["creds"]
    seam = bucket["seam"]
    for prefix, local, visible in ((bucket["full"], None, bucket["ends"][0]), (bucket["part"], timed.data_dir,
                                                                               recs[-1][0] + 1)):
        mine = [r for r in recs if r[0] < visible]
        for lo, hi in ((T0 + 1_000, T0 + 9_000), (T0 + 20_500, T0 + 80_000), (T0 - 5, T0 + 10**9)):
            options = {"path": f"s3://{creds.bucket}/{prefix}", "s3.endpoint": creds.endpoint,
                       "assign": '{"ev":[0]}', "startingTimestamp": str(lo), "endingTimestamp": str(hi)}
            if local:
                options["localDataDir"] = local
            got = _read_rows(SourceOptions.parse(options))
            first = offsets_for_times(mine, lo)
            last = offsets_for_times(mine, hi)
            last = visible if last is None else last
            assert [(o, t) for _, o, t in got] == [r for r in mine if first <= r[0] < last], (prefix, lo, hi)
            if local and first < seam < last:
                assert any(o < seam for _, o, _ in got) and any(o >= seam for _, o, _ in got)


# -- an upper bound on timestamp cuts the tail, from the manifest's smallest timestamps -----------------------
def segments_of(data_dir: str, p: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(base offset, its records' (offset, timestamp) by kafka-python) of each segment of partition ``p``."""
    out = []
    for path in sorted(glob.glob(os.path.join(data_dir, f"{TOPIC}-{p}", "*.log"))):
        base = int(os.path.basename(path)[:20])
        with open(path, "rb") as f:
            from kafka.record.memory_records import MemoryRecords

            records = MemoryRecords(f.read())
        recs = []
        while records.has_next():
            recs += [(r.offset, r.timestamp) for r in records.next_batch()]
        out.append((base, recs))
    return out


def suffix_cut(segments, hi: int, start: int, end: int) -> int:
    """The cut by brute force: the base offset of the first of the longest run of segments before ``end`` whose
    records are all later than ``hi`` (``end`` if the segment holding ``end - 1`` has one at or before)."""
    cut = end
    for base, recs in reversed(segments):
        if base >= cut:
            continue
        if not recs or recs[-1][0] < start or min(t for _, t in recs) <= hi:
            break
        cut = base
    return cut


def test_the_manifest_holds_each_segments_smallest_timestamp(timed, bucket):
    """What the tiering's scan recorded is kafka-python's smallest timestamp of the segment's records (partition 0
    has a batch older than the ones before it and a batch whose records go back in time)."""
    going_back = 0
    for p in range(2):
        m = ManifestStore(bucket["store"], bucket["full"]).read(TOPIC, p)
        segments = dict(segments_of(timed.data_dir, p))
        assert len(m.segments) > 8
        for i, seg in enumerate(m.segments):
            assert seg.min_timestamp == min(t for _, t in segments[seg.base_offset]), (p, seg.base_offset)
            going_back += i > 0 and seg.min_timestamp < m.segments[i - 1].max_timestamp
    assert going_back  # (a segment holding records older than the one before it: the case an upper bound minds)


def test_an_upper_bound_cuts_the_tail_exactly_at_segment_granularity(timed, bucket):
    """For every timestamp of the log (one ms on each side too) as the inclusive upper bound, from the log start
    and from a later offset: the bucket reader's end is the brute-force suffix cut, and no record at or before the
    bound lies at or after it. From the manifest read by layout(): no request at all."""
    for p in range(2):
        reader = BucketPartitionReader(bucket["store"], bucket["full"], TopicPartition(TOPIC, p))
        first, end, _ = reader.layout()
        segments = [(b, r) for b, r in segments_of(timed.data_dir, p) if b < end]
        recs = [r for _, rs in segments for r in rs]
        reader.manifests.store = None  # (any request now fails)
        for hi in probe_times(recs)[::2]:
            for start in (first, 137):
                cut = reader.end_for_timestamp_at_most(hi, start, end)
                assert cut == suffix_cut(segments, hi, start, end), (p, hi, start)
                assert all(o < cut for o, t in recs if t <= hi and o >= start), (p, hi, start, cut)
            assert reader.end_for_timestamp_at_most(hi, first, 200) == suffix_cut(segments, hi, first, 200)
        assert reader.end_for_timestamp_at_most(T0 - 50_000, first, end) == segments[0][0]  # before everything
        assert reader.end_for_timestamp_at_most(10**15, first, end) == end  # after everything


def test_a_mid_window_from_the_bucket_fetches_only_its_segments(timed, bucket, monkeypatch):
    """A window in the middle of partition 0's time range, pushed down as both bounds (``timestamp >= lo AND
    timestamp <= hi``): the rows are the ground truth's and those of the whole read filtered (pushdown off); the
    .log bytes fetched are about the window's segments, not the rest of the log."""
    counting = CountingStore(bucket["store"])
    monkeypatch.setattr(bucket_mod, "open_store", lambda *a, **k: counting)
    end = bucket["ends"][0]
    segments = [(b, r) for b, r in segments_of(timed.data_dir, 0) if b < end]
    recs = [r for _, rs in segments for r in rs]
    sizes = {b: os.path.getsize(os.path.join(timed.data_dir, f"{TOPIC}-0", f"{b:020d}.log")) for b, _ in segments}
    total = sum(sizes.values())
    path = f"s3://{bucket['creds'].bucket}/{bucket['full']}"
    plain = SourceOptions.parse({"path": path, "s3.endpoint": bucket["creds"].endpoint, "assign": '{"ev":[0]}'})
    whole = [(o, t) for _, o, t in _read_rows(plain)]
    counting.log_bytes = 0
    eq = recs[len(recs) // 2][1]  # (timestamp = one record's: both bounds)
    for lo, hi in ((T0 + 40_000, T0 + 43_000), (eq, eq), (T0 + 30_000, T0 + 31_500)):
        counting.log_bytes = 0
        got = [(o, t) for _, o, t in _read_rows(plain, [Narrowing(min_timestamp=lo, max_timestamp=hi)])]
        want = [r for r in recs if lo <= r[1] <= hi]
        assert want and [r for r in got if lo <= r[1] <= hi] == want == [r for r in whole if lo <= r[1] <= hi]
        # What the plan covers: from the first record at or after lo to the cut; its segments and the look-up's.
        first = offsets_for_times(recs, lo)
        cut = suffix_cut(segments, hi, first, end)
        assert cut < end - 100, (lo, hi, cut, end)  # it does cut (the log goes on well past the window)
        assert max(o for o, _ in got) < cut
        held = sum(size for b, size in sizes.items() if any(first <= o < cut for o, _ in dict(segments)[b]))
        assert counting.log_bytes <= held + 2 * max(sizes.values()), (lo, hi, counting.log_bytes, held)
        assert counting.log_bytes < 0.2 * total, (lo, hi, counting.log_bytes, total)
    # Only an upper bound: the read ends at the cut, from the log start.
    counting.log_bytes = 0
    hi = T0 + 12_000
    got = [(o, t) for _, o, t in _read_rows(plain, [Narrowing(max_timestamp=hi)])]
    assert [r for r in got if r[1] <= hi] == [r for r in recs if r[1] <= hi]
    assert counting.log_bytes < 0.35 * total, (counting.log_bytes, total)


def test_a_manifest_without_smallest_timestamps_is_read_whole(timed, bucket, monkeypatch):
    """Segments tiered by a logfs from before ``min_timestamp`` (no field in the manifest): an upper bound does
    not cut, the rows are the same."""
    store = bucket["store"]
    old = "o-" + uuid.uuid4().hex[:8]
    end = upload(store, old, timed.data_dir, 0, min_timestamps=False)
    key = f"{old}/{TOPIC}-0/manifest.json"
    doc = json.loads(store.get_bytes(key))
    for seg in doc["segments"]:
        del seg["min_timestamp"]  # as an older logfs wrote it
    store.put_bytes(key, json.dumps(doc).encode())
    reader = BucketPartitionReader(store, old, TopicPartition(TOPIC, 0))
    assert {s.min_timestamp for s in reader.manifest().segments} == {-1}
    first, end2, _ = reader.layout()
    assert end2 == end and reader.end_for_timestamp_at_most(T0 + 10_000, first, end) == end
    recs = [r for r in truth(timed.data_dir, 0) if r[0] < end]
    counting = CountingStore(store)
    monkeypatch.setattr(bucket_mod, "open_store", lambda *a, **k: counting)
    opts = SourceOptions.parse({"path": f"s3://{bucket['creds'].bucket}/{old}", "s3.endpoint": bucket["creds"].endpoint,
                                "assign": '{"ev":[0]}'})
    got = [(o, t) for _, o, t in _read_rows(opts, [Narrowing(max_timestamp=T0 + 10_000)])]
    assert got == recs


def test_the_cut_across_the_local_data_dir_seam(timed, bucket):
    """With localDataDir: a range ending at or before the seam is cut from the manifest; one reaching past it
    keeps its end (the local segments keep no smallest timestamps)."""
    store = bucket["store"]
    seam = bucket["seam"]
    whole = TieredPartitionReader(BucketPartitionReader(store, bucket["part"], TopicPartition(TOPIC, 0)),
                                  PartitionReader(timed.data_dir, TopicPartition(TOPIC, 0)))
    first, end, _ = whole.layout()
    segments = [(b, r) for b, r in segments_of(timed.data_dir, 0) if b < seam]
    hi = T0 + 2_000
    assert whole.end_for_timestamp_at_most(hi, first, seam) == suffix_cut(segments, hi, first, seam) < seam
    assert whole.end_for_timestamp_at_most(hi, first, end) == end
    assert PartitionReader(timed.data_dir, TopicPartition(TOPIC, 0)).end_for_timestamp_at_most(hi, 0, end) == end


@pytest.fixture
def backwards(open_manager, creds):
    """Partition 0 of ``ev`` whose late segments hold records older than the whole log, where only a walk of the
    records shows them: a CreateTime batch (kafka-python) whose second record is 100 s before the log's start
    (its first timestamp and its max are new), a gzip batch holding one 90 s before it, and a LogAppendTime batch
    whose records' deltas point 80 s back (its records are its max timestamp: they are new). Every segment
    sealed, tiered with its smallest timestamp."""
    from logfs.remote.s3 import S3Store
    from logfs.storage.format import records as rec

    m = open_manager({"num.partitions": "1", "log.segment.bytes": "2048", "log.index.interval.bytes": "256",
                      "log.segment.delete.delay.ms": "0"}, clock=ManualClock())
    m.create_topic(TOPIC)
    log = m.get_log(TOPIC, 0)
    t = T0
    for i in range(60):
        stamps = [t + 10 * j for j in range(5)]
        if i == 40:
            stamps = [t, T0 - 100_000, t + 5]
        batch = _batch([(b"b%d-r%d-%s" % (i, j, b"z" * 30), ts) for j, ts in enumerate(stamps)])
        if i == 45:
            batch = rec.compress_batch(_batch([(b"gz%d" % j, ts) for j, ts in enumerate([t, t + 1, T0 - 90_000])]),
                                       1)
        if i == 50:
            batch = rec.build_batch_generic(0, t, [b"lat-%d" % j for j in range(3)],
                                            timestamps=[t, T0 - 80_000, t - 3], attributes=rec.ATTR_TIMESTAMP_TYPE)
        log.append_raw_batch(batch)
        t += 1000
    log.roll()
    store = S3Store(creds.bucket, endpoint=creds.endpoint)
    prefix = "b-" + uuid.uuid4().hex[:8]
    end = upload(store, prefix, m.data_dir, 0)
    yield {"store": store, "prefix": prefix, "end": end, "data_dir": m.data_dir, "creds": creds}
    store.close()


def test_records_older_than_the_log_in_late_segments_are_never_cut_away(backwards, monkeypatch):
    b = backwards
    end = b["end"]
    segments = [(base, r) for base, r in segments_of(b["data_dir"], 0) if base < end]
    recs = [r for _, rs in segments for r in rs]
    assert len(recs) == 5 * 57 + 9 and recs[-1][0] == end - 1
    oldest = sorted(recs, key=lambda r: r[1])[:2]
    assert [t for _, t in oldest] == [T0 - 100_000, T0 - 90_000] and oldest[0][0] > 150
    reader = BucketPartitionReader(b["store"], b["prefix"], TopicPartition(TOPIC, 0))
    first, _, _ = reader.layout()
    for hi in probe_times(recs)[::3] + [T0 - 100_000, T0 - 100_001, T0 - 90_000, T0 - 80_000]:
        cut = reader.end_for_timestamp_at_most(hi, first, end)
        assert cut == suffix_cut(segments, hi, first, end), hi
        assert all(o < cut for o, t in recs if t <= hi), (hi, cut)
    # The LogAppendTime batch's records are new (its max timestamp): nothing at or before T0 - 80_000 but the
    # two old records, and the cut at T0 - 90_000 ends right after the segment of the gzip batch's old record.
    assert [r for r in recs if r[1] <= T0 - 80_000] == sorted(oldest)
    assert reader.end_for_timestamp_at_most(T0 - 90_000, first, end) < end
    opts = SourceOptions.parse({"path": f"s3://{b['creds'].bucket}/{b['prefix']}", "s3.endpoint": b["creds"].endpoint,
                                "assign": '{"ev":[0]}'})
    whole = [(o, t) for _, o, t in _read_rows(opts)]
    assert whole == recs
    for lo, hi in ((None, T0 - 100_000), (None, T0 - 90_000), (T0 - 95_000, T0 - 85_000), (T0 + 30_000, T0 + 41_000),
                   (None, T0 + 20_000), (T0 + 49_000, T0 + 50_500)):
        got = [(o, t) for _, o, t in _read_rows(opts, [Narrowing(min_timestamp=lo, max_timestamp=hi)])]
        keep = (lambda r: (lo is None or r[1] >= lo) and r[1] <= hi)
        assert [r for r in got if keep(r)] == [r for r in whole if keep(r)] and any(map(keep, whole)), (lo, hi)


# -- Spark ---------------------------------------------------------------------------------------------------
def rows_of(df) -> list[tuple[int, int, int]]:
    from pyspark.sql import functions as F

    return sorted((r[0], r[1], r[2]) for r in df.select("partition", "offset", F.expr("unix_millis(timestamp)"))
                  .collect())


def read(spark, path, **options):
    reader = spark.read.format("logfs").option("subscribe", TOPIC)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def expected(recs_by_p, bounds) -> list[tuple[int, int, int]]:
    """Rows of each partition p with offsets in bounds[p] = [start, end)."""
    return sorted((p, o, t) for p, recs in recs_by_p.items() for o, t in recs
                  if bounds[p][0] <= o < bounds[p][1])


def test_timestamp_options_and_their_precedence(spark, timed):
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    end = {p: recs[p][-1][0] + 1 for p in range(2)}

    def oft(p, ts):
        found = offsets_for_times(recs[p], ts)
        return end[p] if found is None else found

    t1, t2, t3 = T0 + 12_345, T0 + 30_000, T0 + 55_555
    # startingTimestamp: every partition from its offsetsForTimes; endingTimestamp: up to it (exclusive).
    assert rows_of(read(spark, d, startingTimestamp=str(t1))) == expected(recs, {p: (oft(p, t1), end[p])
                                                                                 for p in range(2)})
    assert rows_of(read(spark, d, endingTimestamp=str(t2))) == expected(recs, {p: (0, oft(p, t2))
                                                                               for p in range(2)})
    # Per partition, with -2 (earliest) and -1 (latest); a timestamp after the last record as an end: latest.
    got = rows_of(read(spark, d, startingOffsetsByTimestamp=json.dumps({TOPIC: {"0": t1, "1": -2}}),
                       endingOffsetsByTimestamp=json.dumps({TOPIC: {"0": T0 + 10**9, "1": t3}})))
    assert got == expected(recs, {0: (oft(0, t1), end[0]), 1: (0, oft(1, t3))})
    # Precedence: the global timestamp over the per-partition ones over the offsets (both sides).
    got = rows_of(read(spark, d, startingTimestamp=str(t2), startingOffsetsByTimestamp=json.dumps(
        {TOPIC: {"0": t1, "1": t1}}), startingOffsets="latest", endingTimestamp=str(t3),
        endingOffsetsByTimestamp=json.dumps({TOPIC: {"0": -1, "1": -1}}), endingOffsets="earliest"))
    assert got == expected(recs, {p: (oft(p, t2), oft(p, t3)) for p in range(2)})
    got = rows_of(read(spark, d, startingOffsetsByTimestamp=json.dumps({TOPIC: {"0": t1, "1": t2}}),
                       startingOffsets='{"ev":{"0":-1,"1":-1}}', endingOffsetsByTimestamp=json.dumps(
                           {TOPIC: {"0": t3, "1": -1}}), endingOffsets='{"ev":{"0":3,"1":3}}'))
    assert got == expected(recs, {0: (oft(0, t1), oft(0, t3)), 1: (oft(1, t2), end[1])})
    # Before the first record: from the start; between batches (in a gap): the next batch's first record.
    gap = next(t for a, b in zip(recs[0], recs[0][1:]) for t in [a[1] + 2_000] if b[1] - a[1] > 4_000)
    assert rows_of(read(spark, d, startingTimestamp=str(T0 - 99_999), endingTimestamp=str(gap))) == expected(
        recs, {p: (0, oft(p, gap)) for p in range(2)})


def test_starting_offsets_by_timestamp_strategy(spark, timed):
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    after = max(t for p in range(2) for _, t in recs[p]) + 1
    with pytest.raises(Exception, match="No offset matched from request of topic-partition ev-"):
        read(spark, d, startingTimestamp=str(after)).collect()
    assert read(spark, d, startingTimestamp=str(after), startingOffsetsByTimestampStrategy="latest").count() == 0
    mixed = json.dumps({TOPIC: {"0": after, "1": T0}})
    got = rows_of(read(spark, d, startingOffsetsByTimestamp=mixed, startingOffsetsByTimestampStrategy="LATEST"))
    assert got == expected(recs, {0: (0, 0), 1: (0, recs[1][-1][0] + 1)})
    with pytest.raises(Exception, match="must name every selected partition"):
        read(spark, d, startingOffsetsByTimestamp=json.dumps({TOPIC: {"0": T0}})).collect()


def test_a_stream_starts_at_a_timestamp(spark, timed, tmp_path):
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    ts = T0 + 44_444
    q = (spark.readStream.format("logfs").option("subscribe", TOPIC).option("startingTimestamp", str(ts)).load(d)
         .selectExpr("partition", "offset", "unix_millis(timestamp) AS ts").writeStream.format("memory")
         .queryName("from_ts").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    q.awaitTermination(120)
    got = sorted(tuple(r) for r in spark.sql("SELECT partition, offset, ts FROM from_ts").collect())
    assert got == expected(recs, {p: (offsets_for_times(recs[p], ts), recs[p][-1][0] + 1) for p in range(2)})
    never = (spark.readStream.format("logfs").option("subscribe", TOPIC).option("endingTimestamp", "1").load(d)
             .writeStream.format("memory").queryName("never").option("checkpointLocation", str(tmp_path / "c2"))
             .start())
    with pytest.raises(Exception, match="for batch queries only"):
        never.awaitTermination(60)


# -- pushdown ------------------------------------------------------------------------------------------------
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture
def pushdown_on(spark):
    """Spark's filter pushdown for Python sources on for one test (register(spark, pushdown=True)); back to what
    register(spark) leaves (off) afterwards."""
    spark.conf.set(PUSHDOWN, "true")
    yield
    spark.conf.set(PUSHDOWN, "false")


_COMPARE = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}


def random_filter(rnd: random.Random, recs) -> tuple[str, callable]:
    """A random conjunction over timestamp/offset/partition/topic (and sometimes value), as SQL and as a
    predicate on (partition, offset, ts ms, value)."""
    stamps = sorted({t for p in recs for _, t in recs[p]})
    parts, preds = [], []

    def compare(column, arg, literal, op, x):  # arg: which of (partition, offset, ts, value) the column is
        parts.append(f"{column} {op} {literal(x)}")
        preds.append(lambda *row: _COMPARE[op](row[arg], x))

    def member(column, arg, literal, a, b):
        parts.append(f"{column} IN ({literal(a)}, {literal(b)})")
        preds.append(lambda *row: row[arg] in (a, b))

    for _ in range(rnd.randint(1, 4)):
        kind = rnd.choice(["ts_lo", "ts_hi", "ts_eq", "ts_in", "off_lo", "off_hi", "off_in", "part", "topic",
                           "value"])
        t = rnd.choice(stamps) + rnd.choice([-1, 0, 0, 1])
        o = rnd.randrange(0, 600)
        field, _, how = kind.partition("_")
        if field in ("ts", "off"):
            if field == "ts":
                column, arg, literal, x = "timestamp", 2, (lambda t: f"timestamp_millis({t})"), t
            else:
                column, arg, literal, x = "offset", 1, str, o
            if how == "in":
                member(column, arg, literal, x, rnd.choice(stamps) if field == "ts" else rnd.randrange(0, 600))
            else:
                op = "=" if how == "eq" else rnd.choice({"lo": [">", ">="], "hi": ["<", "<="]}[how])
                compare(column, arg, literal, op, x)
        elif kind == "part":
            p = rnd.choice([0, 1])
            compare("partition", 0, str, rnd.choice(["=", "<", ">=", "!="]), p)
        elif kind == "topic":
            name = rnd.choice([TOPIC, "other"])
            parts.append(f"topic = '{name}'")
            preds.append((lambda n: lambda p, off, ts, v: n == TOPIC)(name))
        else:
            parts.append("value LIKE '%r1-%'")
            preds.append(lambda p, off, ts, v: b"r1-" in v)
    return " AND ".join(parts), (lambda p, off, ts, v: all(f(p, off, ts, v) for f in preds))


def test_pushdown_on_and_off_give_the_same_rows(spark, timed):
    """A seeded random loop of filter conjunctions: with pushdown on (register(spark, pushdown=True)) and off (Spark's
    default: the source then plans without pushFilters, no DATA_SOURCE_PUSHDOWN_DISABLED), the rows are the
    brute-force ones. Each query reads a fresh DataFrame (a new relation)."""
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    values = {}
    for p in range(2):
        for o, v in ((r.offset, r.value) for r in PartitionReader(d, TopicPartition(TOPIC, p)).records(0, 10**6)):
            values[(p, o)] = v
    rnd = random.Random(34)
    try:
        for i in range(8):
            where, pred = random_filter(rnd, recs)
            want = sorted((p, o, t) for p in range(2) for o, t in recs[p] if pred(p, o, t, values[(p, o)]))
            spark.conf.set(PUSHDOWN, "true" if i % 2 == 0 else "false")
            assert rows_of(read(spark, d).where(where)) == want, where
            spark.conf.set(PUSHDOWN, "false" if i % 2 == 0 else "true")
            assert rows_of(read(spark, d).where(where)) == want, where
    finally:
        spark.conf.set(PUSHDOWN, "false")


def test_pushdown_narrows_the_plan(spark, timed, pushdown_on):
    """A late lower bound on timestamp and a partition filter leave fewer input partitions than the full read
    (one per 20 offsets here)."""
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    last = max(t for _, t in recs[0])
    full = read(spark, d, maxRecordsPerPartition="20")
    narrow = read(spark, d, maxRecordsPerPartition="20").where(
        f"timestamp >= timestamp_millis({last - 3000}) AND partition = 0")
    assert full.rdd.getNumPartitions() >= 40
    assert narrow.rdd.getNumPartitions() <= 3
    assert rows_of(narrow) == sorted((0, o, t) for o, t in recs[0] if t >= last - 3000)


def test_a_self_union_with_different_filters_is_exact(spark, timed, pushdown_on):
    """Spark 4.3 runs every scan of a relation with the read plan of the last one pushed down (a self-union
    here): the source plans the union of the narrowings pushed to the relation, and Spark's own filters (all
    handed back) select each branch's rows."""
    d = timed.data_dir
    recs = {p: truth(d, p) for p in range(2)}
    last = max(t for _, t in recs[1])
    df = read(spark, d)
    a = df.where(f"timestamp >= timestamp_millis({last - 2000}) AND partition = 1")
    b = df.where("offset < 7 AND partition = 0")
    want = sorted([(1, o, t) for o, t in recs[1] if t >= last - 2000] + [(0, o, t) for o, t in recs[0] if o < 7])
    assert rows_of(a.union(b)) == want
    assert rows_of(b.union(a)) == want
    # Two later queries over the same DataFrame, each with its own filters, stay exact too.
    assert rows_of(b) == sorted((0, o, t) for o, t in recs[0] if o < 7)
    assert rows_of(df.where("partition = 1 AND offset >= 300")) == sorted((1, o, t) for o, t in recs[1] if o >= 300)


@pytest.mark.xfail(strict=True, reason="Spark 4.3 reuses the last pushed-down read plan of a relation for a later "
                   "query without pushable filters (README: load() again)")
def test_a_later_query_without_filters_over_the_same_dataframe(spark, timed, pushdown_on):
    df = read(spark, timed.data_dir)
    assert df.where("offset < 5").count() == 10
    assert df.count() == sum(len(truth(timed.data_dir, p)) for p in range(2))


def test_register_turns_pushdown_on_when_asked_unless_the_session_set_it(spark):
    from logfs.spark import read_plans_per_scan, register

    try:
        spark.conf.unset(PUSHDOWN)
        assert spark.conf.get(PUSHDOWN) == "false"  # Spark's default
        # Spark 4.3 keeps a pushed-down read plan on the data source (PythonDataSourceV2.setReadInfo), not on the
        # scan: register(spark) then leaves pushdown off (the xfail above); a Spark that keeps it per scan gets it.
        per_scan = read_plans_per_scan(spark)
        jvm = spark._jvm
        builder = jvm.org.apache.spark.util.Utils.classForName(
            "org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder", True, False)
        assert per_scan == ("readInfo" in [f.getName() for f in builder.getDeclaredFields()])
        if spark.version.startswith("4.3."):
            assert not per_scan
        register(spark)
        assert spark.conf.get(PUSHDOWN) == ("true" if per_scan else "false")
        spark.conf.unset(PUSHDOWN)
        register(spark, pushdown=False)
        assert spark.conf.get(PUSHDOWN) == "false"
        df = spark.read.format("logfs").option("subscribe", "none").load("/nonexistent-logfs-dir")
        assert df.schema.names[:2] == ["key", "value"]  # a default session reads (no DATA_SOURCE_PUSHDOWN_DISABLED)
        register(spark, pushdown=True)
        assert spark.conf.get(PUSHDOWN) == "true"
        spark.conf.set(PUSHDOWN, "false")
        register(spark, pushdown=True)
        assert spark.conf.get(PUSHDOWN) == "false"
    finally:
        spark.conf.set(PUSHDOWN, "false")


def test_narrowing_union_and_record(tmp_path, timed):
    """Without Spark: narrowings of one relation accumulate; their union covers each."""
    reader = PartitionReader(timed.data_dir, TopicPartition(TOPIC, 0))
    a, b = Narrowing(offset_lo=10, offset_hi=20), Narrowing(offset_lo=15, offset_hi=40, partitions=(0,))
    assert remember("r1", a, str(tmp_path)) == [a]
    assert remember("r1", b, str(tmp_path)) == [a, b]
    assert remember("r1", a, str(tmp_path)) == [a, b]
    assert remember("r2", b, str(tmp_path)) == [b]
    tp = TopicPartition(TOPIC, 0)
    assert narrow_union([a, b], reader, tp, 0, 100) == [(10, 40)]
    assert narrow_union([a, Narrowing(offset_lo=50)], reader, tp, 0, 100) == [(10, 20), (50, 100)]
    assert narrow_union([a, Narrowing()], reader, tp, 0, 100) == [(0, 100)]
    assert narrow_union([Narrowing(partitions=(1,))], reader, tp, 0, 100) == []
    with pytest.raises(OptionError):
        SourceOptions.parse({"path": "/x", "subscribe": "a", "startingOffsetsByTimestampStrategy": "x"})
    assert OffsetRange  # (imported for the planner's types)


def test_translate_turns_timestamp_bounds_into_inclusive_milliseconds():
    """Spark's timestamps are microseconds, the records' milliseconds: a record at ms m is the Spark timestamp
    m * 1000 us; each bound becomes the smallest / largest ms that passes it (rows stay exact: Spark filters)."""
    import datetime

    from pyspark.sql.datasource import (
        EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual, StringStartsWith,
    )

    from logfs.spark.pushdown import translate

    def at(us: int) -> datetime.datetime:
        return datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=us)

    ts = ("timestamp",)
    cases = [
        (LessThan(ts, at(5_000_000)), None, 4_999), (LessThan(ts, at(5_000_001)), None, 5_000),
        (LessThan(ts, at(5_000_999)), None, 5_000), (LessThanOrEqual(ts, at(5_000_000)), None, 5_000),
        (LessThanOrEqual(ts, at(4_999_999)), None, 4_999), (LessThanOrEqual(ts, at(-1_500)), None, -2),
        (LessThan(ts, at(-1_500)), None, -2), (LessThan(ts, at(-1_000)), None, -2),
        (GreaterThan(ts, at(5_000_000)), 5_001, None), (GreaterThanOrEqual(ts, at(4_999_001)), 5_000, None),
        (EqualTo(ts, at(7_000_000)), 7_000, 7_000), (EqualTo(ts, at(7_000_500)), 7_001, 7_000),
        (In(ts, (at(9_000_000), at(3_000_000), None)), 3_000, 9_000),
    ]
    for f, lo, hi in cases:
        n = translate([f])
        assert (n.min_timestamp, n.max_timestamp) == (lo, hi), f
    # BETWEEN (both bounds) and several upper bounds: the tightest.
    n = translate([GreaterThanOrEqual(ts, at(1_000_000)), LessThanOrEqual(ts, at(2_000_000)),
                   LessThan(ts, at(1_800_000)), StringStartsWith(("topic",), "e")])
    assert (n.min_timestamp, n.max_timestamp, n.topic_prefixes) == (1_000, 1_799, ("e",))
    # A TimestampNTZ literal (no zone) is not this column's type: no bound.
    assert translate([LessThan(ts, datetime.datetime(2024, 1, 1))]).max_timestamp is None
    # Every m in range passes the filter and every m out of it fails, for the Spark value m * 1000 us.
    for us in range(-3_001, 3_002, 250):
        for kind, test in ((LessThan, lambda v: v < us), (LessThanOrEqual, lambda v: v <= us)):
            hi = translate([kind(ts, at(us))]).max_timestamp
            assert test(hi * 1000) and not test((hi + 1) * 1000), (kind, us, hi)

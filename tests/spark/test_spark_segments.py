"""The read-only segment reader and the option/offset planning of the logfs Spark source (no Spark here).

Data directories are written by the engine (LogManager), which stays open while they are read: the reader
must work while another process holds ``.lock``, and must change nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
import time

import pytest

from logfs.spark import options as opts
from logfs.spark import segments as seg
from logfs.spark.options import OffsetRange, OptionError, SourceOptions
from logfs.spark.segments import DataLossError, PartitionReader, TopicPartition
from logfs.storage import ManualClock
from logfs.storage.local import reader as storage_reader
from log_helpers import read_all as engine_records

SMALL = {"log.segment.bytes": "4096", "log.index.interval.bytes": "256", "log.segment.delete.delay.ms": "0"}


@pytest.fixture
def manager(open_manager):
    """factory(**broker props) -> an open LogManager on tmp_path/data (the shared factory, ManualClock)."""

    def make(props=None, partitions=1):
        return open_manager({"num.partitions": str(partitions), **(props or SMALL)}, clock=ManualClock())

    return make


def fill(log, clock, count, *, start=0, keyed=False, headers=False, per_append=7):
    """Append ``count`` records in appends of ``per_append``, the clock moving 1 ms per append."""
    i = start
    while i < start + count:
        n = min(per_append, start + count - i)
        values = [f"value-{j:05d}-{'x' * (j % 37)}".encode() for j in range(i, i + n)]
        keys = [f"k{j % 5}".encode() if j % 3 else None for j in range(i, i + n)] if keyed else None
        hdrs = [[("h", f"{j}".encode()), ("null", None)] for j in range(i, i + n)] if headers else None
        log.append(values, keys, headers=hdrs)
        clock.advance(1)
        i += n


def filled_topic(manager, count):
    """A new manager (the ``manager`` fixture's defaults) with topic ``t``, ``count`` records in partition 0 (fill):
    (manager, log)."""
    m = manager()
    m.create_topic("t")
    log = m.get_log("t", 0)
    fill(log, m.clock, count)
    return m, log


def tree_snapshot(root):
    """Every file under ``root`` with its size, mtime and content hash."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, digest)
    return out


def as_tuples(records):
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]


# -- reading ---------------------------------------------------------------------------------------------

def test_reads_what_the_engine_wrote_while_the_daemon_lock_is_held(manager):
    m = manager(partitions=2)
    m.create_topic("orders")
    for p in range(2):
        fill(m.get_log("orders", p), m.clock, 400 + 50 * p, keyed=True, headers=True)
    assert len(m.get_log("orders", 0).segments) > 5
    lock_fd = os.open(os.path.join(m.data_dir, ".lock"), os.O_RDONLY)
    try:  # the manager (the daemon's engine) holds .lock: a non-blocking flock of it fails
        with pytest.raises(BlockingIOError):
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(lock_fd)
    before = tree_snapshot(m.data_dir)
    assert set(seg.list_partitions(m.data_dir)) == {TopicPartition("orders", 0), TopicPartition("orders", 1)}
    for p in range(2):
        log = m.get_log("orders", p)
        reader = PartitionReader(m.data_dir, TopicPartition("orders", p))
        assert reader.offsets() == (log.log_start_offset, log.log_end_offset)
        assert as_tuples(reader.records(0, log.log_end_offset)) == as_tuples(engine_records(log))
        # Any sub-range, including ones starting and ending inside batches and segments.
        for start, end in [(0, 1), (13, 14), (57, 301), (199, log.log_end_offset), (5, 5)]:
            got = [r.offset for r in reader.records(start, end)]
            assert got == list(range(start, end))
    assert tree_snapshot(m.data_dir) == before, "the reader changed the data directory"


def test_offsets_of_the_active_segment_with_a_preallocated_index(manager):
    m = manager({"log.segment.bytes": str(1 << 20), "log.index.interval.bytes": "128"})
    m.create_topic("t")
    log = m.get_log("t", 0)
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    assert reader.offsets() == (0, 0)
    fill(log, m.clock, 3000)
    active = log.active_segment
    index_path = active.offset_index.path
    assert os.path.getsize(index_path) > active.offset_index.entries * 8  # preallocated zero slots
    assert reader.log_end_offset() == 3000
    # The index is used: a seek deep into the segment lands near the offset, not at the start.
    with storage_reader.SegmentReader(log.directory, active.base_offset) as s:
        pos = s.seek_position(2500)
        assert pos > 0
        first = next(s.batches(pos))[0]
        assert first.base_offset <= 2500 and 2500 - first.base_offset < 200
    assert [r.offset for r in reader.records(2500, 2510)] == list(range(2500, 2510))
    # After more appends the same reader sees the new end.
    fill(log, m.clock, 10, start=3000)
    assert reader.log_end_offset() == 3010


def test_a_missing_or_bogus_index_means_a_scan_from_the_segment_start(manager):
    m, log = filled_topic(manager, 300)
    want = as_tuples(engine_records(log))
    m.close()
    d = os.path.join(m.data_dir, "t-0")
    indexes = sorted(n for n in os.listdir(d) if n.endswith(".index"))
    os.unlink(os.path.join(d, indexes[0]))
    with open(os.path.join(d, indexes[1]), "r+b") as f:  # points at positions that are no batch starts
        f.write(bytes.fromhex("00000005 00000007 00000009 0000000b".replace(" ", "")))
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    assert as_tuples(reader.records(0, 300)) == want
    for start in (3, 100, 250):
        assert [r.offset for r in reader.records(start, start + 20)] == list(range(start, start + 20))


def test_skips_deleted_cleaned_swap_files_and_deleted_partitions(manager):
    m, log = filled_topic(manager, 200)
    want = as_tuples(engine_records(log))
    end = log.log_end_offset
    d = log.directory
    first = sorted(n for n in os.listdir(d) if n.endswith(".log"))[0]
    # Leftovers of retention and compaction with base offsets of their own, full of other records.
    for suffix, base in ((".deleted", 10**6), (".cleaned", 10**6 + 1), (".swap", 10**6 + 2)):
        for kind in (".log", ".index", ".timeindex"):
            src = os.path.join(d, first[:-4] + kind)
            shutil.copy(src, os.path.join(d, f"{base:020d}{kind}{suffix}"))
    shutil.copytree(d, os.path.join(m.data_dir, "t-7.0123abcd-delete"))
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    old_wait = storage_reader.SWAP_WAIT_SECONDS
    storage_reader.SWAP_WAIT_SECONDS = 0.05  # a stray .log.swap (a crashed swap) only delays the listing
    try:
        assert reader.offsets() == (0, end)
        assert as_tuples(reader.records(0, end)) == want
    finally:
        storage_reader.SWAP_WAIT_SECONDS = old_wait
    assert set(seg.list_partitions(m.data_dir)) == {TopicPartition("t", 0)}


def test_listing_waits_for_an_in_flight_swap(manager):
    m, _ = filled_topic(manager, 50)
    d = m.get_log("t", 0).directory
    swap = os.path.join(d, f"{0:020d}.log.swap")
    open(swap, "wb").close()
    timer = threading.Timer(0.2, os.unlink, [swap])
    timer.start()
    started = time.monotonic()
    bases = PartitionReader(m.data_dir, TopicPartition("t", 0)).segment_bases()
    waited = time.monotonic() - started
    timer.join()
    assert bases == [0] and 0.15 < waited < storage_reader.SWAP_WAIT_SECONDS + 0.5


def test_log_start_offset_from_the_checkpoint(manager):
    m, log = filled_topic(manager, 100)
    log.increment_log_start_offset(42)
    m.checkpoint()
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    assert reader.offsets() == (42, 100)
    assert opts.plan_batch(SourceOptions.parse({"path": m.data_dir, "subscribe": "t"})) == [
        OffsetRange("t", 0, 42, 100)]


# -- retention while reading -----------------------------------------------------------------------------

def _retained(manager, count=800):
    m, log = filled_topic(manager, count)
    segments = log.segments.as_list()
    assert len(segments) >= 8
    return m, log, segments


def test_retention_while_reading_continues_at_the_next_live_segment(manager):
    m, log, segments = _retained(manager)
    end = log.log_end_offset
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    it = reader.records(0, end)
    got = [next(it)]  # the first segment is open now
    # Retention deletes the first four segments (renamed .deleted and unlinked at once: delay 0).
    log.delete_segments(segments[:4])
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))
    got += list(it)
    offsets = [r.offset for r in got]
    first_kept = segments[4].base_offset
    # The open segment is read to its end; the three deleted unread ones are skipped; the rest is complete.
    assert offsets == list(range(0, segments[1].base_offset)) + list(range(first_kept, end))


def test_retention_while_reading_with_fail_on_data_loss(manager):
    m, log, segments = _retained(manager)
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    it = reader.records(0, log.log_end_offset, fail_on_data_loss=True)
    next(it)
    log.delete_segments(segments[:4])
    with pytest.raises(DataLossError, match=f"offsets {segments[1].base_offset}"):
        list(it)
    # Starting below the log start fails at once; without fail_on_data_loss it starts at the log start.
    with pytest.raises(DataLossError):
        list(reader.records(0, 10**6, fail_on_data_loss=True))
    assert next(reader.records(0, 10**6)).offset == segments[4].base_offset


def test_a_segment_vanishing_between_listing_and_opening(manager, monkeypatch):
    m, log, segments = _retained(manager)
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    stale = [s.base_offset for s in segments]
    real = PartitionReader.segment_bases
    calls = []

    def listing(self):
        calls.append(1)
        return stale if len(calls) == 1 else real(self)

    monkeypatch.setattr(PartitionReader, "segment_bases", listing)
    log.delete_segments(segments[:2])  # gone after the (stale) listing
    got = [r.offset for r in reader.records(segments[1].base_offset + 1, log.log_end_offset)]
    assert got == list(range(segments[2].base_offset, log.log_end_offset))
    assert len(calls) >= 2


def test_the_partition_deleted_while_reading_ends_the_read(manager):
    m, log, segments = _retained(manager)
    reader = PartitionReader(m.data_dir, TopicPartition("t", 0))
    it = reader.records(0, log.log_end_offset)
    next(it)
    m.delete_partition("t", 0)
    got = list(it)  # the open segment is read to its end, then there is nothing more
    assert [r.offset for r in got] == list(range(1, segments[1].base_offset))


# -- options and planning ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    ({}, "option path"),
    ({"path": "/x"}, "exactly one of"),
    ({"path": "/x", "subscribe": "a", "subscribePattern": "b"}, "exactly one of"),
    ({"path": "/x", "subscribePattern": "("}, "invalid regex"),
    ({"path": "/x", "subscribe": "a", "startingOffsets": "soon"}, "startingOffsets"),
    ({"path": "/x", "subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "not an offset"),
    ({"path": "/x", "subscribe": "a", "endingOffsets": '{"a":{"x":1}}'}, "not a partition"),
    ({"path": "/x", "subscribe": "a", "includeHeaders": "yes"}, "true or false"),
    ({"path": "/x", "subscribe": "a", "maxRecordsPerPartition": "-1"}, "negative"),
    ({"path": "/x", "subscribe": "a", "kafka.bootstrap.servers": "h:9092"}, "not supported"),
    ({"path": "/x", "subscribe": "a", "startingTimestamp": "soon"}, "milliseconds since the epoch"),
    ({"path": "/x", "subscribe": "a", "endingTimestamp": "-3"}, "not a timestamp"),
    ({"path": "/x", "subscribe": "a", "startingOffsetsByTimestamp": '{"a":{"0":"x"}}'}, "not a timestamp"),
    ({"path": "/x", "subscribe": "a", "endingOffsetsByTimestamp": "[1]"}, "must be JSON"),
    ({"path": "/x", "subscribe": "a", "startingOffsetsByTimestampStrategy": "earliest"}, "error or latest"),
    ({"path": "/x", "assign": "[1]"}, "option assign"),
    ({"path": "/x", "subscribe": "a", "kafka.isolation.level": "committed"}, "read_committed or read_uncommitted"),
])
def test_invalid_options(bad, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(bad)


def test_isolation_level_option():
    """``kafka.isolation.level`` as Kafka's consumer reads it (trimmed, any case); read_committed by default, as the
    mount's ``logfs.isolation.level``."""
    def parse(**o):
        return SourceOptions.parse({"path": "/x", "subscribe": "a", **o}).read_uncommitted

    assert not parse() and not parse(**{"kafka.isolation.level": "read_committed"})
    assert parse(**{"kafka.isolation.level": " READ_UNCOMMITTED "})


def test_offsets_specs_and_topic_selection(manager):
    m = manager(partitions=2)
    for topic in ("orders", "orders.eu", "clicks"):
        m.create_topic(topic)
        for p in range(2):
            fill(m.get_log(topic, p), m.clock, 30 + p)

    def plan(**o):
        return opts.plan_batch(SourceOptions.parse({"path": m.data_dir, **o}))

    assert plan(subscribe="orders") == [OffsetRange("orders", 0, 0, 30), OffsetRange("orders", 1, 0, 31)]
    assert {(r.topic, r.partition) for r in plan(subscribePattern="orders.*")} == {
        ("orders", 0), ("orders", 1), ("orders.eu", 0), ("orders.eu", 1)}
    assert {r.topic for r in plan(subscribePattern="orders")} == {"orders"}  # a full match, as in Kafka
    assert plan(assign='{"clicks":[1]}') == [OffsetRange("clicks", 1, 0, 31)]
    assert plan(subscribe="orders, clicks", startingOffsets='{"orders":{"0":5,"1":-1},"clicks":{"0":-2}}',
                endingOffsets='{"orders":{"0":-1,"1":-1},"clicks":{"1":7}}') == [
        OffsetRange("clicks", 0, 0, 30), OffsetRange("clicks", 1, 0, 7), OffsetRange("orders", 0, 5, 30)]
    assert plan(subscribe="orders", startingOffsets="latest") == []
    assert plan(subscribe="orders", endingOffsets='{"orders":{"0":999}}')[0] == OffsetRange("orders", 0, 0, 30)
    assert plan(subscribe="nosuchtopic") == []


def test_unknown_topics_select_nothing_and_an_unknown_assignment_is_named(manager):
    """As Spark's Kafka source: subscribing to a topic that does not exist reads nothing; assigning one is an
    error naming what is missing, raised while the driver plans the query (not in a worker)."""
    m = manager(partitions=2)
    m.create_topic("clicks")
    fill(m.get_log("clicks", 0), m.clock, 5)

    def plan(**o):
        return opts.plan_batch(SourceOptions.parse({"path": m.data_dir, **o}))

    assert plan(subscribe="nosuch") == [] and plan(subscribePattern="nosuch.*") == []
    assert SourceOptions.parse({"path": m.data_dir, "subscribe": "nosuch"}).bounds(starting=True) == {}
    with pytest.raises(OptionError, match=r"unknown topic or partition nosuch-0 \(no topic 'nosuch'\)"):
        plan(assign='{"nosuch":[0]}')
    with pytest.raises(OptionError, match=r"unknown topic or partition clicks-7 in "):
        plan(assign='{"clicks":[0,7]}')
    assert plan(assign='{"clicks":[0,1]}') == [OffsetRange("clicks", 0, 0, 5)]  # an empty partition: no range


def test_split_ranges():
    r = [OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 10, 10), OffsetRange("b", 0, 5, 8)]
    assert opts.split_ranges(r, None, None) == [r[0], r[2]]
    split = opts.split_ranges(r, 30, None)
    assert [(x.start, x.end) for x in split if x.topic == "a"] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert [x for x in split if x.topic == "b"] == [r[2]]
    split = opts.split_ranges(r, None, 10)
    assert len(split) >= 10 and sum(x.size for x in split) == 103
    # Every offset is in exactly one range.
    covered = sorted((x.topic, x.partition, o) for x in split for o in range(x.start, x.end))
    assert covered == sorted([("a", 0, o) for o in range(100)] + [("b", 0, o) for o in range(5, 8)])


def test_split_ranges_on_segment_boundaries():
    """With the segments' base offsets, cuts fall between segments: runs of whole segments, at most the even
    share each (so never fewer parts than the even split, and none over maxRecordsPerPartition); only a
    segment bigger than the share is cut inside."""
    bases = {("a", 0): [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]}  # ten segments of 100 records

    def cuts(ranges):
        return [(x.start, x.end) for x in ranges]

    whole = [OffsetRange("a", 0, 0, 1000)]
    assert cuts(opts.split_ranges(whole, 250, None, bases)) == [(0, 200), (200, 400), (400, 600), (600, 800),
                                                                (800, 1000)]
    assert cuts(opts.split_ranges(whole, None, 3, bases)) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert cuts(opts.split_ranges(whole, None, 2, bases)) == [(0, 500), (500, 1000)]
    # A range starting and ending inside segments: its first and last runs hold partial segments; no cut is
    # inside one (a run is at most the share, 400 here, so the last segment's 50 records are a run of their own).
    assert cuts(opts.split_ranges([OffsetRange("a", 0, 150, 950)], None, 2, bases)) == [
        (150, 500), (500, 900), (900, 950)]
    # Segments bigger than the share: each is cut inside, evenly, and nothing is cut across one.
    big = {("a", 0): [0, 600]}
    assert cuts(opts.split_ranges(whole, 250, None, big)) == [(0, 200), (200, 400), (400, 600), (600, 800),
                                                              (800, 1000)]
    assert cuts(opts.split_ranges(whole, 300, None, {("a", 0): [0, 700]})) == [  # share 1000 // 4
        (0, 233), (233, 466), (466, 700), (700, 850), (850, 1000)]
    # Every offset once, no part over the limit, never fewer parts than the even split by the limit, nor than
    # minPartitions (for one range), for many shapes.
    import random

    rnd = random.Random(7)
    for _ in range(300):
        lo = rnd.randrange(0, 500)
        r = OffsetRange("a", 0, lo, lo + rnd.randrange(1, 3000))
        seg_bases = sorted({0, *(rnd.randrange(0, 4000) for _ in range(rnd.randrange(0, 40)))})
        limit, minimum = rnd.choice([None, 1, 7, 100, 999]), rnd.choice([None, 1, 3, 16])
        out = opts.split_ranges([r], limit, minimum, {("a", 0): seg_bases})
        assert [o for x in out for o in range(x.start, x.end)] == list(range(r.start, r.end))
        assert not limit or max(x.size for x in out) <= limit
        assert len(out) >= len(opts.split_ranges([r], limit, None))
        if not limit and minimum:
            assert len(out) >= min(minimum, r.size)


def test_rate_limit_and_offset_json():
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
    start = {a: 0, b: 100, c: 7}
    latest = {a: 1000, b: 110, c: 7}
    assert opts.rate_limit(start, latest, 5000) == latest
    limited = opts.rate_limit(start, latest, 101)
    assert limited[a] - 0 + limited[b] - 100 <= 101 and limited[b] > 100 and limited[c] == 7
    as_json = opts.offsets_to_json(limited)
    assert as_json == {"t": {"0": limited[a], "1": limited[b]}, "u": {"0": 7}}
    assert opts.offsets_from_json(as_json) == limited

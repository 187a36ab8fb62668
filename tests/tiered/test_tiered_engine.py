"""Tiered storage's mechanism over the directory store, without FUSE: upload, manifest, local and whole-log
retention, reads across tiers, startup from the manifests, orphans."""

from __future__ import annotations

import os

import pytest

from logfs.remote import DirectoryStore
from logfs.remote.manifest import ManifestStore
from logfs.storage import BrokerConfig, LogManager
from logfs.storage.errors import InvalidConfigError
from logfs.storage.tiered.remote_segment import RemoteLogSegment
from logfs.storage.tiered.manager import RemoteLogManager, tier_stats
from logfs.view.text import live_view, open_view
from tiered_helpers import view_text

PROPS = {"log.segment.bytes": "4096", "log.index.interval.bytes": "512", "log.segment.delete.delay.ms": "0",
         "remote.log.storage.system.enable": "true"}


def lines(n, start=0):
    return b"".join(b"record-%06d-%s\n" % (i, b"x" * (i % 37)) for i in range(start, start + n))


@pytest.fixture
def archive(tmp_path):
    root = tmp_path / "archive"
    root.mkdir()
    return root


def make(tmp_path, archive, clock, store=None, cache_bytes=64 << 10, **extra):
    props = dict(PROPS, **{"logfs.remote.dir": str(archive)}, **extra)
    manager = LogManager(str(tmp_path / "data"), BrokerConfig.from_properties(props), clock=clock)
    store = store if store is not None else DirectoryStore(archive)
    rlm = RemoteLogManager(manager.data_dir, manager.logs, store, cache_bytes=cache_bytes)
    manager.attach_tiering(rlm)
    return manager, rlm


def tiered_topic(manager, local_bytes="8192"):
    manager.create_topic("t", 1)
    manager.set_topic_config("t", "remote.storage.enable", "true")
    manager.set_topic_config("t", "local.retention.bytes", local_bytes)
    return manager.get_log("t", 0)


def tiered_log(tmp_path, archive, clock, data, local_bytes="8192", **make_args):
    """make() and tiered_topic(), its partition holding ``data``, rolled: all of it in sealed segments."""
    manager, rlm = make(tmp_path, archive, clock, **make_args)
    plog = tiered_topic(manager, local_bytes)
    plog.append_lines(b"", data, len(data))
    plog.roll()
    return manager, rlm, plog


def test_upload_local_retention_and_whole_log_read(tmp_path, archive, clock):
    data = lines(3000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data)
    plog.flush()
    uploaded = rlm.sync(plog, clock.time_ms())
    assert uploaded >= 10
    m = ManifestStore(DirectoryStore(archive)).read("t", 0)
    assert m.remote_log_end_offset == plog.log_end_offset
    assert [s.base_offset for s in m.segments][0] == 0
    assert sorted(os.listdir(archive / "t-0"))[-1] == "manifest.json"
    # Local retention kept about local.retention.bytes; the log start offset is still 0.
    assert plog.size_bytes <= 8192 + 4096
    assert plog.log_start_offset == 0
    assert plog.segments.first.base_offset > 0
    assert any(isinstance(s, RemoteLogSegment) for s in plog.view_segments())
    assert live_view(plog).length() == len(data)
    assert view_text(plog) == data
    # Positions and offsets across the tiers.
    view = live_view(plog)
    pos = view.position_of(1234)
    assert data[pos:].startswith(b"record-001234-")
    assert view.offset_at(pos + 3) == 1234
    stats = tier_stats(plog)
    assert stats["remote_log_end_offset"] == plog.log_end_offset
    assert stats["remote_segment_count"] == len(m.segments)
    assert stats["local_log_start_offset"] == plog.segments.first.base_offset
    manager.close()
    # Remount: the whole log again, first from the local copy of the manifest, then from the store.
    manager, rlm = make(tmp_path, archive, clock)
    plog = manager.get_log("t", 0)
    rlm.attach_cached()
    assert plog.log_start_offset == 0
    assert view_text(plog) == data
    rlm.sync(plog, clock.time_ms())
    assert view_text(plog) == data
    manager.close()


def test_orphans_are_removed_and_sealed_segments_flushed_before_upload(tmp_path, archive, clock):
    data = lines(1000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="0")
    assert plog.recovery_point == 0
    # An interrupted upload left objects the manifest does not name.
    (archive / "t-0").mkdir(exist_ok=True)
    (archive / "t-0" / ("%020d.log" % 999999)).write_bytes(b"junk")
    rlm.sync(plog, clock.time_ms())
    assert not (archive / "t-0" / ("%020d.log" % 999999)).exists()
    assert plog.recovery_point == plog.active_segment.base_offset
    assert len(plog.segments) == 1  # everything sealed is tiered and deleted locally
    assert view_text(plog) == data
    manager.close()


def test_whole_log_retention_deletes_from_the_store(tmp_path, archive, clock):
    data = lines(3000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="4096")
    plog.flush()
    rlm.sync(plog, clock.time_ms())
    before = ManifestStore(DirectoryStore(archive)).read("t", 0)
    manager.set_topic_config("t", "retention.bytes", "40000")
    rlm.sync(plog, clock.time_ms())
    after = ManifestStore(DirectoryStore(archive)).read("t", 0)
    assert len(after.segments) < len(before.segments)
    assert plog.log_start_offset == after.log_start_offset > 0
    names = set(os.listdir(archive / "t-0"))
    for s in before.segments[: len(before.segments) - len(after.segments)]:
        assert "%020d.log" % s.base_offset not in names
    text = view_text(plog)
    assert data.endswith(text) and text.startswith(b"record-%06d-" % plog.log_start_offset)
    rlm.sync(plog, clock.time_ms())  # a steady state: nothing expired is uploaded again
    assert ManifestStore(DirectoryStore(archive)).read("t", 0).generation == after.generation
    # Time-based whole-log retention empties the store; the log starts past everything tiered.
    manager.set_topic_config("t", "retention.ms", "1000")
    clock.advance(5000)
    rlm.sync(plog, clock.time_ms())
    emptied = ManifestStore(DirectoryStore(archive)).read("t", 0)
    assert emptied.segments == () and emptied.log_start_offset == plog.log_start_offset
    assert plog.log_start_offset >= after.remote_log_end_offset
    assert plog.segments.first.base_offset >= plog.log_start_offset  # the local copies went too
    gen = emptied.generation
    rlm.sync(plog, clock.time_ms())
    assert ManifestStore(DirectoryStore(archive)).read("t", 0).generation == gen
    assert set(os.listdir(archive / "t-0")) == {"manifest.json"}
    manager.close()


def test_tiering_settings_are_checked(tmp_path, archive, clock):
    manager, _ = make(tmp_path, archive, clock)
    manager.create_topic("c", 1)
    manager.set_topic_config("c", "cleanup.policy", "compact")
    with pytest.raises(InvalidConfigError):
        manager.set_topic_config("c", "remote.storage.enable", "true")
    manager.create_topic("t", 1)
    manager.set_topic_config("t", "remote.storage.enable", "true")
    with pytest.raises(InvalidConfigError):
        manager.set_topic_config("t", "cleanup.policy", "compact")
    with pytest.raises(InvalidConfigError):
        manager.set_topic_config("t", "remote.storage.enable", "false")
    with pytest.raises(InvalidConfigError):
        manager.set_topic_config("t", "local.retention.bytes", "-3")
    manager.set_topic_config("t", "retention.bytes", "1000")
    with pytest.raises(InvalidConfigError):
        manager.set_topic_config("t", "local.retention.bytes", "2000")
    manager.close()
    with pytest.raises(InvalidConfigError):
        BrokerConfig.from_properties({"remote.log.storage.system.enable": "true"})  # no bucket, no directory
    with pytest.raises(InvalidConfigError):
        BrokerConfig.from_properties({"logfs.remote.cache.bytes": "-1"})
    with pytest.raises(InvalidConfigError):
        BrokerConfig.from_properties({"remote.log.manager.task.interval.ms": "0"})
    with pytest.raises(InvalidConfigError):
        BrokerConfig.from_properties({"remote.log.manager.thread.pool.size": "0"})
    plain = LogManager(str(tmp_path / "plain"), BrokerConfig.from_properties({}), clock=clock)
    plain.create_topic("t", 1)
    with pytest.raises(InvalidConfigError):  # the broker's remote storage system is off
        plain.set_topic_config("t", "remote.storage.enable", "true")
    plain.close()


def test_deleted_partition_objects_are_removed_and_the_cache_stays_bounded(tmp_path, archive, clock):
    data = lines(4000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="0")
    rlm.sync(plog, clock.time_ms())
    assert view_text(plog) == data  # every tiered block fetched once...
    assert rlm.blocks.used <= 64 << 10  # ...through a cache bounded by logfs.remote.cache.bytes
    assert len(os.listdir(archive / "t-0")) > 4
    manager.delete_partition("t", 0)
    manager.abandon()  # a crash before the objects were deleted: the deletion is remembered
    manager, rlm = make(tmp_path, archive, clock)
    assert ("t", 0) not in manager.logs
    replacement = manager.create_partition("t", 0)  # the same name again: not tiered before the old objects go
    replacement.append_lines(b"", b"new\n", 4)
    replacement.roll()
    assert rlm.sync(replacement, clock.time_ms()) == 0
    assert rlm.purge_deleted() == 1
    assert os.listdir(archive / "t-0") == []
    assert rlm.purge_deleted() == 0
    rlm.sync(replacement, clock.time_ms())
    assert view_text(replacement) == b"new\n"
    assert sorted(os.listdir(archive / "t-0"))[-1] == "manifest.json"
    manager.close()


def test_the_view_says_which_reads_need_the_store(tmp_path, archive, clock):
    """``SegmentView.in_memory``, which the FUSE layer asks before a read to make it on its request thread or in a
    worker: False while what the read touches is not cached (or, for a tiered segment no read met yet, while its
    codec is unknown), and a read it says True for sends no request from the reading thread. Random reads of all
    sizes over one-block segments, with the block cache keeping everything."""
    import random
    import threading

    class CountingStore(DirectoryStore):
        def get_range_buffer(self, key, start, length, progress=None):
            fetched_on.append(threading.current_thread())
            return super().get_range_buffer(key, start, length, progress)

    fetched_on: list = []
    data = lines(2000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="0",
                                    store=CountingStore(archive), cache_bytes=64 << 20)
    rlm.sync(plog, clock.time_ms())
    assert len(plog.remote_segments) > 10
    view = open_view(plog)
    try:
        assert not fetched_on and not view.in_memory(0, 100) and not view.in_memory(len(data) // 2, 1)
        assert view.read(0, 100) == data[:100] and fetched_on  # (as a worker thread reads: it fetches)
        rng = random.Random(5)
        probes = [(0, 100), (50, 1), (100, 3000)] + [(rng.randrange(len(data)), rng.choice([1, 100, 5000, 20000]))
                                                     for _ in range(300)]
        said = {True: 0, False: 0}
        for pos, size in probes:
            inline = view.in_memory(pos, size)
            before = fetched_on.count(threading.current_thread())
            assert view.read(pos, size) == data[pos:pos + size], (pos, size)
            if inline:
                assert fetched_on.count(threading.current_thread()) == before, (pos, size)
            said[inline] += 1
        assert said[True] > 100 and said[False] > 0, said
    finally:
        view.release()
        manager.close()


def test_time_lookup_and_record_reads_across_tiers(tmp_path, archive, clock):
    manager, rlm = make(tmp_path, archive, clock)
    plog = tiered_topic(manager, local_bytes="4096")
    starts = []
    for k in range(5):
        starts.append((clock.time_ms(), plog.log_end_offset))
        data = lines(500, 500 * k)
        plog.append_lines(b"", data, len(data))
        clock.advance(1000)
    plog.roll()
    rlm.sync(plog, clock.time_ms())
    first_local = plog.segments.first.base_offset
    tiered = [(ts, off) for ts, off in starts if off < first_local and off > 0]
    assert tiered, "some chunk must start in a tiered segment"
    for ts, off in tiered:
        assert plog.offset_for_timestamp(ts) == off
    got = plog.read(700, max_records=3)  # records API over a tiered offset
    assert [r.offset for r in got] == [700, 701, 702]
    assert got[0].value == lines(1, 700)[:-1]
    manager.close()


def test_an_open_view_keeps_reading_while_segments_move_to_the_store(tmp_path, archive, clock):
    data = lines(3000)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="0")
    view = open_view(plog)  # pins the local segments, as a file handle does
    head = view.read(0, 5000)
    rlm.sync(plog, clock.time_ms())
    plog.purge_deleted(now_ms=1 << 62)  # their files are unlinked
    assert len(plog.segments) == 1
    assert not any(n.endswith(".log.deleted") for n in os.listdir(plog.directory))
    rest = view.read(5000, len(data))
    view.release()
    assert head + rest == data
    assert view_text(plog) == data  # a new open reads the same bytes from the store
    manager.close()


def test_a_small_tiered_read_costs_one_ranged_get_of_at_most_two_blocks(tmp_path, archive, clock):
    from logfs.storage.tiered.block_cache import BLOCK_BYTES

    class Counting(DirectoryStore):
        calls: list = []

        def get_range(self, key, start, length):
            self.calls.append(length)
            return super().get_range(key, start, length)

    store = Counting(archive)
    data = lines(60000) * 2
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data, local_bytes="0", store=store,
                                    cache_bytes=64 << 20, **{"log.segment.bytes": str(4 << 20)})
    rlm.sync(plog, clock.time_ms())
    assert len(plog.segments) == 1 and len(data) > 3 * (1 << 20)
    view = open_view(plog)
    assert view.length() == len(data) and store.calls == []  # st_size: the local copies of the indexes
    pos = view.position_of(91337)  # the index entry, then one interval's batches: one ranged GET
    assert len(store.calls) == 1 and store.calls[0] <= 2 * BLOCK_BYTES
    assert view.read(pos, 100) == data[pos:pos + 100]
    assert len(store.calls) <= 2 and max(store.calls) <= 2 * BLOCK_BYTES
    n = len(store.calls)
    assert view.read(pos, 100) == data[pos:pos + 100]
    assert len(store.calls) == n  # cached
    view.release()
    manager.close()


def _segment_min_timestamps(partition_dir) -> dict[int, int]:
    """Each segment's smallest record timestamp, by kafka-python (a LogAppendTime batch's records: its max)."""
    from kafka.record.memory_records import MemoryRecords

    out = {}
    for name in sorted(os.listdir(partition_dir)):
        if name.endswith(".log"):
            with open(os.path.join(partition_dir, name), "rb") as f:
                records = MemoryRecords(f.read())
            stamps = []
            while records.has_next():
                stamps += [r.timestamp for r in records.next_batch()]
            if stamps:
                out[int(name[:20])] = min(stamps)
    return out


def test_upload_records_each_segments_smallest_timestamp(tmp_path, archive, clock):
    """The manifest's ``min_timestamp`` of every tiered segment is the smallest timestamp of its records, found by
    the upload's walk of the records: logfs's own lines, then another writer's batches whose timestamps go back
    where no header shows it (a CreateTime batch's second record, a gzip batch's last one) and a LogAppendTime
    batch (its records are its max timestamp, whatever their deltas say)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from logfs.storage.format import records as rec

    def foreign(stamps, compression=0) -> bytes:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i, ts in enumerate(stamps):
            builder.append(i, timestamp=ts, key=None, value=b"foreign-%d-%s" % (i, b"f" * 200), headers=[])
        return bytes(builder.build())

    manager, rlm = make(tmp_path, archive, clock)
    plog = tiered_topic(manager)
    data = lines(600)
    plog.append_lines(b"", data, len(data))
    now = clock.time_ms()
    for i in range(30):
        clock.advance(1000)
        t = clock.time_ms()
        if i == 10:
            plog.append_raw_batch(foreign([t, now - 500_000, t + 1]))
        elif i == 15:
            plog.append_raw_batch(foreign([t, t + 2, now - 400_000], compression=1))
        elif i == 20:
            plog.append_raw_batch(rec.build_batch_generic(0, t, [b"lat-a", b"lat-b"], timestamps=[t, now - 300_000],
                                                          attributes=rec.ATTR_TIMESTAMP_TYPE))
        else:
            plog.append_raw_batch(foreign([t + 3, t + 1, t + 2]))
    plog.roll()
    plog.flush()
    want = _segment_min_timestamps(tmp_path / "data" / "t-0")
    assert sorted(want.values())[:2] == [now - 500_000, now - 400_000]
    rlm.sync(plog, clock.time_ms())
    m = ManifestStore(DirectoryStore(archive)).read("t", 0)
    assert len(m.segments) > 10 and m.remote_log_end_offset == plog.log_end_offset
    assert {s.base_offset: s.min_timestamp for s in m.segments} == want
    assert all(s.min_timestamp <= s.max_timestamp for s in m.segments)
    manager.close()


def test_a_segment_whose_records_cannot_be_walked_is_tiered_without_a_smallest_timestamp(tmp_path, archive, clock,
                                                                                        caplog):
    """A sealed segment damaged on disk after it was written (a record's length no longer fits its batch; the
    upload does not check CRCs): it is tiered as before, its ``min_timestamp`` unknown (-1: never skipped by an
    upper time bound), with a warning."""
    data = lines(400)
    manager, rlm, plog = tiered_log(tmp_path, archive, clock, data)
    plog.flush()
    first = plog.segments.first
    with open(first.log_path, "r+b") as f:
        f.seek(61)  # the first batch's first record: its length varint, now the largest 1-byte one (63)
        f.write(b"\x7e")
    rlm.sync(plog, clock.time_ms())
    m = ManifestStore(DirectoryStore(archive)).read("t", 0)
    assert m.segments[0].base_offset == 0 and m.segments[0].min_timestamp == -1
    assert all(s.min_timestamp == clock.time_ms() for s in m.segments[1:]) and len(m.segments) > 3
    assert "no min_timestamp" in caplog.text
    manager.abandon()


@pytest.mark.parametrize("pool", [1, 4])
async def test_a_pass_runs_the_partitions_syncs_a_pool_at_a_time(tmp_path, archive, clock, pool):
    """remote.log.manager.thread.pool.size partitions are synced at once in a pass (Kafka's RLM pool): a pass over
    new partitions, each a LIST and a GET of the store, takes their round trips a pool at a time, never more."""
    import threading
    import time

    from logfs.service.tiering import TieringTask

    class Slow(DirectoryStore):
        def __init__(self, root):
            super().__init__(root)
            self.lock = threading.Lock()
            self.now = self.peak = 0

        def get_bytes(self, key):
            if key.endswith("manifest.json"):
                with self.lock:
                    self.now += 1
                    self.peak = max(self.peak, self.now)
                try:
                    time.sleep(0.05)  # a store's round trip
                    return super().get_bytes(key)
                finally:
                    with self.lock:
                        self.now -= 1
            return super().get_bytes(key)

    store = Slow(archive)
    manager, rlm = make(tmp_path, archive, clock, store=store,
                        **{"remote.log.manager.thread.pool.size": str(pool)})
    manager.create_topic("t", 12)
    manager.set_topic_config("t", "remote.storage.enable", "true")
    for p in range(12):
        data = lines(300, p * 1000)
        manager.get_log("t", p).append_lines(b"", data, len(data))
        manager.get_log("t", p).roll()
    task = TieringTask(manager, rlm)
    await task.run_once()
    assert store.peak == pool, store.peak
    assert all(rlm.tiers[("t", p)].loaded for p in range(12))
    assert all(tier_stats(manager.get_log("t", p))["remote_segment_count"] > 0 for p in range(12))
    assert not task.failed_passes
    rlm.close()
    manager.close()

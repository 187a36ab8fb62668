"""Log: one partition (Kafka's UnifiedLogTest / LocalLogTest essentials)."""

import os

import pytest

from logfs.storage import LogConfig, OffsetOutOfRangeError, RecordTooLargeError
from logfs.storage.format import records as rec

SMALL = dict(segment_bytes=2048, index_interval_bytes=128)


def values(n, start=0, width=20):
    return [f"{i:0{width}d}".encode() for i in range(start, start + n)]


def read_all(log, offset=None):
    offset = log.log_start_offset if offset is None else offset
    out = []
    while offset < log.log_end_offset:
        batch = log.read(offset)
        assert batch, offset
        out += batch
        offset = batch[-1].offset + 1
    return out


def test_append_returns_contiguous_offsets(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    expected = 0
    for n in [1, 5, 1, 40, 3, 200, 1]:
        first, last = log.append(values(n, expected))
        assert (first, last) == (expected, expected + n - 1)
        expected += n
    assert log.log_end_offset == expected
    got = read_all(log)
    assert [r.offset for r in got] == list(range(expected))
    assert [r.value for r in got] == values(expected)
    assert len(log.segments) > 1


def test_append_many_records_splits_into_batches(open_log):
    log = open_log()
    from logfs.storage.local.log import TARGET_BATCH_BYTES

    log.append([b"x" * 1000] * (4 * TARGET_BATCH_BYTES // 1000))  # several batches of about TARGET_BATCH_BYTES
    batches = list(log.active_segment.batches_from(0))
    assert len(batches) > 3
    assert all(h.size <= TARGET_BATCH_BYTES + 2000 for _, h, _, _ in batches)
    assert [h.base_offset for _, h, _, _ in batches][0] == 0
    assert batches[-1][1].last_offset == 4 * TARGET_BATCH_BYTES // 1000 - 1


def test_read_at_every_offset(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(0, 300, 7):
        log.append(values(7, i), keys=[f"k{j}".encode() for j in range(i, i + 7)])
    for offset in range(0, 301):
        got = log.read(offset, max_bytes=1)
        assert got[0].offset == offset
        assert got[0].value == values(1, offset)[0] and got[0].key == f"k{offset}".encode()
        limited = log.read(offset, max_records=3)
        assert [r.offset for r in limited] == list(range(offset, min(offset + 3, 301)))
    assert log.read(301) == []


def test_read_max_bytes_bounds_the_result(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(100):
        log.append(values(1, i))
    got = log.read(10, max_bytes=300)
    assert 1 <= len(got) < 20
    assert [r.offset for r in got] == list(range(10, 10 + len(got)))


def test_read_out_of_range(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    log.append(values(100))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(101)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1)
    log.increment_log_start_offset(40)
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(39)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (40, 100)
    assert log.read(40)[0].offset == 40
    with pytest.raises(OffsetOutOfRangeError):
        log.increment_log_start_offset(101)


def test_offset_for_timestamp(open_log, clock):
    log = open_log(LogConfig.for_tests(**SMALL))
    stamps = []
    for i in range(200):
        log.append(values(1, i))
        stamps.append(clock.time_ms())
        clock.advance(5 if i % 3 else 0)  # some equal timestamps
    assert len(log.segments) > 3
    assert [r.timestamp for r in read_all(log)] == stamps
    for target in range(stamps[0] - 3, stamps[-1] + 3):
        expected = next((o for o, ts in enumerate(stamps) if ts >= target), None)
        assert log.offset_for_timestamp(target) == expected, target
    log.increment_log_start_offset(50)
    assert log.offset_for_timestamp(stamps[0]) == 50
    assert log.offset_for_timestamp(stamps[120]) == stamps.index(stamps[120])


def test_roll_on_segment_bytes(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(300):
        log.append(values(1, i, width=40))
    segs = log.segments.as_list()
    assert len(segs) > 5
    for seg, nxt in zip(segs, segs[1:]):
        assert seg.size <= 2048
        assert seg.next_offset == nxt.base_offset
        assert not seg.active
        assert os.path.getsize(seg.offset_index.path) == seg.offset_index.entries * 8  # trimmed on roll
    assert segs[-1].active and os.path.getsize(segs[-1].offset_index.path) == LogConfig().segment_index_bytes
    assert [s.base_offset for s in segs][0] == 0
    assert sorted(n for n in os.listdir(log.directory) if n.endswith(".log")) == [
        f"{s.base_offset:020d}.log" for s in segs]


def test_roll_on_segment_ms(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_ms=1000))
    assert not log.maybe_roll_for_time()  # empty
    clock.advance(5000)
    assert not log.maybe_roll_for_time()  # still empty: never rolls
    log.append([b"a"])
    clock.advance(1000)
    assert not log.maybe_roll_for_time()
    clock.advance(1)
    assert log.maybe_roll_for_time()
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert not log.maybe_roll_for_time()  # the new one is empty
    # An append after segment.ms rolls before appending.
    log.append([b"b"])
    clock.advance(1001)
    log.append([b"c"])
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert [r.value for r in read_all(log)] == [b"a", b"b", b"c"]


def test_roll_on_segment_ms_with_jitter(open_log, clock, monkeypatch):
    import logfs.storage.local.lifecycle as lifecycle
    monkeypatch.setattr(lifecycle, "random_jitter", lambda jitter, ms: 400)
    log = open_log(LogConfig.for_tests(segment_ms=1000, segment_jitter_ms=500))
    log.append([b"a"])
    log.roll()  # the new active segment gets the (fixed) jitter
    log.append([b"b"])
    clock.advance(600)
    assert not log.maybe_roll_for_time()
    clock.advance(1)
    assert log.maybe_roll_for_time()


def test_roll_is_a_no_op_on_an_empty_segment(open_log):
    log = open_log()
    first = log.roll()
    assert len(log.segments) == 1 and first is log.active_segment
    log.append([b"x"])
    second = log.roll()
    assert second.base_offset == 1 and len(log.segments) == 2
    assert log.roll() is second


def test_flush_advances_recovery_point(open_log):
    log = open_log()
    log.append(values(10))
    assert log.recovery_point == 0 and log.unflushed_messages == 10
    assert log.flush(up_to=4) == 4
    assert log.recovery_point == 4
    assert log.flush() == 10
    assert log.recovery_point == 10 and log.unflushed_messages == 0
    log.append(values(3, 10))
    assert log.recovery_point == 10


def test_flush_messages_makes_a_flush_due(open_log):
    """flush.messages: an append only reports the flush as due (it runs on the FUSE thread, which must not
    fsync); the appender then flushes in a worker thread (Operations.write)."""
    log = open_log(LogConfig.for_tests(flush_messages=5))
    log.append(values(2))
    log.append(values(2, 2))
    assert not log.flush_due
    log.append(values(1, 4))
    assert log.flush_due and log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 5 and not log.flush_due
    log.append(values(4, 5))
    assert not log.flush_due
    log.append(values(3, 9))
    assert log.flush_due and log.recovery_point == 5


def test_truncate_to(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(200):
        log.append(values(1, i, width=30))
    log.flush()
    segs = log.segments.as_list()
    assert len(segs) > 4
    cut = (segs[1].base_offset + segs[1].next_offset) // 2  # in the middle of the second segment
    log.truncate_to(cut)
    assert log.log_end_offset == cut
    assert log.recovery_point == cut
    assert [s.base_offset for s in log.segments] == [segs[0].base_offset, segs[1].base_offset]
    names = os.listdir(log.directory)
    for gone in segs[2:]:
        assert not any(n.startswith(f"{gone.base_offset:020d}") for n in names), names
    assert [r.value for r in read_all(log)] == values(cut, width=30)
    log.append(values(50, cut, width=30))
    assert [r.value for r in read_all(log)] == values(cut + 50, width=30)
    log.truncate_to(10**6)  # past the end: nothing happens
    assert log.log_end_offset == cut + 50


def test_truncate_to_a_segment_boundary_then_append(open_log):
    log = open_log(LogConfig.for_tests(index_interval_bytes=64))
    log.append(values(20))
    log.roll()
    log.append(values(20, 20))
    log.truncate_to(20)  # exactly the base of the active segment: the previous one becomes active again
    assert [s.base_offset for s in log.segments] == [0]
    assert log.active_segment.active
    for i in range(40, 60):
        log.append(values(1, i))
    assert [r.value for r in read_all(log)] == values(20) + values(20, 40)


def test_truncate_to_zero_and_below_start(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    log.append(values(100))
    log.increment_log_start_offset(10)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(5)
    log.truncate_to(10)
    assert log.log_end_offset == 10
    assert log.read(10) == []
    log.append([b"again"])
    assert log.read(10)[0].value == b"again" and log.read(10)[0].offset == 10


def test_truncate_everything_restarts_the_active_segment_at_the_offset(open_log):
    log = open_log(LogConfig.for_tests(**SMALL))
    log.append(values(100, width=40))
    segs = log.segments.as_list()
    start = segs[1].base_offset + 1
    log.delete_segments(segs[:1])
    log.increment_log_start_offset(start)
    log.truncate_to(start)
    assert log.log_end_offset == start
    assert log.active_segment.base_offset == segs[1].base_offset
    log.append([b"z"])
    assert [(r.offset, r.value) for r in log.read(start)] == [(start, b"z")]


def test_delete_segments_and_purge(open_log, clock):
    log = open_log(LogConfig.for_tests(file_delete_delay_ms=1000, **SMALL))
    for i in range(200):
        log.append(values(1, i, width=30))
    segs = log.segments.as_list()
    victims = segs[:2]
    log.delete_segments(victims)
    assert log.log_start_offset == segs[2].base_offset
    names = set(os.listdir(log.directory))
    for seg in victims:
        stem = f"{seg.base_offset:020d}"
        assert f"{stem}.log.deleted" in names and f"{stem}.index.deleted" in names
        assert f"{stem}.timeindex.deleted" in names
        assert f"{stem}.log" not in names
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0)
    assert log.read(segs[2].base_offset)[0].offset == segs[2].base_offset
    clock.advance(999)
    assert log.purge_deleted() == 0
    assert any(n.endswith(".deleted") for n in os.listdir(log.directory))
    clock.advance(1)
    assert log.purge_deleted() == 2
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))
    with pytest.raises(ValueError):
        log.delete_segments([log.active_segment])


def test_record_too_large_appends_nothing(open_log):
    log = open_log(LogConfig.for_tests(max_message_bytes=100, **SMALL))
    log.append([b"ok"])
    size, end = log.size_bytes, log.log_end_offset
    with pytest.raises(RecordTooLargeError):
        log.append([b"a", b"b", b"x" * 101])
    with pytest.raises(RecordTooLargeError):
        log.append([b"a"], keys=[b"k" * 100])  # key + value count
    assert (log.size_bytes, log.log_end_offset) == (size, end)
    log.append([b"x" * 100])  # exactly the limit is fine
    assert log.log_end_offset == end + 1


def test_record_that_cannot_fit_a_segment(open_log):
    log = open_log(LogConfig.for_tests(segment_bytes=200))
    with pytest.raises(RecordTooLargeError):
        log.append([b"x" * 190])
    assert log.log_end_offset == 0 and log.size_bytes == 0
    log.append([b"y" * 50])
    log.append([b"y" * 50])
    assert len(log.segments) == 2


def test_append_keys_headers_and_explicit_timestamp(open_log):
    log = open_log()
    log.append([b"v1", None], keys=[b"k1", b"k2"], headers=[[("h", b"x")], []], timestamp_ms=12345)
    got = log.read(0)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (0, 12345, b"k1", b"v1", (("h", b"x"),)), (1, 12345, b"k2", None, ())]


def test_append_raw_batch_restamps_offsets(open_log):
    log = open_log()
    log.append([b"a"])
    log.append_raw_batch(rec.build_batch(999, 5, [b"b", b"c"]))
    assert [(r.offset, r.value) for r in log.read(0)] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert log.log_end_offset == 3


def test_close_then_reopen_clean(open_log, tmp_path):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(150):
        log.append(values(1, i))
    log.close()
    assert log.closed
    again = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert again.log_end_offset == 150 and again.recovery_point == 150
    assert [r.value for r in read_all(again)] == values(150)

"""Retention (UnifiedLogTest/LogManagerTest retention cases) and the cleaner (LogCleanerTest,
LogCleanerManagerTest), with time from a ManualClock."""

import os
import shutil

import pytest

from logfs.storage import LogConfig, load_log
from logfs.storage.cleaner.compaction import (
    OffsetMap, _clean_group, build_offset_map, clean, cleanable_range, grab_filthiest,
)
from logfs.storage.checkpoints import fsync_dir
from logfs.storage.local.retention import delete_old_segments
from logfs.storage.local.segment import DELETED_SUFFIX, SWAP_SUFFIX
from logfs.view.text import live_view, open_view


def fill(log, clock, n, step_ms=10, key=None, start=0):
    for i in range(start, start + n):
        k = key(i) if key else None
        log.append([b"value-%04d" % i], [k] if k is not None else None)
        clock.advance(step_ms)


def keyed(log):
    return [(r.key, r.value) for r in log.read(log.log_start_offset, 1 << 30)]


# -- retention ----------------------------------------------------------------------------------------------
def test_retention_ms_deletes_old_sealed_segments_only(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_bytes=400, retention_ms=1000, file_delete_delay_ms=0))
    fill(log, clock, 60)
    assert len(log.segments) > 3
    clock.advance(5000)  # every record is now older than retention.ms
    deleted = delete_old_segments(log, clock.time_ms())
    assert deleted > 0
    assert len(log.segments) == 1  # the active segment always stays
    assert log.log_start_offset == log.active_segment.base_offset
    assert not [f for f in os.listdir(log.directory) if f.endswith(DELETED_SUFFIX)]


def test_retention_ms_keeps_young_segments(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_bytes=400, retention_ms=300))
    fill(log, clock, 60, step_ms=20)
    before = [s.base_offset for s in log.segments]
    deleted = delete_old_segments(log, clock.time_ms())
    after = [s.base_offset for s in log.segments]
    assert deleted > 0 and after == before[deleted:]
    for s in log.segments.as_list()[:-1]:
        assert clock.time_ms() - s.largest_timestamp <= 300


def test_retention_bytes(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_bytes=400, retention_bytes=1000, retention_ms=-1))
    fill(log, clock, 80)
    delete_old_segments(log, clock.time_ms())
    assert log.size_bytes - log.active_segment.size <= 1000 or len(log.segments) == 1
    # one more deletion would take it under the limit by more than a segment
    assert log.size_bytes - log.segments.first.size < 1000


def test_log_start_offset_breach_applies_even_for_compact(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_bytes=400, cleanup_policy="compact", retention_ms=1))
    fill(log, clock, 60)
    clock.advance(10_000)
    assert delete_old_segments(log, clock.time_ms()) == 0  # no time/size retention without "delete"
    second = log.segments.as_list()[1]
    log.increment_log_start_offset(second.base_offset + 1)
    assert delete_old_segments(log, clock.time_ms()) == 1
    assert log.segments.first is second


def test_deleted_segments_unlinked_after_delay_and_open_handle_reads_intact(open_log, clock):
    log = open_log(LogConfig.for_tests(segment_bytes=400, retention_ms=100, file_delete_delay_ms=1000))
    fill(log, clock, 40)
    handle = open_view(log)
    full = handle.read(0, 1 << 20)
    clock.advance(1000)
    assert delete_old_segments(log, clock.time_ms()) > 0
    assert [f for f in os.listdir(log.directory) if f.endswith(DELETED_SUFFIX)]
    assert live_view(log).length() < len(full)
    clock.advance(1001)
    log.purge_deleted()
    assert not [f for f in os.listdir(log.directory) if f.endswith(DELETED_SUFFIX)]
    assert handle.read(0, 1 << 20) == full  # the handle's fds outlive the unlink
    handle.release()


# -- cleaner ------------------------------------------------------------------------------------------------
def compact_config(**kw):
    base = dict(segment_bytes=600, cleanup_policy="compact", delete_retention_ms=1000, file_delete_delay_ms=0)
    base.update(kw)
    return LogConfig.for_tests(**base)


def latest_per_key(pairs):
    out = {}
    for k, v in pairs:
        out[k] = v
    return out


def test_clean_keeps_latest_value_per_key(open_log, clock):
    log = open_log(compact_config())
    fill(log, clock, 200, key=lambda i: b"k%d" % (i % 7))
    expected = latest_per_key(keyed(log))
    target = cleanable_range(log, None, clock.time_ms())
    result = clean(log, target, OffsetMap(10_000), clock.time_ms())
    assert result.end_offset == log.active_segment.base_offset
    pairs = keyed(log)
    assert latest_per_key(pairs) == expected
    # below the active segment, each key appears once
    sealed_keys = [r.key for r in log.read(0, 1 << 30) if r.offset < log.active_segment.base_offset]
    assert len(sealed_keys) == len(set(sealed_keys))
    # offsets are preserved, and the log end offset is unchanged
    assert log.log_end_offset == 200
    offsets = [r.offset for r in log.read(0, 1 << 30)]
    assert offsets == sorted(offsets)
    assert live_view(log).length() == sum(len(v) + 1 for _, v in pairs)


def test_uncleanable_active_segment_and_min_compaction_lag(open_log, clock):
    log = open_log(compact_config(min_compaction_lag_ms=500))
    fill(log, clock, 100, step_ms=1, key=lambda i: b"k%d" % (i % 3))
    clock.advance(1000)
    fill(log, clock, 100, step_ms=1, key=lambda i: b"k%d" % (i % 3), start=100)
    target = cleanable_range(log, None, clock.time_ms())
    young = [s for s in log.segments.as_list()[:-1] if s.largest_timestamp > clock.time_ms() - 500]
    assert young and target.first_uncleanable == young[0].base_offset
    before = [(r.offset, r.value) for r in log.read(target.first_uncleanable, 1 << 30)]
    clean(log, target, OffsetMap(10_000), clock.time_ms())
    assert [(r.offset, r.value) for r in log.read(target.first_uncleanable, 1 << 30)] == before


def test_tombstones_kept_for_delete_retention_then_dropped(open_log, clock):
    log = open_log(compact_config(delete_retention_ms=1000))
    fill(log, clock, 50, key=lambda i: b"k%d" % (i % 5))
    log.append([None], [b"k1"])  # tombstone for k1
    clock.advance(10)
    fill(log, clock, 60, key=lambda i: b"x%d" % (i % 5), start=50)
    target = cleanable_range(log, None, clock.time_ms())
    clean(log, target, OffsetMap(10_000), clock.time_ms())
    records = log.read(0, 1 << 30)
    assert any(r.key == b"k1" and r.value is None for r in records)  # inside delete.retention.ms
    assert not any(r.key == b"k1" and r.value is not None for r in records)
    clock.advance(1001)
    target = cleanable_range(log, log.log_start_offset, clock.time_ms())
    clean(log, target, OffsetMap(10_000), clock.time_ms())
    assert not any(r.key == b"k1" for r in log.read(0, 1 << 30))


def test_partial_clean_with_tiny_map_still_progresses(open_log, clock):
    log = open_log(compact_config())
    fill(log, clock, 200, key=lambda i: b"k%d" % i)  # every key distinct
    offset_map = OffsetMap(30)
    target = cleanable_range(log, None, clock.time_ms())
    end = build_offset_map(log.segments.as_list(), target.first_dirty, target.first_uncleanable, OffsetMap(30))
    assert target.first_dirty < end < target.first_uncleanable
    before = keyed(log)
    result = clean(log, target, offset_map, clock.time_ms())
    assert result.end_offset > target.first_dirty
    assert keyed(log) == before  # nothing superseded: nothing lost


def test_keyless_records_are_dropped_by_cleaning(open_log, clock):
    log = open_log(compact_config())
    fill(log, clock, 60)  # no keys
    fill(log, clock, 60, key=lambda i: b"k", start=60)
    clean(log, cleanable_range(log, None, clock.time_ms()), OffsetMap(1000), clock.time_ms())
    assert all(r.key is not None for r in log.read(0, 1 << 30))


def test_grab_filthiest_and_checkpoint_reset(tmp_path, clock, open_log):
    a = open_log(compact_config(), directory=tmp_path / "a-0")
    b = open_log(compact_config(), directory=tmp_path / "b-0")
    fill(a, clock, 100, key=lambda i: b"k%d" % (i % 3))
    fill(b, clock, 100, key=lambda i: b"k%d" % (i % 3))
    # b's first half is already clean per its checkpoint: a is the filthier
    mid = b.segments.as_list()[len(b.segments) // 2].base_offset
    chosen = grab_filthiest([a, b], {("t", 0): 0}, clock.time_ms())
    assert chosen is not None
    assert cleanable_range(b, mid, clock.time_ms()).ratio < cleanable_range(a, None, clock.time_ms()).ratio
    # out-of-range checkpoints reset to the log start offset
    assert cleanable_range(a, 10**9, clock.time_ms()).first_dirty == a.log_start_offset
    assert cleanable_range(a, -5, clock.time_ms()).first_dirty == a.log_start_offset
    # below min.cleanable.dirty.ratio nothing is chosen
    a.config = compact_config(min_cleanable_dirty_ratio=1.0)
    b.config = compact_config(min_cleanable_dirty_ratio=1.0)
    assert grab_filthiest([a, b], {}, clock.time_ms()) is None


# -- crash points of the swap ----------------------------------------------------------------------------
@pytest.mark.parametrize("crash_point", range(6))
def test_swap_crash_points_recover(tmp_path, clock, crash_point):
    """Stop the swap after each step, reopen with the loader (unclean), and check the content is either the
    old or the cleaned one, never a mix, and always readable."""
    directory = str(tmp_path / "t-0")
    log = load_log(directory, "t", 0, compact_config(), clock=clock)
    fill(log, clock, 120, key=lambda i: b"k%d" % (i % 4))
    original = latest_per_key(keyed(log))
    all_before = keyed(log)
    target = cleanable_range(log, None, clock.time_ms())
    offset_map = OffsetMap(1000)
    build_offset_map(log.segments.as_list(), target.first_dirty, target.first_uncleanable, offset_map)
    group = log.segments.as_list()[:3]
    cleaned, _ = _clean_group(log.directory, log.config, group, offset_map, target.first_uncleanable,
                              clock.time_ms())
    steps = [
        lambda: None,                                           # 0: .cleaned written
        lambda: cleaned.change_suffix(SWAP_SUFFIX),             # 1: renamed .swap
        lambda: [s.change_suffix(DELETED_SUFFIX) for s in sorted(group, key=lambda s: -s.base_offset)[:1]],
        lambda: [s.change_suffix(DELETED_SUFFIX) for s in sorted(group, key=lambda s: -s.base_offset)[1:]],
        lambda: os.rename(cleaned.log_path, cleaned.log_path[: -len(SWAP_SUFFIX)]),  # log live, indexes .swap
        lambda: cleaned.change_suffix(""),                      # all live, .deleted left behind
    ]
    for step in steps[: crash_point + 1]:
        step()
    if crash_point == 4:
        cleaned.log_path = cleaned.log_path[: -len(SWAP_SUFFIX)]
    fsync_dir(directory)
    # "crash": copy the directory as it is, without closing anything
    image = str(tmp_path / "image" / "t-0")
    shutil.copytree(directory, image)
    reopened = load_log(image, "t", 0, compact_config(), clock=clock, had_clean_shutdown=False)
    try:
        pairs = keyed(reopened)
        assert latest_per_key(pairs) == original
        if crash_point == 0:
            assert pairs == all_before  # rolled back
        else:
            assert len(pairs) < len(all_before)  # completed
        names = os.listdir(image)
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]
        offsets = [r.offset for r in reopened.read(0, 1 << 30)]
        assert offsets == sorted(set(offsets))
        assert live_view(reopened).length() == sum(len(v) + 1 for _, v in pairs)
    finally:
        reopened.close()
        cleaned.close()
        log.close_without_flush()


def test_clean_in_subprocess_matches_in_process(tmp_path, clock):
    from logfs.storage.cleaner.process import clean_in_subprocess

    logs = []
    for name in ("a", "b"):
        log = load_log(str(tmp_path / f"{name}-0"), name, 0, compact_config(), clock=clock)
        fill(log, clock, 150, key=lambda i: b"k%d" % (i % 6))
        log.append([None], [b"k2"])
        fill(log, clock, 30, key=lambda i: b"z%d" % (i % 3), start=150)
        logs.append(log)
    a, b = logs
    handle = open_view(b)
    before_b = handle.read(0, 1 << 20)
    clean(a, cleanable_range(a, None, clock.time_ms()), OffsetMap(10_000), clock.time_ms())
    result = clean_in_subprocess(b, cleanable_range(b, None, clock.time_ms()), 10_000, clock.time_ms())
    assert result.segments_replaced > 0 and result.records_removed > 0
    assert [(r.offset, r.key, r.value) for r in a.read(0, 1 << 30)] == [(r.offset, r.key, r.value) for r in b.read(0, 1 << 30)]
    assert live_view(a).read(0, 1 << 20) == live_view(b).read(0, 1 << 20)
    assert handle.read(0, 1 << 20) == before_b  # an open view is untouched by the swap
    handle.release()
    assert not [n for n in os.listdir(b.directory) if n.endswith((".cleaned", ".swap"))]
    expected = [(r.offset, r.value) for r in a.read(0, 1 << 30)]
    for log in logs:
        log.close()
    reopened = load_log(b.directory, "b", 0, compact_config(), clock=clock)
    assert [(r.offset, r.value) for r in reopened.read(0, 1 << 30)] == expected
    reopened.close()

"""The open-file budget (storage/local/open_files.py): segment descriptors and index maps open on use, idle ones close
past the budget, and nothing a reader or writer relies on is ever closed under it: a pinned segment, a segment
whose log lock is held, a segment whose files are gone. Real files, real descriptors (/proc/self/fd)."""

from __future__ import annotations

import os
import threading

import pytest

from logfs.storage import LogConfig
from logfs.storage.format import records as rec
from logfs.storage.local.index import OffsetIndex, ViewIndex
from logfs.storage.local.lifecycle import open_segment
from logfs.storage.local.open_files import MIN_BUDGET, OpenFiles
from logfs.storage.local.retention import delete_old_segments
from logfs.storage.local.segment import batch_stats
from logfs.view.text import open_view


@pytest.fixture
def files():
    """The open-file budget every log of the test opens its files within, as a mount's logs share their manager's."""
    return OpenFiles()


@pytest.fixture
def open_log(open_log, files):
    """conftest's ``open_log``, each log within ``files``."""
    return lambda *args, **kw: open_log(*args, open_files=files, **kw)


@pytest.fixture
def budget(files):
    """``budget(n)`` sets the budget of the test's logs to n units (below MIN_BUDGET too)."""

    def set_budget(n: int) -> None:
        files.budget = n

    return set_budget


def config(**kw):
    # Small segments and a small index interval: every log has sealed segments and index entries to map.
    base = dict(segment_bytes=2048, index_interval_bytes=128, segment_index_bytes=4096, retention_ms=10_000,
                file_delete_delay_ms=1000)
    base.update(kw)
    return LogConfig.for_tests(**base)


def units(log) -> list:
    """The log's units open now: .log and index descriptors."""
    out = []
    for segment in log.segments:
        if segment.__dict__.get("fd", -1) >= 0:
            out.append(segment)
        out += [i for i in (segment.offset_index, segment.time_index, segment.view_index) if "_fd" in i.__dict__]
    return out


def process_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fill(log, clock, n: int, tag: bytes = b"") -> list[bytes]:
    values = [tag + b"line-%05d-" % i + b"x" * 40 for i in range(n)]
    for i in range(0, n, 10):
        log.append(values[i:i + 10])
        clock.advance(5)
    return values


def read_all(log) -> list[bytes]:
    return [r.value for r in log.read(log.log_start_offset, 1 << 30)]


def many_logs(open_log, tmp_path, clock, count: int, lines: int = 120) -> list:
    logs = []
    for i in range(count):
        log = open_log(config(), directory=tmp_path / f"p-{i}")
        fill(log, clock, lines, b"%d:" % i)
        logs.append(log)
    return logs


def test_descriptors_and_maps_stay_within_the_budget(open_log, tmp_path, clock, budget, files):
    budget(16)
    before = process_fds()
    logs = many_logs(open_log, tmp_path, clock, 40)
    assert all(len(log.segments) >= 3 for log in logs)
    for i, log in enumerate(logs):  # every log read whole: every segment and index opened at some point
        assert read_all(log) == [b"%d:" % i + b"line-%05d-" % n + b"x" * 40 for n in range(120)]
        view = open_view(log)
        try:
            assert view.read(view.length() // 2, 30)
        finally:
            view.release()
        assert len(files) <= 16
        assert process_fds() - before <= 16 + 2  # (+ a short-lived descriptor of an index being reserved)
    assert files.evictions > 0
    assert sum(len(units(log)) for log in logs) <= 16


def test_a_segment_opened_again_reads_the_same_bytes(open_log, tmp_path, clock, budget):
    log = open_log(config())
    values = fill(log, clock, 200)
    view = open_view(log)
    text = view.read(0, 1 << 20)
    middle = view.position_of(117)
    view.release()
    timestamp_offset = log.offset_for_timestamp(clock.time_ms() - 300)
    with log.lock:
        for segment in log.segments:
            segment.release()
    assert units(log) == []
    assert read_all(log) == values
    view = open_view(log)
    assert view.read(0, 1 << 20) == text
    assert view.position_of(117) == middle
    view.release()
    assert log.offset_for_timestamp(clock.time_ms() - 300) == timestamp_offset
    log.append([b"after"])  # the active segment's descriptor and maps open again for the write
    assert read_all(log) == values + [b"after"]


def test_a_pinned_segment_is_never_closed(open_log, tmp_path, clock, budget):
    budget(8)
    pinned_log = open_log(config(), directory=tmp_path / "pinned")
    fill(pinned_log, clock, 300)
    view = open_view(pinned_log)
    text = view.read(0, 1 << 20)  # opens every segment of it, and the view indexes it looks up
    for pos in range(0, len(text), 500):
        view.read(pos, 10)
    held = {id(u): u.__dict__.get("fd", u.__dict__.get("_fd")) for u in units(pinned_log)}
    assert len(held) > 8  # more than the whole budget: pins go over it rather than close what readers use
    many_logs(open_log, tmp_path, clock, 20)
    now = {id(u): u.__dict__.get("fd", u.__dict__.get("_fd")) for u in units(pinned_log)}
    assert now == held  # the same descriptors, the same maps
    assert view.read(0, 1 << 20) == text
    view.release()
    many_logs(open_log, tmp_path / "more", clock, 20)
    assert len(units(pinned_log)) < len(held)  # unpinned: closed like any other


def test_a_log_whose_lock_is_held_keeps_its_files(open_log, tmp_path, clock, budget):
    budget(8)
    busy = open_log(config(), directory=tmp_path / "busy")
    values = fill(busy, clock, 100)
    read_all(busy)
    held = list(units(busy))
    assert held
    locked, done = threading.Event(), threading.Event()

    def writer() -> None:  # a writer in the middle of an append holds the log's lock
        with busy.lock:
            locked.set()
            done.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        locked.wait(30)
        many_logs(open_log, tmp_path, clock, 20)
        assert units(busy) == held
    finally:
        done.set()
        thread.join()
    many_logs(open_log, tmp_path / "more", clock, 20)
    assert len(units(busy)) < len(held)
    assert read_all(busy) == values


def test_a_deleted_segment_pinned_by_a_snapshot_still_reads(open_log, tmp_path, clock, budget):
    log = open_log(config())
    fill(log, clock, 200)
    view = open_view(log)
    text = view.read(0, 1 << 20)
    with log.lock:  # every file closed by the budget before retention renames and unlinks them
        for segment in log.segments:
            segment.release()
    pinned = list(log.segments)
    clock.advance(20_000)
    assert delete_old_segments(log, clock.time_ms()) > 0
    clock.advance(2000)
    assert log.purge_deleted() > 0
    gone = [s for s in pinned if s not in log.segments]
    assert gone and not any(os.path.exists(s.log_path) for s in gone)
    budget(4)
    many_logs(open_log, tmp_path, clock, 10)
    assert view.read(0, 1 << 20) == text
    for pos in range(0, len(text), 333):
        assert view.read(pos, 40) == text[pos:pos + 40]
    view.release()
    assert all(s.closed for s in gone)


def test_a_deleted_partition_read_through_an_open_handle(open_manager, clock, budget):
    manager = open_manager({"num.partitions": "1", "log.segment.bytes": "2048", "log.index.interval.bytes": "128"})
    manager.create_topic("t")
    log = manager.get_log("t", 0)
    fill(log, clock, 150)
    view = open_view(log)
    text = view.read(0, 1 << 20)
    with log.lock:
        for segment in log.segments:
            segment.release()
    manager.delete_partition("t", 0)  # the directory is renamed for deletion
    assert manager.purge_deleted_dirs(now_ms=1 << 62) == 1  # and removed
    assert view.read(0, 1 << 20) == text
    view.release()
    assert all(s.closed for s in log.segments)


def test_the_view_index_preallocates_no_more_than_the_offset_index(tmp_path):
    segment = open_segment(str(tmp_path), 0, LogConfig())
    try:
        index_bytes = os.path.getsize(segment.offset_index.path)
        view_bytes = os.path.getsize(segment.view_index.path)
        assert index_bytes == 10 * 1024 * 1024
        # One entry per offset index entry a 1 GiB segment can get at 4096-byte intervals, and the end entry.
        assert view_bytes == ((1 << 30) // 4097 + 2) * ViewIndex.ENTRY.size <= index_bytes
        assert units_of(segment) == [segment]  # a new segment maps nothing
    finally:
        segment.close()
    assert os.path.getsize(segment.view_index.path) == 0  # trimmed to its (no) entries
    # Capped by segment.index.bytes when the interval would want more: never above Kafka's own preallocation.
    assert ViewIndex.bytes_for(4096, 1 << 30, 1) <= 4096


def units_of(segment) -> list:
    return [u for u in (segment, segment.offset_index, segment.time_index, segment.view_index)
            if u.__dict__.get("fd", -1) >= 0 or "_mmap" in u.__dict__]


def test_a_full_view_index_grows(tmp_path, clock):
    # segment.bytes raised after the segment was made: more entries than its view index was preallocated for.
    segment = open_segment(str(tmp_path), 0, config(segment_bytes=1024, index_interval_bytes=64))
    try:
        preallocated = segment.view_index.max_entries
        assert preallocated == 1024 // 65 + 2
        for i in range(preallocated * 4):
            batch = rec.build_batch(i, clock.time_ms(), [b"v%04d" % i + b"y" * 80])
            segment.append(batch, rec.parse_header(batch), batch_stats(batch))
        assert segment.view_index.entries > preallocated
        entries = [segment.view_index.get(i) for i in range(segment.view_index.entries)]
        assert [e.position for e in entries] == sorted(e.position for e in entries)
        assert segment.view_index.floor_by_offset(3 * preallocated).offset <= 3 * preallocated
        segment.on_become_inactive()
        assert os.path.getsize(segment.view_index.path) == segment.view_index.entries * ViewIndex.ENTRY.size
    finally:
        segment.close()


def test_entries_stored_before_a_close_are_flushed(tmp_path):
    path = str(tmp_path / "00000000000000000000.index")
    index = OffsetIndex(path, 0, 4096)
    for i in range(1, 50):
        index.append(i, i * 100)
    index.release()  # as the budget would
    assert "_fd" not in index.__dict__ and index.dirty
    index.flush()  # an fsync of the file: its pages stayed in the page cache
    assert not index.dirty
    assert index.lookup(25) == (25, 2500)  # opened again on use
    index.close()
    again = OffsetIndex(path, 0, 4096, active=False)
    assert again.entries == 49 and again.last_entry() == (49, 4900)
    again.close()


def test_the_budget_is_half_the_descriptor_limit_and_of_the_map_limit():
    files = OpenFiles()
    assert files.set_budget_from_limit(20_000, 65530) == 10_000
    assert files.set_budget_from_limit(1024, 65530) == 512
    assert files.set_budget_from_limit(100, 65530) == MIN_BUDGET
    # Every unit may be a map: a very high (or unlimited, -1) descriptor limit stops at half of vm.max_map_count.
    assert files.set_budget_from_limit(1 << 20, 65530) == 32765
    assert files.set_budget_from_limit(-1, 65530) == 32765
    assert files.set_budget_from_limit(65536) <= 65536 // 2  # the shipped unit's LimitNOFILE

"""Segment lifetimes: Log.snapshot (the one way to hold segments), the layout version, and the one swap
protocol (Log.replace_segments) as the cleaner uses it."""

import os

import pytest

from logfs.storage import LogConfig
from logfs.storage.format import records as rec
from logfs.storage.cleaner.compaction import OffsetMap, clean, cleanable_range
from logfs.storage.errors import LogfsError
from logfs.storage.local.lifecycle import open_segment
from logfs.storage.local.retention import delete_old_segments
from logfs.storage.local.segment import CLEANED_SUFFIX
from logfs.view.text import LiveViews, live_view, open_view


def config(**kw):
    base = dict(segment_bytes=600, cleanup_policy="compact,delete", retention_ms=10_000, delete_retention_ms=0,
                file_delete_delay_ms=1000)
    base.update(kw)
    return LogConfig.for_tests(**base)


def fill(log, clock, n, start=0):
    for i in range(start, start + n):
        log.append([b"value-%04d" % i], [b"k%d" % (i % 5)])
        clock.advance(10)


def test_a_snapshot_view_survives_retention_and_compaction(open_log, clock):
    log = open_log(config())
    fill(log, clock, 150)
    view = open_view(log)
    before = view.read(0, 1 << 20)
    pinned = list(log.segments)
    layout = log.layout_version
    result = clean(log, cleanable_range(log, None, clock.time_ms()), OffsetMap(1000), clock.time_ms())
    assert result.segments_replaced > 0
    clock.advance(20_000)
    assert delete_old_segments(log, clock.time_ms()) > 0
    clock.advance(2000)
    assert log.purge_deleted() > 0
    gone = [s for s in pinned if s not in log.segments]
    assert gone and all(s.purged and s.fd >= 0 for s in gone)  # unlinked, still open for the view
    assert not any(os.path.exists(s.log_path) for s in gone)
    assert log.layout_version > layout
    assert live_view(log).length() < len(before)
    assert view.read(0, 1 << 20) == before
    for pos in range(0, len(before), 97):
        assert view.read(pos, 50) == before[pos:pos + 50]
    view.release()
    assert all(s.refs == 0 for s in pinned)
    assert all(s.fd < 0 for s in gone)  # closed once the last pin went
    assert all(s.fd >= 0 for s in log.segments)


def test_refs_return_to_zero_and_a_second_release_does_nothing(open_log, clock):
    log = open_log(config())
    fill(log, clock, 60)
    with log.snapshot() as outer:
        inner = log.snapshot(sealed_only=True)
        assert outer.segments[:-1] == inner.segments and outer.segments[-1] is log.active_segment
        assert all(s.refs == 2 for s in inner.segments) and log.active_segment.refs == 1
        assert outer.log_start_offset == log.log_start_offset
        inner.release()
        inner.release()
        assert all(s.refs == 1 for s in outer.segments)
    assert outer.segments == [] and all(s.refs == 0 for s in log.segments)
    log.flush()  # flush pins what it syncs through a snapshot too
    assert all(s.refs == 0 for s in log.segments)


def test_extend_pins_segments_rolled_since(open_log, clock):
    log = open_log(config())
    fill(log, clock, 10)
    snapshot = log.snapshot()
    first = list(snapshot.segments)
    assert snapshot.extend() == []
    fill(log, clock, 60, start=10)
    newer = snapshot.extend()
    assert newer and [s.base_offset for s in first + newer] == [s.base_offset for s in log.segments]
    assert all(s.refs == 1 for s in log.segments)
    snapshot.release()
    assert all(s.refs == 0 for s in log.segments)


def test_retention_honours_pins(open_log, clock):
    log = open_log(config(cleanup_policy="delete", file_delete_delay_ms=0))
    fill(log, clock, 100)
    snapshot = log.snapshot(sealed_only=True)
    clock.advance(20_000)
    victims = list(snapshot.segments)
    assert delete_old_segments(log, clock.time_ms()) == len(victims)
    assert all(s.purged and s.fd >= 0 and s.refs == 1 for s in victims)  # unlinked at once, kept open
    _, header, buf, at = next(victims[0].batches_from(0))
    assert next(rec.decode(buf, at, header.size)).value == b"value-0000"
    snapshot.release()
    assert all(s.fd < 0 and s.refs == 0 for s in victims)


def test_the_cleaner_honours_pins_and_pins_what_it_reads(open_log, clock, monkeypatch):
    log = open_log(config(file_delete_delay_ms=0))
    fill(log, clock, 150)
    snapshot = log.snapshot(sealed_only=True)
    seen = []
    real = type(log).replace_segments

    def replace(plog, old, new):
        seen.append([s.refs for s in old])  # the cleaner's own snapshot pins them too
        return real(plog, old, new)

    monkeypatch.setattr(type(log), "replace_segments", replace)
    clean(log, cleanable_range(log, None, clock.time_ms()), OffsetMap(1000), clock.time_ms())
    assert seen and all(refs == [2] * len(refs) for refs in seen)
    replaced = [s for s in snapshot.segments if s not in log.segments]
    assert replaced and all(s.purged and s.fd >= 0 and s.refs == 1 for s in replaced)
    snapshot.release()
    assert all(s.fd < 0 for s in replaced)
    assert all(s.refs == 0 for s in log.segments)


def test_replace_segments_gives_up_when_the_log_changed(open_log, clock):
    log = open_log(config(file_delete_delay_ms=0))
    fill(log, clock, 150)
    old = log.segments.as_list()[:2]
    new = open_segment(log.directory, old[0].base_offset, log.config, suffix=CLEANED_SUFFIX)
    log.delete_segments(old[:1])  # retention took one of them meanwhile
    layout = log.layout_version
    with pytest.raises(LogfsError, match="log changed"):
        log.replace_segments(old, new)
    assert log.layout_version == layout and old[1] in log.segments
    assert not [n for n in os.listdir(log.directory) if n.endswith((".cleaned", ".swap"))]


def test_the_log_keeps_no_view_state_and_the_live_view_follows_the_layout_version(open_log, clock):
    log = open_log(config())
    fill(log, clock, 60)
    attributes = set(vars(log))
    views = LiveViews()  # (the mount's: the FUSE operations hold one)
    view = views.get(log)
    assert views.get(log) is view  # kept in the view layer
    assert set(vars(log)) == attributes
    log.roll()
    assert views.get(log) is not view
    view = views.get(log)
    log.truncate_to(30)
    assert views.get(log) is not view
    assert views.get(log).read(0, 1 << 20) == b"".join(b"value-%04d\n" % i for i in range(30))
    assert live_view(log).read(0, 1 << 20) == views.get(log).read(0, 1 << 20)

"""Sealed segments rewritten in the topic's codec (logfs.storage.cleaner.compression), at the engine level: every reader
sees the same records and the same text view before and after, the batches are standard Kafka v2 batches in the
codec (read back by kafka-python), and the rewrite's swap is crash-safe at every step."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil

import pytest

from logfs.storage import LogConfig, load_log
from logfs.storage.format import records as rec
from logfs.storage.checkpoints import fsync_dir
from logfs.storage.cleaner.process import compress_in_subprocess, compress_in_thread
from logfs.storage.cleaner.compression import needs_rewrite, write_compressed
from logfs.storage.local.segment import DELETED_SUFFIX, SWAP_SUFFIX
from logfs.view.text import live_view, open_view

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


NAMES = {0: "uncompressed", **{v: k for k, v in CODECS.items()}}


def config(codec: int, **kw) -> LogConfig:
    base = LogConfig.for_tests(segment_bytes=64 << 10, index_interval_bytes=4096, **kw)
    return dataclasses.replace(base, compression_type=NAMES[codec])


def text_lines(rng: random.Random, start: int, n: int) -> list[bytes]:
    words = [b"GET", b"POST", b"/api/v1/orders", b"/health", b"200", b"404", b"user=alice", b"user=bob", b"ms"]
    return [b"%d %s" % (start + i, b" ".join(rng.choice(words) for _ in range(rng.randrange(2, 14))))
            for i in range(n)]


def fill(plog, clock, rng, n_bulk=3000, n_small=400):
    """Bulk appends (whole batches), small appends (tail batches grown in place), a keyed append and a tombstone:
    the shapes of batch logfs writes. Returns the text appended."""
    out = []
    lines = text_lines(rng, 0, n_bulk)
    data = b"".join(line + b"\n" for line in lines)
    plog.append_lines(b"", data, len(data))
    out.append(data)
    for i in range(n_small):
        line = text_lines(rng, n_bulk + i, 1)[0] + b"\n"
        plog.append_lines(b"", line, len(line))
        clock.advance(rng.choice([0, 1, 3]))
        out.append(line)
        if i % 97 == 0:
            plog.flush()  # ends tail growth: more, smaller batches
    plog.roll()
    plog.flush()
    return b"".join(out)


def kafka_python_records(path: str) -> list:
    """Every record of a .log file, read by kafka-python's own v2 reader (an independent parser)."""
    from kafka.record.default_records import DefaultRecordBatch

    data = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        batch = DefaultRecordBatch(data[pos : pos + size])
        assert batch.validate_crc()
        out.extend((r.offset, r.timestamp, r.key, r.value) for r in batch)
        pos += size
    return out


def records_of(plog):
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in plog.read(0, 1 << 40)]


@pytest.mark.parametrize("name", list(CODECS))
def test_sealed_segments_rewritten_in_each_codec_read_the_same(tmp_path, clock, name):
    codec = CODECS[name]
    rng = random.Random(codec)
    plog = load_log(str(tmp_path / "t-0"), "t", 0, config(codec), clock=clock)
    appended = fill(plog, clock, rng)
    before_records = records_of(plog)
    before_bytes = plog.size_bytes
    handle = open_view(plog)  # a handle open across the rewrite keeps its view
    sealed = plog.segments.as_list()[:-1]
    assert len(sealed) >= 2 and all(needs_rewrite(s, plog.config) for s in sealed)
    result = compress_in_thread(plog, sealed, clock.time_ms())
    assert result.segments_replaced == len(sealed)
    assert not any(needs_rewrite(s, plog.config) for s in plog.segments.as_list())
    assert records_of(plog) == before_records
    view = live_view(plog)
    assert view.length() == len(appended) and view.read(0, len(appended) + 1) == appended
    assert handle.read(0, len(appended) + 1) == appended
    handle.release()
    # Positions and offsets at every 37th record, and reads of 8 KiB from random places, land on the same bytes.
    starts = [0]
    for line in appended.splitlines(keepends=True)[:-1]:
        starts.append(starts[-1] + len(line))
    for offset in range(0, len(starts), 37):
        assert view.position_of(offset) == starts[offset]
        assert view.offset_at(starts[offset] + 1) == offset
    for _ in range(50):
        pos = rng.randrange(len(appended))
        assert live_view(plog).read(pos, 8192) == appended[pos : pos + 8192]
    # Standard batches in the codec, one per ~256 KiB of records; kafka-python reads every segment.
    for segment in plog.segments.as_list()[:-1]:
        headers = [h for _, h in rec.iter_headers(open(segment.log_path, "rb").read())]
        assert headers and all(h.compression == codec for h in headers)
        got = kafka_python_records(segment.log_path)
        want = [(o, t, k, v) for o, t, k, v, _ in before_records if segment.base_offset <= o < segment.next_offset]
        assert got == want
    assert plog.size_bytes < before_bytes / 2, (name, plog.size_bytes, before_bytes)
    assert plog.offset_for_timestamp(0) == 0
    # Both loads of the directory (clean: from the indexes; unclean: CRC recovery) read the same.
    plog.close()
    for clean in (True, False):
        again = load_log(str(tmp_path / "t-0"), "t", 0, config(codec), clock=clock, had_clean_shutdown=clean)
        assert records_of(again) == before_records
        assert live_view(again).read(0, len(appended) + 1) == appended
        again.close_without_flush() if not clean else again.close()


def test_the_child_process_writes_what_the_thread_writes(tmp_path, clock):
    logs = []
    for name in ("a", "b"):
        plog = load_log(str(tmp_path / f"{name}-0"), name, 0, config(4), clock=clock)
        fill(plog, clock, random.Random(7))
        logs.append(plog)
    a, b = logs
    compress_in_thread(a, a.segments.as_list()[:-1], clock.time_ms())
    result = compress_in_subprocess(b, b.segments.as_list()[:-1], clock.time_ms())
    assert result.segments_replaced == len(b.segments) - 1
    assert [(r[0], *r[2:]) for r in records_of(a)] == [(r[0], *r[2:]) for r in records_of(b)]  # (clocks differ)
    assert live_view(a).read(0, 1 << 24) == live_view(b).read(0, 1 << 24)
    assert not [n for n in os.listdir(b.directory) if n.endswith((".cleaned", ".swap"))]
    for plog in logs:
        plog.close()


def test_a_segment_retention_removed_before_the_child_opened_it_is_not_created_again(tmp_path, clock):
    """Retention renames a sealed segment away after the daemon chose it for the rewrite, before the child process
    opens it: the child must not create its files again (an empty segment where the log has none, which the
    next start would load: a gap under the log start). The other segments are compressed."""
    plog = load_log(str(tmp_path / "t-0"), "t", 0, config(4), clock=clock)
    fill(plog, clock, random.Random(3))
    sealed = plog.segments.as_list()[:-1]
    assert len(sealed) >= 3
    gone = sealed[0]
    plog.delete_segments([gone])  # renamed .deleted (and unlinked later)
    names_before = set(os.listdir(plog.directory))
    result = compress_in_subprocess(plog, sealed, clock.time_ms())
    assert result.segments_replaced == len(sealed) - 1
    stem = "%020d" % gone.base_offset
    created = [n for n in set(os.listdir(plog.directory)) - names_before if n.startswith(stem)]
    assert created == [], created
    assert not [n for n in os.listdir(plog.directory) if n.startswith(stem) and not n.endswith(".deleted")]
    plog.close()
    reloaded = load_log(str(tmp_path / "t-0"), "t", 0, config(4), clock=clock)
    assert reloaded.segments.first.base_offset > gone.base_offset
    reloaded.close()


@pytest.mark.parametrize("level", [1, 8, 19])
def test_other_zstd_levels_are_read_by_kafka_python(tmp_path, clock, level):
    """The levels docs/compression.md weighs against the default (ratio against CPU): standard zstd frames whatever
    the level (the window stays within the batch), read by kafka-python's reader and by logfs's."""
    plog = load_log(str(tmp_path / "t-0"), "t", 0, config(4, compression_zstd_level=level), clock=clock)
    fill(plog, clock, random.Random(level))
    before = records_of(plog)
    sealed = plog.segments.as_list()[:-1]
    compress_in_thread(plog, sealed, clock.time_ms())
    assert records_of(plog) == before
    for segment in plog.segments.as_list()[:-1]:
        headers = [h for _, h in rec.iter_headers(open(segment.log_path, "rb").read())]
        assert headers and all(h.compression == 4 for h in headers)
        want = [(o, t, k, v) for o, t, k, v, _ in before if segment.base_offset <= o < segment.next_offset]
        assert kafka_python_records(segment.log_path) == want
    plog.close()


def test_a_changed_codec_applies_to_what_is_sealed_from_then_on(tmp_path, clock):
    plog = load_log(str(tmp_path / "t-0"), "t", 0, config(0), clock=clock)
    fill(plog, clock, random.Random(3))
    old = plog.segments.as_list()[:-1]
    assert not any(needs_rewrite(s, plog.config) for s in old)  # no codec: nothing to do
    plog.config = config(4)
    compress_in_thread(plog, plog.segments.as_list()[:-1], clock.time_ms())
    zstd = plog.segments.as_list()[:-1]
    plog.config = config(3)  # zstd -> lz4: what is zstd stays zstd
    assert not any(needs_rewrite(s, plog.config) for s in zstd)
    fill(plog, clock, random.Random(4))
    new = [s for s in plog.segments.as_list()[:-1] if needs_rewrite(s, plog.config)]
    assert new and all(s.base_offset >= zstd[-1].next_offset for s in new)
    plog.close()


@pytest.mark.parametrize("crash_point", range(6))
def test_rewrite_crash_points_leave_each_offset_in_one_segment(tmp_path, clock, crash_point):
    """Stop the rewrite's swap after each step, reopen uncleanly from a copy: the old segment or the compressed one,
    never both, never neither; the same records and text."""
    directory = str(tmp_path / "t-0")
    plog = load_log(directory, "t", 0, config(4), clock=clock)
    appended = fill(plog, clock, random.Random(11))
    before = records_of(plog)
    target = plog.segments.as_list()[0]
    cleaned = write_compressed(directory, plog.config, target, clock.time_ms())
    steps = [
        lambda: None,                                                                # 0: .cleaned written
        lambda: cleaned.change_suffix(SWAP_SUFFIX),                                  # 1: .swap (commit point)
        lambda: target.change_suffix(DELETED_SUFFIX),                                # 2: old renamed .deleted
        lambda: os.rename(cleaned.log_path, cleaned.log_path[: -len(SWAP_SUFFIX)]),  # 3: log live, indexes .swap
        lambda: cleaned.change_suffix(""),                                           # 4: all live
        lambda: os.unlink(target.log_path),                                          # 5: .deleted log unlinked
    ]
    for step in steps[: crash_point + 1]:
        step()
    if crash_point >= 3:
        cleaned.log_path = cleaned.log_path[: -len(SWAP_SUFFIX)] if cleaned.log_path.endswith(SWAP_SUFFIX) \
            else cleaned.log_path
    fsync_dir(directory)
    image = str(tmp_path / "image" / "t-0")
    shutil.copytree(directory, image)
    reopened = load_log(image, "t", 0, config(4), clock=clock, had_clean_shutdown=False)
    try:
        assert records_of(reopened) == before
        assert live_view(reopened).read(0, len(appended) + 1) == appended
        first = reopened.segments.as_list()[0]
        headers = [h for _, h in rec.iter_headers(open(first.log_path, "rb").read())]
        assert all(h.compression == (0 if crash_point == 0 else 4) for h in headers)
        assert not [n for n in os.listdir(image) if n.endswith((".cleaned", ".swap", ".deleted"))]
    finally:
        reopened.close()
        cleaned.close()
        plog.close_without_flush()


def test_a_segment_whose_rewrite_failed_is_not_waited_for(tmp_path, clock):
    """A rewrite that fails (a bug, a damaged segment) leaves the segment as it is; the daemon gives up on it, so
    neither the compressor nor tiering (which waits for needs_rewrite) is stuck on it."""
    from logfs.storage.cleaner.compression import give_up

    plog = load_log(str(tmp_path / "t-0"), "t", 0, config(4), clock=clock)
    fill(plog, clock, random.Random(9))
    first = plog.segments.as_list()[0]
    assert needs_rewrite(first, plog.config)
    with open(first.log_path, "r+b") as f:  # a record section that is no batch
        f.seek(70)
        f.write(b"\xff" * 64)
    with pytest.raises(Exception):
        write_compressed(plog.directory, plog.config, first, clock.time_ms())
    assert not [n for n in os.listdir(plog.directory) if n.endswith(".cleaned")]
    give_up(first)
    assert not needs_rewrite(first, plog.config)
    plog.close_without_flush()

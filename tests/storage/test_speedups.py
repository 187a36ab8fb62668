"""The C accelerator produces exactly the bytes of the pure-Python/aiokafka paths it replaces."""

import itertools
import random

import pytest

from logfs.storage.format import records as rec
from logfs.view.text import LineFormat

speedups = pytest.importorskip("logfs._speedups")


def random_records(rnd, n):
    values = [None if rnd.random() < 0.1 else rnd.randbytes(rnd.choice([0, 1, 5, 127, 128, 300, 20000]))
              for _ in range(n)]
    keys = [None if rnd.random() < 0.3 else rnd.randbytes(rnd.choice([0, 3, 200])) for _ in range(n)]
    return values, keys


@pytest.mark.parametrize("seed", range(20))
def test_encode_matches_aiokafka_builder(seed):
    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.choice([1, 2, 63, 64, 65, 200, 2000]))
    ts = 1_700_000_000_000 + seed
    for k in (None, keys):
        fast = rec.build_batch(12345 + seed, ts, values, k)
        slow = rec.build_batch_generic(12345 + seed, ts, values, k)
        assert fast == slow
        rec.validate(fast)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("fmt", [LineFormat(), LineFormat(b"=", None), LineFormat(None, b"NULL"),
                                 LineFormat(b"::", b"<nil>")])
def test_render_matches_generic(seed, fmt):
    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.choice([1, 64, 500]))
    headers = [[("h", b"v")] if rnd.random() < 0.2 else [] for _ in values]
    batch = rec.build_batch_generic(7, 1_700_000_000_000, values, keys, headers)
    expected = b"".join(fmt.line(r.key, r.value) for r in rec.decode(batch))
    assert speedups.render_records(batch, fmt.separator, fmt.null_marker) == expected
    assert fmt.render(batch, 0, len(batch))[0] == expected


def test_render_rejects_malformed_and_compressed():
    batch = bytearray(rec.build_batch(0, 1, [b"abc", b"def"]))
    with pytest.raises(ValueError):
        speedups.render_records(bytes(batch[:70]))
    batch[22] |= 1  # gzip attribute
    with pytest.raises(ValueError):
        speedups.render_records(bytes(batch))


@pytest.mark.parametrize("seed", range(30))
def test_render_window_is_the_slice_of_the_rendered_lines(seed):
    """render_window(buf, skip, want) gives lines[skip:skip + want] of the batches in buf, how many records' lines
    end in it, and a resume point (batch position, skip within it) that continues exactly there, also when buf
    ends inside a batch (the records that are whole are rendered, and ``need`` says how much to read) or at a
    compressed batch."""
    rnd = random.Random(seed)
    fmt = rnd.choice([LineFormat(), LineFormat(b"=", b"NULL"), LineFormat(b"::", None), LineFormat(None, b"")])
    batches, offset = [], 0
    for _ in range(rnd.randrange(1, 8)):
        values, keys = random_records(rnd, rnd.randrange(1, 50))
        batches.append(rec.build_batch(offset, 1_700_000_000_000, values, keys))
        offset += len(values)
    compressed_at = rnd.choice([None, None, rnd.randrange(len(batches))])
    if compressed_at is not None:
        gz = bytearray(batches[compressed_at])
        gz[22] |= 1  # (flagged only: render_window must stop before it, not decode it)
        batches[compressed_at] = bytes(gz)
    plain = batches[:compressed_at] if compressed_at is not None else batches
    lines = b"".join(b"".join(fmt.line(r.key, r.value) for r in rec.decode(b)) for b in plain)
    ends = list(itertools.accumulate(len(fmt.line(r.key, r.value)) for b in plain for r in rec.decode(b)))
    data = b"".join(batches)
    starts = [sum(map(len, batches[:k])) for k in range(len(batches) + 1)]
    for _ in range(40):
        skip = rnd.randrange(len(lines) + 2)
        want = rnd.choice([0, 1, 7, 100, 5000, 1 << 20])
        cut = rnd.choice([len(data), rnd.randrange(len(data) + 1)])  # the buffer may end anywhere
        out, advanced, skip_after, need, newlines = speedups.render_window(data[:cut], skip, want, fmt.separator,
                                                                           fmt.null_marker)
        assert out == lines[skip:skip + want][: len(out)]
        # (values are random bytes: a "\n" inside one is not a line end)
        assert newlines == sum(skip < end <= skip + len(out) for end in ends)
        assert advanced in starts
        if need == 0 and advanced < cut:
            assert len(out) == min(want, max(0, len(lines) - skip))
        if need > 0:  # stopped at a batch cut off by the end of the buffer: its size
            assert starts[starts.index(advanced) + 1] - advanced == need
        if need < 0:
            assert compressed_at is not None and advanced == starts[compressed_at]
        # Resuming from (advanced, skip_after) with the whole data continues exactly where out ended.
        rest, _, _, _, _ = speedups.render_window(data[advanced:], skip_after, 1 << 30, fmt.separator,
                                               fmt.null_marker)
        assert out + rest == lines[skip:] or (skip >= len(lines) and out + rest == b"")


def test_render_window_rejects_a_malformed_batch():
    batch = bytearray(rec.build_batch(0, 1, [b"abc", b"de"]))
    batch[rec.HEADER_SIZE] = 0x7F  # first record's length far past the batch end
    with pytest.raises(ValueError):
        speedups.render_window(bytes(batch), 0, 100)
    with pytest.raises(ValueError):
        speedups.render_window(bytes(batch), -1, 100)


@pytest.mark.parametrize("seed", range(10))
def test_batch_stats_matches_decoding(seed):
    from logfs.storage.local import segment

    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.randrange(1, 300))
    batch = rec.build_batch(0, 1, values, keys)
    expected = (len(values), sum(k is not None for k in keys), sum(v is None for v in values),
                sum(len(k) for k in keys if k is not None), sum(len(v) for v in values if v is not None))
    assert speedups.batch_stats(batch) == expected
    assert tuple(segment.batch_stats(b"xx" + batch, 2, len(batch))) == expected


def _segment_bytes(log):
    return [open(s.log_path, "rb").read() for s in log.segments]


@pytest.mark.parametrize("seed", range(12))
def test_append_lines_writes_the_bytes_append_writes(open_log, tmp_path, seed, monkeypatch):
    """Log.append_lines (the bulk path: one C call cuts and encodes whole batches from the write buffer) leaves
    byte-identical segments, indexes and view lengths to Log.append of the split lines, including the first
    line's prefix (a partial line held by the handle), empty lines, batch and segment boundaries. (Growing the
    tail batch, which Log.append never does, is off here: test_tail_batch covers it.)"""
    from logfs.storage import LogConfig

    monkeypatch.setattr("logfs.storage.local.log.TAIL_BATCH_CAP", 0)

    rnd = random.Random(seed)
    config = LogConfig.for_tests(segment_bytes=rnd.choice([4096, 70_000, 1 << 20]),
                                 index_interval_bytes=rnd.choice([1, 4096]))
    fast = open_log(config, tmp_path / "fast-0")
    slow = open_log(config, tmp_path / "slow-0")
    for _ in range(rnd.choice([1, 5, 30])):
        lines = [rnd.randbytes(rnd.choice([0, 1, 100, 127, 128, 1000])).replace(b"\n", b"x")
                 for _ in range(rnd.choice([1, 2, 50, 700]))]
        prefix_len = min(rnd.choice([0, 0, 1, 5]), len(lines[0]))
        prefix, text = lines[0][:prefix_len], b"\n".join(lines)[prefix_len:] + b"\n"
        tail = rnd.randbytes(rnd.choice([0, 3])).replace(b"\n", b"x")  # bytes after the last line: not appended
        assert fast.append_lines(prefix, text + tail, len(text)) == slow.append(lines)
    assert fast.log_end_offset == slow.log_end_offset
    assert _segment_bytes(fast) == _segment_bytes(slow)
    for a, b in zip(fast.segments, slow.segments):
        assert (a.base_offset, a.size, a.stats) == (b.base_offset, b.size, b.stats)
        for index in ("offset_index", "time_index", "view_index"):
            ia, ib = getattr(a, index), getattr(b, index)
            assert [ia.entry(i) for i in range(ia.entries)] == [ib.entry(i) for i in range(ib.entries)]


def test_append_lines_is_all_or_nothing_on_a_long_line(open_log):
    from logfs.storage import LogConfig, RecordTooLargeError

    log = open_log(LogConfig.for_tests(max_message_bytes=10))
    log.append_lines(b"", b"ok\n", 3)
    with pytest.raises(RecordTooLargeError):
        log.append_lines(b"", b"a\n" * 5000 + b"x" * 11 + b"\n", 10_012)
    with pytest.raises(RecordTooLargeError):  # the prefix counts towards the first line
        log.append_lines(b"123456", b"78901\nb\n", 8)
    assert log.log_end_offset == 1
    assert log.append_lines(b"12345", b"67890\n", 6) == (1, 1)


def test_encode_lines_rejects_what_is_not_whole_lines():
    for prefix, data, end in [(b"", b"abc", 3), (b"", b"a\nb", 3), (b"x\n", b"a\n", 2), (b"", b"a\n", 0),
                              (b"", b"a\n", 3)]:
        with pytest.raises(ValueError):
            speedups.encode_lines(prefix, data, end, 1024)


def test_append_lines_without_the_accelerator(open_log, tmp_path, monkeypatch):
    """Without the accelerator, append_lines takes the same path with the Python twins: the same bytes on disk."""
    lines = [b"a" * n for n in (0, 5, 300, 0, 70_000, 1)]
    text = b"\n".join(lines) + b"\n"
    fast = open_log(None, tmp_path / "fast-0")
    assert fast.append_lines(b"", text, len(text)) == (0, 5)
    monkeypatch.setattr(rec, "_speedups", None)
    monkeypatch.setattr("logfs.storage.local.log._speedups", None)
    slow = open_log(None, tmp_path / "slow-0")
    assert slow.append_lines(b"", text, len(text)) == (0, 5)
    assert _segment_bytes(fast) == _segment_bytes(slow)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("fmt", [LineFormat(), LineFormat(b"=", b"NULL")])
def test_seek_line_matches_the_records_lines(seed, fmt):
    """seek_line (the view's position_of and offset_at inside a batch) stops where a walk over
    LineFormat.records_with_lines stops, with gaps in the offsets (a compacted batch) and headers."""
    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.choice([1, 64, 500]))
    deltas = sorted(rnd.sample(range(len(values) * 3), len(values)))
    headers = [[("h", b"v")] if rnd.random() < 0.2 else [] for _ in values]
    batch = rec.build_batch_generic(1000, 1_700_000_000_000, values, keys, headers, offset_deltas=deltas,
                                    last_offset_delta=deltas[-1])
    lines = fmt.records_with_lines(batch, 0, len(batch))
    total = sum(n for _, n in lines)
    assert speedups.seek_line(batch, fmt.separator, fmt.null_marker, -1, -1) == (total, -1)
    for target in [0, 999, 1000, 1001, 1000 + deltas[-1], 1001 + deltas[-1]] + [rnd.randrange(900, 2600)
                                                                               for _ in range(20)]:
        passed = 0
        want = (total, -1)
        for offset, n in lines:
            if offset >= target:
                want = (passed, offset)
                break
            passed += n
        assert speedups.seek_line(batch, fmt.separator, fmt.null_marker, target, -1) == want, target
    for position in [0, total - 1, total, total + 5] + [rnd.randrange(total + 1) for _ in range(20)]:
        passed = 0
        want = (total, -1)
        for offset, n in lines:
            if passed + n > position:
                want = (passed, offset)
                break
            passed += n
        assert speedups.seek_line(batch, fmt.separator, fmt.null_marker, -1, position) == want, position

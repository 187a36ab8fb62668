"""The text view: its length, byte ranges and position <-> offset mapping, against a naive rendering."""

import os
import random

import pytest

from logfs.storage.format import records as rec
from logfs.view.text import LineFormat, SegmentView, live_view, open_view

FMT = dict(key_separator=b"=", null_marker=b"NULL")


class Model:
    """The records of a log as (offset, key, value), and their naive rendering."""

    def __init__(self, sep=None, marker=None):
        self.records = []
        self.start = 0
        self.sep, self.marker = sep, marker

    def line(self, key, value):
        body = value if value is not None else (self.marker or b"")
        return (key + self.sep if self.sep and key is not None else b"") + body + b"\n"

    def visible(self):
        return [r for r in self.records if r[0] >= self.start]

    def text(self):
        return b"".join(self.line(k, v) for _, k, v in self.visible())

    def positions(self):
        """{offset: view position of its line}, and the end position."""
        out, pos = {}, 0
        for offset, key, value in self.visible():
            out[offset] = pos
            pos += len(self.line(key, value))
        return out, pos


def random_records(rng, n, keyed=0.5, nulls=0.1):
    keys, values = [], []
    for _ in range(n):
        keys.append(None if rng.random() > keyed else rng.choice([b"k", b"user-42", b"", b"a=b"]))
        if rng.random() < nulls:
            values.append(None)
        else:
            values.append(bytes(rng.choice(b"abcdefghij =-") for _ in range(rng.choice([0, 1, 5, 30, 200]))))
    return keys, values


def fill(log, model, rng, appends=150, max_batch=12):
    for _ in range(appends):
        keys, values = random_records(rng, rng.randint(1, max_batch))
        first, _ = log.append(values, keys=keys)
        model.records += [(first + i, k, v) for i, (k, v) in enumerate(zip(keys, values))]


def check_view(view, model, rng, probes=150):
    expected = model.text()
    assert view.length() == len(expected)
    assert view.read(0, len(expected) + 100) == expected
    for _ in range(probes):
        pos = rng.randrange(len(expected) + 5)
        size = rng.choice([1, 2, 7, 100, 4096, 70_000])
        assert view.read(pos, size) == expected[pos:pos + size], (pos, size)
    positions, end = model.positions()
    for offset, pos in positions.items():
        assert view.position_of(offset) == pos, offset
    assert view.position_of(model.records[-1][0] + 1) == end == len(expected)
    assert view.position_of(model.records[-1][0] + 2) is None
    if model.start > 0:
        assert view.position_of(model.start - 1) is None
    starts = sorted(positions.items(), key=lambda kv: kv[1])
    for _ in range(probes):
        pos = rng.randrange(len(expected))
        owner = max((o for o, p in starts if p <= pos), default=None)
        assert view.offset_at(pos) == owner, pos
    assert view.offset_at(len(expected)) is None
    assert view.offset_at(-1) is None


@pytest.mark.parametrize("fmt", [FMT, dict(key_separator=b" -> "), dict(null_marker=b"<null>"), {}],
                         ids=["sep+marker", "sep", "marker", "plain"])
def test_view_matches_naive_rendering(make_log, fmt):
    rng = random.Random(42)
    log = make_log(segment_bytes=4096, index_interval_bytes=300, **fmt)
    model = Model(fmt.get("key_separator"), fmt.get("null_marker"))
    fill(log, model, rng)
    assert len(log.segments) > 5
    check_view(live_view(log), model, rng)


def test_sequential_reads_in_chunks_follow_the_cursor(make_log):
    rng = random.Random(5)
    log = make_log(segment_bytes=8192, index_interval_bytes=512, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng, appends=200)
    expected = model.text()
    for chunk in (1, 3, 64, 1000, 4096, 131072):
        view = open_view(log)
        out, pos = [], 0
        while True:
            piece = view.read(pos, chunk)
            if not piece:
                break
            assert len(piece) == min(chunk, len(expected) - pos)
            out.append(piece)
            pos += len(piece)
        assert b"".join(out) == expected
        view.release()


def test_view_grows_with_appends(make_log):
    rng = random.Random(8)
    log = make_log(segment_bytes=4096, index_interval_bytes=200, **FMT)
    model = Model(b"=", b"NULL")
    for step in range(40):
        fill(log, model, rng, appends=3)
        view = live_view(log)
        expected = model.text()
        assert view.length() == len(expected)
        tail = max(0, len(expected) - 50)
        assert view.read(tail, 100) == expected[tail:]


def test_log_start_offset_in_the_middle_of_a_segment(make_log):
    rng = random.Random(9)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng)
    segs = log.segments.as_list()
    for start in (3, segs[1].base_offset + 5, segs[3].base_offset, segs[-1].base_offset + 1):
        log.increment_log_start_offset(start)
        model.start = start
        check_view(live_view(log), model, rng, probes=40)
    # Everything below the end offset trimmed away: an empty view.
    end = log.log_end_offset
    log.increment_log_start_offset(end)
    model.start = end
    view = live_view(log)
    assert view.length() == 0 and view.read(0, 10) == b""
    assert view.position_of(end) == 0 and view.offset_at(0) is None


def test_view_after_delete_segments_starts_at_new_log_start(make_log):
    rng = random.Random(10)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, file_delete_delay_ms=0, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng)
    victims = log.segments.as_list()[:3]
    log.delete_segments(victims)
    model.start = log.log_start_offset
    assert model.start == victims[-1].next_offset
    check_view(live_view(log), model, rng, probes=40)


def test_open_view_keeps_its_content_after_retention(make_log, clock):
    rng = random.Random(11)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, file_delete_delay_ms=1000, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng)
    before = model.text()
    view = open_view(log)
    assert view.length() == len(before)
    log.delete_segments(log.segments.as_list()[:4])
    clock.advance(2000)
    assert log.purge_deleted() == 4  # the files are unlinked; the handle's fds keep them readable
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))
    assert view.length() == len(before)
    assert view.read(0, len(before)) == before
    for _ in range(50):
        pos = rng.randrange(len(before))
        assert view.read(pos, 300) == before[pos:pos + 300]
    # Appends after the retention event show up at the end of the old handle's view, too.
    first, _ = log.append([b"new line"], keys=[b"n"])
    model.records.append((first, b"n", b"new line"))
    view.extend()
    assert view.read(len(before), 100) == b"n=new line\n"
    assert view.length() == len(before) + len(b"n=new line\n")
    # A new open sees the view from the new log start.
    model.start = log.log_start_offset
    assert live_view(log).read(0, 10**6) == model.text()
    assert len(model.text()) < len(before)
    pinned = list(view._snapshot.segments)
    assert all(s.refs == 1 for s in pinned)
    view.release()
    assert view.segments == [] and all(s.refs == 0 for s in pinned)


def test_released_view_closes_deleted_segments(make_log):
    rng = random.Random(12)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, file_delete_delay_ms=0)
    model = Model()
    fill(log, model, rng)
    victims = log.segments.as_list()[:2]
    view = open_view(log)
    log.delete_segments(victims)
    assert all(s.fd >= 0 for s in victims)  # pinned
    view.release()
    assert all(s.fd < 0 for s in victims)


def test_open_view_extends_across_rolls(make_log):
    rng = random.Random(13)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng, appends=20)
    view = open_view(log)
    n = len(log.segments)
    fill(log, model, rng, appends=100)
    assert len(log.segments) > n
    assert view.extend()
    check_view(view, model, rng, probes=40)
    assert not view.extend()
    view.release()


def test_view_survives_reopen(make_log, tmp_path):
    rng = random.Random(14)
    directory = tmp_path / "reopen"
    log = make_log(directory=directory, segment_bytes=4096, index_interval_bytes=256, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng)
    log.increment_log_start_offset(17)
    model.start = 17
    log.close()
    log = make_log(directory=directory, had_clean_shutdown=True, segment_bytes=4096, index_interval_bytes=256,
                   **FMT)
    log.increment_log_start_offset(17)
    check_view(live_view(log), model, rng, probes=40)
    fill(log, model, rng, appends=10)
    check_view(live_view(log), model, rng, probes=40)


def test_view_after_truncation(make_log):
    rng = random.Random(15)
    log = make_log(segment_bytes=4096, index_interval_bytes=256, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng)
    for cut in (log.log_end_offset - 1, log.segments.as_list()[-2].base_offset, 150, 151):
        log.truncate_to(cut)
        model.records = [r for r in model.records if r[0] < cut]
        check_view(live_view(log), model, rng, probes=30)
        fill(log, model, rng, appends=5)
        check_view(live_view(log), model, rng, probes=30)


def test_format_change_is_picked_up(make_log):
    import dataclasses
    rng = random.Random(16)
    log = make_log(segment_bytes=4096, index_interval_bytes=256)
    model = Model()
    fill(log, model, rng, appends=50)
    assert live_view(log).read(0, 10**6) == model.text()
    log.config = dataclasses.replace(log.config, **FMT)
    model.sep, model.marker = b"=", b"NULL"
    check_view(live_view(log), model, rng, probes=30)


def test_control_batches_render_nothing(make_log):
    log = make_log()
    log.append([b"a"])
    control = bytearray(rec.build_batch(0, 1, [None], keys=[b"\x00\x00\x00\x01"]))
    control[22] |= rec.ATTR_CONTROL  # attributes low byte; recompute the CRC
    import struct
    import crc32c
    struct.pack_into(">I", control, 17, crc32c.crc32c(bytes(control[21:])))
    log.append_raw_batch(bytes(control))
    log.append([b"b"])
    assert [r.value for r in log.read(0)] == [b"a", b"b"]
    view = live_view(log)
    assert view.read(0, 100) == b"a\nb\n" and view.length() == 4
    assert view.position_of(1) == 2 and view.position_of(2) == 2
    assert view.offset_at(2) == 2


def test_line_format():
    fmt = LineFormat(b"=", b"NULL")
    assert fmt.line(b"k", b"v") == b"k=v\n"
    assert fmt.line(None, b"v") == b"v\n"
    assert fmt.line(b"k", None) == b"k=NULL\n"
    assert LineFormat().line(b"k", None) == b"\n"
    from logfs.storage.format.lines import LineStats
    stats = LineStats(records=3, keyed=2, nulls=1, key_bytes=5, value_bytes=10)
    assert fmt.length(stats) == 3 + 10 + 5 + 2 + 4
    assert LineFormat().length(stats) == 13


def test_segment_view_over_an_empty_log(make_log):
    log = make_log()
    view = live_view(log)
    assert view.length() == 0 and view.read(0, 10) == b""
    assert view.position_of(0) == 0 and view.offset_at(0) is None
    assert isinstance(view, SegmentView)


def test_tail_follow_on_an_open_view(make_log):
    """Read to the end, then appends (into the same segment, then across a roll) show up at the old end."""
    log = make_log(segment_bytes=2048, index_interval_bytes=100, **FMT)
    model = Model(b"=", b"NULL")
    rng = random.Random(17)
    fill(log, model, rng, appends=5, max_batch=3)
    view = open_view(log)
    pos = 0
    seen = b""
    for round_ in range(30):
        while True:
            piece = view.read(pos, 100)
            if not piece:
                break
            seen += piece
            pos += len(piece)
        assert seen == model.text()
        fill(log, model, rng, appends=2, max_batch=4)
        view.extend()
    assert len(log.segments) > 3
    view.release()


def test_records_larger_than_the_read_chunk(make_log):
    rng = random.Random(18)
    log = make_log(index_interval_bytes=1000, **FMT)
    model = Model(b"=", b"NULL")
    for size in (10, 200_000, 5, 70_000, 1, 300_000, 3):
        value = bytes(rng.choice(b"abc") for _ in range(size))
        first, _ = log.append([value], keys=[b"big"])
        model.records.append((first, b"big", value))
    assert [len(r.value) for r in log.read(1, max_bytes=1)] == [200_000]
    check_view(live_view(log), model, rng, probes=60)


@pytest.mark.parametrize("compression", [0, 1])  # plain (the C path), gzip (the Python path)
def test_view_counts_the_records_whose_line_ends_in_each_read(make_log, compression):
    """``view.lines`` after a read: the records whose line (its final "\\n") the read returned, also when values
    hold "\\n" of their own (other Kafka producers' records) and reads cut lines anywhere. The metrics' read
    counter."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    log = make_log()
    rng = random.Random(compression)
    values = [rng.choice([b"plain", b"two\nlines", b"", b"x" * 300, b"\n"]) for _ in range(200)]
    for start in range(0, len(values), 50):
        builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 30)
        for delta, value in enumerate(values[start:start + 50]):
            builder.append(delta, 1_700_000_000_000, None, value, [])
        log.append_raw_batch(bytes(builder.build()))
    text = b"".join(v + b"\n" for v in values)
    ends = []
    for v in values:
        ends.append((ends[-1] if ends else 0) + len(v) + 1)
    view = open_view(log)
    try:
        for _ in range(200):
            pos = rng.randrange(len(text) + 1)
            size = rng.choice([1, 5, 64, 700, 1 << 20])
            got = view.read(pos, size)
            assert got == text[pos:pos + size]
            assert view.lines == sum(pos < end <= pos + len(got) for end in ends), (pos, size)
        pos, total = 0, 0  # a sequential read in chunks counts every record once
        while chunk := view.read(pos, 333):
            pos += len(chunk)
            total += view.lines
        assert total == len(values)
    finally:
        view.release()


def test_lookups_and_reads_without_the_accelerator(make_log, monkeypatch):
    """The view's pure-Python paths (no logfs._speedups) give what the C ones give."""
    from logfs.view import text as text_module

    rng = random.Random(5)
    log = make_log(index_interval_bytes=512, **FMT)
    model = Model(b"=", b"NULL")
    fill(log, model, rng, appends=60)
    monkeypatch.setattr(text_module, "_speedups", None)
    check_view(live_view(log), model, rng, probes=40)


@pytest.mark.parametrize("then", ["roll", "extend"])
def test_a_read_that_another_threads_append_overtakes_leaves_no_cursor_inside_a_grown_batch(make_log, then):
    """Issue 42 (a tiered ``tail -f`` stopped short for good): a read that runs in a worker thread (a tiered range
    fetched, a compressed batch) reads the active segment while the request thread goes on appending. If, after it
    read the end of the active segment's last batch, another append grew that batch in place and the segment then
    rolled (or the view was extended meanwhile), the cursor it left pointed inside the grown batch: every later
    read rendered nothing there, and the reader never got another line."""
    log = make_log(segment_bytes=1 << 20)
    written = []

    def append(n: int) -> None:
        data = b"".join(b"line-%06d\n" % (len(written) + k) for k in range(n))
        written.extend(data.splitlines(keepends=True))
        log.append_lines(b"", data, len(data))

    append(50)
    view = open_view(log)
    active = log.segments.active
    assert active.tail is not None  # (its last batch may grow in place)
    read_into = active.read_into

    def read_then_overtaken(scratch, position, length):
        buf = read_into(scratch, position, length)
        del active.read_into  # (once)
        size = active.size
        append(1)  # the request thread, meanwhile: grows the last batch in place...
        assert active.size > size and len(log.segments) == 1
        log.roll()  # ... and rolls (a full segment)
        append(2)
        if then == "extend":
            view.extend()  # (an fstat or a getxattr of the handle, answered on the request thread meanwhile)
        return buf

    active.read_into = read_then_overtaken
    text = view.read(0, 1 << 20)
    assert text == b"".join(written[:50])
    for _ in range(4):  # a reader following the file: read to the end, then again
        view.extend()
        while piece := view.read(len(text), 1 << 20):
            text += piece
    assert text == b"".join(written), f"{len(text.splitlines())} of {len(written)} lines"
    view.release()


def test_an_empty_active_segment_inside_a_view_is_passed_over(make_log, tmp_path):
    """A follower's log moves its one empty local segment to the tiered log's end, and a handle's view keeps the
    old one (retired, never sealed: still active, and empty) between the tiered segments around it: a read that
    reaches it goes on into the next segment, never ending early there (``cat`` would stop short)."""
    from logfs.storage.local.lifecycle import open_segment

    log = make_log(segment_bytes=1 << 20)
    for k in range(3):
        data = b"".join(b"seg%d-%04d\n" % (k, i) for i in range(100))
        log.append_lines(b"", data, len(data))
        log.roll()
    first, second = log.segments.as_list()[:2]
    (tmp_path / "other").mkdir()
    empty = open_segment(str(tmp_path / "other"), second.base_offset, log.config)  # (active, as a follower's)
    try:
        view = SegmentView([first, empty, second], 0, LineFormat.of(log.config))
        whole = view.read(0, 1 << 20)
        assert whole.splitlines() == [b"seg%d-%04d" % (k, i) for k in range(2) for i in range(100)]
        head = view.read(0, len(whole) // 2)  # a read that ends where the empty segment begins, then the next
        assert len(head) == len(whole) // 2 and view.read(len(head), 1 << 20) == whole[len(head):]
    finally:
        empty.close()


def test_two_threads_measuring_a_view_at_once_never_write_a_start_twice(make_log):
    """A handle's view read in a worker thread may be measured on the request thread at the same moment (before
    issue 42's fix, an fstat or a getxattr did so): the segment starts the two grow together are each written once
    (a start written twice shifted every later one, and the view's length came out a segment short)."""
    log = make_log(segment_bytes=1 << 20)
    for k in range(5):
        data = b"".join(b"seg%d-%04d\n" % (k, i) for i in range(10 + k))
        log.append_lines(b"", data, len(data))
        log.roll()
    view = open_view(log)
    view.extend()
    expected = sum(10 + k for k in range(5)) * len(b"seg0-0000\n")
    measure = view._segment_length
    interleaved = []

    def other_thread_meanwhile(i):  # the other thread runs between this one's look at the list and its append
        if not interleaved:
            interleaved.append(i)
            view._start(len(view.segments) - 1)
        return measure(i)

    view._segment_length = other_thread_meanwhile
    assert view.length() == expected and interleaved
    del view._segment_length
    for k in range(5, 8):  # the log goes on: the starts of the segments after them
        data = b"".join(b"seg%d-%04d\n" % (k, i) for i in range(10 + k))
        log.append_lines(b"", data, len(data))
        log.roll()
        expected += len(data)
    view.extend()
    assert view.length() == expected
    assert [view._start(i) for i in range(len(view.segments))] == [
        sum(10 + j for j in range(k)) * 10 for k in range(len(view.segments))]
    assert view.read(0, 1 << 20).splitlines() == [b"seg%d-%04d" % (k, i) for k in range(8) for i in range(10 + k)]
    view.release()

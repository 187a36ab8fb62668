"""Growing the active segment's last batch in place (a small append adds its records to the tail batch, then
rewrites the batch's header): the bytes, the offsets and timestamps, the indexes and totals, the view's cursor,
where growth stops (cap, flush, roll, truncation, another append path), a failed write, and crash images cut at
every byte of the rewrite sequence."""

from __future__ import annotations

import os

import pytest

from logfs.storage.local import log as log_module
from logfs.storage.format import records as rec
from logfs.storage.format import speedups
from logfs.view.text import open_view



@pytest.fixture(autouse=True, params=["c", "twins"])
def accelerator(request, monkeypatch):
    """Each test with the C accelerator and again with its Python twins (logfs.storage.format.twins)."""
    if request.param == "c" and speedups.C is None:
        pytest.skip("the C accelerator is not built")
    if request.param == "twins":
        for module in ("logfs.storage.local.log", "logfs.storage.local.tail_batch", "logfs.storage.format.records"):
            monkeypatch.setattr(f"{module}._speedups", None)


def append_line(log, line: bytes):
    return log.append_lines(b"", line + b"\n", len(line) + 1)


def batches_on_disk(log):
    """(position, header) of every batch of every segment, each CRC-checked."""
    out = []
    for segment in log.segments:
        data = open(segment.log_path, "rb").read()
        assert len(data) == segment.size
        for pos, header in rec.iter_headers(data):
            rec.validate(data, pos)
            out.append((segment.base_offset, pos, header))
    return out


def all_records(log):
    return log.read(log.log_start_offset, 1 << 30)


def test_one_line_appends_share_a_batch_with_right_offsets_timestamps_and_totals(open_log, clock):
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=1024)
    lines = [b"line %d " % i + b"x" * (i % 50) for i in range(400)]
    for i, line in enumerate(lines):
        clock.advance(0 if i % 3 else 7)  # some appends in the same millisecond, some later
        assert append_line(log, line) == (i, i)
    found = batches_on_disk(log)
    assert len(found) < len(lines) // 10  # grown, not one batch per append
    assert all(h.size <= log_module.TAIL_BATCH_CAP for _, _, h in found)
    records = all_records(log)
    assert [r.value for r in records] == lines
    assert [r.offset for r in records] == list(range(len(lines)))
    times = [r.timestamp for r in records]
    assert times == sorted(times) and times[0] < times[-1]
    for _, pos, h in found:  # header fields agree with the records
        mine = [r for r in records if h.base_offset <= r.offset <= h.last_offset]
        assert h.records_count == len(mine) and h.last_offset == mine[-1].offset
        assert h.base_timestamp == mine[0].timestamp and h.max_timestamp == max(r.timestamp for r in mine)
    segment = log.active_segment
    assert segment.size == os.path.getsize(segment.log_path)
    assert segment.stats.records == len(lines) and segment.stats.value_bytes == sum(map(len, lines))
    assert segment.max_timestamp == max(times)
    # Every offset index entry names a batch start holding its offset; reads from any offset are exact.
    assert segment.offset_index.entries > 3 and segment.view_index.entries > 3
    for i in range(segment.offset_index.entries):
        rel, position = segment.offset_index.entry(i)
        assert any(pos == position and h.base_offset <= rel <= h.last_offset for _, pos, h in found)
    total = 0
    for i in range(segment.view_index.entries):  # each names a batch start and the totals before it
        entry = segment.view_index.get(i)
        header = next(h for _, pos, h in found if pos == entry.position)
        assert entry.offset == header.base_offset
        assert entry.stats.records == header.base_offset
        total += 1
    for offset in (0, 1, 57, 200, 399):
        assert log.read(offset, 1)[0].value == lines[offset]
    assert log.offset_for_timestamp(times[250]) == times.index(times[250])


def test_the_segment_reloads_and_kafka_python_parses_it(open_log, clock, tmp_path, caplog):
    """After a clean close the indexes agree with the grown batches: the reload derives its state from them
    without a rebuild (the loader logs one when an index disagrees with the log)."""
    import logging

    from kafka.record.default_records import DefaultRecordBatch

    log = open_log(segment_bytes=1 << 20, index_interval_bytes=512)
    lines = [b"%05d" % i for i in range(1000)]
    for line in lines:
        clock.advance(1)
        append_line(log, line)
    log.close()
    data = open(tmp_path / "t-0" / "00000000000000000000.log", "rb").read()
    values, pos = [], 0
    while pos < len(data):
        size = rec.peek_size(data, pos)
        batch = DefaultRecordBatch(data[pos : pos + size])
        assert batch.validate_crc()
        values += [r.value for r in batch]
        pos += size
    assert values == lines
    caplog.set_level(logging.INFO, logger="logfs.storage")
    again = open_log(segment_bytes=1 << 20, index_interval_bytes=512)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.value for r in all_records(again)] == lines
    assert again.active_segment.stats == log.active_segment.stats


def test_growth_stops_at_the_cap_at_a_flush_and_at_a_keyed_append(open_log):
    log = open_log(segment_bytes=1 << 20)
    append_line(log, b"a" * 100)
    append_line(log, b"b" * 100)
    assert len(batches_on_disk(log)) == 1
    # A flush: the synced batch is never rewritten, the next append starts a batch.
    log.flush()
    before = open(log.active_segment.log_path, "rb").read()
    append_line(log, b"c" * 100)
    append_line(log, b"d" * 100)
    after = open(log.active_segment.log_path, "rb").read()
    assert after[: len(before)] == before and len(batches_on_disk(log)) == 2
    # Another append path (Log.append) ends growth of the batch before it.
    log.append([b"e"])
    append_line(log, b"f")
    assert len(batches_on_disk(log)) == 4
    # The cap: a batch never grows past it.
    for _ in range(200):
        append_line(log, b"g" * 100)
    assert all(h.size <= log_module.TAIL_BATCH_CAP for _, _, h in batches_on_disk(log))
    # A write as large as the cap takes the bulk path.
    big = b"h" * log_module.TAIL_BATCH_CAP
    count = len(batches_on_disk(log))
    append_line(log, big)
    assert len(batches_on_disk(log)) == count + 1
    assert [r.value for r in all_records(log)][-1] == big


def test_growth_never_crosses_a_roll_or_a_truncation(open_log):
    log = open_log(segment_bytes=4096)
    lines = [b"%04d" % i + b"y" * 60 for i in range(300)]
    for line in lines:
        append_line(log, line)
    assert len(log.segments) > 3
    assert all(s.size <= 4096 for s in log.segments)
    assert [r.value for r in all_records(log)] == lines
    log.truncate_to(295)
    append_line(log, b"after")
    assert [r.value for r in all_records(log)] == lines[:295] + [b"after"]
    batches_on_disk(log)


def test_too_long_a_line_refuses_the_grow_and_changes_nothing(open_log):
    from logfs.storage.errors import RecordTooLargeError

    log = open_log(segment_bytes=1 << 20, max_message_bytes=200)
    append_line(log, b"ok")
    image = open(log.active_segment.log_path, "rb").read()
    with pytest.raises(RecordTooLargeError):
        append_line(log, b"z" * 300)
    assert open(log.active_segment.log_path, "rb").read() == image
    append_line(log, b"next")
    assert [r.value for r in all_records(log)] == [b"ok", b"next"]
    assert len(batches_on_disk(log)) == 1


def test_a_failed_grow_on_a_full_disk_leaves_the_batch_as_it_was(small_tmpfs, open_log):
    log = open_log(directory=small_tmpfs.path / "t-0", segment_bytes=1 << 30)
    append_line(log, b"first")
    small_tmpfs.top_up()
    size = log.active_segment.size
    with pytest.raises(Exception) as failed:
        for i in range(10_000):  # until the page the batch ends in is full
            append_line(log, b"w%05d" % i + b"v" * 90)
    assert getattr(failed.value, "errno", None) == 28
    kept = all_records(log)
    assert log.active_segment.size == os.path.getsize(log.active_segment.log_path) >= size
    assert [r.offset for r in kept] == list(range(log.log_end_offset))
    batches_on_disk(log)
    os.unlink(small_tmpfs.path / "filler")
    append_line(log, b"after")
    assert [r.value for r in all_records(log)] == [r.value for r in kept] + [b"after"]
    batches_on_disk(log)


def test_a_view_cursor_at_the_end_of_a_growing_batch_reads_on_right(open_log):
    log = open_log(segment_bytes=1 << 20)
    view = open_view(log)
    text = b""
    followed = 0
    try:
        for i in range(300):
            line = b"line-%d" % i + b"." * (i % 13)
            append_line(log, line)
            text += line + b"\n"
            if i % 4 == 0:  # a reader following the file (tail -f): read to the end now and then
                got = b""
                pos = followed
                while True:
                    chunk = view.read(pos, 1 << 20)
                    if not chunk:
                        break
                    got += chunk
                    pos += len(chunk)
                assert pos == len(text) and got == text[followed:pos]
                followed = pos
        assert view.read(0, 1 << 20) == text
    finally:
        view.release()


class _Recorder:
    """The .log file's bytes after every pwrite of the segment (the crash images of a kill between any two)."""

    def __init__(self, path):
        self.path, self.images = path, []
        self._pwrite = os.pwrite

    def __call__(self, fd, data, position):
        n = self._pwrite(fd, data, position)
        self.images.append(open(self.path, "rb").read())
        return n


def test_a_crash_anywhere_in_a_grow_keeps_every_line_already_appended(open_log, tmp_path, monkeypatch):
    """Crash images of a kill -9 during a growing append: the file after the records' pwrite cut at every byte
    (the records land first), and after the header's. Recovery gives a valid log holding every line of the
    appends that returned, and at most the line in flight. A header torn part-way (possible only at a power
    loss, for bytes never flushed) still recovers to a valid log: a prefix of the lines."""
    log = open_log(segment_bytes=1 << 20)
    lines = [b"L%03d" % i + b"q" * (i % 7) for i in range(40)]
    for line in lines[:-1]:
        append_line(log, line)
    before = open(log.active_segment.log_path, "rb").read()
    recorder = _Recorder(log.active_segment.log_path)
    monkeypatch.setattr(os, "pwrite", recorder)
    append_line(log, lines[-1])
    monkeypatch.undo()
    assert len(recorder.images) == 2  # the records, then the header
    records_image, final = recorder.images
    assert records_image[: len(before)] == before  # the old header stays until the records are there
    kill_images = [records_image[:cut] for cut in range(len(before), len(records_image) + 1)] + [final]
    torn_images = [final[:k] + records_image[k:] for k in range(1, rec.HEADER_SIZE)]
    for n, image in enumerate(kill_images + torn_images):
        directory = tmp_path / f"crash{n}" / "t-0"
        directory.mkdir(parents=True)
        (directory / "00000000000000000000.log").write_bytes(image)
        recovered = open_log(segment_bytes=1 << 20, directory=directory, recovery_point=0,
                             had_clean_shutdown=False)
        values = [r.value for r in all_records(recovered)]
        if n < len(kill_images):
            assert values in (lines[:-1], lines), n
        else:
            assert values == lines[: len(values)], n
        if image == final:
            assert values == lines
        batches_on_disk(recovered)
        append_line(recovered, b"next")  # and it appends on from there
        assert [r.value for r in all_records(recovered)] == values + [b"next"]
        recovered.close_without_flush()


def test_the_spark_reader_never_fails_while_a_writer_grows_the_tail(open_log, tmp_path, caplog):
    """A writer thread appends one line at a time (each growing the tail batch in place, with rolls) while the
    read-only reader of the Spark source loops over the partition: it never raises, never logs corruption, and
    what it returns is always a prefix of what was appended, in order, once."""
    import logging
    import threading

    from logfs.spark.segments import PartitionReader, TopicPartition

    log = open_log(segment_bytes=64 * 1024, directory=tmp_path / "data" / "t-0")
    lines = [b"w" * (i % 3) if i % 50 else b"w%06d" % i for i in range(6000)]  # short: header-like bytes
    done = threading.Event()
    failures = []

    def write():
        try:
            for line in lines:
                append_line(log, line)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            done.set()

    reader = PartitionReader(str(tmp_path / "data"), TopicPartition("t", 0))
    caplog.set_level(logging.DEBUG, logger="logfs.storage.local.reader")
    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    try:
        while not done.is_set() or reads < 2:
            start, end = reader.offsets()
            values = [r.value for r in reader.records(start, end)]
            assert values == lines[: len(values)] and len(values) == end
            reads += 1
    finally:
        writer.join()
    assert not failures
    assert [r.value for r in reader.records(0, len(lines))] == lines
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert reads > 5


def test_the_spark_reader_between_the_writes_of_a_grow(open_log, tmp_path, caplog, monkeypatch):
    """Deterministically, the states a reader can meet while a batch grows: the records past the end without
    their header yet, and a header half rewritten. The Spark source's reader reads at every such instant: no
    error, no corruption reported, a prefix of the lines in order."""
    import logging

    from logfs.spark.segments import PartitionReader, TopicPartition

    log = open_log(segment_bytes=1 << 20, directory=tmp_path / "data" / "t-0")
    reader = PartitionReader(str(tmp_path / "data"), TopicPartition("t", 0))
    lines = [b"w" * (i % 3) if i % 7 else b"w%06d" % i for i in range(300)]
    appended = []
    seen = []
    real_pwrite = os.pwrite

    def read_now(torn=False):
        start, end = reader.offsets()
        values = [r.value for r in reader.records(start, end)]
        assert values == lines[: len(values)]
        if not torn:  # else the reader stops before the batch being rewritten
            assert len(values) >= len(appended)
        seen.append(len(values))

    def pwrite(fd, data, position):
        if len(data) == rec.HEADER_SIZE and len(appended) % 10 == 0:  # a header torn part-way
            real_pwrite(fd, bytes(data[:30]), position)
            read_now(torn=True)
        n = real_pwrite(fd, data, position)
        read_now()
        return n

    caplog.set_level(logging.DEBUG, logger="logfs.storage.local.reader")
    monkeypatch.setattr(os, "pwrite", pwrite)
    for line in lines:
        append_line(log, line)
        appended.append(line)
    monkeypatch.undo()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.value for r in reader.records(0, len(lines))] == lines
    assert len(seen) > 2 * len(lines)


def test_a_batch_whose_header_crosses_a_page_is_never_grown(open_log):
    """A kill can cut a write between two pages: a header rewritten across a page boundary could be left torn,
    and with it the batch's earlier lines. Such a batch is left as it is; the next line starts a new batch."""
    log = open_log(segment_bytes=1 << 20)
    page = log_module.PAGE_SIZE
    # A first batch ending 30 bytes before a page boundary: the next batch's header straddles it.
    filler = b"f" * (page - 30 - rec.HEADER_SIZE - 9)  # 9: the record framing of a ~4000-byte value
    log.append([filler])
    assert log.active_segment.size == page - 30
    append_line(log, b"straddling")
    image = open(log.active_segment.log_path, "rb").read()
    append_line(log, b"after")
    after = open(log.active_segment.log_path, "rb").read()
    assert after[: len(image)] == image  # nothing rewritten
    assert [h.base_offset for _, _, h in batches_on_disk(log)] == [0, 1, 2]
    # The batch after it took the index entry due after ~4 KiB (an indexed batch never grows: Kafka's entries name
    # a batch's last offset), so the one after that grows again.
    append_line(log, b"new batch")
    append_line(log, b"grows")
    assert [h.records_count for _, _, h in batches_on_disk(log)] == [1, 1, 1, 2]


def test_a_topic_turned_compacted_refuses_the_grow_and_changes_nothing(open_log):
    import dataclasses

    from logfs.storage.errors import InvalidRecordError

    log = open_log(segment_bytes=1 << 20)
    append_line(log, b"plain")
    image = open(log.active_segment.log_path, "rb").read()
    log.config = dataclasses.replace(log.config, cleanup_policy="compact")  # as the manager does on a change
    with pytest.raises(InvalidRecordError):
        append_line(log, b"no key")
    assert open(log.active_segment.log_path, "rb").read() == image
    assert log.active_segment.tail.batch == image  # the batch in memory is as it was too
    log.config = dataclasses.replace(log.config, cleanup_policy="delete")
    append_line(log, b"again")
    assert [r.value for r in all_records(log)] == [b"plain", b"again"]
    assert len(batches_on_disk(log)) == 1


@pytest.mark.parametrize("short_first", [False, True])
def test_a_grow_whose_write_fails_part_way_raises_the_disk_error_and_keeps_the_log(open_log, monkeypatch,
                                                                                  short_first):
    """The write of a grow fails with ENOSPC at once, or after a short write (the disk filled in the middle, as a
    full tmpfs does it). The failed write's frames, kept by the traceback, still export views of the batch buffer:
    restoring it must not resize that buffer (it raised BufferError, an internal error through the mount)."""
    log = open_log(segment_bytes=1 << 20)
    append_line(log, b"first")
    real_pwrite = os.pwrite
    calls = []

    def failing(fd, data, position):
        calls.append(len(data))
        if short_first and len(calls) == 1 and len(data) > 1:
            return real_pwrite(fd, memoryview(data)[: len(data) // 2], position)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", failing)
    with pytest.raises(Exception) as failed:
        append_line(log, b"second")
    monkeypatch.undo()
    assert getattr(failed.value, "errno", None) == 28, repr(failed.value)
    assert [r.value for r in all_records(log)] == [b"first"]
    batches_on_disk(log)
    append_line(log, b"third")
    assert [r.value for r in all_records(log)] == [b"first", b"third"]
    batches_on_disk(log)

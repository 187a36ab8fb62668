"""Reading compressed segments through the text view as the FUSE layer does (a read the view says is in memory is
made on the request thread, and then decompresses nothing; any other in a worker thread): the read-ahead of a
sequential reader returns the text at every position and decompresses each batch once; a random read decompresses
only the batch that holds its line; a view released while its read-ahead runs lets its segments go once the
workers are done."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from logfs.storage import LogConfig, load_log
from logfs.storage.cleaner import compression
from logfs.storage.format import records as rec
from logfs.storage.cleaner.process import compress_in_thread
from logfs.view import readahead
from logfs.view.text import live_view, open_view

BATCH = 8 << 10  # records per rewritten batch: many batches per segment with little data


@pytest.fixture
def pool():
    """The read-ahead's threads, as the FUSE operations make them for a mount."""
    pool = readahead.decompress_pool()
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def zstd_log(tmp_path, clock, monkeypatch):
    """A zstd topic of ~600 KB of log lines: 4 sealed segments rewritten in ~8 KiB batches, and an active segment
    (plain). Returns (log, text)."""
    monkeypatch.setattr(compression, "TARGET_BATCH_BYTES", BATCH)
    config = dataclasses.replace(LogConfig.for_tests(segment_bytes=160 << 10, index_interval_bytes=4096),
                                 compression_type="zstd")
    plog = load_log(str(tmp_path / "t-0"), "t", 0, config, clock=clock)
    rng = random.Random(7)
    words = [b"GET", b"POST", b"/api/v1/orders", b"/health", b"200", b"404", b"user=alice", b"ms", b"retry"]
    lines = [b"%d %s\n" % (i, b" ".join(rng.choice(words) for _ in range(rng.randrange(1, 30))))
             for i in range(9000)]
    data = b"".join(lines)
    for start in range(0, len(lines), 500):
        chunk = b"".join(lines[start:start + 500])
        plog.append_lines(b"", chunk, len(chunk))
    sealed = plog.segments.as_list()[:-1]
    assert len(sealed) >= 4
    compress_in_thread(plog, sealed, clock.time_ms())
    yield plog, data
    plog.close()


def compressed_batches(plog) -> int:
    n = 0
    for segment in plog.segments.as_list():
        with open(segment.log_path, "rb") as f:
            n += sum(1 for _, h in rec.iter_headers(f.read()) if h.compression)
    return n


class Fuse:
    """Reads and lookups as logfs.fuse makes them: here when the view says they are in memory (and then they must
    decompress nothing), else in a worker thread; counts both."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(1)
        self.here = self.repeated = 0

    def call(self, in_memory: bool, fn, *args):
        if in_memory:
            me = threading.get_ident()  # (the read-ahead's threads may decompress meanwhile: they are not this one)
            before = readahead.decompressions(me)
            result = fn(*args)
            assert readahead.decompressions(me) == before, "a decompression on the request thread"
            self.here += 1
            return result
        self.repeated += 1
        return self.pool.submit(fn, *args).result()

    def read(self, view, pos: int, size: int) -> bytes:
        return self.call(view.in_memory(pos, size), view.read, pos, size)

    def close(self):
        self.pool.shutdown()


def idle(view, timeout: float = 10.0) -> None:
    """Wait until the view's read-ahead workers have nothing left to do."""
    deadline = time.monotonic() + timeout
    while view._ahead is not None and view._ahead._workers:
        assert time.monotonic() < deadline, "read-ahead never went idle"
        time.sleep(0.001)


@pytest.mark.parametrize("size", [200_000, 131072, 4099, 333])
def test_sequential_reads_return_the_text_and_decompress_each_batch_once(zstd_log, pool, size):
    plog, data = zstd_log
    fuse = Fuse()
    view = open_view(plog, ahead_pool=pool)
    before = readahead.decompressions()
    try:
        got, pos, reads = [], 0, 0
        while chunk := fuse.read(view, pos, size):
            got.append(chunk)
            pos += len(chunk)
            reads += 1
            if reads % 7 == 0 and pos < len(data):
                # The read-ahead decompressed the batches after this one: the next read finds them ready and is
                # served on the request thread.
                idle(view)
                repeated = fuse.repeated
                chunk = fuse.read(view, pos, size)
                assert fuse.repeated == repeated, (pos, size)
                got.append(chunk)
                pos += len(chunk)
        assert b"".join(got) == data
        assert readahead.decompressions() - before == compressed_batches(plog)
        assert view._ahead is not None  # (the read-ahead was used)
    finally:
        view.release()
        fuse.close()


def test_reads_from_every_kind_of_position_return_the_text(zstd_log, pool):
    """Sequential reads starting anywhere (inside batches, at batch and segment boundaries), in sizes that end
    anywhere, with the read-ahead running: the same bytes as the text."""
    plog, data = zstd_log
    fuse = Fuse()
    rng = random.Random(3)
    starts = [0, len(data) - 1] + [rng.randrange(len(data)) for _ in range(40)]
    starts += [live_view(plog).position_of(s.base_offset) for s in plog.segments.as_list()]
    try:
        for start in starts:
            view = open_view(plog, ahead_pool=pool)
            try:
                pos = start
                for _ in range(12):
                    size = rng.choice([1, 97, 4096, 8191, 65536, 300_000])
                    chunk = fuse.read(view, pos, size)
                    assert chunk == data[pos:pos + size], (start, pos, size)
                    pos += len(chunk)
            finally:
                view.release()
    finally:
        fuse.close()


def test_a_random_read_decompresses_only_the_batch_holding_its_line(zstd_log, pool):
    """``getxattr position.<offset>`` (a lookup: on the request thread it is repeated in a worker thread, with a
    view of its own) and the read of that line (a handle's view): one decompression between them, of the batch that
    holds the line; no read-ahead."""
    plog, data = zstd_log
    fuse = Fuse()
    rng = random.Random(11)
    end = plog.segments.as_list()[-1].base_offset  # the sealed (compressed) part
    handle = open_view(plog, ahead_pool=pool)
    try:
        for offset in [0, end - 1] + [rng.randrange(end) for _ in range(60)]:
            readahead.plain_batches.clear()
            before = readahead.decompressions()
            pos = _lookup_position(fuse, plog, offset)
            line_end = data.index(b"\n", pos) + 1
            line = fuse.read(handle, pos, line_end - pos)
            assert line == data[pos:line_end]
            assert pos == 0 or data[pos - 1:pos] == b"\n"
            assert readahead.decompressions() - before == 1, offset
        assert handle._ahead is None  # random reads: nothing read ahead
    finally:
        handle.release()
        fuse.close()


def _lookup_position(fuse, plog, offset: int) -> int:
    """What the position xattr does: in the live view on the request thread when it is in memory, else in a worker
    thread through a pinned view of its own."""
    with plog.lock:
        live = live_view(plog)
        if live.lookup_in_memory(offset=offset):
            return fuse.call(True, live.position_of, offset)

    def pinned() -> int:
        view = open_view(plog)
        try:
            return view.position_of(offset)
        finally:
            view.release()

    return fuse.call(False, pinned)


def test_a_view_released_during_read_ahead_unpins_its_segments_when_the_workers_are_done(zstd_log, pool):
    plog, data = zstd_log
    fuse = Fuse()
    segments = plog.segments.as_list()
    refs = [s.refs for s in segments]
    view = open_view(plog, ahead_pool=pool)
    try:
        pos = 0
        for _ in range(3):
            pos += len(fuse.read(view, pos, 4096))
        assert view._ahead is not None
        view.release()  # (workers may still be reading)
        deadline = time.monotonic() + 10
        while [s.refs for s in segments] != refs:
            assert time.monotonic() < deadline, [s.refs for s in segments]
            time.sleep(0.001)
    finally:
        fuse.close()


def test_a_log_start_inside_a_compressed_batch(zstd_log, pool):
    """The log start moved inside a compressed batch (and into the next segments): an open on the request thread
    measures the part before it (one batch decompressed there), and reads and lookups give the text from it."""
    plog, data = zstd_log
    fuse = Fuse()
    lines = data.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    try:
        for start in (37, plog.segments.as_list()[1].base_offset + 301, plog.segments.as_list()[3].base_offset + 5):
            plog.increment_log_start_offset(start)
            readahead.plain_batches.clear()
            before = readahead.decompressions()
            view = open_view(plog, ahead_pool=pool)  # (as a PartitionHandle is made in open())
            assert readahead.decompressions() - before <= 1
            try:
                want = data[starts[start]:]
                assert view.length() == len(want)
                pos, got = 0, []
                while chunk := fuse.read(view, pos, 65536):
                    got.append(chunk)
                    pos += len(chunk)
                assert b"".join(got) == want
                for offset in (start, start + 1, start + 250):
                    position = starts[offset] - starts[start]
                    assert fuse.call(view.lookup_in_memory(offset=offset), view.position_of, offset) == position
                    assert fuse.call(view.lookup_in_memory(position=position + 1), view.offset_at,
                                     position + 1) == offset
            finally:
                view.release()
    finally:
        fuse.close()


def test_a_view_reads_on_once_its_read_ahead_pool_is_shut_down(zstd_log):
    """The FUSE operations shut their read-ahead pool down at unmount (Operations.close): a view still reading then
    gets no read-ahead, and its reads return the text all the same."""
    plog, data = zstd_log
    pool = readahead.decompress_pool()
    pool.shutdown(wait=True)
    view = open_view(plog, ahead_pool=pool)
    try:
        pos, got = 0, []
        while chunk := view.read(pos, 65536):
            got.append(chunk)
            pos += len(chunk)
        assert b"".join(got) == data
        assert view._ahead is not None and view._ahead._workers == 0  # (asked to read ahead, and refused)
    finally:
        view.release()

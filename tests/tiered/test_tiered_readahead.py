"""Reading tiered history at the store's speed (issue 23), at the engine level over a counting directory store:
a sequential reader's fetches run ahead in larger GETs, small reads are served from what was fetched, a random
read still fetches only its blocks, concurrent readers share fetches, the cache stays bounded, and a store that
fails only fails the reads that need it."""

from __future__ import annotations

import os
import random
import threading

import pytest

from logfs.remote import DirectoryStore
from logfs.remote.api import RemoteUnavailableError
from logfs.storage import BrokerConfig, LogManager
from logfs.storage.remote_segment import BLOCK_BYTES, READ_AHEAD_GET
from logfs.storage.tiered import RemoteLogManager
from logfs.view.text import live_view, open_view

SEGMENT = 8 << 20


class CountingStore(DirectoryStore):
    def __init__(self, root):
        super().__init__(root)
        self.lock = threading.Lock()
        self.gets: list[tuple[str, int, int]] = []
        self.down = False

    def get_range(self, key, start, length):
        if self.down:
            raise RemoteUnavailableError("the store is down (test)")
        with self.lock:
            self.gets.append((key, start, length))
        return super().get_range(key, start, length)

    def log_gets(self):
        with self.lock:
            return [g for g in self.gets if g[0].endswith(".log")]


def lines(n):
    rng = random.Random(5)
    pool = [bytes(rng.choice(b"abcdefgh ") for _ in range(60 + i % 40)) for i in range(997)]
    return b"".join(b"%08d %s\n" % (i, pool[i % 997]) for i in range(n))


@pytest.fixture
def tiered(tmp_path, clock):
    """A partition of ~24 MiB, all of it tiered and deleted locally, read through a fresh manager whose block
    cache is empty."""
    archive = tmp_path / "archive"
    archive.mkdir()
    props = {"log.segment.bytes": str(SEGMENT), "log.segment.delete.delay.ms": "0",
             "remote.log.storage.system.enable": "true", "logfs.remote.dir": str(archive)}

    def open_manager(cache_bytes=256 << 20):
        manager = LogManager(str(tmp_path / "data"), BrokerConfig.from_properties(props), clock=clock)
        store = CountingStore(archive)
        rlm = RemoteLogManager(manager.data_dir, manager.logs, store, cache_bytes=cache_bytes)
        manager.remote = rlm
        return manager, rlm, store

    manager, rlm, _ = open_manager()
    manager.create_topic("t", 1)
    manager.set_topic_config("t", "remote.storage.enable", "true")
    manager.set_topic_config("t", "local.retention.bytes", "0")
    plog = manager.get_log("t", 0)
    data = lines(230_000)
    plog.append_lines(b"", data, len(data))
    plog.roll()
    rlm.sync(plog, clock.time_ms())
    assert len(plog.segments) == 1 and len(plog.remote_segments) >= 2
    manager.close()
    opened = []

    def reopen(cache_bytes=256 << 20):
        m, r, s = open_manager(cache_bytes)
        r.attach_cached()
        opened.append((m, r))
        return m.get_log("t", 0), r, s

    yield data, reopen
    for m, r in opened:
        r.close()
        m.close()


def read_all(view, size):
    out, pos = [], 0
    while True:
        chunk = view.read(pos, size)
        if not chunk:
            return b"".join(out)
        out.append(chunk)
        pos += len(chunk)


@pytest.mark.parametrize("size", [8 << 10, 1 << 20])
def test_a_sequential_reader_fetches_ahead_in_large_gets(tiered, size):
    data, reopen = tiered
    plog, rlm, store = reopen()
    view = open_view(plog)
    try:
        assert read_all(view, size) == data
    finally:
        view.release()
    gets = store.log_gets()
    fetched = sum(n for _, _, n in gets)
    stored = sum(s.size for s in plog.remote_segments)
    # Each byte once (no fetch repeated), in GETs far fewer than the blocks: the read-ahead's, of up to 4 MiB.
    assert fetched <= stored + 2 * BLOCK_BYTES * len(plog.remote_segments), (fetched, stored)
    assert len(gets) <= stored // BLOCK_BYTES // 4, (len(gets), stored // BLOCK_BYTES)
    assert max(n for _, _, n in gets) == READ_AHEAD_GET
    assert rlm.blocks.requests == len(gets)


def test_random_reads_fetch_only_their_blocks(tiered):
    data, reopen = tiered
    plog, rlm, store = reopen()
    rng = random.Random(3)
    view = live_view(plog)
    starts = [0]
    for line in data.splitlines(keepends=True)[:-1]:
        starts.append(starts[-1] + len(line))
    end = int(plog.remote_segments[-1].next_offset)
    for offset in rng.sample(range(end), 100):
        pos = view.position_of(offset)
        assert pos == starts[offset]
        assert data[pos:].startswith(view.read(pos, 100))
    gets = store.log_gets()
    assert len(gets) <= 2 * 100  # position_of and read each at most one GET; no read-ahead for a jumping reader
    assert all(n <= 2 * BLOCK_BYTES for _, _, n in gets), sorted(n for _, _, n in gets)[-5:]


def test_concurrent_sequential_readers_share_fetches(tiered):
    data, reopen = tiered
    plog, rlm, store = reopen()
    results = []

    def reader():
        view = open_view(plog)
        try:
            results.append(read_all(view, 64 << 10))
        finally:
            view.release()

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [data] * 3
    stored = sum(s.size for s in plog.remote_segments)
    fetched = sum(n for _, _, n in store.log_gets())
    assert fetched <= stored + 4 * BLOCK_BYTES * len(plog.remote_segments), (fetched, stored)


@pytest.mark.parametrize("size", [8 << 10, 256 << 10])
def test_the_cache_stays_bounded_while_reading_ahead(tiered, size):
    """A reader of 24 MiB through a 2 MiB cache: the cache's files (block files and the temporaries being written,
    sampled in a thread) never pass the limit, and each byte is fetched once: blocks fetched ahead are kept until
    the reader gets there, not evicted as soon as they arrive into a full cache."""
    data, reopen = tiered
    limit = 2 << 20
    plog, rlm, store = reopen(cache_bytes=limit)
    blocks_dir = plog.remote_segments[0].blocks_dir
    peak = {"used": 0, "disk": 0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            disk = 0
            for entry in os.scandir(blocks_dir) if os.path.isdir(blocks_dir) else ():
                try:
                    disk += entry.stat().st_size
                except FileNotFoundError:
                    pass
            peak["disk"] = max(peak["disk"], disk)

    sampler = threading.Thread(target=sample)
    sampler.start()
    view = open_view(plog)
    try:
        pos = 0
        while True:
            chunk = view.read(pos, size)
            if not chunk:
                break
            assert chunk == data[pos : pos + len(chunk)]
            pos += len(chunk)
            peak["used"] = max(peak["used"], rlm.blocks.used)
    finally:
        view.release()
        stop.set()
        sampler.join()
    assert pos == len(data)
    assert peak["used"] <= limit and 0 < peak["disk"] <= limit, peak
    fetched = sum(n for _, _, n in store.log_gets())
    stored = sum(s.size for s in plog.remote_segments)
    assert fetched <= stored + 2 * BLOCK_BYTES * len(plog.remote_segments), (fetched, stored)


def test_a_store_that_fails_fails_only_the_reads_that_need_it(tiered):
    data, reopen = tiered
    plog, rlm, store = reopen()
    view = open_view(plog)
    try:
        first = view.read(0, 1 << 20)
        second = view.read(len(first), 1 << 20)  # sequential: read-ahead starts
        assert first + second == data[: len(first) + len(second)]
        store.down = True
        with pytest.raises(RemoteUnavailableError):
            view.read(15 << 20, 1 << 20)  # far from anything fetched
        store.down = False
        assert view.read(15 << 20, 100) == data[15 << 20 : (15 << 20) + 100]
    finally:
        view.release()

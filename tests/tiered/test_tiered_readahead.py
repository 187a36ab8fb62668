"""Reading tiered history at the store's speed (issue 23), at the engine level over a counting directory store:
a sequential reader's fetches run ahead in larger GETs, and on into the next tiered segment, small reads are served
from what was fetched, a random read still fetches only its blocks, concurrent readers share fetches, the cache
stays bounded, and a store that fails only fails the reads that need it. Then through the mount against SeaweedFS:
8 KiB reads have the next segment fetched ahead, random reads leave only their blocks in the cache."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
import uuid

import pytest

from logfs.remote import DirectoryStore
from logfs.remote.api import RemoteUnavailableError
from logfs.storage import BrokerConfig, LogManager
from logfs.storage.tiered import block_cache, remote_segment
from logfs.storage.tiered.block_cache import BLOCK_BYTES
from logfs.storage.tiered.manager import RemoteLogManager
from logfs.view.text import live_view, open_view

from remote_store import s3_tiering

SEGMENT = 8 << 20
# The engine tests' read-ahead at a quarter of the daemon's (16 MiB GETs, 32 MiB window), so that its GETs are
# smaller than these 8 MiB segments (what they check does not depend on the scale).
READ_AHEAD_GET = 4 << 20


@pytest.fixture(autouse=True)
def quarter_scale_read_ahead(monkeypatch):
    for module in (remote_segment, block_cache):  # (the segment's read-ahead window, the cache's GETs)
        monkeypatch.setattr(module, "READ_AHEAD_GET", READ_AHEAD_GET)
    monkeypatch.setattr(remote_segment, "READ_AHEAD_MAX", 4 * READ_AHEAD_GET)


class CountingStore(DirectoryStore):
    def __init__(self, root):
        super().__init__(root)
        self.lock = threading.Lock()
        self.gets: list[tuple[str, int, int]] = []
        self.threads: list[str] = []
        self.down = False
        self.hold_ahead: threading.Event | None = None  # when set: GETs by other threads than the test's wait on it

    def get_range(self, key, start, length):
        if self.down:
            raise RemoteUnavailableError("the store is down (test)")
        with self.lock:
            self.gets.append((key, start, length))
            self.threads.append(threading.current_thread().name)
        held = self.hold_ahead
        if held is not None and threading.current_thread() is not threading.main_thread():
            held.wait(60)
        return super().get_range(key, start, length)

    def log_gets(self):
        with self.lock:
            return [g for g in self.gets if g[0].endswith(".log")]

    def log_gets_by_thread(self):
        """[(key, start, length, the name of the thread that sent it)] of the .log GETs, in order: a demand fetch
        is sent by the reader's own thread, read-ahead by the daemon's read-ahead threads."""
        with self.lock:
            return [(*g, t) for g, t in zip(self.gets, self.threads) if g[0].endswith(".log")]


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
        manager.attach_tiering(rlm)
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

    def close_all():  # (a restart: what reopen opened is closed)
        while opened:
            m, r = opened.pop()
            r.close()
            m.close()

    reopen.close_all = close_all
    yield data, reopen
    close_all()


def read_all(view, size):
    out, pos = [], 0
    while True:
        chunk = view.read(pos, size)
        if not chunk:
            return b"".join(out)
        out.append(chunk)
        pos += len(chunk)


def read_log(plog, size):
    """The whole partition through a view of its own (as a new open), in reads of ``size``."""
    view = open_view(plog)
    try:
        return read_all(view, size)
    finally:
        view.release()


@pytest.mark.parametrize("size", [8 << 10, 1 << 20])
def test_a_sequential_reader_fetches_ahead_in_large_gets(tiered, size):
    data, reopen = tiered
    plog, rlm, store = reopen()
    assert read_log(plog, size) == data
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
    me = threading.current_thread().name
    assert [g for g in store.log_gets_by_thread() if g[3] != me] == []  # nothing ahead, in this segment or the next


@pytest.mark.parametrize("size", [8 << 10, 1 << 20])
def test_read_ahead_goes_on_into_the_next_tiered_segment(tiered, size):
    """A forward reader nearing a tiered segment's end has the next segment's first blocks fetched ahead: every
    block of every segment after the first comes from read-ahead GETs (none from the reader's own thread, as when
    the window started again at each segment), each segment's first GET is a whole read-ahead GET from its start,
    and each byte is fetched once."""
    data, reopen = tiered
    plog, rlm, store = reopen()
    segments = plog.remote_segments
    assert len(segments) >= 3
    assert [s.successor for s in segments] == segments[1:] + [None]
    assert read_log(plog, size) == data
    gets = store.log_gets_by_thread()
    me = threading.current_thread().name
    first_key = segments[0].key
    later = [g for g in gets if g[0] != first_key]
    assert later and all(t != me for _, _, _, t in later), [g for g in later if g[3] == me][:5]
    for seg in segments[1:]:
        mine = [(start, n) for key, start, n, _ in gets if key == seg.key]
        assert mine[0] == (0, min(READ_AHEAD_GET, seg.size)), mine[:3]
        assert sum(n for _, n in mine) == seg.size, (seg.key, mine)  # each byte once
    assert sum(n for _, _, n, _ in gets) <= sum(s.size for s in segments) + 2 * BLOCK_BYTES


def test_read_ahead_into_the_next_segment_is_one_get_and_keeps_another_readers_window(tiered):
    """A reader that stops at the end of a segment has fetched at most one read-ahead GET of the next; and it
    does not take over the read-ahead of a reader already in the middle of that next segment."""
    data, reopen = tiered
    plog, rlm, store = reopen()
    first, second = plog.remote_segments[:2]
    end_of_first = len(b"".join(data.splitlines(keepends=True)[:first.next_offset]))  # (no lookup: no GET)
    view = open_view(plog)
    try:
        pos = 0
        while pos < end_of_first:
            chunk = view.read(pos, min(64 << 10, end_of_first - pos))
            assert chunk == data[pos:pos + len(chunk)]
            pos += len(chunk)
        # Let the read-ahead in flight land (it is what is measured), without reading it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and rlm.blocks._inflight:
            time.sleep(0.01)
        got = [(start, n) for key, start, n in store.log_gets() if key == second.key]
        assert got == [(0, min(READ_AHEAD_GET, second.size))], got
        # Another reader is now 2 MiB into the second segment and reading ahead there.
        other = open_view(plog)
        try:
            at = end_of_first + (2 << 20)
            for _ in range(40):  # 2.5 MiB forward: past READ_AHEAD_AFTER, its window is open
                chunk = other.read(at, 64 << 10)
                assert chunk == data[at:at + len(chunk)]
                at += len(chunk)
            state = second._window, second._ahead_to, second._prev_first, second._next_block, second._run
            assert state[0] > 0 and state[3] > READ_AHEAD_GET // BLOCK_BYTES  # reading ahead, past what was handed on
            first._handed_on = False  # the first reader's run hands on again ...
            first._read_ahead((first.size - 1) // BLOCK_BYTES, (first.size - 1) // BLOCK_BYTES)
            # ... and leaves the other's state alone (its next read is not taken for a jump)
            assert (second._window, second._ahead_to, second._prev_first, second._next_block, second._run) == state
        finally:
            other.release()
    finally:
        view.release()


def test_concurrent_sequential_readers_share_fetches(tiered):
    data, reopen = tiered
    plog, rlm, store = reopen()
    results = []

    def reader():
        results.append(read_log(plog, 64 << 10))

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


def test_a_reader_waits_for_a_fetch_in_flight_no_longer_than_for_its_own(tiered):
    """A read-ahead GET is larger than a reader's own, so a store that trickles (or stalls) may hold it far longer
    than the bound a read promises (EIO within about 10 s). A reader waiting for a block such a GET has in flight
    gives up after its own bound (the wait base, 5 s in the daemon, plus the block at 64 KiB/s), then reads again
    once the store answers."""
    data, reopen = tiered
    plog, rlm, store = reopen()
    rlm.blocks.wait_base_s = 0.5
    view = open_view(plog)
    release = threading.Event()
    try:
        first = view.read(0, 1 << 20)
        store.hold_ahead = release  # read-ahead's GETs (sent from here on) hang
        second = view.read(len(first), 1 << 20)  # sequential: read-ahead starts
        assert first + second == data[: len(first) + len(second)]
        time.sleep(0.2)
        ahead = [g for g in store.log_gets_by_thread() if g[3] != threading.main_thread().name]
        assert ahead, "no read-ahead GET was sent"
        position = ahead[0][1] - (ahead[0][1] % BLOCK_BYTES)  # (the segment's own position: its first segment)
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match="in flight did not complete"):
            view.read(position, 8192)
        waited = time.monotonic() - start
        assert 0.5 <= waited < 0.5 + BLOCK_BYTES / (64 << 10) + 2, waited
    finally:
        store.hold_ahead = None
        release.set()
        view.release()
    view = open_view(plog)
    try:
        assert view.read(position, 8192) == data[position: position + 8192]
    finally:
        view.release()


# -- through the mount, against SeaweedFS -------------------------------------------------------------------------

MOUNT_SEGMENT = 4 << 20


def _mount_opts(seaweed, prefix):
    return s3_tiering(seaweed, prefix, segment_bytes=MOUNT_SEGMENT, interval_ms=200) + (
        f"logfs.remote.cache.bytes={64 << 20}",)


def _tiered_mount(mount_logfs, seaweed, prefix):
    """A mount whose partition t/0 holds ~20 MB, all but the last segment tiered and deleted locally, remounted
    with an empty block cache. Returns (mount, the text appended, the tiered segments' manifest entries)."""
    import json

    from harness import sh, wait_for

    options = _mount_opts(seaweed, prefix)
    fs = mount_logfs(*options)
    os.mkdir(fs.path("t"))
    sh(f"setfattr -n user.logfs.config.remote.storage.enable -v true {fs.path('t')}")
    sh(f"setfattr -n user.logfs.config.local.retention.bytes -v 0 {fs.path('t')}")
    data = lines(200_000)
    i = 0
    while i < len(data):  # whole lines per append (a held partial line becomes a record at close)
        cut = data.index(b"\n", min(i + (1 << 20), len(data) - 1)) + 1
        fs.append("t/0", data[i:cut])
        i = cut
    wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= 4
             and int(fs.getx("t/0", "segment_count")) == 1, 120, interval=0.3, what="the upload")
    fs.unmount()
    remote = fs.data / "t-0" / "logfs-remote"
    with open(remote / "manifest.json") as f:
        segments = json.load(f)["segments"]
    shutil.rmtree(remote / "blocks", ignore_errors=True)
    fs.mount(*options)
    return fs, data, segments


def _block_files(fs, key):
    """Block numbers of ``key`` in the mount's block cache (run files named by a hash of the key and the numbers
    of their first and last blocks, ``<hash>.<first>-<last>``, or ``<hash>.<block>``)."""
    import hashlib

    stem = hashlib.sha1(key.encode()).hexdigest()[:24] + "."
    blocks = fs.data / "t-0" / "logfs-remote" / "blocks"
    names = os.listdir(blocks) if blocks.is_dir() else []
    found = []
    for name in names:
        if name.startswith(stem):
            first, _, last = name[len(stem):].partition("-")
            found += range(int(first), int(last or first) + 1)
    return sorted(found)


def test_through_the_mount_8k_reads_have_the_next_segment_fetched_ahead(mount_logfs, creds):
    """A reader of 8 KiB requests that stops at the end of the first tiered segment already has the second
    segment's first blocks in the cache (fetched ahead while it read the first), though it never read there; the
    rest then reads back exact."""
    from harness import wait_for

    fs, data, segments = _tiered_mount(mount_logfs, creds, "xseg-" + uuid.uuid4().hex[:8])
    first, second = segments[0], segments[1]
    assert first["base_offset"] == 0
    end_of_first = len(b"".join(data.splitlines(keepends=True)[:first["next_offset"]]))
    with open(fs.path("t", 0), "rb", buffering=0) as f:
        got = []
        pos = 0
        while pos < end_of_first:
            chunk = f.read(min(8192, end_of_first - pos))
            assert chunk
            got.append(chunk)
            pos += len(chunk)
        assert b"".join(got) == data[:end_of_first]
        key = second["objects"]["log"]["key"]
        # (a GET of 4 MiB in flight: give it time to land, without reading)
        wait_for(lambda: len(_block_files(fs, key)) >= 4, 30, interval=0.05, what="the next segment's blocks")
        assert _block_files(fs, key)[:4] == [0, 1, 2, 3]
        rest = []
        while True:
            chunk = f.read(8192)
            if not chunk:
                break
            rest.append(chunk)
    assert b"".join(got + rest) == data


def test_through_the_mount_random_reads_fetch_no_more_than_their_blocks(mount_logfs, creds):
    """Random position lookups and reads at them (each a jump) leave at most the blocks they touched in the
    cache: nothing fetched ahead, in their segment or the next."""
    fs, data, segments = _tiered_mount(mount_logfs, creds, "xrnd-" + uuid.uuid4().hex[:8])
    starts = [0]
    for line in data.splitlines(keepends=True)[:-1]:
        starts.append(starts[-1] + len(line))
    rng = random.Random(11)
    tiered_end = segments[-1]["next_offset"]
    with open(fs.path("t", 0), "rb", buffering=0) as f:
        for offset in rng.sample(range(tiered_end), 20):
            pos = int(fs.getx("t/0", f"position.{offset}"))
            assert pos == starts[offset]
            assert data[pos:].startswith(os.pread(f.fileno(), 100, pos))
    blocks = sum(len(_block_files(fs, s["objects"]["log"]["key"])) for s in segments)
    assert 0 < blocks <= 2 * 20, blocks


def test_blocks_are_read_only_views_of_one_get_correct_at_block_boundaries_and_the_last_block(tiered, monkeypatch):
    """A GET of several blocks is handed out as read-only views of the one buffer its body was read into: the
    bytes are the object's at every block boundary and in the object's last, partial, block; read back from the
    block files (written by writev with their CRC) they are the same; and the memory of blocks kept in memory is
    counted by the GET buffers they hold, within HOT_BYTES."""
    monkeypatch.setattr(block_cache, "HOT_BYTES", 3 * BLOCK_BYTES)
    data, reopen = tiered
    plog, rlm, store = reopen()
    seg = plog.remote_segments[0]
    obj = store.get_range(seg.key, 0, seg.size)
    assert len(obj) == seg.size and seg.size % BLOCK_BYTES  # the last block is partial
    last = (seg.size - 1) // BLOCK_BYTES
    blocks = rlm.blocks.get_blocks(seg.blocks_dir, seg.key, last - 3, last, seg._block_length, seg._fetch)
    assert store.log_gets()[1:] == [(seg.key, (last - 3) * BLOCK_BYTES, seg.size - (last - 3) * BLOCK_BYTES)]
    assert all(isinstance(b, memoryview) and b.readonly and b.obj is blocks[0].obj for b in blocks)
    with pytest.raises(TypeError):
        blocks[0][0] = 0
    assert b"".join(blocks) == obj[(last - 3) * BLOCK_BYTES:]
    assert len(blocks[-1]) == seg.size - last * BLOCK_BYTES
    # Kept in memory: the blocks of that one GET, counted as its whole buffer (4 blocks' worth > HOT_BYTES: the
    # oldest dropped until the buffer no longer counts).
    cache = rlm.blocks
    owners = {id(b.obj if isinstance(b, memoryview) else b): len(b.obj if isinstance(b, memoryview) else b)
              for b in cache._hot.values()}
    assert cache._hot_used == sum(owners.values()) <= block_cache.HOT_BYTES
    for position, length in ((BLOCK_BYTES - 10, 20), ((last - 2) * BLOCK_BYTES - 1, 2), (last * BLOCK_BYTES, 7),
                             (seg.size - 100, 500), ((last - 3) * BLOCK_BYTES, 4 * BLOCK_BYTES)):
        assert seg.read(position, length) == obj[position:position + length], (position, length)
    with cache.lock:  # out of memory: the blocks now come from the block files
        cache._hot.clear()
        cache._hot_buffers.clear()
        cache._hot_used = 0
    cache.last_block = None  # (nor the block read last)
    gets = len(store.log_gets())
    for position, length in ((seg.size - 100, 500), ((last - 2) * BLOCK_BYTES - 1, 2),
                             ((last - 3) * BLOCK_BYTES, 4 * BLOCK_BYTES)):
        assert seg.read(position, length) == obj[position:position + length], (position, length)
    assert len(store.log_gets()) == gets
    files = os.listdir(seg.blocks_dir)
    assert files and not [n for n in files if ".tmp" in n]
    for name in files:  # a run file: each block and its CRC (the last block of the object is partial)
        first, _, last = name.rpartition(".")[2].partition("-")
        first, last = int(first), int(last or first)
        sizes = [min(BLOCK_BYTES, seg.size - b * BLOCK_BYTES) + 4 for b in range(first, last + 1)]
        assert os.path.getsize(os.path.join(seg.blocks_dir, name)) == sum(sizes), name


def _settled(cache, timeout=30.0):
    """Wait until no fetch is in flight: a read-ahead GET hands its blocks to the reader as they arrive, and writes
    their files after that, so the last ones may still be being written when the reader is done."""
    deadline = time.monotonic() + timeout
    while cache._inflight:
        assert time.monotonic() < deadline, "fetches still in flight"
        time.sleep(0.01)


def test_the_block_cache_survives_a_restart(tiered):
    """After a restart the cache takes its block files in, and a reader of the whole log sends no GET but for the
    blocks no longer there: one evicted, one cut short (as a power cut leaves an unsynced file), each fetched
    again alone."""
    data, reopen = tiered
    plog, rlm, store = reopen()
    assert read_log(plog, 1 << 20) == data
    blocks_dir = plog.remote_segments[0].blocks_dir
    cache = rlm.blocks
    _settled(cache)
    names = sorted(os.listdir(blocks_dir))
    assert cache.used == sum(os.path.getsize(os.path.join(blocks_dir, n)) for n in names)
    with cache.lock:
        cache._remove(os.path.join(blocks_dir, names[3]))
    assert not os.path.exists(os.path.join(blocks_dir, names[3]))
    with open(os.path.join(blocks_dir, names[7]), "r+b") as f:
        f.truncate(BLOCK_BYTES // 2)
    reopen.close_all()
    plog, rlm, store = reopen()
    assert read_log(plog, 1 << 20) == data
    gets = store.log_gets()
    assert len(gets) == 2 and all(n <= BLOCK_BYTES for _, _, n in gets), gets
    _settled(rlm.blocks)
    assert rlm.blocks.used == sum(os.path.getsize(os.path.join(blocks_dir, n)) for n in os.listdir(blocks_dir))


def test_a_reader_is_served_the_blocks_of_a_read_ahead_get_as_they_arrive(tmp_path):
    """Read-ahead hands each block of its GET to the readers waiting for it as soon as the block's bytes have
    arrived (``fetch``'s ``ready``): a reader of the GET's first block does not wait for the rest of the body; the
    blocks join the cache once the whole GET is in, and a GET that fails midway fails only the blocks it had not
    delivered."""
    cache = block_cache.BlockCache(64 << 20)
    directory = str(tmp_path / "blocks")
    obj = os.urandom(6 * BLOCK_BYTES)
    arrived = threading.Event()
    finish = threading.Event()
    failing = [False]

    def fetch(a, b, ready=None):
        blocks = [obj[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] for i in range(a, b + 1)]
        for i, data in enumerate(blocks[:2]):
            ready(i, data)  # the first two blocks are in; the rest is on its way
        arrived.set()
        assert finish.wait(30)
        if failing[0]:
            raise RemoteUnavailableError("cut off (test)")
        for i in range(2, len(blocks)):
            ready(i, blocks[i])
        return blocks

    length = lambda block: BLOCK_BYTES  # noqa: E731
    assert cache.prefetch(directory, "k", 0, 5, fetch) == 1
    assert arrived.wait(30)
    started = time.monotonic()
    got = cache.get_blocks(directory, "k", 0, 1, length, fetch)  # (in this thread: not the request thread)
    assert time.monotonic() - started < 5 and b"".join(got) == obj[:2 * BLOCK_BYTES]
    assert not os.path.isdir(directory) or not os.listdir(directory)  # not cached yet: the GET goes on
    finish.set()
    deadline = time.monotonic() + 30
    while cache._inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(os.listdir(directory)) == 6 and cache.get_blocks(directory, "k", 2, 5, length, fetch) == [
        obj[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] for i in range(2, 6)]
    # A GET that fails after its first blocks: those were served and stay good; the others fail their waiters.
    arrived.clear()
    finish.clear()
    failing[0] = True
    cache.drop(directory, "k")
    assert cache.prefetch(directory, "k2", 0, 3, fetch) == 1
    assert arrived.wait(30)
    assert b"".join(cache.get_blocks(directory, "k2", 0, 0, length, fetch)) == obj[:BLOCK_BYTES]
    waiter = {}

    def wait_for_block_3():
        try:
            waiter["got"] = cache.get_blocks(directory, "k2", 3, 3, length, fetch)
        except BaseException as exc:  # noqa: BLE001
            waiter["error"] = exc

    t = threading.Thread(target=wait_for_block_3)
    t.start()
    time.sleep(0.2)
    finish.set()
    t.join(30)
    assert isinstance(waiter.get("error"), RemoteUnavailableError), waiter
    cache.close()

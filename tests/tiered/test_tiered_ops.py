"""The FUSE Operations over a tiered log, without the kernel: a read or xattr that needs data not cached runs in a
worker thread, and other requests are answered meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import trio

from logfs.fuse.handles import PartitionHandle
from logfs.fuse.operations import Operations
from logfs.remote import DirectoryStore
from logfs.storage import BrokerConfig, LogManager
from logfs.storage.tiered.manager import RemoteLogManager

from ops_helpers import OpsFS, run_blocking


class SlowStore(DirectoryStore):
    delay = 0.0
    fetched_on: set = set()

    def get_range(self, key, start, length):
        self.fetched_on.add(threading.current_thread().name)
        time.sleep(self.delay)
        return super().get_range(key, start, length)


async def test_uncached_tiered_reads_run_in_a_worker_thread(tmp_path, clock):
    archive = tmp_path / "archive"
    archive.mkdir()
    props = {"log.segment.bytes": "4096", "remote.log.storage.system.enable": "true",
             "logfs.remote.dir": str(archive), "log.segment.delete.delay.ms": "0"}
    manager = LogManager(str(tmp_path / "data"), BrokerConfig.from_properties(props), clock=clock)
    store = SlowStore(archive)
    rlm = RemoteLogManager(manager.data_dir, manager.logs, store, cache_bytes=1 << 20)
    manager.attach_tiering(rlm)
    fs = OpsFS(Operations(manager, run_blocking=run_blocking))
    try:
        await fs.mkdir("t")
        await fs.setconfig("t", "remote.storage.enable", "true")
        await fs.setconfig("t", "local.retention.bytes", "0")
        data = b"".join(b"line %05d\n" % i for i in range(3000))
        await fs.append("t/0", data)
        plog = manager.get_log("t", 0)
        plog.roll()
        await trio.to_thread.run_sync(rlm.sync, plog, clock.time_ms())
        assert len(plog.segments) == 1 and await fs.getx("t/0", "remote_segment_count") != "0"
        assert (await fs.getattr("t/0")).st_size == len(data)  # no fetch needed for st_size
        assert store.fetched_on == set()
        pos = int(await fs.getx("t/0", "position.1234"))  # fetched in a worker thread
        assert data[pos:].startswith(b"line 01234\n")
        assert threading.main_thread().name not in store.fetched_on and store.fetched_on
        assert await fs.cat("t/0") == data
        # A slow fetch holds only its own request: a stat is answered meanwhile.
        for path in (Path(plog.directory) / "logfs-remote" / "blocks").iterdir():
            path.unlink()
        rlm.blocks._lru.clear()
        rlm.blocks._hot.clear()  # (and the blocks kept in memory)
        store.delay = 1.0
        fh = await fs.open("t/0")
        answered = []
        async with trio.open_nursery() as nursery:
            async def slow_read():
                answered.append(("read", await fs.read(fh, 0, 100)))

            nursery.start_soon(slow_read)
            await trio.sleep(0.1)
            start = trio.current_time()
            st = await fs.getattr("t/0")
            answered.append(("stat", trio.current_time() - start))
        assert answered[0][0] == "stat" and answered[0][1] < 0.5 and st.st_size == len(data)
        assert answered[1] == ("read", data[:100])
        await fs.release(fh)
    finally:
        fs.ops.release_all()
        manager.close()


async def test_a_view_reading_in_a_worker_thread_is_left_to_it(tmp_path, clock, monkeypatch):
    """Issue 42: while a handle's read of tiered data runs in a worker thread, the requests answered meanwhile on
    the request thread (an fstat of its inode once a DeleteRecords retired it, a getxattr answered in its view)
    neither extend, measure nor release its view: a view is not thread-safe (it was extended under the read, and
    segments it read were let go), and its size is the one last measured until the read is done."""
    archive = tmp_path / "archive"
    archive.mkdir()
    props = {"log.segment.bytes": "4096", "remote.log.storage.system.enable": "true",
             "logfs.remote.dir": str(archive), "log.segment.delete.delay.ms": "0"}
    manager = LogManager(str(tmp_path / "data"), BrokerConfig.from_properties(props), clock=clock)
    store = SlowStore(archive)
    store.fetched_on = set()
    rlm = RemoteLogManager(manager.data_dir, manager.logs, store, cache_bytes=1 << 20)
    manager.attach_tiering(rlm)
    fs = OpsFS(Operations(manager, run_blocking=run_blocking))
    try:
        await fs.mkdir("t")
        await fs.setconfig("t", "remote.storage.enable", "true")
        await fs.setconfig("t", "local.retention.bytes", "0")
        data = b"".join(b"line %05d\n" % i for i in range(3000))
        await fs.append("t/0", data)
        plog = manager.get_log("t", 0)
        plog.roll()
        await trio.to_thread.run_sync(rlm.sync, plog, clock.time_ms())
        assert len(plog.segments) == 1  # every line is in the bucket only, and none is cached
        ino = await fs.inode("t/0")
        fh = await fs.open("t/0")
        handle = fs.ops.handles.open[fh]
        more = b"".join(b"line %05d\n" % i for i in range(3000, 3400))
        await fs.append("t/0", more)  # (rolled segments the view has not taken yet)
        reading = threading.Event()
        touched = []  # what the request thread did to the view while the worker read through it
        for name in ("extend", "length", "release_passed", "read"):
            def spy(*args, _name=name, _real=getattr(handle.view, name), **kwargs):
                if reading.is_set() and threading.current_thread() is threading.main_thread():
                    touched.append(_name)
                return _real(*args, **kwargs)
            setattr(handle.view, name, spy)
        real_read = PartitionHandle.read

        def read_in_worker(self, offset, size):
            if self is not handle or threading.current_thread() is threading.main_thread():
                return real_read(self, offset, size)
            reading.set()
            try:
                return real_read(self, offset, size)
            finally:
                reading.clear()

        monkeypatch.setattr(PartitionHandle, "read", read_in_worker)
        store.delay = 1.0
        got = {}
        async with trio.open_nursery() as nursery:
            async def slow_read():
                got["read"] = await fs.read(fh, 0, 100)

            async def view_xattr():  # (the name's inode is still the handle's: answered in its view)
                got["xattr"] = await fs.getx("t/0", "log_start_offset")

            nursery.start_soon(slow_read)
            await trio.sleep(0.2)
            assert reading.is_set()
            nursery.start_soon(view_xattr)
            await trio.sleep(0.1)
            # DeleteRecords (to a segment's base: nothing to measure, nothing fetched): the name moves on
            await fs.setxattr("t/0", "user.logfs.log_start_offset", b"%d" % plog.remote_segments[1].base_offset)
            assert (await fs.getattr("t/0")).st_ino != ino
            st = await fs.ops.getattr(ino, None)  # the handle's own inode: an fstat of its descriptor
            assert st.st_size >= len(data)
            assert reading.is_set(), "the read was over before the request thread's calls: nothing checked"
        assert touched == []
        assert got == {"read": data[:100], "xattr": "0"}
        assert (await fs.ops.getattr(ino, None)).st_size == len(data + more)  # (measured again once it is done)
        await fs.release(fh)
    finally:
        fs.ops.release_all()
        manager.close()

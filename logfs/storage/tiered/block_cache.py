"""The bounded on-disk cache of the byte ranges of remote objects that tiered reads fetched, and its read-ahead.

A remote ``.log`` is read in :data:`BLOCK_BYTES` blocks through :class:`BlockCache` (LRU, at most
``logfs.remote.cache.bytes`` of files in the partition directories; the most recent also in memory): a read costs
one ranged GET per run of consecutive blocks it overlaps that are not cached, never the whole segment. Whether a
range is cached is asked before a read (:meth:`BlockCache.cached`): the FUSE layer reads on its request thread only
what is, and in a worker thread otherwise (logfs.view.text.SegmentView.in_memory).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import struct
import threading
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Callable

from crc32c import crc32c

from ...remote.api import RemoteUnavailableError

#: Unit of fetching and caching a remote .log: a small read costs one ranged GET of at most this many bytes.
BLOCK_BYTES = 256 * 1024
#: Memory kept of the most recently used blocks, over all partitions (on top of the disk cache): two read-ahead GETs'
#: buffers (a buffer is counted whole while any block of it is kept).
HOT_BYTES = 64 << 20
#: Read-ahead for a sequential reader of a tiered segment: the window starts at READ_AHEAD_FIRST past what it read
#: and doubles with each sequential read up to READ_AHEAD_MAX (and a quarter of the cache), going on into the next
#: tiered segment at the end of one (RemoteLogSegment.successor); a read elsewhere ends it. GETs of at most
#: READ_AHEAD_GET bytes (never across objects), READ_AHEAD_THREADS in flight at once over the whole daemon.
READ_AHEAD_FIRST = 1 << 20
READ_AHEAD_AFTER = 4  # blocks (1 MiB) a reader must move forward by, read after read, before read-ahead starts
#: (128 MiB: four 32 MiB GETs in flight. Against a store 40 MB/s per connection away, a cold follower read went
#: from 73-75 to 96-97 MB/s with it, against 64 MiB; the same on a local SeaweedFS, docs/benchmarks.md)
READ_AHEAD_MAX = 128 << 20
READ_AHEAD_GET = 32 << 20  # (16 MiB GETs and a 32 MiB window: 0.37-0.43 of the store's GET rate, 32/64: 0.43-0.47)
READ_AHEAD_THREADS = 4
_CRC = struct.Struct(">I")  # the trailer of a cached block file
#: A block's bytes: a read-only view of the GET's buffer it came in, or of the block file's bytes read back.
Block = bytes | memoryview

log = logging.getLogger(__name__)


WAIT_BASE_S = 5.0  # the read store's read timeout (logfs.service.tiering.READ_TIMEOUTS)
WAIT_RATE = 64 << 10  # bytes/s: the S3 store's minimum transfer rate (logfs.remote.s3.MIN_TRANSFER_RATE)


class BlockCache:
    """Blocks of remote objects as files (in each partition's ``logfs-remote/blocks/``), least recently used
    evicted beyond ``limit`` bytes over all partitions; the most recently used also in memory (:data:`HOT_BYTES`),
    so small reads inside a block cost no file read; and read-ahead (:meth:`prefetch`) in worker threads.

    Thread-safe. A block file is the block's bytes and their CRC-32C (4 bytes, big-endian), written in
    place by one writev (it joins the cache only once written; temporaries of older versions are removed by
    :meth:`scan`), not fsynced: a block torn or emptied by a power cut fails its CRC when read, is removed, and is
    fetched again. It is named by a hash of the object key and the block number. The cache
    survives restarts: :meth:`scan` takes in a directory's blocks, oldest modification time first.

    A block being fetched (on demand or ahead) is in flight once: a reader that needs it waits for that fetch
    instead of sending its own request, so concurrent readers of one segment share fetches. A block fetched ahead
    enters as the most recently used (its reader is on its way to it: a full cache must not evict it on arrival);
    the blocks a reader fetched ahead and never read, once it jumps elsewhere, become the first evicted
    (:meth:`demote`). A block file being written counts against the limit from the start (room is made before it is
    written), so the files on disk stay within it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # path -> bytes on disk; the oldest first
        self.used = 0
        self._hot: OrderedDict[str, Block] = OrderedDict()  # path -> the block, in memory
        # A block in memory may be a view of a whole GET's buffer (RemoteLogSegment._fetch): each buffer is
        # counted once, whole, while any of its blocks is kept, so HOT_BYTES bounds the memory really held.
        self._hot_buffers: dict[int, list[int]] = {}  # id of the buffer -> [blocks kept of it, its bytes]
        self._hot_used = 0
        self._dirs: set[str] = set()  # blocks directories known to exist (made once, not per block)
        self._ahead: set[str] = set()  # fetched ahead, not read yet
        self._reserved = 0  # bytes of block files being written (their temporaries), counted against the limit
        self._inflight: dict[str, Future] = {}
        self._pool: _DaemonPool | None = None
        # How long a reader waits for a block another fetch has in flight (read-ahead's GETs are larger than the
        # reader's own would be, and a store that trickles bytes may take their own, longer, bound): this plus
        # the block at WAIT_RATE, the bound of a GET of that block alone. Then the read fails (EIO).
        self.wait_base_s = WAIT_BASE_S
        # (segment, block number, its bytes) read last, over all segments: a reader of small requests inside one block
        # (32 of 8 KiB) needs no lookup (RemoteLogSegment._blocks). One tuple, replaced whole by any thread; one
        # block, so memory stays bounded whatever the number of segments or readers.
        self.last_block: tuple | None = None
        self.requests = 0  # ranged GETs sent (demand and ahead), and their bytes: for tests and the bench
        self.fetched_bytes = 0

    def scan(self, directory: str) -> None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        found = []
        for name in names:
            path = os.path.join(directory, name)
            if ".tmp-" in name:
                os.unlink(path)
                continue
            st = os.stat(path)
            found.append((st.st_mtime, path, st.st_size))
        with self.lock:
            for _, path, size in sorted(found):
                self.used += size - self._lru.pop(path, 0)
                self._lru[path] = size
            self._evict()

    @staticmethod
    def _path(directory: str, key: str, block: int) -> str:
        return _block_stem(directory, key) + str(block)

    def _cached(self, path: str, length: int) -> Block | None:
        with self.lock:
            data = self._hot.get(path)
            if data is not None:
                self._hot.move_to_end(path)
                self._read(path)
                return data
            if path not in self._lru:
                return None
            self._read(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None  # evicted meanwhile
        if len(data) == length + _CRC.size and _CRC.unpack_from(data, length)[0] == crc32c(
                memoryview(data)[:length]):
            data = memoryview(data)[:length]  # (no copy without the CRC)
            with self.lock:
                self._keep_hot(path, data)
            return data
        # Torn by a power cut (blocks are not fsynced: a lost one is fetched again) or damaged: never used.
        self._forget(path)
        return None

    def _read(self, path: str) -> None:
        """(lock held) ``path`` was read: most recently used, no longer 'ahead'."""
        if path in self._lru:
            self._lru.move_to_end(path)
        self._ahead.discard(path)

    def _keep_hot(self, path: str, data: Block) -> None:
        """(lock held)"""
        self._drop_hot(path)
        self._hot[path] = data
        owner = data.obj if isinstance(data, memoryview) else data
        counted = self._hot_buffers.get(id(owner))
        if counted is None:
            self._hot_buffers[id(owner)] = [1, len(owner)]
            self._hot_used += len(owner)
        else:
            counted[0] += 1
        while self._hot_used > HOT_BYTES and self._hot:
            self._drop_hot(next(iter(self._hot)))

    def _drop_hot(self, path: str) -> None:
        """(lock held) ``path``'s block no longer kept in memory (its buffer's bytes uncounted with its last)."""
        data = self._hot.pop(path, None)
        if data is None:
            return
        owner = data.obj if isinstance(data, memoryview) else data
        counted = self._hot_buffers[id(owner)]
        counted[0] -= 1
        if not counted[0]:
            del self._hot_buffers[id(owner)]
            self._hot_used -= counted[1]

    def _store(self, path: str, data: Block, ahead: bool = False) -> None:
        size = len(data) + _CRC.size
        if size > self.limit:
            return
        with self.lock:  # room first: the block file counts from the start
            self._reserved += size
            self._evict()
        try:
            # Written in place (no temporary, no rename: a new file is the costly part here, see
            # docs/benchmarks.md): one writer per block at a time (in flight once), and the file joins the cache
            # only once complete; one cut short (a crash) fails its CRC when read and is fetched again.
            directory = os.path.dirname(path)
            if directory not in self._dirs:
                os.makedirs(directory, exist_ok=True)
                self._dirs.add(directory)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # the directory was removed meanwhile
                os.makedirs(directory, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, [data, _CRC.pack(crc32c(data))])
            finally:
                os.close(fd)
        except BaseException:
            with self.lock:
                self._reserved -= size
            raise
        with self.lock:  # from reserved to used at once: never on disk and counted nowhere (a reservation could
            self._reserved -= size  # then pass the limit: 8 full blocks in a cache of 8 blocks' bytes were seen)
            self.used += size - self._lru.pop(path, 0)
            self._lru[path] = size
            if ahead:  # not read yet, and the most recently used all the same: its reader is on its way
                self._ahead.add(path)
            self._keep_hot(path, data)
            self._evict()

    def _forget(self, path: str) -> None:
        with self.lock:
            self._remove(path)

    def _remove(self, path: str) -> None:
        """(lock held) One block gone: from the disk cache, memory and the books."""
        self.used -= self._lru.pop(path, 0)
        self._drop_hot(path)
        self._ahead.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _fetch_run(self, paths: list[str], futures: list[Future], a: int, b: int,
                   fetch: Callable[[int, int], list[Block]], ahead: bool) -> None:
        """Fetch blocks a..b (one request), store them, and settle their futures (with the error, if it failed).
        Read-ahead settles each block's future as soon as its bytes have arrived (``fetch``'s ``ready``), so a
        reader waiting for the first block of a large GET is served while the rest arrives; a waiter finds the
        settled future until the block is stored (it leaves the in-flight set only after that)."""
        try:
            if ahead:
                blocks = fetch(a, b, lambda i, data: _settle(futures[i], data))
            else:
                blocks = fetch(a, b)
            with self.lock:
                self.requests += 1
                self.fetched_bytes += sum(len(d) for d in blocks)
            for path, future, data in zip(paths, futures, blocks):
                self._store(path, data, ahead=ahead)
                _settle(future, data)
        except BaseException as exc:
            for future in futures:
                _settle(future, exc=exc)
            if not ahead:
                raise
            log.debug("read-ahead of blocks %d..%d failed: %s", a, b, exc)
        finally:
            with self.lock:
                for path, future in zip(paths, futures):
                    if self._inflight.get(path) is future:
                        del self._inflight[path]

    def get_blocks(self, directory: str, key: str, first: int, last: int, length_of: Callable[[int], int],
                   fetch: Callable[[int, int], list[Block]]) -> list[Block]:
        """Blocks ``first..last`` of ``key``: from memory or the disk cache; the missing ones by ``fetch(a, b)``
        (blocks a..b in one request) per run of consecutive missing blocks not already in flight, then cached; a
        block in flight (another reader's fetch, or read-ahead) is waited for. May wait for the store: a caller
        that must not asks :meth:`cached` first."""
        found: dict[int, Block] = {}
        missing: list[int] = []
        for block in range(first, last + 1):
            data = self._cached(self._path(directory, key, block), length_of(block))
            if data is None:
                missing.append(block)
            else:
                found[block] = data
        if not missing:
            return [found[block] for block in range(first, last + 1)]
        waits: dict[int, Future] = {}
        mine: list[tuple[int, str, Future]] = []
        for attempt in range(3):
            # Looked at again, all under the lock: a fetch that ended since the look above has its blocks cached
            # (a fetched block joins the cache before it leaves the in-flight set), not fetched again here.
            late: list[int] = []
            with self.lock:
                for block in missing:
                    path = self._path(directory, key, block)
                    data = self._hot.get(path)
                    if data is not None:
                        self._hot.move_to_end(path)
                        self._read(path)
                        found[block] = data
                        continue
                    future = self._inflight.get(path)
                    if future is None and path in self._lru and attempt < 2:
                        late.append(block)  # in its block file: read below, outside the lock
                        continue
                    if future is None:
                        future = self._inflight[path] = Future()
                        mine.append((block, path, future))
                    waits[block] = future
            missing = []
            for block in late:
                data = self._cached(self._path(directory, key, block), length_of(block))
                if data is None:
                    missing.append(block)  # evicted or torn meanwhile: once more
                else:
                    found[block] = data
            if not missing:
                break
        mine.sort()
        runs: list[list[tuple[int, str, Future]]] = []
        for item in mine:
            if runs and runs[-1][-1][0] == item[0] - 1:
                runs[-1].append(item)
            else:
                runs.append([item])
        try:
            for run in runs:
                self._fetch_run([p for _, p, _ in run], [f for _, _, f in run], run[0][0], run[-1][0], fetch, False)
        finally:
            for block, path, future in mine:  # a run not reached (an earlier one failed): nobody waits in vain
                if not future.done():
                    _settle(future, exc=RemoteUnavailableError(f"{key} block {block}: its fetch was not made"))
                    with self.lock:
                        if self._inflight.get(path) is future:
                            del self._inflight[path]
        for block, future in waits.items():
            bound = self.wait_base_s + length_of(block) / WAIT_RATE
            try:
                found[block] = future.result(timeout=bound)
            except FutureTimeoutError:
                raise RemoteUnavailableError(f"{key} block {block}: the fetch in flight did not complete within "
                                             f"{bound:.1f} s") from None
            with self.lock:
                self._read(self._path(directory, key, block))
        return [found[block] for block in range(first, last + 1)]

    def cached(self, directory: str, key: str, first: int, last: int) -> bool:
        """Whether blocks ``first..last`` of ``key`` are all cached (in memory or in their block files): a read of
        them sends no request, unless one is evicted before it. No I/O. The blocks become the most recently used:
        the read that follows on the same thread finds them unless the whole cache turned over in between (or a
        block file was found torn: then that read fetches it again, one GET of one block)."""
        with self.lock:
            for block in range(first, last + 1):
                path = self._path(directory, key, block)
                if path not in self._lru:
                    return False
            for block in range(first, last + 1):
                self._lru.move_to_end(self._path(directory, key, block))
        return True

    def prefetch(self, directory: str, key: str, first: int, last: int, fetch: Callable[[int, int], list[Block]]
                 ) -> int:
        """Fetch blocks ``first..last`` of ``key`` ahead of a sequential reader, in worker threads (at most
        :data:`READ_AHEAD_THREADS` GETs of up to :data:`READ_AHEAD_GET` bytes in flight), skipping blocks cached or
        already in flight. Never blocks; never on the caller's thread. Returns the number of GETs started."""
        per_get = max(1, READ_AHEAD_GET // BLOCK_BYTES)
        runs: list[list[tuple[int, str, Future]]] = []
        with self.lock:
            for block in range(first, last + 1):
                path = self._path(directory, key, block)
                if path in self._hot or path in self._lru or path in self._inflight:
                    continue
                future = self._inflight[path] = Future()
                if runs and runs[-1][-1][0] == block - 1 and len(runs[-1]) < per_get:
                    runs[-1].append((block, path, future))
                else:
                    runs.append([(block, path, future)])
            if runs and self._pool is None:
                self._pool = _DaemonPool(READ_AHEAD_THREADS, "logfs-read-ahead")
            pool = self._pool
        for run in runs:
            pool.submit(self._fetch_run, [p for _, p, _ in run], [f for _, _, f in run], run[0][0], run[-1][0],
                        fetch, True)
        return len(runs)

    def demote(self, directory: str, key: str, first: int, last: int) -> None:
        """Blocks ``first..last`` of ``key`` that were fetched ahead and not read (their reader jumped elsewhere)
        become the first evicted."""
        with self.lock:
            for block in range(first, last + 1):
                path = self._path(directory, key, block)
                if path in self._ahead and path in self._lru:
                    self._lru.move_to_end(path, last=False)

    def _evict(self) -> None:
        """(lock held) Least recently used first (blocks a reader jumped past unread are at that end), until the
        block files and those being written fit in the limit."""
        while self.used + self._reserved > self.limit and self._lru:
            self._remove(next(iter(self._lru)))

    def drop(self, directory: str, key: str) -> None:
        """Forget every block of ``key`` (its object was deleted from the store)."""
        stem = self._path(directory, key, 0)[:-1]
        with self.lock:
            for path in [p for p in self._lru if p.startswith(stem)]:
                self._remove(path)

    def close(self) -> None:
        """Stop read-ahead (fetches under way finish in their threads; nothing waits for them)."""
        with self.lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        with self.lock:
            inflight, self._inflight = self._inflight, {}
        for future in inflight.values():  # a fetch cancelled before it ran: its waiters must not wait for ever
            _settle(future, exc=RemoteUnavailableError("the daemon is stopping"))


class _DaemonPool:
    """Worker threads for read-ahead that never hold up the daemon's exit (a GET to a stalled store can take its
    whole time bound; concurrent.futures' threads are joined at interpreter exit). Queued work is dropped at
    shutdown."""

    def __init__(self, threads: int, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn, *args) -> None:
        self._queue.put((fn, args))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - _fetch_run settles its futures; nothing else to tell
                pass

    def shutdown(self) -> None:
        while True:  # drop what is queued; the threads end after what they are doing
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in range(READ_AHEAD_THREADS):
            self._queue.put(None)


def _write_all(fd: int, parts: list) -> None:
    """``parts`` to ``fd`` by ``writev`` (a short write goes on with the rest)."""
    left = sum(len(p) for p in parts)
    while True:
        done = os.writev(fd, parts)
        left -= done
        if not left:
            return
        views = []
        for p in parts:
            if done >= len(p):
                done -= len(p)
                continue
            views.append(memoryview(p)[done:])
            done = 0
        parts = views


@functools.lru_cache(maxsize=4096)
def _block_stem(directory: str, key: str) -> str:
    """``directory/<hash of key>.``: every read looks a block up by its path, and a SHA-1 per lookup was ~2 us of
    the ~70 us an 8 KiB read takes in all."""
    return os.path.join(directory, hashlib.sha1(key.encode()).hexdigest()[:24]) + "."


def _settle(future: Future, data: Block | None = None, exc: BaseException | None = None) -> None:
    """Set a block fetch's outcome once (a fetch and a stop may both try)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(data)
    except InvalidStateError:
        pass

"""A tiered segment, read like a local one, and the bounded on-disk cache of the byte ranges fetched for it.

:class:`RemoteLogSegment` has the reading side of :class:`~logfs.storage.segment.LogSegment` (``size``, ``stats``,
the three indexes, ``read``/``read_into``/``batches_from``, ``translate_offset``, ``find_offset_by_timestamp``),
so the view layer and the log read a tiered range exactly as a local one. Its ``.index``, ``.timeindex`` and
``.viewindex`` are small: they are kept whole on local disk (copied at upload, fetched once otherwise) and mapped
like a local segment's. Its ``.log`` is read in :data:`BLOCK_BYTES` blocks through :class:`BlockCache` (LRU, at
most ``logfs.remote.cache.bytes`` of files in the partition directories): a read costs one ranged GET per run of
consecutive blocks it overlaps that are not cached, never the whole segment.

The FUSE request loop must never wait for the store: the thread that serves requests marks itself
(:func:`mark_request_thread`); a read there that needs a block not in the cache raises
:class:`~logfs.storage.errors.FetchNeededError` before any request is sent, and the caller repeats the call in a
worker thread, where the fetch happens (bounded by the store's own timeouts: a store that is down or stalled
fails the read with a :class:`~logfs.remote.api.RemoteStoreError`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import struct
import shutil
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Callable

from crc32c import crc32c

from ..remote.api import RemoteCorruptError, RemoteStore, RemoteUnavailableError
from ..remote.manifest import RemoteSegment
from .checkpoints import fsync_dir
from .errors import CorruptRecordError, FetchNeededError
from .index import LineStats, OffsetIndex, TimeIndex, ViewIndex
from .names import INDEX_SUFFIX, TIME_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix
from .segment import LogSegment, SegmentFile

#: Unit of fetching and caching a remote .log: a small read costs one ranged GET of at most this many bytes.
BLOCK_BYTES = 256 * 1024
#: Memory kept of the most recently used blocks, over all partitions (on top of the disk cache).
HOT_BYTES = 32 << 20
#: Read-ahead for a sequential reader of a tiered segment: the window starts at READ_AHEAD_FIRST past what it read
#: and doubles with each sequential read up to READ_AHEAD_MAX (and a quarter of the cache), going on into the next
#: tiered segment at the end of one (RemoteLogSegment.successor); a read elsewhere ends it. GETs of at most
#: READ_AHEAD_GET bytes (never across objects), READ_AHEAD_THREADS in flight at once over the whole daemon.
READ_AHEAD_FIRST = 1 << 20
READ_AHEAD_AFTER = 4  # blocks (1 MiB) a reader must move forward by, read after read, before read-ahead starts
READ_AHEAD_MAX = 32 << 20
READ_AHEAD_GET = 16 << 20
READ_AHEAD_THREADS = 4
_CRC = struct.Struct(">I")  # the trailer of a cached block file
#: A block's bytes: a read-only view of the GET's buffer it came in, or of the block file's bytes read back.
Block = bytes | memoryview

_thread = threading.local()
log = logging.getLogger(__name__)


def mark_request_thread(on: bool = True) -> None:
    """The calling thread serves requests: reads there never fetch, they raise FetchNeededError instead."""
    _thread.no_fetch = on


def _may_fetch() -> bool:
    return not getattr(_thread, "no_fetch", False)


def on_request_thread() -> bool:
    """Whether the calling thread serves requests (:func:`mark_request_thread`): CPU-heavy work (decompressing a
    batch) does not run there either; callers raise FetchNeededError to be repeated in a worker thread."""
    return not _may_fetch()


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
        finally:
            with self.lock:
                self._reserved -= size
        with self.lock:
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
        """Fetch blocks a..b (one request), store them, and settle their futures (with the error, if it failed)."""
        try:
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
        block in flight (another reader's fetch, or read-ahead) is waited for. On the request thread a missing
        block raises FetchNeededError before anything is fetched or waited for."""
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
        if not _may_fetch():
            raise FetchNeededError(f"{key} blocks {missing[0]}..{missing[-1]} are not cached")
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
                    _settle(future, exc=FetchNeededError(f"{key} block {block}: its fetch was not made"))
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


def index_paths(index_dir: str, base_offset: int) -> dict[str, str]:
    """Where a tiered segment's indexes are kept locally, by object kind."""
    stem = os.path.join(index_dir, filename_prefix(base_offset))
    return {"index": stem + INDEX_SUFFIX, "timeindex": stem + TIME_INDEX_SUFFIX, "viewindex": stem + VIEW_INDEX_SUFFIX}


def install_index(path: str, source: str | None = None, data: bytes | None = None) -> None:
    """Put a file of the tiered state (an index copy, the manifest copy) in place, durably: written to a
    temporary from ``source`` or ``data``, fsynced, renamed over ``path``, directory fsynced. A power cut leaves
    the old file or the new one, never a torn or empty one that the next start would trust."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            if source is not None:
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
            else:
                f.write(data or b"")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class RemoteLogSegment(SegmentFile):
    """One tiered segment (read-only). Its indexes must already be in ``index_dir`` (:func:`index_paths`)."""

    active = False
    fd = -1  # never a local descriptor: close_if_unused leaves it alone

    def __init__(self, meta: RemoteSegment, index_dir: str, store: RemoteStore, cache: BlockCache):
        self.meta = meta
        self.base_offset = meta.base_offset
        self.next_offset = meta.next_offset
        self.size = meta.size
        self.max_timestamp = meta.max_timestamp
        self.key = meta.objects["log"].key
        self.log_path = f"remote object {self.key}"
        self.store = store
        self.cache = cache
        self.blocks_dir = os.path.join(index_dir, "blocks")
        self.refs = 0
        self.deleted = self.purged = self.broken = self.closed = False
        self.owner = None  # its log's lock, once published (Log.set_remote): the open-file budget asks it
        # Read-ahead state (shared by every reader of this segment; a race only resets the window).
        self._prev_first: int | None = None
        self._next_block = 0
        self._window = 0
        self._ahead_to = -1  # the last block read-ahead was asked for
        self._run = 0  # blocks a forward run of reads has moved on by
        self._handed_on = False  # this run's read-ahead went on into the successor
        #: The next tiered segment of the partition (set by the tiered manager at each publish): a forward run's
        #: read-ahead goes on into it, so the window does not start again from nothing at each segment.
        self.successor: RemoteLogSegment | None = None
        self._paths = index_paths(index_dir, meta.base_offset)
        for ext, path in self._paths.items():
            if os.path.getsize(path) != meta.objects[ext].size:
                raise RemoteCorruptError(f"{path}: {os.path.getsize(path)} bytes, the manifest says "
                                         f"{meta.objects[ext].size}")
        # The view length needs only the view index's end entry: the indexes are mapped on first lookup, so a
        # tiered segment nobody reads holds no descriptor (and the open-file budget unmaps idle ones).
        entry = ViewIndex.ENTRY
        with open(self._paths["viewindex"], "rb") as f:
            f.seek(max(0, meta.objects["viewindex"].size - entry.size))
            raw = f.read(entry.size)
        if len(raw) != entry.size:
            raise RemoteCorruptError(f"{self._paths['viewindex']}: no end entry")
        rel, position, *stats = entry.unpack(raw)
        if position != self.size or self.base_offset + rel != self.next_offset:
            raise RemoteCorruptError(f"{self._paths['viewindex']}: no end entry for {self.size} bytes, offset "
                                     f"{self.next_offset}")
        self.stats = LineStats(*stats)
        self._indexes: tuple | None = None

    def _mapped(self) -> tuple:
        if self._indexes is None:
            if self.broken:
                raise RemoteCorruptError(f"{self._paths['index']}: the local copies of {self.key}'s indexes failed "
                                         "their check; fetched again at the next tiering pass")
            size = self.meta.objects
            indexes = (
                OffsetIndex(self._paths["index"], self.base_offset, size["index"].size, active=False),
                TimeIndex(self._paths["timeindex"], self.base_offset, size["timeindex"].size, active=False),
                ViewIndex(self._paths["viewindex"], self.base_offset, size["viewindex"].size, active=False))
            for index in indexes:
                index.segment = self
            try:
                for index in indexes:  # one C pass each, on first use only: a copy that fails is never used
                    index.sanity_check(self.size)
            except CorruptRecordError as exc:
                for index in indexes:
                    index.close_handler()
                self.broken = True
                raise RemoteCorruptError(f"{exc} (the local copy of a tiered segment's index; fetched again at "
                                         "the next tiering pass)") from None
            self._indexes = indexes
        return self._indexes

    @property
    def offset_index(self) -> OffsetIndex:
        return self._mapped()[0]

    @property
    def time_index(self) -> TimeIndex:
        return self._mapped()[1]

    @property
    def view_index(self) -> ViewIndex:
        return self._mapped()[2]

    @property
    def largest_timestamp(self) -> int:
        return self.max_timestamp

    def _block_length(self, block: int) -> int:
        return min(BLOCK_BYTES, self.size - block * BLOCK_BYTES)

    def _fetch(self, first: int, last: int) -> list[Block]:
        """Blocks ``first..last`` of the .log object by one ranged GET: read-only views of the one buffer the
        body was read into (no copy per block; nothing writes to that buffer once it is returned)."""
        start = first * BLOCK_BYTES
        want = min((last + 1) * BLOCK_BYTES, self.size) - start
        data = self.store.get_range_buffer(self.key, start, want)
        if len(data) != want:
            raise RemoteCorruptError(f"{self.key}: {len(data)} bytes at {start}, expected {want}")
        view = memoryview(data).toreadonly()
        return [view[i:i + BLOCK_BYTES] for i in range(0, want, BLOCK_BYTES)]

    def read(self, position: int, length: int) -> bytes:
        end = min(position + length, self.size)
        if end <= position:
            return b""
        data = self._blocks(position, end)
        return data if isinstance(data, bytes) else bytes(data)

    def _blocks(self, position: int, end: int) -> memoryview | bytes:
        """Bytes position..end (end <= size, position < end) as a view: of the block itself when one block holds
        them (no copy), else of the slices joined (one copy of only those bytes, not of the whole blocks)."""
        first, last = position // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        skip = position - first * BLOCK_BYTES
        if first == last:
            # Small reads go on in the block the calling thread read last (32 requests of 8 KiB per block): no
            # cache lookup for them. One block per thread is kept so.
            memo = getattr(_thread, "last_block", None)
            if memo is not None and memo[0] is self and memo[1] == first:
                data = memo[2]
            else:
                data = self.cache.get_blocks(self.blocks_dir, self.key, first, last, self._block_length,
                                             self._fetch)[0]
                _thread.last_block = (self, first, data)
            self._read_ahead(first, last)
            return memoryview(data)[skip:skip + end - position]
        blocks = self.cache.get_blocks(self.blocks_dir, self.key, first, last, self._block_length, self._fetch)
        self._read_ahead(first, last)
        tail = end - last * BLOCK_BYTES
        return b"".join([memoryview(blocks[0])[skip:], *blocks[1:-1], memoryview(blocks[-1])[:tail]])

    def _read_ahead(self, first: int, last: int) -> None:
        """A read of blocks first..last was served: if it continues the previous one (from the block that one
        ended in), widen the read-ahead window and fetch that far ahead in the background; anything else (a
        jump) ends the window, so a random read fetches only what it needs."""
        prev_first, prev_last = self._prev_first, self._next_block - 1
        if prev_first is not None and prev_first <= first <= prev_last + 1 and last > prev_last:
            self._run += last - prev_last  # moving forward from where the last read was
            if self._run >= READ_AHEAD_AFTER:  # (a random read and its neighbour, e.g. a position lookup, are not)
                window = max(READ_AHEAD_FIRST, self._window * 2)
                self._window = min(window, READ_AHEAD_MAX, max(BLOCK_BYTES, self.cache.limit // 4))
        elif prev_first is None or not prev_first <= first <= last <= prev_last:
            # A jump (reading inside the last range is not): what was fetched ahead for it and not read goes first.
            if self._ahead_to > prev_last:
                self.cache.demote(self.blocks_dir, self.key, prev_last + 1, self._ahead_to)
            self._window, self._ahead_to, self._run, self._handed_on = 0, -1, 0, False
        self._prev_first, self._next_block = first, last + 1
        if not self._window:
            return
        blocks = -(-self._window // BLOCK_BYTES)
        end_block = (self.size - 1) // BLOCK_BYTES
        # At least one GET's worth, but never more than a quarter of the cache: blocks of one GET must not evict
        # each other before the reader gets to them.
        per_get = max(1, min(READ_AHEAD_GET, self.cache.limit // 4) // BLOCK_BYTES)
        if self._ahead_to < end_block:
            if self._ahead_to - last >= blocks // 2:
                return  # enough is on its way: read-ahead goes in large GETs, not one block per read
            start = max(last + 1, self._ahead_to + 1)
            stop = min(max(last + blocks, start + per_get - 1), end_block)
            if stop >= start:
                self.cache.prefetch(self.blocks_dir, self.key, start, stop, self._fetch)
                self._ahead_to = stop
        over = last + blocks - end_block  # blocks of the window past this segment's end
        if over > 0 and self._ahead_to >= end_block and not self._handed_on:
            self._hand_on(over, per_get)

    def _hand_on(self, over: int, per_get: int) -> None:
        """The window reaches past this segment's end: fetch the successor's first blocks ahead (what the window
        overhangs, at least one GET's worth) and let its first read continue this run, with this window (no
        demand fetch, no new ramp at each segment). Not when another reader's run is under way in the successor
        (its read-ahead state is shared): that reader keeps its window."""
        self._handed_on = True
        after = self.successor
        if after is None or after.deleted or after.closed or after.broken or after.size <= 0:
            return
        after_end = (after.size - 1) // BLOCK_BYTES
        if after._window and after._next_block <= after_end:
            return  # being read ahead for someone in the middle of it
        stop = min(max(over, per_get) - 1, after_end)
        after.cache.prefetch(after.blocks_dir, after.key, 0, stop, after._fetch)
        after._window, after._ahead_to, after._run, after._handed_on = self._window, stop, self._run, False
        after._prev_first, after._next_block = 0, 0  # as if a read had ended just before block 0

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        """As :meth:`read`, as a view of the cached block (``scratch`` is not needed: blocks are immutable)."""
        end = min(position + length, self.size)
        if end <= position:
            return memoryview(b"")
        return memoryview(self._blocks(position, end))

    # The same bounded lookups as a local segment's: index entry, then a scan of at most one interval.
    translate_offset = LogSegment.translate_offset
    find_offset_by_timestamp = LogSegment.find_offset_by_timestamp

    def hold_files(self) -> None:
        """Open the indexes before their files are unlinked while a snapshot pins this segment (as
        :meth:`LogSegment.hold_files`; the caller then marks it ``deleted``)."""
        for index in self._mapped():
            if index.entries:
                index.hold()

    def close(self) -> None:
        indexes, self._indexes = self._indexes, None
        for index in indexes or ():
            index.close_handler()
        self.closed = True

    def __repr__(self) -> str:
        return f"RemoteLogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

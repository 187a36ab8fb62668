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

import hashlib
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from typing import Callable

from ..remote.api import RemoteCorruptError, RemoteStore
from ..remote.manifest import RemoteSegment
from .errors import FetchNeededError
from .index import LineStats, OffsetIndex, TimeIndex, ViewIndex
from .names import INDEX_SUFFIX, TIME_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix
from .segment import LogSegment, SegmentFile

#: Unit of fetching and caching a remote .log: a small read costs one ranged GET of at most this many bytes.
BLOCK_BYTES = 256 * 1024

_thread = threading.local()


def mark_request_thread(on: bool = True) -> None:
    """The calling thread serves requests: reads there never fetch, they raise FetchNeededError instead."""
    _thread.no_fetch = on


def _may_fetch() -> bool:
    return not getattr(_thread, "no_fetch", False)


class BlockCache:
    """Blocks of remote objects as files (in each partition's ``logfs-remote/blocks/``), least recently used
    evicted beyond ``limit`` bytes over all partitions.

    Thread-safe. A block file is complete or absent (written to a temporary, then renamed). It is named by a hash
    of the object key and the block number. The cache survives restarts: :meth:`scan` takes in a directory's
    blocks, oldest modification time first."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()
        self.used = 0

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
        return os.path.join(directory, f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.{block}")

    def _cached(self, directory: str, key: str, block: int, length: int) -> bytes | None:
        path = self._path(directory, key, block)
        with self.lock:
            if path not in self._lru:
                return None
            self._lru.move_to_end(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None  # evicted meanwhile
        return data if len(data) == length else None

    def _store(self, directory: str, key: str, block: int, data: bytes) -> None:
        if len(data) > self.limit:
            return
        path = self._path(directory, key, block)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        with self.lock:
            self.used += len(data) - self._lru.pop(path, 0)
            self._lru[path] = len(data)
            self._evict()

    def get_blocks(self, directory: str, key: str, first: int, last: int, length_of: Callable[[int], int],
                   fetch: Callable[[int, int], list[bytes]]) -> list[bytes]:
        """Blocks ``first..last`` of ``key``: from the cache, the missing ones by ``fetch(a, b)`` (blocks a..b in
        one request) per run of consecutive missing blocks, then cached. On the request thread a missing block
        raises FetchNeededError before anything is fetched."""
        found: dict[int, bytes] = {}
        missing: list[int] = []
        for block in range(first, last + 1):
            data = self._cached(directory, key, block, length_of(block))
            if data is None:
                missing.append(block)
            else:
                found[block] = data
        if missing and not _may_fetch():
            raise FetchNeededError(f"{key} blocks {missing[0]}..{missing[-1]} are not cached")
        runs: list[list[int]] = []
        for block in missing:
            if runs and runs[-1][-1] == block - 1:
                runs[-1].append(block)
            else:
                runs.append([block])
        for run in runs:
            for block, data in zip(run, fetch(run[0], run[-1])):
                found[block] = data
                self._store(directory, key, block, data)
        return [found[block] for block in range(first, last + 1)]

    def _evict(self) -> None:
        while self.used > self.limit and self._lru:
            path, size = self._lru.popitem(last=False)
            self.used -= size
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def drop(self, directory: str, key: str) -> None:
        """Forget every block of ``key`` (its object was deleted from the store)."""
        stem = self._path(directory, key, 0)[:-1]
        with self.lock:
            for path in [p for p in self._lru if p.startswith(stem)]:
                self.used -= self._lru.pop(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def index_paths(index_dir: str, base_offset: int) -> dict[str, str]:
    """Where a tiered segment's indexes are kept locally, by object kind."""
    stem = os.path.join(index_dir, filename_prefix(base_offset))
    return {"index": stem + INDEX_SUFFIX, "timeindex": stem + TIME_INDEX_SUFFIX, "viewindex": stem + VIEW_INDEX_SUFFIX}


def install_index(path: str, source: str | None = None, data: bytes | None = None) -> None:
    """Put an index file in place atomically, copied from ``source`` or written from ``data``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        if source is not None:
            shutil.copyfile(source, tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data or b"")
        os.replace(tmp, path)
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
        self.deleted = self.purged = self.closed = False
        self.owner = None  # its log's lock, once published (Log.set_remote): the open-file budget asks it
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
            size = self.meta.objects
            indexes = (
                OffsetIndex(self._paths["index"], self.base_offset, size["index"].size, active=False),
                TimeIndex(self._paths["timeindex"], self.base_offset, size["timeindex"].size, active=False),
                ViewIndex(self._paths["viewindex"], self.base_offset, size["viewindex"].size, active=False))
            for index in indexes:
                index.segment = self
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

    def _fetch(self, first: int, last: int) -> list[bytes]:
        """Blocks ``first..last`` of the .log object by one ranged GET."""
        start = first * BLOCK_BYTES
        want = min((last + 1) * BLOCK_BYTES, self.size) - start
        data = self.store.get_range(self.key, start, want)
        if len(data) != want:
            raise RemoteCorruptError(f"{self.key}: {len(data)} bytes at {start}, expected {want}")
        return [data[i:i + BLOCK_BYTES] for i in range(0, want, BLOCK_BYTES)]

    def read(self, position: int, length: int) -> bytes:
        end = min(position + length, self.size)
        if end <= position:
            return b""
        first, last = position // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        blocks = self.cache.get_blocks(self.blocks_dir, self.key, first, last, self._block_length, self._fetch)
        skip = position - first * BLOCK_BYTES
        if len(blocks) == 1:
            return blocks[0][skip:skip + end - position]
        return b"".join(blocks)[skip:skip + end - position]

    def read_into(self, scratch: bytearray, position: int, length: int) -> memoryview:
        return memoryview(self.read(position, length))

    # The same bounded lookups as a local segment's: index entry, then a scan of at most one interval.
    translate_offset = LogSegment.translate_offset
    find_offset_by_timestamp = LogSegment.find_offset_by_timestamp

    def hold_files(self) -> None:
        """Map the indexes before their files are unlinked while a snapshot pins this segment (as
        :meth:`LogSegment.hold_files`; the caller then marks it ``deleted``)."""
        for index in self._mapped():
            if index.entries:
                index._mmap  # noqa: B018 (maps it)

    def close(self) -> None:
        indexes, self._indexes = self._indexes, None
        for index in indexes or ():
            index.close_handler()
        self.closed = True

    def __repr__(self) -> str:
        return f"RemoteLogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

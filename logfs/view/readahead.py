"""Compressed batches for the text view: decompressed once each, shared, and ahead of a sequential reader.

The last few batches decompressed for reads and lookups are kept over all views (:class:`PlainBatches`), so a
lookup (``position.``) and the read of the line it found share one decompression. For a sequential reader
(a read starting where the previous one ended) :class:`ReadAhead` decompresses the compressed batches after its
own in up to :data:`READ_AHEAD_THREADS` worker threads of a pool its owner made (:func:`decompress_pool`: the FUSE
operations hold one for the mount and shut it down at unmount), up to :data:`READ_AHEAD_BYTES` of lines ahead, so that
the request thread finds them ready: the view tells the FUSE layer beforehand whether a read's batches are
(:meth:`ReadAhead.done`), and the read runs in a worker thread otherwise.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from ..storage.format import records as rec

# A read fetches the lines to pass over and the requested size, plus 1/8 for the records' own overhead, plus this
# much: the batch straddling the end of the request need not be whole (render_window renders the records that
# are), so a small read stays small.
READ_SLACK = 4096

#: How far a sequential reader's compressed batches are decompressed ahead of it, beyond the batch it is in: this
#: many bytes of lines (a read request of FUSE's 1 MiB spans several batches), and at least this many batches.
READ_AHEAD_BYTES = 4 << 20
READ_AHEAD_BATCHES = 2
#: Worker threads decompressing ahead for one view, each on its own batch.
READ_AHEAD_THREADS = 2
#: Decompressed batches kept in memory (over all views): the ones sequential readers are in, and the last lookups'.
PLAIN_BATCHES_KEPT = 8
#: Worker threads of a :func:`decompress_pool` (for all the views of a mount).
POOL_THREADS = 4

_count_lock = threading.Lock()
_decompressed = [0]  # batches the views have decompressed, by any thread (under _count_lock)
_by_thread: dict[int, int] = {}  # the same, by the thread that decompressed them


def decompressions(thread: int | None = None) -> int:
    """How many batches the text views have decompressed so far in this process, or by the thread whose
    ``threading.get_ident()`` is ``thread`` (tests count them: the request thread must decompress nothing while
    the read-ahead's threads work beside it)."""
    if thread is None:
        return _decompressed[0]
    return _by_thread.get(thread, 0)


def decompress_pool() -> ThreadPoolExecutor:
    """A pool for the read-ahead of views (its threads start with the first batch read ahead): its owner shuts it
    down once the views using it are released (``shutdown(wait=True)``: a worker ends after the batch it is on)."""
    return ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="logfs-decompress")


def decompress(buf, at: int = 0) -> bytes:
    """The compressed batch at ``at`` as a plain batch to render (its compressed bytes' CRC-32C checked; no CRC
    computed for the plain one: render_window never checks it)."""
    me = threading.get_ident()
    with _count_lock:
        _decompressed[0] += 1
        _by_thread[me] = _by_thread.get(me, 0) + 1
    return rec.decompress_batch(buf, at, stamp=False)


def _whole_batch_size(buf) -> int:
    return int.from_bytes(buf[8:12], "big") + 12


def _whole_compressed_head(buf) -> bool:
    """Whether ``buf`` starts with the header of a v2 batch in a codec (not a control batch)."""
    return (len(buf) >= rec.HEADER_SIZE and buf[16] == rec.MAGIC and buf[22] & rec.ATTR_COMPRESSION_MASK
            and not buf[22] & rec.ATTR_CONTROL and _whole_batch_size(buf) >= rec.HEADER_SIZE)


def whole_compressed(buf) -> bool:
    """Whether ``buf`` starts with a whole v2 batch in a codec (not a control batch)."""
    return (len(buf) >= rec.HEADER_SIZE and buf[16] == rec.MAGIC and buf[22] & rec.ATTR_COMPRESSION_MASK
            and not buf[22] & rec.ATTR_CONTROL and rec.HEADER_SIZE <= _whole_batch_size(buf) <= len(buf))


class PlainBatches:
    """The last decompressed batches, by (segment, position, CRC-32C as stored): thread-safe, least recently used
    dropped beyond :data:`PLAIN_BATCHES_KEPT`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: OrderedDict = OrderedDict()

    def get(self, key):
        with self._lock:
            plain = self._batches.get(key)
            if plain is not None:
                self._batches.move_to_end(key)
            return plain

    def put(self, key, plain: bytes) -> None:
        with self._lock:
            self._batches[key] = plain
            self._batches.move_to_end(key)
            while len(self._batches) > PLAIN_BATCHES_KEPT:
                self._batches.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._batches.clear()


plain_batches = PlainBatches()


def _after(segments: list, i: int, pos: int, size: int) -> tuple[int, int] | None:
    """(segment index, position) of the batch after the one of ``size`` bytes at ``pos`` of ``segments[i]``, or
    None at the end of what is sealed (an active segment may still grow)."""
    pos += size
    segment = segments[i]
    if pos < segment.size:
        return i, pos
    if segment.active or i + 1 >= len(segments):
        return None
    return i + 1, 0


class ReadAhead:
    """The compressed batches after a sequential reader's, decompressed ahead of it in worker threads (up to
    :data:`READ_AHEAD_THREADS` per view, each on its own batch: a batch's header says where the next one starts),
    as far as :data:`READ_AHEAD_BYTES` of decompressed lines beyond the batch the reader is in; the workers go on
    by themselves as the reader takes batches. Thread-safe; reads the view's segments only (pinned by its
    snapshot: :meth:`stop` says when no worker reads them any more)."""

    def __init__(self, segments: list, pool: ThreadPoolExecutor) -> None:
        self._segments = segments
        self._pool = pool
        self._cond = threading.Condition()
        self._done: dict = {}  # (segment index, position) -> (plain, size as stored) | None | an exception
        self._busy: set = set()  # (segment index, position) of the batches being decompressed
        self._next: tuple[int, int, int] | None = None  # (segment index, position, read size guess) to claim next
        self._room = 0  # batches the workers may still claim before the reader takes one
        self._workers = 0
        self._generation = 0  # changes when the reader moves elsewhere (a worker's batch from before is dropped)
        self._on_idle = None  # called once no worker runs, after stop()

    def follow(self, i: int, pos: int, size: int, plain_size: int) -> None:
        """The reader is in the compressed batch at ``pos`` of segment ``i`` (``size`` bytes as stored,
        ``plain_size`` decompressed): go on from there, unless already doing so."""
        after = _after(self._segments, i, pos, size)
        with self._cond:
            if self._on_idle is not None or after is None or after in self._done or after in self._busy or (
                    self._next is not None and self._next[:2] == after):
                return
            self._done.clear()
            self._busy.clear()
            self._generation += 1
            self._next = (*after, size + READ_SLACK)
            self._room = max(READ_AHEAD_BATCHES, READ_AHEAD_BYTES // max(1, plain_size))
            self._kick()

    def done(self, i: int, pos: int) -> tuple | None:
        """(plain, size as stored) of the batch at ``pos`` of segment ``i`` if it is decompressed ahead (and so
        stays until the reader takes it), else None."""
        with self._cond:
            result = self._done.get((i, pos))
        return result if isinstance(result, tuple) else None

    def pending(self, i: int, pos: int) -> bool:
        """Whether a worker is on the batch at ``pos`` of segment ``i``, or is about to be (:meth:`take` would
        wait for it)."""
        key = (i, pos)
        with self._cond:
            return key in self._busy or (self._next is not None and self._next[:2] == key)

    def take(self, i: int, pos: int):
        """The batch at ``pos`` of segment ``i``: (plain, size as stored) if decompressed ahead (waited for while a
        worker is on it or about to be); None if not read ahead, not compressed, or its decompression failed (the
        reader's own path reads it again and reports what is wrong)."""
        key = (i, pos)
        with self._cond:
            while key not in self._done:
                if key not in self._busy:
                    if self._next is None or self._next[:2] != key:
                        return None
                    self._room = max(self._room, 1)  # the reader waits for it: it is claimed whatever is ahead
                    self._kick()
                    if self._next is None:  # no worker could start (the pool is shut down): the reader's own path
                        return None
                self._cond.wait()
            result = self._done.pop(key)
            self._room += 1
            self._kick()
        return result if isinstance(result, tuple) else None

    def stop(self, on_idle) -> None:
        """No more read-ahead: ``on_idle()`` is called when no worker reads the segments any more (now, or when
        the last batch in progress is done, from its thread)."""
        with self._cond:
            self._next = None
            self._done.clear()
            self._generation += 1
            if self._workers:
                self._on_idle = on_idle
                return
        on_idle()

    def _kick(self) -> None:  # (under the lock) one more worker, if there is a batch to claim and room for it
        if self._workers < READ_AHEAD_THREADS and self._next is not None and self._room > 0:
            self._workers += 1
            try:
                self._pool.submit(self._work)
            except RuntimeError:  # the pool is shut down (the mount is stopping): no more read-ahead
                self._workers -= 1
                self._next = None

    def _work(self) -> None:
        on_idle = None
        try:
            while True:
                with self._cond:
                    task = self._next
                    if task is None or self._room <= 0:
                        break
                    self._room -= 1
                    self._next = None  # until this batch's header says where the next one starts
                    key, generation = task[:2], self._generation
                    self._busy.add(key)
                result = self._one(task, generation)
                with self._cond:
                    self._busy.discard(key)
                    if generation == self._generation:
                        self._done[key] = result
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._workers -= 1
                if not self._workers and self._on_idle is not None:
                    on_idle, self._on_idle = self._on_idle, None
                self._cond.notify_all()
            if on_idle is not None:
                on_idle()

    def _one(self, task: tuple[int, int, int], generation: int):
        """Read and decompress one batch; as soon as its header is read, let the next worker go on after it."""
        i, pos, guess = task
        segment = self._segments[i]
        try:
            buf = segment.read(pos, max(guess, rec.HEADER_SIZE))
            if not _whole_compressed_head(buf):
                return None
            size = _whole_batch_size(buf)
            after = _after(self._segments, i, pos, size)
            with self._cond:
                if generation == self._generation and self._next is None and after is not None:
                    self._next = (*after, size + READ_SLACK)
                    self._kick()  # another worker for the batch after this one
                    self._cond.notify_all()
            if len(buf) < size:
                buf = segment.read(pos, size)
                if len(buf) < size:
                    return None
            plain = plain_batches.get((segment, pos, rec.parse_header(buf).crc))
            return (plain if plain is not None else decompress(buf)), size  # (not kept there: the reader takes it)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, whose own path reports it
            return exc

"""Background work of a mounted store, as trio tasks owned by one nursery.

Owns the schedule, not the mechanism: time-based rolls (``segment.ms``, also for idle partitions), flushes
(``flush.ms`` and the asynchronous flush of a just-rolled segment), recovery-point and log-start-offset
checkpoints, and the unlinking of ``.deleted`` segments and ``-delete`` directories. Anything that touches the
disk beyond a page-cache write (fsync, unlink, directory fsync) runs in a worker thread, so the trio loop (and
with it every FUSE request) never waits on it.
"""

from __future__ import annotations

import logging
import operator
import os
import threading

import trio

from ..storage.local.log import Log
from ..storage.manager import LogManager
from ..storage.cleaner.compaction import OffsetMap, clean, grab_filthiest
from ..storage.cleaner import compression
from ..storage.cleaner.process import clean_in_subprocess, compress_in_subprocess, compress_in_thread
from ..storage.tiered.manager import tier_stats
from ..storage.errors import LogfsError, StorageIOError
from ..storage.failure import offline_by as _offline_by
from ..storage.local.retention import delete_old_segments

log = logging.getLogger(__name__)

MAX_TICK_MS = 1000
MIN_TICK_MS = 10
COMPRESSION_TICK_S = 0.2  # how often sealed segments are looked at for compression when none was due
COMPRESSION_SEGMENTS_PER_PASS = 4  # per child process: bounds the time one partition holds the compressor
STAGING_SWEEP_MS = 60_000  # how often staged files older than logfs.staging.retention.ms are looked for


class ServiceStats:
    """What the background work did since the daemon started (for the metrics); updated by the one task or worker
    thread doing that work, read from anywhere."""

    __slots__ = ("cleaner_runs", "cleaner_failures", "cleaner_removed_records", "cleaner_reclaimed_bytes",
                 "retention_deleted_segments", "compressed_segments", "compression_failures",
                 "compression_bytes_before", "compression_bytes_after")

    def __init__(self):
        self.cleaner_runs = self.cleaner_failures = self.cleaner_removed_records = 0
        self.cleaner_reclaimed_bytes = self.retention_deleted_segments = 0
        self.compressed_segments = self.compression_failures = 0
        self.compression_bytes_before = self.compression_bytes_after = 0


class LogService:
    def __init__(self, manager: LogManager):
        self.manager = manager
        self.clock = manager.clock
        self._roll_flush: set[tuple[str, int]] = set()
        broker = manager.broker
        self._last_checkpoint_ms = self.clock.time_ms()
        # The first retention pass runs log.initial.task.delay.ms after start, then every check interval.
        self._last_retention_ms = (self.clock.time_ms() + broker.get("log.initial.task.delay.ms")
                                   - broker.get("log.retention.check.interval.ms"))
        # Both checkpoints are written together, as often as the more frequent of their two intervals asks.
        self._checkpoint_interval_ms = min(broker.get("log.flush.offset.checkpoint.interval.ms"),
                                           broker.get("log.flush.start.offset.checkpoint.interval.ms"))
        # Where compaction's CPU work runs: a child process (default; it never competes with request handling
        # for the GIL, see docs/benchmarks.md) or a worker thread of the daemon.
        self.cleaner_mode = os.environ.get("LOGFS_CLEANER_MODE", "process")
        self._last_sweep_ms = self.clock.time_ms()
        self._trio_thread: int | None = None
        self._trio_token = None
        self._wakeup = trio.Event()
        self._failing: dict[str, str] = {}  # background step -> the error it last failed with
        self.tiering = None  # the TieringTask, when tiered storage is on
        self.following = None  # the FollowTask of a follower mount
        self.stats = ServiceStats()

    def _on_roll(self, key):
        def wake() -> None:
            self._roll_flush.add(key)
            self._wakeup.set()

        def callback(_segment):
            # Rolls happen on the trio thread (appends), or in a worker thread (the sink's commits,
            # Log.append_staged), which must not touch trio objects: it only queues the wake-up, without waiting
            # (it holds the log lock, which the trio thread may be waiting for).
            if self._trio_token is None or threading.get_ident() == self._trio_thread:
                wake()
            else:
                self._trio_token.run_sync_soon(wake)
        return callback

    def attach(self, plog: Log) -> None:
        plog.on_roll = self._on_roll((plog.topic, plog.partition))

    def _tick_ms(self) -> int:
        tick = MAX_TICK_MS
        # (The logs of a topic share one config object: a store of 20,000 partitions has a few thousand.)
        configs = {id(c): c for c in map(operator.attrgetter("config"), list(self.manager.logs.values()))}
        for c in configs.values():
            tick = min(tick, c.segment_ms // 4 if c.segment_ms < 4 * MAX_TICK_MS else MAX_TICK_MS)
            if c.flush_ms < 4 * MAX_TICK_MS:
                tick = min(tick, c.flush_ms // 4)
        for interval in (self._checkpoint_interval_ms, self.manager.broker.get("log.retention.check.interval.ms")):
            tick = min(tick, max(interval // 4, MIN_TICK_MS))
        # Kafka's flusher checks flush.ms every log.flush.scheduler.interval.ms; logfs checks at least that often.
        tick = min(tick, self.manager.broker.get("log.flush.scheduler.interval.ms"))
        return max(MIN_TICK_MS, tick)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._trio_thread = threading.get_ident()
        self._trio_token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            if self.manager.broker_logs is not None:
                # A running broker's directory, read in place (storage/broker.py): the broker rolls, retains,
                # compacts and flushes its log; the one background work here is following it.
                from .follower import FollowTask

                self.following = FollowTask(self.manager.broker_logs, self.manager.broker.get("logfs.broker.poll.ms"),
                                            "the broker's log directory")
                nursery.start_soon(self.following.run)
                task_status.started()
                return
            if self.manager.broker.get("log.cleaner.enable") and self.manager.broker.get("log.cleaner.threads"):
                nursery.start_soon(self.cleaner_loop)
            nursery.start_soon(self.compression_loop)
            if self.manager.follower is not None:
                from .follower import FollowTask

                self.following = FollowTask(self.manager.follower,
                                            self.manager.broker.get("logfs.follow.interval.ms"))
                nursery.start_soon(self.following.run)
            elif self.manager.remote is not None:
                from .tiering import TieringTask

                self.tiering = TieringTask(self.manager, self.manager.remote)
                nursery.start_soon(self.tiering.run)
            task_status.started()
            await self._housekeeping_loop()

    async def cleaner_loop(self) -> None:
        """Clean the filthiest compacted log; back off ``log.cleaner.backoff.ms`` when none needs it.
        Cleaning runs in a worker thread; the log lock is taken only for each segment swap."""
        backoff = self.manager.broker.get("log.cleaner.backoff.ms") / 1000
        while True:
            cleaned = await self._guarded("cleaning", self.clean_once, self.clock.time_ms())
            if not cleaned:
                await trio.sleep(backoff)

    async def compression_loop(self) -> None:
        """Rewrite sealed segments in their topic's codec (:mod:`logfs.storage.cleaner.compression`), one partition's
        backlog at a time, in the cleaner's child process; wait a tick when none is due."""
        while True:
            done = await self._guarded("compressing sealed segments", self.compress_once, self.clock.time_ms())
            if not done:
                await trio.sleep(COMPRESSION_TICK_S)

    def compress_once(self, now_ms: int) -> bool:
        """Compress the due segments of one partition (worker thread). False when no partition has any."""
        remote = self.manager.remote
        for plog in list(self.manager.logs.values()):
            if plog.closed or plog.log_dir.offline or not compression.codec_of(plog.config)[0]:
                continue
            tiered_end = tier_stats(plog)["remote_log_end_offset"] if remote is not None else 0
            with plog.snapshot(sealed_only=True) as snap:
                due = [s for s in snap.segments if s.next_offset > tiered_end
                       and compression.needs_rewrite(s, plog.config)][:COMPRESSION_SEGMENTS_PER_PASS]
                if not due or not plog.rewrite_lock.acquire(blocking=False):
                    continue
                try:
                    if self.cleaner_mode == "process":
                        result = compress_in_subprocess(plog, due, now_ms)
                    else:
                        result = compress_in_thread(plog, due, now_ms)
                except LogfsError as exc:
                    if isinstance(exc, StorageIOError):
                        plog.log_dir.report(exc, f"compressing {plog.name}")
                        raise  # the disk's error: the failure channel's, not a codec's
                    self.stats.compression_failures += 1
                    log.error("compressing %s-%d failed, its segments stay uncompressed: %s", plog.topic,
                              plog.partition, exc)
                    for segment in due:  # not retried, and tiering does not wait for them
                        compression.give_up(segment)
                    return False
                finally:
                    plog.rewrite_lock.release()
            stats = self.stats
            stats.compressed_segments += result.segments_replaced
            stats.compression_bytes_before += result.bytes_before
            stats.compression_bytes_after += result.bytes_after
            log.info("compressed %d segment(s) of %s-%d: %d -> %d bytes", result.segments_replaced, plog.topic,
                     plog.partition, result.bytes_before, result.bytes_after)
            return True
        return False

    async def _guarded(self, what: str, fn, *args, log_dir=None):
        """Background work in a worker thread. A full disk (or EMFILE...) is logged, once until the step works
        again, and the step is retried on a later tick. Any other I/O error takes its log directory offline
        (storage/failure.py: ``log_dir``, the one the step works in; by default the first, which holds the mount's
        own files; an error met in another directory was reported there already), and no background work runs
        there any more until the next mount; the daemon never ends for either."""
        log_dir = log_dir or self.manager.log_dir
        if log_dir.offline:
            return None  # nothing more is done on a directory whose disk failed, until the next mount
        try:
            result = await trio.to_thread.run_sync(fn, *args)
        except (OSError, LogfsError) as exc:
            log_dir.report(exc, what)
            if _offline_by(exc, log_dir):
                return None  # (logged once, by the failure channel: this step is not retried)
            if what == "cleaning":
                self.stats.cleaner_failures += 1
            elif what == "compressing sealed segments":
                self.stats.compression_failures += 1
            self._failed(what, exc)
            return None
        self._recovered(what)
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        message = str(exc)
        if self._failing.get(what) != message:
            log.error("%s failed (will retry): %s", what, message)
            self._failing[what] = message

    def _recovered(self, what: str) -> None:
        if self._failing.pop(what, None) is not None:
            log.info("%s works again", what)

    def clean_once(self, now_ms: int) -> bool:
        logs = [plog for plog in list(self.manager.logs.values()) if not plog.log_dir.offline]
        target = grab_filthiest(logs, dict(self.manager.cleaner_checkpoints), now_ms)
        if target is None:
            return False
        plog = target.log
        if not plog.rewrite_lock.acquire(blocking=False):
            return False  # its sealed segments are being compressed: later
        try:
            return self._clean(plog, target, now_ms)
        finally:
            plog.rewrite_lock.release()

    def _clean(self, plog, target, now_ms: int) -> bool:
        buffer = self.manager.broker.get("log.cleaner.dedupe.buffer.size")
        threads = max(1, self.manager.broker.get("log.cleaner.threads"))
        offset_map = OffsetMap.for_buffer(buffer // threads, self.manager.broker.get("log.cleaner.io.buffer.load.factor"))
        try:
            if self.cleaner_mode == "process":
                result = clean_in_subprocess(plog, target, offset_map.capacity, now_ms)
            else:
                result = clean(plog, target, offset_map, now_ms)
        except OSError as exc:
            plog.log_dir.report(exc, f"cleaning {plog.name}")  # (its directory's disk, not the first's)
            raise
        except LogfsError as exc:
            if isinstance(exc, StorageIOError):
                plog.log_dir.report(exc, f"cleaning {plog.name}")
                raise  # the disk's error: the failure channel's; cleaning is retried if it is full
            log.info("cleaning %s-%d skipped: %s", plog.topic, plog.partition, exc)
            return False
        self.manager.update_cleaner_checkpoint(plog.topic, plog.partition, result.end_offset)
        stats = self.stats
        stats.cleaner_runs += 1
        stats.cleaner_removed_records += result.records_removed
        stats.cleaner_reclaimed_bytes += max(0, result.bytes_before - result.bytes_after)
        log.info("cleaned %s-%d up to offset %d: %d -> %d bytes, %d records removed", plog.topic, plog.partition,
                 result.end_offset, result.bytes_before, result.bytes_after, result.records_removed)
        return True

    async def _housekeeping_loop(self) -> None:
        while True:
            await self.housekeeping()
            with trio.move_on_after(self._tick_ms() / 1000):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def housekeeping(self) -> None:
        now = self.clock.time_ms()
        for i, (key, plog) in enumerate(list(self.manager.logs.items())):
            if i % 1024 == 1023:
                # A pass over every partition runs on the request thread: let the requests waiting meanwhile in
                # (20,000 partitions take tens of ms). What is checked below is cheap when nothing is due.
                await trio.sleep(0)
            if plog.on_roll is None:
                self.attach(plog)
            if plog.closed or plog.log_dir.offline:
                continue  # (nothing more is done on a directory whose disk failed, until the next mount)
            try:
                plog.maybe_roll_for_time(now)
            except (OSError, LogfsError) as exc:
                self._failed(f"time-based roll of {plog.topic}-{plog.partition}", exc)
            else:
                if self._failing:
                    self._recovered(f"time-based roll of {plog.topic}-{plog.partition}")
            due_flush = (now - plog.last_flush_ms >= plog.config.flush_ms and plog.unflushed_messages > 0)
            if key in self._roll_flush or due_flush:
                name = f"{plog.topic}-{plog.partition}"
                self._roll_flush.discard(key)
                upto = None if due_flush else plog.active_segment.base_offset
                if await self._guarded(f"flush of {name}", plog.flush, upto, log_dir=plog.log_dir) is None:
                    self._roll_flush.add(key)  # retried on the next tick
            if plog.deleted_segments:
                await self._guarded(f"unlinking deleted segments of {plog.topic}-{plog.partition}",
                                    plog.purge_deleted, now, log_dir=plog.log_dir)
        if now - self._last_retention_ms >= self.manager.broker.get("log.retention.check.interval.ms"):
            self._last_retention_ms = now
            deleted = await self._guarded("retention", self.retention, now)
            if deleted:
                self._last_checkpoint_ms = -1 << 62  # persist the new log start offsets now
        if now - self._last_checkpoint_ms >= self._checkpoint_interval_ms:
            self._last_checkpoint_ms = now
            await self._guarded("writing checkpoints", self.manager.checkpoint)
        await self._guarded("removing deleted partitions", self.manager.purge_deleted_dirs, now)
        if now - self._last_sweep_ms >= STAGING_SWEEP_MS:
            self._last_sweep_ms = now
            await self._guarded("removing old staged files", self.manager.transactions.sweep)

    def retention(self, now_ms: int) -> int:
        """One retention pass over every log (worker thread). Returns the number of segments deleted."""
        total = 0
        failure: BaseException | None = None
        for plog in list(self.manager.logs.values()):
            if plog.closed or plog.log_dir.offline:
                continue
            if self.manager.remote is not None and plog.config.remote_storage_enable:
                continue  # tiered: retention is the tiering task's (it never deletes what is not uploaded)
            try:
                count = delete_old_segments(plog, now_ms)
            except (OSError, LogfsError) as exc:
                # (reported to the log's directory by the log: the other directories' logs go on)
                plog.log_dir.report(exc, f"retention of {plog.name}")
                failure = failure or exc
                continue
            self.stats.retention_deleted_segments += count
            if count:
                log.info("retention deleted %d segment(s) of %s-%d; log start offset now %d",
                         count, plog.topic, plog.partition, plog.log_start_offset)
            total += count
        if failure is not None:
            raise failure
        return total

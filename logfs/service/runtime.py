"""Background work of a mounted store, as trio tasks owned by one nursery.

Owns the schedule, not the mechanism: time-based rolls (``segment.ms``, also for idle partitions), flushes
(``flush.ms`` and the asynchronous flush of a just-rolled segment), recovery-point and log-start-offset
checkpoints, and the unlinking of ``.deleted`` segments and ``-delete`` directories. Anything that touches the
disk beyond a page-cache write (fsync, unlink, directory fsync) runs in a worker thread, so the trio loop (and
with it every FUSE request) never waits on it.
"""

from __future__ import annotations

import logging

import trio

from ..storage.log import Log
from ..storage.manager import LogManager

log = logging.getLogger(__name__)

MAX_TICK_MS = 1000
MIN_TICK_MS = 10


class LogService:
    def __init__(self, manager: LogManager):
        self.manager = manager
        self.clock = manager.clock
        self._roll_flush: set[tuple[str, int]] = set()
        self._last_checkpoint_ms = self.clock.time_ms()
        self._wakeup = trio.Event()

    def _on_roll(self, key):
        def callback(_segment):
            self._roll_flush.add(key)
            self._wakeup.set()
        return callback

    def attach(self, plog: Log) -> None:
        plog.on_roll = self._on_roll((plog.topic, plog.partition))

    def _tick_ms(self) -> int:
        tick = MAX_TICK_MS
        for plog in list(self.manager.logs.values()):
            c = plog.config
            tick = min(tick, c.segment_ms // 4 if c.segment_ms < 4 * MAX_TICK_MS else MAX_TICK_MS)
            if c.flush_ms < 4 * MAX_TICK_MS:
                tick = min(tick, c.flush_ms // 4)
        interval = self.manager.broker.get("log.flush.offset.checkpoint.interval.ms")
        tick = min(tick, max(interval // 4, MIN_TICK_MS))
        return max(MIN_TICK_MS, tick)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.housekeeping()
            with trio.move_on_after(self._tick_ms() / 1000):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def housekeeping(self) -> None:
        now = self.clock.time_ms()
        for key, plog in list(self.manager.logs.items()):
            if plog.on_roll is None:
                self.attach(plog)
            if plog.closed:
                continue
            plog.maybe_roll_for_time()
            due_flush = (plog.unflushed_messages > 0 and now - plog.last_flush_ms >= plog.config.flush_ms)
            if key in self._roll_flush or due_flush:
                self._roll_flush.discard(key)
                upto = None if due_flush else plog.active_segment.base_offset
                await trio.to_thread.run_sync(plog.flush, upto)
            if plog.deleted_segments:
                await trio.to_thread.run_sync(plog.purge_deleted, now)
        interval = self.manager.broker.get("log.flush.offset.checkpoint.interval.ms")
        if now - self._last_checkpoint_ms >= interval:
            self._last_checkpoint_ms = now
            await trio.to_thread.run_sync(self.manager.checkpoint)
        await trio.to_thread.run_sync(self.manager.purge_deleted_dirs, now)

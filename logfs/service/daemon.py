"""Serving a mount: pyfuse3's request loop, the background LogService, signals and readiness, in one nursery.

Shutdown, however it starts (SIGTERM/SIGINT, ``fusermount3 -u``/``umount``), ends the same way: ``STOPPING=1``,
pending partial lines committed, unmounted, every log flushed and closed, checkpoints and the clean-shutdown
marker written. Readiness (``READY=1`` and the daemonizing parent's go-ahead) is signalled only once a
``stat`` of the mountpoint has gone through the kernel to this process and been answered.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Callable

import pyfuse3
import trio

from ..fuse.operations import Operations
from ..storage.manager import LogManager
from .metrics import Metrics, MetricsFile
from .notify import notify, watchdog_interval_s
from .runtime import LogService

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# glibc's malloc serves a FUSE request's data (pyfuse3 copies each WRITE, up to 1 MiB, into a new ``bytes``) and
# the batches encoded from it from the heap only while they are under its mmap threshold, and it returns the freed
# top of the heap to the kernel whenever that passes its trim threshold (by default 128 KiB, adjusted upwards to
# twice the largest block freed). Both defaults made every 1 MiB append fault in ~500 fresh zeroed pages (half
# the daemon's CPU for a bulk append, docs/benchmarks.md). Fixed thresholds keep those pages for the next request:
# at most TRIM_THRESHOLD of freed memory stays in the daemon's RSS.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 16 << 20
# Each arena keeps up to TRIM_THRESHOLD of freed memory, and glibc gives threads arenas of their own (up to 8 per
# core): the tiering pass's pool of threads (remote.log.manager.thread.pool.size) would each keep their own.
ARENA_MAX = 2


async def serve(manager: LogManager, mountpoint: str, fuse_opts: list[str], read_only: bool, ready,
                stop_requested: Callable[[], bool] = lambda: False, startup: dict | None = None) -> int:
    """Mount and serve until a signal or an unmount; returns the exit status.

    ``ready(error=None)`` (or None) is called once: with None when the mount answers, with a message if
    mounting failed. ``stop_requested()`` says whether a stop signal arrived before this function took over
    signal handling (then nothing is mounted and the manager is closed cleanly). ``startup``: how loading went
    (:meth:`StartupProgress.summary`), for the metrics."""
    # Take over SIGTERM/SIGINT first: from here on a stop signal always means a clean shutdown.
    with trio.open_signal_receiver(*STOP_SIGNALS, signal.SIGHUP) as signals:
        if stop_requested():
            notify("STOPPING=1\nSTATUS=stopped before mounting")
            log.info("stop requested before mounting; closing %s", manager.source)
            manager.close()
            return 0
        tune_malloc()
        ops = Operations(manager, read_only=read_only)
        log.debug("mounting %s on %s with FUSE options %s", manager.source, mountpoint, ",".join(fuse_opts))
        try:
            pyfuse3.init(ops, mountpoint, fuse_opts)
        except RuntimeError as exc:
            message = f"cannot mount on {mountpoint}: {exc}"
            log.error("%s", message, extra={"user_error": True})
            manager.close()
            if ready:
                ready(message)
            return 1
        return await _serve_mounted(manager, ops, mountpoint, ready, signals, startup)


def tune_malloc() -> bool:
    """Fixed malloc thresholds for this process (glibc; elsewhere a no-op). True if they were set."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(libc.mallopt(M_ARENA_MAX, ARENA_MAX))
    except (OSError, AttributeError):
        return False


async def _serve_mounted(manager: LogManager, ops: Operations, mountpoint: str, ready, signals,
                         startup: dict | None) -> int:
    unmounted_externally = False
    status = 0
    service = LogService(manager)
    metrics = None
    if manager.broker.get("logfs.metrics.file"):
        metrics = MetricsFile(manager.broker.get("logfs.metrics.file"),
                              Metrics(manager, ops, service, startup or {}),
                              manager.broker.get("logfs.metrics.interval.ms") / 1000)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)

            async def fuse_loop():
                nonlocal unmounted_externally
                await pyfuse3.main()
                unmounted_externally = True
                log.info("%s was unmounted", mountpoint)
                manager.stopping.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(fuse_loop)
            nursery.start_soon(_signals, signals, nursery.cancel_scope, manager)
            # Ready only once the kernel routes a request to us and we answer it. (Abandoned on a stop signal:
            # the unmount below then fails the stat.)
            try:
                await trio.to_thread.run_sync(os.stat, mountpoint, abandon_on_cancel=True)
            except OSError as exc:
                message = f"the mount on {mountpoint} does not answer: {exc.strerror or exc}"
                log.error("%s", message, extra={"user_error": True})
                if ready:
                    ready(message)
                status = 1
                nursery.cancel_scope.cancel()
                return status
            partitions = len(manager.logs)
            log.info("mounted %s on %s (%d partitions)", manager.source, mountpoint, partitions)
            notify(f"READY=1\nSTATUS=serving {partitions} partitions of {manager.source} on {mountpoint}")
            if ready:
                ready(None)
            if metrics is not None:
                nursery.start_soon(metrics.run)
            interval = watchdog_interval_s()
            if interval:
                log.debug("watchdog enabled: WATCHDOG=1 every %.3f s", interval)
                nursery.start_soon(_watchdog, interval)
    finally:
        notify(f"STOPPING=1\nSTATUS=shutting down: flushing {len(manager.logs)} partitions")
        log.info("shutting down")
        ops.close()  # (every handle's partial line committed, the read-ahead's threads ended)
        try:
            pyfuse3.close(unmount=not unmounted_externally)
        except Exception as exc:  # already unmounted underneath us
            log.debug("close: %s", exc)
        if metrics is not None:
            metrics.write()  # the final figures (every partial line committed), before the logs close
        manager.close()
        notify("STATUS=stopped: clean shutdown complete")
        log.info("clean shutdown complete")
    return status


async def _signals(signals, cancel_scope: trio.CancelScope, manager: LogManager) -> None:
    async for signum in signals:
        if signum == signal.SIGHUP:
            log.debug("ignoring SIGHUP")
            continue
        log.info("received %s", signal.Signals(signum).name)
        manager.stopping.set()  # (the cancel waits for worker threads; this cuts a long one short)
        cancel_scope.cancel()
        return


async def _watchdog(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)

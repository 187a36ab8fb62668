"""Serving a mount: pyfuse3's request loop, the background LogService, signals and readiness, in one nursery.

Shutdown, however it starts (SIGTERM/SIGINT, ``fusermount3 -u``/``umount``), ends the same way: pending
partial lines committed, unmounted, every log flushed and closed, checkpoints and the clean-shutdown marker
written.
"""

from __future__ import annotations

import logging
import os
import signal

import pyfuse3
import trio

from ..fuse.operations import Operations
from ..storage.manager import LogManager
from .notify import notify, watchdog_interval_s
from .runtime import LogService

log = logging.getLogger(__name__)


async def serve(manager: LogManager, mountpoint: str, fuse_opts: list[str], read_only: bool, ready) -> int:
    ops = Operations(manager, read_only=read_only)
    try:
        pyfuse3.init(ops, mountpoint, fuse_opts)
    except RuntimeError as exc:
        message = f"cannot mount on {mountpoint}: {exc}"
        log.error("%s", message)
        manager.close()
        if ready:
            ready(message)
        return 1
    unmounted_externally = False
    try:
        async with trio.open_nursery() as nursery:
            service = LogService(manager)
            await nursery.start(service.run)

            async def fuse_loop():
                nonlocal unmounted_externally
                await pyfuse3.main()
                unmounted_externally = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(fuse_loop)
            nursery.start_soon(_signals, nursery.cancel_scope)
            # Ready only once the kernel routes a request to us and we answer it.
            await trio.to_thread.run_sync(os.stat, mountpoint)
            log.info("mounted %s on %s (%d partitions)", manager.data_dir, mountpoint, len(manager.logs))
            notify(f"READY=1\nSTATUS=serving {len(manager.logs)} partitions")
            if ready:
                ready(None)
            interval = watchdog_interval_s()
            if interval:
                nursery.start_soon(_watchdog, interval)
    finally:
        notify("STOPPING=1")
        log.info("shutting down")
        ops.release_all()
        try:
            pyfuse3.close(unmount=not unmounted_externally)
        except Exception as exc:  # already unmounted underneath us
            log.debug("close: %s", exc)
        manager.close()
        log.info("clean shutdown complete")
    return 0


async def _signals(cancel_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                continue
            log.info("received %s", signal.Signals(signum).name)
            cancel_scope.cancel()
            return


async def _watchdog(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)

"""Follower mounts in the daemon (CONTRACT section 10): the tiered log of a writer, read-only, on any host, from
the bucket.

``logfs s3://BUCKET/PREFIX MOUNTPOINT -o logfs.remote.s3.endpoint=URL`` mounts what a writing daemon tiers under
that prefix. This module is the service's part: the source parsed (:func:`parse_source`), where the cache lives
(:func:`default_cache_dir`), the setup at mount (:func:`setup`: the read-only stores, their check, the state
cached by the last run) and the trio task that follows every ``logfs.follow.interval.ms`` (:class:`FollowTask`).
What following does (the follower index polled, changed manifests applied, the lag kept) is the engine's:
:mod:`logfs.storage.tiered.follower`.

- Everything that would write is ``EROFS`` (the kernel mount is read-only, and so are the Operations).
- The store down: stat, listing and xattrs answer from what was seen last; reads of uncached ranges fail with
  ``EIO`` within the tiered read path's bound; following retries every interval, the failure logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os

from ..remote.api import RemoteStoreError
from ..storage.errors import LogfsError
from ..storage.manager import LogManager
from ..storage.tiered.follower import Follower

log = logging.getLogger(__name__)


def parse_source(source: str) -> tuple[str, str] | None:
    """``s3://BUCKET[/PREFIX]`` -> (bucket, prefix); None for anything else (a data directory)."""
    if not source.startswith("s3://"):
        return None
    rest = source[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{source}: no bucket")
    return bucket, prefix.strip("/")


def default_cache_dir(endpoint: str, bucket: str, prefix: str) -> str:
    """Where a follower keeps its cache when ``logfs.remote.cache.dir`` is not set: one directory per source under
    ``$XDG_CACHE_HOME/logfs`` (``/var/cache/logfs`` for root)."""
    base = "/var/cache/logfs" if os.geteuid() == 0 else os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "logfs")
    digest = hashlib.blake2b(f"{endpoint}\n{bucket}\n{prefix}".encode(), digest_size=6).hexdigest()
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{bucket}-{prefix}")[:80]
    return os.path.join(base, f"follower-{name}-{digest}")


class FollowTask:
    """Every ``logfs.follow.interval.ms`` (a broker mount: ``logfs.broker.poll.ms``), one ``sync_once`` in a worker
    thread; a failure is logged once until it works again."""

    def __init__(self, follower: Follower, interval_ms: int, what: str = "the bucket"):
        """``follower``: anything with a ``sync_once()`` (a follower mount's :class:`Follower`, or a broker mount's
        :class:`~logfs.storage.broker.BrokerLogs`); ``what`` it follows, for the log."""
        self.follower = follower
        self.interval_s = interval_ms / 1000
        self.what = what
        self._failing: str | None = None

    async def run(self) -> None:
        import trio

        while True:
            await self.once()
            await trio.sleep(self.interval_s)

    async def once(self) -> None:
        import trio

        try:
            await trio.to_thread.run_sync(self.follower.sync_once, abandon_on_cancel=True)
        except (RemoteStoreError, LogfsError, OSError) as exc:
            message = f"{type(exc).__name__}: {exc}"
            if self._failing != message:
                log.error("following %s failed (will retry): %s", self.what, message)
                self._failing = message
            return
        if self._failing is not None:
            log.info("following %s works again", self.what)
            self._failing = None


def setup(manager: LogManager, prefix: str) -> Follower:
    """At startup (before mounting): the store (read-only), its check (a missing bucket or refused credentials
    raise RemoteSetupError; an unreachable store is logged, and following retries), the state cached by the last
    run published at once, then one look at the bucket if it answers."""
    from ..remote.api import ReadOnlyStore
    from ..storage.tiered.manager import RemoteLogManager
    from .tiering import check_at_mount, make_stores

    broker = manager.broker
    store, read_store, where = make_stores(broker)
    reachable = check_at_mount(read_store, where, "follower", "mounting what was seen last, following retries")
    rlm = RemoteLogManager(manager.data_dir, manager.logs, ReadOnlyStore(store), read_store=ReadOnlyStore(read_store),
                           prefix=prefix, cache_bytes=broker.get("logfs.remote.cache.bytes"), stopping=manager.stopping,
                           open_files=manager.open_files)
    follower = Follower(manager, rlm, prefix)
    manager.attach_tiering(rlm, follower)
    follower.attach_cached()
    if reachable:
        try:
            follower.sync_once()
        except (RemoteStoreError, LogfsError, OSError) as exc:
            log.warning("follower: first look at %s failed (%s); following retries", where, exc)
    log.info("following %s, prefix %r", where, prefix)
    return follower

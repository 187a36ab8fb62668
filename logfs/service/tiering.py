"""Tiered storage in the daemon: choosing the store from the settings, the check at mount, and the trio task that
runs :class:`~logfs.storage.tiered.manager.RemoteLogManager` passes in worker threads.

Stores: ``logfs.remote.dir=/path`` is a :class:`~logfs.remote.directory.DirectoryStore` (a local or NFS
archive); otherwise ``logfs.remote.s3.bucket`` (+ ``endpoint``, ``region``, ``prefix``) is an
:class:`~logfs.remote.s3.S3Store` with credentials from the AWS chain only. Uploads and retention use a store with
the default time bound; reads of tiered ranges use one with fewer, shorter attempts (:data:`READ_TIMEOUTS`), so a
read of a tiered range with the store down or stalled fails with EIO within ``read_store.worst_case_seconds``
(22 s), and at once when the store refuses connections.

The task: every ``remote.log.manager.task.interval.ms``, one pass per tiered partition (upload, whole-log and
local retention), in a worker thread: the trio loop and with it every FUSE request never waits for the store. A
partition whose pass fails (store down, slow, refusing) backs off exponentially (interval x 2^n, at most
:data:`MAX_BACKOFF_S`); the failure is logged once until it works again. Appends never wait for any of it:
local segments simply stay until they are tiered.
"""

from __future__ import annotations

import logging
import threading

import trio

from ..remote.api import RemoteAuthError, RemoteStore, RemoteStoreError, RemoteUnavailableError
from ..remote.directory import DirectoryStore
from ..storage.errors import LogfsError
from ..storage.failure import offline_by as _offline_by
from ..storage.manager import LogManager
from ..storage.tiered.follower import IndexPublisher
from ..storage.tiered.manager import RemoteLogManager

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
#: How long the mount waits for the store's check: past this, it mounts and the task retries.
CHECK_TIMEOUT_S = 10.0
#: S3 timeouts for reads of tiered ranges: (connect s, read s, attempts) -> 2 x (3 + 5) + 6 = 22 s at most.
READ_TIMEOUTS = (3.0, 5.0, 2)


class RemoteSetupError(Exception):
    """The store named by the settings cannot be used (missing bucket, refused credentials): no mount."""


def make_stores(broker) -> tuple[RemoteStore, RemoteStore, str]:
    """(store for uploads and retention, store for reads, description) from the broker settings."""
    directory = broker.get("logfs.remote.dir")
    if directory:
        store = DirectoryStore(directory)
        return store, store, f"directory {directory}"
    from ..remote.s3 import S3Store  # only here: the engine and a daemon without S3 never load boto3

    for name in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)  # their debug lines carry signed headers
    bucket = broker.get("logfs.remote.s3.bucket")
    endpoint = broker.get("logfs.remote.s3.endpoint") or None
    region = broker.get("logfs.remote.s3.region")
    connect, read, attempts = READ_TIMEOUTS
    try:
        store = S3Store(bucket, endpoint=endpoint, region=region)
        read_store = S3Store(bucket, endpoint=endpoint, region=region, connect_timeout=connect,
                             read_timeout=read, max_attempts=attempts)
    except ValueError as exc:  # e.g. an endpoint that is not a URL
        raise RemoteSetupError(f"logfs.remote.s3.endpoint {endpoint!r}: {exc}") from None
    return store, read_store, f"s3://{bucket} at {endpoint or 'AWS'}"


def setup(manager: LogManager) -> RemoteLogManager | None:
    """At startup (before mounting): the stores, their check, and the remote state from the local cache. A
    missing bucket or refused credentials raise RemoteSetupError; an unreachable store is logged, and retried by
    the task."""
    broker = manager.broker
    if not broker.get("remote.log.storage.system.enable"):
        return None
    store, read_store, where = make_stores(broker)
    reachable = check_at_mount(read_store, where, "tiered storage", "mounting anyway, uploads retry")
    rlm = RemoteLogManager(manager.data_dir, manager.logs, store, read_store=read_store,
                           prefix=broker.get("logfs.remote.s3.prefix"),
                           cache_bytes=broker.get("logfs.remote.cache.bytes"), stopping=manager.stopping,
                           open_files=manager.open_files)
    rlm.attach_cached(store_reachable=reachable)
    log.info("tiered storage to %s", where)
    return rlm


def check_at_mount(store: RemoteStore, where: str, what: str, unreachable: str) -> bool:
    """The store's check at mount: whether it answered. A missing bucket or refused credentials raise
    RemoteSetupError (no mount); an unreachable store is logged (``what: where cannot be reached; unreachable``)."""
    try:
        _check(store, CHECK_TIMEOUT_S)
        return True
    except RemoteUnavailableError as exc:
        log.warning("%s: %s cannot be reached (%s); %s", what, where, exc, unreachable)
    except RemoteAuthError as exc:
        raise RemoteSetupError(f"{what}: the store refused the credentials of the AWS chain: {exc}") from None
    except RemoteStoreError as exc:
        raise RemoteSetupError(f"{what}: {exc}") from None
    return False


def _check(store: RemoteStore, timeout: float) -> None:
    """``store.check()``, waiting at most ``timeout`` seconds: a store that does not answer by then counts as
    unreachable (the check goes on in its thread; its outcome is no longer needed)."""
    outcome: list = []

    def run() -> None:
        try:
            store.check()
            outcome.append(None)
        except BaseException as exc:  # handed to the caller
            outcome.append(exc)

    thread = threading.Thread(target=run, name="remote-store-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise RemoteUnavailableError(f"no answer within {timeout:g} s")
    if outcome[0] is not None:
        raise outcome[0]


class TieringTask:
    """The periodic passes of one RemoteLogManager, with per-partition backoff."""

    def __init__(self, manager: LogManager, rlm: RemoteLogManager):
        self.manager = manager
        self.rlm = rlm
        self.index = IndexPublisher(rlm)  # the follower index (what followers poll)
        self.interval_s = manager.broker.get("remote.log.manager.task.interval.ms") / 1000
        self._failures: dict[tuple[str, int], int] = {}  # consecutive failed passes (the backoff)
        self.failed_passes: dict[tuple[str, int], int] = {}  # all failed passes (for the metrics)
        self._next_try: dict[tuple[str, int], float] = {}
        self._failing: dict[str, str] = {}

    async def run(self) -> None:
        while True:
            await self.run_once()
            await trio.sleep(self.interval_s)

    async def run_once(self) -> None:
        """One pass: every tiered partition's sync (load, upload, retention), ``remote.log.manager.thread.pool.size``
        at a time (Kafka's RLM tasks run in a pool of that size: a pass over thousands of new partitions, a LIST and
        a GET each, is store round trips, not CPU), then the deletes of deleted partitions and the follower index."""
        now = trio.current_time()
        limiter = trio.CapacityLimiter(self.manager.broker.get("remote.log.manager.thread.pool.size"))

        async def one(plog, token) -> None:
            key = (plog.topic, plog.partition)
            what = f"tiering of {plog.topic}-{plog.partition}"
            try:
                ok = await self._guarded(what, self.rlm.sync, plog, self.manager.clock.time_ms(),
                                         log_dir=plog.log_dir)
            finally:
                limiter.release_on_behalf_of(token)
            if ok:
                self._failures.pop(key, None)
                self._next_try.pop(key, None)
            else:
                n = self._failures[key] = self._failures.get(key, 0) + 1
                self.failed_passes[key] = self.failed_passes.get(key, 0) + 1
                self._next_try[key] = now + min(self.interval_s * 2 ** n, max(MAX_BACKOFF_S, self.interval_s))

        async with trio.open_nursery() as nursery:
            for plog in self.rlm.tiered_logs():
                if self._next_try.get((plog.topic, plog.partition), 0) > now:
                    continue
                token = object()  # (taken here: at most the pool's size of tasks exist at once)
                await limiter.acquire_on_behalf_of(token)
                nursery.start_soon(one, plog, token)
        await self._guarded("deleting the remote objects of deleted partitions", self.rlm.purge_deleted)
        configs = {t: dict(self.manager.topics.get(t, {})) for t, _ in self.rlm.shown_manifests()}
        await self._guarded("publishing the follower index", self.index.publish, configs)

    async def _guarded(self, what: str, fn, *args, log_dir=None) -> bool:
        """``fn(*args)`` in a worker thread. ``log_dir``: the directory whose disk the step uses (a partition's; by
        default the first, which holds tiering's own files)."""
        log_dir = log_dir or self.manager.log_dir
        if log_dir.offline:
            return False  # uploads read local segments and local retention deletes them: not on a failed disk
        try:
            # Abandoned when the daemon stops: a call to a stalled store may take its whole time bound (~50 s),
            # and shutdown does not wait for it. The pass sees manager.stopping and changes nothing local after
            # that (RemoteLogManager.sync); what it leaves in the bucket is an orphan, removed at the next start.
            await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        except (RemoteStoreError, OSError, LogfsError, ValueError) as exc:
            if not isinstance(exc, RemoteStoreError):
                log_dir.report(exc, what)  # the local disk failed: offline (a full one: retried)
                if _offline_by(exc, log_dir):
                    return False  # (logged once, by the failure channel)
            message = f"{type(exc).__name__}: {exc}"
            if self._failing.get(what) != message:
                log.error("%s failed (will retry with backoff): %s", what, message)
                self._failing[what] = message
            return False
        if self._failing.pop(what, None) is not None:
            log.info("%s works again", what)
        return True

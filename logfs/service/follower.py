"""Follower mounts (CONTRACT section 10): the tiered log of a writer, read-only, on any host, from the bucket.

``logfs s3://BUCKET/PREFIX MOUNTPOINT -o logfs.remote.s3.endpoint=URL`` mounts what a writing daemon tiers under
that prefix. The follower is the writer's daemon with no local records:

- Its "data directory" is a cache directory (``logfs.remote.cache.dir``) laid out as the writer's: one directory
  per partition, holding one empty local segment at the tiered log's end (so the log end offset is the writer's
  ``remote_log_end_offset``), the manifest's local copy, the tiered segments' index copies and the bounded block
  cache (``logfs.remote.cache.bytes``). Reads go through the writer's own tiered read path (remote segments,
  block cache, read-ahead, outage bounds) and the same view, so text and positions are byte for byte the
  writer's for those offsets.
- Following costs one request per ``logfs.follow.interval.ms`` when nothing changed: a GET of the prefix's
  follower index (:class:`~logfs.remote.manifest.FollowerIndex`) with ``If-None-Match`` (304, no body). When it
  changed, only the manifests whose generation moved are read, and each new segment's three index objects.
- The writer publishes that index after each tiering pass that changed a manifest or a topic setting: the topics
  and their settings (``logfs.key.separator``, ``logfs.null.marker`` shape the text), and each partition's
  manifest generation. A topic or partition the index no longer names is removed from the mount.
- Everything that would write is ``EROFS`` (the kernel mount is read-only, and so are the Operations).
- The store down: stat, listing and xattrs answer from what was seen last; reads of uncached ranges fail with
  ``EIO`` within the tiered read path's bound; following retries every interval, the failure logged once.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import threading
import time

from ..remote.api import RemoteNotFoundError, RemoteStoreError
from ..remote.manifest import ManifestStore, decode_index, index_key
from ..storage.errors import LogfsError
from ..storage.manager import LogManager

log = logging.getLogger(__name__)

#: Manifests read at once when many partitions changed (catching up): a few of the store client's 10 connections,
#: the rest left to reads. Read a chunk at a time (each applied as it comes).
MANIFEST_READERS = 4
MANIFEST_CHUNK = 256


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


class Follower:
    """Keeps a follower's LogManager in step with the bucket (:meth:`sync_once`, in a worker thread)."""

    def __init__(self, manager: LogManager, prefix: str):
        self.manager = manager
        self.rlm = manager.remote
        self.store = self.rlm.read_store
        self.prefix = prefix
        self.manifests = ManifestStore(self.store, prefix)
        self.etag: str | None = None
        self.generations: dict[tuple[str, int], int] = {}  # manifest generation each partition shows
        self.requests = 0  # requests to the store for following (index polls, manifests; metrics)
        self.syncs = 0  # index changes applied
        self.last_sync_s = 0.0  # time.time() of the last successful look at the index
        # For the lag metrics (metrics.py): the writer's remote_log_end_offset of each partition as the newest index
        # read names it (set before that index is applied, so a render meanwhile sees the lag); the writer's publish
        # time of the newest index applied (seconds since the epoch; -1: an older writer's index gives none) and
        # when it was applied; and when a look last began after which the follower showed everything published
        # (a 304, or an index applied whole): the follower is at most ``now - current_since_s`` behind.
        self.published_ends: dict[tuple[str, int], int] = {}
        self.applied_published_s = -1.0
        self.applied_at_s = 0.0
        self.current_since_s = 0.0
        for plog in manager.logs.values():
            plog.follower = True

    def sync_once(self) -> bool:
        """Look at the index; apply what changed. Whether anything did. Raises RemoteStoreError (the task
        retries)."""
        began = time.time()
        try:
            data, etag = self.store.get_if_changed(index_key(self.prefix), self.etag)
        except RemoteNotFoundError:
            data, etag = None, None  # nothing tiered under that prefix yet
            self.published_ends = {}
        finally:
            self.requests += 1
        self.last_sync_s = time.time()
        if data is None:
            if self.etag == etag:  # unchanged since applied whole (or nothing there yet): current
                self.current_since_s = began
            return False
        index = decode_index(data)
        self.published_ends = {(topic, p): end for topic, entry in index.topics.items()
                               for p, end in entry["end_offsets"].items()}
        manager = self.manager
        changed: list[tuple[str, int]] = []
        for topic, entry in sorted(index.topics.items()):
            self._topic(topic, entry["config"], entry["partitions"])
            changed += [(topic, partition) for partition, generation in sorted(entry["partitions"].items())
                        if self.generations.get((topic, partition)) != generation]
        try:
            for (topic, partition), m in self._read_manifests(changed):
                plog = manager.logs[(topic, partition)]
                tier = self.rlm._tier(plog)
                tier.loaded = True
                self.rlm._publish(tier, m, fetch=True)
                self.generations[(topic, partition)] = m.generation
        finally:
            if len(changed) > 1:  # the readers' extra connections: not kept alive, holding descriptors, when idle
                self.store.drop_idle_connections()
        for topic in list(manager.topics):
            named = index.topics.get(topic, {}).get("partitions", {})
            for partition in manager.partitions(topic):
                if partition not in named:
                    manager.delete_partition(topic, partition)
                    self.generations.pop((topic, partition), None)
            if topic not in index.topics:
                manager.delete_topic(topic)
        self.etag = etag
        self.syncs += 1
        self.applied_at_s = time.time()
        self.applied_published_s = index.published_ms / 1000 if index.published_ms >= 0 else -1.0
        self.current_since_s = began
        return True

    def _read_manifests(self, keys: list[tuple[str, int]]):
        """(key, manifest) for each partition in ``keys``, in order. Several: read by up to MANIFEST_READERS threads
        at once, MANIFEST_CHUNK at a time, so catching up on thousands of changed partitions is not one GET's round
        trip after another. Each is applied as it comes; a failure stops there (what came before stays applied).
        Daemon threads, as the read-ahead's: a GET to a stalled store never holds up the daemon's exit."""
        for i in range(0, len(keys), MANIFEST_CHUNK):
            chunk = keys[i:i + MANIFEST_CHUNK]
            results = [concurrent.futures.Future() for _ in chunk]
            todo = iter(range(len(chunk)))
            lock, stop = threading.Lock(), threading.Event()

            def work() -> None:
                while not stop.is_set():
                    with lock:
                        j = next(todo, None)
                    if j is None:
                        return
                    try:
                        results[j].set_result(self.manifests.read(*chunk[j]))
                    except BaseException as exc:  # noqa: BLE001 - raised by the applier, in order
                        results[j].set_exception(exc)

            if len(chunk) == 1:
                work()  # (one change, the usual case: no thread)
            else:
                for _ in range(min(MANIFEST_READERS, len(chunk))):
                    threading.Thread(target=work, name="logfs-follow-manifests", daemon=True).start()
            try:
                for key, result in zip(chunk, results):
                    m = result.result()
                    self.requests += 1
                    yield key, m
            finally:
                stop.set()  # (a failure, or the applier gone: the threads take no more)

    def lag_offsets(self) -> dict[str, int]:
        """Per topic: the writer's ``remote_log_end_offset`` summed over its partitions, as the newest follower
        index read names them, less what this follower shows (each partition's difference, never below 0)."""
        lag: dict[str, int] = {}
        logs = self.manager.logs
        for (topic, partition), end in list(self.published_ends.items()):
            plog = logs.get((topic, partition))
            shown = plog.log_end_offset if plog is not None and not plog.closed else 0
            lag[topic] = lag.get(topic, 0) + max(0, end - shown)
        return lag

    def _topic(self, topic: str, config: dict[str, str], partitions) -> None:
        manager = self.manager
        if topic not in manager.topics:
            manager.create_topic(topic, partitions=0)
        manager.replace_overrides(topic, config)
        for partition in sorted(partitions):
            if (topic, partition) not in manager.logs:
                while True:  # (partitions are created in order; a hole the writer left stays an empty one)
                    plog = manager.create_partition(topic, min(manager.next_partition(topic), partition))
                    plog.follower = True
                    if plog.partition == partition:
                        break


class FollowTask:
    """Every ``logfs.follow.interval.ms``, one :meth:`Follower.sync_once` in a worker thread; a failure is logged
    once until it works again."""

    def __init__(self, follower: Follower, interval_ms: int):
        self.follower = follower
        self.interval_s = interval_ms / 1000
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
                log.error("following the bucket failed (will retry): %s", message)
                self._failing = message
            return
        if self._failing is not None:
            log.info("following the bucket works again")
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
    manager.remote = RemoteLogManager(manager.data_dir, manager.logs, ReadOnlyStore(store),
                                      read_store=ReadOnlyStore(read_store), prefix=prefix,
                                      cache_bytes=broker.get("logfs.remote.cache.bytes"), stopping=manager.stopping)
    follower = Follower(manager, prefix)
    manager.remote.attach_cached(store_reachable=False)
    follower.generations = {k: t.manifest.generation for k, t in manager.remote.tiers.items()
                            if t.manifest is not None}
    if reachable:
        try:
            follower.sync_once()
        except (RemoteStoreError, LogfsError, OSError) as exc:
            log.warning("follower: first look at %s failed (%s); following retries", where, exc)
    log.info("following %s, prefix %r", where, prefix)
    manager.follower = follower
    return follower

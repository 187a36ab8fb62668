"""A follower mount's engine (CONTRACT section 10): the logs of a follower's LogManager kept in step with what a
writer tiers under a prefix of the bucket.

The follower is the writer's daemon with no local records: its data directory is a cache laid out as the
writer's (one directory per partition, one empty local segment at the tiered log's end, the manifest's local copy,
the tiered segments' index copies, the block cache), and reads go through the writer's own tiered read path. The
service (:mod:`logfs.service.follower`) sets it up and runs :meth:`Follower.sync_once` in a worker thread every
``logfs.follow.interval.ms``:

- one request when nothing changed: a GET of the prefix's follower index
  (:class:`~logfs.remote.manifest.FollowerIndex`) with ``If-None-Match`` (304, no body). When it changed, only the
  manifests whose generation moved are read (:data:`MANIFEST_READERS` at once), and each new segment's three index
  objects; each is applied through :meth:`~logfs.storage.tiered.manager.RemoteLogManager.apply_manifest`;
- the topics and their settings follow the index; a topic or partition it no longer names is removed;
- its lag (for the metrics): offsets behind the index's end offsets, seconds since it last knew it was current.

The writer's side is :class:`IndexPublisher`: the follower index written after each tiering pass that changed a
manifest or a topic setting.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Iterable, Protocol

from ...remote.api import RemoteCorruptError, RemoteNotFoundError
from ...remote.manifest import FollowerIndex, ManifestStore, decode_index, encode_index, index_key
from ..clock import SYSTEM_CLOCK
from ..local.log import Log

if TYPE_CHECKING:
    from .manager import RemoteLogManager

#: Manifests read at once when many partitions changed (catching up): a few of the store client's 10 connections,
#: the rest left to reads. Read a chunk at a time (each applied as it comes).
MANIFEST_READERS = 4
MANIFEST_CHUNK = 256


class FollowedLogs(Protocol):
    """What a follower needs of its LogManager: its logs, and the topics' and partitions' creation and removal."""

    logs: dict[tuple[str, int], Log]
    topics: dict[str, dict[str, str]]

    def create_topic(self, topic: str, partitions: int | None = None) -> None: ...
    def replace_overrides(self, topic: str, overrides: dict[str, str]) -> None: ...
    def create_partition(self, topic: str, partition: int) -> Log: ...
    def next_partition(self, topic: str) -> int: ...
    def partitions(self, topic: str) -> list[int]: ...
    def delete_partition(self, topic: str, partition: int) -> None: ...
    def delete_topic(self, topic: str) -> None: ...


class Follower:
    """Keeps a follower's logs in step with the bucket (:meth:`sync_once`, in a worker thread)."""

    def __init__(self, manager: FollowedLogs, rlm: "RemoteLogManager", prefix: str):
        self.manager = manager
        self.rlm = rlm
        self.store = rlm.read_store
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

    def attach_cached(self) -> None:
        """At startup: the state cached by the last run published (before the store is asked anything)."""
        self.rlm.attach_cached(store_reachable=False)
        self.generations = {key: m.generation for key, m in self.rlm.shown_manifests().items()}

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
                self.rlm.apply_manifest(manager.logs[(topic, partition)], m)
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

    def _read_manifests(self, keys: list[tuple[str, int]]) -> Iterable:
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


class IndexPublisher:
    """A writer's follower index (:class:`~logfs.remote.manifest.FollowerIndex`) under its prefix: what a follower
    polls."""

    def __init__(self, rlm: "RemoteLogManager"):
        self.rlm = rlm
        self._body: bytes | None = None  # the index last written (its generation and time aside)
        self._generation: int | None = None

    def publish(self, configs: dict[str, dict[str, str]], now_ms: int | None = None) -> bool:
        """Write the index if what it would say changed since the last write: each tiered partition's manifest
        generation, and its topic's settings (``configs``: topic -> overrides); with each partition's
        ``remote_log_end_offset`` and the time of the write, ``now_ms`` (the wall clock if not given): a follower's
        lag in offsets and seconds. After the manifests it names, so a follower that reads it finds them at least
        that new. Returns whether it wrote."""
        topics: dict = {}
        for (topic, partition), manifest in self.rlm.shown_manifests().items():
            entry = topics.setdefault(topic, {"config": dict(configs.get(topic, {})), "partitions": {},
                                              "end_offsets": {}})
            entry["partitions"][partition] = manifest.generation
            entry["end_offsets"][partition] = manifest.remote_log_end_offset
        body = encode_index(FollowerIndex(0, topics))  # (what it says, its generation and time aside)
        if body == self._body:
            return False
        store, key = self.rlm.store, index_key(self.rlm.prefix)
        if self._generation is None:
            try:
                self._generation = decode_index(store.get_bytes(key)).generation
            except (RemoteNotFoundError, RemoteCorruptError):
                self._generation = 0
        generation = self._generation + 1
        published = SYSTEM_CLOCK.time_ms() if now_ms is None else now_ms
        store.put_bytes(key, encode_index(FollowerIndex(generation, topics, published)))
        self._generation, self._body = generation, body
        return True

"""All partitions of the log directories (one DATA_DIR, or Kafka's ``log.dirs``): topics, partitions, placement,
checkpoints, and the clean shutdown.

Owns the Kafka log-directory layout (the names themselves are :mod:`.names`'s; one directory's own files:
:mod:`.log_dirs`), topic registration (the topics' settings and modes: :mod:`.topics`), loading at mount
(:mod:`.loading`), moves between directories (:mod:`.moves`) and asynchronous deletion of partitions
(directories renamed for deletion, removed later by :meth:`LogManager.purge_deleted_dirs`). What a log directory
holds besides is logged once at startup and never touched.

Thread safety: topic/partition creation and deletion and config changes are serialised by ``lock``; each
log has its own writer lock.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import threading
from typing import TYPE_CHECKING, Callable

from . import checkpoints as ckpt
from .clock import SYSTEM_CLOCK, Clock
from .config import BrokerConfig, LogConfig
from .errors import (
    InvalidOffsetError, InvalidPartitionError, InvalidTopicError, LogfsError, NoSuchTopicError,
    ShuttingDownError, StorageIOError, TopicExistsError, TopicNotEmptyError,
)
from .failure import SPACE_ERRNOS, guarded
from .log_dirs import DataDir, next_log_dir, parse_log_dirs
from .local.loader import load_log
from .publish.transactions import Transactions
from .loading import LogDirsLoading
from .moves import PartitionMoves
from .topics import TopicSettings
from .local.log import Log
from .local.open_files import raise_fd_limit
from .names import (
    TOPICS_FILE, collision_key, delete_dir_name, partition_dir_name,
    validate_topic_name,
)

if TYPE_CHECKING:  # (a mount without tiering never loads it)
    from .tiered.follower import Follower
    from .tiered.manager import RemoteLogManager

log = logging.getLogger(__name__)


class LogManager(TopicSettings, PartitionMoves, LogDirsLoading):
    def __init__(self, data_dir: str, broker: BrokerConfig | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 progress: Callable[[int, int], None] | None = None,
                 segment_progress: Callable[[int, int], None] | None = None):
        """``progress(done, total)`` is called after each partition is loaded; ``segment_progress(done,
        total)`` once per segment (and once when a partition is complete), counted over all partitions. Its
        ``total`` starts as the number of ``.log`` files found and is corrected as each partition's loader
        settles it (completing a compaction swap can remove segments)."""
        paths = parse_log_dirs(data_dir) if isinstance(data_dir, str) else [os.path.abspath(p) for p in data_dir]
        # The log directories (Kafka's log.dirs): each with its own lock, checkpoints and health. The first also
        # holds the mount's own state (the sink's staging and transactions, tiering's pending deletions).
        self.dirs = [DataDir(p) for p in paths]
        self._dirs_by_path = {d.path: d for d in self.dirs}
        self.data_dir = self.dirs[0].path
        self.broker = broker or BrokerConfig.from_properties({})
        self.clock = clock
        self.lock = threading.RLock()
        self.logs: dict[tuple[str, int], Log] = {}
        self._topic_logs: dict[str, dict[int, Log]] = {}  # the same logs by topic (no operation scans them all)
        # Each topic's partition numbers, kept ascending as logs are added and dropped (a new partition is the
        # next number: an append), so listing them or finding the next one sorts nothing. Sorting on every
        # creation made a follower's catch-up of 20,000 partitions quadratic (docs/benchmarks.md, issue 33).
        self._topic_parts: dict[str, list[int]] = {}
        self.topics: dict[str, dict[str, str]] = {}  # topic -> overrides
        self.attrs: dict[str, tuple[int, int, int]] = {}  # "", "topic", "topic/N" -> (mode, uid, gid)
        self._deleted_dirs: list[tuple[int, str]] = []
        # Tiered storage's RemoteLogManager, and a follower mount's Follower (the logs come from the bucket): given
        # by the service through attach_tiering, once, before the mount serves anything.
        self.remote: RemoteLogManager | None = None
        self.follower: Follower | None = None
        # Set (from any thread, without the lock) when the daemon stops: a topic creation still running then
        # gives up and undoes itself, so the shutdown waits for at most one partition.
        self.stopping = threading.Event()
        self.moving: dict[tuple[str, int], str] = {}  # partitions being moved -> their target directory
        self.move_threads: set = set()
        self.moves_done = self.moves_failed = 0
        # The first directory's health (each directory has its own: storage/failure.py, as Kafka's
        # LogDirFailureChannel): the manager's own files (topics, sink, tiering) fail with it.
        self.log_dir = self.dirs[0].log_dir
        raise_fd_limit()
        locked: list[DataDir] = []
        try:
            for d in self.dirs:
                d.acquire_lock()
                locked.append(d)
        except BaseException:
            for d in locked:
                d.release_lock()
            raise
        try:
            self._load(progress, segment_progress)
            # The Spark sink's commits: the ones a crash interrupted are completed before anything is served.
            self.transactions = Transactions(self)
            self.transactions.open()
        except BaseException:
            for partition_log in self.logs.values():
                partition_log.close_without_flush()
            for d in self.dirs:
                d.release_lock()
            raise
        self.closed = False

    def attach_tiering(self, remote: RemoteLogManager | None, follower: Follower | None = None) -> None:
        """Turn tiered storage on (the service, at startup, before the mount serves anything): ``remote`` uploads,
        deletes and reads this manager's tiered partitions; with ``follower``, a follower mount's logs come from the
        bucket through it."""
        self.remote, self.follower = remote, follower

    # -- topics (their listing: the TopicSettings mixin) -----------------------------------------------

    def dir_of(self, plog: Log) -> DataDir:
        """The log directory holding ``plog``."""
        return self._dirs_by_path[os.path.dirname(plog.directory)]

    def _add_log(self, plog: Log) -> Log:
        self.dir_of(plog).partitions += 1
        self.logs[(plog.topic, plog.partition)] = plog
        logs = self._topic_logs.setdefault(plog.topic, {})
        if plog.partition not in logs:
            bisect.insort(self._topic_parts.setdefault(plog.topic, []), plog.partition)  # (the next: at the end)
        logs[plog.partition] = plog
        return plog

    def _drop_log(self, topic: str, partition: int) -> Log | None:
        plog = self.logs.pop((topic, partition), None)
        if plog is not None:
            self.dir_of(plog).partitions -= 1
        logs = self._topic_logs.get(topic)
        if logs is not None and logs.pop(partition, None) is not None:
            parts = self._topic_parts[topic]
            del parts[bisect.bisect_left(parts, partition)]
            if not logs:
                del self._topic_logs[topic], self._topic_parts[topic]
        return plog

    @guarded("topic creation", convert=False)
    def create_topic(self, topic: str, partitions: int | None = None) -> None:
        validate_topic_name(topic)
        with self.lock:
            if topic in self.topics:
                raise TopicExistsError(f"topic {topic!r} exists")
            other = self._collisions.get(collision_key(topic))
            if other is not None:
                raise InvalidTopicError(f"topic {topic!r} collides with existing topic {other!r} ('.' and '_' "
                                        "are the same character in Kafka's metric names)")
            self.topics[topic] = {}
            count = self.broker.get("num.partitions") if partitions is None else partitions
            made: list[str] = []
            config = self.topic_config(topic)
            try:
                for p in range(count):
                    if self.stopping.is_set():
                        raise ShuttingDownError(f"creation of topic {topic!r} abandoned: logfs is stopping")
                    self._create_partition(topic, p, made, config, sync=False)
                for d in {self._dirs_by_path[os.path.dirname(p)] for p in made}:
                    with self._on(d, f"creating topic {topic!r}"):
                        ckpt.fsync_dir(d.path)  # once for all of them: the topic exists once this returns
                if not count:
                    self._save_topics()  # a topic without partitions is known only from logfs-topics.json
            except BaseException:
                # All or nothing (EMFILE, ENOSPC...): no topic left behind with only some of its partitions. Only
                # what was made is undone, its fds closed first (removing a directory needs fds too).
                for p in range(len(made)):
                    created = self._drop_log(topic, p)
                    if created is not None:
                        created.close_without_flush()
                for path in made:
                    shutil.rmtree(path, ignore_errors=True)
                del self.topics[topic]
                try:
                    self._save_topics()
                except OSError:
                    pass
                raise
            self._collisions[collision_key(topic)] = topic

    @guarded("partition creation", convert=False)
    def create_partition(self, topic: str, partition: int) -> Log:
        """Add partition ``partition``: the next number, or one missing below it (a hole left by a delete, or a
        store whose lowest partitions were removed)."""
        with self.lock:
            limit = self.next_partition(topic)
            if partition > limit or (topic, partition) in self.logs:
                raise InvalidPartitionError(
                    f"partition {partition} of {topic!r} exists or is past the next partition ({limit})")
            made: list[str] = []
            try:
                return self._create_partition(topic, partition, made)
            except BaseException:
                created = self._drop_log(topic, partition)
                if created is not None:
                    created.close_without_flush()
                for path in made:
                    shutil.rmtree(path, ignore_errors=True)
                raise

    def _create_partition(self, topic: str, partition: int, made: list[str], config: LogConfig | None = None,
                          *, sync: bool = True) -> Log:
        """Create one partition's directory and log in the log directory placement picks; its path is added to
        ``made`` once the directory exists, for the caller to undo. ``sync=False``: the caller fsyncs the log
        directories (once for a topic's partitions)."""
        d = next_log_dir(self.dirs)
        if d is None:
            self.log_dir.check()  # (every directory is offline: the first one's error)
        path = os.path.join(d.path, partition_dir_name(topic, partition))
        with self._on(d, f"creating partition {topic}-{partition}"):
            os.mkdir(path)  # not exist_ok: a stray of that name is not ours to reuse (FileExistsError -> EEXIST)
            made.append(path)
            plog = self._add_log(load_log(path, topic, partition, config or self.topic_config(topic),
                                          had_clean_shutdown=True, clock=self.clock, log_dir=d.log_dir))
            if sync:
                ckpt.fsync_dir(d.path)
        return plog

    @contextlib.contextmanager
    def _on(self, d: DataDir, what: str):
        """Report an error of the disk met inside to ``d``, the directory it came from (offline, unless a full
        disk), then raise it as it was."""
        try:
            yield
        except (OSError, StorageIOError) as exc:
            d.log_dir.io_error(exc, f"{what} in {d.path}")
            raise

    def get_log(self, topic: str, partition: int) -> Log:
        try:
            return self.logs[(topic, partition)]
        except KeyError:
            raise NoSuchTopicError(f"no partition {topic}/{partition}") from None

    @guarded("partition deletion", convert=False)
    def delete_partition(self, topic: str, partition: int) -> None:
        """Remove a partition now; its directory is renamed for deletion and removed after
        ``file.delete.delay.ms`` (or at the next startup).

        The rename is the commit point: it needs no new space, and before it nothing has changed, so a failed
        rename changes nothing. What follows only records the deletion (checkpoints, topics file): on a full
        disk the renamed directory is purged at once to make room, and a write that still fails is logged,
        not raised (stale checkpoint entries of a partition that is gone are ignored at load)."""
        with self.lock:
            victim = self.get_log(topic, partition)
            emptied = len(self._topic_logs.get(topic, ())) == 1  # (the victim is one of them: get_log above)
            if emptied:
                try:  # the emptied topic must survive a crash after the rename as a topic
                    self._save_topics(keep=topic)
                except OSError as exc:
                    if exc.errno not in SPACE_ERRNOS:
                        raise  # a failing disk: offline (guarded), and the partition is not deleted
                    log.warning("%s not updated before deleting the last partition of %r: %s", TOPICS_FILE,
                                topic, exc.strerror or exc)
            d = self.dir_of(victim)
            d.log_dir.check()
            new_path = os.path.join(d.path, delete_dir_name(topic, partition))
            if self.remote is not None and victim.config.remote_storage_enable and not victim.follower:
                self.remote.schedule_delete(topic, partition)  # its objects go too, even after a crash
            with victim.lock, self._on(d, f"deleting partition {topic}-{partition}"):
                victim.hold_pinned()  # open handles go on reading the files they pinned, under any name
                os.rename(victim.directory, new_path)
                self._drop_log(topic, partition)
                victim.close_deleted()
            self._deleted_dirs.append((self.clock.time_ms() + victim.config.file_delete_delay_ms, new_path))
            attrs_gone = self.attrs.pop(f"{topic}/{partition}", None) is not None
            with self._on(d, f"deleting partition {topic}-{partition}"):
                self._record_deletion(new_path, d, save_topics=attrs_gone or emptied)

    def _record_deletion(self, deleted_path: str, d: DataDir, *, save_topics: bool) -> None:
        def record() -> None:
            ckpt.fsync_dir(d.path)
            if save_topics:
                self._save_topics()  # an emptied topic stays a topic
            self.checkpoint()

        try:
            record()
        except OSError as exc:
            if exc.errno not in SPACE_ERRNOS:
                # A failing disk (the fsync that makes the rename durable, or a checkpoint's write): the unlink
                # is not reported as done, and the directory goes offline (guarded); the next mount finds the
                # partition renamed for deletion, or still live, and either is a valid state.
                raise
            log.warning("recording a deletion in %s failed (%s); purging %s now to make room",
                        self.data_dir, exc.strerror or exc, os.path.basename(deleted_path))
            self._deleted_dirs = [(t, p) for t, p in self._deleted_dirs if p != deleted_path]
            shutil.rmtree(deleted_path, ignore_errors=True)
            try:
                record()
            except OSError as again:
                if again.errno not in SPACE_ERRNOS:
                    raise
                log.error("checkpoints of %s not updated after a deletion (%s); they are rewritten at the next "
                          "checkpoint or clean shutdown", self.data_dir, again.strerror or again)

    @guarded("topic deletion", convert=False)
    def delete_topic(self, topic: str) -> None:
        with self.lock:
            if self.partition_count(topic):
                raise TopicNotEmptyError(f"topic {topic!r} still has partitions")
            overrides, attrs = self.topics.pop(topic), self.attrs.pop(topic, None)
            try:
                self._save_topics()
            except OSError:
                if self._topics_file_names(topic):  # on disk it would come back: change nothing
                    self.topics[topic] = overrides
                    if attrs is not None:
                        self.attrs[topic] = attrs
                    raise
                log.warning("%s not rewritten after deleting topic %r (it does not name it)", TOPICS_FILE, topic)
            key = collision_key(topic)
            if self._collisions.get(key) == topic:
                del self._collisions[key]
                for other in self.topics:  # (two colliding topics can both come from an existing store)
                    if collision_key(other) == key:
                        self._collisions[key] = other
                        break

    @guarded("removing deleted partitions", space_ok=False, convert=False)
    def purge_deleted_dirs(self, now_ms: int | None = None) -> int:
        """Remove the directories of deleted partitions whose ``file.delete.delay.ms`` has passed. An error of the
        disk on the way takes that directory offline and is raised once all are tried; what is left behind is
        removed at the next mount."""
        now = self.clock.time_ms() if now_ms is None else now_ms
        with self.lock:
            due = [p for t, p in self._deleted_dirs if t <= now]
            self._deleted_dirs = [(t, p) for t, p in self._deleted_dirs if t > now]
        failures: list[OSError] = []

        def failed(_fn, _path, exc_info) -> None:
            if not isinstance(exc_info[1], FileNotFoundError):  # (gone already: nothing to remove)
                failures.append(exc_info[1])

        for path in due:
            d = self._dirs_by_path.get(os.path.dirname(path))
            if d is not None and d.offline:
                continue  # (the next mount removes it)
            before = len(failures)
            shutil.rmtree(path, onerror=failed)
            if d is not None and len(failures) > before:
                d.log_dir.io_error(failures[before], f"removing {os.path.basename(path)} in {d.path}")
        if failures:
            raise failures[0]
        return len(due)

    # -- checkpoints and shutdown ------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.data_dir

    @property
    def source(self) -> str:
        """The log directories as given (``DIR1,DIR2``; one directory alone)."""
        return ",".join(d.path for d in self.dirs)

    # -- DeleteRecords -------------------------------------------------------------------------------
    @guarded("deleting records", convert=False)
    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's DeleteRecords (KIP-107): the log of ``topic``/``partition`` starts at ``offset`` from now on
        (-1: the log end offset). Returns the log start offset. At or below the current start it changes nothing;
        past the log end offset it is InvalidOffsetError. Before it returns the new start is durable: in the
        tiered manifest (a tiered partition, whose whole-log start the manifest holds) and in
        ``log-start-offset-checkpoint``. Segments wholly below it are deleted later by retention (local, and in the
        bucket by tiering's whole-log retention); open handles keep the view they have."""
        plog = self.get_log(topic, partition)
        with plog.lock:
            end = plog.log_end_offset
            start = plog.log_start_offset
        target = end if offset == -1 else offset
        if target < 0 or target > end:
            raise InvalidOffsetError(f"cannot delete records of {topic}-{partition} below {offset}: the log ends "
                                     f"at {end} (-1 means the log end offset)")
        if target <= start:
            return start
        # The records below the new start are made durable first: a power cut could otherwise leave a log that
        # ends below a start already checkpointed, which the loader takes for a damaged checkpoint (it starts at
        # the first segment then), bringing the deleted records back. (One fsync; none when they already are.)
        plog.flush(up_to=target)
        if self.remote is not None and plog.config.remote_storage_enable:
            self.remote.delete_records(plog, target)  # the manifest first: it is the tiered log's start
        plog.increment_log_start_offset(target)
        self.checkpoint()
        log.info("%s-%d: records below offset %d deleted (DeleteRecords); retention removes their segments",
                 topic, partition, target)
        return plog.log_start_offset

    def checkpoint(self) -> None:
        """Write each online directory's recovery points and log start offsets (never an offline directory's: the
        next mount recovers it from the checkpoints it had when its disk failed). An error is reported to its
        directory and raised once every directory is written."""
        with self.lock:
            logs = dict(self.logs)
        by_dir: dict[str, dict] = {d.path: {} for d in self.dirs}
        for key, plog in logs.items():
            by_dir[os.path.dirname(plog.directory)][key] = plog
        self._each_dir("writing checkpoints", lambda d: d.write_checkpoints(by_dir[d.path]))

    def _each_dir(self, what: str, fn) -> None:
        """``fn(d)`` for every online directory; the first error (reported to its directory) raised at the end."""
        first: BaseException | None = None
        for d in self.dirs:
            if d.offline:
                continue
            try:
                with self._on(d, what):
                    fn(d)
            except (OSError, StorageIOError) as exc:
                first = first or exc
        if first is not None:
            raise first
        if all(d.offline for d in self.dirs):
            self.log_dir.check()

    def update_cleaner_checkpoint(self, topic: str, partition: int, offset: int) -> None:
        """Record the end of the cleaned section of a log in its directory's ``cleaner-offset-checkpoint``."""
        with self.lock:
            self.cleaner_checkpoints[(topic, partition)] = offset
            d = self.dir_of(self.logs[(topic, partition)])
            live = {k: v for k, v in self.cleaner_checkpoints.items()
                    if k in self.logs and self.dir_of(self.logs[k]) is d}
        with self._on(d, "writing the cleaner checkpoint"):
            d.write_cleaner_checkpoint(live)

    def flush_all(self) -> None:
        for partition_log in list(self.logs.values()):
            if not partition_log.log_dir.offline:
                partition_log.flush()

    def close(self) -> None:
        """Clean shutdown: flush and close every log, write checkpoints, leave each directory's clean-shutdown
        marker. A directory that went offline gets none of it (no flush: a failed fsync is never retried; no
        checkpoint, no marker): the next mount recovers it as after a crash. The locks are released either way."""
        if self.closed:
            return
        self.wait_for_moves()
        with self.lock:
            try:
                if self.log_dir.offline:
                    self.transactions.log.close()
                else:
                    self.transactions.close()
            except (OSError, LogfsError) as exc:
                self.log_dir.report(exc, "clean shutdown")
                try:
                    self.transactions.log.close()
                except (OSError, LogfsError):
                    pass
            try:
                self.purge_deleted_dirs(now_ms=1 << 62)  # first: on a full disk this makes room for what follows
            except (OSError, LogfsError):
                pass  # (reported to its directory: offline)
            clean = [d for d in self.dirs if self._close_dir(d)]
            if not all(d.offline for d in self.dirs):
                try:
                    self._save_topics()
                except (OSError, LogfsError) as exc:
                    self.log_dir.report(exc, "clean shutdown")
            for d in self.dirs:
                if d in clean and not d.offline:
                    try:
                        with self._on(d, "clean shutdown"):
                            d.mark_clean()
                    except (OSError, LogfsError) as exc:
                        log.error("clean shutdown of %s incomplete (the next start recovers): %s", d.path, exc)
                d.release_lock()
            self.closed = True

    def _close_dir(self, d: DataDir) -> bool:
        """Close the logs of ``d`` and write its checkpoints; whether that all went well (then it gets its
        clean-shutdown marker)."""
        logs = {k: v for k, v in self.logs.items() if self.dir_of(v) is d}
        if not d.offline:
            try:
                with self._on(d, "clean shutdown"):
                    for partition_log in logs.values():
                        partition_log.close()
                    d.write_checkpoints(logs)
                return True
            except (OSError, LogfsError) as exc:
                # E.g. ENOSPC: without the clean-shutdown marker, the next start recovers what was not made durable
                # here. An I/O error took the directory offline: nothing more is written to it.
                log.error("clean shutdown of %s incomplete (the next start recovers): %s", d.path, exc)
        else:
            log.error("%s was offline (%s): shut down without flushing or the clean-shutdown marker; the next "
                      "mount recovers it", d.path, d.log_dir.offline_reason)
        for partition_log in logs.values():
            if partition_log.closed:
                continue
            try:
                if d.offline:
                    partition_log.close()  # (offline: closes without touching the disk)
                else:
                    partition_log.close_without_flush()
            except (OSError, LogfsError):
                for segment in partition_log.segments:
                    segment.close_readonly()
                partition_log.closed = True
        return False

    def abandon(self) -> None:
        """Release the locks without flushing or the markers (simulates a crash in tests)."""
        self.transactions.log.close()
        for partition_log in self.logs.values():
            partition_log.close_without_flush()
        for d in self.dirs:
            d.release_lock()
        self.closed = True

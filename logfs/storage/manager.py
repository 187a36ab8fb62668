"""All partitions of the log directories (one DATA_DIR, or Kafka's ``log.dirs``): topics, partitions, placement,
checkpoints, DeleteRecords and the clean shutdown.

:class:`LogManager` is the engine's one door (the FUSE layer, the service, tools and tests go through it), and holds
collaborators that own one idea each, as Kafka's LogManager holds a LogCleaner and a LogDirFailureChannel: the
partitions served (``served``: :mod:`.partitions`), the topics' settings and modes (``settings``: :mod:`.topics`),
the moves between directories (``mover``: :mod:`.moves`), the directories renamed for deletion and removed later
(``deleted_dirs``: :mod:`.deletions`), the sink's commits (``transactions``), one :class:`~.log_dirs.DataDir` per
directory (its lock, checkpoints and failure channel), and, once the service turns tiering on
(:meth:`LogManager.attach_tiering`), ``remote`` and ``follower``. Loading at mount is :mod:`.loading`'s. The names
are :mod:`.names`'s. What a log directory holds besides is logged once at startup and never touched.

The module is longer than 500 lines because it is that door: besides placement, creation and deletion, the
checkpoints and the shutdown it owns, each public method of its collaborators that callers use is one line here.

Thread safety: topic/partition creation and deletion and config changes are serialised by ``lock``; each
log has its own writer lock.
"""

from __future__ import annotations

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
from .broker import BrokerLogs, clear_cache
from .deletions import DeletedDirs
from .failure import SPACE_ERRNOS, guarded
from .log_dirs import DataDir, next_log_dir, parse_log_dirs
from .local.loader import load_log
from .publish.transactions import Transactions
from .loading import LogDirsLoader
from .moves import PartitionMover
from .partitions import ServedPartitions
from .topics import TopicSettings
from .local.log import Log
from .local.open_files import OpenFiles, raise_fd_limit
from .names import (
    TOPICS_FILE, collision_key, delete_dir_name, partition_dir_name,
    validate_topic_name,
)

if TYPE_CHECKING:  # (a mount without tiering never loads it)
    from .tiered.follower import Follower
    from .tiered.manager import RemoteLogManager

log = logging.getLogger(__name__)


class LogManager:
    """All partitions of the log directories. Holds, each owning one idea: the partitions served (``served``), the
    topics' settings (``settings``, a :class:`TopicSettings`), the moves between directories (``mover``, a
    :class:`PartitionMover`), the directories renamed for deletion (``deleted_dirs``), the open-file budget of its
    segments (``open_files``), the sink's commits (``transactions``), and, when the service turns tiering on,
    ``remote`` and ``follower``; each directory's health is its :class:`DataDir`'s failure channel. Loading at
    mount is a :class:`LogDirsLoader`'s."""

    def __init__(self, data_dir: str, broker: BrokerConfig | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 progress: Callable[[int, int], None] | None = None,
                 segment_progress: Callable[[int, int], None] | None = None,
                 open_files: OpenFiles | None = None, broker_dirs: list[str] | None = None):
        """``progress(done, total)`` is called after each partition is loaded; ``segment_progress(done,
        total)`` once per segment (and once when a partition is complete), counted over all partitions. Its
        ``total`` starts as the number of ``.log`` files found and is corrected as each partition's loader
        settles it (completing a compaction swap can remove segments). ``open_files``: the budget of the segment
        files it opens (by default one of half the descriptors, the soft limit raised to the hard one first).
        ``broker_dirs``: a running Kafka broker's log directories, served read-only and followed
        (:mod:`.broker`); ``data_dir`` is then logfs's cache for them."""
        paths = parse_log_dirs(data_dir) if isinstance(data_dir, str) else [os.path.abspath(p) for p in data_dir]
        # The log directories (Kafka's log.dirs): each with its own lock, checkpoints and health. The first also
        # holds the mount's own state (the sink's staging and transactions, tiering's pending deletions).
        self.dirs = [DataDir(p) for p in paths]
        self._dirs_by_path = {d.path: d for d in self.dirs}
        self.data_dir = self.dirs[0].path
        self.broker = broker or BrokerConfig.from_properties({})
        self.clock = clock
        self.lock = threading.RLock()
        self.served = ServedPartitions()
        self.logs = self.served.logs  # (topic, partition) -> Log: the same dict, for the readers of it
        self.settings = TopicSettings(self.dirs, self.broker, self.lock, self.served.by_topic)
        self.deleted_dirs = DeletedDirs(self._dirs_by_path, clock)  # partitions renamed for deletion, until removed
        # Tiered storage's RemoteLogManager, and a follower mount's Follower (the logs come from the bucket): given
        # by the service through attach_tiering, once, before the mount serves anything.
        self.remote: RemoteLogManager | None = None
        self.follower: Follower | None = None
        # Set (from any thread, without the lock) when the daemon stops: a topic creation still running then
        # gives up and undoes itself, so the shutdown waits for at most one partition.
        self.stopping = threading.Event()
        self.mover = PartitionMover(self)
        # The first directory's health (each directory has its own: storage/failure.py, as Kafka's
        # LogDirFailureChannel): the manager's own files (topics, sink, tiering) fail with it.
        self.log_dir = self.dirs[0].log_dir
        # The open-file budget of every segment file the mount opens (its logs', tiering's): half the descriptors.
        if open_files is None:
            open_files = OpenFiles()
            raise_fd_limit(open_files)
        self.open_files = open_files
        locked: list[DataDir] = []
        try:
            for d in self.dirs:
                d.acquire_lock()
                locked.append(d)
        except BaseException:
            for d in locked:
                d.release_lock()
            raise
        # A running broker's directories (read in place, followed by the service): none of their files is written.
        self.broker_logs: BrokerLogs | None = None
        # A Kafka cluster as the store (storage/cluster): its clients, attached by the service; the logs are then
        # the replica's, served as a broker's directory (broker_logs over CACHE/replica).
        self.cluster = None
        try:
            if broker_dirs:
                clear_cache(self.data_dir)
            LogDirsLoader(self).load(progress, segment_progress)
            for plog in self.logs.values():
                if plog.config.read_uncommitted:  # (its aborted batches measured now, not on a request)
                    plog.measure_aborted()
            if broker_dirs:
                self.broker_logs = BrokerLogs(self, broker_dirs)
                self.broker_logs.load()
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

    # -- topics: their settings (TopicSettings), and their partitions -----------------------------------
    @property
    def topics(self) -> dict[str, dict[str, str]]:
        """topic -> overrides (the settings')."""
        return self.settings.topics

    @property
    def attrs(self) -> dict[str, tuple[int, int, int]]:
        """"", "topic", "topic/N" -> (mode, uid, gid) (the settings')."""
        return self.settings.attrs

    def list_topics(self) -> list[str]:
        return self.settings.list_topics()

    def topic_config(self, topic: str) -> LogConfig:
        return self.settings.topic_config(topic)

    def topic_overrides(self, topic: str) -> dict[str, str]:
        return self.settings.topic_overrides(topic)

    def get_attrs(self, name: str) -> tuple[int, int, int] | None:
        """(mode bits, uid, gid) set for ``name`` ("" = root, "topic", "topic/N"), or None for the default."""
        return self.settings.get_attrs(name)

    @guarded("a mode change", convert=False)
    def set_attrs(self, name: str, mode: int, uid: int, gid: int) -> None:
        self.settings.set_attrs(name, mode, uid, gid)

    @guarded("a topic setting", convert=False)
    def set_topic_config(self, topic: str, key: str, value: str | None) -> None:
        """Set (or, with ``value=None``, remove) a topic override; applies to the topic's logs at once."""
        self.settings.set_topic_config(topic, key, value)

    def replace_overrides(self, topic: str, overrides: dict[str, str]) -> None:
        """Make ``overrides`` the topic's (a follower mount takes its writer's settings as published)."""
        self.settings.replace_overrides(topic, overrides)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition numbers, ascending (a copy: O(p) for its p partitions)."""
        with self.lock:
            return self.served.numbers(self._known(topic))

    def partition_count(self, topic: str) -> int:
        """How many partitions the topic has (O(1))."""
        with self.lock:
            return self.served.count(self._known(topic))

    def next_partition(self, topic: str) -> int:
        """One past the topic's highest partition number (0 for none): the number a new partition gets (O(1))."""
        with self.lock:
            return self.served.next_number(self._known(topic))

    def _known(self, topic: str) -> str:
        if topic not in self.topics:
            raise NoSuchTopicError(f"no topic {topic!r}")
        return topic

    def topic_logs(self, topic: str) -> list[Log]:
        """The logs of one topic's partitions (O(p); empty for an unknown topic)."""
        return self.served.of_topic(topic)

    # -- moves between the log directories (the PartitionMover's) ---------------------------------------
    @property
    def moving(self) -> dict[tuple[str, int], str]:
        """The partitions being moved -> their target directory."""
        return self.mover.moving

    @property
    def moves_done(self) -> int:
        return self.mover.done

    @property
    def moves_failed(self) -> int:
        return self.mover.failed

    def log_dir_of(self, topic: str, partition: int) -> str:
        """The log directory holding the partition (``user.logfs.log_dir``)."""
        return self.dir_of(self.get_log(topic, partition)).path

    def move_partition(self, topic: str, partition: int, target: str) -> bool:
        """:meth:`PartitionMover.move_partition`: move it to ``target`` and wait."""
        return self.mover.move_partition(topic, partition, target)

    def start_move(self, topic: str, partition: int, target: str):
        """:meth:`PartitionMover.start_move`: its thread, or None when the partition is there already."""
        return self.mover.start_move(topic, partition, target)

    def wait_for_moves(self) -> None:
        self.mover.wait_for_moves()

    # -- the log directories ----------------------------------------------------------------------------
    def dir_by_path(self, path: str) -> DataDir | None:
        """The log directory at ``path`` (absolute), if it is one of the mount's."""
        return self._dirs_by_path.get(path)

    def defer_removal(self, path: str, delay_ms: int) -> None:
        """Remove ``path`` (a partition directory renamed for deletion) ``delay_ms`` from now."""
        self.deleted_dirs.defer(path, delay_ms)


    def dir_of(self, plog: Log) -> DataDir:
        """The log directory holding ``plog``."""
        return self._dirs_by_path[os.path.dirname(plog.directory)]

    def add_log(self, plog: Log) -> Log:
        """Serve ``plog`` (loaded or created), counted in its directory."""
        self.dir_of(plog).partitions += 1
        self.served.add(plog)
        return plog

    def unserve(self, topic: str, partition: int) -> Log | None:
        """Serve a partition no more, leaving its files as they are: a running broker's that the broker removed or
        moved (:mod:`.broker`). Under the lock."""
        return self._drop_log(topic, partition)

    def _drop_log(self, topic: str, partition: int) -> Log | None:
        plog = self.served.drop(topic, partition)
        if plog is not None:
            self.dir_of(plog).partitions -= 1
        return plog

    @guarded("topic creation", convert=False)
    def create_topic(self, topic: str, partitions: int | None = None) -> None:
        validate_topic_name(topic)
        with self.lock:
            if topic in self.topics:
                raise TopicExistsError(f"topic {topic!r} exists")
            other = self.settings.collisions.get(collision_key(topic))
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
                    with self.on_disk_of(d, f"creating topic {topic!r}"):
                        ckpt.fsync_dir(d.path)  # once for all of them: the topic exists once this returns
                if not count:
                    self.settings.save()  # a topic without partitions is known only from logfs-topics.json
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
                    self.settings.save()
                except OSError:
                    pass
                raise
            self.settings.collisions[collision_key(topic)] = topic

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
        with self.on_disk_of(d, f"creating partition {topic}-{partition}"):
            os.mkdir(path)  # not exist_ok: a stray of that name is not ours to reuse (FileExistsError -> EEXIST)
            made.append(path)
            plog = self.add_log(load_log(path, topic, partition, config or self.topic_config(topic),
                                          had_clean_shutdown=True, clock=self.clock, log_dir=d.log_dir,
                                          open_files=self.open_files))
            if sync:
                ckpt.fsync_dir(d.path)
        return plog

    @contextlib.contextmanager
    def on_disk_of(self, d: DataDir, what: str):
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
            emptied = self.served.count(topic) == 1  # (the victim is one of them: get_log above)
            if emptied:
                try:  # the emptied topic must survive a crash after the rename as a topic
                    self.settings.save(keep=topic)
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
            with victim.lock, self.on_disk_of(d, f"deleting partition {topic}-{partition}"):
                victim.hold_pinned()  # open handles go on reading the files they pinned, under any name
                os.rename(victim.directory, new_path)
                self._drop_log(topic, partition)
                victim.close_deleted()
            self.defer_removal(new_path, victim.config.file_delete_delay_ms)
            attrs_gone = self.attrs.pop(f"{topic}/{partition}", None) is not None
            with self.on_disk_of(d, f"deleting partition {topic}-{partition}"):
                self._record_deletion(new_path, d, save_topics=attrs_gone or emptied)

    def _record_deletion(self, deleted_path: str, d: DataDir, *, save_topics: bool) -> None:
        def record() -> None:
            ckpt.fsync_dir(d.path)
            if save_topics:
                self.settings.save()  # an emptied topic stays a topic
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
            self.deleted_dirs.remove_now(deleted_path)
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
            self.settings.remove(topic)

    @guarded("removing deleted partitions", space_ok=False, convert=False)
    def purge_deleted_dirs(self, now_ms: int | None = None) -> int:
        """Remove the directories of deleted partitions whose ``file.delete.delay.ms`` has passed
        (:meth:`DeletedDirs.purge_due`)."""
        return self.deleted_dirs.purge_due(now_ms)

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
                with self.on_disk_of(d, what):
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
        with self.on_disk_of(d, "writing the cleaner checkpoint"):
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
        if self.broker_logs is not None:
            self.broker_logs.close()
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
                    self.settings.save()
                except (OSError, LogfsError) as exc:
                    self.log_dir.report(exc, "clean shutdown")
            for d in self.dirs:
                if d in clean and not d.offline:
                    try:
                        with self.on_disk_of(d, "clean shutdown"):
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
                with self.on_disk_of(d, "clean shutdown"):
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

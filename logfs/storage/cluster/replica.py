"""The local replica of a Kafka cluster's partitions: what the mount reads (CONTRACT.md section 15, "Reading").

One consumer (``isolation.level=read_committed``, partitions assigned, no group membership) in one thread of its
own fetches every partition of every topic the cluster's metadata lists, from its log start offset, and writes the
records into ``CACHE/replica/<topic>-<n>/`` as Kafka-format segments: batches re-encoded with the records' own
offsets (with the gaps aborted records and transaction markers leave), timestamps (and their type), keys and
headers. That directory is a log directory as a broker writes it, and the mount serves it exactly as it serves a
running broker's (:class:`~logfs.storage.broker.BrokerLogs`: logfs's indexes beside it, appends, rolls and removals
followed by polling). So positions, the ``offset.``/``position.``/``time.`` xattrs, ``tail -f`` and the Spark source
work as on a local mount, with no second reader of the format.

- **Namespace.** Every :data:`REFRESH_S` the metadata is asked for: a partition new to it gets a directory with an
  empty segment at the partition's log start offset (a broker's new partition looks the same), and is fetched from
  there; a topic gone from it (deleted) has its directories renamed ``-delete`` (the mount serves them no more) and
  removed. Kafka's internal topics (``__consumer_offsets``, ...) are not listed.
- **A first open of a large partition.** The replica starts at the log start offset (positions need the length of
  everything before them) and is filled in the background from the mount's start: a partition file shows what has
  been fetched so far and grows as the fetcher catches up, as a ``tail -f`` would see it.
- **Catching up: the batches as Kafka sends them.** A partition the replica starts fetching (new to it, or resumed),
  and one its consumer has fallen ``direct_lag`` offsets behind on (noted every :data:`REFRESH_S`), is fetched with
  Kafka's own Fetch request (:mod:`.fetch`, logged in as the consumer is: :mod:`.security`), whose record batches
  are written into the segments as they come: no record is decoded or encoded again, so a cold partition fills at
  the speed of the broker and the disk. (A first batch the replica's end falls inside is cut there: its records
  from the end on, re-encoded as the consumer's are.) The partition goes (back) to the consumer, which re-encodes
  each record, once caught up, at the first transactional or control batch (the consumer's ``read_committed``
  drops aborted records and markers), and at any error (the consumer reports and retries it). A partition where
  the Fetch met a transaction is not sent back to it for a lag (the consumer would lose its prefetch each time for
  nothing). Settings the Fetch does not follow as librdkafka would leave every partition to the consumer (one INFO
  line at start); a login the broker refuses hands every partition to it for :data:`AUTH_RETRY_S`.
  :attr:`Replica.bulk` holds the partitions being caught up so.
- **Kept across mounts.** A mount with the same cache directory resumes the replica: each partition's last segment
  is walked (batches checked, a torn tail cut: the replica is not synced but at each roll and at unmount), and the
  fetch goes on from its end, so nothing fetched before is fetched again. The replica is started afresh where it
  cannot be resumed: another cluster (``meta.properties`` names the cluster's id), a topic deleted and made again
  (each partition's ``partition.metadata`` holds its topic's id, as a broker's does; a partition without one, or
  whose topic's id is not known, is not resumed until it is), a partition whose records the cluster no longer has
  from the replica's end (its start moved past it) or whose end is past the cluster's, a partition's last segment
  that is not a log. A topic deleted meanwhile is removed.
  ``.lock`` (flock) keeps a second mount off a replica in use.
- **The log start offset** (DeleteRecords through this mount, :meth:`Replica.note_start`; the cluster's start,
  followed every :data:`REFRESH_S` from what the fetches bring, :meth:`Replica._note_lags`: retention on the
  cluster, DeleteRecords by another host or client; a cluster's start found past the replica's first offset at
  resume) is written in ``log-start-offset-checkpoint``, as a broker keeps it, and the mount's file starts there
  (BrokerLogs follows that file while mounted, and reads it at a remount). The segments wholly below it are
  removed as the cache's bound removes them (below); the active one is rolled first when the start is at its end.
- **The cache's bound** (``logfs.remote.cache.bytes``): a segment rolls at :data:`SEGMENT_BYTES` (or an eighth of
  the bound, if smaller); when the replica holds more than the bound, the oldest sealed segments (of any partition)
  are removed, as retention would: renamed ``.deleted`` (a reader that pinned one keeps reading it: the mount
  holds its descriptor, ``BrokerSegment.hold``) and unlinked :data:`DELETE_DELAY_S` later. The partition's file
  then starts at its first remaining segment: the log start offset the mount shows moves up, and the lines before
  it are read through a Kafka consumer, not the mount.

The engine's rule holds: no trio, no pyfuse3. Only this thread writes the segments; the checkpoint is written
under :attr:`Replica._lock` by whoever moves a start.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field

from .. import checkpoints as ckpt
from . import fetch as kafka_fetch
from ..errors import ClusterError, CorruptRecordError
from ..format import records as rec
from ..names import (DELETED_SUFFIX, LOG_SUFFIX, DataDirScan, filename_prefix, parse_segment_file,
                     partition_dir_name)
from .security import DirectSecurity, NotUnderstood, direct_security

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # how often the cluster's metadata is asked for (topics created and deleted elsewhere)
SEGMENT_BYTES = 64 << 20
DELETE_DELAY_S = 30.0  # a segment removed for the cache's bound is unlinked this long after its rename
BATCH_RECORDS = 2048  # at most this many records per re-encoded batch
BATCH_BYTES = 256 << 10  # ... and about this many bytes of values
METADATA_TIMEOUT_S = 5.0
LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME (1: CreateTime)
ATTR_LOG_APPEND_TIME = 0x08
META_FILE = "meta.properties"  # the replica's cluster: "cluster.id=..."
PARTITION_METADATA = "partition.metadata"  # Kafka's, in each partition's directory: "version: 0", "topic_id: ..."
LOCK_FILE = ".lock"
AUTH_RETRY_S = 300.0  # a login the broker refused on the direct Fetch: the consumer fetches everything this long


@dataclass
class ReplicaPartition:
    """One partition's directory in the replica: its segments (base offset -> size) and the active one's file."""
    directory: str
    segments: dict[int, int] = field(default_factory=dict)
    active_base: int = 0
    next_offset: int = 0  # the offset after the last record written
    last_timestamp: int = 0  # the last record's
    fd: int = -1
    assigned: bool = False  # the consumer fetches it (a partition resumed from disk: once the metadata lists it)

    def open_segment(self, base: int) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)  # (a sealed segment is whole after a power cut: a resume walks only the last one)
            os.close(self.fd)
        path = os.path.join(self.directory, filename_prefix(base) + LOG_SUFFIX)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.segments[base] = 0
        self.active_base = base

    def write(self, data: bytes) -> None:
        """Append whole batches to the active segment. A write that fails part way (ENOSPC, EIO) is undone to the
        segment's size before it, so the fetch tried again appends after whole batches, never after a torn one."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            os.ftruncate(self.fd, self.segments[self.active_base])
            raise
        self.segments[self.active_base] += len(data)

    def close(self, sync: bool = False) -> None:
        if self.fd >= 0:
            if sync:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1

    @property
    def size(self) -> int:
        return sum(self.segments.values())

    @classmethod
    def resume(cls, directory: str) -> "ReplicaPartition | None":
        """The partition as a former mount left it: its segments, and the last one walked to its last whole batch
        (a torn tail cut), opened for appending. None when it holds no segment or its last one is not a log."""
        bases = {}
        for name in os.listdir(directory):
            parsed = parse_segment_file(name)
            if parsed is None:
                continue
            base, kind, state = parsed
            if state == DELETED_SUFFIX:
                os.unlink(os.path.join(directory, name))  # (removed by the former mount, not yet unlinked)
            elif kind == LOG_SUFFIX and not state:
                bases[base] = os.path.join(directory, name)
        if not bases:
            return None
        part = cls(directory)
        for base, path in bases.items():
            part.segments[base] = os.stat(path).st_size
        last = max(bases)
        with open(bases[last], "rb") as f:
            buf = f.read()
        pos, next_offset, stamp = 0, last, 0
        try:
            while pos < len(buf):
                if rec.peek_size(buf, pos) is None or rec.peek_size(buf, pos) > len(buf) - pos:
                    break  # (a torn tail: the write a kill cut short)
                header = rec.validate(buf, pos)
                pos += header.size
                next_offset, stamp = header.next_offset, header.max_timestamp
        except CorruptRecordError as exc:
            if pos == 0:
                log.warning("%s: the replica's last segment is not a log (%s): fetched again", bases[last], exc)
                return None
        if pos < len(buf):
            log.info("%s: the replica's last segment cut at %d of %d bytes (a torn tail)", bases[last], pos, len(buf))
            os.truncate(bases[last], pos)
        part.segments[last] = pos
        part.active_base, part.next_offset, part.last_timestamp = last, next_offset, stamp
        part.fd = os.open(bases[last], os.O_WRONLY | os.O_APPEND)
        return part


def read_topic_id(directory: str) -> str | None:
    """The topic id of a partition directory's ``partition.metadata``, or None."""
    try:
        with open(os.path.join(directory, PARTITION_METADATA)) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "topic_id":
                    return value.strip()
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    return None


def encode_batches(messages) -> list[bytes]:
    """Kafka v2 batches of ``messages`` (one partition's, ascending offsets, confluent_kafka Messages): their own
    offsets (gaps kept as offset deltas), timestamps, keys and headers, cut at :data:`BATCH_RECORDS` records or about
    :data:`BATCH_BYTES`. A batch holds one timestamp type (the topic's): a change of type starts a new batch. Each
    message's fields are read once (every call is a C call that makes an object), and batches without headers take
    the table-driven encoder (``build_batch_plain_records``, the same bytes): this runs once a record fetched."""
    out = []
    i, n = 0, len(messages)
    while i < n:
        kind = messages[i].timestamp()[0]
        values, keys, stamps, offsets, headers = [], [], [], [], []
        any_headers = False
        size = 0
        while i < n and len(values) < BATCH_RECORDS and size < BATCH_BYTES:
            m = messages[i]
            stamp_kind, stamp = m.timestamp()
            if stamp_kind != kind:
                break
            value, key, record_headers = m.value(), m.key(), m.headers()
            values.append(value)
            keys.append(key)
            stamps.append(stamp)
            offsets.append(m.offset())
            headers.append(record_headers)
            if record_headers:
                any_headers = True
            size += (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
            i += 1
        base = offsets[0]
        deltas = [o - base for o in offsets]
        attributes = ATTR_LOG_APPEND_TIME if kind == LOG_APPEND_TIME else 0
        if any_headers:
            out.append(rec.build_batch_generic(
                base, stamps[0], values, keys=keys, headers=[tuple(h or ()) for h in headers], timestamps=stamps,
                offset_deltas=deltas, attributes=attributes))
        else:
            out.append(rec.build_batch_plain_records(base, values, keys, stamps, deltas, attributes=attributes))
    return out


class Replica:
    """The fetcher and its directory (see the module's docstring). ``start`` asks for the metadata once (an
    unreachable cluster fails the mount there) and starts the thread; ``close`` stops it."""

    def __init__(self, directory: str, consumer_config: dict, cache_bytes: int, direct_lag: int | None = 100_000):
        """``direct_lag``: how far behind (offsets) the consumer may fall on a partition before Kafka's Fetch
        catches it up (None: never, and new partitions go to the consumer too)."""
        self.directory = directory
        self.consumer_config = dict(consumer_config)
        self.cache_bytes = cache_bytes
        self.segment_bytes = max(1 << 20, min(SEGMENT_BYTES, cache_bytes // 8)) if cache_bytes else SEGMENT_BYTES
        self.partitions: dict[tuple[str, int], ReplicaPartition] = {}
        # (topic, partition) -> log start offset, as in log-start-offset-checkpoint (guarded by _lock); the
        # partitions whose segments below it are to be removed (the fetcher's thread does it)
        self.starts: dict[tuple[str, int], int] = {}
        self._trims: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._lock_fd = -1
        self._admin = None  # (made at the first need of topic ids)
        self.refreshed = threading.Event()  # set after each metadata refresh (creations and deletions wait on it)
        self.generation = 0  # metadata refreshes done
        self._deleted: list[tuple[float, str]] = []  # (when, path) of segments and directories to remove
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh_now = threading.Event()
        self.fetched_records = 0
        self.direct_records = 0  # (of fetched_records) caught up with Kafka's Fetch
        self.error: str | None = None  # the last fetch or metadata error, for the log and the metrics
        self._message_error: str | None = None  # the last error the consumer returned for one partition
        self._group_refused = False
        # Partitions whose records the cluster refuses to this user (a fetch's TOPIC_AUTHORIZATION_FAILED: READ
        # never granted, or revoked), until records of theirs come or the cluster says READ is granted again
        # (:meth:`_recheck_refused`): a read that finds nothing more of one is EACCES (Cluster.check_readable). A set
        # the fetcher's thread changes and other threads only test.
        self.refused: set[tuple[str, int]] = set()
        self._lags: dict[tuple[str, int], int] = {}  # (metrics) noted by the fetcher's thread at each refresh
        # The partitions being caught up by Kafka's Fetch (see the module's docstring) -> the high watermark its
        # last answer gave (-1 before one); their leaders' addresses (every refresh); one connection per broker.
        # The Fetch logs in as the consumer does (:mod:`.security`), decided once from the settings: settings it does
        # not follow as librdkafka would leave every partition to the consumer. A login the broker refuses hands
        # every partition to the consumer and keeps the Fetch off for AUTH_RETRY_S (``_direct_off_until``).
        self.direct = direct_lag is not None
        self.security: DirectSecurity | None = None
        if self.direct:
            try:
                self.security = direct_security(self.consumer_config)
            except NotUnderstood as exc:
                log.info("the replica's direct Fetch is off (%s): the consumer fetches every partition", exc)
                self.direct = False
        self._direct_off_until = 0.0  # (monotonic)
        self.direct_lag = direct_lag
        self.bulk: dict[tuple[str, int], int] = {}
        # Partitions where the Fetch met a transaction: the consumer keeps them once caught up (a lag made of
        # transactional batches would send them back and forth, the consumer's prefetch lost each time).
        self._transactional: set[tuple[str, int]] = set()
        self._leaders: dict[tuple[str, int], tuple[str, int] | None] = {}
        self._connections: dict[tuple[str, int], kafka_fetch.Connection] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        from confluent_kafka import Consumer  # (only a cluster mount loads the client)

        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise ClusterError(f"{self.directory} is in use by another mount", errno.EBUSY) from None
        config = {"group.id": f"logfs-replica-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.partition.eof": False, "fetch.wait.max.ms": 100,
                  # (a cold read through the consumer, on a cluster the direct fetch does not reach: 109,000 records/s
                  # against 58,000 with librdkafka's 1 MiB, measured on 1,000,000 100-byte records)
                  "max.partition.fetch.bytes": 16 << 20, **self.consumer_config}
        self.consumer = Consumer(config)
        metadata = self.consumer.list_topics(timeout=METADATA_TIMEOUT_S)  # (raises when the cluster does not answer)
        self._resume(metadata.cluster_id)
        self._refresh(METADATA_TIMEOUT_S)
        self._thread = threading.Thread(target=self._run, name="logfs-replica", daemon=True)
        self._thread.start()

    def _resume(self, cluster_id: str | None) -> None:
        """The partitions a former mount left (see the module's docstring), or an empty directory when it
        replicated another cluster."""
        meta = os.path.join(self.directory, META_FILE)
        want = f"cluster.id={cluster_id}\n"
        try:
            with open(meta) as f:
                same = f.read() == want
        except FileNotFoundError:
            same = False
        if not same:
            for name in os.listdir(self.directory):
                if name != LOCK_FILE:
                    path = os.path.join(self.directory, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
            ckpt.atomic_write(meta, want.encode())
            return
        scan = DataDirScan(self.directory)
        for path in scan.delete_dirs:
            shutil.rmtree(path, ignore_errors=True)
        for key, directory in scan.partitions:
            part = ReplicaPartition.resume(directory)
            if part is None:
                shutil.rmtree(directory)
                continue
            self.partitions[key] = part
        starts = ckpt.read_checkpoint(os.path.join(self.directory, ckpt.LOG_START_OFFSET))
        self.starts = {k: v for k, v in starts.items() if k in self.partitions}
        if self.partitions:
            log.info("the replica resumes %d partitions (%d bytes)", len(self.partitions), self.cache_used())

    def note_start(self, topic: str, partition: int, start: int) -> None:
        """The partition's log start offset moved up to ``start`` (DeleteRecords): kept in the checkpoint, and the
        segments below it removed by the fetcher's thread (any thread)."""
        key = (topic, partition)
        with self._lock:
            if start <= self.starts.get(key, -1):
                return
            self.starts[key] = start
            ckpt.write_checkpoint(os.path.join(self.directory, ckpt.LOG_START_OFFSET), dict(self.starts))
            self._trims.add(key)

    def _trim(self) -> None:
        """Remove the segments wholly below the log start offsets noted (the fetcher's thread)."""
        with self._lock:
            trims, self._trims = self._trims, set()
            starts = dict(self.starts)
        for key in trims:
            part = self.partitions.get(key)
            if part is None:
                continue
            start = starts[key]
            if start >= part.next_offset and part.segments[part.active_base]:
                part.open_segment(part.next_offset)  # (everything is below the start: the active one goes too)
            bases = sorted(part.segments)
            for base, following in zip(bases, bases[1:]):
                if following <= start:
                    self._remove_segment(part, base)

    def _remove_segment(self, part: ReplicaPartition, base: int) -> int:
        """Rename a sealed segment ``.deleted`` (a reader that pinned it keeps reading it) and unlink it
        :data:`DELETE_DELAY_S` later; its bytes."""
        path = os.path.join(part.directory, filename_prefix(base) + LOG_SUFFIX)
        os.rename(path, path + DELETED_SUFFIX)
        self._deleted.append((time.monotonic() + DELETE_DELAY_S, path + DELETED_SUFFIX))
        return part.segments.pop(base)

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the replica's fetcher did not stop in %.0f s", timeout)
                return
        consumer = getattr(self, "consumer", None)
        if consumer is None:
            return  # (never started)
        try:
            consumer.close()
        except Exception as exc:  # (a cluster that went away: nothing to commit, nothing to lose)
            log.debug("closing the replica's consumer: %s", exc)
        for connection in self._connections.values():
            connection.close()
        for part in self.partitions.values():
            part.close(sync=True)  # (whole at the next mount's resume)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def refresh_soon(self) -> int:
        """Ask for the metadata at the fetcher's next turn; returns the generation to wait past."""
        generation = self.generation
        self._refresh_now.set()
        return generation

    def wait_refreshed(self, past: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.generation <= past + 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.refreshed.wait(min(remaining, 0.05))
            self.refreshed.clear()
        return True

    # -- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_refresh = time.monotonic() + REFRESH_S
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_refresh or self._refresh_now.is_set():
                    self._refresh_now.clear()
                    self._refresh(1.0)
                    self._note_lags()
                    if self.refused:
                        self._recheck_refused()
                    next_refresh = time.monotonic() + REFRESH_S
                self._fetch_bulk()
                self._fetch(0 if self.bulk else 0.1)
                if self._trims:
                    self._trim()
                self._bound()
                self._purge()
                if self.error is not None:
                    log.info("the replica fetches again")
                    self.error = None
            except Exception as exc:  # (a cluster that does not answer: reported once, tried again)
                if self.error is None:
                    log.warning("the replica cannot fetch: %s", exc)
                self.error = str(exc)
                self._stop.wait(0.5)

    def _refresh(self, timeout: float) -> None:
        from confluent_kafka import TopicPartition

        metadata = self.consumer.list_topics(timeout=timeout)
        topics, unsure = {}, set()
        for name, t in metadata.topics.items():
            if name.startswith("__"):
                continue  # (Kafka's internal topics)
            if t.error is not None:
                unsure.add(name)  # (a leader being elected, an authorization: nothing changes for it now)
                continue
            topics[name] = sorted(t.partitions)
            for n, p in t.partitions.items():
                broker = metadata.brokers.get(p.leader)
                self._leaders[(name, n)] = (broker.host, broker.port) if broker is not None else None
        new = []
        for topic, numbers in topics.items():
            for n in numbers:
                part = self.partitions.get((topic, n))
                if part is None or not part.assigned:
                    new.append((topic, n))
        for key in [k for k in self.partitions if k[0] not in unsure and k[1] not in topics.get(k[0], ())]:
            self._drop(key)  # (its topic deleted)
        ids = self._topic_ids({topic for topic, _ in new}) if new else {}
        assign = []
        for topic, n in new:
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, n), timeout=timeout,
                                                                cached=False)
            except Exception as exc:  # (a new partition without a leader yet: the next refresh tries again)
                log.debug("%s-%d: no log start offset yet: %s", topic, n, exc)
                continue
            low = max(low, 0)
            part = self.partitions.get((topic, n))
            if part is not None:  # (resumed from disk)
                if topic not in ids:
                    continue  # (its topic's id not known: the next refresh asks again)
                if read_topic_id(part.directory) != ids[topic]:
                    log.info("%s-%d: the replica holds another topic of that name (deleted and made again): "
                             "fetched again", topic, n)
                    self._drop((topic, n))
                elif low <= part.next_offset <= high:
                    if low > min(part.segments):
                        self.note_start(topic, n, low)  # (the cluster's start moved up meanwhile)
                    part.assigned = True
                    self._fetch_from(topic, n, part.next_offset, assign)
                    continue
                else:
                    log.info("%s-%d: the replica ends at %d, the cluster holds %d to %d: fetched again", topic, n,
                             part.next_offset, low, high)
                    self._drop((topic, n))  # (renamed away, as a deleted topic's: the mount may serve it already)
            part = ReplicaPartition(os.path.join(self.directory, partition_dir_name(topic, n)), next_offset=low)
            os.makedirs(part.directory, exist_ok=True)
            if topic in ids:  # (not synced: one lost to a power cut makes the next mount fetch the partition again)
                with open(os.path.join(part.directory, PARTITION_METADATA), "w") as f:
                    f.write(f"version: 0\ntopic_id: {ids[topic]}")  # (as Kafka writes it: no last newline)
            part.open_segment(low)
            part.assigned = True
            self.partitions[(topic, n)] = part
            self._fetch_from(topic, n, low, assign)
        if assign:
            self.consumer.incremental_assign(assign)
        self.generation += 1
        self.refreshed.set()

    def _direct_now(self) -> bool:
        """Whether Kafka's Fetch catches partitions up now (its settings understood, no refused login lately)."""
        return self.direct and time.monotonic() >= self._direct_off_until

    def _fetch_from(self, topic: str, n: int, offset: int, assign: list) -> None:
        """A partition the replica starts fetching at ``offset``: caught up by Kafka's Fetch (see :meth:`_direct_now`),
        else by the consumer (appended to ``assign``)."""
        from confluent_kafka import TopicPartition

        if self._direct_now():
            self.bulk[(topic, n)] = -1
        else:
            assign.append(TopicPartition(topic, n, offset))

    def _to_consumer(self, keys) -> None:
        """Partitions caught up by Kafka's Fetch go on with the consumer, from the replica's next offsets."""
        from confluent_kafka import TopicPartition

        assign = []
        for key in keys:
            if self.bulk.pop(key, None) is not None and key in self.partitions:
                assign.append(TopicPartition(key[0], key[1], self.partitions[key].next_offset))
        if assign:
            self.consumer.incremental_assign(assign)

    def _fetch_bulk(self) -> None:
        """One Fetch per leader of the partitions being caught up (the fetcher's thread); each answer's batches
        written as they came (see the module's docstring). A broker that cannot be asked hands its partitions to
        the consumer, which retries and reports; one that refuses the login hands every partition to it, and the
        Fetch is not tried again for :data:`AUTH_RETRY_S`. The connections are closed once no partition is being
        caught up (a broker closes a connection idle for its ``connections.max.idle.ms``, 10 minutes: the next
        catch-up would meet that as an error)."""
        if not self.bulk:
            if self._connections:
                for connection in self._connections.values():
                    connection.close()
                self._connections.clear()
            return
        by_leader: dict[tuple[str, int] | None, list[tuple[str, int]]] = {}
        for key in self.bulk:
            by_leader.setdefault(self._leaders.get(key), []).append(key)
        done = by_leader.pop(None, [])  # (no leader known: the consumer waits for one)
        for address, keys in by_leader.items():
            connection = self._connections.get(address)
            if connection is None:
                connection = self._connections[address] = kafka_fetch.Connection(*address, METADATA_TIMEOUT_S,
                                                                                  self.security)
            request: dict[str, list[tuple[int, int]]] = {}
            for topic, n in keys:
                request.setdefault(topic, []).append((n, self.partitions[(topic, n)].next_offset))
            try:
                answers = connection.fetch(request)
            except kafka_fetch.AuthenticationError as exc:
                log.warning("the replica's direct Fetch: %s: every partition goes to the consumer; the Fetch is tried "
                            "again in %.0f s", exc, AUTH_RETRY_S)
                self._direct_off_until = time.monotonic() + AUTH_RETRY_S
                for other in self._connections.values():
                    other.close()
                self._connections.clear()
                self._to_consumer(list(self.bulk))
                return
            except kafka_fetch.FetchError as exc:
                log.info("the replica's direct fetch: %s: its partitions go to the consumer", exc)
                done += keys
                continue
            for key in keys:
                data = answers.get(key)
                try:
                    more = data is not None and not data.error and self._write_fetched(key, data)
                except ValueError as exc:  # (a batch the replica cannot decode where it must: a codec's error)
                    log.warning("the replica's direct fetch of %s-%d: %s: the consumer fetches it", *key, exc)
                    more = False
                if more:
                    self.bulk[key] = data.high_watermark
                else:
                    done.append(key)
        self._to_consumer(done)

    def _write_fetched(self, key: tuple[str, int], data: kafka_fetch.PartitionData) -> bool:
        """Write the whole batches of one partition's Fetch answer that follow the replica's end, rolling segments
        as the consumer's writes do; False when the partition is to go to the consumer (caught up, or a batch
        the replica must not keep as it came)."""
        part = self.partitions[key]
        records = data.records
        chunk_start = chunk_end = -1
        wrote = 0
        go_on = True
        try:
            for pos, header in rec.iter_headers(records):
                if header.next_offset <= part.next_offset:
                    continue  # (before the replica's end: a fetch offset inside the first batch's range)
                if header.attributes & (rec.ATTR_TRANSACTIONAL | rec.ATTR_CONTROL):
                    go_on = False  # (the consumer takes it from the replica's end ...
                    self._transactional.add(key)  # ... and keeps it, however far behind: see _note_lags)
                    break
                rec.validate(records, pos)
                if header.base_offset < part.next_offset:  # (the replica ends inside it: the first one here)
                    wrote += self._write_tail(part, records[pos:pos + header.size], header)
                    continue
                if chunk_start >= 0 and part.segments[part.active_base] + pos - chunk_start >= self.segment_bytes:
                    part.write(records[chunk_start:pos])  # (the segment is full with them: a roll before this one)
                    chunk_start = -1
                if chunk_start < 0:
                    if part.segments[part.active_base] >= self.segment_bytes:
                        part.open_segment(part.next_offset)
                    chunk_start = pos
                chunk_end = pos + header.size
                part.next_offset, part.last_timestamp = header.next_offset, header.max_timestamp
                wrote += header.records_count
        except CorruptRecordError as exc:
            log.warning("the replica's direct fetch at offset %d: %s: the consumer fetches it", part.next_offset, exc)
            go_on = False
        if chunk_start >= 0:
            part.write(records[chunk_start:chunk_end])
        self.fetched_records += wrote
        self.direct_records += wrote
        return go_on and wrote > 0 and part.next_offset < data.last_stable_offset

    @staticmethod
    def _write_tail(part: ReplicaPartition, batch, header) -> int:
        """The records of ``batch`` from the replica's end on, re-encoded in one batch (as the consumer's are:
        offsets, timestamps and their type, keys, headers); their count."""
        kept = [r for r in rec.decode(batch) if r.offset >= part.next_offset]
        if not kept:
            return 0  # (compacted away: the next batch starts later)
        base = kept[0].offset
        part.write(rec.build_batch_generic(
            base, kept[0].timestamp, [r.value for r in kept], keys=[r.key for r in kept],
            headers=[r.headers for r in kept], timestamps=[r.timestamp for r in kept],
            offset_deltas=[r.offset - base for r in kept], attributes=header.attributes & rec.ATTR_TIMESTAMP_TYPE))
        part.next_offset, part.last_timestamp = kept[-1].offset + 1, kept[-1].timestamp
        return len(kept)

    def _recheck_refused(self) -> None:
        """READ granted again (or at last) while mounted: the refused partitions' topics are asked for in one
        DescribeTopics with this user's authorized operations (the fetcher's thread, every :data:`REFRESH_S` while
        any partition is refused: one request for all of them); a topic whose READ is granted now is fetched again
        at once (its partitions assigned afresh at the replica's next offsets: librdkafka backs off a partition
        whose fetch failed) and is no longer refused, records or not (an empty topic reads empty)."""
        from confluent_kafka import TopicCollection, TopicPartition
        from confluent_kafka.admin import AclOperation

        topics = sorted({topic for topic, _ in self.refused})
        try:
            futures = self._admin_client().describe_topics(
                TopicCollection(topics), include_authorized_operations=True, request_timeout=METADATA_TIMEOUT_S)
        except Exception as exc:  # (no answer: asked again at the next refresh)
            log.debug("describing the refused topics: %s", exc)
            return
        granted = set()
        for topic, future in futures.items():
            try:
                operations = future.result(timeout=METADATA_TIMEOUT_S + 1).authorized_operations
            except Exception as exc:  # (not described to this user, or no answer: asked again next time)
                log.debug("%s: the authorized operations are not known: %s", topic, exc)
                continue
            if operations and {AclOperation.READ, AclOperation.ALL} & set(operations):
                granted.add(topic)
        again = [key for key in self.refused if key[0] in granted and key in self.partitions]
        if not again:
            return
        self.refused.difference_update(again)
        tps = [TopicPartition(topic, n) for topic, n in again]
        self.consumer.incremental_unassign(tps)
        self.consumer.incremental_assign([TopicPartition(topic, n, self.partitions[(topic, n)].next_offset)
                                          for topic, n in again])
        self._message_error = None
        log.info("the cluster grants READ again on %s: fetched", ", ".join(f"{t}-{n}" for t, n in sorted(again)))

    def _admin_client(self):
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.consumer_config)
        return self._admin

    def _topic_ids(self, topics: set[str]) -> dict[str, str]:
        """topic -> its id (Kafka's DescribeTopics), for the topics the cluster answers about."""
        from confluent_kafka import TopicCollection

        ids = {}
        try:
            futures = self._admin_client().describe_topics(TopicCollection(sorted(topics)),
                                                           request_timeout=METADATA_TIMEOUT_S)
        except Exception as exc:
            log.debug("describing topics: %s", exc)
            return ids
        for name, future in futures.items():
            try:
                # (librdkafka prints a Uuid in base64, Kafka in URL-safe base64 without padding: Kafka's spelling)
                text = str(future.result(timeout=METADATA_TIMEOUT_S + 1).topic_id)
                ids[name] = text.replace("+", "-").replace("/", "_").rstrip("=")
            except Exception as exc:  # (deleted meanwhile, no answer: asked again at the next refresh)
                log.debug("%s: no topic id: %s", name, exc)
        return ids

    def _drop(self, key: tuple[str, int]) -> None:
        from confluent_kafka import TopicPartition

        part = self.partitions.pop(key)
        self.bulk.pop(key, None)
        self._transactional.discard(key)
        part.close()
        with self._lock:
            self.starts.pop(key, None)  # (a topic made again with its name starts afresh)
        if part.assigned:
            try:
                self.consumer.incremental_unassign([TopicPartition(*key)])
            except Exception as exc:
                log.debug("unassigning %s-%d: %s", *key, exc)
        gone = f"{part.directory}.{uuid.uuid4().hex}-delete"
        os.rename(part.directory, gone)
        self._deleted.append((time.monotonic() + DELETE_DELAY_S, gone))

    def _fetch(self, timeout: float) -> None:
        messages = self.consumer.consume(num_messages=10000, timeout=timeout)
        if not messages:
            return
        by_partition: dict[tuple[str, int], list] = {}
        for m in messages:
            error = m.error()
            if error is not None:
                # One partition's error (its topic deleted meanwhile, a leader moving, its records refused to this
                # user): the others' records of the same call are written all the same (the consumer's positions
                # moved past them).
                name = error.name()
                if m.topic() is None and name == "GROUP_AUTHORIZATION_FAILED":
                    # (librdkafka looks for the group's coordinator, which the replica never uses: partitions are
                    # assigned, nothing committed; a user may have no group)
                    if not self._group_refused:
                        log.info("the replica's consumer: %s (no group is needed)", error.str())
                        self._group_refused = True
                    continue
                if m.topic() is not None and "AUTHORIZATION" in name:
                    self.refused.add((m.topic(), m.partition()))
                err = f"{m.topic()}-{m.partition()}: {error.str()}"
                if err != self._message_error:  # (logged when it changes, not at every fetch)
                    log.warning("the replica's fetch of %s", err)
                    self._message_error = err
                continue
            by_partition.setdefault((m.topic(), m.partition()), []).append(m)
        for key, group in by_partition.items():
            part = self.partitions.get(key)
            if part is None:
                continue  # (deleted since)
            group = [m for m in group if m.offset() >= part.next_offset]  # (a re-fetch after a reset)
            if not group:
                continue
            self.refused.discard(key)  # (its records come: the user may read them now)
            if part.segments[part.active_base] >= self.segment_bytes:
                part.open_segment(part.next_offset)  # (roll: the next batches start at or after it)
            part.write(b"".join(encode_batches(group)))
            part.next_offset = group[-1].offset() + 1
            part.last_timestamp = group[-1].timestamp()[1]
            self.fetched_records += len(group)

    def _past_markers(self) -> None:
        """A partition whose consumer position is past the replica's next offset (the last records fetched were
        transaction markers or aborted records, which a read_committed consumer does not return) gets an empty
        batch up to it, as Kafka's cleaner leaves one: the replica's log end offset is then the cluster's, and an
        open file's next lines keep their offsets. Its timestamps are the last record's (time lookups see none)."""
        from confluent_kafka import TopicPartition

        keys = list(self.partitions)
        if not keys:
            return
        for tp in self.consumer.position([TopicPartition(*k) for k in keys]):
            part = self.partitions.get((tp.topic, tp.partition))
            if part is None or tp.error is not None or tp.offset <= part.next_offset:
                continue
            part.write(rec.build_batch_generic(part.next_offset, part.last_timestamp, [],
                                               last_offset_delta=tp.offset - 1 - part.next_offset))
            part.next_offset = tp.offset

    def _bound(self) -> None:
        """Remove the oldest sealed segments while the replica holds more than the cache's bound."""
        if not self.cache_bytes:
            return
        total = sum(p.size for p in self.partitions.values())
        while total > self.cache_bytes:
            oldest = None
            for part in self.partitions.values():
                sealed = [b for b in part.segments if b != part.active_base]
                if sealed:
                    path = os.path.join(part.directory, filename_prefix(min(sealed)) + LOG_SUFFIX)
                    mtime = os.stat(path).st_mtime_ns
                    if oldest is None or mtime < oldest[0]:
                        oldest = (mtime, part, min(sealed), path)
            if oldest is None:
                return  # only active segments: nothing sealed to remove
            _, part, base, path = oldest
            total -= self._remove_segment(part, base)

    def _purge(self) -> None:
        now = time.monotonic()
        due = [p for when, p in self._deleted if when <= now]
        if not due:
            return
        self._deleted = [(w, p) for w, p in self._deleted if w > now]
        for path in due:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def cache_used(self) -> int:
        """Bytes of the replica's live segments (from any thread: the thread may change them meanwhile)."""
        return sum(sum(list(p.segments.values())) for p in list(self.partitions.values()))

    def lags(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the high watermark the fetches last saw less the replica's next offset, -1 when
        not known yet (from any thread: a copy of what the fetcher's thread noted at its last metadata refresh;
        the consumer itself is never called from another thread, where its calls wait for the fetcher's)."""
        return dict(self._lags)

    def _note_lags(self) -> None:
        """The lags, and the cluster's log start offsets followed (the fetcher's thread, every :data:`REFRESH_S`).
        Both come from what the consumer's fetches already brought: every Fetch response carries each partition's
        high watermark and log start offset, which librdkafka keeps (``get_watermark_offsets(cached=True)``: no
        request; a C call per partition). A start that moved up (retention on the cluster, DeleteRecords by any
        client) is noted as this mount's own DeleteRecords is (:meth:`note_start`: the checkpoint the mount follows,
        the segments below removed) once the replica reached it: the fetch of records below it was refused
        (OFFSET_OUT_OF_RANGE) and went on from the new start, so the replica's next offset gets there."""
        from confluent_kafka import TopicPartition

        self._past_markers()
        lags, behind = {}, []
        direct = self._direct_now()
        for key, part in self.partitions.items():
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            except Exception:
                low = high = -1
            high = self.bulk.get(key, high)  # (caught up by Kafka's Fetch: the consumer has not fetched it)
            lags[key] = max(0, high - part.next_offset) if high >= 0 else -1
            if (direct and key not in self.bulk and key not in self.refused and key not in self._transactional
                    and lags[key] >= self.direct_lag):
                behind.append(key)
            if 0 < low <= part.next_offset and part.segments and low > max(self.starts.get(key, -1),
                                                                               min(part.segments)):
                self.note_start(key[0], key[1], low)
        self._lags = lags
        if behind:  # (the consumer's queued records of these are dropped: the replica's end is where the Fetch goes on)
            log.info("the replica is %s offsets behind on %s: caught up with Kafka's Fetch", 
                     ", ".join(str(lags[k]) for k in behind), ", ".join(f"{t}-{n}" for t, n in behind))
            self.consumer.incremental_unassign([TopicPartition(*key) for key in behind])
            for key in behind:
                self.bulk[key] = lags[key] + self.partitions[key].next_offset

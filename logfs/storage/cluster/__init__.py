"""A Kafka cluster as the store: ``logfs kafka://HOST:PORT[,HOST:PORT...] MOUNTPOINT`` (CONTRACT.md section 15,
issue 46).

:class:`Cluster` holds the three clients of the cluster, one idea each:

- :class:`~.replica.Replica`: a consumer that copies every partition into ``CACHE/replica/`` in Kafka's on-disk
  format; the mount's :class:`~logfs.storage.manager.LogManager` serves that directory as it serves a running
  broker's (:class:`~logfs.storage.broker.BrokerLogs`, ``broker_dirs=[CACHE/replica]``), so reads, positions, xattrs
  and ``tail -f`` are the local mount's;
- :class:`~.appends.ClusterAppends`: the idempotent producer a partition file's writes go through;
- the admin client: ``mkdir`` creates a topic, ``rmdir`` deletes it (each returns once the replica and the mount show
  the change); a topic's ``user.logfs.config.<name>`` xattrs are its config on the cluster (DescribeConfigs, and
  IncrementalAlterConfigs to set or remove one: the cluster judges names and values), and writing a partition's
  ``user.logfs.log_start_offset`` is DeleteRecords (the mount's file then starts there).

Kafka deletes topics, not partitions: ``unlink`` of a partition file hides it on this mount (``rm -r`` of a topic
unlinks its files, then removes the directory, which deletes the topic); a hidden partition comes back at the
next mount if its topic was not deleted.

Client settings are Kafka's names (``-o kafka.<name>=<value>``), passed to librdkafka, which reads the same names
for the common ones (``security.protocol``, ``sasl.*``, ``ssl.*``, ``delivery.timeout.ms``, ...).

**Authorization.** The mount acts as the user its client settings log in as; what the cluster's authorizer refuses
is ``EACCES`` (CONTRACT.md section 15): the admin API's refusals (:func:`_refusal`), an open for writing a topic
whose WRITE is not granted (:meth:`Cluster.check_writable`: DescribeTopics' authorized operations, asked before
any line is produced), a produce refused all the same (WRITE revoked while open: the producer's fatal error,
storage/cluster/appends.py), and a read that finds nothing more of a partition whose fetch the cluster refused
(:meth:`Cluster.check_readable`; lines fetched before a revocation still read). READ granted while mounted is
followed by the replica (:meth:`~.replica.Replica._recheck_refused`).
"""

from __future__ import annotations

import errno
import logging
import os
import time

from ..errors import ClusterError, TopicNotEmptyError
from ..names import validate_topic_name
from .appends import ClusterAppends, PartitionAppender
from .replica import Replica

__all__ = ["Cluster", "ClusterAppends", "PartitionAppender", "Replica", "REPLICA_DIR", "LOGS_DIR"]

log = logging.getLogger(__name__)

REPLICA_DIR = "replica"  # under the cache directory: the fetched segments
LOGS_DIR = "logs"  # under the cache directory: the mount's data directory (logfs's indexes of the replica)
ADMIN_TIMEOUT_S = 30.0
SHOWN_TIMEOUT_S = 15.0  # how long mkdir/rmdir wait for the mount to show what the cluster did
# How long a topic's described config answers getxattr: ``getfattr -d`` asks for every name in turn, one
# DescribeConfigs for all of them rather than one each. A change through this mount forgets it at once.
CONFIG_FRESH_S = 1.0
# How long the cluster's answer to "may this mount's user write the topic" (DescribeTopics' authorized operations)
# holds for the opens for writing that follow, and how long an open waits for it (a cluster that does not answer:
# the open goes on, and the producer reports what the cluster says).
WRITE_GRANT_FRESH_S = 10.0
WRITE_GRANT_TIMEOUT_S = 2.0


class _ClientLog:
    """librdkafka's log lines into logfs's log, at INFO at most: a broker that does not answer makes it log a line
    per connection attempt, several a second; what matters reaches the log once through logfs's own lines (the
    replica cannot fetch, a delivery failed: EIO), and librdkafka's are there for the details."""

    def __init__(self):
        self.logger = logging.getLogger("logfs.kafka")

    def log(self, level, message, *args):
        self.logger.log(min(level, logging.INFO), message, *args)


def _refusal(err, what: str) -> ClusterError:
    """A KafkaError of the admin API as the errno a caller sees."""
    name = err.name() if hasattr(err, "name") else ""
    if "AUTHORIZATION" in name:
        code = errno.EACCES
    elif name == "TOPIC_ALREADY_EXISTS":
        code = errno.EEXIST
    elif name == "UNKNOWN_TOPIC_OR_PART":
        code = errno.ENOENT
    elif name.startswith("INVALID_") or name in ("POLICY_VIOLATION", "OFFSET_OUT_OF_RANGE"):
        code = errno.EINVAL
    else:
        code = errno.EIO
    return ClusterError(f"{what}: {err.str() if hasattr(err, 'str') else err}", code)


class Cluster:
    """The clients of a ``kafka://`` mount (see the module's docstring): made by the service, started before the
    manager loads (the replica's directory must exist), attached to the manager, closed after it."""

    def __init__(self, bootstrap: str, client_settings: dict[str, str], cache_dir: str, broker, *,
                 read_only: bool = False):
        """``read_only`` (``-o ro``): the replica alone, no producer and no admin client."""
        self.bootstrap = bootstrap
        self.read_only = read_only
        self.client_settings = dict(client_settings)
        self.broker = broker
        common = {"bootstrap.servers": bootstrap, **self.client_settings}
        self.common = common
        self.replica_dir = os.path.join(cache_dir, REPLICA_DIR)
        # The manager's data directory (its lock, checkpoints, and the indexes of the replica's segments): beside
        # the replica, not above it, so that its loader finds only its own entries.
        self.logs_dir = os.path.join(cache_dir, LOGS_DIR)
        self.replica = Replica(self.replica_dir, {**common, "logger": _ClientLog()},
                               broker.get("logfs.remote.cache.bytes"),
                               direct_lag=broker.get("logfs.kafka.direct.fetch.lag")
                               if broker.get("logfs.kafka.direct.fetch") else None)
        self.appends = ClusterAppends({**common, "logger": _ClientLog()})
        self.manager = None
        self.admin = None
        self.closed = False
        self._configs: dict[str, tuple[float, dict[str, str | None]]] = {}  # topic -> (when described, config)
        self._write_grants: dict[str, tuple[float, bool]] = {}  # topic -> (when asked, whether WRITE is granted)

    def start(self) -> None:
        """Connect (the metadata once: an unreachable cluster fails here, with a ClusterError)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        try:
            self.replica.start()
        except KafkaException as exc:
            raise ClusterError(f"cannot reach the Kafka cluster at {self.bootstrap}: {exc}", errno.EIO) from None
        if not self.read_only:
            self.appends.start()
            self.admin = AdminClient({**self.common, "logger": _ClientLog()})

    def attach(self, manager) -> None:
        self.manager = manager
        if manager.broker_logs is not None:  # (the replica's files are this mount's: held for pinning readers)
            manager.broker_logs.hold_removed_segments()
        self.appends.stopping = manager.stopping  # (set, from any thread, when the daemon stops)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.appends.close()
        finally:
            self.replica.close()

    # -- appends ------------------------------------------------------------------------------------------
    def appender(self, topic: str, partition: int) -> PartitionAppender:
        return self.appends.appender(topic, partition, self.manager.topic_config(topic))

    def write_grant_known(self, topic: str) -> bool:
        """Whether :meth:`check_writable` answers from what it holds (no call to the cluster: the request thread)."""
        held = self._write_grants.get(topic)
        return held is not None and time.monotonic() - held[0] < WRITE_GRANT_FRESH_S

    def check_writable(self, topic: str) -> None:
        """EACCES when the cluster's authorizer does not grant this mount's user WRITE on ``topic`` (an open for
        writing; a worker thread unless :meth:`write_grant_known`). Asked before any line is produced: a produce
        that the cluster refuses is the producer's fatal error (storage/cluster/appends.py), which takes down the
        lines of other partitions queued with it. Kafka's DescribeTopics with the authorized operations, held
        :data:`WRITE_GRANT_FRESH_S`; a cluster that does not answer in :data:`WRITE_GRANT_TIMEOUT_S` lets the open
        go on (the producer's report then says)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AclOperation

        if not self.write_grant_known(topic):
            try:
                future = self.admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True,
                                                    request_timeout=WRITE_GRANT_TIMEOUT_S)[topic]
                operations = future.result(timeout=WRITE_GRANT_TIMEOUT_S + 1).authorized_operations
            except Exception as exc:  # (no answer, or the topic unknown: the producer will say)
                log.debug("%s: the authorized operations are not known: %s", topic, exc)
                return
            granted = not operations or bool({AclOperation.WRITE, AclOperation.ALL} & set(operations))
            self._write_grants[topic] = (time.monotonic(), granted)
        if not self._write_grants[topic][1]:
            raise ClusterError(f"{topic}: the cluster does not grant this mount's user WRITE", errno.EACCES)

    def check_readable(self, topic: str, partition: int) -> None:
        """EACCES when the cluster refuses the partition's records to this mount's user (READ not granted, or
        revoked: the replica's fetch was refused), rather than a file that reads empty or stops growing unnoticed.
        Asked where a read finds nothing of what the replica holds: an open for reading of a partition the replica
        holds no line of, and a read at the file's end (where a reader that polls waits for more). Lines the replica
        fetched before a revocation are this host's copy, and read as before (CONTRACT.md section 15, README)."""
        if (topic, partition) in self.replica.refused:
            raise ClusterError(f"{topic}-{partition}: the cluster refuses its records to this mount's user",
                               errno.EACCES)

    # -- administration (worker threads) --------------------------------------------------------------------
    def _shown(self, topic: str, partitions: int) -> None:
        """Wait until the mount shows ``topic`` with ``partitions`` partitions (0: no longer shows it)."""
        past = self.replica.refresh_soon()
        self.replica.wait_refreshed(past, SHOWN_TIMEOUT_S)
        deadline = time.monotonic() + SHOWN_TIMEOUT_S
        m = self.manager

        def shown() -> int:
            with m.lock:
                return m.partition_count(topic) if topic in m.topics else -1

        while (shown() < partitions) if partitions else (shown() >= 0):
            if time.monotonic() > deadline or m.stopping.is_set():
                raise ClusterError(f"topic {topic!r}: the cluster did it, but the mount did not show it in "
                                   f"{SHOWN_TIMEOUT_S:.0f} s", errno.EIO)
            time.sleep(0.02)

    def create_topic(self, topic: str) -> None:
        """``mkdir``: Kafka's CreateTopics with ``num.partitions`` and ``default.replication.factor`` of ``-o``."""
        from confluent_kafka.admin import NewTopic

        validate_topic_name(topic)
        new = NewTopic(topic, num_partitions=self.broker.get("num.partitions"),
                       replication_factor=self.broker.get("default.replication.factor"))
        future = self.admin.create_topics([new], request_timeout=ADMIN_TIMEOUT_S)[topic]
        self._await(future, f"creating topic {topic!r}")
        self._shown(topic, self.broker.get("num.partitions"))

    def delete_topic(self, topic: str) -> None:
        """``rmdir``: Kafka's DeleteTopics, once every partition file of the topic was unlinked on this mount
        (else ``ENOTEMPTY``, as on a local mount)."""
        if self.manager.partition_count(topic):
            raise TopicNotEmptyError(f"topic {topic!r} still has partitions")
        future = self.admin.delete_topics([topic], request_timeout=ADMIN_TIMEOUT_S)[topic]
        self._await(future, f"deleting topic {topic!r}")
        self._shown(topic, 0)

    def unlink_partition(self, topic: str, partition: int) -> None:
        """``unlink``: the partition is no longer shown on this mount (Kafka deletes no single partition)."""
        m = self.manager
        with m.lock:
            m.unserve(topic, partition)

    def topic_configs(self, topic: str) -> dict[str, str | None]:
        """The topic's config on the cluster, name -> value (None: a sensitive value, not shown): Kafka's
        DescribeConfigs, every name the broker knows (its defaults included), kept :data:`CONFIG_FRESH_S`."""
        from confluent_kafka.admin import ConfigResource, ResourceType

        held = self._configs.get(topic)
        if held is not None and time.monotonic() - held[0] < CONFIG_FRESH_S:
            return held[1]
        resource = ConfigResource(ResourceType.TOPIC, topic)
        future = self.admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource]
        entries = self._await(future, f"describing the config of topic {topic!r}")
        config = {name: (None if entry.is_sensitive else entry.value) for name, entry in entries.items()}
        self._configs[topic] = (time.monotonic(), config)
        return config

    def alter_topic_config(self, topic: str, name: str, value: str | None) -> None:
        """Set the topic's ``name`` to ``value`` (None: remove the topic's own value, back to the cluster's default):
        Kafka's IncrementalAlterConfigs. An unknown name or a bad value is the cluster's INVALID_CONFIG: EINVAL."""
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op)])
        self._configs.pop(topic, None)
        future = self.admin.incremental_alter_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource]
        self._await(future, f"{'setting' if value is not None else 'removing'} {name} of topic {topic!r}")
        self._configs.pop(topic, None)

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """``setfattr -n user.logfs.log_start_offset -v N``: Kafka's DeleteRecords below ``offset`` (-1: the high
        watermark); an offset past the end is the cluster's OFFSET_OUT_OF_RANGE (EINVAL, as on a local mount).
        Returns the partition's new log start offset once the mount's file starts there: the replica has fetched up
        to it (waited for, at most :data:`SHOWN_TIMEOUT_S`) and its log's start is moved up; the replica notes the
        start in its checkpoint (a remount with this cache starts there) and removes its segments below it."""
        from confluent_kafka import TopicPartition

        tp = TopicPartition(topic, partition, offset)
        future = self.admin.delete_records([tp], request_timeout=ADMIN_TIMEOUT_S)[tp]
        deleted = self._await(future, f"deleting records of {topic}-{partition} below {offset}")
        start = deleted.low_watermark
        m = self.manager
        plog = m.get_log(topic, partition)
        deadline = time.monotonic() + SHOWN_TIMEOUT_S
        while plog.log_end_offset < start:  # (the replica fetches what the cluster has up to the new start)
            if time.monotonic() > deadline or m.stopping.is_set():
                raise ClusterError(f"{topic}-{partition}: records below {start} deleted on the cluster, but the "
                                   f"replica did not reach offset {start} in {SHOWN_TIMEOUT_S:.0f} s", errno.EIO)
            time.sleep(0.02)
        with plog.lock:
            plog.increment_log_start_offset(start)
        self.replica.note_start(topic, partition, start)  # (its checkpoint: a remount starts there too)
        log.info("%s-%d: records below offset %d deleted on the cluster (DeleteRecords)", topic, partition, start)
        return start

    @staticmethod
    def _await(future, what: str):
        from confluent_kafka import KafkaException

        try:
            return future.result(timeout=ADMIN_TIMEOUT_S + 5)
        except KafkaException as exc:
            raise _refusal(exc.args[0], what) from None
        except Exception as exc:  # (a timeout of the future itself)
            raise ClusterError(f"{what}: {exc}", errno.EIO) from None

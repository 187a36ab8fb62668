"""Appends to a Kafka cluster: one record a line, through one idempotent producer (CONTRACT.md section 15,
"Appending").

The producer is librdkafka's (``confluent-kafka``, chosen by measurement: README, "Dependencies"), with
``enable.idempotence``, ``acks=all`` and ``enable.gapless.guarantee``: the broker keeps each partition's records in
the order they were produced, never twice, and a delivery that fails makes the producer fail every message queued
after it (librdkafka raises a fatal error rather than leave a gap). Its own threads send; one thread here serves
its delivery reports (``poll``) and replaces the producer after a failure.

Per partition (:class:`PartitionAppender`, one per (topic, partition), shared by every handle of the mount):

- ``append_lines`` queues the lines of one ``write()`` in order, on the calling thread (a ``produce`` call copies
  the value into librdkafka's queue and returns), so a ``write()`` returns once its lines are queued and the lines
  of two writes never interleave. The queue holds far more than one ``write()`` can bring (:data:`ROOM`): while it
  is fuller than that (or the producer is being replaced), :meth:`PartitionAppender.wait_room` (called in a
  worker thread) waits for it to drain.
- ``sync`` returns once every line queued before it is acknowledged (delivery reports come in order per partition,
  so a count is enough), bounded by ``delivery.timeout.ms`` plus :data:`SYNC_MARGIN_S`.
- **One delivery report per ``write()``**, not per line: only a write's last line is produced with a callback, which
  stands for the write's lines. A Python callback per line cost the mount's poll thread a call, a lock and a wake-up
  per line, each taking the GIL from the thread that serves ``write()`` (profiled: README, "A Kafka cluster as the
  store"). It is enough because, with idempotence, one partition's deliveries are in order: the broker appends a
  partition's batches in sequence, so the last line acknowledged means the lines before it are; and a line that
  fails takes the lines queued after it down with it (the gapless guarantee's fatal error, or the purge when the
  producer is replaced; a write's lines are queued together and time out together), so the last line's report
  carries the failure.
- A failed delivery is kept until the next ``append_lines``, ``check`` or ``sync`` of the partition, which raises
  it (``EIO``; ``EACCES`` when the cluster refused the partition's lines to this user) once and forgets it. The
  lines queued after the failed one were failed with it by the producer (never sent); the producer is then
  replaced (:meth:`ClusterAppends._replace`: its queue purged first), so what the writer writes after the error
  goes out on a new producer, after everything the old one delivered.

**An authorization refused** (the user may read the topic but not write it) is, with the gapless guarantee, no
delivery report but the producer's fatal error, which librdkafka's ``poll`` raises (measured against a broker with
an authorizer: the failed line has no report of its own until the producer's queue is purged). The poll thread
takes it as any fatal error (the producer is replaced), and the failure it reports to the partition the error names
(``ProduceRequest for TOPIC [N] ... authorization failed``: librdkafka's text, the only place it says which
partition) is ``EACCES``; the lines of other partitions purged with it are ``EIO``, as after any fatal error.

The engine's rule holds: no trio, no pyfuse3.
"""

from __future__ import annotations

import errno
import functools
import logging
import re
import threading
import time

from ..errors import ClusterError
from ..format import lines as line_format

log = logging.getLogger(__name__)

QUEUE_MESSAGES = 4_000_000  # librdkafka's queue.buffering.max.messages here
ROOM = 2_000_000  # a write() starts only while fewer messages than this are queued (one write brings < 600k lines)
TIMEOUT_SCAN_MS = 1000  # how often librdkafka looks for messages past message.timeout.ms
CLOSE_STALL_S = 5.0  # at unmount, how long queued lines are waited for without any acknowledgement
SYNC_MARGIN_S = 5.0  # beyond delivery.timeout.ms, how long a sync waits before it calls the delivery failed
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000  # Kafka's delivery.timeout.ms


# librdkafka's text of a produce request that failed fatally: which partition, and why.
_FATAL_PARTITION = re.compile(r"for (\S+) \[(\d+)\]")


def _authorization(err) -> bool:
    return "AUTHORIZATION" in err.name()


def _refused_partition(err) -> tuple[str, int] | None | bool:
    """The partition a fatal error says the cluster refused to this user ((topic, partition); True: refused, the
    partition not named), or None: not an authorization."""
    text = err.str()
    if "AUTHORIZATION" not in err.name() and "authorization failed" not in text.lower():
        return None
    named = _FATAL_PARTITION.search(text)
    return (named.group(1), int(named.group(2))) if named else True


class PartitionState:
    """One partition's deliveries: queued and reported counts, and the failure not yet raised."""

    __slots__ = ("queued", "done", "failed", "failed_errno", "waiting")

    def __init__(self):
        self.queued = 0
        self.done = 0
        self.waiting = 0  # syncs waiting for reports (none: a report wakes nobody)
        self.failed: str | None = None
        self.failed_errno = errno.EIO


class PartitionAppender:
    """A partition's appends (see the module's docstring). ``append_lines`` has the signature of
    :meth:`Log.append_lines`, so a file handle appends through either."""

    def __init__(self, appends: "ClusterAppends", topic: str, partition: int, config):
        self.appends = appends
        self.topic = topic
        self.partition = partition
        self.config = config  # the topic's LogConfig: its line format and max.message.bytes
        self._format = None  # its LineFormat, made at the first append
        self.state = PartitionState()
        self.report_one = functools.partial(self.delivered, 1)  # (the delivery report of a one-line write)

    def check(self) -> None:
        """Raise the failed delivery not raised yet (once)."""
        state = self.state
        if state.failed is not None:
            with self.appends.cond:
                message, code, state.failed = state.failed, state.failed_errno, None
            if message is not None:
                raise ClusterError(f"{self.topic}-{self.partition}: a line was not delivered: {message}", code)

    def append_lines(self, prefix: bytes, data, end: int, headers=None):
        if self.state.failed is not None:
            self.check()
        text = prefix + bytes(data[: end - 1]) if prefix else bytes(data[: end - 1])
        fmt = self._format
        if fmt is None:
            fmt = self._format = line_format.LineFormat.of(self.config)
        if headers is None and fmt.plain and b"\n" not in text:
            # One plain line (a write() of one line, the shell's and most loggers'): the checks and the produce
            # without the lists of the general case.
            config = self.config
            line_format.check_record_size(config, len(text))
            if config.compact:
                line_format.check_keys(config, None)
            self.appends.produce_one(self, text)
            return None
        lines = text.split(b"\n")
        if fmt.plain:  # (the common case: each line is the value)
            values, keys = lines, None
            longest = max(map(len, lines))
        else:
            values, keys = fmt.parse_lines(lines)
            longest = max(len(v or b"") + len((keys[i] if keys else None) or b"") for i, v in enumerate(values))
        line_format.check_record_size(self.config, longest)
        line_format.check_keys(self.config, keys)
        self.appends.produce(self, values, keys, list(headers) if headers else None)
        return None

    def needs_room(self) -> bool:
        """Whether a write must wait (:meth:`wait_room`) before its lines are queued: the producer's queue is full, or
        the producer failed and is being replaced (its queue purged, its reports served: a write queued on it now
        would be refused; one queued on the next producer before the reports are served could go out after a line
        of its partition that failed)."""
        appends = self.appends
        return appends.broken or appends.queued() >= ROOM

    def wait_room(self) -> None:
        """Wait (a worker thread) until the producer's queue has room for a write's lines, and no producer is being
        replaced; then raise the partition's failure, if the replaced producer's reports brought one."""
        appends = self.appends
        deadline = time.monotonic() + appends.delivery_timeout_s + SYNC_MARGIN_S
        while appends.broken or appends.queued() >= ROOM:
            if time.monotonic() > deadline or appends.stopping.is_set():
                raise ClusterError("the producer's queue did not drain in time", errno.EIO)
            with appends.cond:
                if appends.broken:
                    appends.cond.wait(0.05)  # (the replacement notifies)
                    continue
            time.sleep(0.01)
        self.check()

    def sync(self) -> None:
        """Return once every line queued before is acknowledged; raise a failed delivery (``EIO``)."""
        appends, state = self.appends, self.state
        timeout = appends.delivery_timeout_s + SYNC_MARGIN_S
        deadline = time.monotonic() + timeout
        with appends.cond:
            target = state.queued
            state.waiting += 1
            try:
                while state.done < target:
                    remaining = deadline - time.monotonic()
                    if appends.stopping.is_set() or appends.closed:
                        # (the daemon stops: a stop signal waits for this worker thread, not for delivery.timeout.ms)
                        raise ClusterError(f"{self.topic}-{self.partition}: lines not acknowledged before the mount "
                                           f"stopped", errno.EIO)
                    if remaining <= 0:
                        raise ClusterError(f"{self.topic}-{self.partition}: lines not acknowledged in "
                                           f"{timeout:.0f} s", errno.EIO)
                    appends.cond.wait(min(remaining, 0.5))
            finally:
                state.waiting -= 1
        self.check()

    def delivered(self, lines: int, err, _msg) -> None:
        """librdkafka's delivery report of the last line of a ``write()``, for its ``lines`` lines (on the poll
        thread; see the module's docstring)."""
        appends, state = self.appends, self.state
        if err is None:
            # (no lock: only this thread changes these counts; a sync counts itself ``waiting`` under the lock
            # before it reads ``done``, so a report that finds nobody waiting was counted before the sync looked)
            state.done += lines
            appends.acked += lines
            if state.waiting:
                with appends.cond:
                    appends.cond.notify_all()
            return
        with appends.cond:
            state.done += lines
            if state.failed is None:
                refused = appends.refused
                state.failed = err.str() if refused is None else f"{err.str()} ({appends.fatal})"
                state.failed_errno = errno.EACCES if _authorization(err) or refused is True or refused == (
                    self.topic, self.partition) else errno.EIO
            appends.broken = True
            appends.failed_deliveries += lines
            appends.cond.notify_all()


class ClusterAppends:
    """The mount's producer, its poll thread, and the partitions' appenders."""

    def __init__(self, config: dict):
        self.config = {"enable.idempotence": True, "acks": "all", "enable.gapless.guarantee": True,
                       "linger.ms": 5, "queue.buffering.max.messages": QUEUE_MESSAGES, **config}
        timeout = int(self.config.pop("delivery.timeout.ms", None) or self.config.pop("message.timeout.ms", None)
                      or DEFAULT_DELIVERY_TIMEOUT_MS)
        self.delivery_timeout_s = timeout / 1000
        # librdkafka looks at its messages' timeouts about once a second: a message times out up to a second after
        # message.timeout.ms. Given that much less, a write waits at most delivery.timeout.ms, as Kafka's Java
        # producer promises (measured: EIO 4.2 s after the broker stopped with 3000 given as it is).
        self.config["message.timeout.ms"] = max(timeout - TIMEOUT_SCAN_MS, min(timeout, TIMEOUT_SCAN_MS))
        self.cond = threading.Condition()
        self.partitions: dict[tuple[str, int], PartitionAppender] = {}
        self.broken = False  # a delivery failed: the producer is replaced (its queue purged first)
        # The producer's fatal error being handled (its text), and the partition it says the cluster refused (see
        # the module's docstring: _refused_partition), until the producer is replaced.
        self.fatal: str | None = None
        self.refused: tuple[str, int] | None | bool = None
        self.closed = False
        # Set when the daemon stops (the manager's ``stopping``, given at attach): waits in worker threads end.
        self.stopping = threading.Event()
        self.acked = self.failed_deliveries = self.produced = 0
        self._producer = None
        self._refused: tuple = (BufferError,)
        self._fatal_raised: tuple = ()
        self._thread: threading.Thread | None = None

    def _new_producer(self):
        from confluent_kafka import KafkaException, Producer  # (only a cluster mount loads the client)

        self._refused = (KafkaException, BufferError)  # what produce() raises for a line it does not take
        self._fatal_raised = (KafkaException,)  # what poll() raises for a fatal error
        return Producer({**self.config, "error_cb": self._error})

    def _error(self, err) -> None:
        if err.fatal():
            self._fatal(err)
        else:
            log.debug("producer: %s", err.str())

    def start(self) -> None:
        self._producer = self._new_producer()
        self._thread = threading.Thread(target=self._run, name="logfs-producer", daemon=True)
        self._thread.start()

    def appender(self, topic: str, partition: int, config) -> PartitionAppender:
        with self.cond:
            found = self.partitions.get((topic, partition))
            if found is None:
                found = self.partitions[(topic, partition)] = PartitionAppender(self, topic, partition, config)
            return found

    def queued(self) -> int:
        return len(self._producer)

    def produce(self, appender: PartitionAppender, values, keys, headers) -> None:
        """Queue one ``write()``'s lines, in order; only the last has a delivery report, for all of them (see the
        module's docstring)."""
        producer, topic, partition = self._producer, appender.topic, appender.partition
        produce = producer.produce
        last = len(values) - 1
        report = functools.partial(appender.delivered, len(values))
        try:
            if keys is None and headers is None:  # (the common case, kept lean: it runs once a line)
                for i in range(last):
                    produce(topic, values[i], None, partition)
                produce(topic, values[last], None, partition, report)
            else:
                for i in range(last):
                    produce(topic, values[i], keys[i] if keys else None, partition, headers=headers)
                produce(topic, values[last], keys[last] if keys else None, partition, report, headers=headers)
        except self._refused as exc:
            # (a fatal producer, being replaced: what this write queued before is failed with it, and no report
            # counts it: the write fails here)
            with self.cond:
                self.broken = True
            raise ClusterError(f"{topic}-{partition}: the producer refused a line: {exc}", errno.EIO) from None
        appender.state.queued += len(values)
        self.produced += len(values)

    def produce_one(self, appender: PartitionAppender, value: bytes) -> None:
        """:meth:`produce` of a write() of one line without key or headers (the per-line path of small writes)."""
        try:
            self._producer.produce(appender.topic, value, None, appender.partition, appender.report_one)
        except self._refused as exc:
            with self.cond:
                self.broken = True
            raise ClusterError(f"{appender.topic}-{appender.partition}: the producer refused a line: {exc}",
                               errno.EIO) from None
        appender.state.queued += 1
        self.produced += 1

    def _run(self) -> None:
        while True:
            producer = self._producer
            try:
                producer.poll(0.05)
            except self._fatal_raised as exc:  # (the producer's fatal error, raised once: it is replaced)
                self._fatal(exc.args[0])
            if self.broken:
                self._replace()
            if self.closed and len(producer) == 0:
                return

    def _fatal(self, err) -> None:
        log.warning("the producer failed: %s (it is replaced)", err.str())
        with self.cond:
            self.fatal = err.str()
            self.refused = _refused_partition(err)
            self.broken = True

    def _replace(self) -> None:
        """A new producer after a failed delivery: the old one's queue is purged (those lines are never sent; their
        reports fail them), its reports served, and the next line goes out on the new one."""
        old = self._producer
        try:
            old.purge(True, True, False)
        except Exception as exc:
            log.debug("purging the failed producer: %s", exc)
        for serve in (lambda: old.poll(0), lambda: old.flush(1.0)):
            try:
                serve()
            except Exception as exc:  # (its fatal error raised again: the reports are served by the next call)
                log.debug("serving the failed producer's reports: %s", exc)
        with self.cond:
            self.fatal = self.refused = None
            self.broken = False
            self._producer = self._new_producer()
            self.cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Wait for what is queued while the cluster acknowledges it (at most ``timeout``, by default
        ``delivery.timeout.ms``, and at most :data:`CLOSE_STALL_S` without an acknowledgement: with no broker
        answering, an unmount or a stop takes seconds, not the delivery timeout), then stop."""
        if self._producer is None:
            return
        timeout = self.delivery_timeout_s if timeout is None else timeout
        now = time.monotonic()
        deadline, progress_at, reported = now + timeout, now, self.acked + self.failed_deliveries
        while len(self._producer) and now < deadline and now - progress_at < CLOSE_STALL_S:
            time.sleep(0.02)
            now = time.monotonic()
            if self.acked + self.failed_deliveries != reported:
                progress_at, reported = now, self.acked + self.failed_deliveries
        left = len(self._producer)
        if left:
            log.warning("%d lines were not acknowledged at unmount: they may not be in the cluster", left)
            try:
                self._producer.purge(True, True, False)
            except Exception:
                pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(2.0)

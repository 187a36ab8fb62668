"""``df.write.format("logfs")`` and ``df.writeStream.format("logfs")``: rows appended to topics, exactly once.

    df.write.format("logfs").option("topic", "totals").save("/mnt/logs")      # MOUNTPOINT, not DATA_DIR
    (df.writeStream.format("logfs").option("checkpointLocation", "/ckpt/q1").start("/mnt/logs"))

The columns are Spark's Kafka sink's: ``value`` (string or binary, required; null: a tombstone), ``key`` (string
or binary), ``headers`` (array<struct<key: string, value: binary>>), ``topic`` (string; the ``topic`` option wins)
and ``partition`` (int; null: Kafka's default partitioner, ``toPositive(murmur2(key)) % partitions``, and round
robin over the partitions for a null key). Records get the append time as their timestamp.

How a write goes (the publish primitive is :mod:`logfs.storage.publish.transactions`, reached through the mount):

- ``writer()``/``streamWriter()``, on the driver: the columns, the options, the mount (``user.logfs.sink.protocol``
  on its root) and the topics are checked, and each topic's partitions and limits read from its xattrs. Any error
  is raised here, before a task runs.
- ``write()``, in every task attempt (:mod:`logfs.spark.sink_rows`): the rows become Kafka v2 batches (from the
  Arrow buffers, in C: ``_speedups.partition_rows`` and ``encode_arrow``), grouped by target partition, in ONE
  staged file of the attempt's own: ``MOUNT/.logfs-staging/<writer>.<task>.<attempt>...``, or with option ``staging`` a directory the
  driver can read, or ``s3://BUCKET/PREFIX`` (with the source's ``s3.endpoint``/``s3.region``) for executors
  that cannot see the mount. Its commit message names the file and each partition's spans of it. A row the topic
  refuses (unknown topic or partition, over ``max.message.bytes``, no key for a compacted topic) stops the
  attempt's staging; the refusal travels in the message (a task that raised would only be retried).
- ``commit()``, on the driver: the first refusal is raised; else (files staged elsewhere are first copied into
  the mount's staging directory) ONE request to ``MOUNT/.logfs-commit`` names the spans of the winning attempts,
  and the daemon appends them exactly once for the writer: a batch job's own id, or a streaming query's id and the
  micro-batch id (which Spark keeps across restarts from a checkpoint, so a micro-batch replayed after a driver
  crash is recognised). The daemon removes every other staged file of the write (losing and speculative attempts).
- ``abort()``: the write's staged files are removed (and a batch job's prefix closed: a late attempt cannot stage).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Mapping

from ..remote.api import RemoteStoreError
from ..storage.format import lines as storage_lines
from ..storage.names import MOUNT_COMMIT, MOUNT_STAGING, is_internal_topic, is_legal_topic, parse_partition_number
from . import bucket
from .sink_rows import WRITE_BYTES, StagedWrite, bucket_key, stage  # noqa: F401 (stage: what a task runs)

log = logging.getLogger(__name__)

PROTOCOL_XATTR = "user.logfs.sink.protocol"
# Staged files outside the mount (option staging) untouched this long are removed when a write plans (the daemon's
# logfs.staging.retention.ms default, for its own staging directory): a losing attempt that finished after its
# write's cleanup, or a driver that died without committing or aborting, leaves them there.
STAGED_ELSEWHERE_RETENTION_S = 86_400
# The name of a staged file (attempt_name): a batch job's, or a micro-batch's. Only these are ever swept.
STAGED_NAME = re.compile(r"(?:j-[0-9a-f]{32}|q-[0-9a-f-]{36}\.[0-9]+)\.[0-9]+\.[0-9]+\.[0-9]+\.[0-9a-f]{12}")
COPY_BYTES = 16 << 20  # bytes per read when the driver copies a file staged elsewhere into the mount
KAFKA_COLUMNS = ("key", "value", "headers", "topic", "partition")


class SinkError(Exception):
    """A write the logfs sink refuses: its options, its columns, a row, or the commit. Raised on the driver, before
    anything is appended."""


# -- what the driver plans ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopicInfo:
    partitions: tuple[int, ...]
    max_message_bytes: int
    segment_bytes: int
    compact: bool

    @property
    def max_record(self) -> int:
        """The largest record (key + value + header bytes) the topic takes (the lines' rule)."""
        return min(self.max_message_bytes, self.segment_bytes - storage_lines.SEGMENT_SLACK)


@dataclass(frozen=True)
class SinkPlan:
    """Everything a task needs (pickled to the executors with the writer)."""

    mount: str
    topic: str | None  # the topic option
    columns: tuple[str, ...]
    topics: dict  # topic -> TopicInfo (the option's, or every topic of the mount for a topic column)
    staging: str | None  # None: the mount's staging directory; else a directory or s3://BUCKET/PREFIX
    s3_endpoint: str | None = None
    s3_region: str | None = None

    @property
    def staging_in_bucket(self) -> bool:
        return self.staging is not None and bucket.is_bucket_path(self.staging)


def check_mount(path: str) -> None:
    """SinkError unless ``path`` is the root of a logfs mount (its root answers ``user.logfs.sink.protocol``)."""
    try:
        protocol = os.getxattr(path, PROTOCOL_XATTR)
    except OSError as exc:
        raise SinkError(f"{path!r} is not the root of a logfs mount ({exc.strerror or exc}): the sink writes "
                        "through the mount (the MOUNTPOINT given to logfs), not to DATA_DIR") from None
    if protocol != b"1":
        raise SinkError(f"{path!r}: logfs mount speaks sink protocol {protocol!r}, this sink speaks 1")


def topic_info(mount: str, topic: str) -> TopicInfo | None:
    """A topic's partitions and limits, from its directory and xattrs; None if it does not exist."""
    if not is_legal_topic(topic) or is_internal_topic(topic):
        return None
    directory = os.path.join(mount, topic)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None

    def setting(name: str) -> str:
        return os.getxattr(directory, f"user.logfs.config.{name}").decode()

    numbers = sorted(n for n in map(parse_partition_number, names) if n is not None)
    return TopicInfo(tuple(numbers), int(setting("max.message.bytes")), int(setting("segment.bytes")),
                     "compact" in setting("cleanup.policy").split(","))


def _check_columns(schema) -> tuple[str, ...]:
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

    names = [f.name for f in schema.fields]
    other = [n for n in names if n not in KAFKA_COLUMNS]
    if other:
        raise SinkError(f"the logfs sink takes the Kafka sink's columns ({', '.join(KAFKA_COLUMNS)}); "
                        f"unexpected column(s): {', '.join(other)}")
    if "value" not in names:
        raise SinkError("the logfs sink needs a column 'value' (string or binary)")
    types = {f.name: f.dataType for f in schema.fields}
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], (StringType, BinaryType)):
            raise SinkError(f"column {name!r} must be string or binary, not {types[name].simpleString()}")
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise SinkError(f"column 'topic' must be string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise SinkError(f"column 'partition' must be int, not {types['partition'].simpleString()}")
    if "headers" in types:
        t = types["headers"]
        ok = (isinstance(t, ArrayType) and isinstance(t.elementType, StructType)
              and [(f.name, type(f.dataType)) for f in t.elementType.fields] == [("key", StringType),
                                                                                  ("value", BinaryType)])
        if not ok:
            raise SinkError("column 'headers' must be array<struct<key: string, value: binary>>, not "
                            f"{t.simpleString()}")
    return tuple(names)


def plan(options: Mapping[str, str], schema, overwrite: bool, *, streaming: bool) -> SinkPlan:
    """Check a write (driver side) and gather what its tasks need. SinkError for anything refused."""
    if overwrite and not streaming:
        raise SinkError("the logfs sink only appends: mode('overwrite') would have to delete a topic's records; "
                        "use mode('append')")
    mount = options.get("path")
    if not mount:
        raise SinkError("the logfs sink needs the mount: save('/mnt/logs') (or option path)")
    mount = os.path.abspath(mount[len("file://"):] if mount.startswith("file://") else mount)
    columns = _check_columns(schema)
    topic = options.get("topic")
    if topic is None and "topic" not in columns:
        raise SinkError("no topic: set option 'topic' or give a column 'topic'")
    staging = options.get("staging") or None
    endpoint, region = options.get("s3.endpoint") or None, options.get("s3.region") or None
    if staging is not None and bucket.is_bucket_path(staging):
        try:
            bucket.parse_bucket_path(staging)
        except ValueError as exc:
            raise SinkError(f"option staging: {exc}") from None
    elif endpoint or region:
        raise SinkError("options s3.endpoint and s3.region are for staging=s3://BUCKET/PREFIX")
    elif staging is not None and not os.path.isabs(staging):
        raise SinkError(f"option staging must be an absolute directory or s3://BUCKET/PREFIX, not {staging!r}")
    check_mount(mount)
    if topic is not None:
        info = topic_info(mount, topic)
        if info is None:
            raise SinkError(f"unknown topic {topic!r} in {mount} (create it first: mkdir {mount}/{topic})")
        if not info.partitions:
            raise SinkError(f"topic {topic!r} has no partitions")
        topics = {topic: info}
    else:
        topics = {}
        for name in os.listdir(mount):
            info = topic_info(mount, name)
            if info is not None:
                topics[name] = info
    plan_ = SinkPlan(mount, topic, columns, topics, staging, endpoint, region)
    if staging is not None:
        sweep_staged_elsewhere(plan_)
    return plan_


def sweep_staged_elsewhere(plan_: SinkPlan, now_s: float | None = None,
                           retention_s: float = STAGED_ELSEWHERE_RETENTION_S) -> int:
    """Remove staged files of option ``staging`` (a bucket prefix or a directory) untouched for ``retention_s``;
    how many. Best effort: a failure is logged (the write goes on)."""
    cutoff = (time.time() if now_s is None else now_s) - retention_s
    try:
        if plan_.staging_in_bucket:
            under = bucket_key(plan_.staging, "")
            store = bucket.open_store(plan_.staging, plan_.s3_endpoint, plan_.s3_region)
            try:
                old = [o.key for o in store.list(under)
                       if o.modified < cutoff and STAGED_NAME.fullmatch(o.key[len(under):])]
                store.delete(old)
            finally:
                store.close()
            removed = len(old)
        else:
            removed = 0
            for name in os.listdir(plan_.staging):
                path = os.path.join(plan_.staging, name)
                if STAGED_NAME.fullmatch(name) and os.path.isfile(path) and os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
                    removed += 1
    except (OSError, RemoteStoreError) as exc:
        log.warning("logfs sink: old staged files in %s not removed: %s", plan_.staging, exc)
        return 0
    if removed:
        log.info("logfs sink: removed %d staged file(s) older than %d s from %s", removed, retention_s,
                 plan_.staging)
    return removed


# -- what the driver does at the end ----------------------------------------------------------------------------
def control(mount: str, request: dict) -> dict:
    """One request to the daemon through ``MOUNT/.logfs-commit``; its answer. SinkError if it was refused."""
    data = (json.dumps(request, separators=(",", ":")) + "\n").encode()
    fd = os.open(os.path.join(mount, MOUNT_COMMIT), os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            answer = _answer(fd)
            what = f"the {request.get('op')} of {request.get('app') or request.get('prefix')}"
            if answer is None:  # the daemon did not answer (it died, the mount went away)
                raise SinkError(
                    f"no answer from logfs to {what} ({exc.strerror or exc}): its outcome is unknown; once the "
                    f"mount is back, the request {{\"op\": \"status\", \"app\": \"{request.get('app')}\", "
                    f"\"version\": {request.get('version')}}} to {MOUNT_COMMIT} tells whether it was applied") from None
            raise SinkError(f"logfs refused {what}: {answer.get('error') or exc.strerror}") from None
        return _answer(fd) or {}
    finally:
        os.close(fd)


def _answer(fd: int) -> dict | None:
    """The answer to the last request (the commit file reads as a pipe: until its end)."""
    try:
        raw = b""
        while chunk := os.read(fd, 1 << 20):
            raw += chunk
        return json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None


def publish(plan_: SinkPlan, app: str, version: int, messages, *, cleanup: str, close: bool) -> dict:
    """Commit the staged spans of the winning attempts for the writer (app, version): one request."""
    tasks = [m for m in messages if isinstance(m, StagedWrite)]
    for m in tasks:
        if m.error:
            raise SinkError(m.error)
    parts: dict[tuple[str, int], list] = {}
    for m in tasks:
        for topic, partition, spans in m.parts:
            parts.setdefault((topic, partition), []).extend([m.file, pos, length] for pos, length in spans)
    for (topic, partition), spans in parts.items():
        total = sum(s[2] for s in spans)
        limit = plan_.topics[topic].segment_bytes
        if total > limit:
            raise SinkError(f"{total} bytes for {topic}-{partition} in one commit: all of a partition's records in "
                            f"a commit go into one segment, and segment.bytes={limit} (raise it, or write less "
                            "per batch or micro-batch)")
    files = sorted({m.file for m in tasks if m.file})
    if plan_.staging is not None:
        _copy_into_mount(plan_, files)
    answer = control(plan_.mount, {"op": "commit", "app": app, "version": version, "cleanup": cleanup,
                                   "close": close,
                                   "parts": [[t, p, spans] for (t, p), spans in parts.items()]})
    if plan_.staging is not None:
        _remove_staged_elsewhere(plan_, cleanup)
    return answer


def abort(plan_: SinkPlan, prefix: str, *, close: bool) -> None:
    """Remove a write's staged files (best effort: a failure is logged; the daemon's sweep removes them later)."""
    try:
        control(plan_.mount, {"op": "abort", "prefix": prefix, "close": close})
        if plan_.staging is not None:
            _remove_staged_elsewhere(plan_, prefix)
    except (SinkError, OSError) as exc:
        log.warning("logfs sink: the staged files of %s were not all removed: %s", prefix, exc)


def _copy_into_mount(plan_: SinkPlan, files: list[str]) -> None:
    """Files staged in a directory or a bucket, copied into the mount's staging directory (the daemon reads only
    what is in its own)."""
    store = bucket.open_store(plan_.staging, plan_.s3_endpoint, plan_.s3_region) if plan_.staging_in_bucket \
        else None
    try:
        for name in files:
            target = os.path.join(plan_.mount, MOUNT_STAGING, name)
            try:
                os.unlink(target)  # a copy by an earlier call of this commit
            except FileNotFoundError:
                pass
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                if store is not None:
                    key, position = bucket_key(plan_.staging, name), 0
                    while True:
                        chunk = store.get_range(key, position, COPY_BYTES)
                        if not chunk:
                            break
                        _write_all(out, chunk)
                        position += len(chunk)
                else:
                    with open(os.path.join(plan_.staging, name), "rb") as f:
                        while chunk := f.read(COPY_BYTES):
                            _write_all(out, chunk)
            finally:
                os.close(out)
    finally:
        if store is not None:
            store.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:WRITE_BYTES]):]


def _remove_staged_elsewhere(plan_: SinkPlan, prefix: str) -> None:
    if plan_.staging_in_bucket:
        store = bucket.open_store(plan_.staging, plan_.s3_endpoint, plan_.s3_region)
        try:
            store.delete([o.key for o in store.list(bucket_key(plan_.staging, prefix))])
        finally:
            store.close()
        return
    for name in os.listdir(plan_.staging):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(plan_.staging, name))
            except FileNotFoundError:
                pass


def attempt_name(prefix: str) -> str:
    """The staged file of this task attempt: ``prefix`` + partition id, attempt number, task attempt id, and a
    random part (a restarted driver numbers its task attempts from 0 again)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return f"{prefix}{ctx.partitionId()}.{ctx.attemptNumber()}.{ctx.taskAttemptId()}.{uuid.uuid4().hex[:12]}"

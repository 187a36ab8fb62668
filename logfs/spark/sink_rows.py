"""What one task attempt of a ``logfs`` sink write does (:mod:`logfs.spark.sink` is the rest): its rows, as Arrow
record batches, become Kafka v2 batches grouped by target partition, in ONE staged file of the attempt's own, and
a :class:`StagedWrite` tells the driver the file and each partition's spans of it.

Kafka's default partitioner (``toPositive(murmur2(key)) % partitions``; round robin for a null key) and the
batches are computed from the Arrow buffers in C (``_speedups.partition_rows``, ``encode_arrow``); the Python
paths here (:func:`murmur2`, :func:`default_partition`, :func:`encode_batches`) give the same results, and take
rows with headers. A row its topic refuses ends the attempt's staging with :class:`RowRefused`, reported in the
message (a task that raised would only be retried).
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from typing import Iterator, Protocol

import crc32c as _crc32c
import pyarrow as pa
import pyarrow.compute as pc

from ..storage.format import records as rec
from ..storage.names import MOUNT_STAGING
from . import bucket


class SinkPlan(Protocol):
    """What a task reads of the driver's plan (:class:`logfs.spark.sink.SinkPlan`, which imports this module)."""

    mount: str
    topic: str | None
    topics: dict
    staging: str | None
    s3_endpoint: str | None
    s3_region: str | None

    @property
    def staging_in_bucket(self) -> bool: ...


from ..storage.format.speedups import C as _speedups

TARGET_BATCH_BYTES = 64 * 1024  # as the log's own appends (logfs.storage.local.log.TARGET_BATCH_BYTES)
CHUNK_BYTES = 8 << 20  # Arrow bytes gathered before they are partitioned (fewer, fuller batches per partition)
WRITE_BYTES = 1 << 20  # staged bytes per write(): one FUSE request
_CRC = struct.Struct(">I")

class RowRefused(Exception):
    """A row the target topic does not take (travels to the driver in the commit message)."""


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Utils.murmur2, signed 32 bits); the Python path of ``_speedups.murmur2``."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def default_partition(key: bytes | None, partitions, rr: int) -> tuple[int, int]:
    """Kafka's default partitioner for one row: (partition, next round-robin counter)."""
    if key is not None:
        return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)], rr
    return partitions[rr % len(partitions)], rr + 1


def _binary(column: pa.Array | None) -> pa.Array | None:
    """A string or binary column as binary with int32 offsets (a string's buffers are a binary's: no copy)."""
    if column is None:
        return None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa.types.is_binary(t):
        return column
    if pa.types.is_string(t):
        return column.view(pa.binary())
    if pa.types.is_large_string(t):
        column = column.view(pa.large_binary())
    return column.cast(pa.binary())


def _buffers(column: pa.Array) -> tuple:
    valid, offsets, data = column.buffers()[:3]
    return (valid if column.null_count else None, offsets, data, column.offset)


def _lengths(column: pa.Array | None, n: int) -> pa.Array:
    if column is None:
        return pa.repeat(pa.scalar(0, pa.int64()), n)
    return pc.fill_null(pc.binary_length(column).cast(pa.int64()), 0)


class _StageFile:
    """One task attempt's staged file, written sequentially in WRITE_BYTES pieces: in the mount's staging
    directory, in the ``staging`` directory, or in a local temporary file uploaded to the bucket at the end."""

    def __init__(self, plan_: SinkPlan, name: str):
        self.plan, self.name = plan_, name
        self.fd = -1
        self.position = 0
        self.pending: list = []
        self.pending_bytes = 0
        if plan_.staging is None:
            self.path = os.path.join(plan_.mount, MOUNT_STAGING, name)
        elif plan_.staging_in_bucket:
            fd, self.path = tempfile.mkstemp(prefix=f"logfs-stage-{name}-")
            os.close(fd)
        else:
            self.path = os.path.join(plan_.staging, name)

    def write(self, batches: list) -> tuple[int, int]:
        """Queue whole batches; returns their span (position, length) in the file."""
        start = self.position
        for b in batches:
            self.pending.append(b)
            self.pending_bytes += len(b)
            self.position += len(b)
        if self.pending_bytes >= WRITE_BYTES:
            self._flush()
        return start, self.position - start

    def _flush(self) -> None:
        if not self.pending:
            return
        if self.fd < 0:
            flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_TRUNC if self.plan.staging_in_bucket else os.O_CREAT | os.O_EXCL)
            self.fd = os.open(self.path, flags, 0o644)
        data = b"".join(self.pending)
        self.pending, self.pending_bytes = [], 0
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view[:WRITE_BYTES]):]

    def finish(self) -> None:
        """The whole file written, and durable (the daemon fsyncs the staged files a commit names before its
        commit point; synced here, in the tasks, that costs the commit nothing)."""
        self._flush()
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
        if self.plan.staging_in_bucket and self.position:
            store = bucket.open_store(self.plan.staging, self.plan.s3_endpoint, self.plan.s3_region)
            try:
                store.put_file(bucket_key(self.plan.staging, self.name), self.path)
            finally:
                store.close()
                os.unlink(self.path)

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.position or self.plan.staging_in_bucket:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def bucket_key(staging: str, name: str) -> str:
    """The object key of staged file ``name`` under ``staging`` (s3://BUCKET/PREFIX)."""
    prefix = bucket.parse_bucket_path(staging)[1]
    return f"{prefix}/{name}" if prefix else name


class StagedWrite:
    """What one task attempt reports (its WriterCommitMessage carries this)."""

    def __init__(self, file: str | None, parts: list, rows: int, nbytes: int, error: str | None = None,
                 app: str | None = None, version: int | None = None):
        self.file, self.parts, self.rows, self.bytes = file, parts, rows, nbytes
        self.error, self.app, self.version = error, app, version


class _Stager:
    """Rows of one task attempt -> batches per target partition -> the staged file."""

    def __init__(self, plan_: SinkPlan, name: str, rr_start: int):
        self.plan = plan_
        self.file = _StageFile(plan_, name)
        self.spans: dict[tuple[str, int], list[list[int]]] = {}
        self.rr: dict[str, int] = {}
        self.rr_start = rr_start
        self.rows = 0
        self.timestamp = int(time.time() * 1000)

    def add(self, table: pa.Table) -> None:
        n = table.num_rows
        if not n:
            return
        names = table.column_names
        col = {name: table.column(name).combine_chunks() for name in names}
        if self.plan.topic is not None:
            groups = [(self.plan.topic, None)]
        else:
            topics = col["topic"]
            if topics.null_count:
                raise RowRefused("a row without a topic (its 'topic' column is null and no option 'topic' is set)")
            groups = [(t, pc.equal(topics, t)) for t in pc.unique(topics).to_pylist()]
        for topic, mask in groups:
            part = col if mask is None else {k: pc.filter(v, mask) for k, v in col.items()}
            self._add_topic(topic, part, len(part["value"]))
        self.rows += n

    def _add_topic(self, topic: str, col: dict, n: int) -> None:
        info = self.plan.topics.get(topic)
        if info is None:
            raise RowRefused(f"unknown topic {topic!r} in {self.plan.mount}")
        if not info.partitions:
            raise RowRefused(f"topic {topic!r} has no partitions")
        values, keys = _binary(col["value"]), _binary(col.get("key"))
        headers = col.get("headers")
        if headers is not None and headers.null_count == len(headers):
            headers = None
        explicit = col.get("partition")
        if explicit is not None and explicit.null_count == len(explicit):
            explicit = None
        # The topic's rules, for every row at once.
        if explicit is not None:
            known = pc.is_in(explicit, value_set=pa.array(info.partitions, pa.int32()))
            bad = pc.and_(pc.is_valid(explicit), pc.invert(known))
            if pc.any(bad).as_py():
                first = explicit.filter(bad)[0].as_py()
                raise RowRefused(f"topic {topic!r} has no partition {first} (it has {len(info.partitions)}: "
                                 f"{_describe_partitions(info.partitions)})")
        sizes = pc.add(_lengths(values, n), _lengths(keys, n))
        if headers is not None:
            sizes = pc.add(sizes, pa.array([sum(len(h["key"].encode()) + len(h["value"] or b"") for h in hs)
                                            if hs else 0 for hs in headers.to_pylist()], pa.int64()))
        largest = pc.max(sizes).as_py() or 0
        if largest > info.max_record:
            raise RowRefused(f"a record of {largest} bytes (key + value + headers) for topic {topic!r} exceeds "
                             f"max.message.bytes={info.max_message_bytes}"
                             + (f" (or what a segment of segment.bytes={info.segment_bytes} holds)"
                                if info.max_record < info.max_message_bytes else ""))
        if info.compact and (keys is None or keys.null_count):
            raise RowRefused(f"topic {topic!r} is compacted (its cleanup.policy has compact): every record needs a key")
        # Target partitions, then the rows of each partition in their order (a stable sort).
        rr = self.rr.get(topic, self.rr_start)
        if _speedups is not None:
            raw, rr = _speedups.partition_rows(
                n, _buffers(keys) if keys is not None else None,
                (explicit.buffers()[0] if explicit.null_count else None, explicit.buffers()[1], explicit.offset)
                if explicit is not None else None,
                pa.array(info.partitions, pa.int32()).buffers()[1], rr)
            targets = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(raw)])
        else:
            out = []
            key_list = keys.to_pylist() if keys is not None else [None] * n
            ex_list = explicit.to_pylist() if explicit is not None else [None] * n
            for k, e in zip(key_list, ex_list):
                if e is None:
                    e, rr = default_partition(k, info.partitions, rr)
                out.append(e)
            targets = pa.array(out, pa.int32())
        self.rr[topic] = rr
        order = pc.sort_indices(targets).cast(pa.int64())
        runs = pc.run_end_encode(pc.take(targets, order))
        start = 0
        for partition, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist()):
            batches = self._encode(values, keys, headers, order, start, end)
            position, length = self.file.write(batches)
            spans = self.spans.setdefault((topic, partition), [])
            if spans and spans[-1][0] + spans[-1][1] == position:
                spans[-1][1] += length
            else:
                spans.append([position, length])
            start = end

    def _encode(self, values, keys, headers, order, start: int, end: int) -> list:
        if _speedups is not None and headers is None:
            batches = _speedups.encode_arrow(_buffers(values), _buffers(keys) if keys is not None else None,
                                             order.buffers()[1], start, end, TARGET_BATCH_BYTES, self.timestamp)
            for b in batches:
                _CRC.pack_into(b, 17, _crc32c.crc32c(memoryview(b)[21:]))
            return batches
        rows = order.slice(start, end - start)
        vals = values.take(rows).to_pylist()
        ks = keys.take(rows).to_pylist() if keys is not None else None
        hs = ([[(h["key"], h["value"]) for h in (x or ())] for x in headers.take(rows).to_pylist()]
              if headers is not None else None)
        return encode_batches(vals, ks, hs, TARGET_BATCH_BYTES, self.timestamp)

    def finish(self, app: str | None = None, version: int | None = None) -> StagedWrite:
        self.file.finish()
        parts = [(t, p, [tuple(s) for s in spans]) for (t, p), spans in self.spans.items()]
        return StagedWrite(self.file.name if self.file.position else None, parts, self.rows, self.file.position,
                           app=app, version=version)


def encode_batches(values: list, keys: list | None, headers: list | None, target: int, timestamp: int) -> list:
    """The Python path of ``_speedups.encode_arrow`` (byte for byte), and the path for rows with headers: batches
    of about ``target`` bytes each (at least one record), CRC stamped."""
    out, start, n = [], 0, len(values)
    while start < n:
        size, end = rec.HEADER_SIZE, start
        while end < n:
            record = _record_size(values[end], keys[end] if keys is not None else None,
                                  headers[end] if headers is not None else (), end - start)
            if end > start and size + record > target:
                break
            size += record
            end += 1
        out.append(bytearray(rec.build_batch_generic(
            0, timestamp, values[start:end], keys[start:end] if keys is not None else None,
            headers[start:end] if headers is not None else None)))
        start = end
    return out


def _varint_size(value: int) -> int:
    z = ((value << 1) ^ (value >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


def _record_size(value: bytes | None, key: bytes | None, headers, delta: int) -> int:
    """Bytes of one record in a batch (Kafka v2's framing; timestamp delta 0)."""
    body = 2 + _varint_size(delta)
    for field in (key, value):
        body += _varint_size(-1) if field is None else _varint_size(len(field)) + len(field)
    body += _varint_size(len(headers))
    for k, v in headers:
        k = k.encode()
        body += _varint_size(len(k)) + len(k) + (_varint_size(-1) if v is None else _varint_size(len(v)) + len(v))
    return _varint_size(body) + body


def _describe_partitions(parts) -> str:
    return ", ".join(map(str, parts[:10])) + (", ..." if len(parts) > 10 else "")


def stage(plan_: SinkPlan, batches: Iterator[pa.RecordBatch], name: str, rr_start: int,
          app: str | None = None, version: int | None = None) -> StagedWrite:
    """One task attempt: its rows staged as batches in file ``name``; the message for the driver."""
    stager = _Stager(plan_, name, rr_start)
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    try:
        for batch in batches:
            pending.append(batch)
            pending_bytes += batch.nbytes
            if pending_bytes >= CHUNK_BYTES:
                stager.add(pa.Table.from_batches(pending))
                pending, pending_bytes = [], 0
        if pending:
            stager.add(pa.Table.from_batches(pending))
        return stager.finish(app, version)
    except RowRefused as refused:
        stager.file.discard()
        return StagedWrite(None, [], 0, 0, error=str(refused), app=app, version=version)
    except BaseException:
        stager.file.discard()
        raise

"""``spark.read.format("logfs")`` / ``spark.readStream.format("logfs")``: a PySpark Python data source that
reads a logfs DATA_DIR's segments directly (no mount, no daemon needed, never the ``.lock``), or the tiered log
in its bucket (``load("s3://BUCKET/PREFIX")``, :mod:`logfs.spark.bucket`).

The rows have Spark's Kafka source schema. Each input partition is one offset range of one topic-partition;
the executors read segments with the storage's read-only reader (:mod:`logfs.storage.local.reader`) and hand Spark
Arrow record batches. The data directory must be readable at the same path by the driver and every executor
(local mode, or a shared filesystem); the bucket, by every executor's AWS credential chain.
"""

from __future__ import annotations

import logging
import sys
import uuid
from typing import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamArrowWriter, DataSourceStreamReader,
    InputPartition, WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
)

from .options import (
    EARLIEST, LATEST, PartitionOffsets, OffsetRange, SourceOptions, check_data_loss, offsets_from_json, offsets_to_json,
    plan_batch, rate_limit, split_ranges, starting_offsets,
)
from . import pushdown
from .segments import TopicPartition
from . import sink
from ..storage.format import records as rec

log = logging.getLogger(__name__)

from ..storage.format.speedups import C as _speedups  # whole uncompressed batches to Arrow buffers

ARROW_BATCH_ROWS = 8192  # rows per Arrow batch on the per-record path
COLUMNS_GROUP_BYTES = 4 << 20  # bytes of batches per C decode (one Arrow batch each)

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
])))


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (with ``headers`` when includeHeaders is true)."""
    return StructType(KAFKA_SCHEMA.fields + ([HEADERS_FIELD] if include_headers else []))


class LogfsPartition(InputPartition):
    """One Spark input partition: records [start, end) of one topic-partition."""

    def __init__(self, r: OffsetRange):
        super().__init__(r)
        self.range = r

    def __repr__(self) -> str:
        r = self.range
        return f"LogfsPartition({r.topic}-{r.partition} [{r.start}, {r.end}))"


def read_range(options: SourceOptions, r: OffsetRange, schema: StructType) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the records in ``r`` (what an executor runs for one input partition).

    Batches go to Arrow without a Python object per record: runs of them, up to ``COLUMNS_GROUP_BYTES``, are
    decoded by one C call (``_speedups.decode_columns``) into Arrow buffers; a compressed batch is decompressed
    once first (:func:`~logfs.storage.format.records.decompress_batch`). Headers, or a build without the accelerator,
    take the per-record path."""
    store = options.store() if options.from_bucket else None
    try:
        yield from _read_batches(options, r, schema, options.reader(TopicPartition(r.topic, r.partition),
                                                                     store=store))
    finally:
        if store is not None:
            store.close()


def _read_batches(options: SourceOptions, r: OffsetRange, schema: StructType, reader) -> Iterator[pa.RecordBatch]:
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    types = [f.type for f in arrow_schema]
    with_headers = "headers" in arrow_schema.names
    keys: list = []
    values: list = []
    offsets: list = []
    stamps: list = []
    stamp_types: list = []
    headers: list = []
    group: list = []  # uncompressed batches for the C decoder
    group_bytes = 0

    constants: list = []  # the topic and partition columns, for the most rows asked so far: sliced per batch

    def constant_columns(n: int) -> list:
        if not constants or len(constants[0]) < n:
            rows = max(n, 2 * len(constants[0]) if constants else 0)
            constants[:] = [pa.repeat(r.topic, rows).cast(types[2]),
                            pa.Array.from_buffers(types[3], rows, [None, pa.py_buffer(
                                r.partition.to_bytes(4, sys.byteorder, signed=True) * rows)])]
        return [c.slice(0, n) for c in constants]

    def flush() -> pa.RecordBatch:
        n = len(offsets)
        columns = [
            pa.array(keys, type=types[0]),
            pa.array(values, type=types[1]),
            *constant_columns(n),
            pa.array(offsets, type=types[4]),
            pa.array(stamps, type=pa.int64()).cast(types[5]) if n else pa.array([], type=types[5]),
            pa.array(stamp_types, type=types[6]),
        ]
        if with_headers:
            columns.append(pa.array(headers, type=types[7]))
        batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema)
        for column in (keys, values, offsets, stamps, stamp_types, headers):
            column.clear()
        return batch

    def flush_group() -> Iterator[pa.RecordBatch]:
        nonlocal group_bytes
        (n, offs, ts, ts_types, kvalid, koffs, kdata, knulls, vvalid, voffs, vdata,
         vnulls) = _speedups.decode_columns(group, r.start, r.end)
        group.clear()
        group_bytes = 0
        if not n:
            return
        buf = pa.py_buffer
        columns = [
            pa.Array.from_buffers(types[0], n, [buf(kvalid), buf(koffs), buf(kdata)], null_count=knulls),
            pa.Array.from_buffers(types[1], n, [buf(vvalid), buf(voffs), buf(vdata)], null_count=vnulls),
            *constant_columns(n),
            pa.Array.from_buffers(types[4], n, [None, buf(offs)]),
            pa.Array.from_buffers(types[5], n, [None, buf(ts)]),
            pa.Array.from_buffers(types[6], n, [None, buf(ts_types)]),
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=arrow_schema)

    fast = _speedups is not None and not with_headers
    for header, data in reader.batches(r.start, r.end, fail_on_data_loss=options.fail_on_data_loss):
        if header.is_control or (not options.read_uncommitted and reader.is_aborted(header)):
            continue  # (what a consumer of kafka.isolation.level reads: control batches never are records)
        if fast:
            if offsets:
                yield flush()
            if header.compression:
                data = rec.decompress_batch(data)  # once per batch; then the same C decoder as plain batches
            group.append(data)
            group_bytes += len(data)
            if group_bytes >= COLUMNS_GROUP_BYTES:
                yield from flush_group()
            continue
        if group:
            yield from flush_group()
        ts_type = header.timestamp_type
        for record in rec.decode_raw(data):
            if not r.start <= record.offset < r.end:
                continue
            keys.append(record.key)
            values.append(record.value)
            offsets.append(record.offset)
            stamps.append(record.timestamp * 1000)  # ms -> the us of Spark's TimestampType
            stamp_types.append(ts_type)
            if with_headers:
                headers.append([{"key": k, "value": v} for k, v in record.headers])
            if len(offsets) >= ARROW_BATCH_ROWS:
                yield flush()
    if group:
        yield from flush_group()
    if offsets:
        yield flush()


class LogfsBatchReader(DataSourceReader):
    """A batch read without filter pushdown (Spark plans it so when pushdown is off, or when the query has no
    filter it could push): it must not implement ``pushFilters``, or Spark fails the read with
    DATA_SOURCE_PUSHDOWN_DISABLED while ``spark.sql.python.filterPushdown.enabled`` is false."""

    narrowings: list | None = None  # (pushed-down filters: LogfsPushdownReader)

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [LogfsPartition(r) for r in plan_batch(self.options, self.narrowings)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition, self.schema)


class LogfsPushdownReader(LogfsBatchReader):
    """The batch reader Spark's filter-pushdown planner gets (:mod:`logfs.spark.pushdown`): filters on
    ``topic``, ``partition``, ``offset`` and ``timestamp`` narrow the offset ranges before they are planned.
    Every filter is handed back (Spark applies them to what is read: exact rows)."""

    def __init__(self, options: SourceOptions, schema: StructType, relation: str):
        super().__init__(options, schema)
        self.relation = relation

    def pushFilters(self, filters: list) -> Iterable:
        narrowing = pushdown.translate(filters)
        try:
            self.narrowings = pushdown.remember(self.relation, narrowing)
        except OSError as exc:  # no record possible: plan without narrowing (always correct)
            log.warning("logfs: filter pushdown off for this scan (%s)", exc)
            self.narrowings = None
        return filters


def _planned_for_pushdown() -> bool:
    """Whether ``DataSource.reader`` is being called by Spark's filter-pushdown planner (pyspark's
    ``data_source_pushdown_filters`` worker), the one caller that calls ``pushFilters``. Any other caller (the
    plain planner, which fails a reader implementing ``pushFilters`` while pushdown is off) gets a reader
    without it."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


def _read(options: SourceOptions, partition: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    # A plan without input partitions (no partition selected, or nothing in the ranges) is run by Spark as one
    # task over a bare InputPartition(None): it reads nothing.
    if not isinstance(partition, LogfsPartition):
        return iter(())
    return read_range(options, partition.range, schema)


class LogfsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets are Kafka's JSON, ``{"topic": {"0": 23}}``: the next offset to read per
    topic-partition. Partitions that appear later (new topics matching the subscription, new partitions)
    are read from their earliest offset, as Spark's Kafka source does."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow: never read past this
        self._boundaries: dict = {}  # segment base offsets seen by the last look, for splitting on them

    def _latest(self) -> tuple[PartitionOffsets, PartitionOffsets]:
        layouts = self.options.layouts()
        self._boundaries = {(tp.topic, tp.partition): layout[2] for tp, layout in layouts.items()}
        return {tp: b[0] for tp, b in layouts.items()}, {tp: b[1] for tp, b in layouts.items()}

    def initialOffset(self) -> dict:
        """startingTimestamp, startingOffsetsByTimestamp or startingOffsets (in that precedence), default
        latest."""
        return offsets_to_json(starting_offsets(self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        starts, latest = self._latest()
        for tp, offset in begin.items():
            if tp not in latest:
                latest[tp] = offset  # the partition was deleted: stays where it was
        for tp in latest:
            if tp not in begin:
                begin[tp] = starts.get(tp, 0)  # discovered now: from its earliest offset
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, begin[tp])) if tp in self._target else begin[tp]
                      for tp, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest()[1])

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        finish = offsets_from_json(end)
        starts = None
        ranges = []
        for tp, stop in finish.items():
            first = begin.get(tp)
            if first is None:  # new since the previous batch: from its earliest offset
                if starts is None:
                    starts = self._latest()[0]
                first = starts.get(tp, 0)
            if stop < first:
                # The log end went below where the stream was (the partition was deleted and created again):
                # as the Kafka source, report it and go on from the new end.
                check_data_loss(tp, -1, 0, self.options.fail_on_data_loss,
                                f"{tp}: the log end offset went back from {first} to {stop} (partition recreated?)")
                continue
            ranges.append(OffsetRange(tp.topic, tp.partition, first, stop))
        parts = split_ranges(ranges, self.options.max_records_per_partition, self.options.min_partitions,
                             self._boundaries)
        return [LogfsPartition(r) for r in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition, self.schema)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the log is the daemon's, and retention is its business


class StagedMessage(WriterCommitMessage):
    """A task attempt's report to the driver: its staged file and spans, or the row its topic refused."""

    def __init__(self, staged: sink.StagedWrite):
        self.staged = staged


def _staged(messages) -> list:
    return [m.staged if isinstance(m, StagedMessage) else None for m in messages]


class LogfsBatchWriter(DataSourceArrowWriter):
    """``df.write.format("logfs")``: one writer per job, its id shared by the tasks (this object is pickled to
    them) and by ``commit``/``abort``: every staged file of the job starts with ``j-<id>.``."""

    def __init__(self, plan: sink.SinkPlan):
        self.plan = plan
        self.app = "j-" + uuid.uuid4().hex
        self.prefix = self.app + "."

    def write(self, iterator) -> StagedMessage:
        from pyspark import TaskContext

        return StagedMessage(sink.stage(self.plan, iterator, sink.attempt_name(self.prefix),
                                        TaskContext.get().partitionId()))

    def commit(self, messages) -> None:
        answer = sink.publish(self.plan, self.app, 0, _staged(messages), cleanup=self.prefix, close=True)
        log.info("logfs sink: %s appended %s", self.app, answer.get("offsets"))

    def abort(self, messages) -> None:
        sink.abort(self.plan, self.prefix, close=True)


class LogfsStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("logfs")``: the writer of micro-batch ``batchId`` of a query is (its query id,
    batchId), both kept in the checkpoint, so the daemon recognises a micro-batch committed before a driver crash
    and replayed after the restart. The tasks read both from their local properties; commit and abort, which
    Spark runs in another process with a new instance of this class, from the tasks' messages."""

    def __init__(self, plan: sink.SinkPlan):
        self.plan = plan

    def write(self, iterator) -> StagedMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise sink.SinkError("a streaming write without its query id and batch id (Spark sets them on the "
                                 "tasks of a micro-batch)")
        app = "q-" + query
        return StagedMessage(sink.stage(self.plan, iterator, sink.attempt_name(f"{app}.{batch}."),
                                        ctx.partitionId(), app=app, version=int(batch)))

    def commit(self, messages, batchId: int) -> None:
        staged = [m for m in _staged(messages) if m is not None]
        apps = {m.app for m in staged}
        if not apps:
            return  # no task reported: nothing was staged
        if len(apps) != 1 or any(m.version != batchId for m in staged):
            raise sink.SinkError(f"micro-batch {batchId}: messages of other writers {sorted(apps)}")
        app = apps.pop()
        # Every other staged file of the query goes: the losing attempts', and those a crashed run left.
        answer = sink.publish(self.plan, app, batchId, staged, cleanup=app + ".", close=False)
        if answer.get("duplicate"):
            log.info("logfs sink: %s micro-batch %d was already appended (a replay): nothing appended again",
                     app, batchId)

    def abort(self, messages, batchId: int) -> None:
        apps = {m.app for m in _staged(messages) if m is not None}
        for app in apps:
            sink.abort(self.plan, f"{app}.{batchId}.", close=False)


class LogfsDataSource(DataSource):
    """Register with ``spark.dataSource.register(LogfsDataSource)`` (or :func:`logfs.spark.register`)."""

    @classmethod
    def name(cls) -> str:
        return "logfs"

    def __init__(self, options):
        super().__init__(options)
        self._parsed = None
        # This relation's id: Spark creates the data source once per load() and pickles it into every planning
        # call for the relation (see logfs.spark.pushdown for why that matters).
        self.relation = uuid.uuid4().hex

    @property
    def parsed(self) -> SourceOptions:
        """The source's options (parsed when a read asks: a write has other options)."""
        if self._parsed is None:
            self._parsed = SourceOptions.parse(self.options)
        return self._parsed

    def writer(self, schema: StructType, overwrite: bool) -> LogfsBatchWriter:
        return LogfsBatchWriter(sink.plan(self.options, schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LogfsStreamWriter:
        return LogfsStreamWriter(sink.plan(self.options, schema, overwrite, streaming=True))

    def schema(self) -> StructType:
        return source_schema(self.parsed.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        if _planned_for_pushdown():
            return LogfsPushdownReader(self.parsed, schema, self.relation)
        return LogfsBatchReader(self.parsed, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.parsed.has_ending:
            from .options import OptionError

            raise OptionError("options endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch "
                              "queries only")
        return LogfsStreamReader(self.parsed, schema)


__all__ = ["LogfsDataSource", "source_schema", "KAFKA_SCHEMA", "EARLIEST", "LATEST"]

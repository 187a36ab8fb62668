"""Options of the ``logfs`` Spark source and offset planning (no PySpark here: testable on its own). The values
of single options are parsed in :mod:`logfs.spark.specs`.

The option names and offset JSON follow Spark's Kafka source, so a job can move between the two by changing
``format("kafka")`` to ``format("logfs")`` and ``kafka.bootstrap.servers`` to ``path``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from . import bucket
from .segments import DataLossError, PartitionReader, TopicPartition, list_partitions, select_partitions
from .specs import (EARLIEST, LATEST, OptionError, bool_option, offsets_spec, positive_int_option,
                    timestamp_option, timestamps_spec)

log = logging.getLogger(__name__)

DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

PartitionOffsets = dict[TopicPartition, int]


STRATEGY_ERROR = "error"
STRATEGY_LATEST = "latest"
ISOLATION_COMMITTED = "read_committed"
ISOLATION_UNCOMMITTED = "read_uncommitted"


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class SourceOptions:
    data_dir: str
    subscribe: tuple[str, ...] | None = None
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    starting: int | dict[TopicPartition, int] | None = None
    ending: int | dict[TopicPartition, int] | None = None
    include_headers: bool = False
    max_records_per_partition: int | None = DEFAULT_MAX_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = False
    s3_endpoint: str | None = None  # with path s3://BUCKET/PREFIX: the tiered log in the bucket (bucket.py)
    s3_region: str | None = None
    local_data_dir: str | None = None  # with a bucket path: the daemon's DATA_DIR, for what is not tiered yet
    # Spark's Kafka-source timestamp options (epoch ms; -2 earliest, -1 latest). Precedence as Spark's
    # getKafkaOffsetRangeLimit: the global timestamp, then the per-partition ones, then the offsets.
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[TopicPartition, int] | None = None
    ending_timestamp: int | None = None
    ending_by_timestamp: dict[TopicPartition, int] | None = None
    starting_strategy: str = STRATEGY_ERROR  # startingOffsetsByTimestampStrategy: no offset for the timestamp
    # kafka.isolation.level (the consumer setting Spark's Kafka source passes on): read_uncommitted gives the
    # records of Kafka's aborted transactions too, as the mount's logfs.isolation.level does. The default is the
    # mount's, read_committed (a Kafka consumer's own default is read_uncommitted).
    read_uncommitted: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        """From Spark's (case-insensitive) option map."""
        data_dir = options.get("path")
        if not data_dir:
            raise OptionError("the logfs source needs the data directory: option path "
                              "(spark.read.format('logfs').load('/var/lib/logfs'), or load('s3://BUCKET/PREFIX'))")
        if bucket.is_bucket_path(data_dir):
            try:
                bucket.parse_bucket_path(data_dir)
            except ValueError as exc:
                raise OptionError(f"option path: {exc}") from None
        elif any(options.get(n) is not None for n in ("s3.endpoint", "s3.region", "localDataDir")):
            raise OptionError("options s3.endpoint, s3.region and localDataDir are for a path s3://BUCKET/PREFIX, "
                              f"not {data_dir!r}")
        subscribe = options.get("subscribe")
        pattern = options.get("subscribePattern")
        assign_raw = options.get("assign")
        given = [n for n, v in (("subscribe", subscribe), ("subscribePattern", pattern), ("assign", assign_raw))
                 if v is not None]
        if len(given) != 1:
            raise OptionError("exactly one of the options subscribe, subscribePattern or assign is required"
                              + (f" (got {', '.join(given)})" if given else ""))
        topics = None
        if subscribe is not None:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
            if not topics:
                raise OptionError("option subscribe: no topic named")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise OptionError(f"option subscribePattern: invalid regex {pattern!r}: {exc}") from None
        assign = None
        if assign_raw is not None:
            try:
                data = json.loads(assign_raw)
                assign = {str(t): [int(p) for p in ps] for t, ps in data.items()}
            except (ValueError, TypeError, AttributeError):
                raise OptionError(f"option assign must be JSON like {{\"topic\":[0,1]}}, not {assign_raw!r}") \
                    from None
        if options.get("kafka.bootstrap.servers") is not None:
            raise OptionError("option kafka.bootstrap.servers is not supported by the logfs source (there is no "
                              "broker: the path names the data directory or the bucket)")
        strategy = str(options.get("startingOffsetsByTimestampStrategy") or STRATEGY_ERROR).strip().lower()
        if strategy not in (STRATEGY_ERROR, STRATEGY_LATEST):
            raise OptionError("option startingOffsetsByTimestampStrategy must be error or latest, not "
                              f"{options.get('startingOffsetsByTimestampStrategy')!r}")
        isolation = str(options.get("kafka.isolation.level") or ISOLATION_COMMITTED).strip().lower()
        if isolation not in (ISOLATION_COMMITTED, ISOLATION_UNCOMMITTED):
            raise OptionError("option kafka.isolation.level must be read_committed or read_uncommitted, not "
                              f"{options.get('kafka.isolation.level')!r}")
        return cls(
            data_dir=str(data_dir),
            subscribe=topics,
            pattern=pattern,
            assign=assign,
            starting=offsets_spec(options.get("startingOffsets"), "startingOffsets"),
            ending=offsets_spec(options.get("endingOffsets"), "endingOffsets"),
            include_headers=bool_option(options, "includeHeaders", False),
            max_records_per_partition=positive_int_option(options, "maxRecordsPerPartition",
                                                    DEFAULT_MAX_RECORDS_PER_PARTITION),
            min_partitions=positive_int_option(options, "minPartitions", None),
            max_offsets_per_trigger=positive_int_option(options, "maxOffsetsPerTrigger", None),
            fail_on_data_loss=bool_option(options, "failOnDataLoss", False),
            s3_endpoint=options.get("s3.endpoint") or None,
            s3_region=options.get("s3.region") or None,
            local_data_dir=options.get("localDataDir") or None,
            starting_timestamp=timestamp_option(options.get("startingTimestamp"), "startingTimestamp"),
            starting_by_timestamp=timestamps_spec(options.get("startingOffsetsByTimestamp"),
                                                        "startingOffsetsByTimestamp"),
            ending_timestamp=timestamp_option(options.get("endingTimestamp"), "endingTimestamp"),
            ending_by_timestamp=timestamps_spec(options.get("endingOffsetsByTimestamp"),
                                                      "endingOffsetsByTimestamp"),
            starting_strategy=strategy,
            read_uncommitted=isolation == ISOLATION_UNCOMMITTED,
        )

    @property
    def has_ending(self) -> bool:
        """Whether an ending option is set (batch queries only)."""
        return self.ending is not None or self.ending_timestamp is not None or self.ending_by_timestamp is not None

    # -- partitions and their offsets --------------------------------------------------------------------
    @property
    def from_bucket(self) -> bool:
        return bucket.is_bucket_path(self.data_dir)

    def all_partitions(self) -> dict[TopicPartition, str]:
        """Every partition of the data directory (or bucket prefix) -> its directory (or manifest key)."""
        if self.from_bucket:
            store = self.store()
            try:
                found = bucket.list_bucket_partitions(store, bucket.parse_bucket_path(self.data_dir)[1])
            finally:
                store.close()
            if self.local_data_dir:
                found = {**list_partitions(self.local_data_dir), **found}
            return found
        return list_partitions(self.data_dir)

    def partitions(self) -> dict[TopicPartition, str]:
        return select_partitions(self.all_partitions(), subscribe=list(self.subscribe) if self.subscribe else None,
                                 pattern=self.pattern, assign=self.assign)

    def store(self):
        """A client of the bucket (credentials from this process's AWS chain), shared by this process's reads
        (:func:`~logfs.spark.bucket.reading_store`); the caller closes it (which keeps a shared one open)."""
        return bucket.reading_store(self.data_dir, self.s3_endpoint, self.s3_region)

    def reader(self, tp: TopicPartition, directory: str | None = None, store=None):
        """The partition's reader: of the data directory, or of the bucket through ``store``."""
        if self.from_bucket:
            remote = bucket.BucketPartitionReader(store, bucket.parse_bucket_path(self.data_dir)[1], tp)
            if self.local_data_dir:
                return bucket.TieredPartitionReader(remote, PartitionReader(self.local_data_dir, tp))
            return remote
        return PartitionReader(self.data_dir, tp, directory)

    def bounds(self, *, starting: bool = False) -> dict[TopicPartition, tuple[int, int]]:
        """(log start offset, log end offset) of every selected partition, now (see :meth:`layouts`)."""
        return {tp: layout[:2] for tp, layout in self.layouts(starting=starting).items()}

    def layouts(self, *, starting: bool = False, store=None, readers: dict | None = None
                ) -> dict[TopicPartition, tuple[int, int, list[int]]]:
        """(log start offset, log end offset, segment base offsets) of every selected partition, now (one
        listing or manifest read per partition). As Spark's Kafka source, a
        subscription (list or pattern) to topics that do not exist selects nothing; an assignment of a topic or
        partition that does not exist is an OptionError naming it when a query ``starting`` plans its offsets
        (later, a partition deleted under a running stream just stops growing)."""
        every = self.all_partitions()
        found = select_partitions(every, subscribe=list(self.subscribe) if self.subscribe else None,
                                  pattern=self.pattern, assign=self.assign)
        if starting and self.assign is not None:
            missing = sorted((t, p) for t, parts in self.assign.items() for p in parts
                             if TopicPartition(t, p) not in found)
            if missing:
                topics = {tp.topic for tp in every}
                raise OptionError("option assign: unknown topic or partition " + ", ".join(
                    f"{t}-{p}" if t in topics else f"{t}-{p} (no topic {t!r})" for t, p in missing)
                    + f" in {self.data_dir}")
        own = store is None and self.from_bucket
        if own:
            store = self.store()
        try:
            out = {}
            for tp, path in sorted(found.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
                reader = self.reader(tp, path, store)
                if readers is not None:
                    readers[tp] = reader
                out[tp] = reader.layout()
            return out
        finally:
            if own:
                store.close()


def resolve_offset(spec, tp: TopicPartition, bounds: tuple[int, int], default: int) -> int:
    """One partition's offset from a spec (EARLIEST, LATEST or a per-partition map; a partition the map does
    not name gets ``default``), within [log start, log end] except for an explicit offset below the log
    start, which is returned as is (the reader then reports or skips the lost records)."""
    start, end = bounds
    if spec is None:
        value = default
    elif isinstance(spec, dict):
        value = spec.get(tp, default)
    else:
        value = spec
    if value == EARLIEST:
        return start
    if value == LATEST:
        return end
    return min(value, end)


def resolve_timestamp(reader, tp: TopicPartition, timestamp: int, bounds: tuple[int, int], *, starting: bool,
                      strategy: str = STRATEGY_ERROR) -> int:
    """A timestamp to an offset as Spark's Kafka source resolves it (Kafka's ListOffsets): -2 the log start, -1
    the log end, else the earliest offset whose record timestamp is at or after it (through the time index).
    When no record is that late: the log end for an ending offset; for a starting one, an OptionError
    (``startingOffsetsByTimestampStrategy`` error, the default) or the log end (``latest``)."""
    start, end = bounds
    if timestamp == EARLIEST:
        return start
    if timestamp == LATEST:
        return end
    found = reader.offset_for_timestamp(timestamp, start) if end > start else None
    if found is None:
        if starting and strategy == STRATEGY_ERROR:
            raise OptionError(f"No offset matched from request of topic-partition {tp} and timestamp {timestamp} "
                              "(no record at or after it; option startingOffsetsByTimestampStrategy=latest "
                              "starts at the latest offset instead)")
        return end
    return min(max(found, start), end)


def _by_timestamp_spec(options: SourceOptions, starting: bool):
    """(global timestamp, per-partition timestamps, offsets spec) in force for the starting or ending side."""
    if starting:
        return options.starting_timestamp, options.starting_by_timestamp, options.starting
    return options.ending_timestamp, options.ending_by_timestamp, options.ending


def check_timestamp_partitions(options: SourceOptions, partitions) -> None:
    """As Spark's Kafka source: a per-partition timestamp JSON (when no global timestamp overrides it) must name
    every selected partition."""
    for name, glob, spec in (("startingOffsetsByTimestamp", options.starting_timestamp,
                              options.starting_by_timestamp),
                             ("endingOffsetsByTimestamp", options.ending_timestamp, options.ending_by_timestamp)):
        if glob is None and spec is not None and set(spec) != set(partitions):
            names = lambda tps: ", ".join(sorted(str(tp) for tp in tps)) or "none"  # noqa: E731
            raise OptionError(f"option {name} must name every selected partition (as Spark's Kafka source): "
                              f"specified {names(spec)}; selected {names(partitions)}")


def resolve_side(options: SourceOptions, reader, tp: TopicPartition, bounds: tuple[int, int], *, starting: bool,
                 default: int) -> int:
    """The starting (or ending) offset of one partition, with Spark's precedence: ``startingTimestamp`` over
    ``startingOffsetsByTimestamp`` over ``startingOffsets`` (and the same for ending)."""
    glob, by_ts, spec = _by_timestamp_spec(options, starting)
    if glob is not None:
        return resolve_timestamp(reader, tp, glob, bounds, starting=starting, strategy=options.starting_strategy)
    if by_ts is not None:
        return resolve_timestamp(reader, tp, by_ts[tp], bounds, starting=starting,
                                 strategy=options.starting_strategy)
    return resolve_offset(spec, tp, bounds, default)


def check_data_loss(tp: TopicPartition, requested: int, log_start: int, fail: bool, message: str = "") -> int:
    """A start offset below the log start offset: DataLossError with ``fail``, else the log start."""
    if requested < log_start:
        if fail:
            raise DataLossError((message or f"{tp}: offset {requested} is below the log start offset {log_start} "
                                 "(removed by retention)") + "; set failOnDataLoss=false to go on")
        log.warning("%s", message or f"{tp}: offsets {requested}..{log_start - 1} were removed by retention")
        return log_start
    return requested


def split_ranges(ranges: list[OffsetRange], max_records: int | None, min_partitions: int | None,
                 boundaries: Mapping[tuple[str, int], Sequence[int]] | None = None) -> list[OffsetRange]:
    """Spark's Kafka rule: ranges over ``max_records`` split evenly; then, while there are fewer than
    ``min_partitions``, ranges split in proportion to their size. Empty ranges are dropped.

    With ``boundaries`` (segment base offsets per (topic, partition)), cuts fall on segment boundaries where
    they can: a range splits into runs of whole segments of at most the even share each, and only a segment
    larger than the share is cut inside. So no two input partitions read parts of one segment unless it
    must be split, and a reader of the bucket fetches each segment's bytes once in all. There may then be
    more input partitions than the even split gives (never fewer than it, nor over ``max_records``)."""
    boundaries = boundaries or {}

    def split(r: OffsetRange, parts: int) -> list[OffsetRange]:
        return _split(r, parts, boundaries.get((r.topic, r.partition), ()))

    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        ranges = [part for r in ranges for part in split(r, -(-r.size // max_records))]
    if min_partitions and len(ranges) < min_partitions:
        total = sum(r.size for r in ranges)
        out = []
        for r in ranges:
            parts = max(1, round(r.size / total * min_partitions)) if total else 1
            out += split(r, parts)
        ranges = out
    return ranges


def _split(r: OffsetRange, parts: int, boundaries: Sequence[int] = ()) -> list[OffsetRange]:
    parts = max(1, min(parts, r.size))
    if parts == 1:
        return [r]
    inner = [b for b in boundaries if r.start < b < r.end]
    if inner:
        share = r.size // parts  # (rounded down: never fewer parts than the even split)
        out: list[OffsetRange] = []
        start = r.start  # of the run of whole segments being gathered
        for lo, hi in zip([r.start, *inner], [*inner, r.end]):
            if hi - lo > share:  # a segment over the share: the run so far, then the segment cut evenly
                if lo > start:
                    out.append(OffsetRange(r.topic, r.partition, start, lo))
                out += _split(OffsetRange(r.topic, r.partition, lo, hi), -(-(hi - lo) // share))
                start = hi
            elif hi - start > share:  # the run is full: it ends where this segment starts
                out.append(OffsetRange(r.topic, r.partition, start, lo))
                start = lo
        if r.end > start:
            out.append(OffsetRange(r.topic, r.partition, start, r.end))
        return out
    out = []
    for i in range(parts):
        s = r.start + r.size * i // parts
        e = r.start + r.size * (i + 1) // parts
        if e > s:
            out.append(OffsetRange(r.topic, r.partition, s, e))
    return out


def plan_batch(options: SourceOptions, narrowings: Sequence | None = None) -> list[OffsetRange]:
    """The input partitions of a batch read: the starting offsets (startingTimestamp, startingOffsetsByTimestamp
    or startingOffsets; default earliest) to the ending ones (endingTimestamp, endingOffsetsByTimestamp or
    endingOffsets; default latest) of every selected partition, narrowed by pushed-down filters
    (``narrowings``: the union of what each allows, see :mod:`logfs.spark.pushdown`), split by
    maxRecordsPerPartition / minPartitions on segment boundaries where they can be."""
    ranges = []
    store = options.store() if options.from_bucket else None
    try:
        readers: dict = {}
        layouts = options.layouts(starting=True, store=store, readers=readers)
        check_timestamp_partitions(options, layouts)
        for tp, (first, last, _) in layouts.items():
            reader = readers[tp]
            start = resolve_side(options, reader, tp, (first, last), starting=True, default=EARLIEST)
            end = resolve_side(options, reader, tp, (first, last), starting=False, default=LATEST)
            start = check_data_loss(tp, start, first, options.fail_on_data_loss)
            if narrowings is None:
                ranges.append(OffsetRange(tp.topic, tp.partition, start, max(start, end)))
                continue
            from .pushdown import narrow_union

            for s, e in narrow_union(narrowings, reader, tp, start, max(start, end), (first, last)):
                ranges.append(OffsetRange(tp.topic, tp.partition, s, e))
    finally:
        if store is not None:
            store.close()
    return split_ranges(ranges, options.max_records_per_partition, options.min_partitions,
                        {(tp.topic, tp.partition): layout[2] for tp, layout in layouts.items()})


def starting_offsets(options: SourceOptions) -> PartitionOffsets:
    """A stream's first offsets (startingTimestamp, startingOffsetsByTimestamp or startingOffsets; default
    latest) of every selected partition."""
    store = options.store() if options.from_bucket else None
    try:
        readers: dict = {}
        layouts = options.layouts(starting=True, store=store, readers=readers)
        check_timestamp_partitions(options, layouts)
        out = {}
        for tp, (first, last, _) in layouts.items():
            offset = resolve_side(options, readers[tp], tp, (first, last), starting=True, default=LATEST)
            out[tp] = check_data_loss(tp, offset, first, options.fail_on_data_loss)
        return out
    finally:
        if store is not None:
            store.close()


# -- streaming offsets: Kafka's JSON shape {"topic": {"0": 23}} ------------------------------------------
def offsets_to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets, key=lambda t: (t.topic, t.partition)):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(data: Mapping) -> PartitionOffsets:
    if isinstance(data, str):
        data = json.loads(data)
    return {TopicPartition(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


def rate_limit(start: PartitionOffsets, latest: PartitionOffsets, max_records: int) -> PartitionOffsets:
    """Kafka's maxOffsetsPerTrigger: at most ``max_records`` offsets in all, shared in proportion to what
    each partition has available (a partition's share rounds down, or up when below one)."""
    sizes = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= max_records:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_records * sizes[tp] / total
        step = int(share) if share >= 1 else (1 if sizes[tp] > 0 and share > 0 else 0)
        out[tp] = min(end, begin + step)
    return out

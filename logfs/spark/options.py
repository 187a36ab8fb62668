"""Options of the ``logfs`` Spark source and offset planning (no PySpark here: testable on its own).

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

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

PartitionOffsets = dict[TopicPartition, int]


class OptionError(ValueError):
    """An invalid or missing option of the logfs source."""


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return value == "true"


def _positive_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {raw!r}") from None
    if value < 0:
        raise OptionError(f"option {name} must not be negative, not {raw!r}")
    return value or None  # 0 switches the limit off


def parse_offsets_spec(raw: str | None, name: str) -> int | dict[TopicPartition, int] | None:
    """``earliest`` -> EARLIEST, ``latest`` -> LATEST, Kafka's JSON ``{"topic":{"0":23,"1":-2}}`` -> a map
    (-2 earliest, -1 latest), None when unset."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() == "earliest":
        return EARLIEST
    if text.lower() == "latest":
        return LATEST
    try:
        data = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name} must be earliest, latest or JSON like "
                          f"{{\"topic\":{{\"0\":23}}}}, not {text!r}") from None
    if not isinstance(data, dict):
        raise OptionError(f"option {name}: expected a JSON object of topics, not {text!r}")
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map partitions to offsets")
        for part, offset in parts.items():
            try:
                partition = int(part)
            except ValueError:
                raise OptionError(f"option {name}: {part!r} of topic {topic!r} is not a partition") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -2:
                raise OptionError(f"option {name}: offset {offset!r} of {topic}-{part} is not an offset "
                                  "(-2 earliest, -1 latest, or >= 0)")
            out[TopicPartition(topic, partition)] = offset
    return out


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
        for unsupported in ("startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
                            "endingOffsetsByTimestamp", "kafka.bootstrap.servers"):
            if options.get(unsupported) is not None:
                raise OptionError(f"option {unsupported} is not supported by the logfs source")
        return cls(
            data_dir=str(data_dir),
            subscribe=topics,
            pattern=pattern,
            assign=assign,
            starting=parse_offsets_spec(options.get("startingOffsets"), "startingOffsets"),
            ending=parse_offsets_spec(options.get("endingOffsets"), "endingOffsets"),
            include_headers=_bool(options, "includeHeaders", False),
            max_records_per_partition=_positive_int(options, "maxRecordsPerPartition",
                                                    DEFAULT_MAX_RECORDS_PER_PARTITION),
            min_partitions=_positive_int(options, "minPartitions", None),
            max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger", None),
            fail_on_data_loss=_bool(options, "failOnDataLoss", False),
            s3_endpoint=options.get("s3.endpoint") or None,
            s3_region=options.get("s3.region") or None,
            local_data_dir=options.get("localDataDir") or None,
        )

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
        """A new client of the bucket (credentials from this process's AWS chain); the caller closes it."""
        return bucket.open_store(self.data_dir, self.s3_endpoint, self.s3_region)

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

    def layouts(self, *, starting: bool = False) -> dict[TopicPartition, tuple[int, int, list[int]]]:
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
        store = self.store() if self.from_bucket else None
        try:
            return {tp: self.reader(tp, path, store).layout() for tp, path in sorted(
                found.items(), key=lambda kv: (kv[0].topic, kv[0].partition))}
        finally:
            if store is not None:
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


def plan_batch(options: SourceOptions) -> list[OffsetRange]:
    """The input partitions of a batch read: startingOffsets (default earliest) to endingOffsets (default
    latest) of every selected partition, split by maxRecordsPerPartition / minPartitions on segment
    boundaries where they can be."""
    ranges = []
    layouts = options.layouts(starting=True)
    for tp, (first, last, _) in layouts.items():
        start = resolve_offset(options.starting, tp, (first, last), EARLIEST)
        end = resolve_offset(options.ending, tp, (first, last), LATEST)
        start = check_data_loss(tp, start, first, options.fail_on_data_loss)
        ranges.append(OffsetRange(tp.topic, tp.partition, start, max(start, end)))
    return split_ranges(ranges, options.max_records_per_partition, options.min_partitions,
                        {(tp.topic, tp.partition): layout[2] for tp, layout in layouts.items()})


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

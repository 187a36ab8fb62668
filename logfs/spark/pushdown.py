"""Filters Spark pushes down to the ``logfs`` source (``DataSourceReader.pushFilters``, Spark 4.1+), turned into
offset ranges before the input partitions are planned (no PySpark import at module level: testable on its own).

What narrows the read, per topic-partition (conjuncts only; Spark does not push an ``OR``):

- ``topic``: ``=``, ``IN``, ``STARTSWITH``: partitions of other topics are not read;
- ``partition``: ``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=``;
- ``offset``: the same comparisons cut the offset range (``IN`` by its smallest and largest value);
- ``timestamp``: a lower bound (``>``, ``>=``, ``=``, ``IN`` by its smallest value) starts the range at Kafka's
  ``offsetsForTimes`` of the bound, through the time index. Every record before that offset is older than the
  bound, whatever the order of timestamps in the log: the time index records the largest timestamp so far.
- ``timestamp``: an upper bound (``<``, ``<=``, ``=``, ``IN`` by its largest value; ``BETWEEN`` is both) cuts the
  tail of the range, at segment granularity: a Kafka log's timestamps may go back (another producer's
  CreateTime, a clock stepped back, a batch whose records are out of order), so "the first record after the
  bound" proves nothing about later ones, and Kafka's indexes hold only the largest timestamp so far. What does
  prove it is each segment's SMALLEST record timestamp, which tiering records in the bucket's manifest
  (``min_timestamp``, :mod:`logfs.remote.manifest`): the range ends at the base offset of the first segment of
  the longest run of segments, up to the range's end, whose smallest timestamp is after the bound (a suffix
  minimum over segments). So from the bucket a window in the middle of a log reads about the window's segments.
  Segments without one (tiered by an older logfs, or whose scan failed) end the run; so does the part of the log
  that is only in a DATA_DIR (a local log keeps no smallest timestamps, and finding them would read the segments:
  the very cost the cut saves), so locally, and with ``localDataDir`` for a range reaching past the tiered part,
  an upper bound does not cut. Spark's timestamps are microseconds, the records' milliseconds: a bound becomes
  the largest millisecond at or before it (``_ms_at_or_before``, the twin of ``_ms_at_or_after``).
  ``endingTimestamp`` (Kafka's semantics: the range ends at the first record at or after it) ends a read
  anywhere, locally too.

Every filter is handed back to Spark, which applies it to the rows read: the source only reads less (a cut may
keep records outside the bounds, never drop one inside them). That keeps the rows exact, and it is also what
makes a scan correct when Spark 4.3 runs it with the read plan of another scan of the same DataFrame (below).

Spark 4.3 keeps the read plan that a filter pushdown produced on the DataFrame's relation, not on the scan
(``PythonDataSourceV2.setReadInfo``): every scan of that relation planned afterwards in the same query (a
self-union, a self-join) runs with the LAST pushed-down plan, and a later query over the same DataFrame whose
filters Spark cannot push (or that has none) reuses it too. So that the first case stays exact, the planner
remembers, per relation (the data source instance's id), every narrowing pushed down to it, and plans their
union: the last plan covers every scan of the query, and Spark's own filters (handed back) select each scan's
rows. The record is a small file per relation on the driver's host (the planner runs there, in Python
processes Spark starts and reuses), under the temporary directory, removed after a day. The second case cannot
be seen from Python (no Python code runs when Spark reuses the plan): see the README.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Sequence

log = logging.getLogger(__name__)

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MICROSECOND = datetime.timedelta(microseconds=1)
REGISTRY_TTL_SECONDS = 86_400


@dataclass(frozen=True)
class Narrowing:
    """What one scan's pushed filters allow, as bounds (None: unbounded)."""

    topics: tuple[str, ...] | None = None  # sorted
    topic_prefixes: tuple[str, ...] = ()
    partitions: tuple[int, ...] | None = None  # sorted
    partition_lo: int | None = None  # inclusive
    partition_hi: int | None = None  # inclusive
    offset_lo: int | None = None  # inclusive
    offset_hi: int | None = None  # exclusive
    min_timestamp: int | None = None  # ms, inclusive
    max_timestamp: int | None = None  # ms, inclusive

    @property
    def narrows(self) -> bool:
        return self != Narrowing()

    def selects(self, topic: str, partition: int) -> bool:
        if self.topics is not None and topic not in self.topics:
            return False
        if any(not topic.startswith(p) for p in self.topic_prefixes):
            return False
        if self.partitions is not None and partition not in self.partitions:
            return False
        if self.partition_lo is not None and partition < self.partition_lo:
            return False
        if self.partition_hi is not None and partition > self.partition_hi:
            return False
        return True

    def range_for(self, reader, topic: str, partition: int, start: int, end: int) -> tuple[int, int] | None:
        """The part of offsets [start, end) of one partition that can hold rows passing the filters, or None.
        ``reader`` resolves a lower timestamp bound through the time index (``offset_for_timestamp``) and an
        upper one through the segments' smallest timestamps (``end_for_timestamp_at_most``)."""
        if not self.selects(topic, partition):
            return None
        if self.offset_lo is not None:
            start = max(start, self.offset_lo)
        if self.offset_hi is not None:
            end = min(end, self.offset_hi)
        if start >= end:
            return None
        if self.max_timestamp is not None:  # (first: from the manifest, no request; it may leave nothing)
            end = min(end, reader.end_for_timestamp_at_most(self.max_timestamp, start, end))
            if start >= end:
                return None
        if self.min_timestamp is not None:
            found = reader.offset_for_timestamp(self.min_timestamp, start)
            if found is None:
                return None  # no record that late
            start = max(start, found)
        return (start, end) if start < end else None


def narrow_union(narrowings: Sequence[Narrowing], reader, tp, start: int, end: int,
                 bounds: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Disjoint, ascending offset ranges within [start, end) of partition ``tp`` covering what any of
    ``narrowings`` allows (all of [start, end) when one of them does not narrow)."""
    if start >= end:
        return []
    if not narrowings or any(not n.narrows for n in narrowings):
        return [(start, end)]
    ranges = sorted(r for n in narrowings
                    if (r := n.range_for(reader, tp.topic, tp.partition, start, end)) is not None)
    out: list[list[int]] = []
    for s, e in ranges:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


# -- Spark's filters -> a Narrowing ---------------------------------------------------------------------------
def _ms_at_or_after(value: datetime.datetime, strict: bool) -> int | None:
    """The smallest record timestamp (ms) whose Spark timestamp (us) is >= ``value`` (> with ``strict``)."""
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None  # (a TimestampNTZ literal: not this column's type; never narrow on a guess)
    micros = (value - _EPOCH) // _MICROSECOND
    return micros // 1000 + 1 if strict else -(-micros // 1000)


def _ms_at_or_before(value: datetime.datetime, strict: bool) -> int | None:
    """The largest record timestamp (ms) whose Spark timestamp (us) is <= ``value`` (< with ``strict``)."""
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None  # (as _ms_at_or_after)
    micros = (value - _EPOCH) // _MICROSECOND
    return -(-micros // 1000) - 1 if strict else micros // 1000


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def translate(filters: Iterable) -> Narrowing:
    """The narrowing that Spark's pushed filters (``pyspark.sql.datasource`` Filter objects) allow. Filters on
    other columns, negations and unknown kinds narrow nothing (Spark applies every filter anyway)."""
    from pyspark.sql.datasource import (
        EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual, StringStartsWith,
    )

    topics: set[str] | None = None
    prefixes: list[str] = []
    parts: set[int] | None = None
    p_lo = p_hi = o_lo = o_hi = ts_lo = ts_hi = None

    def lower(cur, v):
        return v if cur is None else max(cur, v)

    def upper(cur, v):
        return v if cur is None else min(cur, v)

    for f in filters:
        attribute = getattr(f, "attribute", None)
        if not isinstance(attribute, tuple) or len(attribute) != 1:
            continue
        column = attribute[0]
        if isinstance(f, (EqualTo, EqualNullSafe)):
            values, kind = [f.value], "eq"
        elif isinstance(f, In):
            values, kind = [v for v in f.value if v is not None], "eq"
            if not values:
                continue
        elif isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
            values, kind = [f.value], type(f).__name__
        elif isinstance(f, StringStartsWith) and column == "topic" and isinstance(f.value, str):
            prefixes.append(f.value)
            continue
        else:
            continue
        if column == "topic" and kind == "eq" and all(isinstance(v, str) for v in values):
            topics = set(values) if topics is None else topics & set(values)
        elif column in ("partition", "offset") and all(_is_int(v) for v in values):
            lo, hi = min(values), max(values)
            if column == "partition":
                if kind == "eq":
                    parts = set(values) if parts is None else parts & set(values)
                elif kind == "GreaterThan":
                    p_lo = lower(p_lo, hi + 1)
                elif kind == "GreaterThanOrEqual":
                    p_lo = lower(p_lo, hi)
                elif kind == "LessThan":
                    p_hi = upper(p_hi, lo - 1)
                else:
                    p_hi = upper(p_hi, lo)
            else:  # offset: [o_lo, o_hi)
                if kind == "eq":
                    o_lo, o_hi = lower(o_lo, lo), upper(o_hi, hi + 1)
                elif kind == "GreaterThan":
                    o_lo = lower(o_lo, hi + 1)
                elif kind == "GreaterThanOrEqual":
                    o_lo = lower(o_lo, hi)
                elif kind == "LessThan":
                    o_hi = upper(o_hi, lo)
                else:
                    o_hi = upper(o_hi, lo + 1)
        elif column == "timestamp":
            if kind in ("eq", "GreaterThan", "GreaterThanOrEqual"):
                bounds = [_ms_at_or_after(v, kind == "GreaterThan") for v in values]
                if all(b is not None for b in bounds):
                    ts_lo = lower(ts_lo, min(bounds))
            if kind in ("eq", "LessThan", "LessThanOrEqual"):
                bounds = [_ms_at_or_before(v, kind == "LessThan") for v in values]
                if all(b is not None for b in bounds):
                    ts_hi = upper(ts_hi, max(bounds))
    return Narrowing(
        topics=tuple(sorted(topics)) if topics is not None else None,
        topic_prefixes=tuple(sorted(set(prefixes))),
        partitions=tuple(sorted(parts)) if parts is not None else None,
        partition_lo=p_lo, partition_hi=p_hi, offset_lo=o_lo, offset_hi=o_hi, min_timestamp=ts_lo,
        max_timestamp=ts_hi)


# -- the per-relation record (Spark 4.3 shares one read plan between the scans of a relation) ----------------
_FIELDS = frozenset(f.name for f in fields(Narrowing))


def registry_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"logfs-spark-{os.getuid()}", "pushdown")


def _to_json(n: Narrowing) -> str:
    return json.dumps(asdict(n), sort_keys=True)


def _from_json(line: str) -> Narrowing:
    d = json.loads(line)
    d = {k: v for k, v in d.items() if k in _FIELDS}  # (a record of another logfs version: what both know)
    for k in ("topics", "topic_prefixes", "partitions"):
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    return Narrowing(**d)


def remember(relation: str, narrowing: Narrowing, directory: str | None = None) -> list[Narrowing]:
    """Record ``narrowing`` as pushed down to the relation ``relation`` and return every narrowing recorded
    for it (this one included), in the order they came."""
    directory = directory or registry_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, relation + ".jsonl")
    line = _to_json(narrowing)
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        lines = [x for x in f.read().splitlines() if x]
        if line not in lines:
            f.write(line + "\n")
            lines.append(line)
    _prune(directory)
    return [_from_json(x) for x in lines]


def _prune(directory: str) -> None:
    horizon = time.time() - REGISTRY_TTL_SECONDS
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                try:
                    if e.name.endswith(".jsonl") and e.stat().st_mtime < horizon:
                        os.unlink(e.path)
                except OSError:
                    pass
    except OSError:
        pass

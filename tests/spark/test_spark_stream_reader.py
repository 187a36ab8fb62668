"""The streaming reader's offset logic, driven directly (no SparkSession): initial offsets, new partitions,
read limits, Trigger.AvailableNow, a partition whose log end went backwards."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from logfs.spark.datasource import LogfsDataSource, read_range  # noqa: E402
from logfs.spark.segments import DataLossError  # noqa: E402
from logfs.storage import ManualClock  # noqa: E402


@pytest.fixture
def m(open_manager):
    manager = open_manager({"num.partitions": "2", "log.segment.bytes": "4096"}, clock=ManualClock())
    manager.create_topic("s")
    return manager


def put(m, topic, partition, n):
    log = m.get_log(topic, partition)
    start = log.log_end_offset
    log.append([f"{topic}-{partition}-{start + i}".encode() for i in range(n)])


def reader(m, **options):
    source = LogfsDataSource({"path": m.data_dir, **options})
    return source.streamReader(source.schema())


def values(m, stream, start, end):
    out = []
    for part in stream.partitions(start, end):
        for batch in read_range(stream.options, part.range, stream.schema):
            out += [v.decode() for v in batch.column("value").to_pylist()]
    return sorted(out)


def test_offsets_new_partitions_and_limits(m):
    put(m, "s", 0, 5)
    put(m, "s", 1, 3)
    latest = reader(m, subscribe="s")
    assert latest.initialOffset() == {"s": {"0": 5, "1": 3}}
    stream = reader(m, subscribePattern="s|t", startingOffsets="earliest")
    start = stream.initialOffset()
    assert start == {"s": {"0": 0, "1": 0}}
    put(m, "s", 0, 100)
    m.create_topic("t", 1)  # a new topic matching the pattern: read from its earliest offset
    put(m, "t", 0, 4)
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"s": {"0": 105, "1": 3}, "t": {"0": 4}}
    assert len(values(m, stream, start, end)) == 112
    assert stream.latestOffset(end, ReadAllAvailable()) == end  # nothing new
    # maxOffsetsPerTrigger: the default read limit, shared in proportion.
    capped = reader(m, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="20")
    limit = capped.getDefaultReadLimit()
    assert limit == ReadMaxRows(20)
    first = capped.latestOffset(capped.initialOffset(), limit)
    assert sum(first["s"].values()) <= 20 and first["s"]["0"] > first["s"]["1"] >= 0
    assert values(m, capped, capped.initialOffset(), first) == sorted(
        [f"s-0-{i}" for i in range(first["s"]["0"])] + [f"s-1-{i}" for i in range(first["s"]["1"])])


def test_available_now_stops_at_the_target(m):
    put(m, "s", 0, 10)
    stream = reader(m, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="4")
    stream.prepareForTriggerAvailableNow()
    put(m, "s", 0, 10)  # after the target: not read by this run
    offset, seen = stream.initialOffset(), 0
    for _ in range(10):
        nxt = stream.latestOffset(offset, stream.getDefaultReadLimit())
        if nxt == offset:
            break
        seen += len(values(m, stream, offset, nxt))
        offset = nxt
    assert offset == {"s": {"0": 10, "1": 0}} and seen == 10


def test_a_partition_whose_end_went_back(m):
    put(m, "s", 0, 10)
    stream = reader(m, subscribe="s", startingOffsets="earliest")
    start = stream.latestOffset(stream.initialOffset(), ReadAllAvailable())
    m.delete_partition("s", 1)
    m.delete_partition("s", 0)
    m.create_partition("s", 0)
    put(m, "s", 0, 3)
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"s": {"0": 3, "1": 0}}
    assert stream.partitions(start, end) == []  # reported and skipped, as the Kafka source does
    with pytest.raises(DataLossError, match="went back from 10 to 3"):
        reader(m, subscribe="s", failOnDataLoss="true").partitions(start, end)
    assert stream.latestOffset(end, ReadAllAvailable()) == end


def test_unknown_topics_stream_nothing_and_an_unknown_assignment_is_named(m):
    """A subscription to topics that do not exist streams nothing (Spark runs a plan without input partitions
    as one task over a bare InputPartition(None), which reads nothing); an assignment of one is an error naming
    it when the stream starts."""
    from pyspark.sql.datasource import InputPartition

    from logfs.spark.options import OptionError

    for options in ({"subscribe": "nosuch"}, {"subscribePattern": "nosuch.*"}):
        stream = reader(m, startingOffsets="earliest", **options)
        start = stream.initialOffset()
        assert start == {}
        end = stream.latestOffset(start, ReadAllAvailable())
        assert end == {} and stream.partitions(start, end) == []
        assert list(stream.read(InputPartition(None))) == []
    with pytest.raises(OptionError, match=r"nosuch-0 \(no topic 'nosuch'\)"):
        reader(m, assign='{"nosuch":[0]}').initialOffset()
    with pytest.raises(OptionError, match=r"s-2 in "):
        reader(m, assign='{"s":[0,2]}').initialOffset()
    batch = LogfsDataSource({"path": m.data_dir, "subscribe": "nosuch"})
    batch_reader = batch.reader(batch.schema())
    assert batch_reader.partitions() == [] and list(batch_reader.read(InputPartition(None))) == []

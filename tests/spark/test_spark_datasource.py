"""``spark.read.format("logfs")``: the records of DATA_DIR's segments with Spark's Kafka source schema.

Cross-checked three ways: the mount's view (``cat``) and its xattrs (``user.logfs.position.<offset>``,
``user.logfs.time.<ms>``, ``log_end_offset``) for a live mount, and kafka-python's independent v2 parser
(``DefaultRecordBatch``) over the very ``.log`` files.
"""

from __future__ import annotations

import glob
import gzip  # noqa: F401  (kafka-python's gzip codec)
import os
import time

import pytest

pytest.importorskip("pyspark")
from kafka.record.default_records import DefaultRecordBatchBuilder
from pyspark.sql import functions as F

from logfs.spark.datasource import source_schema
from logfs.storage import ManualClock
from harness import wait_for
from log_helpers import log_file_records



def columns():
    return ["partition", "offset", "key", "value", F.expr("unix_millis(timestamp)").alias("ts"), "timestampType",
            "topic"]


def kafka_python_records(partition_dir: str) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record in the partition's .log files, parsed by
    kafka-python; every batch's CRC is checked."""
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in log_file_records(partition_dir)]


def collect(df) -> list:
    return sorted(df.select(*columns()).collect(), key=lambda r: (r.topic, r.partition, r.offset))


@pytest.mark.mount
def test_logfs_source_equals_the_mount_its_xattrs_and_kafka_python(spark, mount_logfs):
    fs = mount_logfs("num.partitions=3", "log.segment.bytes=4096", "log.index.interval.bytes=512")
    os.mkdir(fs.path("orders"))
    os.setxattr(fs.path("orders"), "user.logfs.config.logfs.key.separator", b"=")
    expected = {p: [] for p in range(3)}
    for round_ in range(12):  # appends a few ms apart: several timestamps, batches and segments
        for p in range(3):
            lines = []
            for i in range(25 + p * 10):
                n = len(expected[p])
                line = f"cust{n % 7}=order-{p}-{n}-{'z' * (n % 40)}" if n % 4 else f"unkeyed-{p}-{n}"
                lines.append(line)
                expected[p].append(line)
            fs.append(f"orders/{p}", "".join(x + "\n" for x in lines))
        time.sleep(0.004)

    df = (spark.read.format("logfs").option("subscribe", "orders").option("maxRecordsPerPartition", "100")
          .load(str(fs.data)))
    assert df.schema == source_schema(False)
    assert df.rdd.getNumPartitions() >= sum(len(v) for v in expected.values()) // 100
    rows = collect(df)
    assert len(rows) == sum(len(v) for v in expected.values())
    for p in range(3):
        mine = [r for r in rows if r.partition == p]
        assert all(r.topic == "orders" and r.timestampType == 0 for r in mine)
        # Offsets: 0 .. log_end_offset - 1, as the mount's xattr says.
        assert [r.offset for r in mine] == list(range(int(fs.getx(f"orders/{p}", "log_end_offset"))))
        # Keys and values: what was appended, and what cat shows.
        view = fs.read(f"orders/{p}")
        rendered = [((r.key + b"=") if r.key is not None else b"") + r.value for r in mine]
        assert rendered == [x.encode() for x in expected[p]] == view.splitlines()
        assert [r.key is not None for r in mine] == ["=" in x for x in expected[p]]
        # Each record's line starts at user.logfs.position.<offset>.
        for r, line in zip(mine, rendered):
            pos = int(fs.getx(f"orders/{p}", f"position.{r.offset}"))
            assert view[pos:pos + len(line) + 1] == line + b"\n"
        # Timestamps: user.logfs.time.<ms> is the first offset with a timestamp >= ms.
        stamps = [r.ts for r in mine]
        assert len(set(stamps)) >= 3
        for ts in sorted(set(stamps)):
            first = min(r.offset for r in mine if r.ts >= ts)
            assert int(fs.getx(f"orders/{p}", f"time.{ts}")) == first
            if ts + 1 <= max(stamps):
                assert int(fs.getx(f"orders/{p}", f"time.{ts + 1}")) == min(
                    r.offset for r in mine if r.ts >= ts + 1)
        # kafka-python, parsing the .log files independently, sees the same records.
        parsed = kafka_python_records(os.path.join(fs.data, f"orders-{p}"))
        assert parsed == [(r.offset, r.ts, r.key, r.value, ()) for r in mine]
    assert len(glob.glob(os.path.join(fs.data, "orders-0", "*.log"))) > 2


@pytest.fixture
def engine_dir(open_manager):
    """A DATA_DIR written by the engine (no mount): topics ``a`` (2 partitions, keys, headers, tombstones)
    and ``b``; the LogManager stays open (holding .lock) while Spark reads."""
    m = open_manager({"num.partitions": "2", "log.segment.bytes": "2048", "log.index.interval.bytes": "256",
                      "log.segment.delete.delay.ms": "0"}, clock=ManualClock())
    m.create_topic("a")
    m.create_topic("b")
    for p in range(2):
        for i in range(0, 300, 10):
            values = [None if (i + j) % 17 == 0 else f"a{p}-{i + j}".encode() for j in range(10)]
            keys = [f"k{(i + j) % 5}".encode() for j in range(10)]
            headers = [[("n", str(i + j).encode()), ("empty", None)] if (i + j) % 2 else [] for j in range(10)]
            m.get_log("a", p).append(values, keys, headers=headers)
            m.clock.advance(3)
    m.get_log("b", 0).append([b"b-0", b"b-1"])
    return m


def test_headers_keys_tombstones_and_kafka_python(spark, engine_dir):
    m = engine_dir
    df = spark.read.format("logfs").option("subscribe", "a").option("includeHeaders", "true").load(m.data_dir)
    assert df.schema == source_schema(True)
    rows = sorted(df.select("partition", "offset", "key", "value", F.expr("unix_millis(timestamp)").alias("ts"),
                            "headers").collect(), key=lambda r: (r.partition, r.offset))
    for p in range(2):
        mine = [(r.offset, r.ts, r.key, r.value, tuple((h.key, h.value) for h in r.headers))
                for r in rows if r.partition == p]
        assert mine == kafka_python_records(os.path.join(m.data_dir, f"a-{p}"))
        assert len(mine) == 300 and sum(1 for x in mine if x[3] is None) == len([i for i in range(300) if i % 17 == 0])


def test_offsets_patterns_and_splits(spark, engine_dir):
    m = engine_dir

    def offsets(**options):
        reader = spark.read.format("logfs")
        for k, v in options.items():
            reader = reader.option(k, v)
        df = reader.load(m.data_dir)
        return df, sorted((r.topic, r.partition, r.offset) for r in df.select("topic", "partition", "offset").collect())

    _, got = offsets(subscribePattern="[ab]", startingOffsets='{"a":{"0":295,"1":-2}}',
                     endingOffsets='{"a":{"1":3},"b":{"0":-1}}')
    assert got == [("a", 0, o) for o in range(295, 300)] + [("a", 1, o) for o in range(3)] + [("b", 0, 0), ("b", 0, 1)]
    df, got = offsets(subscribe="a", minPartitions="9", maxRecordsPerPartition="50")
    assert df.rdd.getNumPartitions() >= 12
    assert got == [("a", p, o) for p in range(2) for o in range(300)]
    # Retention removed the first segments of a-0: earliest starts after them; asking for offset 0 fails with
    # failOnDataLoss=true and starts at the log start without it.
    log = m.get_log("a", 0)
    log.delete_segments(log.segments.as_list()[:2])
    start = log.log_start_offset
    assert start > 0
    _, got = offsets(assign='{"a":[0]}')
    assert got[0] == ("a", 0, start) and len(got) == 300 - start
    _, got = offsets(assign='{"a":[0]}', startingOffsets='{"a":{"0":0}}')
    assert got[0] == ("a", 0, start)
    with pytest.raises(Exception, match="DataLossError|below the log start"):
        offsets(assign='{"a":[0]}', startingOffsets='{"a":{"0":0}}', failOnDataLoss="true")


def test_unknown_topics(spark, engine_dir):
    """Regression: an unknown topic failed in a Python worker with AttributeError ('InputPartition' object has
    no attribute 'range'). As Spark's Kafka source: subscribe and subscribePattern read nothing; assign is an
    error naming the topic."""
    m = engine_dir
    for option, value in (("subscribe", "nosuch"), ("subscribePattern", "nosuch.*")):
        df = spark.read.format("logfs").option(option, value).load(m.data_dir)
        assert df.count() == 0 and df.collect() == []
    with pytest.raises(Exception, match=r"unknown topic or partition nosuch-0 \(no topic 'nosuch'\)") as caught:
        spark.read.format("logfs").option("assign", '{"nosuch":[0]}').load(m.data_dir).collect()
    assert "AttributeError" not in str(caught.value)


def test_segments_of_a_foreign_kafka_writer_with_compression(spark, tmp_path):
    """Plain .log files without indexes, gzip-compressed, as another Kafka v2 writer leaves them."""
    data = tmp_path / "foreign"
    part = data / "ext-0"
    part.mkdir(parents=True)
    expected = []
    blob = b""
    offset = 0
    for b in range(5):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(20):
            key, value, ts = f"k{i}".encode(), f"v{b}-{i}".encode() * 3, 1_700_000_000_000 + b * 100 + i
            builder.append(i, timestamp=ts, key=key, value=value, headers=[("src", b"kp")])
            expected.append((offset + i, ts, key, value))
        batch = bytearray(builder.build())
        batch[0:8] = offset.to_bytes(8, "big")
        blob += bytes(batch)
        offset += 20
    (part / "00000000000000000000.log").write_bytes(blob)
    rows = collect(spark.read.format("logfs").option("subscribe", "ext").load(str(data)))
    assert [(r.offset, r.ts, r.key, r.value) for r in rows] == expected
    assert not any(p.name.endswith(".index") for p in part.iterdir())  # nothing was written


def _batch(offset: int, records, *, compression: int = 0, log_append_time: int | None = None) -> bytes:
    """A v2 batch from kafka-python's builder: (key, value, timestamp) per record."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (key, value, ts) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=[("h", b"x")] if i % 3 == 0 else [])
    batch = bytearray(builder.build())
    batch[0:8] = offset.to_bytes(8, "big")
    if log_append_time is not None:  # LogAppendTime: attributes bit 3, maxTimestamp is every record's time
        import crc32c

        batch[22] |= 0x08
        batch[35:43] = log_append_time.to_bytes(8, "big")
        batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


def test_arrow_columns_from_c_equal_the_per_record_path(engine_dir, monkeypatch):
    """The executor-side decoder: runs of uncompressed batches go to Arrow through one C call
    (_speedups.decode_columns); the per-record path (compressed batches, headers, no accelerator) must give
    the very same table: keys, tombstones, timestamps of both types, and ranges that start and end inside
    batches, over batches from logfs, a gzip batch and a LogAppendTime batch in between."""
    from logfs.spark import datasource as ds
    from logfs.spark.options import OffsetRange, SourceOptions

    m = engine_dir
    b = m.get_log("b", 0)
    for compression, lat in ((1, None), (0, 1_800_000_000_123), (0, None)):
        base = b.log_end_offset
        records = [(None if i % 4 == 0 else b"k%d" % i, None if i % 5 == 0 else b"v%d" % i * (i % 7),
                    1_700_000_000_000 + i) for i in range(23)]
        b.append_raw_batch(_batch(base, records, compression=compression, log_append_time=lat))
    b.append([b"tail-%d" % i for i in range(40)])
    opts = SourceOptions(data_dir=m.data_dir, subscribe=("a", "b"))
    assert ds._speedups is not None

    def table(topic, partition, start, end, schema=ds.KAFKA_SCHEMA):
        return pa.Table.from_batches(list(ds.read_range(opts, OffsetRange(topic, partition, start, end), schema)),
                                     schema=ds.to_arrow_schema(schema, timezone="UTC"))

    import pyarrow as pa

    checked = 0
    for topic, partition, start, end in [("a", 0, 0, 300), ("a", 1, 7, 293), ("a", 1, 55, 56), ("b", 0, 0, 200),
                                         ("b", 0, 1, 30), ("b", 0, 30, 70), ("b", 0, 70, 200)]:
        fast = table(topic, partition, start, end)
        monkeypatch.setattr(ds, "_speedups", None)
        slow = table(topic, partition, start, end)
        monkeypatch.undo()
        assert fast.equals(slow), (topic, partition, start, end)
        assert fast.column("offset").to_pylist() == sorted(fast.column("offset").to_pylist())
        checked += fast.num_rows
    types = set(table("b", 0, 0, 200).column("timestampType").to_pylist())
    assert types == {0, 1} and checked > 800
    # With headers asked for, every record takes the per-record path: the same rows otherwise.
    with_headers = table("b", 0, 0, 200, ds.source_schema(True))
    assert with_headers.drop(["headers"]).equals(table("b", 0, 0, 200))


@pytest.mark.mount
def test_writer_headers_reach_the_source_through_a_mount(spark, mount_logfs):
    """logfs.writer.headers: records appended through the mount carry the writer's pid, uid and command name,
    which the source returns with includeHeaders (as kafka-python parses them); the text view does not show them."""
    fs = mount_logfs()
    os.mkdir(fs.path("w"))
    os.setxattr(fs.path("w"), "user.logfs.config.logfs.writer.headers", b"true")
    fs.append("w/0", b"first\nsecond\n")
    with open("/proc/self/comm", "rb") as f:
        comm = f.read().rstrip(b"\n")
    expected = (("logfs.pid", str(os.getpid()).encode()), ("logfs.uid", str(os.getuid()).encode()),
                ("logfs.comm", comm))
    assert fs.read("w/0") == b"first\nsecond\n"
    df = spark.read.format("logfs").option("subscribe", "w").option("includeHeaders", "true").load(str(fs.data))
    rows = sorted(df.select("offset", "value", "headers").collect(), key=lambda r: r.offset)
    assert [(r.value, tuple((h.key, h.value) for h in r.headers)) for r in rows] == [
        (b"first", expected), (b"second", expected)]
    mine = [(r.offset, r.value, tuple((h.key, bytes(h.value)) for h in r.headers)) for r in rows]
    assert mine == [(o, v, h) for o, _, _, v, h in kafka_python_records(os.path.join(fs.data, "w-0"))]
    plain = spark.read.format("logfs").option("subscribe", "w").load(str(fs.data))
    assert "headers" not in plain.columns and [r.value for r in plain.orderBy("offset").collect()] == [b"first",
                                                                                                          b"second"]


@pytest.mark.mount
def test_the_source_reads_several_log_directories(spark, mount_logfs):
    """``path`` names the log directories as the daemon takes them (``DIR1,DIR2``): each partition is read from the
    one that holds it, a moved one included, with its log start offset from that directory's checkpoint."""
    dirs: list[str] = []

    def prepare(m):
        dirs.extend(str(m.root / f"disk{i}") for i in (1, 2))
        m.source = ",".join(dirs)

    fs = mount_logfs("num.partitions=3", "log.segment.bytes=4096", prepare=prepare)
    os.mkdir(fs.path("t"))
    for p in range(3):
        fs.append(f"t/{p}", "".join(f"{p}-{i}\n" for i in range(300)))
    os.setxattr(fs.path("t", 2), "user.logfs.log_start_offset", b"100")  # DeleteRecords, in disk1's checkpoint
    os.setxattr(fs.path("t", 0), "user.logfs.log_dir", dirs[1].encode())  # moved: disk2 holds 0 and 1
    wait_for(lambda: os.getxattr(fs.path("t", 0), "user.logfs.log_dir").decode() == dirs[1], 60,
             what="the move (it runs in the background)")
    assert [os.getxattr(fs.path("t", p), "user.logfs.log_dir").decode() for p in range(3)] == \
        [dirs[1], dirs[1], dirs[0]]
    rows = collect(spark.read.format("logfs").option("subscribe", "t").load(",".join(dirs)))
    for p in range(3):
        first = 100 if p == 2 else 0
        assert [(r.offset, bytes(r.value).decode()) for r in rows if r.partition == p] == \
            [(i, f"{p}-{i}") for i in range(first, 300)]

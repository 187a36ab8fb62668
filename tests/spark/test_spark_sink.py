"""``df.write.format("logfs")`` on the suite's local SparkSession: rows become records where a Kafka producer would
put them, with their keys, values and headers (read back by kafka-python from the segments); every refusal of the
contract is raised in the driver before anything is appended; a failed job appends nothing and leaves nothing
staged."""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest

pytest.importorskip("pyspark")
from kafka.partitioner.default import murmur2 as kafka_murmur2
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType

pytestmark = pytest.mark.mount

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def kafka_python_records(data_dir, topic: str, partition: int) -> list[tuple]:
    """(offset, timestamp, key, value, headers, producer id) of every record of one partition, parsed by
    kafka-python from the .log files; every batch's CRC checked, no trailing bytes."""
    out = []
    for path in sorted(glob.glob(os.path.join(str(data_dir), f"{topic}-{partition}", "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        records, consumed = MemoryRecords(data), 0
        while records.has_next():
            batch = records.next_batch()
            assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
            consumed += batch.size_in_bytes
            for r in batch:
                out.append((r.offset, r.timestamp, r.key, r.value, tuple(r.headers), batch.producer_id))
        assert consumed == len(data)
    return out


def staged(fs) -> list[str]:
    return sorted(os.listdir(fs.path(".logfs-staging")))


def write(df, fs, **options):
    writer = df.write.format("logfs").mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save(str(fs.mnt))


def test_rows_land_where_a_kafka_producer_puts_them(spark, mount_logfs):
    fs = mount_logfs("num.partitions=3")
    os.mkdir(fs.path("out"))
    n = 5000
    df = spark.range(n).repartition(4).select(
        F.when(F.col("id") % 7 == 0, F.lit(None)).otherwise(F.concat(F.lit("user-"), (F.col("id") % 97)
                                                                     .cast("string"))).alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string"), F.when(F.col("id") % 5 == 0, F.lit("\nsecond line"))
                 .otherwise(F.lit(""))).cast("binary").alias("value"),
        F.when(F.col("id") % 11 == 3, F.lit(1)).otherwise(F.lit(None).cast("int")).alias("partition"))
    before = int(time.time() * 1000)
    write(df, fs, topic="out")
    after = int(time.time() * 1000)
    want = {}
    for i in range(n):
        key = None if i % 7 == 0 else f"user-{i % 97}".encode()
        value = f"v{i}".encode() + (b"\nsecond line" if i % 5 == 0 else b"")
        want[value] = key, 1 if i % 11 == 3 else None
    seen = {}
    counts = []
    for p in range(3):
        records = kafka_python_records(fs.data, "out", p)
        counts.append(len(records))
        assert [r[0] for r in records] == list(range(len(records)))
        assert all(before <= r[1] <= after for r in records)  # the append time
        assert len({r[5] for r in records}) == 1 and records[0][5] >= 0  # one commit: one producer id
        for _, _, key, value, _, _ in records:
            assert value not in seen
            seen[value] = (key, p)
            wkey, wpart = want[value]
            assert key == wkey
            if wpart is not None:
                assert p == wpart
            elif key is not None:
                assert p == (kafka_murmur2(key) & 0x7FFFFFFF) % 3  # Kafka's default partitioner
    assert set(seen) == set(want)
    null_keys = [p for value, (key, p) in seen.items() if key is None and want[value][1] is None]
    assert {null_keys.count(p) for p in range(3)} and min(null_keys.count(p) for p in range(3)) > 100  # spread
    assert staged(fs) == []
    assert [int(fs.getx("out/%d" % p, "log_end_offset")) for p in range(3)] == counts
    # A value holding "\n" spans two lines of the text view, as from any Kafka producer.
    assert fs.read("out/1").decode().count("\nsecond line\n") == sum(
        1 for v, (k, p) in seen.items() if p == 1 and v.endswith(b"second line"))


def test_the_sink_writes_into_every_log_directory(spark, mount_logfs, tmp_path):
    """CONTRACT section 12: a topic whose partitions are placed in two log directories takes a sink's commit in
    both, each partition's records in its own directory (kafka-python reads them there)."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()

    def prepare(m):
        m.source = f"{d1},{d2}"

    fs = mount_logfs("num.partitions=2", prepare=prepare)
    os.mkdir(fs.path("out"))
    dirs = {p: os.getxattr(fs.path("out", p), "user.logfs.log_dir").decode() for p in range(2)}
    assert sorted(dirs.values()) == sorted([str(d1), str(d2)])  # placement: one partition in each
    df = spark.range(1000).repartition(3).select(
        F.concat(F.lit("v"), F.col("id").cast("string")).cast("binary").alias("value"),
        (F.col("id") % 2).cast("int").alias("partition"))
    write(df, fs, topic="out")
    for p in range(2):
        want = sorted(b"v%d" % i for i in range(p, 1000, 2))
        records = kafka_python_records(dirs[p], "out", p)
        assert [r[0] for r in records] == list(range(500))
        assert sorted(r[3] for r in records) == want
        assert sorted(fs.read(f"out/{p}").split()) == want
    assert staged(fs) == []


def test_topic_column_headers_and_the_topic_option_winning(spark, mount_logfs):
    fs = mount_logfs("num.partitions=2")
    for t in ("a", "b", "c"):
        os.mkdir(fs.path(t))
    rows = [("a", "k1", "one", [("h", b"1"), ("h2", None)], 0), ("b", None, "two", None, None),
            ("a", "k2", "three", [], 1), ("b", "k3", None, [("x", b"\x00\xff")], None)]
    schema = StructType([StructField("topic", StringType()), StructField("key", StringType()),
                         StructField("value", StringType()), StructField("headers", HEADERS),
                         StructField("partition", IntegerType())])
    df = spark.createDataFrame(rows, schema)
    write(df, fs)
    got = {t: sorted(((r[2], r[3], r[4]) for p in range(2) for r in kafka_python_records(fs.data, t, p)), key=repr)
           for t in ("a", "b")}
    assert got["a"] == [(b"k1", b"one", (("h", b"1"), ("h2", None))), (b"k2", b"three", ())]
    assert got["b"] == sorted([(None, b"two", ()), (b"k3", None, (("x", b"\x00\xff"),))], key=repr)  # a null value: a tombstone
    assert [r[3] for r in kafka_python_records(fs.data, "a", 0)] == [b"one"]
    # The topic option wins over the column.
    write(df, fs, topic="c")
    assert sum(len(kafka_python_records(fs.data, "c", p)) for p in range(2)) == 4


def _refused(spark, fs, case):
    """A write of case ``case``; returns the exception it raised."""
    ints = spark.range(10).select(F.col("id").cast("string").alias("value"))
    options = {"topic": "out"}
    df, path, mode = ints, str(fs.mnt), "append"
    if case == "other column":
        df = ints.withColumn("extra", F.lit(1))
    elif case == "no value":
        df = ints.withColumnRenamed("value", "key")
    elif case == "value type":
        df = spark.range(10).withColumnRenamed("id", "value")
    elif case == "key type":
        df = ints.withColumn("key", F.lit(1.5))
    elif case == "partition type":
        df = ints.withColumn("partition", F.lit(1).cast(LongType()))
    elif case == "headers type":
        df = ints.withColumn("headers", F.array(F.struct(F.lit("k").alias("key"), F.lit("v").alias("value"))))
    elif case == "unknown topic":
        options = {"topic": "nope"}
    elif case == "unknown topic in a row":
        options = {}
        df = ints.withColumn("topic", F.when(F.col("value") == "7", "nope").otherwise("out"))
    elif case == "no topic":
        options = {}
    elif case == "unknown partition":
        df = ints.withColumn("partition", F.when(F.col("value") == "9", 5).otherwise(0))
    elif case == "too large":
        df = ints.withColumn("value", F.when(F.col("value") == "3", F.repeat(F.lit("x"), 2000)).otherwise("v"))
    elif case == "keyless on a compacted topic":
        options = {"topic": "kv"}
        df = ints.withColumn("key", F.when(F.col("value") == "8", None).otherwise(F.col("value")))
    elif case == "overwrite":
        mode = "overwrite"
    elif case == "not a mount":
        path = str(fs.root / "plain")
        os.makedirs(path, exist_ok=True)
    elif case == "data dir":
        path = str(fs.data)
    elif case == "topic directory":
        path = fs.path("out")
    writer = df.repartition(3).write.format("logfs").mode(mode)
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception) as info:
        writer.save(path)
    return info.value


CASES = {
    "other column": "unexpected column(s): extra",
    "no value": "needs a column 'value'",
    "value type": "column 'value' must be string or binary, not bigint",
    "key type": "column 'key' must be string or binary, not double",
    "partition type": "column 'partition' must be int, not bigint",
    "headers type": "column 'headers' must be array<struct<key: string, value: binary>>",
    "unknown topic": "unknown topic 'nope'",
    "unknown topic in a row": "unknown topic 'nope'",
    "no topic": "no topic: set option 'topic' or give a column 'topic'",
    "unknown partition": "topic 'out' has no partition 5",
    "too large": "a record of 2000 bytes (key + value + headers) for topic 'out' exceeds max.message.bytes=1000",
    "keyless on a compacted topic": "topic 'kv' is compacted",
    "overwrite": "the logfs sink only appends: mode('overwrite')",
    "not a mount": "is not the root of a logfs mount",
    "data dir": "is not the root of a logfs mount",
    "topic directory": "is not the root of a logfs mount",
}


@pytest.fixture(scope="module")
def refusing_mount(tmp_path_factory):
    """One mount for every refusal (they append nothing): topics ``out`` (3 partitions, max.message.bytes=1000)
    and ``kv`` (compacted)."""
    from harness import fuse_unusable_reason, mount_factory

    reason = fuse_unusable_reason()
    if reason:
        pytest.skip(reason)
    with mount_factory(tmp_path_factory.mktemp("refusals")) as make:
        fs = make("num.partitions=3", "message.max.bytes=1000")
        os.mkdir(fs.path("out"))
        os.mkdir(fs.path("kv"))
        os.setxattr(fs.path("kv"), "user.logfs.config.cleanup.policy", b"compact")
        yield fs


@pytest.mark.parametrize("case", list(CASES))
def test_every_refusal_is_raised_in_the_driver_before_anything_is_appended(spark, refusing_mount, case):
    fs = refusing_mount
    error = _refused(spark, fs, case)
    assert CASES[case] in str(error)
    for topic in ("out", "kv"):
        for p in range(3):
            assert fs.getx(f"{topic}/{p}", "log_end_offset") == "0"
    assert staged(fs) == []


def test_a_failed_job_appends_nothing_and_leaves_nothing_staged(spark, mount_logfs):
    fs = mount_logfs("num.partitions=2")
    os.mkdir(fs.path("out"))

    seen = {"rows": 0}

    @F.udf("string")
    def fail_late(value):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 3:
            seen["rows"] += 1
            if seen["rows"] > 30_000:
                raise RuntimeError("a task that fails half way through")
        return value

    df = spark.range(200_000, numPartitions=4).select(fail_late(F.col("id").cast("string")).alias("value"))
    observed = set()
    done = threading.Event()

    def watch():  # what the staging directory held while the job ran
        while not done.is_set():
            observed.update(staged(fs))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(Exception, match="fails half way through"):
            write(df, fs, topic="out")
    finally:
        done.set()
        watcher.join()
    assert observed  # the tasks that succeeded had staged their rows
    deadline = time.monotonic() + 10  # (the job's other tasks are cancelled, not awaited, when it fails)
    while staged(fs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert staged(fs) == []
    assert [fs.getx(f"out/{p}", "log_end_offset") for p in range(2)] == ["0", "0"]


def test_staging_in_a_directory_the_driver_copies_from(spark, mount_logfs, tmp_path):
    """Option staging=DIR (executors that cannot see the mount, a shared filesystem): the tasks stage there, the
    driver copies the winning attempts' files into the mount and commits, and removes the write's files."""
    fs = mount_logfs("num.partitions=2")
    os.mkdir(fs.path("out"))
    staging_dir = tmp_path / "shared"
    staging_dir.mkdir()
    # What an earlier write left (a driver that died, an attempt that finished after its write's cleanup): staged
    # files untouched for over a day are removed when a write plans; younger ones and other files are not.
    two_days_ago = time.time() - 2 * 86_400
    left = {"old": f"j-{'a' * 32}.0.0.5.{'b' * 12}", "young": f"j-{'c' * 32}.1.0.6.{'d' * 12}",
            "other": "notes.txt"}
    for kind, name in left.items():
        (staging_dir / name).write_bytes(b"x")
        if kind != "young":
            os.utime(staging_dir / name, (two_days_ago, two_days_ago))
    df = spark.range(3000, numPartitions=3).select(F.col("id").cast("string").alias("value"))
    observed = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            observed.update(os.listdir(staging_dir))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        write(df, fs, topic="out", staging=str(staging_dir))
    finally:
        done.set()
        watcher.join()
    observed -= set(left.values())
    assert observed and all(name.startswith("j-") for name in observed)  # the tasks staged there
    values = sorted(int(r[3]) for p in range(2) for r in kafka_python_records(fs.data, "out", p))
    assert values == list(range(3000))
    assert sorted(os.listdir(staging_dir)) == sorted([left["young"], left["other"]]) and staged(fs) == []
    with pytest.raises(Exception, match="option staging must be an absolute directory"):
        write(df, fs, topic="out", staging="relative/dir")


def test_old_files_staged_in_the_bucket_are_swept_and_nothing_else(creds):
    """staging=s3://BUCKET/PREFIX: what a dead driver or a late attempt left under the prefix is removed once older
    than a day (the sweep a write's plan runs, with a clock two days ahead); objects that are not staged files
    (other names, or below another prefix) stay."""
    from logfs.spark import sink

    client = creds._client()
    staged_name = f"j-{'a' * 32}.0.0.5.{'b' * 12}"
    keys = [f"stg/{staged_name}", "stg/notes.txt", f"stg/sub/{staged_name}", f"other/{staged_name}"]
    for key in keys:
        client.put_object(Bucket=creds.bucket, Key=key, Body=b"x")
    plan = sink.SinkPlan("/nonexistent", "out", ("value",), {}, f"s3://{creds.bucket}/stg", creds.endpoint)
    try:
        assert sink.sweep_staged_elsewhere(plan) == 0  # (young)
        assert sink.sweep_staged_elsewhere(plan, now_s=time.time() + 2 * 86_400) == 1
        left = {o["Key"] for prefix in ("stg/", "other/")
                for o in client.list_objects_v2(Bucket=creds.bucket, Prefix=prefix).get("Contents", [])}
        assert left == set(keys[1:])
    finally:
        client.delete_objects(Bucket=creds.bucket, Delete={"Objects": [{"Key": k} for k in keys]})

"""``spark.readStream.format("logfs")``: a streaming query picks up records appended (through the mount) after
it started; its progress is Kafka-style offsets JSON per topic-partition, restored from the checkpoint."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.mount


def stream(spark, data_dir, name, checkpoint, trigger, **options):
    reader = spark.readStream.format("logfs")
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load(str(data_dir)).selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS v")
    writer = (df.writeStream.format("memory").queryName(name).outputMode("append")
              .option("checkpointLocation", str(checkpoint)))
    return writer.trigger(**trigger).start()


def table(spark, name):
    return sorted((r.topic, r.partition, r.offset, r.v) for r in spark.table(name).collect())


def wait_rows(spark, query, name, count, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        assert query.exception() is None, query.exception()
        rows = table(spark, name)
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"{name}: {len(rows)} of {count} rows after {timeout}s"
        time.sleep(0.2)


def test_stream_receives_appends_after_it_started(spark, mount_logfs, tmp_path):
    fs = mount_logfs("num.partitions=2", "log.segment.bytes=4096")
    os.mkdir(fs.path("live"))
    lines = {0: [], 1: []}

    def append(p, n):
        new = [f"p{p}-{len(lines[p]) + i}" for i in range(n)]
        lines[p] += new
        fs.append(f"live/{p}", "".join(x + "\n" for x in new))

    append(0, 10)
    append(1, 5)
    query = stream(spark, fs.data, "live_q", tmp_path / "ckpt", {"processingTime": "200 milliseconds"},
                   subscribe="live", startingOffsets="earliest")
    try:
        wait_rows(spark, query, "live_q", 15)
        # Appended after the start: more records, enough to roll segments, and a new partition.
        for _ in range(5):
            append(0, 30)
            append(1, 20)
        with open(fs.path("live/2"), "a") as f:  # creates partition 2
            f.write("new-0\nnew-1\n")
        lines[2] = ["new-0", "new-1"]
        rows = wait_rows(spark, query, "live_q", sum(len(v) for v in lines.values()))
        query.processAllAvailable()
        rows = table(spark, "live_q")
        want = sorted(("live", p, i, v) for p, vs in lines.items() for i, v in enumerate(vs))
        assert rows == want
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        end = progress[-1]["sources"][0]["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
        assert end == {"live": {"0": 160, "1": 105, "2": 2}}
    finally:
        query.stop()

    # A restart from the checkpoint continues after the committed offsets: only newer records arrive. (The
    # memory sink cannot recover from a checkpoint; a JSON file sink can.)
    append(1, 3)
    df = (spark.readStream.format("logfs").option("subscribe", "live").option("startingOffsets", "earliest")
          .load(str(fs.data)).selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS v"))
    query = (df.writeStream.format("json").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert query.exception() is None
        # (The part files themselves: the sink's metadata log starts at this run's first batch id.)
        rows = spark.read.schema("topic STRING, partition INT, offset LONG, v STRING").json(
            str(tmp_path / "out" / "part-*"))
        assert sorted(tuple(r) for r in rows.collect()) == [("live", 1, 105 + i, f"p1-{105 + i}") for i in range(3)]
    finally:
        query.stop()


def test_available_now_with_max_offsets_per_trigger_and_latest_start(spark, mount_logfs, tmp_path):
    fs = mount_logfs("num.partitions=3")
    os.mkdir(fs.path("t"))
    for p in range(3):
        fs.append(f"t/{p}", "".join(f"{p}-{i}\n" for i in range(30 + 10 * p)))
    query = stream(spark, fs.data, "capped", tmp_path / "c1", {"availableNow": True},
                   subscribePattern="t", startingOffsets="earliest", maxOffsetsPerTrigger="40")
    query.awaitTermination(120)
    assert query.exception() is None
    assert table(spark, "capped") == sorted(("t", p, i, f"{p}-{i}") for p in range(3) for i in range(30 + 10 * p))
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sum(batches) == 120 and max(batches) <= 40 and len(batches) >= 3

    # startingOffsets=latest (the streaming default): nothing from before the start.
    query = stream(spark, fs.data, "fresh", tmp_path / "c2", {"processingTime": "200 milliseconds"},
                   subscribe="t")
    try:
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)  # the first batch fixes the start offsets
        fs.append("t/1", "late-a\nlate-b\n")
        assert wait_rows(spark, query, "fresh", 2) == [("t", 1, 40, "late-a"), ("t", 1, 41, "late-b")]
    finally:
        query.stop()

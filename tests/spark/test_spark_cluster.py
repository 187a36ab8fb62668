"""The ``logfs`` source on a real Spark standalone cluster: a Master and two Workers on 127.0.0.1, each Worker
launching its own executor JVM (fixtures ``spark_cluster`` and ``cluster_driver`` in conftest.py).

Every executor sees the same local DATA_DIR path here; reading from a bucket instead is test_spark_bucket.py.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark")
from logfs.testing.spark_standalone import ClusterJobError  # noqa: E402
from test_spark_datasource import kafka_python_records  # noqa: E402

from logfs.storage import ManualClock  # noqa: E402


def test_two_executor_jvms_read_exactly_what_the_engine_wrote(cluster_driver, spark_cluster, open_manager):
    m = open_manager({"num.partitions": "2", "log.segment.bytes": "4096", "log.index.interval.bytes": "512"},
                     clock=ManualClock())
    m.create_topic("events")
    m.create_topic("other")
    written = {0: [], 1: []}
    for p in range(2):
        for i in range(0, 400, 20):
            values = [None if (i + j) % 13 == 0 else f"e{p}-{i + j}-{'x' * ((i + j) % 30)}".encode()
                      for j in range(20)]
            keys = [None if (i + j) % 5 == 0 else f"k{(i + j) % 7}".encode() for j in range(20)]
            headers = [[("n", str(i + j).encode())] if (i + j) % 3 else [] for j in range(20)]
            m.get_log("events", p).append(values, keys, headers=headers)
            written[p] += list(zip(keys, values, headers))
            m.clock.advance(2)
    m.get_log("other", 0).append([b"not subscribed"])

    result = cluster_driver.run("read", path=m.data_dir, options={
        "subscribe": "events", "includeHeaders": "true", "maxRecordsPerPartition": "50"})
    parts = result["partitions"]
    assert len(parts) >= 16  # 800 records, at most 50 per Spark partition

    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: (r["partition"], r["offset"]))
    assert {r["topic"] for r in rows} == {"events"} and {r["timestampType"] for r in rows} == {0}
    for p in range(2):
        mine = [(r["offset"], r["timestamp"], r["key"], r["value"],
                 tuple((h["key"], h["value"]) for h in r["headers"])) for r in rows if r["partition"] == p]
        # Exactly the records kafka-python parses from the partition's .log files, once each ...
        assert mine == kafka_python_records(os.path.join(m.data_dir, f"events-{p}"))
        # ... which are the ones appended, in order.
        assert [(k, v, list(h)) for _, _, k, v, h in mine] == [(k, v, h) for k, v, h in written[p]]
    assert len(os.listdir(os.path.join(m.data_dir, "events-0"))) > 6  # several segments

    # Two executors did the work, each a JVM launched by a different Worker of the cluster (not the driver's
    # JVM), and their Python workers import the logfs under test.
    executors = {part["executor"]["executor_id"]: part["executor"] for part in parts}
    assert len(executors) == 2, executors
    assert {e["jvm_parent_pid"] for e in executors.values()} == {w.pid for w in spark_cluster.workers}
    jvms = {e["jvm_pid"] for e in executors.values()}
    assert len(jvms) == 2 and cluster_driver.info["driver_jvm_pid"] not in jvms
    assert {e["logfs"] for e in executors.values()} == {os.path.abspath(__import__("logfs").__file__)}
    state = spark_cluster.state()
    assert [a["id"] for a in state["activeapps"]] == [cluster_driver.info["app_id"]]
    assert {w["coresused"] for w in spark_cluster.alive_workers(state)} == {1}


def test_a_failed_job_comes_back_as_an_error_and_the_driver_goes_on(cluster_driver, open_manager):
    """The channel issue 17's error cases need: an error raised in the cluster job reaches the test with its
    type and message, and the session driver serves the next job."""
    m = open_manager({"num.partitions": "1"})
    m.create_topic("t")
    m.get_log("t", 0).append([b"one", b"two"])
    with pytest.raises(ClusterJobError, match=r"unknown topic or partition nosuch-0 \(no topic 'nosuch'\)") as caught:
        cluster_driver.run("read", path=m.data_dir, options={"assign": '{"nosuch":[0]}'})
    assert caught.value.type != "AttributeError"
    result = cluster_driver.run("read", path=m.data_dir, options={"subscribe": "t"}, columns=["offset", "value"])
    assert sorted((r["offset"], r["value"]) for p in result["partitions"] for r in p["rows"]) == [
        (0, b"one"), (1, b"two")]

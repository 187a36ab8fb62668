"""The logfs sink on the 2-worker standalone cluster, its executors staging through the bucket
(``staging=s3://...``): the driver copies the winning attempts' files into the mount and commits; first attempts
that fail half way are retried, a stalled one is speculated (a copy on the other Worker wins), and each row is
appended once; a stream into a topic appends each record once
across runs from its checkpoint; nothing is left in the bucket or in the staging directory."""

from __future__ import annotations

import collections
import os

import pytest

pytest.importorskip("pyspark")
from test_spark_sink import kafka_python_records  # noqa: E402

from logfs.spark.sink_rows import murmur2  # noqa: E402

pytestmark = pytest.mark.mount


def bucket_keys(seaweed, prefix: str) -> list[str]:
    listing = seaweed._client().list_objects_v2(Bucket=seaweed.bucket, Prefix=prefix + "/")
    return [o["Key"] for o in listing.get("Contents", [])]


def test_the_cluster_writes_each_row_once_staging_through_the_bucket(cluster_driver, mount_logfs, creds, tmp_path):
    fs = mount_logfs("num.partitions=3")
    os.mkdir(fs.path("out"))
    markers = tmp_path / "markers"
    markers.mkdir()
    staging = {"staging": f"s3://{creds.bucket}/sink-staging", "s3.endpoint": creds.endpoint}
    rows = 1_000_000 if os.environ.get("LOGFS_LONG") == "1" else 120_000
    cluster_driver.run("sink_write", timeout=600, mount=str(fs.mnt), rows=rows, markers=str(markers),
                       options={"topic": "out", **staging}, stall=1)
    names = os.listdir(markers)
    assert {"failed-0", "failed-3"} <= set(names)  # first attempts failed half way, and were retried
    # Task 1's first attempt stalled half way through its rows; Spark ran a speculative copy (on the other Worker),
    # which won: the stalled attempt was killed, and its rows are not appended twice.
    assert {"stalled-1", "speculative-1-1"} <= set(names), names
    assert len({n.split("-")[1] for n in names if n.startswith("ran-")}) == 2  # both executors staged rows
    seen = collections.Counter()
    for p in range(3):
        for _, _, key, value, _, _ in kafka_python_records(fs.data, "out", p):
            assert key == b"k%d" % (int(value) % 1000) and (murmur2(key) & 0x7FFFFFFF) % 3 == p
            seen[int(value)] += 1
    assert len(seen) == rows and set(seen.values()) == {1}
    assert bucket_keys(creds, "sink-staging") == [] and os.listdir(fs.path(".logfs-staging")) == []

    # A stream into another topic, in two runs from one checkpoint: each record once.
    os.mkdir(fs.path("in"))
    os.setxattr(fs.path("in"), "user.logfs.config.logfs.key.separator", b"\t")
    os.mkdir(fs.path("copy"))
    fs.append("in/0", "".join(f"k{i % 10}\tv{i}\n" for i in range(3000)))
    run = dict(data_dir=str(fs.data), mount=str(fs.mnt), source="in", checkpoint=str(tmp_path / "ckpt"),
               options={"topic": "copy", **staging})
    assert cluster_driver.run("sink_stream", timeout=300, **run)["batches"] >= 4
    fs.append("in/1", "".join(f"k{i % 10}\tv{i}\n" for i in range(3000, 4000)))
    assert cluster_driver.run("sink_stream", timeout=300, **run)["batches"] >= 1
    copied = [r[3] for p in range(3) for r in kafka_python_records(fs.data, "copy", p)]
    assert sorted(copied) == sorted(b"v%d" % i for i in range(4000))
    assert bucket_keys(creds, "sink-staging") == [] and os.listdir(fs.path(".logfs-staging")) == []


def test_a_stream_on_the_cluster_whose_driver_is_killed_appends_every_record_once(
        cluster_driver, spark_cluster, mount_logfs, creds, tmp_path):
    """The local driver-kill test (test_spark_sink_exactly_once.killed_stream) on the standalone cluster: the
    driver process (its JVM with it) killed with -9 at random moments and right after the daemon committed a
    micro-batch, once (10 times with LOGFS_LONG=1), restarted from its checkpoint each time; executors stage through
    the bucket. Every record once, in order per key, readers see whole micro-batches, nothing left staged."""
    import json

    from test_spark_sink_exactly_once import LONG, killed_stream

    cluster_driver.release()  # (its application holds every core; the next cluster test starts it again)
    fs = mount_logfs("num.partitions=3", foreground=True)
    staging = {"staging": f"s3://{creds.bucket}/sink-stream-staging", "s3.endpoint": creds.endpoint}
    env = {**creds.env(), "SPARK_LOCAL_IP": "127.0.0.1", "LOGFS_SINK_MASTER": spark_cluster.master_url,
           "LOGFS_SINK_CONF": json.dumps({f"spark.executorEnv.{k}": v for k, v in creds.env().items()}),
           "LOGFS_SINK_OPTIONS": json.dumps(staging)}

    def nothing_in_the_bucket():
        assert bucket_keys(creds, "sink-stream-staging") == []

    # One kill in the SHORT profile (the driver killed right after the daemon committed a micro-batch: the replay
    # case); the local test kills at both kinds of moment, and LONG kills ten times here.
    killed_stream(fs, tmp_path, 10 if LONG else 1, env=env, check_staged=nothing_in_the_bucket)

"""Spark on a ``kafka://`` mount (CONTRACT.md section 15, last point): ``spark.read.text`` of the mount and Spark's
own Kafka source read the same topic with the same rows.

Lines go in through the mount (``echo``-style appends and a bulk write, each partition its own, with ``fsync``);
the mount's files are read by the suite's SparkSession as text, and Spark's Kafka source (the connector set-up
resolved: tests/kafka/spark_kafka.py) reads the topic from the session's broker. Per partition, both give the lines
written, in the order written. Spark's connector is a consumer of its own: nothing of logfs is in its path.
"""

from __future__ import annotations

import os

import pytest

from harness import wait_for
from test_kafka_store import kafka_mount, read

pytestmark = pytest.mark.mount

TOPIC = "spark-read"


def test_spark_reads_the_mount_and_the_topic_alike(mount_logfs, kafka_broker, kafka_source, spark, tmp_path):
    from pyspark.sql import functions as F

    m = kafka_mount(mount_logfs, kafka_broker.bootstrap, "m", tmp_path / "cache", "num.partitions=2")
    os.mkdir(m.path(TOPIC))
    written = {0: [f"p0 line {i} é".encode() for i in range(400)],
               1: [f'{{"id": {i}, "partition": 1}}'.encode() for i in range(250)]}
    for p, lines in written.items():
        fd = os.open(m.path(TOPIC, p), os.O_WRONLY | os.O_APPEND)
        try:
            for line in lines[:50]:  # one line a write(), as `echo >>` does
                os.write(fd, line + b"\n")
            os.write(fd, b"".join(line + b"\n" for line in lines[50:]))  # the rest in one write()
            os.fsync(fd)  # every line acknowledged by the cluster
        finally:
            os.close(fd)
    for p, lines in written.items():
        want = b"".join(line + b"\n" for line in lines)
        wait_for(lambda: read(m.path(TOPIC, p)) == want, 30, what=f"the mount's {TOPIC}/{p}")

    # The mount as files: one row a line, each file in its order.
    df = spark.read.text(m.path(TOPIC)).withColumn("file", F.input_file_name())
    from_files: dict[int, list[bytes]] = {}
    for row in df.collect():
        from_files.setdefault(int(row.file.rsplit("/", 1)[1]), []).append(row.value.encode())
    # The topic through Spark's Kafka source.
    from_kafka = {p: values for (topic, p), values in kafka_source.values(kafka_broker.bootstrap, [TOPIC]).items()}
    assert from_files == from_kafka == written

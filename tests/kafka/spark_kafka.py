"""Spark's own Kafka source, for the tests that compare it with logfs (CONTRACT.md sections 13 and 15).

The connector is the one set-up resolved (logfs/testing/kafka_setup.py: PySpark's own version, else the newest
earlier release of its major version on Maven Central), on the classpath of the suite's one SparkSession
(tests/spark/conftest.py). Rows are read as a ``read_committed`` consumer reads them, from the earliest to the
latest offsets, and given in the shape of the ``logfs`` source's rows in tests/kafka/test_logfs_reads_a_broker.py:
``(offset, timestamp ms, timestamp type, key, value, headers)`` per ``(topic, partition)``, in offset order.
"""

from __future__ import annotations

from logfs.testing.kafka_setup import spark_connector_jars, spark_connector_status
from logfs.testing.spark_standalone import spark_missing_reason

TIMESTAMP_TYPES = ["CreateTime", "LogAppendTime"]


def kafka_source_missing_reason() -> str | None:
    """Why Spark's Kafka source cannot run here, or None."""
    reason = spark_missing_reason()
    if reason:
        return reason
    if not spark_connector_jars():
        return f"Spark's Kafka connector is not here: {spark_connector_status()}"
    return None


def logfs_source_rows(session, data_dir, topics, **options: str) -> dict[tuple[str, int], list]:
    """``spark.read.format("logfs")`` over a log directory (with ``options``), in the shape of
    :meth:`KafkaSource.rows`."""
    return _rows(session.read.format("logfs").option("subscribe", ",".join(topics)).option("includeHeaders", "true")
                 .options(**options).load(str(data_dir)))


def _rows(df) -> dict[tuple[str, int], list]:
    from pyspark.sql import functions as F

    out: dict[tuple[str, int], list] = {}
    for r in df.select("topic", "partition", "offset", F.expr("unix_millis(timestamp)").alias("ts"),
                       "timestampType", "key", "value", "headers").collect():
        headers = [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers or ()]
        out.setdefault((r.topic, r.partition), []).append(
            (r.offset, r.ts, TIMESTAMP_TYPES[r.timestampType], None if r.key is None else bytes(r.key),
             None if r.value is None else bytes(r.value), headers))
    return {k: sorted(v) for k, v in out.items()}


class KafkaSource:
    """``spark.read.format("kafka")`` with the options every comparison uses."""

    def __init__(self, session):
        self.session = session

    def frame(self, bootstrap: str, topics):
        return (self.session.read.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("kafka.isolation.level", "read_committed")
                .option("subscribe", ",".join(topics))
                .option("startingOffsets", "earliest").option("endingOffsets", "latest")
                .option("includeHeaders", "true")
                .load())

    def rows(self, bootstrap: str, topics) -> dict[tuple[str, int], list]:
        return _rows(self.frame(bootstrap, topics))

    def values(self, bootstrap: str, topics) -> dict[tuple[str, int], list[bytes]]:
        """Each partition's record values, in offset order."""
        return {tp: [row[4] for row in rows] for tp, rows in self.rows(bootstrap, topics).items()}

"""A real Apache Kafka for the tests (logfs/testing/kafka.py): ONE client JVM (Kafka's clients and its
DumpLogSegments) and ONE broker for the whole session, each started on first use and ended at the session's end.

Set-up (tools/dev.sh) must have resolved Kafka's jars: without them these fixtures fail with a message saying so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from logfs.testing.kafka import KafkaClient, running_broker
from logfs.testing.kafka_dump import DumpLogSegments

from spark_kafka import KafkaSource, kafka_source_missing_reason


@pytest.fixture(scope="session")
def kafka_client(tmp_path_factory):
    """Kafka's Java clients and tools in one JVM (KafkaClient.java)."""
    client = KafkaClient(tmp_path_factory.mktemp("kafka-client")).start()
    yield client
    client.close()


@pytest.fixture(scope="session")
def kafka_dump(kafka_client):
    """Kafka's own DumpLogSegments (kafka.tools.DumpLogSegments), run in the client's JVM."""
    return DumpLogSegments(kafka_client)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory, kafka_client):
    """One KRaft node (broker and controller) for the session. Tests create their own topics on it."""
    with running_broker(tmp_path_factory.mktemp("kafka-broker"), kafka_client) as broker:
        yield broker


# -- Spark: tests/spark's session (one SparkSession per test session), and Spark's own Kafka source -----------
def _spark_suite_fixture():
    """tests/spark's ``spark`` fixture (session-scoped; it skips without PySpark or Java). Its SparkSession is
    the one of tests/spark too (``getOrCreate``): started once per test session, whichever suite asks first."""
    spec = importlib.util.spec_from_file_location("spark_suite_conftest",
                                                  Path(__file__).resolve().parents[1] / "spark" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.spark


spark = _spark_suite_fixture()


@pytest.fixture
def kafka_source(spark):
    """Spark's own Kafka source (``spark.read.format("kafka")``) on the session's SparkSession, when set-up
    resolved Spark's Kafka connector (CONTRACT.md sections 13 and 15: "where it is available"); else the test
    skips, saying why."""
    reason = kafka_source_missing_reason()
    if reason:
        pytest.skip(reason)
    return KafkaSource(spark)

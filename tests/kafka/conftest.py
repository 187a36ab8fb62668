"""A real Apache Kafka for the tests (logfs/testing/kafka.py): ONE client JVM (Kafka's clients and its
DumpLogSegments) and ONE broker for the whole session, each started on first use and ended at the session's end.

Set-up (tools/dev.sh) must have resolved Kafka's jars: without them these fixtures fail with a message saying so.
"""

from __future__ import annotations

import pytest

from logfs.testing.kafka import KafkaClient, running_broker
from logfs.testing.kafka_dump import DumpLogSegments


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

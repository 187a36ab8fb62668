"""A Kafka cluster of three as the store: a broker killed while a writer appends (CONTRACT.md section 15,
"Failures"; issue 46).

Three KRaft nodes of this module's own (``logfs.testing.kafka.running_cluster``, ``min.insync.replicas=2``); a
``kafka://`` mount of all three makes a topic with ``default.replication.factor=3``; a writer appends one line per
``write()`` and ``fsync``s every few lines, and the partition's leader is killed (SIGKILL) half-way. Every line
whose ``fsync`` returned is in the cluster once (as Kafka's consumer reads it), no line is there twice, each line
after its predecessors, and the mount's file shows what the consumer reads.
"""

from __future__ import annotations

import os

import pytest

from logfs.testing.kafka import bootstrap_of, running_cluster

from harness import daemon_pids, wait_for

pytestmark = pytest.mark.mount

LINES = 1500
FSYNC_EVERY = 25


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, kafka_client):
    with running_cluster(tmp_path_factory.mktemp("kafka-cluster"), kafka_client, 3,
                         settings={"min.insync.replicas": "2"}) as members:
        yield members


def leader_of(bootstrap: str, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[0].leader


def test_leader_killed_while_appending(mount_logfs, nodes, kafka_client, tmp_path):
    bootstrap = bootstrap_of(nodes)

    def prepare(m):
        m.source = f"kafka://{bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)

    m = mount_logfs(f"logfs.remote.cache.dir={tmp_path / 'cache'}", "default.replication.factor=3",
                    "kafka.delivery.timeout.ms=60000", foreground=True, name="m", prepare=prepare)
    os.mkdir(m.path("replicated"))
    leader = leader_of(bootstrap, "replicated")
    victim = next(n for n in nodes if n.node_id == leader)
    synced = 0  # lines whose fsync returned
    fd = os.open(m.path("replicated", 0), os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(LINES):
            line = b"line %d\n" % i
            assert os.write(fd, line) == len(line)
            if i == LINES // 2:
                victim.kill()
            if (i + 1) % FSYNC_EVERY == 0:
                os.fsync(fd)
                synced = i + 1
    finally:
        os.close(fd)
    assert synced == LINES
    alive = [n for n in nodes if n is not victim]
    records = kafka_client.consume(bootstrap_of(alive), "replicated", 0)
    values = [r.value for r in records]
    assert len(values) == len(set(values)), "a line is there twice"
    assert values == [b"line %d" % i for i in range(LINES)]
    assert leader_of(bootstrap_of(alive), "replicated") != leader
    want = b"".join(v + b"\n" for v in values)
    wait_for(lambda: open(m.path("replicated", 0), "rb").read() == want, 60, what="the mount to show every line")

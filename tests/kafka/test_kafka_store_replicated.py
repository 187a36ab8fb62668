"""A Kafka cluster of three as the store: a broker killed while a writer appends (CONTRACT.md section 15,
"Failures"; issue 46).

Three KRaft nodes of this module's own (``logfs.testing.kafka.running_cluster``, ``min.insync.replicas=2``); a
``kafka://`` mount of all three makes a topic with ``default.replication.factor=3``; two mounts (two hosts) each
have a writer appending one line per ``write()`` to the same partition and ``fsync``ing every few lines, and the
partition's leader is killed (SIGKILL) when both are half-way. Every line whose ``fsync`` returned is in the cluster
once (as Kafka's consumer reads it), no line is there twice, each writer's lines in its order, and both mounts' files
show what the consumer reads.
"""

from __future__ import annotations

import os
import threading

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

    def mount(name: str):
        def prepare(m):
            m.source = f"kafka://{bootstrap}"
            m.pids = lambda: daemon_pids(m.source, m.mnt)

        return mount_logfs(f"logfs.remote.cache.dir={tmp_path / name / 'cache'}", "default.replication.factor=3",
                           "kafka.delivery.timeout.ms=60000", foreground=True, name=name, prepare=prepare)

    a, b = mount("a"), mount("b")  # two hosts
    os.mkdir(a.path("replicated"))
    wait_for(lambda: os.path.exists(b.path("replicated", 0)), 10, what="the topic on the second mount")
    leader = leader_of(bootstrap, "replicated")
    victim = next(n for n in nodes if n.node_id == leader)
    synced: dict[bytes, int] = {}  # writer -> lines whose fsync returned
    half = threading.Barrier(3)

    def writer(m, name: bytes) -> None:
        fd = os.open(m.path("replicated", 0), os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(LINES):
                line = b"%s %d\n" % (name, i)
                assert os.write(fd, line) == len(line)
                if i == LINES // 2:
                    half.wait(60)
                if (i + 1) % FSYNC_EVERY == 0:
                    os.fsync(fd)
                    synced[name] = i + 1
        finally:
            os.close(fd)

    threads = [threading.Thread(target=writer, args=(m, name)) for m, name in ((a, b"a"), (b, b"b"))]
    for t in threads:
        t.start()
    half.wait(60)
    victim.kill()  # (both writers half-way)
    for t in threads:
        t.join(300)
    assert synced == {b"a": LINES, b"b": LINES}
    alive = [n for n in nodes if n is not victim]
    records = kafka_client.consume(bootstrap_of(alive), "replicated", 0)
    values = [r.value for r in records]
    assert len(values) == len(set(values)), "a line is there twice"
    for name in (b"a", b"b"):  # every line of each writer once, in its order
        assert [v for v in values if v.startswith(name + b" ")] == [b"%s %d" % (name, i) for i in range(LINES)]
    assert len(values) == 2 * LINES
    assert leader_of(bootstrap_of(alive), "replicated") != leader
    want = b"".join(v + b"\n" for v in values)
    for m in (a, b):  # both hosts read the same order
        wait_for(lambda: open(m.path("replicated", 0), "rb").read() == want, 60, what="the mounts to show every line")

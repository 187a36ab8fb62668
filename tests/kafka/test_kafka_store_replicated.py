"""A Kafka cluster of three as the store: a leader moved by reassignment, and a broker killed, while writers append
(CONTRACT.md section 15, "Failures"; issue 46).

Three KRaft nodes of this module's own (``logfs.testing.kafka.running_cluster``, ``min.insync.replicas=2``); two
``kafka://`` mounts of all three (two hosts) each have a writer appending one line per ``write()`` to the same
partition and ``fsync``ing every few lines, and when both are half-way:

- the partition is reassigned by Kafka's AlterPartitionReassignments (the request ``kafka-reassign-partitions``
  sends; kafka-python's admin client sends it here, confluent-kafka has none) to two brokers that leave out its
  leader, so the leader moves once the new replica caught up, while the writers go on;
- or its leader is killed (SIGKILL).

Every line whose ``fsync`` returned is in the cluster once (as Kafka's consumer reads it), no line is there twice,
each writer's lines in its order, both mounts' files show what the consumer reads, and a ``tail -f`` started before
shows it too. The reassignment runs first: the kill leaves the cluster one node short.
"""

from __future__ import annotations

import os
import threading

import pytest

from logfs.testing.kafka import bootstrap_of, running_cluster

from open_reader import TailF

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

    """The leader of ``topic``'s partition 0, or -1 while the answering broker knows of none (a topic just
    created: its metadata may not have reached that broker yet, and the answer lists no partition)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or 0 not in found.partitions:
        return -1
    return found.partitions[0].leader


def cluster_mount(mount_logfs, bootstrap: str, tmp_path, name: str):
    """A foreground ``kafka://`` mount of the cluster, its cache its own (a host)."""
    def prepare(m):
        m.source = f"kafka://{bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)

    return mount_logfs(f"logfs.remote.cache.dir={tmp_path / name / 'cache'}", "default.replication.factor=3",
                       "kafka.delivery.timeout.ms=60000", foreground=True, name=name, prepare=prepare)


# kafka-python's admin client loads its protocol schemas through importlib.resources' legacy API (read_text,
# open_text): 218 DeprecationWarnings of that library's, none of logfs's
@pytest.mark.filterwarnings(r"ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_leader_moved_by_reassignment(mount_logfs, nodes, kafka_client, tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import TopicPartition as KafkaPythonPartition
    from kafka.admin import KafkaAdminClient

    bootstrap = bootstrap_of(nodes)
    ids = [n.node_id for n in nodes]
    # two replicas, on the first two nodes: the reassignment moves them to the last two, away from the leader
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("reassigned", 1, replica_assignment=[ids[:2]])], request_timeout=30)[
        "reassigned"].result(60)
    wait_for(lambda: leader_of(bootstrap, "reassigned") in ids[:2], 30, what="the partition's leader")
    leader = leader_of(bootstrap, "reassigned")
    target = [n for n in ids if n != leader][:2]
    a, b = cluster_mount(mount_logfs, bootstrap, tmp_path, "a"), cluster_mount(mount_logfs, bootstrap, tmp_path, "b")
    wait_for(lambda: os.path.exists(a.path("reassigned", 0)) and os.path.exists(b.path("reassigned", 0)), 10,
             what="the topic on both mounts")
    moved = threading.Event()
    half = threading.Barrier(3)
    written: dict[bytes, int] = {}

    def writer(m, name: bytes) -> None:
        """LINES lines, and on until the leader moved (so that appends are in flight across the move)."""
        fd = os.open(m.path("reassigned", 0), os.O_WRONLY | os.O_APPEND)
        try:
            i = 0
            while i < LINES or (not moved.is_set() and i < 20 * LINES):
                line = b"%s %d\n" % (name, i)
                assert os.write(fd, line) == len(line)
                i += 1
                if i == LINES // 2:
                    half.wait(60)
                if i % FSYNC_EVERY == 0:
                    os.fsync(fd)
            os.fsync(fd)
            written[name] = i
        finally:
            os.close(fd)

    threads = [threading.Thread(target=writer, args=(m, name)) for m, name in ((a, b"a"), (b, b"b"))]
    with TailF(b.path("reassigned", 0)) as tail:  # (started before anything is written)
        for t in threads:
            t.start()
        half.wait(60)
        reassign = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:  # Kafka's AlterPartitionReassignments: the leader is not among the new replicas
            answer = reassign.alter_partition_reassignments({KafkaPythonPartition("reassigned", 0): target})
            assert all(error is None for error in answer.values()), answer
            wait_for(lambda: leader_of(bootstrap, "reassigned") in target, 60, interval=0.1,
                     what="the reassignment to move the leader")
            appending = [t.is_alive() for t in threads]  # (the writers go on until they see it moved)
            moved.set()
            wait_for(lambda: not reassign.list_partition_reassignments(), 60, interval=0.2,
                     what="the reassignment to finish")
        finally:
            moved.set()
            reassign.close()
        for t in threads:
            t.join(300)
        assert set(written) == {b"a", b"b"} and min(written.values()) >= LINES, written
        assert all(appending), "a writer ended before the leader moved"
        print(f"lines written across the move: {written}")
        records = kafka_client.consume(bootstrap, "reassigned", 0)
        values = [r.value for r in records]
        assert len(values) == len(set(values)), "a line is there twice"
        for name in (b"a", b"b"):  # every line of each writer once, in its order
            assert [v for v in values if v.startswith(name + b" ")] == [b"%s %d" % (name, i)
                                                                         for i in range(written[name])]
        assert len(values) == sum(written.values())
        want = b"".join(v + b"\n" for v in values)
        for m in (a, b):  # both hosts read the same order
            wait_for(lambda: open(m.path("reassigned", 0), "rb").read() == want, 60,
                     what="the mounts to show every line")
        tail.shows(want, what="tail -f across the move to show every line once")


def test_leader_killed_while_appending(mount_logfs, nodes, kafka_client, tmp_path):
    bootstrap = bootstrap_of(nodes)

    def mount(name: str):
        return cluster_mount(mount_logfs, bootstrap, tmp_path, name)

    a, b = mount("a"), mount("b")  # two hosts
    os.mkdir(a.path("replicated"))
    wait_for(lambda: os.path.exists(b.path("replicated", 0)), 10, what="the topic on the second mount")
    wait_for(lambda: leader_of(bootstrap, "replicated") in [n.node_id for n in nodes], 30, what="the leader")
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

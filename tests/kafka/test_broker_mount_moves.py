"""A partition moved between a running broker's log directories under its read-only mount (CONTRACT.md section 14;
issue 45): a broker of this module's own with two log directories, mounted as one namespace (``DIR1,DIR2``), and
Kafka's AlterReplicaLogDirs (the broker copies the log into ``<topic>-<n>.<uuid>-future`` in the target, renames
the source ``-delete``, and the copy ``<topic>-<n>``).

- the partition is then served from its new directory: a fresh read is the consumer's read, later appends too;
- a file opened before the move goes on reading, the appends after it too (Kafka's copy holds the same segments:
  the log's segments are pointed at the new files); tests/storage/test_broker_dir.py has the other case (a copy
  rolled elsewhere: the open file reads what it read through the renamed ``-delete`` directory);
- the broker's server log shows no ERROR, and its consumer reads the same records before and after.
"""

from __future__ import annotations

import os

import pytest

from logfs.testing.kafka import KafkaBroker

from harness import mounted_at, wait_for
from open_reader import OpenReader, produce_lines

pytestmark = pytest.mark.mount

TOPIC = "moving"


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    root = tmp_path_factory.mktemp("kafka-broker-moves")
    b = KafkaBroker(root, log_dirs=[root / "d1", root / "d2"], client=kafka_client)
    b.start()
    try:
        b.create_topic(TOPIC, 1, {"internal.segment.bytes": "4096", "file.delete.delay.ms": "600000"})
        yield b
    finally:
        try:
            b.stop()
        except Exception:
            b.kill()


def produce(client, broker, start: int, count: int) -> bytes:
    return produce_lines(client, broker, TOPIC, [f"{TOPIC} line {i} {'m' * 30}".encode()
                                                 for i in range(start, start + count)])


def test_a_partition_moved_between_the_brokers_directories(broker, kafka_client, mount_logfs, tmp_path):
    d1, d2 = broker.log_dirs
    sent = produce(kafka_client, broker, 0, 80)
    source = d1 if (d1 / f"{TOPIC}-0").is_dir() else d2
    target = d2 if source == d1 else d1
    log_at = broker.log_file.stat().st_size
    fs = mount_logfs("ro", f"logfs.cache.dir={tmp_path / 'cache'}", "logfs.broker.poll.ms=100",
                     prepare=lambda m: setattr(m, "source", f"{d1},{d2}"))
    reader = OpenReader(fs.path(TOPIC, 0))
    try:
        assert reader.read() == sent
        before = kafka_client.consume(broker.bootstrap, TOPIC, 0)
        kafka_client.alter_log_dirs(broker.bootstrap, {(TOPIC, 0, broker.node_id): str(target)})
        wait_for(lambda: (target / f"{TOPIC}-0").is_dir() and not (source / f"{TOPIC}-0").exists(), 60,
                 interval=0.1, what="Kafka's move of the partition")
        assert any(n.startswith(f"{TOPIC}-0.") and n.endswith("-delete") for n in os.listdir(source))
        assert kafka_client.consume(broker.bootstrap, TOPIC, 0) == before

        sent += produce(kafka_client, broker, 80, 40)
        expected = b"".join(r.value + b"\n" for r in kafka_client.consume(broker.bootstrap, TOPIC, 0))
        assert expected == sent

        def shown():
            return fs.read(f"{TOPIC}/0") == expected

        wait_for(shown, 30, interval=0.1, what="the moved partition, served from its new directory")
        # The file opened before the move goes on: Kafka's copy holds the same segments, and the log follows them.
        assert reader.seen == b"".join(r.value + b"\n" for r in before)  # (what it read before the move)
        reader.reaches(expected, 30, what="the open file, after the move")
        with open(broker.log_file, "rb") as f:
            f.seek(log_at)
            text = f.read().decode(errors="replace")
        errors = [line for line in text.splitlines() if " ERROR " in line]
        if "ReplicaAlterLogDirsThread.updateReassignmentState" in text:
            # Kafka's own race in promoting the future replica (the controller's answer to the directory
            # assignment arrives after the promotion: an NullPointerException in its callback, logged by the
            # AssignmentsManager; the move completes). Seen once in a loaded run; nothing of the mount's.
            errors = [line for line in errors if "[AssignmentsManager" not in line
                      or "unexpected callback exception" not in line]
        assert not errors, errors
    finally:
        reader.close()
        if mounted_at(fs.mnt):
            fs.unmount()

"""A Kafka cluster as the store, with an authorizer: what the cluster refuses is ``EACCES`` (CONTRACT.md section 15,
"Administration"; issue 46).

A broker of this module's own (logfs/testing/kafka.py ``SaslUsers``): SASL_PLAINTEXT with PLAIN users, KRaft's
``StandardAuthorizer``, nothing allowed where no ACL says so; ``admin`` is its super user, and the ACLs of the
limited user ``alice`` are set through Kafka's admin API (CreateAcls). A mount as ``alice``
(``-o kafka.security.protocol=SASL_PLAINTEXT,kafka.sasl.mechanism=PLAIN,kafka.sasl.username=alice,...``):

- a topic she may read but not write: the open for appending is ``EACCES`` (the mount asks the cluster's
  authorized operations first); a topic whose WRITE is revoked while she holds it open: the append (``write`` then
  ``fsync``, and ``write`` then ``close``) is ``EACCES`` (the producer's fatal error); no refused line reaches the
  cluster;
- ``mkdir`` without CREATE, ``setfattr`` of a ``user.logfs.config.*`` name without ALTER_CONFIGS, ``getfattr``
  without DESCRIBE_CONFIGS: ``EACCES``, and the cluster is unchanged;
- a topic she may not DESCRIBE is not listed, and is ``ENOENT``; one she may DESCRIBE but not READ is listed, and
  its read is ``EACCES`` (the replica's fetch was refused);
- ACLs changed while mounted (no remount): READ granted (on a topic with records, on an empty one), DESCRIBE and
  READ granted on a hidden topic, READ revoked (the lines fetched before still read, a read at the file's end is
  ``EACCES``, no fresh record is fetched) and granted again;
- every call returns (the refusal is the cluster's answer, not a timeout), and the mount goes on serving what she
  may: a topic she may write takes her lines before and after each refusal, and every line acknowledged is in the
  cluster once, in order, and in the mount's file.

No consumer group is granted: the mount's replica reads by assignment, with no group membership.
"""

from __future__ import annotations

import errno
import os

import pytest

from logfs.testing.kafka import SaslUsers, running_broker

from harness import daemon_pids, expect_errno, wait_for

pytestmark = pytest.mark.mount

USERS = SaslUsers({"admin": "admin-secret", "alice": "alice-secret"})


def admin_client(broker):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap, **USERS.client_settings("admin")})


def bindings(topic: str, *operations: str) -> list:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    return [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation[op],
                       AclPermissionType.ALLOW) for op in operations]


def grant(admin, topic: str, *operations: str) -> None:
    """ACLs allowing ``alice`` ``operations`` (AclOperation names) on ``topic``, through Kafka's CreateAcls."""
    for future in admin.create_acls(bindings(topic, *operations)).values():
        future.result(30)


def revoke(admin, topic: str, *operations: str) -> None:
    """Kafka's DeleteAcls of what :func:`grant` allowed."""
    from confluent_kafka.admin import AclBindingFilter

    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                b.permission_type) for b in bindings(topic, *operations)]
    for future in admin.delete_acls(filters).values():
        future.result(30)


def consume_all(broker, topic: str, partition: int = 0) -> list[bytes]:
    """Every value of the partition, read as the super user by a ``read_committed`` consumer (librdkafka's)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, **USERS.client_settings("admin"),
                         "group.id": "logfs-test-check", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        values = []
        position = low
        while position < high:
            message = consumer.poll(30)
            assert message is not None, f"{topic}-{partition}: nothing fetched at {position} (end {high})"
            assert message.error() is None, message.error()
            values.append(message.value())
            position = message.offset() + 1
        return values
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    from confluent_kafka.admin import NewTopic

    with running_broker(tmp_path_factory.mktemp("kafka-store-acl"), kafka_client, sasl=USERS) as b:
        admin = admin_client(b)
        topics = [NewTopic(name, 1, 1) for name in ("readable", "writable", "hidden", "described", "unreadable",
                                                    "revoked")]
        for future in admin.create_topics(topics, request_timeout=30).values():
            future.result(60)
        grant(admin, "readable", "DESCRIBE", "READ", "DESCRIBE_CONFIGS")
        grant(admin, "writable", "DESCRIBE", "READ", "WRITE", "DESCRIBE_CONFIGS")
        grant(admin, "described", "DESCRIBE", "READ")  # (no DESCRIBE_CONFIGS, no ALTER_CONFIGS)
        grant(admin, "unreadable", "DESCRIBE")  # (listed, not fetched)
        grant(admin, "revoked", "DESCRIBE", "READ", "WRITE")  # (WRITE revoked by the test)
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": b.bootstrap, **USERS.client_settings("admin")})
        producer.produce("unreadable", b"not for alice", partition=0)
        assert producer.flush(30) == 0
        del producer, admin  # (their connections end before the broker does)
        yield b


def alice_mount(mount_logfs, broker, cache):
    def prepare(m):
        m.source = f"kafka://{broker.bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)

    settings = [f"kafka.{name}={value}" for name, value in USERS.client_settings("alice").items()]
    return mount_logfs(f"logfs.remote.cache.dir={cache}", "logfs.broker.poll.ms=50", *settings,
                       "kafka.delivery.timeout.ms=10000", foreground=True, name="alice", prepare=prepare)


def append(path: str, data: bytes, sync: str) -> None:
    """``write`` then ``fsync`` and ``close`` (``sync="fsync"``), or ``write`` then ``close`` alone."""
    append_to(os.open(path, os.O_WRONLY | os.O_APPEND), data, sync)


def append_to(fd: int, data: bytes, sync: str) -> None:
    """:func:`append` on an open descriptor, which it closes."""
    try:
        assert os.write(fd, data) == len(data)  # (queued: the cluster answers at fsync or close)
        if sync == "fsync":
            os.fsync(fd)
    finally:
        os.close(fd)


def test_what_the_cluster_refuses_is_eacces(mount_logfs, broker, tmp_path):
    m = alice_mount(mount_logfs, broker, tmp_path / "cache")
    assert sorted(os.listdir(m.path())) == ["described", "readable", "revoked", "unreadable", "writable"]  # (-hidden)

    def read_refused() -> bool:
        try:
            with open(m.path("unreadable", 0), "rb") as f:
                f.read()
        except PermissionError:
            return True
        return False

    # DESCRIBE without READ: listed, and its read is EACCES once the replica's fetch was refused (not an empty file)
    wait_for(read_refused, 30, what="the read of a topic she may not READ to be refused")
    expect_errno(errno.ENOENT, os.stat, m.path("hidden"))
    expect_errno(errno.ENOENT, os.open, m.path("hidden", 0), os.O_WRONLY | os.O_APPEND)

    mine = []

    def write_mine(sync: str) -> None:
        line = b"mine %d\n" % len(mine)
        append(m.path("writable", 0), line, sync)  # acknowledged: fsync and close return without error
        mine.append(line)

    write_mine("fsync")
    # Read but not write: the open for appending is refused (the cluster's authorized operations).
    expect_errno(errno.EACCES, os.open, m.path("readable", 0), os.O_WRONLY | os.O_APPEND)
    expect_errno(errno.EACCES, os.open, m.path("readable", 0), os.O_RDWR)
    assert open(m.path("readable", 0), "rb").read() == b""  # (reading it is granted)
    write_mine("close")
    # WRITE revoked while open: the append is refused by the cluster, whether fsync or close is the first to wait.
    fds = [os.open(m.path("revoked", 0), os.O_WRONLY | os.O_APPEND) for _ in range(3)]
    try:
        os.write(fds[0], b"granted\n")
        os.fsync(fds[0])
        revoke(admin_client(broker), "revoked", "WRITE")

        def refused(fd: int) -> bool:  # (the broker's authorizer applies the deleted ACL from its metadata log)
            try:
                os.write(fd, b"refused\n")
                os.fsync(fd)
            except PermissionError:
                return True
            return False

        wait_for(lambda: refused(fds[0]), 30, what="the revoked WRITE to refuse an append")
        write_mine("fsync")
        expect_errno(errno.EACCES, append_to, fds[1], b"refused 1\n", "fsync")
        write_mine("close")
        expect_errno(errno.EACCES, append_to, fds[2], b"refused 2\n", "close")
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    write_mine("fsync")
    # No CREATE: mkdir is refused, and no topic is made.
    expect_errno(errno.EACCES, os.mkdir, m.path("new"))
    write_mine("close")
    # Topic config: read with DESCRIBE_CONFIGS, refused without ALTER_CONFIGS; neither on "described".
    assert os.getxattr(m.path("readable"), "user.logfs.config.cleanup.policy") == b"delete"
    expect_errno(errno.EACCES, os.setxattr, m.path("readable"), "user.logfs.config.retention.ms", b"1000")
    expect_errno(errno.EACCES, os.removexattr, m.path("writable"), "user.logfs.config.retention.ms")
    expect_errno(errno.EACCES, os.getxattr, m.path("described"), "user.logfs.config.retention.ms")
    # No DELETE: DeleteRecords is refused.
    expect_errno(errno.EACCES, os.setxattr, m.path("writable", 0), "user.logfs.log_start_offset", b"1")
    write_mine("fsync")

    # The mount still serves what she may: her lines are in the cluster once each, in order, and in the file.
    want = b"".join(mine)
    assert consume_all(broker, "writable") == [line.rstrip(b"\n") for line in mine]
    wait_for(lambda: open(m.path("writable", 0), "rb").read() == want, 30, what="the file to show her lines")
    assert consume_all(broker, "readable") == []  # no refused line reached the cluster
    assert consume_all(broker, "revoked") == [b"granted"]
    assert m.getx("readable/0", "log_end_offset") == "0"
    admin = admin_client(broker)
    assert "new" not in admin.list_topics(timeout=30).topics
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, "readable")
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["retention.ms"].value == "-1"  # (the broker's default: unchanged)
    del admin  # (its connections end before the broker does)


def read_or_errno(path: str) -> bytes | int:
    """The file's bytes, or the errno its open or a read answered (``cat``: the lines it printed are lost then)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return exc.errno


def test_read_granted_and_revoked_while_mounted(mount_logfs, broker, tmp_path):
    """ACLs changed while mounted, through Kafka's admin API, no remount: READ granted on a topic she may only
    DESCRIBE (its read was EACCES) makes the file read, an empty one too (no record comes to say so: the replica
    asks the cluster's authorized operations); DESCRIBE and READ granted on a topic she could not see make it
    appear (it was ENOENT) and read. READ revoked: what the replica fetched before still reads (this host's copy), the
    cluster's fresh records are not fetched, and a read at the file's end is EACCES (``cat`` prints the lines it
    has, then fails, rather than a file that stops growing unnoticed); READ granted again brings the fresh
    records."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    admin = admin_client(broker)
    names = ("granted-later", "granted-empty", "seen-later", "revoked-read")
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names], request_timeout=30).values():
        future.result(60)
    grant(admin, "granted-later", "DESCRIBE")
    grant(admin, "granted-empty", "DESCRIBE")
    grant(admin, "revoked-read", "DESCRIBE", "READ")
    producer = Producer({"bootstrap.servers": broker.bootstrap, **USERS.client_settings("admin")})

    def produce(topic: str, *values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, partition=0)
        assert producer.flush(30) == 0

    for topic in ("granted-later", "seen-later", "revoked-read"):
        produce(topic, b"%s 0" % topic.encode(), b"%s 1" % topic.encode())
    m = alice_mount(mount_logfs, broker, tmp_path / "cache")
    path = {topic: m.path(topic, 0) for topic in names}
    for topic in ("granted-later", "granted-empty"):
        wait_for(lambda: read_or_errno(path[topic]) == errno.EACCES, 30, what=f"the refused read of {topic}")
    wait_for(lambda: read_or_errno(path["revoked-read"]) == b"revoked-read 0\nrevoked-read 1\n", 30,
             what="the readable topic")
    expect_errno(errno.ENOENT, os.stat, m.path("seen-later"))

    grant(admin, "granted-later", "READ")
    wait_for(lambda: read_or_errno(path["granted-later"]) == b"granted-later 0\ngranted-later 1\n", 30,
             what="READ granted while mounted to make the file read")
    grant(admin, "granted-empty", "READ")
    wait_for(lambda: read_or_errno(path["granted-empty"]) == b"", 30, what="READ granted on an empty topic")
    grant(admin, "seen-later", "DESCRIBE", "READ")
    wait_for(lambda: read_or_errno(path["seen-later"]) == b"seen-later 0\nseen-later 1\n", 30,
             what="DESCRIBE and READ granted while mounted to show the topic")

    cached = b"revoked-read 0\nrevoked-read 1\n"
    before = os.open(path["revoked-read"], os.O_RDONLY)  # (a reader open across the revocation)
    try:
        assert os.read(before, 1 << 20) == cached
        revoke(admin, "revoked-read", "READ")
        wait_for(lambda: read_or_errno(path["revoked-read"]) == errno.EACCES, 30,
                 what="a read at the end of a revoked topic to be EACCES")  # (the replica's fetch refused)
        produce("revoked-read", b"fresh 2")  # (after the broker applied the revocation: refused to her)
        expect_errno(errno.EACCES, os.read, before, 1 << 20)  # at its end: refused, not an idle empty read
        assert os.pread(before, 1 << 20, 0) == cached  # what was fetched before reads
        with open(path["revoked-read"], "rb") as f:  # a new open, too: the cached lines, then the refusal
            assert f.read(len(cached)) == cached
            expect_errno(errno.EACCES, f.read)
        assert m.getx("revoked-read/0", "log_end_offset") == "2"  # the fresh record is not fetched
        grant(admin, "revoked-read", "READ")
        wait_for(lambda: read_or_errno(path["revoked-read"]) == cached + b"fresh 2\n", 30,
                 what="READ granted again to bring the fresh record")
        assert os.read(before, 1 << 20) == b"fresh 2\n"
    finally:
        os.close(before)
    del producer, admin  # (their connections end before the broker does)

"""The replica's direct Fetch on secured clusters (CONTRACT.md section 15, "Reading";
logfs/storage/cluster/security.py): it logs in as the consumer does with the same ``-o kafka.*`` settings, and the batches it writes are the broker's.

One broker of this module's own (logfs/testing/kafka.py ``SaslUsers`` with ``scram`` and ``tls``): SASL_PLAINTEXT and
SASL_SSL listeners enabling PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (credentials written at format), an SSL listener
that requires a client certificate (``CN=alice`` is the user alice), a test CA and certificates made with ``openssl``
at test time, KRaft's ``StandardAuthorizer`` with nothing allowed where no ACL says so.

- On each protocol and mechanism (SASL_PLAINTEXT with PLAIN and with SCRAM-SHA-256, SASL_SSL with SCRAM-SHA-512, SSL
  with a client certificate whose key has a password) a mount as alice holds the broker's own batches, byte for
  byte, and its metrics count them as fetched directly; a topic she may DESCRIBE but not READ reads ``EACCES``.
- A session the broker gives a lifetime (``connections.max.reauth.ms`` on the SASL_SSL listener) is logged in again
  before the broker would close the connection: a Fetch after the lifetime is answered.
- A login the broker refuses on the direct Fetch (bob's SCRAM password changed while mounted: the consumer's
  connections logged in before, the Fetch's new one cannot): the partition goes to the consumer and reads through
  the mount, once warned; a partition new after it goes to the consumer too, with no second try (no second warning).
"""

from __future__ import annotations

import errno
import os
import time

import pytest
from confluent_kafka import Producer

from logfs.storage.format import records as rec
from logfs.testing.kafka import SaslUsers, TlsFiles, running_broker

from harness import wait_for
from test_kafka_store import kafka_mount, read
from test_kafka_store_authorization import read_or_errno
from test_kafka_store_direct import batches

pytestmark = pytest.mark.mount

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
RECORDS = 12_000
REFUSED = "the replica's direct Fetch: "
REAUTH_MS = 2000


def admin_client(broker):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap, **broker.sasl.client_settings("admin")})


def grant(admin, user: str, topic: str, *operations: str) -> None:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    acls = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}", "*",
                       AclOperation[op], AclPermissionType.ALLOW) for op in operations]
    for future in admin.create_acls(acls).values():
        future.result(30)


def create_topics(admin, *names: str) -> None:
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names], request_timeout=30).values():
        future.result(60)


def produce(broker, topic: str, values: list[bytes], codec: str = "lz4") -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, **broker.sasl.client_settings("admin"),
                         "compression.codec": codec, "linger.ms": 50, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=0)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    tls = TlsFiles.make(tmp_path_factory.mktemp("tls"), clients=("alice",))
    users = SaslUsers(dict(PASSWORDS), scram=True, tls=tls)
    # (SASL_SSL sessions last 2 s: a client logs in again, or the broker closes the connection at its next request)
    with running_broker(tmp_path_factory.mktemp("kafka-secured"), kafka_client, sasl=users,
                        settings={"listener.name.sasl_ssl.connections.max.reauth.ms": str(REAUTH_MS)}) as b:
        admin = admin_client(b)
        create_topics(admin, "cold", "unreadable")
        grant(admin, "alice", "cold", "DESCRIBE", "READ")
        grant(admin, "alice", "unreadable", "DESCRIBE")  # (listed, not fetched)
        values = [b"cold %06d " % i + b"c" * (i % 70) for i in range(RECORDS)]
        half = RECORDS // 2
        produce(b, "cold", values[:half], "zstd")
        produce(b, "cold", values[half:], "none")
        produce(b, "unreadable", [b"not for alice"])
        del admin  # (its connections end before the broker does)
        b.values = values
        yield b


def metric(path, name: str) -> int:
    if not os.path.exists(path):
        return -1
    for line in path.read_text().splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return -1


def settings_of(broker, protocol: str, mechanism: str | None, user: str) -> dict[str, str]:
    if protocol == "SSL":
        return {"security.protocol": "SSL", **broker.sasl.tls.client_settings(user)}
    settings = {**broker.sasl.client_settings(user), "security.protocol": protocol, "sasl.mechanism": mechanism}
    if protocol == "SASL_SSL":
        settings.update(broker.sasl.tls.client_settings())
    return settings


def secured_mount(mount_logfs, broker, protocol: str, mechanism: str | None, user: str, cache, metrics, name="m"):
    options = [f"kafka.{k}={v}" for k, v in settings_of(broker, protocol, mechanism, user).items()]
    return kafka_mount(mount_logfs, broker.bootstrap_for(protocol), name, cache, *options,
                       f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")


@pytest.mark.parametrize("protocol,mechanism", [("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
                                                ("SASL_SSL", "SCRAM-SHA-512"), ("SSL", None)])
def test_each_protocol_fetches_the_brokers_batches(mount_logfs, broker, tmp_path, protocol, mechanism):
    metrics = tmp_path / "metrics.prom"
    m = secured_mount(mount_logfs, broker, protocol, mechanism, "alice", tmp_path / "cache", metrics)
    want = b"".join(v + b"\n" for v in broker.values)
    wait_for(lambda: os.path.exists(m.path("cold", 0)) and read(m.path("cold", 0)) == want, 60,
             what="the mount to show every record")
    held = batches(tmp_path / "cache" / "replica" / "cold-0")
    assert held == batches(broker.log_dirs[0] / "cold-0")  # the broker's own bytes: the direct Fetch ran
    assert {rec.parse_header(b).compression for b in held} == {0, 4}
    wait_for(lambda: metric(metrics, "logfs_kafka_fetched_records_total") == RECORDS, 10, what="the metrics")
    assert metric(metrics, "logfs_kafka_direct_fetched_records_total") == RECORDS
    # READ denied: the Fetch's TOPIC_AUTHORIZATION_FAILED hands it to the consumer, whose refusal is EACCES.
    wait_for(lambda: read_or_errno(m.path("unreadable", 0)) == errno.EACCES, 30, what="the refused read")
    assert REFUSED not in m.stderr()


def test_a_refused_login_hands_over_to_the_consumer(mount_logfs, broker, tmp_path):
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = admin_client(broker)
    create_topics(admin, "before")
    grant(admin, "bob", "before", "DESCRIBE", "READ")
    first = [b"before %05d" % i for i in range(3000)]
    produce(broker, "before", first)
    metrics = tmp_path / "metrics.prom"
    m = secured_mount(mount_logfs, broker, "SASL_PLAINTEXT", "SCRAM-SHA-256", "bob", tmp_path / "cache", metrics)
    wait_for(lambda: os.path.exists(m.path("before", 0)) and read(m.path("before", 0)) == b"".join(
        v + b"\n" for v in first), 60, what="the first topic")
    assert batches(tmp_path / "cache" / "replica" / "before-0") == batches(broker.log_dirs[0] / "before-0")
    wait_for(lambda: metric(metrics, "logfs_kafka_direct_fetched_records_total") == len(first), 10,
             what="the metrics")

    # bob's password changes: the consumer's connections logged in before; a new login with the old one is refused.
    change = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"bob-new-secret")
    for future in admin.alter_user_scram_credentials([change]).values():
        future.result(30)
    later = {}
    for topic in ("after", "later"):
        create_topics(admin, topic)
        grant(admin, "bob", topic, "DESCRIBE", "READ")
        later[topic] = [b"%s %05d" % (topic.encode(), i) for i in range(3000)]
        produce(broker, topic, later[topic])
        wait_for(lambda: os.path.exists(m.path(topic, 0)) and read(m.path(topic, 0)) == b"".join(
            v + b"\n" for v in later[topic]), 60, what=f"{topic} through the consumer")
        held = batches(tmp_path / "cache" / "replica" / f"{topic}-0")
        assert held != batches(broker.log_dirs[0] / f"{topic}-0")  # (the consumer's batches, re-encoded)
        assert all(rec.parse_header(b).compression == 0 for b in held)
    assert metric(metrics, "logfs_kafka_direct_fetched_records_total") == len(first)
    refusals = [line for line in m.stderr().splitlines() if REFUSED in line]
    assert len(refusals) == 1, refusals  # (tried once: "later" went to the consumer without a second login)
    assert "SASL_AUTHENTICATION_FAILED" in refusals[0]
    del admin


def test_a_session_with_a_lifetime_logs_in_again(broker):
    from logfs.storage.cluster.fetch import Connection
    from logfs.storage.cluster.security import direct_security

    host, port = broker.bootstrap_for("SASL_SSL").split(":")
    connection = Connection(host, int(port), 10, direct_security(settings_of(broker, "SASL_SSL", "SCRAM-SHA-512",
                                                                            "alice")))
    try:
        assert connection.fetch({"cold": [(0, 0)]}, partition_max_bytes=1024)[("cold", 0)].error == 0
        time.sleep(REAUTH_MS / 1000 + 0.5)  # (past the session's lifetime: its next request would be refused)
        answer = connection.fetch({"cold": [(0, 0)]}, partition_max_bytes=1024)[("cold", 0)]
        assert answer.error == 0 and answer.high_watermark == RECORDS
    finally:
        connection.close()

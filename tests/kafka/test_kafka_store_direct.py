"""A ``kafka://`` mount catches a cold partition up with Kafka's own Fetch (CONTRACT.md section 15, "Reading";
logfs/storage/cluster/fetch.py): the batches the broker sends are the replica's, byte for byte.

- Records in every codec Kafka has (gzip, snappy, lz4, zstd, none), written by a producer before the mount: the
  replica's segments hold exactly the broker's batches (the same bytes: offsets, timestamps, compression, CRCs,
  leader epochs), cut into several segments at batch boundaries; the mount's file is what Kafka's consumer reads,
  with its positions; the metrics say those records came by the direct fetch.
- Once caught up, the partition goes on with the consumer: lines appended through the mount come through it (the
  direct count stays), and are read through the mount.
- Transactions (committed, aborted, markers) are not the direct fetch's: ``test_kafka_store.py``'s
  ``test_kafka_producer_records_read_through_the_mount`` reads a partition whose first batches come direct and whose
  transactional batches come through the consumer's ``read_committed``.
"""

from __future__ import annotations

import base64
import os
import random

import pytest
from confluent_kafka import Producer

from logfs.storage.format import records as rec
from logfs.testing.kafka import running_broker

from harness import wait_for
from test_kafka_store import kafka_mount, read

pytestmark = pytest.mark.mount

CODECS = ("gzip", "snappy", "lz4", "zstd", "none")


def batches(directory) -> list[bytes]:
    """Every batch of a partition directory's segments, in order, as bytes."""
    out = []
    for segment in sorted(p for p in os.listdir(directory) if p.endswith(".log")):
        with open(os.path.join(directory, segment), "rb") as f:
            buf = f.read()
        out += [bytes(buf[pos:pos + header.size]) for pos, header in rec.iter_headers(buf)]
    return out


@pytest.fixture(scope="module")
def kafka_broker(kafka_client, tmp_path_factory):
    """A broker of this module's own: the mount replicates every topic of its cluster, and the cache's bound (which
    makes the segments small here) is the replica's whole: other tests' topics would push this one's out."""
    with running_broker(tmp_path_factory.mktemp("direct-broker"), kafka_client) as broker:
        yield broker


def test_a_cold_partition_is_the_brokers_batches(mount_logfs, kafka_broker, kafka_client, tmp_path):
    kafka_client.create_topics(kafka_broker.bootstrap, [{"name": "cold", "partitions": 1, "replication_factor": 1,
                                                         "configs": {}}])
    values = []
    for codec in CODECS:  # a producer per codec: each one's batches compressed so
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "compression.codec": codec,
                             "linger.ms": 50, "batch.size": 262144, "acks": "all"})
        for i in range(15_000):
            value = b"%s %06d " % (codec.encode(), i) + base64.b64encode(random.randbytes(i % 90))
            values.append(value)
            producer.produce("cold", value, key=b"k%d" % (i % 7), partition=0, timestamp=1_700_000_000_000 + i)
            if i % 1000 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
    metrics = tmp_path / "metrics.prom"
    # (a bound of 8 MiB makes the replica's segments 1 MiB: the partition's ~4 MB roll several times)
    m = kafka_mount(mount_logfs, kafka_broker.bootstrap, "m", tmp_path / "cache", "logfs.remote.cache.bytes=8388608",
                    f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")
    want = b"".join(v + b"\n" for v in values)
    wait_for(lambda: os.path.exists(m.path("cold", 0)) and read(m.path("cold", 0)) == want, 60,
             what="the mount to show every record")

    # The replica holds the broker's own batches, cut at batch boundaries into several segments.
    replica = tmp_path / "cache" / "replica" / "cold-0"
    broker_dir = kafka_broker.log_dirs[0] / "cold-0"
    held = batches(replica)
    assert held == batches(broker_dir)
    assert {rec.parse_header(b).compression for b in held} == {0, 1, 2, 3, 4}
    assert len([p for p in os.listdir(replica) if p.endswith(".log")]) >= 3
    for segment in sorted(p for p in os.listdir(replica) if p.endswith(".log")):
        first = rec.parse_header((replica / segment).read_bytes())
        assert first.base_offset >= int(segment[:-4])  # (a segment starts at its name's offset or after)
    # Positions and offsets as on any mount.
    position = 0
    for offset, value in enumerate(values):
        if offset % 7919 == 0:
            assert m.getx("cold/0", f"position.{offset}") == str(position)
            assert m.getx("cold/0", f"offset.{position}") == str(offset)
        position += len(value) + 1
    assert m.getx("cold/0", "log_end_offset") == str(len(values))

    def metric(name: str) -> int:
        for line in metrics.read_text().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
        return -1

    wait_for(lambda: metric("logfs_kafka_fetched_records_total") == len(values), 10,
             what="the metrics to count the records")
    assert metric("logfs_kafka_direct_fetched_records_total") == len(values)

    # Caught up: the consumer goes on. Lines appended through the mount come back through it.
    more = [b"more %d" % i for i in range(300)]
    with open(m.path("cold", 0), "ab") as f:
        f.write(b"".join(line + b"\n" for line in more))
        f.flush()
        os.fsync(f.fileno())
    wait_for(lambda: read(m.path("cold", 0)) == want + b"".join(line + b"\n" for line in more), 30,
             what="the appended lines through the replica's consumer")
    wait_for(lambda: metric("logfs_kafka_fetched_records_total") == len(values) + len(more), 10,
             what="the metrics to count them")
    assert metric("logfs_kafka_direct_fetched_records_total") == len(values)
    assert [r.value for r in kafka_client.consume(kafka_broker.bootstrap, "cold", 0, offset=len(values))] == more


def produce(bootstrap: str, topic: str, values: list[bytes], **settings) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **settings})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=0)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def test_a_replica_that_ends_inside_a_batch_and_a_consumer_that_falls_behind(mount_logfs, kafka_broker,
                                                                              kafka_client, tmp_path):
    """The replica's end inside one of the broker's batches (written by the consumer, whose batches are its own):
    that batch's records from the end on are re-encoded, the batches after it are the broker's. Then the consumer
    made slow (fetches of 1 KiB) falls ``logfs.kafka.direct.fetch.lag`` behind on a burst: the Fetch catches the
    partition up, and the consumer goes on after it."""
    kafka_client.create_topics(kafka_broker.bootstrap, [{"name": "resumed", "partitions": 1,
                                                         "replication_factor": 1, "configs": {}}])
    values = [b"resumed %06d " % i + b"r" * (i % 50) for i in range(20_000)]
    produce(kafka_broker.bootstrap, "resumed", values, **{"linger.ms": 50, "batch.size": 1 << 20})
    broker_batches = batches(kafka_broker.log_dirs[0] / "resumed-0")
    assert rec.parse_header(broker_batches[0]).last_offset > 2048  # (the consumer's first batch ends inside it)
    cache = tmp_path / "cache"
    want = b"".join(v + b"\n" for v in values)

    # A replica written by the consumer alone, then cut after its first batch (2,048 records: inside the broker's).
    m = kafka_mount(mount_logfs, kafka_broker.bootstrap, "m", cache, "logfs.kafka.direct.fetch=false")
    wait_for(lambda: os.path.exists(m.path("resumed", 0)) and read(m.path("resumed", 0)) == want, 60,
             what="the consumer's replica")
    m.unmount()
    segment = cache / "replica" / "resumed-0" / ("%020d.log" % 0)
    first = rec.parse_header(segment.read_bytes())
    assert first.next_offset == 2048
    os.truncate(segment, first.size)

    metrics = tmp_path / "metrics.prom"
    m = kafka_mount(mount_logfs, kafka_broker.bootstrap, "m2", cache, "logfs.kafka.direct.fetch.lag=1000",
                    "kafka.max.partition.fetch.bytes=1024", f"logfs.metrics.file={metrics}",
                    "logfs.metrics.interval.ms=100")
    wait_for(lambda: read(m.path("resumed", 0)) == want, 60, what="the resumed replica")
    held = batches(cache / "replica" / "resumed-0")
    assert held[0] == segment.read_bytes()[:first.size]  # (the consumer's, kept)
    tail = rec.parse_header(held[1])
    assert (tail.base_offset, tail.last_offset) == (2048, rec.parse_header(broker_batches[0]).last_offset)
    assert [r.value for r in rec.decode(held[1])] == values[2048:tail.last_offset + 1]
    assert held[2:] == broker_batches[1:]

    def metric(name: str) -> int:
        for line in metrics.read_text().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
        return -1

    # (the module's broker holds the other test's topic too, which this mount fetches as well)
    wait_for(lambda: metric('logfs_kafka_replica_lag_offsets{topic="resumed",partition="0"}') == 0, 10,
             what="the metrics")
    direct = metric("logfs_kafka_direct_fetched_records_total")
    assert direct >= len(values) - 2048
    # A burst in small batches (~10 records each), which the consumer's 1 KiB fetches take one at a time.
    burst = [b"burst %06d " % i + b"b" * 80 for i in range(100_000)]
    produce(kafka_broker.bootstrap, "resumed", burst, **{"linger.ms": 5, "batch.size": 1024})
    want += b"".join(v + b"\n" for v in burst)
    wait_for(lambda: read(m.path("resumed", 0)) == want, 60, what="the burst")
    # (the consumer follows while the burst is produced, until it is 1,000 behind at a look: then the Fetch takes
    # at least those, and the consumer goes on after it; how the burst splits depends on the producer's pace)
    assert metric("logfs_kafka_direct_fetched_records_total") - direct >= 1000
    # After the catch-up, the consumer again: a line appended through the mount.
    with open(m.path("resumed", 0), "ab") as f:
        f.write(b"last\n")
        f.flush()
        os.fsync(f.fileno())
    wait_for(lambda: read(m.path("resumed", 0)) == want + b"last\n", 30, what="the appended line")

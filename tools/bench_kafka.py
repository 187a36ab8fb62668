"""The ``kafka`` scenario of tools/bench.py: logfs against Apache Kafka on the same data, in the same run.

One broker (logfs/testing/kafka.py: Kafka 4.2.2 from the set-up's jars, KRaft, one node, on 127.0.0.1) and a local
logfs mount, each given the same records: ``records`` values of 100 bytes (256 MiB of them; 8 MiB with
``--quick``), in one partition, uncompressed.

- **append**: ``cat`` of a file of those values as lines (100 bytes and a newline) into the partition file,
  closed (timed to ``close()``'s return), against Kafka's own ``kafka-producer-perf-test`` sending as many
  100-byte records with ``acks=all`` and ``enable.idempotence=true`` (the tool's own figure: its JVM's start is not
  in it), once with the producer's default batching and once with a bulk load's (``batch.size=262144``,
  ``linger.ms=20``): the better of the two is the reference. The same durability: neither fsyncs (logfs's ``close()`` returns with the records in its segments in the
  page cache; a one-node broker's ``acks=all`` answers once its leader has them in its page cache, Kafka's default
  ``flush.messages``). Figure: records/s.
- **read**: the partition read from its start, page cache dropped before each (``cat``'s 1 MiB reads of the file
  on a new mount; Kafka's ``kafka-consumer-perf-test``, its fetch rate: its group join is not in it). Figure:
  records/s.

Ratios are logfs over Kafka (above 1: logfs is faster). No target: the figures say where logfs stands against the
system whose format it writes. Without Kafka's jars (the set-up not run) the scenario is recorded as skipped.
"""

from __future__ import annotations

import os
import time

from logfs.testing.benchlib import drop_caches, mount_logfs, timed_shell, unmount

VALUE = 100  # bytes a record's value (a line without its newline)
DURABILITY = ("acks=all", "enable.idempotence=true")
BULK = ("batch.size=262144", "linger.ms=20")  # (Kafka's defaults: 16 KiB and 5 ms)
MiB = 1 << 20


def kafka(bench):
    from logfs.testing.kafka import KafkaClient, running_broker
    from logfs.testing.kafka_perf import consumer_perf, producer_perf
    from logfs.testing.kafka_setup import KafkaNotSetUp, jars_dir

    try:
        jars_dir()
    except KafkaNotSetUp as exc:
        bench.record("kafka", skipped=str(exc))
        return
    records = ((8 if bench.quick else 256) * MiB) // VALUE
    src = os.path.join(bench.work, "kafka-lines.txt")
    with open(src, "wb") as f:
        chunk = (b"v" * VALUE + b"\n") * 10_000
        for _ in range(records // 10_000):
            f.write(chunk)
        f.write((b"v" * VALUE + b"\n") * (records % 10_000))
    data, mnt = bench.dirs("kafka")
    client = KafkaClient(os.path.join(bench.work, "kafka-client")).start()
    try:
        with running_broker(os.path.join(bench.work, "kafka-broker"), client) as broker:
            broker.create_topic("t", 1)
            broker.create_topic("t2", 1)
            os.sync()
            # Kafka's producer as shipped, and with the batching a bulk load would use (the better figure
            # counts: the reference at its best).
            kafka_default = producer_perf(broker.bootstrap, "t", records, VALUE, *DURABILITY)["records_s"]
            kafka_append = max(kafka_default, producer_perf(broker.bootstrap, "t2", records, VALUE, *DURABILITY,
                                                            *BULK)["records_s"])
            mount_logfs(data, mnt, "num.partitions=1")
            try:
                os.mkdir(f"{mnt}/t")
                os.sync()
                logfs_append = records / timed_shell(f"cat {src} >> {mnt}/t/0")
            finally:
                unmount(mnt, data)
            dropped = drop_caches()
            kafka_read = consumer_perf(broker.bootstrap, "t", records, "bench-kafka")["fetch_records_s"]
            mount_logfs(data, mnt)
            try:
                dropped = drop_caches() and dropped
                started = time.perf_counter()
                lines = 0
                with open(f"{mnt}/t/0", "rb", buffering=0) as f:
                    while chunk := f.read(MiB):
                        lines += chunk.count(b"\n")
                logfs_read = records / (time.perf_counter() - started)
            finally:
                unmount(mnt, data)
            if lines != records:
                raise RuntimeError(f"the mount read {lines} lines of {records}")
    finally:
        client.close()
        os.unlink(src)
    bench.record("kafka", records=records, value_bytes=VALUE, append_per_s_logfs=logfs_append,
                 append_per_s_kafka=kafka_append, append_per_s_kafka_defaults=kafka_default,
                 append_ratio=logfs_append / kafka_append,
                 read_per_s_logfs=logfs_read, read_per_s_kafka=kafka_read, read_ratio=logfs_read / kafka_read,
                 page_cache_dropped=dropped)

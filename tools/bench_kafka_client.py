"""Which Python Kafka client the Kafka-backed mount produces with (issue 46): the produce rate of 100-byte
records, acks=all, idempotent, against one real broker (logfs.testing.kafka), for confluent-kafka (librdkafka) and
kafka-python, one after the other in the same run.

    PYTHONPATH=$PWD /work/main/.venv/bin/python tools/bench_kafka_client.py [--records 200000]

Each client sends ``--records`` records to a topic of its own and waits for every acknowledgement; the rate is
records over that time (the client's start included: it is part of what a mount pays once).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from logfs.testing.kafka import KafkaClient, running_broker

VALUE = b"x" * 99 + b"\n"


def confluent(bootstrap: str, topic: str, count: int) -> float:
    from confluent_kafka import Producer

    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    started = time.perf_counter()

    def done(err, _msg):
        if err is not None:
            errors.append(err)

    for _ in range(count):
        while True:
            try:
                producer.produce(topic, VALUE, partition=0, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush()
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    return count / elapsed


def kafka_python(bootstrap: str, topic: str, count: int) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5)
    started = time.perf_counter()
    futures = [producer.send(topic, VALUE, partition=0) for _ in range(count)]
    producer.flush()
    elapsed = time.perf_counter() - started
    for f in futures[-10:]:
        f.get(timeout=1)
    producer.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-kafka-client.") as tmp:
        client = KafkaClient(f"{tmp}/client").start()
        try:
            with running_broker(f"{tmp}/broker", client) as broker:
                for name, run in (("confluent-kafka", confluent), ("kafka-python", kafka_python)):
                    broker.create_topic(f"bench-{name}")
                    rate = run(broker.bootstrap, f"bench-{name}", opts.records)
                    print(f"{name:16s} {rate:10,.0f} records/s  ({rate * len(VALUE) / 1e6:.1f} MB/s of values)")
        finally:
            client.close()


if __name__ == "__main__":
    main()

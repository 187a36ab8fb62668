"""The session's Kafka broker (logfs/testing/kafka.py) works: a topic created with Kafka's admin client, records
from Kafka's idempotent and transactional producers, read back by Kafka's consumer under read_committed (aborted
records and transaction markers are never records) and read_uncommitted, ListOffsets by timestamp; stopped cleanly
and started again on the same directories. And logfs-dump-log-segments prints, for the segments the broker wrote,
what Kafka's DumpLogSegments prints."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness import daemon_env, mounted_at

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "smoke"


def record(i: int, ts: int, **extra) -> dict:
    return {"topic": TOPIC, "partition": 0, "key": b"key-%d" % (i % 3), "value": "value %d é".encode() % i,
            "headers": [("trace", b"%d" % i), ("empty", None)], "timestamp": ts, **extra}


def produced(client, bootstrap: str, t0: int) -> tuple[list, list]:
    """Records produced three ways; returns (what read_committed must read, what read_uncommitted adds)."""
    plain = [record(i, t0 + i) for i in range(5)] + [dict(record(5, t0 + 5), value=None)]  # a tombstone
    sent = client.produce(bootstrap, plain, enable_idempotence="true", compression_type="zstd", linger_ms="5")
    committed = [record(10 + i, t0 + 10 + i) for i in range(3)]
    aborted = [record(20 + i, t0 + 20 + i) for i in range(2)]
    after = [record(30, t0 + 30)]
    txn = client.produce(bootstrap, [{"txn": "begin"}, *committed, {"txn": "commit"},
                                     {"txn": "begin"}, *aborted, {"txn": "abort"},
                                     {"txn": "begin"}, *after, {"txn": "commit"}],
                         transactional_id="smoke-tx", compression_type="gzip")
    offsets = [s["offset"] for s in sent + txn]
    assert offsets == sorted(offsets) and offsets[:6] == list(range(6))
    for r, s in zip(plain + committed + aborted + after, sent + txn):
        r["offset"] = s["offset"]
    return plain + committed + after, aborted


def as_consumed(records: list) -> list:
    return [(r["offset"], r["timestamp"], "CreateTime", r["key"], r["value"], r["headers"]) for r in records]


def test_broker_serves_kafkas_clients_and_restarts(kafka_broker, kafka_client, tmp_path):
    broker, client = kafka_broker, kafka_client
    topic_id = broker.create_topic(TOPIC, 1, {"segment.bytes": "1048576"})
    assert len(topic_id) == 22
    t0 = int(time.time() * 1000) - 60_000
    committed, aborted = produced(client, broker.bootstrap, t0)
    # commitTransaction returns before the coordinator has written the markers: wait for the last stable offset.
    end = committed[-1]["offset"] + 2  # (the last record, then its COMMIT marker)
    deadline = time.monotonic() + 30
    while client.list_offsets(broker.bootstrap, TOPIC, 0)["latest"] < end:
        assert time.monotonic() < deadline, "the last transaction's markers were not written in 30 s"
        time.sleep(0.05)

    def consumed(isolation: str) -> list:
        return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)
                for r in client.consume(broker.bootstrap, TOPIC, 0, isolation=isolation)]

    assert consumed("read_committed") == as_consumed(committed)
    everything = sorted(committed + aborted, key=lambda r: r["offset"])
    assert consumed("read_uncommitted") == as_consumed(everything)
    offsets = client.list_offsets(broker.bootstrap, TOPIC, 0, timestamps=[0, t0 + 3, t0 + 21, t0 + 10**9])
    assert offsets["earliest"] == 0 and offsets["latest"] == end
    # A transaction marker is a record with the coordinator's time (now): Kafka's ListOffsets finds the COMMIT
    # after the first transaction for any time past the records before it.
    commit_marker = committed[-2]["offset"] + 1
    assert [o and o["offset"] for o in offsets["by_timestamp"]] == [0, 3, commit_marker, None]
    assert offsets["max_timestamp"]["timestamp"] >= t0 + 30  # (the markers carry the coordinator's time)

    # A clean stop, then the same node on the same directories: the same records.
    status = broker.stop()
    assert status in (0, 143) and not broker.running  # (143: the JVM's exit status after SIGTERM)
    assert all((d / ".kafka_cleanshutdown").exists() for d in broker.log_dirs)
    partition = broker.log_dirs[0] / f"{TOPIC}-0"
    files = [str(p) for p in sorted(partition.iterdir()) if p.suffix in (".log", ".index", ".timeindex")]
    # Kafka's own segments (idempotent and transactional batches, control markers, producer codecs): logfs's tool
    # prints what Kafka's prints.
    for options in ([], ["--deep-iteration", "--print-data-log"], ["--verify-index-only"]):
        kafka = client.dump(["--files", ",".join(files), *options])
        r = subprocess.run([sys.executable, "-m", "logfs.tools.dump", "--files", ",".join(files), *options],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert (r.stdout, r.stderr) == (kafka["stdout"], kafka["stderr"]), options
        if "--print-data-log" in options:
            assert "endTxnMarker: ABORT" in r.stdout and "compresscodec: zstd" in r.stdout
    broker.start()
    assert consumed("read_committed") == as_consumed(committed)


def test_a_running_brokers_log_directory_is_refused(kafka_broker, tmp_path):
    """Kafka's broker holds .lock with a POSIX record lock (FileChannel.tryLock), which flock() does not see: a
    read-write mount of its log directory must fail clearly, and leave the directory as it was."""
    log_dir = kafka_broker.log_dirs[0]
    before = sorted(p.name for p in log_dir.iterdir())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run([sys.executable, "-m", "logfs.cli", str(log_dir), str(mnt)], capture_output=True,
                            text=True, timeout=60, env=daemon_env())
    if mounted_at(mnt):  # (the failure this test is about: never leave a mount behind over the broker's directory)
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    assert result.returncode != 0
    assert "in use by another process, a Kafka broker perhaps" in result.stderr, result.stderr
    assert sorted(p.name for p in log_dir.iterdir()) == before
    assert not mounted_at(mnt)

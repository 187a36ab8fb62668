"""logfs reads a broker's log directory (CONTRACT.md section 13, second bullet; issue 43).

The session's Kafka broker gets topics written by Kafka's own producers: idempotent and transactional (commits, and
aborts whose records lie among other producers' records and in earlier segments than their markers), every codec
(on the producer, and as a topic's ``compression.type`` that makes the broker recompress), keys, headers,
tombstones, a ``LogAppendTime`` topic, a compacted topic the broker's cleaner has cleaned, several partitions each.
What a ``read_committed`` consumer reads from each partition, and ListOffsets by timestamp for a sample of times,
are recorded, and the broker stops (the module's fixture ``written``). Then:

- the ``logfs`` Spark source over the broker's directory returns the consumer's records (a test of its own: the
  Spark session, shared with tests/spark, is what takes time here), and with ``kafka.isolation.level`` set to
  ``read_uncommitted`` a ``read_uncommitted`` consumer's;
- Spark's own Kafka source, from the broker started again on the directory, returns the rows the ``logfs`` source
  returns over it (where set-up resolved Spark's Kafka connector: tests/kafka/spark_kafka.py);
- logfs mounts the directory and, through real syscalls on the mount: the topics and partitions are listed
  (Kafka's internal topics are not); each partition file is the consumer's records as lines;
  ``user.logfs.log_start_offset``/``log_end_offset`` are Kafka's earliest and latest offsets; ``position.`` of
  every offset leads to its record's line (or the next line, for an aborted record, a marker or a record the
  cleaner removed) and ``offset.`` of every byte of a line back to its record; ``time.<ts>`` is Kafka's ListOffsets
  by timestamp (a transaction marker is a record with the coordinator's time, and counts, as in Kafka);
- the topic setting ``logfs.isolation.level=read_uncommitted`` (by ``setfattr``, kept across a remount, or for the
  whole mount by ``-o``) shows what a ``read_uncommitted`` consumer reads (the aborted records too, never the
  markers), with the same xattr checks; set back to ``read_committed`` the files are the committed records again;
  any other value is ``EINVAL``;
- after the unmount, the checkpoint files still name every partition the broker named (Kafka's internal topics,
  which logfs does not serve, included), the clean-shutdown marker still holds the broker's epoch, the indexes
  logfs rebuilt pass Kafka's DumpLogSegments checks, and the broker, started again on the directory, serves the
  same records and the same ListOffsets answers, and its controller sees a clean restart.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from logfs.testing.kafka import running_broker

from harness import mounted_at, wait_for
from spark_kafka import logfs_source_rows

pytestmark = pytest.mark.mount

SEP = b"="
NULL = b"<tombstone>"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# name -> (partitions, topic configs). Small segments through internal.segment.bytes: Kafka 4's segment.bytes is at
# least 1 MiB.
TOPICS = {
    "bd-codecs": (len(CODECS), {}),
    "bd-topic-zstd": (2, {"compression.type": "zstd"}),
    "bd-txn": (2, {"internal.segment.bytes": "1024"}),
    "bd-append-time": (2, {"message.timestamp.type": "LogAppendTime", "internal.segment.bytes": "2048"}),
    "bd-compact": (2, {"cleanup.policy": "compact", "internal.segment.bytes": "1024",
                       "min.cleanable.dirty.ratio": "0.01", "segment.ms": "100", "min.compaction.lag.ms": "0"}),
}
TRANSACTIONAL = [("bd-txn", 0), ("bd-txn", 1), ("bd-append-time", 0), ("bd-compact", 0)]
INTERNAL = ("__consumer_offsets", "__transaction_state", "__cluster_metadata")


# -- what the producers send ---------------------------------------------------------------------------------
class Script:
    """The entries of one produce command (several producers taking turns), with a timestamp for each record."""

    def __init__(self, t0: int):
        self.entries: list[dict] = []
        self.t = t0
        self.n = 0

    def rec(self, producer: str, topic: str, partition: int, value: bytes | None, key: bytes | None = None,
            headers=()) -> None:
        self.t += 37
        self.n += 1
        self.entries.append({"producer": producer, "topic": topic, "partition": partition, "key": key,
                             "value": value, "headers": list(headers), "timestamp": self.t})

    def txn(self, producer: str, what: str) -> None:
        self.entries.append({"producer": producer, "txn": what})


def value(topic: str, partition: int, what: str, i: int, pad: int = 0) -> bytes:
    """A line's text; ``pad`` characters of hex that compress little (segments fill, and roll)."""
    text = f"{topic}/{partition} {what} {i} é"
    noise = "".join(hashlib.blake2b(f"{text}{j}".encode()).hexdigest() for j in range(pad // 128 + 1))
    return f"{text} {noise[:pad]}".encode()


def script(t0: int) -> Script:
    s = Script(t0)
    # Every codec from the producer (one partition each), keys (some records without), headers.
    for p, codec in enumerate(CODECS):
        for i in range(40):
            key = None if i % 7 == 0 else b"k%d" % (i % 5)
            s.rec(codec, "bd-codecs", p, value("bd-codecs", p, codec, i, pad=i % 13), key,
                  [("trace", b"%d" % i), ("empty", None)])
    # The topic's codec over the producer's: the broker recompresses (from none, and from gzip).
    for i in range(30):
        for p, producer in enumerate(("none", "gzip")):
            s.rec(producer, "bd-topic-zstd", p, value("bd-topic-zstd", p, producer, i), b"k%d" % (i % 3))
    # Transactions among an idempotent producer's records; the first abort spans several segments.
    for p in (0, 1):
        for i in range(5):
            s.rec("plain", "bd-txn", p, value("bd-txn", p, "plain", i), b"p%d" % i)
    s.txn("tx", "begin")
    for p in (0, 1):
        for i in range(4):
            s.rec("tx", "bd-txn", p, value("bd-txn", p, "ABORTED first", i), b"t%d" % i)
    for p in (0, 1):
        for i in range(3):
            s.rec("plain", "bd-txn", p, value("bd-txn", p, "plain among", i), None)
    for i in range(30):
        s.rec("tx", "bd-txn", i % 2, value("bd-txn", i % 2, "ABORTED long", i, pad=120), b"t%d" % i,
              [("h", b"x")])
    s.rec("tx", "bd-append-time", 0, value("bd-append-time", 0, "ABORTED", 0), b"a")
    s.rec("tx", "bd-compact", 0, value("bd-compact", 0, "ABORTED", 0), b"c1")
    s.txn("tx", "abort")
    s.txn("tx", "begin")
    for p in (0, 1):
        for i in range(6):
            s.rec("tx", "bd-txn", p, value("bd-txn", p, "committed", i), b"c%d" % i)
    s.rec("tx", "bd-append-time", 0, value("bd-append-time", 0, "committed", 0), b"a")
    s.rec("tx", "bd-compact", 0, value("bd-compact", 0, "committed", 0), b"c2")
    s.txn("tx", "commit")
    # Two transactions open at once, taking turns with each other and with the idempotent producer.
    def on_both(producer: str, what: str, i: int, key: bytes) -> None:  # one record in each bd-txn partition
        for p in (0, 1):
            s.rec(producer, "bd-txn", p, value("bd-txn", p, what, i), key)

    s.txn("tx2", "begin")
    on_both("tx2", "ABORTED second", 0, b"u")
    s.txn("tx", "begin")
    on_both("tx", "committed second", 0, b"v")
    for p in (0, 1):
        s.rec("tx2", "bd-txn", p, value("bd-txn", p, "ABORTED second", 1), b"u")
        s.rec("plain", "bd-txn", p, value("bd-txn", p, "plain between", 0), b"w")
    s.txn("tx", "commit")
    on_both("tx2", "ABORTED second", 2, b"u")
    s.txn("tx2", "abort")
    on_both("plain", "plain after", 0, b"z")
    # LogAppendTime: the broker's time replaces the producer's.
    for i in range(40):
        for p in (0, 1):
            s.rec("snappy", "bd-append-time", p, value("bd-append-time", p, "appended", i, pad=i * 3), b"k%d" % i,
                  [("n", b"%d" % i)])
    # Compaction: keys updated again and again, a few deleted (tombstones stay: delete.retention.ms is a day).
    for round_ in range(8):
        for p in (0, 1):
            for k in range(6):
                deleted = round_ == 7 and k == 3
                s.rec("gzip", "bd-compact", p, None if deleted else value("bd-compact", p, f"v{round_}", k, pad=40),
                      b"key%d" % k)
    return s


PRODUCERS = {
    **{codec: {"compression_type": codec, "batch_size": "600"} for codec in CODECS},
    "plain": {"compression_type": "snappy"},
    "tx": {"transactional_id": "bd-tx", "compression_type": "lz4", "batch_size": "700"},
    "tx2": {"transactional_id": "bd-tx2"},
}


# -- what Kafka reads --------------------------------------------------------------------------------------
@dataclass
class Partition:
    topic: str
    partition: int
    records: list = field(default_factory=list)  # ConsumedRecord, read_committed
    earliest: int = 0
    latest: int = 0
    times: dict = field(default_factory=dict)  # timestamp -> Kafka's offset (None: no record at or after it)

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.partition}"


def line(record) -> bytes:
    body = NULL if record.value is None else record.value
    return (record.key + SEP + body if record.key is not None else body) + b"\n"


def sample_times(records, around: list[int]) -> list[int]:
    """Times to look up: before everything, each of a few records' own times and one past them, the times the
    producers ran (transaction markers carry the coordinator's time), and the far future."""
    stamps = sorted({r.timestamp for r in records})
    picked = stamps[:: max(1, len(stamps) // 6)] + stamps[-1:]
    return sorted({0, *picked, *(t + 1 for t in picked), *around, 1 << 50})


def read_txn_indexes(partition_dir: Path) -> list[tuple[int, int, int]]:
    """(producer id, first offset, marker offset) of every aborted transaction in the partition's .txnindex files
    (Kafka's TransactionIndex: 34-byte entries)."""
    out = []
    for path in sorted(partition_dir.glob("*.txnindex")):
        data = path.read_bytes()
        for at in range(0, len(data) - 33, 34):
            _, pid, first, last, _ = struct.unpack_from(">hqqqq", data, at)
            out.append((pid, first, last))
    return out


def segment_of(partition_dir: Path, offset: int) -> int:
    bases = sorted(int(p.name[:20]) for p in partition_dir.glob("*.log"))
    return max(b for b in bases if b <= offset)


def read_checkpoint(path: Path) -> dict:
    lines = path.read_text().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, f"{path} is not a Kafka checkpoint file"
    return {(t, int(p)): int(o) for t, p, o in (x.split() for x in lines[2:])}


def truth_by_time(dumped: list[dict], earliest: int, timestamp: int) -> int | None:
    """The first offset at or after ``earliest`` of a record of any kind (transaction markers and aborted records
    too: Kafka's lookup walks every batch) whose timestamp is at or after ``timestamp``, from Kafka's own dump."""
    found = [r["offset"] for r in dumped if r["offset"] >= earliest and r["timestamp"] >= timestamp]
    return min(found) if found else None


# -- the Spark part (tests/kafka/conftest.py: tests/spark's session, and Spark's own Kafka source) ----------
def spark_rows(session, log_dir: Path, **options: str) -> dict[tuple[str, int], list]:
    return logfs_source_rows(session, log_dir, TOPICS, **options)


def as_rows(records) -> list:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in records]


# -- the tests -------------------------------------------------------------------------------------------------
@dataclass
class Written:
    """What the broker wrote, as Kafka's clients and tools saw it before it stopped."""
    broker: object
    partitions: list
    kafka: dict  # (topic, partition) -> Partition
    uncommitted: dict  # (topic, partition) -> Partition, what a read_uncommitted consumer read
    dumped: dict  # (topic, partition) -> Kafka's DumpLogSegments records, every kind, in offset order
    checkpoints: dict  # checkpoint file -> its entries
    marker: bytes  # .kafka_cleanshutdown
    seconds: float

    @property
    def log_dir(self) -> Path:
        return self.broker.log_dirs[0]


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory, kafka_client):
    """A broker of this module's own, on a fresh log directory (the session's, once restarted by the hand-over
    test, left a transactional produce here without a reply for 120 s in a whole tests/kafka run; alone it never
    did: not understood yet). Stopped at the module's end."""
    with running_broker(tmp_path_factory.mktemp("kafka-broker-bd"), kafka_client) as broker:
        yield broker


@pytest.fixture(scope="module")
def written(module_broker, kafka_client, kafka_dump):
    """The module's broker gets the topics, what Kafka's consumer and ListOffsets answer is recorded, and the
    broker stops (cleanly). It runs again afterwards."""
    broker, client = module_broker, kafka_client
    log_dir = broker.log_dirs[0]
    partitions = [(t, p) for t, (n, _) in TOPICS.items() for p in range(n)]
    began = time.monotonic()
    client.create_topics(broker.bootstrap, [{"name": t, "partitions": n, "replication_factor": 1, "configs": c}
                                            for t, (n, c) in TOPICS.items()])
    t0 = int(time.time() * 1000) - 3_600_000  # producers stamp their records an hour back (CreateTime)
    entries = script(t0)
    around = [int(time.time() * 1000)]
    sent = client.produce(broker.bootstrap, entries.entries, producers=PRODUCERS, enable_idempotence="true",
                          linger_ms="0")
    around.append(int(time.time() * 1000))
    assert len(sent) == entries.n
    client.commit_offsets(broker.bootstrap, "bd-group", {("bd-codecs", 0): 7})  # (records in __consumer_offsets)

    # commitTransaction and abortTransaction return before the coordinator has written every marker: wait until
    # the last stable offset is the high watermark (no transaction open).
    def settled():
        return all(client.list_offsets(broker.bootstrap, t, p)["latest"]
                   == client.list_offsets(broker.bootstrap, t, p, isolation="read_uncommitted")["latest"]
                   for t, p in TRANSACTIONAL)

    wait_for(settled, 30, interval=0.1, what="the transaction markers")

    # The broker's cleaner has cleaned the compacted topic up to its active segments.
    def cleaned():
        path = log_dir / "cleaner-offset-checkpoint"
        done = read_checkpoint(path) if path.exists() else {}
        return all(done.get(("bd-compact", p), -1) >= max(int(f.name[:20]) for f in
                                                          (log_dir / f"bd-compact-{p}").glob("*.log"))
                   for p in range(2))

    wait_for(cleaned, 60, interval=0.1, what="Kafka's cleaner")
    consumed = client.consume_partitions(broker.bootstrap, partitions)
    everything = client.consume_partitions(broker.bootstrap, partitions, isolation="read_uncommitted")
    kafka = {}
    for t, p in partitions:
        kafka[(t, p)] = view = Partition(t, p, consumed[(t, p)])
        times = sample_times(view.records, around)
        listed = client.list_offsets(broker.bootstrap, t, p, times)
        view.earliest, view.latest = listed["earliest"], listed["latest"]
        view.times = {ts: (o and o["offset"]) for ts, o in zip(times, listed["by_timestamp"])}

    broker.stop()
    try:
        marker = (log_dir / ".kafka_cleanshutdown").read_bytes()
        assert b'"brokerEpoch"' in marker  # (Kafka's CleanShutdownFileHandler)
        checkpoints = {name: read_checkpoint(log_dir / name) for name in
                       ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                        "cleaner-offset-checkpoint")}
        files = {tp: sorted(str(f) for f in (log_dir / f"{tp[0]}-{tp[1]}").glob("*.log")) for tp in partitions}
        dump = kafka_dump.print_data([f for names in files.values() for f in names])
        assert not dump.problems, dump.problems
        dumped = {tp: sorted((r for f in files[tp] for r in dump.files[f].records), key=lambda r: r["offset"])
                  for tp in partitions}
        # A read_uncommitted consumer: the same offsets, times and ListOffsets answers (nothing is open in a stopped
        # broker's log, so the last stable offset is the log end), and the aborted records too.
        uncommitted = {tp: dataclasses.replace(kafka[tp], records=everything[tp]) for tp in partitions}
        check_what_was_written(kafka, dumped, log_dir, uncommitted)
        yield Written(broker, partitions, kafka, uncommitted, dumped, checkpoints, marker, time.monotonic() - began)
    finally:
        if not broker.running:
            broker.start()


def test_the_spark_source_reads_what_kafkas_consumer_reads(written, spark):
    """``spark.read.format("logfs")`` over the broker's log directory (the broker stopped; before logfs mounted
    it): the rows of a ``read_committed`` consumer, with their timestamps (CreateTime, LogAppendTime) and headers."""
    if written.broker.running:  # (the other test ran first, and started it again)
        written.broker.stop()
    rows = spark_rows(spark, written.log_dir)
    for tp in written.partitions:
        assert rows.get(tp, []) == as_rows(written.kafka[tp].records), tp


def test_the_spark_source_reads_uncommitted_as_kafkas_consumer_does(written, spark):
    """The ``logfs`` source's option ``kafka.isolation.level`` (Spark's Kafka source passes it to its consumer):
    ``read_uncommitted`` gives a ``read_uncommitted`` consumer's rows (aborted records too), ``read_committed`` the
    default's; another value fails the query."""
    if written.broker.running:
        written.broker.stop()
    rows = spark_rows(spark, written.log_dir, **{"kafka.isolation.level": "read_uncommitted"})
    for tp in written.partitions:
        assert rows.get(tp, []) == as_rows(written.uncommitted[tp].records), tp
    rows = spark_rows(spark, written.log_dir, **{"kafka.isolation.level": "READ_COMMITTED"})
    assert rows[("bd-txn", 0)] == as_rows(written.kafka[("bd-txn", 0)].records)
    with pytest.raises(Exception, match="kafka.isolation.level must be read_committed or read_uncommitted"):
        spark_rows(spark, written.log_dir, **{"kafka.isolation.level": "committed"})


ISOLATION = "user.logfs.config.logfs.isolation.level"


def test_the_isolation_level_setting(written, mount_logfs):
    """``logfs.isolation.level`` on a broker's log directory (CONTRACT section 13): ``read_uncommitted`` shows what
    a ``read_uncommitted`` consumer reads, in the files and the ``offset.``/``position.``/``time.`` xattrs, set per
    topic (``setfattr``, kept across a remount) or for the whole mount (``-o``); ``read_committed`` shows the
    committed records again; any other value is EINVAL and changes nothing."""
    broker, kafka, uncommitted = written.broker, written.kafka, written.uncommitted
    if broker.running:
        broker.stop()
    txn_topics = sorted({t for t, _ in TRANSACTIONAL})
    fs = mount_logfs("log.retention.ms=-1", prepare=lambda m: setattr(m, "source", str(written.log_dir)))
    try:
        for t in TOPICS:
            os.setxattr(fs.path(t), "user.logfs.config.logfs.key.separator", SEP)
            os.setxattr(fs.path(t), "user.logfs.config.logfs.null.marker", NULL)
        assert os.getxattr(fs.path("bd-txn"), ISOLATION) == b"read_committed"  # (the default)
        before = fs.read("bd-txn/0")
        for bad in (b"", b"read_committed_x", b"uncommitted", b"read uncommitted", b"\xff"):
            with pytest.raises(OSError) as refused:
                os.setxattr(fs.path("bd-txn"), ISOLATION, bad)
            assert refused.value.errno == errno.EINVAL, bad
        assert os.getxattr(fs.path("bd-txn"), ISOLATION) == b"read_committed" and fs.read("bd-txn/0") == before
        held = open(fs.path("bd-txn", 0), "rb")  # (open across the change)
        began = time.monotonic()
        for t in txn_topics:
            os.setxattr(fs.path(t), ISOLATION, b" Read_Uncommitted")  # (trimmed, any case: Kafka's parsing)
            assert os.getxattr(fs.path(t), ISOLATION) == b"read_uncommitted"
        switched = time.monotonic() - began
        with held:  # a file open before the change keeps the view it opened with; a new open has the new one
            assert held.read() == before and os.fstat(held.fileno()).st_size == len(before)
        for tp in TRANSACTIONAL:
            check_partition(fs, uncommitted[tp], written.dumped[tp])
        assert fs.read("bd-txn/0") != before
        for tp in written.partitions:  # (topics without transactions, or without the setting: as before)
            if tp[0] not in txn_topics:
                assert fs.read(f"{tp[0]}/{tp[1]}") == b"".join(line(r) for r in kafka[tp].records), tp

        fs.remount()  # the setting is kept, as the other topic settings
        assert os.getxattr(fs.path("bd-txn"), ISOLATION) == b"read_uncommitted"
        check_partition(fs, uncommitted[("bd-txn", 1)], written.dumped[("bd-txn", 1)])
        for t in txn_topics:  # back to read_committed: the committed records again
            os.setxattr(fs.path(t), ISOLATION, b"read_committed")
        for tp in TRANSACTIONAL:
            check_partition(fs, kafka[tp], written.dumped[tp])
        for t in txn_topics:
            os.removexattr(fs.path(t), ISOLATION)

        # For the whole mount: -o (a topic's own setting would win).
        fs.remount("log.retention.ms=-1", "logfs.isolation.level=read_uncommitted")
        assert os.getxattr(fs.path("bd-txn"), ISOLATION) == b"read_uncommitted"
        for tp in TRANSACTIONAL:
            check_partition(fs, uncommitted[tp], written.dumped[tp])
        os.setxattr(fs.path("bd-txn"), ISOLATION, b"read_committed")
        check_partition(fs, kafka[("bd-txn", 0)], written.dumped[("bd-txn", 0)])
        os.removexattr(fs.path("bd-txn"), ISOLATION)
    finally:
        if mounted_at(fs.mnt):
            fs.unmount()
    counts = ", ".join(f"{t}/{p} {len(uncommitted[(t, p)].records)} records ({len(kafka[(t, p)].records)} "
                       f"read_committed)" for t, p in TRANSACTIONAL)
    print(f"\nread_uncommitted: {counts}; setfattr of {len(txn_topics)} topics (their aborted batches measured): "
          f"{switched:.2f} s")
    # (The broker stays stopped: the next test checks the clean-shutdown marker its stop wrote; the fixture starts
    # it again at the end.)


def test_logfs_mounts_a_brokers_log_directory(written, kafka_client, kafka_dump, mount_logfs):
    broker, client, log_dir, kafka = written.broker, kafka_client, written.log_dir, written.kafka
    partitions = written.partitions
    if broker.running:
        broker.stop()
    began = time.monotonic()
    fs = mount_logfs("log.retention.ms=-1", prepare=lambda m: setattr(m, "source", str(log_dir)))
    try:
        mounted = time.monotonic()
        listed = set(os.listdir(fs.mnt))
        assert set(TOPICS) <= listed and not listed & set(INTERNAL)
        for t, (n, _) in TOPICS.items():
            assert sorted(os.listdir(fs.path(t)), key=int) == [str(p) for p in range(n)]
            os.setxattr(fs.path(t), "user.logfs.config.logfs.key.separator", SEP)
            os.setxattr(fs.path(t), "user.logfs.config.logfs.null.marker", NULL)
        for tp in partitions:
            check_partition(fs, kafka[tp], written.dumped[tp])
        checked = time.monotonic()
        fs.unmount()

        # -- what logfs left in the directory ------------------------------------------------------------------
        after = {name: read_checkpoint(log_dir / name) for name in written.checkpoints}
        for name, entries in written.checkpoints.items():
            # Every partition the broker named is still named, with the same offset (nothing was appended or
            # deleted): Kafka's internal topics too, which logfs does not serve.
            assert {k: after[name].get(k) for k in entries} == entries, name
        assert {k for k in written.checkpoints["recovery-point-offset-checkpoint"] if k[0] in INTERNAL} >= {
            ("__consumer_offsets", 0), ("__transaction_state", 0)}
        for tp in partitions:
            assert after["recovery-point-offset-checkpoint"][tp] == kafka[tp].latest
        # The clean-shutdown marker still holds the broker's epoch, for its controller.
        assert (log_dir / ".kafka_cleanshutdown").read_bytes() == written.marker
        for name in ("meta.properties", "bootstrap.checkpoint", "replication-offset-checkpoint"):
            assert (log_dir / name).exists(), name
        # The indexes logfs rebuilt (its view needs a .viewindex beside each segment) pass Kafka's own checks.
        indexes = [str(f) for tp in partitions for f in (log_dir / f"{tp[0]}-{tp[1]}").iterdir()
                   if f.suffix in (".index", ".timeindex")]
        for verified in kafka_dump.verify_indexes(indexes):
            assert not verified.problems and verified.status == 0, verified.problems
    finally:
        if mounted_at(fs.mnt):
            fs.unmount()
        log_seen = broker.log_file.stat().st_size
        broker.start()  # (the session's broker: the tests after this one find it running)

    # -- the broker again, on the directory logfs mounted -----------------------------------------------------
    restarted = time.monotonic()
    again = client.consume_partitions(broker.bootstrap, partitions)
    for tp in partitions:
        assert as_rows(again[tp]) == as_rows(kafka[tp].records), tp
        view = kafka[tp]
        listed = client.list_offsets(broker.bootstrap, tp[0], tp[1], list(view.times))
        assert (listed["earliest"], listed["latest"]) == (view.earliest, view.latest), tp
        assert [o and o["offset"] for o in listed["by_timestamp"]] == list(view.times.values()), tp
    # The broker's controller took the restart for the clean one it was (the marker kept the broker's epoch).
    with open(broker.log_file, "rb") as f:
        f.seek(log_seen)
        log = f.read().decode(errors="replace")
    assert "handleBrokerUncleanShutdown" not in log
    assert "since clean shutdown file was found" in log  # (LogManager: no recovery needed)
    ended = time.monotonic()
    print(f"\nrecords: {figures(kafka, written.dumped)}")
    print(f"seconds: produce, consume, stop, dump {written.seconds:.1f}; mount {mounted - began:.1f}; checks through "
          f"the mount {checked - mounted:.1f}; unmount, checkpoints, Kafka's index checks, restart "
          f"{restarted - checked:.1f}; consume and ListOffsets again {ended - restarted:.1f}")


def check_what_was_written(kafka: dict, dumped: dict, log_dir: Path, uncommitted: dict) -> None:
    """The broker's log holds every kind this test is about (else the checks through the mount prove little)."""
    for p in range(2):
        records, log = kafka[("bd-txn", p)].records, dumped[("bd-txn", p)]
        markers = [r["control"].split()[1] for r in log if r["isControl"]]
        assert markers.count("ABORT") == 2 and markers.count("COMMIT") == 2, markers
        aborted = [r["offset"] for r in log if r["payload"] and "ABORTED" in r["payload"]]
        assert len(aborted) > 15 and not {r.offset for r in records} & set(aborted)
        # read_uncommitted: the aborted records too, and every committed one, in offset order
        everything = uncommitted[("bd-txn", p)].records
        assert {r.offset for r in everything} == {r.offset for r in records} | set(aborted)
        assert [r.offset for r in everything] == sorted(r.offset for r in everything)
        directory = log_dir / f"bd-txn-{p}"
        txns = read_txn_indexes(directory)
        assert len(txns) == 2
        # An abort whose records start in an earlier segment than its marker, and aborted records among other
        # producers' committed ones.
        assert any(segment_of(directory, first) < segment_of(directory, last) for _, first, last in txns)
        assert all(any(first < r.offset < last for r in records) for _, first, last in txns)
    for p, codec in enumerate(CODECS):
        assert {b["compresscodec"] for b in dumped_batches(dumped[("bd-codecs", p)])} == {codec}
        assert any(r.headers for r in kafka[("bd-codecs", p)].records)
        assert any(r.key is None for r in kafka[("bd-codecs", p)].records)
    for p in range(2):
        assert {b["compresscodec"] for b in dumped_batches(dumped[("bd-topic-zstd", p)])} == {"zstd"}
        assert {r.timestamp_type for r in kafka[("bd-append-time", p)].records} == {"LogAppendTime"}
        compacted = kafka[("bd-compact", p)]
        assert len(compacted.records) < compacted.latest // 2  # the cleaner removed most records
        assert any(r.value is None for r in compacted.records)  # a tombstone


def dumped_batches(records: list[dict]) -> list[dict]:
    return [{"compresscodec": r["compresscodec"]} for r in records if not r["isControl"]]


def check_partition(fs, kafka: Partition, dumped: list[dict]) -> None:
    """One partition through the mount against what Kafka's consumer read, and Kafka's ListOffsets."""
    rel = kafka.name
    path = fs.path(rel)
    data = fs.read(rel)
    lines = [line(r) for r in kafka.records]
    assert data == b"".join(lines), rel
    assert os.stat(path).st_size == len(data)
    assert (int(fs.getx(rel, "log_start_offset")), int(fs.getx(rel, "log_end_offset"))) == (kafka.earliest,
                                                                                              kafka.latest), rel
    # position.<offset> of every offset: a record's line, or (an aborted record, a marker, a record the cleaner
    # removed) the next line; offset.<position> of every byte of a line: its record.
    starts, at = {}, 0
    for r, text in zip(kafka.records, lines):
        starts[r.offset] = at
        assert int(fs.getx(rel, f"offset.{at}")) == r.offset, (rel, at)
        assert int(fs.getx(rel, f"offset.{at + len(text) - 1}")) == r.offset, (rel, at)
        at += len(text)
    following = len(data)
    for offset in range(kafka.latest, kafka.earliest - 1, -1):
        following = starts.get(offset, following)
        assert int(fs.getx(rel, f"position.{offset}")) == following, (rel, offset)
    # time.<ts>: Kafka's ListOffsets by timestamp. A transaction marker counts (it is a record, at the coordinator's
    # time), as do aborted records; "none" is the log end offset.
    empty_segments = any(f.stat().st_size == 0 for f in Path(fs.source).joinpath(
        f"{kafka.topic}-{kafka.partition}").glob("*.log"))
    for ts, kafkas in kafka.times.items():
        truth = truth_by_time(dumped, kafka.earliest, ts)
        assert int(fs.getx(rel, f"time.{ts}")) == (kafka.latest if truth is None else truth), (rel, ts)
        if kafkas != truth:
            # Kafka 4.2's own answer is "none" in a partition where its cleaner left an empty segment in front:
            # UnifiedLog.fetchOffsetByTimestamp searches only the first segment whose largest timestamp is at or
            # after the target, and an empty segment's is its file's mtime (now). logfs answers what is in the log.
            assert kafkas is None and empty_segments, (rel, ts, kafkas, truth)


def figures(kafka: dict, dumped: dict) -> str:
    consumed = sum(len(v.records) for v in kafka.values())
    everything = [r for v in dumped.values() for r in v]
    markers = [r["control"].split()[1] for r in everything if r["isControl"]]
    aborted = sum(1 for r in everything if r["payload"] and "ABORTED" in r["payload"])
    removed = sum(v.latest - len(v.records) for tp, v in kafka.items() if tp[0] == "bd-compact") - sum(
        1 for tp, v in dumped.items() if tp[0] == "bd-compact" for r in v if r["isControl"] or (
            r["payload"] and "ABORTED" in r["payload"]))
    return (f"{consumed} read_committed in {len(kafka)} partitions ({', '.join(f'{t} {sum(len(v.records) for k, v in kafka.items() if k[0] == t)}' for t in TOPICS)}); "
            f"{aborted} aborted records and {markers.count('ABORT')} ABORT + {markers.count('COMMIT')} COMMIT markers "
            f"in the log; {removed} records removed by Kafka's cleaner; "
            f"{sum(1 for v in kafka.values() for r in v.records if r.value is None)} tombstones")


def test_sparks_kafka_source_reads_what_the_logfs_source_reads(written, spark, kafka_source):
    """Spark's own Kafka source (``read_committed``) from the broker, started again on its directory, gives the
    rows that ``spark.read.format("logfs")`` gives over that directory while the broker was stopped: offsets,
    timestamps and their types, keys, values, headers (CONTRACT.md section 13, "Spark's own Kafka source
    agrees"). Last in the module: it stops and starts the broker, whose clean-shutdown marker
    test_logfs_mounts_a_brokers_log_directory compares with the one the fixture recorded."""
    if written.broker.running:
        written.broker.stop()
    from_logfs = spark_rows(spark, written.log_dir)
    written.broker.start()  # (the session's broker: the tests after this one find it running)
    from_kafka = kafka_source.rows(written.broker.bootstrap, TOPICS)
    assert set(from_kafka) <= set(written.partitions) and set(from_logfs) <= set(written.partitions)
    for tp in written.partitions:
        assert from_kafka.get(tp, []) == from_logfs.get(tp, []), tp
    assert sum(len(rows) for rows in from_kafka.values()) == sum(len(written.kafka[tp].records)
                                                                for tp in written.partitions) > 0

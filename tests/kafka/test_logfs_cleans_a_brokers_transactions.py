"""A broker's log directory that logfs compacts or compresses keeps Kafka's aborted transactions (CONTRACT.md
sections 5, 8 and 13).

A broker of this module's own gets two topics written by Kafka's producers: an idempotent producer's records among
two transactional producers' aborted and committed transactions (the first abort spans several segments, its marker
segments later than its first records; the second's marker lies among another producer's records), every record
keyed, the producers' batches uncompressed. What ``read_committed`` and ``read_uncommitted`` consumers read is
recorded, the broker stops, and logfs mounts its directory read-write (it then owns it, CONTRACT section 13):

- ``tc-keyed`` gets ``cleanup.policy=compact``: logfs's cleaner rewrites its segments as Kafka's would: aborted
  records go (they never count as a key's latest value), each key keeps its latest committed record, the markers
  stay (within ``delete.retention.ms``) and so do the ``.txnindex`` entries of the aborts whose markers it keeps;
- ``tc-plain`` gets ``compression.type=zstd``: logfs's compressor rewrites its sealed segments in the codec, the
  transactional batches whole, so the aborted ranges stay: in memory for readers at once, in a ``.txnindex`` for the
  next mount and for Kafka.

Both active segments are sealed (``segment.ms``) so everything is rewritten. Then, through the mount, at once and
after a remount: each file is what Kafka's ``read_committed`` consumer reads (for the compacted topic: the latest
committed record of each key), the ``offset.``/``position.`` xattrs agree, and ``logfs.isolation.level=
read_uncommitted`` shows the aborted records that are still in the log (the compressed topic's; compaction removed
the other's). After the unmount, Kafka's DumpLogSegments reads every rewritten segment and its indexes without a
complaint and prints the ``.txnindex`` entries the broker wrote (``logfs-dump-log-segments`` prints the same), and
the broker, started again on the directory, serves the same ``read_committed`` (and ``read_uncommitted``) records.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logfs.testing.kafka import running_broker

from harness import mounted_at, wait_for
from test_logfs_reads_a_broker import NULL, SEP, Script, line, read_txn_indexes, segment_of, value

pytestmark = pytest.mark.mount
ROOT = Path(__file__).resolve().parents[2]

KEYED, PLAIN = "tc-keyed", "tc-plain"
TOPICS = {KEYED: {"internal.segment.bytes": "1024"}, PLAIN: {"internal.segment.bytes": "1024"}}
PARTITIONS = [(KEYED, 0), (PLAIN, 0)]
PRODUCERS = {
    "plain": {"compression_type": "none"},
    "tx": {"transactional_id": "tc-tx", "compression_type": "none", "batch_size": "700"},
    "tx2": {"transactional_id": "tc-tx2", "compression_type": "none"},
}


def producers(prefix: str) -> dict[str, dict[str, str]]:
    """The producers of :data:`PRODUCERS` with transactional ids of their own (``<prefix>-tx``, ``<prefix>-tx2``)."""
    return {name: {**given, "transactional_id": given["transactional_id"].replace("tc-", f"{prefix}-")}
            if "transactional_id" in given else dict(given) for name, given in PRODUCERS.items()}
X = "user.logfs.config."


def script(t0: int, topics=tuple(TOPICS)) -> Script:
    """The records and transactions of the test, in each of ``topics`` (partition 0), interleaved."""
    TOPICS = topics  # noqa: N806  (the loops below go over the topics given)
    s = Script(t0)
    for t in TOPICS:
        for i in range(6):
            s.rec("plain", t, 0, value(t, 0, "plain", i, pad=60), b"k%d" % (i % 4))
    s.txn("tx", "begin")  # an abort over several segments, keys the committed records have too
    for i in range(24):
        for t in TOPICS:
            s.rec("tx", t, 0, value(t, 0, "ABORTED long", i, pad=120), b"k%d" % (i % 6))
            if i % 5 == 0:
                s.rec("plain", t, 0, value(t, 0, "plain among", i), b"p%d" % (i % 3))
    s.txn("tx", "abort")
    s.txn("tx", "begin")
    for i in range(6):
        for t in TOPICS:
            s.rec("tx", t, 0, value(t, 0, "committed", i, pad=40), b"k%d" % i)
    s.txn("tx", "commit")
    s.txn("tx2", "begin")  # an abort whose records and marker lie among the idempotent producer's records
    for i in range(4):
        for t in TOPICS:
            s.rec("tx2", t, 0, value(t, 0, "ABORTED second", i), b"k%d" % (i + 2))
            s.rec("plain", t, 0, value(t, 0, "plain between", i), b"q%d" % i)
    s.txn("tx2", "abort")
    for i in range(4):
        for t in TOPICS:
            s.rec("plain", t, 0, value(t, 0, "plain after", i, pad=60), b"k%d" % i)
    return s


def compacted(records: list) -> list:
    """Kafka's cleaner over the whole log: each key's latest committed record (aborted records never count)."""
    latest = {r.key: r.offset for r in records}
    return [r for r in records if latest[r.key] == r.offset]


def as_rows(records) -> list:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


def check(fs, rel: str, records: list, log_end: int) -> None:
    """The file is ``records`` as lines; ``offset.`` of a line's bytes is its record, ``position.`` of every offset
    its record's line or (an aborted record, a marker, a record compaction removed) the next one."""
    data = fs.read(rel)
    lines = [line(r) for r in records]
    assert data == b"".join(lines), rel
    assert os.stat(fs.path(rel)).st_size == len(data)
    assert int(fs.getx(rel, "log_end_offset")) == log_end
    starts, at = {}, 0
    for r, text in zip(records, lines):
        starts[r.offset] = at
        assert int(fs.getx(rel, f"offset.{at}")) == r.offset, (rel, at)
        assert int(fs.getx(rel, f"offset.{at + len(text) - 1}")) == r.offset, (rel, at)
        at += len(text)
    following = len(data)
    for offset in range(log_end, -1, -1):
        following = starts.get(offset, following)
        assert int(fs.getx(rel, f"position.{offset}")) == following, (rel, offset)


def first_batch_attributes(path: Path) -> int | None:
    with open(path, "rb") as f:
        header = f.read(23)
    return None if len(header) < 23 else header[22]


def rewritten(log_dir: Path) -> bool:
    """Both partitions sealed and rewritten: the compacted one is one cleaned segment and an empty active one; each
    sealed segment of the other starts with a compressed batch (or a marker, which is never compressed)."""
    keyed, plain = (sorted((log_dir / f"{t}-0").iterdir()) for t in (KEYED, PLAIN))
    if any(".cleaned" in p.name or ".swap" in p.name for p in keyed + plain):
        return False
    keyed_logs = [p for p in keyed if p.name.endswith(".log")]
    plain_logs = [p for p in plain if p.name.endswith(".log")]
    if len(keyed_logs) != 2 or keyed_logs[-1].stat().st_size or plain_logs[-1].stat().st_size:
        return False
    for p in plain_logs[:-1]:
        attributes = first_batch_attributes(p)
        if attributes is not None and not attributes & 0x20 and not attributes & 0x07:
            return False
    return True


TXN_LINE = re.compile(r"producerId: (\d+) firstOffset: (\d+) lastOffset: (\d+)")


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory, kafka_client):
    with running_broker(tmp_path_factory.mktemp("kafka-broker-tc"), kafka_client) as broker:
        yield broker


def test_compaction_and_compression_keep_kafkas_aborted_transactions(module_broker, kafka_client, kafka_dump,
                                                                       mount_logfs):
    broker, client = module_broker, kafka_client
    log_dir = broker.log_dirs[0]
    client.create_topics(broker.bootstrap, [{"name": t, "partitions": 1, "replication_factor": 1, "configs": c}
                                            for t, c in TOPICS.items()])
    entries = script(int(time.time() * 1000) - 3_600_000)
    sent = client.produce(broker.bootstrap, entries.entries, producers=PRODUCERS, enable_idempotence="true",
                          linger_ms="0")
    assert len(sent) == entries.n

    def settled():  # (the coordinator writes the markers after abortTransaction/commitTransaction return)
        return all(client.list_offsets(broker.bootstrap, t, p)["latest"]
                   == client.list_offsets(broker.bootstrap, t, p, isolation="read_uncommitted")["latest"]
                   for t, p in PARTITIONS)

    wait_for(settled, 30, interval=0.1, what="the transaction markers")
    committed = client.consume_partitions(broker.bootstrap, PARTITIONS)
    everything = client.consume_partitions(broker.bootstrap, PARTITIONS, isolation="read_uncommitted")
    log_end = {tp: client.list_offsets(broker.bootstrap, *tp)["latest"] for tp in PARTITIONS}
    broker.stop()
    try:
        txns = {tp: sorted(read_txn_indexes(log_dir / f"{tp[0]}-{tp[1]}")) for tp in PARTITIONS}
        for tp in PARTITIONS:  # what this test is about is in the broker's log
            directory = log_dir / f"{tp[0]}-{tp[1]}"
            assert len(txns[tp]) == 2, txns[tp]
            assert any(segment_of(directory, first) < segment_of(directory, last) for _, first, last in txns[tp])
            aborted = [r for r in everything[tp] if b"ABORTED" in r.value]
            assert len(aborted) == 28 and not {r.offset for r in aborted} & {r.offset for r in committed[tp]}
            keys = {r.key for r in committed[tp]}
            assert {r.key for r in aborted} <= keys  # an aborted record would be its key's latest
        expected = {(KEYED, 0): compacted(committed[(KEYED, 0)]), (PLAIN, 0): committed[(PLAIN, 0)]}
        assert len(expected[(KEYED, 0)]) < len(committed[(KEYED, 0)])

        options = ("log.retention.ms=-1", "log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.01")
        # (In the foreground: the harness fails the test on an error the daemon logs, such as a rewrite that failed.)
        fs = mount_logfs(*options, foreground=True, prepare=lambda m: setattr(m, "source", str(log_dir)))
        try:
            for t in TOPICS:
                os.setxattr(fs.path(t), X + "logfs.key.separator", SEP)
                os.setxattr(fs.path(t), X + "logfs.null.marker", NULL)
            for tp in PARTITIONS:
                check(fs, f"{tp[0]}/{tp[1]}", committed[tp], log_end[tp])
            os.setxattr(fs.path(KEYED), X + "cleanup.policy", b"compact")
            os.setxattr(fs.path(PLAIN), X + "compression.type", b"zstd")
            for t in TOPICS:
                os.setxattr(fs.path(t), X + "segment.ms", b"100")  # the active segments are sealed too
            wait_for(lambda: rewritten(log_dir), 60, interval=0.1, what="compaction and compression")
            for remounted in (False, True):  # at once (the rewritten segments' aborted ranges in memory), and from disk
                if remounted:
                    fs.remount(*options, foreground=True)
                for tp in PARTITIONS:
                    check(fs, f"{tp[0]}/{tp[1]}", expected[tp], log_end[tp])
                for t in TOPICS:
                    os.setxattr(fs.path(t), X + "logfs.isolation.level", b"read_uncommitted")
                # The compressed topic still holds the aborted records; compaction removed them from the other.
                check(fs, f"{PLAIN}/0", everything[(PLAIN, 0)], log_end[(PLAIN, 0)])
                check(fs, f"{KEYED}/0", expected[(KEYED, 0)], log_end[(KEYED, 0)])
                for t in TOPICS:
                    os.removexattr(fs.path(t), X + "logfs.isolation.level")
        finally:
            if mounted_at(fs.mnt):
                fs.unmount()

        # -- Kafka's DumpLogSegments over what logfs rewrote --------------------------------------------------------
        files = {tp: sorted((log_dir / f"{tp[0]}-{tp[1]}").iterdir()) for tp in PARTITIONS}
        logs = [str(p) for tp in PARTITIONS for p in files[tp] if p.name.endswith(".log")]
        dump = kafka_dump.print_data(logs)
        assert not dump.problems, dump.problems
        for tp in PARTITIONS:
            data = [r for p in files[tp] if p.name.endswith(".log") for r in dump.files[str(p)].records
                    if not r["isControl"]]
            kept = expected[tp] if tp[0] == KEYED else everything[tp]  # (compression keeps the aborted records)
            assert [(r["offset"], r["key"], r["payload"]) for r in data] == [
                (r.offset, r.key.decode(), r.value.decode()) for r in kept], tp
            # (a segment that starts with a marker is not rewritten: compression.needs_rewrite)
            sealed = [p for p in files[tp] if p.name.endswith(".log")][:-1]
            sealed = [p for p in sealed if dump.files[str(p)].batches[:1] and not
                      dump.files[str(p)].batches[0]["isControl"]]
            assert {b["compresscodec"] for p in sealed for b in dump.files[str(p)].batches
                    if b["count"] and not b["isControl"]} == (
                {"zstd"} if tp[0] == PLAIN else {"none"}), tp
        for verified in kafka_dump.verify_indexes([p for tp in PARTITIONS for p in files[tp]]):
            assert not verified.problems and verified.status == 0, verified.problems
        for tp in PARTITIONS:
            indexes = [str(p) for p in files[tp] if p.name.endswith(".txnindex")]
            assert indexes, tp
            listed = kafka_dump.run(indexes)
            assert listed.status == 0 and not listed.problems, listed.problems
            found = sorted(tuple(int(x) for x in TXN_LINE.search(text).groups())
                           for f in listed.files.values() for text in f.other if TXN_LINE.search(text))
            assert found == txns[tp] == sorted(read_txn_indexes(log_dir / f"{tp[0]}-{tp[1]}")), tp
            mine = subprocess.run([sys.executable, "-m", "logfs.tools.dump", "--files", ",".join(indexes)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)
            assert (mine.returncode, mine.stdout, mine.stderr) == (0, listed.stdout, listed.stderr), tp
    finally:
        broker.start()

    # -- the broker again, on the directory logfs rewrote ------------------------------------------------------
    again = client.consume_partitions(broker.bootstrap, PARTITIONS)
    again_everything = client.consume_partitions(broker.bootstrap, PARTITIONS, isolation="read_uncommitted")
    for tp in PARTITIONS:
        assert as_rows(again[tp]) == as_rows(expected[tp]), tp
    assert as_rows(again_everything[(PLAIN, 0)]) == as_rows(everything[(PLAIN, 0)])
    assert as_rows(again_everything[(KEYED, 0)]) == as_rows(expected[(KEYED, 0)])

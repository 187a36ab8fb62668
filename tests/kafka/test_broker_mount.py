"""A running broker's log directory, mounted read-only (CONTRACT.md section 14; issue 45, first step).

A broker of this module's own (small segments: ``internal.segment.bytes``) gets a topic from Kafka's idempotent
producer. Then, through real syscalls on ``logfs -o ro,logfs.cache.dir=CACHE LOG_DIR MNT`` while the broker runs:

- each partition file is what a ``read_committed`` consumer reads, and every writing call answers ``EROFS``; the
  daemon's descriptors under the log directory are ``.log`` files opened read-only (never the ``.lock``), and a
  hash of every name, size, content and mtime under the log directory (the broker's own metadata log and the
  times of the checkpoint files it rewrites on its own aside) is the same before the mount and after its unmount;
- while the broker appends and rolls, a ``tail -f``-style reader (one open file, read on at its end) sees every
  line once, in order, and the file then equals the consumer's read;
- with ``-o logfs.isolation.level=read_uncommitted`` the file goes to the log end offset, open and aborted
  transactions' records shown, as a ``read_uncommitted`` consumer reads them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import pytest

from logfs.testing.kafka import running_broker

from harness import mounted_at, wait_for
from open_reader import OpenReader, produce_lines

pytestmark = pytest.mark.mount

TOPIC = "live"
PARTITIONS = 2
# Topic settings: segments roll every few dozen records (Kafka 4's segment.bytes is at least 1 MiB).
CONFIGS = {"internal.segment.bytes": "4096"}
# Top-level files the broker rewrites on its own while it runs (temporary file, then rename): their names are
# compared, not their times or contents. __cluster_metadata-0 is KRaft's log, appended to all the time.
BROKERS_OWN = {"recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "replication-offset-checkpoint",
               "cleaner-offset-checkpoint"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    with running_broker(tmp_path_factory.mktemp("kafka-broker-live"), kafka_client) as b:
        b.create_topic(TOPIC, PARTITIONS, CONFIGS)
        yield b


def lines_for(partition: int, start: int, count: int) -> list[bytes]:
    return [f"{TOPIC}/{partition} line {i} {hashlib.sha1(str(i).encode()).hexdigest()}".encode()
            for i in range(start, start + count)]


def produce(client, broker, start: int, count: int) -> None:
    entries = [{"topic": TOPIC, "partition": p, "value": v} for p in range(PARTITIONS)
               for v in lines_for(p, start, count)]
    sent = client.produce(broker.bootstrap, entries, enable_idempotence="true", linger_ms="0", batch_size="600")
    assert len(sent) == len(entries)


def consumed(client, broker) -> dict[int, bytes]:
    got = client.consume_partitions(broker.bootstrap, [(TOPIC, p) for p in range(PARTITIONS)])
    return {p: b"".join(r.value + b"\n" for r in got[(TOPIC, p)]) for p in range(PARTITIONS)}


def tree_hash(log_dir: Path) -> dict[str, tuple]:
    """Every directory and file under the log directory: name -> (size, mtime, content hash); the broker's own
    metadata log and the checkpoint files it rewrites on its own: name only."""
    out = {}
    for root, dirs, files in os.walk(log_dir):
        rel_root = os.path.relpath(root, log_dir)
        if rel_root.startswith("__cluster_metadata"):
            out[rel_root] = ("dir",)
            continue
        for name in dirs:
            out[os.path.join(rel_root, name)] = ("dir",)
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.normpath(os.path.join(rel_root, name))
            if rel in BROKERS_OWN or rel.endswith(".tmp"):
                out[rel] = ("broker's own",)
                continue
            st = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.blake2b(f.read()).hexdigest()
            out[rel] = (st.st_size, st.st_mtime_ns, digest)
    return out


def daemon_files_under(pid: int, log_dir: Path) -> list[tuple[str, int]]:
    """(path, open flags) of each descriptor of ``pid`` on a file under ``log_dir``."""
    out = []
    base = os.path.realpath(log_dir) + os.sep
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = int(next(x for x in f if x.startswith("flags:")).split()[1], 8)
        except (FileNotFoundError, StopIteration):
            continue
        if target.startswith(base):
            out.append((target, flags))
    return out


def mount_broker(mount_logfs, log_dir: Path, cache: Path):
    return mount_logfs("ro", f"logfs.cache.dir={cache}", "logfs.broker.poll.ms=100",
                       prepare=lambda m: setattr(m, "source", str(log_dir)))


def test_a_running_brokers_directory_mounts_read_only(broker, kafka_client, mount_logfs, tmp_path):
    log_dir = broker.log_dirs[0]
    produce(kafka_client, broker, 0, 120)
    expected = consumed(kafka_client, broker)
    assert all(len(list((log_dir / f"{TOPIC}-{p}").glob("*.log"))) > 2 for p in range(PARTITIONS))  # (rolled)
    before = tree_hash(log_dir)
    fs = mount_broker(mount_logfs, log_dir, tmp_path / "cache")
    try:
        assert sorted(os.listdir(fs.path(TOPIC)), key=int) == [str(p) for p in range(PARTITIONS)]
        assert not {"__consumer_offsets", "__cluster_metadata"} & set(os.listdir(fs.mnt))
        for p in range(PARTITIONS):
            assert fs.read(f"{TOPIC}/{p}") == expected[p], p
            assert os.stat(fs.path(TOPIC, p)).st_size == len(expected[p])
        opened = daemon_files_under(fs.pid(), log_dir)
        assert all(path.endswith(".log") and flags & os.O_ACCMODE == os.O_RDONLY for path, flags in opened), opened

        # Every writing call: EROFS.
        def refused(call, *args):
            with pytest.raises(OSError) as info:
                call(*args)
            assert info.value.errno == errno.EROFS, (call, info.value)

        refused(open, fs.path(TOPIC, 0), "ab")
        refused(os.open, fs.path(TOPIC, 0), os.O_WRONLY)
        refused(os.truncate, fs.path(TOPIC, 0), 0)
        refused(os.mkdir, fs.path("new-topic"))
        refused(os.mkdir, fs.path(TOPIC, 7))
        refused(os.unlink, fs.path(TOPIC, 1))
        refused(os.rmdir, fs.path(TOPIC))
        refused(os.setxattr, fs.path(TOPIC), "user.logfs.config.retention.ms", b"1000")
        refused(os.setxattr, fs.path(TOPIC, 0), "user.logfs.log_start_offset", b"5")
        refused(os.rename, fs.path(TOPIC), fs.path("other"))
        assert fs.read(f"{TOPIC}/0") == expected[0]
    finally:
        if mounted_at(fs.mnt):
            fs.unmount()
    assert tree_hash(log_dir) == before
    assert (tmp_path / "cache").is_dir()


def test_a_reader_follows_the_brokers_appends_and_rolls(broker, kafka_client, mount_logfs, tmp_path):
    log_dir = broker.log_dirs[0]
    fs = mount_broker(mount_logfs, log_dir, tmp_path / "cache")
    readers = [open(fs.path(TOPIC, p), "rb") for p in range(PARTITIONS)]
    seen = [r.read() for r in readers]  # what the log holds now (the other test's records, or none)
    try:
        segments = len(list((log_dir / f"{TOPIC}-0").glob("*.log")))
        for round_ in range(6):
            produce(kafka_client, broker, 1000 + round_ * 40, 40)
            for p, reader in enumerate(readers):
                want = b"".join(v + b"\n" for v in lines_for(p, 1000 + round_ * 40, 40))

                def caught_up():
                    seen[p] += reader.read()  # (at the end: what came since the last read, or nothing)
                    return seen[p].endswith(want)

                wait_for(caught_up, 30, interval=0.05, what=f"round {round_}'s lines in partition {p}")
        assert len(list((log_dir / f"{TOPIC}-0").glob("*.log"))) > segments + 2  # (the broker rolled meanwhile)
        expected = consumed(kafka_client, broker)
        for p in range(PARTITIONS):
            # Each line once, in order: the reader's bytes are the consumer's.
            assert seen[p] == expected[p], p
            assert fs.read(f"{TOPIC}/{p}") == expected[p], p
    finally:
        for reader in readers:
            reader.close()


def test_retention_under_the_mount(broker, kafka_client, mount_logfs, tmp_path):
    """The broker's retention (``.deleted`` renames, then removal after ``file.delete.delay.ms``) while readers
    read: a ``tail -f``-style reader sees every line once, in order; fresh reads never fail; once retention has
    taken what it takes, the file is the consumer's read from the log start, and no descriptor of the daemon is on
    a removed file."""
    topic = "retained"
    broker.create_topic(topic, 1, {"internal.segment.bytes": "4096", "retention.ms": "3000",
                                   "file.delete.delay.ms": "1500"})
    log_dir = broker.log_dirs[0]
    part = log_dir / f"{topic}-0"
    fs = mount_broker(mount_logfs, log_dir, tmp_path / "cache")
    reader = OpenReader(fs.path(topic, 0))
    sent = b""
    deleted_seen = False
    try:
        for round_ in range(8):
            sent += produce_lines(kafka_client, broker, topic,
                                  [f"{topic} round {round_} line {i} {'x' * 40}".encode() for i in range(40)])
            reader.reaches(sent, 30, what=f"round {round_}")  # each line once, in order, across rolls and retention
            fs.read(f"{topic}/0")  # a fresh read, whatever retention is doing (never an error)
            deleted_seen = deleted_seen or any(p.name.endswith(".deleted") for p in part.iterdir())
            time.sleep(1)  # (records age: retention.ms is 3 s)
        assert deleted_seen  # (the broker's retention ran meanwhile)

        # Retention takes every sealed segment in the end (their records are older than retention.ms).
        def settled():
            names = [p.name for p in part.iterdir()]
            return (sum(1 for n in names if n.endswith(".log")) == 1 and not any(n.endswith(".deleted")
                                                                                 for n in names))

        wait_for(settled, 60, interval=0.2, what="the broker's retention")
        expected = b"".join(r.value + b"\n" for r in kafka_client.consume(broker.bootstrap, topic, 0))
        assert len(expected) < len(sent)  # (retention took records; all of them once the active segment expired)

        def shown():
            return fs.read(f"{topic}/0") == expected

        wait_for(shown, 10, interval=0.1, what="the log start moved by retention")
        assert int(fs.getx(f"{topic}/0", "log_start_offset")) == kafka_client.list_offsets(
            broker.bootstrap, topic, 0)["earliest"]
        reader.close()
        reader = None
        gone = [path for path, _ in daemon_files_under(fs.pid(), log_dir) if not os.path.exists(path)
                or path.endswith(".deleted")]
        assert not gone, gone
    finally:
        if reader is not None:
            reader.close()


def test_a_cache_that_overlaps_the_log_directory_is_refused(tmp_path):
    """logfs's cache inside the broker's log directory (or the other way round) would be a write under it."""
    import subprocess
    import sys

    log_dir, mnt = tmp_path / "kafka", tmp_path / "mnt"
    log_dir.mkdir()
    mnt.mkdir()
    for cache in (log_dir / "cache", log_dir, tmp_path):
        done = subprocess.run([sys.executable, "-m", "logfs.cli", str(log_dir), str(mnt), "-f", "-o",
                               f"ro,logfs.cache.dir={cache}"], capture_output=True, timeout=60)
        assert done.returncode == 2 and b"overlap" in done.stderr, (cache, done.stderr)
    assert sorted(os.listdir(log_dir)) == []


def test_the_brokers_cleaner_under_the_mount(broker, kafka_client, mount_logfs, tmp_path):
    """A compacted topic that the broker's cleaner cleans while the mount follows it: once the cleaner has
    cleaned, a read of the file is the consumer's read (the records it removed gone, nothing shifted or
    partial)."""
    topic = "compacted"
    broker.create_topic(topic, 1, {"cleanup.policy": "compact", "internal.segment.bytes": "1024",
                                   "min.cleanable.dirty.ratio": "0.01", "segment.ms": "100",
                                   "min.compaction.lag.ms": "0", "file.delete.delay.ms": "1500"})
    log_dir = broker.log_dirs[0]
    fs = mount_broker(mount_logfs, log_dir, tmp_path / "cache")
    sent = 0
    for round_ in range(6):
        entries = [{"topic": topic, "partition": 0, "key": b"key%d" % k,
                    "value": f"{topic} v{round_} key{k} {'y' * 30}".encode()} for k in range(8)]
        sent += len(kafka_client.produce(broker.bootstrap, entries, enable_idempotence="true", linger_ms="0",
                                         batch_size="300"))
        fs.read(f"{topic}/0")  # (a read while the cleaner may be swapping: never an error)

    def cleaned():  # (the cleaner's checkpoint can move past a range with no duplicate yet: wait for a removal)
        return len(kafka_client.consume(broker.bootstrap, topic, 0)) < sent

    wait_for(cleaned, 90, interval=0.5, what="Kafka's cleaner to remove a record")

    def shown():
        return fs.read(f"{topic}/0") == b"".join(r.value + b"\n" for r in kafka_client.consume(
            broker.bootstrap, topic, 0))

    wait_for(shown, 30, interval=0.3, what="the cleaned log through the mount")


def test_a_topic_created_while_mounted_appears(broker, kafka_client, mount_logfs, tmp_path):
    log_dir = broker.log_dirs[0]
    fs = mount_broker(mount_logfs, log_dir, tmp_path / "cache")
    topic = "late"
    broker.create_topic(topic, 2, CONFIGS)
    entries = [{"topic": topic, "partition": p, "value": f"{topic}/{p} {i}".encode()} for p in range(2)
               for i in range(50)]
    assert len(kafka_client.produce(broker.bootstrap, entries, enable_idempotence="true", linger_ms="0")) == 100
    got = kafka_client.consume_partitions(broker.bootstrap, [(topic, p) for p in range(2)])

    def shown():  # (the broker makes a topic's partition directories one by one: the mount shows each when it is)
        return (topic in os.listdir(fs.mnt) and sorted(os.listdir(fs.path(topic))) == ["0", "1"] and all(
            fs.read(f"{topic}/{p}") == b"".join(r.value + b"\n" for r in got[(topic, p)]) for p in range(2)))

    wait_for(shown, 30, interval=0.1, what="the new topic through the mount")


class Transactions:
    """Kafka's producers writing one partition for the transaction tests: plain (idempotent) records, and
    transactions left open with plain records after them, then ended; what a consumer of either isolation level
    reads."""

    PLAIN = dict(enable_idempotence="true", linger_ms="0", batch_size="600")

    def __init__(self, client, broker, topic: str, prefix: str):
        self.client, self.broker, self.topic, self.prefix = client, broker, topic, prefix

    def send(self, values: list[bytes]) -> None:
        self.client.produce(self.broker.bootstrap, [{"topic": self.topic, "partition": 0, "value": v} for v in values],
                            **self.PLAIN)

    def consumed(self, isolation: str = "read_committed") -> bytes:
        return b"".join(r.value + b"\n" for r in self.client.consume(self.broker.bootstrap, self.topic, 0,
                                                                     isolation=isolation))

    def _txn(self, outcome: str) -> dict:
        return dict(self.PLAIN, transactional_id=f"{self.prefix}-{outcome}")

    def open(self, outcome: str) -> None:
        """A transaction of 120 records left open (it spans the broker's rolls), then 30 plain records above it
        (``<outcome> txn i``, ``<outcome> after i``)."""
        values = [b"%s txn %d %s" % (outcome.encode(), i, b"t" * 40) for i in range(120)]
        self.client.produce(self.broker.bootstrap, [{"txn": "begin"}] + [
            {"topic": self.topic, "partition": 0, "value": v} for v in values],
            session=f"{self.prefix}-{outcome}", **self._txn(outcome))
        self.send([b"%s after %d" % (outcome.encode(), i) for i in range(30)])

    def shows(self, fs, reader, expected: bytes, what: str) -> None:
        """Waits until the open ``reader`` (a ``tail -f``) has read ``expected`` and a new read of the file is it."""
        reader.reaches(expected, 30, also=lambda: fs.read(f"{self.topic}/0") == expected, what=what)

    def end(self, outcome: str) -> None:
        """Commits or aborts the transaction :meth:`open` left open (``outcome``: "commit" or "abort")."""
        self.client.produce(self.broker.bootstrap, [{"txn": outcome}], session=f"{self.prefix}-{outcome}",
                            end_session=True, **self._txn(outcome))


def test_transactions_as_a_read_committed_consumer_sees_them(broker, kafka_client, mount_logfs, tmp_path):
    """Kafka's transactional producer writes while the mount follows: the records of a transaction left open are
    not shown, nor anything after its first record (the last stable offset); once aborted they never are, once
    committed they are. A ``tail -f``-style reader sees each committed line once, in order; the file is what a
    ``read_committed`` consumer reads at each step. The transactions span the broker's rolls (4 KiB segments)."""
    topic, marks = "txns", "txn-marks"
    broker.create_topic(topic, 1, CONFIGS)
    broker.create_topic(marks, 1)
    fs = mount_broker(mount_logfs, broker.log_dirs[0], tmp_path / "cache")
    txns = Transactions(kafka_client, broker, topic, "h45")
    committed = txns.consumed
    rounds = iter(range(1000))

    def looked_twice():
        """Two whole looks of the mount's follower after what was written: a record in another topic, produced
        after, shows through the mount (twice: a look may have passed this partition before that record came)."""
        for _ in range(2):
            value = b"mark %d" % next(rounds)
            kafka_client.produce(broker.bootstrap, [{"topic": marks, "partition": 0, "value": value}],
                                 **Transactions.PLAIN)
            wait_for(lambda: fs.read(f"{marks}/0").endswith(value + b"\n"), 30, interval=0.05, what="a mark")

    reader = None
    try:
        wait_for(lambda: topic in os.listdir(fs.mnt), 30, interval=0.05, what="the topic")
        reader = OpenReader(fs.path(topic, 0))

        def shows(expected: bytes):
            txns.shows(fs, reader, expected, "the committed records through the mount")

        txns.send([b"before %d" % i for i in range(30)])
        shows(committed())
        for outcome in ("abort", "commit"):
            txns.open(outcome)  # (the records after it: above the LSO)
            open_view = committed()
            assert b"%s txn" % outcome.encode() not in open_view and b"%s after" % outcome.encode() not in open_view
            looked_twice()
            assert fs.read(f"{topic}/0") == open_view  # the open transaction and all after its first record: not shown
            reader.read()
            assert reader.seen == open_view
            txns.end(outcome)
            # (the coordinator writes the markers after the producer's call returns: wait for the consumer too)
            wait_for(lambda: b"%s after 29\n" % outcome.encode() in committed(), 30, interval=0.1,
                     what="the marker, as the consumer sees it")
            expected = committed()
            assert (b"%s txn" % outcome.encode() in expected) == (outcome == "commit")
            shows(expected)
        assert b"abort txn" not in fs.read(f"{topic}/0")
        assert len(list((broker.log_dirs[0] / f"{topic}-0").glob("*.log"))) > 3  # (the transactions spanned rolls)
    finally:
        if reader is not None:
            reader.close()


def test_transactions_as_a_read_uncommitted_consumer_sees_them(broker, kafka_client, mount_logfs, tmp_path):
    """``-o logfs.isolation.level=read_uncommitted`` (CONTRACT sections 13 and 14): the file goes to the broker's log
    end offset, not the last stable offset. A transaction left open shows its records as the broker appends them,
    and the records after it; aborted, they stay; the markers are never lines. At each step the file is what a
    ``read_uncommitted`` consumer reads, and a ``tail -f``-style reader sees each line once, in order. The mount's
    settings are read-only (EROFS), so ``-o`` is how it is set."""
    topic = "txns-uncommitted"
    broker.create_topic(topic, 1, CONFIGS)
    fs = mount_logfs("ro", f"logfs.cache.dir={tmp_path / 'cache'}", "logfs.broker.poll.ms=100",
                     "logfs.isolation.level=read_uncommitted",
                     prepare=lambda m: setattr(m, "source", str(broker.log_dirs[0])))
    name = "user.logfs.config.logfs.isolation.level"
    txns = Transactions(kafka_client, broker, topic, "riu")

    def uncommitted() -> bytes:
        return txns.consumed("read_uncommitted")

    def agrees():
        """The xattrs agree with the consumer: the log end offset is ListOffsets' latest for read_uncommitted (the
        open transaction's records below it), and position./offset. lead to each record's line."""
        rel = f"{topic}/0"
        latest = kafka_client.list_offsets(broker.bootstrap, topic, 0, isolation="read_uncommitted")["latest"]
        assert int(fs.getx(rel, "log_end_offset")) == latest
        at = 0
        for r in kafka_client.consume(broker.bootstrap, topic, 0, isolation="read_uncommitted"):
            assert int(fs.getx(rel, f"position.{r.offset}")) == at, r.offset
            assert int(fs.getx(rel, f"offset.{at}")) == r.offset, at
            at += len(r.value) + 1

    reader = None
    try:
        wait_for(lambda: topic in os.listdir(fs.mnt), 30, interval=0.05, what="the topic")
        assert os.getxattr(fs.path(topic), name) == b"read_uncommitted"
        with pytest.raises(OSError) as refused:
            os.setxattr(fs.path(topic), name, b"read_committed")
        assert refused.value.errno == errno.EROFS
        reader = OpenReader(fs.path(topic, 0))
        txns.send([b"before %d" % i for i in range(30)])

        def shows(expected: bytes):
            txns.shows(fs, reader, expected, "a read_uncommitted consumer's records through the mount")

        shows(uncommitted())
        for outcome in ("abort", "commit"):
            txns.open(outcome)
            open_view = uncommitted()
            assert b"%s txn 119" % outcome.encode() in open_view and b"%s after 29" % outcome.encode() in open_view
            shows(open_view)  # the open transaction's records and those after them, before any marker
            agrees()
            txns.end(outcome)
            # (the marker: no line; the records after it show as they come)
            txns.send([b"%s then %d" % (outcome.encode(), i) for i in range(5)])
            expected = uncommitted()
            assert expected.startswith(open_view) and expected.endswith(b"%s then 4\n" % outcome.encode())
            shows(expected)
            agrees()
        assert fs.read(f"{topic}/0").count(b"abort txn") == 120
        assert len(list((broker.log_dirs[0] / f"{topic}-0").glob("*.log"))) > 3  # (the transactions spanned rolls)
    finally:
        if reader is not None:
            reader.close()

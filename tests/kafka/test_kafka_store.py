"""A Kafka cluster as the store: ``logfs kafka://HOST:PORT MNT`` (CONTRACT.md section 15; issue 46, first step).

The session's broker is the cluster; each test makes its own topics. A mount is a real FUSE mount in the foreground
(its log is checked), its cache directory its own, so two mounts stand for two hosts. What goes in through the mount
is read back with Kafka's own consumer, and what Kafka's own producer writes is read through the mount:

- ``echo >>`` through the mount, then ``fsync``: a ``read_committed`` consumer reads those lines as records, in
  order, once each; and the mount's file shows them (through its replica);
- Kafka's producer writes records (keys, headers, timestamps), and transactions it aborts (one in the middle, one
  last): ``cat`` shows the committed values as lines, ``position.``/``offset.``/``time.``/``log_*_offset`` answer as
  on a local log (the end past the last marker), and the replica's segments decode to the consumer's records;
- two mounts append to one partition at once: both files are equal, every line is there once, equal to what
  Kafka's consumer reads, and a ``tail -f`` on one sees the lines written through the other;
- ``mkdir`` creates a topic (``num.partitions`` from ``-o``), ``rm -r`` deletes it (Kafka's admin says so), and
  another mount sees both; an unknown topic is ``ENOENT``; ``kafka.*`` settings are refused on other mounts, and a
  cluster that does not answer fails the mount in one line;
- a topic's ``user.logfs.config.*`` xattrs are its config on the cluster (Kafka's ConfigCommand shows what
  ``setfattr`` set and ``setfattr -x`` removed; an unknown name or a bad value is ``EINVAL``), and writing
  ``user.logfs.log_start_offset`` is DeleteRecords (Kafka's ListOffsets says the new start; the file starts there);
- the cache's bound: the replica's oldest segments go, the file starts later; the metrics count what went through.
- the cluster's log start offset followed while mounted: DeleteRecords by Kafka's admin client and by another
  host's mount, and the broker's own retention, move the mounted files' start (an open descriptor keeps its view,
  ``tail -f`` shows every line once).

The broker stopped (a broker of this module's own): tests/kafka/test_kafka_store_failures.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading

import pytest

from logfs.storage.format import records as rec
from logfs.testing.kafka import free_port

from open_reader import TailF

from harness import (
    daemon_env as code_env, daemon_pids, deleted_files_held, expect_errno, logfs_command, mount_fstype, mounted_at, needs_mount_helper, sh,
    wait_for,
)

pytestmark = pytest.mark.mount


def kafka_mount(mount_logfs, bootstrap: str, name: str, cache, *options: str):
    """A foreground ``kafka://`` mount with its own cache directory (``cache``)."""
    def prepare(m):
        m.source = f"kafka://{bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)  # (two mounts of one cluster: told apart by mount point)

    return mount_logfs(f"logfs.remote.cache.dir={cache}", "logfs.broker.poll.ms=50", *options, foreground=True,
                       name=name, prepare=prepare)


@pytest.fixture
def mounts(mount_logfs, kafka_broker, tmp_path):
    def make(name: str = "m", *options: str):
        return kafka_mount(mount_logfs, kafka_broker.bootstrap, name, tmp_path / f"{name}-cache", *options)

    return make


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def wait_content(path: str, want: bytes, timeout: float = 30) -> None:
    wait_for(lambda: os.path.exists(path) and read(path) == want, timeout, what=f"{path} to read {want[:80]!r}...")


def test_echo_appends_are_kafka_records(mounts, kafka_broker, kafka_client, tmp_path):
    metrics = tmp_path / "metrics.prom"
    m = mounts("m", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")
    os.mkdir(m.path("echoed"))
    assert sorted(os.listdir(m.path("echoed"))) == ["0"]
    sh(f"echo first >> {m.path('echoed', 0)}")
    lines = [b"line %d" % i for i in range(500)]
    fd = os.open(m.path("echoed", 0), os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(0, len(lines), 100):
            chunk = b"".join(line + b"\n" for line in lines[i:i + 100])
            assert os.write(fd, chunk) == len(chunk)
        os.write(fd, b"partial ")  # (held until its newline, as on a local mount)
        os.write(fd, b"line\n")
        os.fsync(fd)  # returns once every line is acknowledged: a consumer reads them now
    finally:
        os.close(fd)
    records = kafka_client.consume(kafka_broker.bootstrap, "echoed", 0)
    want = [b"first", *lines, b"partial line"]
    assert [r.value for r in records] == want
    assert [r.offset for r in records] == list(range(len(want)))
    assert all(r.key is None for r in records)
    wait_content(m.path("echoed", 0), b"".join(v + b"\n" for v in want))
    assert m.getx("echoed/0", "log_end_offset") == str(len(want))

    def metric(name: str) -> str | None:
        for line in metrics.read_text().splitlines():
            if line.startswith(name + " "):
                return line.split()[1]
        return None

    def caught_up() -> bool:  # (the file is rendered every 100 ms: one render that saw all of it)
        return (metric('logfs_kafka_replica_lag_offsets{topic="echoed",partition="0"}') == "0"
                and metric("logfs_kafka_acknowledged_records_total") == str(len(want))
                # (of every topic the replica copies: the session's broker holds other tests' topics too)
                and int(metric("logfs_kafka_fetched_records_total") or 0) >= len(want))

    wait_for(caught_up, 30, what="the metrics of the caught-up replica")
    assert metric("logfs_kafka_produced_records_total") == str(len(want))
    assert metric("logfs_kafka_failed_deliveries_total") == "0"
    assert int(metric("logfs_kafka_replica_bytes")) > 0


def test_one_line_per_write(mounts, kafka_broker, kafka_client, tmp_path):
    """One delivery report stands for a ``write()``'s lines (storage/cluster/appends.py): many writes of one line,
    of several lines, and an fsync every so often, from two open files at once: every line is acknowledged (the
    metrics' counts agree), once, each file's in its order, and ``fsync`` waits for all of them."""
    metrics = tmp_path / "metrics.prom"
    m = mounts("m", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")
    os.mkdir(m.path("lines"))
    per_writer = 3000
    written = {}

    def writer(name: bytes) -> None:
        fd = os.open(m.path("lines", 0), os.O_WRONLY | os.O_APPEND)
        try:
            i = 0
            while i < per_writer:
                count = 1 if i % 7 else 3  # (mostly one line a write, some writes of three)
                data = b"".join(b"%s %d\n" % (name, i + j) for j in range(count))
                assert os.write(fd, data) == len(data)
                i += count
                if i % 500 < count:
                    os.fsync(fd)
            os.fsync(fd)
            written[name] = i
        finally:
            os.close(fd)

    threads = [threading.Thread(target=writer, args=(name,)) for name in (b"a", b"b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = kafka_client.consume(kafka_broker.bootstrap, "lines", 0)
    assert len(records) == sum(written.values())
    for name in (b"a", b"b"):
        mine = [r.value for r in records if r.value.startswith(name + b" ")]
        assert mine == [b"%s %d" % (name, i) for i in range(written[name])]

    def metric(name: str) -> str | None:
        for line in metrics.read_text().splitlines():
            if line.startswith(name + " "):
                return line.split()[1]
        return None

    wait_for(lambda: metric("logfs_kafka_acknowledged_records_total") == str(len(records)), 10,
             what="the metrics of every acknowledged line")
    assert metric("logfs_kafka_produced_records_total") == str(len(records))
    assert metric("logfs_kafka_failed_deliveries_total") == "0"


def test_kafka_producer_records_read_through_the_mount(mounts, kafka_broker, kafka_client, tmp_path):
    kafka_client.create_topics(kafka_broker.bootstrap, [{"name": "produced", "partitions": 2,
                                                         "replication_factor": 1, "configs": {}}])
    t0 = 1_700_000_000_000
    entries = []
    for i in range(40):
        entries.append({"topic": "produced", "partition": i % 2, "value": b"value %d" % i, "key": b"k%d" % i,
                        "headers": [("h", b"x")], "timestamp": t0 + i * 1000})
    # A transaction that aborts: its records are never shown (read_committed), their offsets are a gap.
    aborted = [{"txn": "begin"}, *({"topic": "produced", "partition": 0, "value": b"aborted %d" % i,
                                    "timestamp": t0 + 100_000} for i in range(3)), {"txn": "abort"}]
    kafka_client.produce(kafka_broker.bootstrap, entries, enable_idempotence="true")
    kafka_client.produce(kafka_broker.bootstrap, aborted, transactional_id="logfs-test-abort")
    kafka_client.produce(kafka_broker.bootstrap, [{"topic": "produced", "partition": 0, "value": b"after",
                                                   "timestamp": t0 + 200_000}])
    # ... and one last: the partition ends with a marker, which the consumer does not return (the replica learns the
    # end from its position)
    kafka_client.produce(kafka_broker.bootstrap, aborted, transactional_id="logfs-test-abort")
    m = mounts()
    assert sorted(os.listdir(m.path("produced"))) == ["0", "1"]
    for p in (0, 1):
        records = kafka_client.consume(kafka_broker.bootstrap, "produced", p)
        want = b"".join(r.value + b"\n" for r in records)
        wait_content(m.path("produced", p), want)
        rel = f"produced/{p}"
        assert m.getx(rel, "log_start_offset") == "0"
        position = 0
        for r in records:
            assert m.getx(rel, f"position.{r.offset}") == str(position)
            assert m.getx(rel, f"offset.{position}") == str(r.offset)
            with open(m.path(rel), "rb") as f:
                f.seek(position)
                assert f.readline() == r.value + b"\n"
            position += len(r.value) + 1
        assert m.getx(rel, f"time.{t0 + 10_000}") == str(next(r.offset for r in records if r.timestamp >= t0 + 10_000))
    # The replica's segments hold the consumer's records as Kafka wrote them: offsets, timestamps, keys, headers.
    for p in (0, 1):
        replica = tmp_path / "m-cache" / "replica" / f"produced-{p}"
        held = []
        for segment in sorted(replica.glob("*.log")):
            buf = segment.read_bytes()
            for pos, header in rec.iter_headers(buf):
                held += [(r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers])
                         for r in rec.decode(buf, pos, header.size)]
        assert held == [(r.offset, r.timestamp, r.key, r.value, r.headers)
                        for r in kafka_client.consume(kafka_broker.bootstrap, "produced", p)]
    end = kafka_client.list_offsets(kafka_broker.bootstrap, "produced", 0)["latest"]
    wait_for(lambda: m.getx("produced/0", "log_end_offset") == str(end), 10,  # (past the last marker, as Kafka's)
             what="the replica's log end offset to be the cluster's")
    assert read(m.path("produced", 0)).endswith(b"value 38\nafter\n")


def test_two_mounts_one_partition(mounts, kafka_broker, kafka_client):
    a = mounts("a")
    os.mkdir(a.path("shared"))
    b = mounts("b")
    wait_for(lambda: os.path.exists(b.path("shared", 0)), 10, what="the topic on the second mount")
    with TailF(b.path("shared", 0)) as tail:  # tail -f on b, started before anything is written
        per_writer = 300

        def writer(m, name: bytes) -> None:
            fd = os.open(m.path("shared", 0), os.O_WRONLY | os.O_APPEND)
            try:
                for i in range(per_writer):
                    line = b"%s %d\n" % (name, i)
                    assert os.write(fd, line) == len(line)
                    if i % 50 == 0:
                        os.fsync(fd)
                os.fsync(fd)
            finally:
                os.close(fd)

        threads = [threading.Thread(target=writer, args=(m, name)) for m, name in
                   ((a, b"a1"), (a, b"a2"), (b, b"b1"), (b, b"b2"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        records = kafka_client.consume(kafka_broker.bootstrap, "shared", 0)
        want = b"".join(r.value + b"\n" for r in records)
        assert sorted(r.value for r in records) == sorted(b"%s %d" % (n, i) for n in (b"a1", b"a2", b"b1", b"b2")
                                                          for i in range(per_writer))
        for name in (b"a1", b"a2", b"b1", b"b2"):  # each writer's lines in its order
            assert [r.value for r in records if r.value.startswith(name + b" ")] == [
                b"%s %d" % (name, i) for i in range(per_writer)]
        wait_content(a.path("shared", 0), want)
        wait_content(b.path("shared", 0), want)
        tail.shows(want, what="tail -f on b to see every line")


def test_mkdir_and_rm_r(mounts, kafka_broker, kafka_client):
    m = mounts("m", "num.partitions=3")
    other = mounts("other")  # another host: it sees the topic come and go through the cluster's metadata
    os.mkdir(m.path("made"))
    assert sorted(os.listdir(m.path("made"))) == ["0", "1", "2"]
    assert "made" in os.listdir(m.path())
    wait_for(lambda: os.path.isdir(other.path("made")) and sorted(os.listdir(other.path("made"))) == ["0", "1", "2"],
             10, what="the topic on the other mount")
    expect_errno(errno.EEXIST, os.mkdir, m.path("made"))
    meta = kafka_client.list_offsets(kafka_broker.bootstrap, "made", 2)
    assert meta["latest"] == 0
    sh(f"echo x >> {m.path('made', 1)}")
    expect_errno(errno.ENOTEMPTY, os.rmdir, m.path("made"))  # (its partition files first, as on a local mount)
    sh(f"rm -r {m.path('made')}")
    assert "made" not in os.listdir(m.path())
    expect_errno(errno.ENOENT, os.stat, m.path("made"))
    wait_for(lambda: not os.path.exists(other.path("made")), 10, what="the topic to leave the other mount")
    with pytest.raises(Exception):
        kafka_client.list_offsets(kafka_broker.bootstrap, "made", 0)


def kafka_topic_configs(kafka_client, bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's own config (its overrides), as Kafka's ConfigCommand (``kafka-configs --describe``) prints it."""
    out = kafka_client.run_main("kafka.admin.ConfigCommand", ["--bootstrap-server", bootstrap, "--entity-type",
                                                               "topics", "--entity-name", topic, "--describe"])
    assert out["status"] == 0 and out["error"] is None, out
    configs = {}
    for line in out["stdout"].splitlines():
        line = line.strip()
        if "=" in line and not line.startswith(("Dynamic", "All ")):
            name, _, rest = line.partition("=")
            configs[name] = rest.split(" ", 1)[0]
    return configs


def test_topic_config_through_kafkas_admin_api(mounts, kafka_broker, kafka_client):
    m = mounts()
    os.mkdir(m.path("configured"))
    path = m.path("configured")
    names = os.listxattr(path)
    # every topic config the broker describes is listed, with the partitions
    assert "user.logfs.partitions" in names and "user.logfs.config.retention.ms" in names
    assert "user.logfs.config.cleanup.policy" in names and "user.logfs.config.max.message.bytes" in names
    assert os.getxattr(path, "user.logfs.config.cleanup.policy") == b"delete"  # (the broker's default)
    default_retention = os.getxattr(path, "user.logfs.config.retention.ms")  # (the test broker's)
    assert default_retention != b"3600000"
    os.setxattr(path, "user.logfs.config.retention.ms", b"3600000")
    os.setxattr(path, "user.logfs.config.max.message.bytes", b"200000")
    assert os.getxattr(path, "user.logfs.config.retention.ms") == b"3600000"
    own = kafka_topic_configs(kafka_client, kafka_broker.bootstrap, "configured")
    assert own.get("retention.ms") == "3600000" and own.get("max.message.bytes") == "200000", own
    os.removexattr(path, "user.logfs.config.retention.ms")  # back to the cluster's default
    own = kafka_topic_configs(kafka_client, kafka_broker.bootstrap, "configured")
    assert "retention.ms" not in own and own.get("max.message.bytes") == "200000", own
    assert os.getxattr(path, "user.logfs.config.retention.ms") == default_retention
    # another mount (host) reads the same config from the cluster
    other = mounts("other")
    wait_for(lambda: os.path.isdir(other.path("configured")), 10, what="the topic on the other mount")
    assert os.getxattr(other.path("configured"), "user.logfs.config.max.message.bytes") == b"200000"
    # refusals, as a local mount answers them: the cluster judges names and values
    expect_errno(errno.EINVAL, os.setxattr, path, "user.logfs.config.no.such.config", b"1")
    expect_errno(errno.EINVAL, os.setxattr, path, "user.logfs.config.retention.ms", b"soon")
    expect_errno(errno.EINVAL, os.setxattr, path, "user.logfs.config.cleanup.policy", b"shred")
    expect_errno(errno.ENODATA, os.getxattr, path, "user.logfs.config.no.such.config")
    expect_errno(errno.EPERM, os.setxattr, path, "user.logfs.partitions", b"4")
    expect_errno(errno.EINVAL, os.setxattr, path, "user.logfs.no_such_name", b"1")
    assert kafka_topic_configs(kafka_client, kafka_broker.bootstrap, "configured") == own  # nothing changed


def test_delete_records_through_kafkas_admin_api(mounts, kafka_broker, kafka_client):
    m = mounts()
    os.mkdir(m.path("trimmed"))
    lines = [b"line %d" % i for i in range(100)]
    with open(m.path("trimmed", 0), "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    wait_content(m.path("trimmed", 0), b"".join(line + b"\n" for line in lines))
    rel = "trimmed/0"
    assert m.getx(rel, "log_start_offset") == "0"
    os.setxattr(m.path(rel), "user.logfs.log_start_offset", b"40")
    assert kafka_client.list_offsets(kafka_broker.bootstrap, "trimmed", 0)["earliest"] == 40  # Kafka's ListOffsets
    assert [r.offset for r in kafka_client.consume(kafka_broker.bootstrap, "trimmed", 0)] == list(range(40, 100))
    assert m.getx(rel, "log_start_offset") == "40"
    assert read(m.path(rel)) == b"".join(line + b"\n" for line in lines[40:])  # the file starts there
    assert m.getx(rel, "position.40") == "0"
    os.setxattr(m.path(rel), "user.logfs.log_start_offset", b"10")  # below the start: nothing changes
    assert m.getx(rel, "log_start_offset") == "40"
    expect_errno(errno.EINVAL, os.setxattr, m.path(rel), "user.logfs.log_start_offset", b"101")  # past the end
    expect_errno(errno.EINVAL, os.setxattr, m.path(rel), "user.logfs.log_start_offset", b"ten")
    os.setxattr(m.path(rel), "user.logfs.log_start_offset", b"-1")  # -1: the log end offset
    assert kafka_client.list_offsets(kafka_broker.bootstrap, "trimmed", 0)["earliest"] == 100
    assert m.getx(rel, "log_start_offset") == "100" and read(m.path(rel)) == b""
    # a new mount (host) starts its replica at the cluster's new log start offset
    other = mounts("other")
    wait_for(lambda: os.path.exists(other.path(rel)), 10, what="the partition on the other mount")
    assert other.getx(rel, "log_start_offset") == "100"


def test_read_only(mounts, kafka_broker, kafka_client):
    """``-o ro``: the replica alone; every writing call is ``EROFS``."""
    kafka_client.create_topics(kafka_broker.bootstrap, [{"name": "only-read", "partitions": 1,
                                                         "replication_factor": 1, "configs": {}}])
    kafka_client.produce(kafka_broker.bootstrap, [{"topic": "only-read", "partition": 0, "value": b"v%d" % i}
                                                  for i in range(3)])
    m = mounts("m", "ro")
    wait_content(m.path("only-read", 0), b"v0\nv1\nv2\n")
    expect_errno(errno.EROFS, open, m.path("only-read", 0), "ab")
    expect_errno(errno.EROFS, os.mkdir, m.path("other"))
    expect_errno(errno.EROFS, os.unlink, m.path("only-read", 0))
    expect_errno(errno.EROFS, os.rmdir, m.path("only-read"))


def test_unknown_topic_and_refused_creations(mounts):
    m = mounts()
    expect_errno(errno.ENOENT, os.stat, m.path("no-such-topic"))
    expect_errno(errno.ENOENT, open, m.path("no-such-topic", 0), "ab")
    os.mkdir(m.path("one"))
    expect_errno(errno.ENOENT, os.stat, m.path("one", 1))
    expect_errno(errno.EPERM, open, m.path("one", 5), "ab")  # a partition comes with its topic, not by a create
    expect_errno(errno.EINVAL, os.mkdir, m.path("bad name!"))


def test_kafka_settings_only_on_a_kafka_mount(tmp_path):
    (tmp_path / "mnt").mkdir()
    r = subprocess.run(logfs_command(tmp_path / "data", tmp_path / "mnt", ["kafka.acks=1"], True),
                       capture_output=True, text=True, env=code_env(), timeout=60)
    assert r.returncode == 2 and "kafka://" in r.stderr, r.stderr
    r = subprocess.run(logfs_command("kafka://nohost", tmp_path / "mnt", [], True), capture_output=True, text=True,
                       env=code_env(), timeout=60)
    assert r.returncode == 2 and "HOST:PORT" in r.stderr, r.stderr
    r = subprocess.run(logfs_command("kafka://127.0.0.1:9092", tmp_path / "mnt", ["kafka.acks=1"], True),
                       capture_output=True, text=True, env=code_env(), timeout=60)
    assert r.returncode == 2 and "kafka.acks is set by logfs" in r.stderr, r.stderr
    # No broker answers: a one-line error, nothing mounted.
    r = subprocess.run(logfs_command(f"kafka://127.0.0.1:{free_port()}", tmp_path / "mnt",
                                     [f"logfs.remote.cache.dir={tmp_path / 'cache'}"], True),
                       capture_output=True, text=True, env=code_env(), timeout=60)
    assert r.returncode == 1 and "cannot reach the Kafka cluster" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # The replica is a read_committed consumer's: logfs.isolation.level=read_uncommitted could not be honoured.
    r = subprocess.run(logfs_command(f"kafka://127.0.0.1:{free_port()}", tmp_path / "mnt",
                                     [f"logfs.remote.cache.dir={tmp_path / 'cache'}",
                                      "logfs.isolation.level=read_uncommitted"], True),
                       capture_output=True, text=True, env=code_env(), timeout=60)
    assert r.returncode == 1 and "not available on a Kafka cluster mount" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_cache_bound(mounts, tmp_path):
    """Past ``logfs.remote.cache.bytes`` the replica's oldest sealed segments are removed: the file starts later
    (its log start offset moves up), and shows every line from there."""
    bound = 4 << 20
    m = mounts("m", f"logfs.remote.cache.bytes={bound}")
    os.mkdir(m.path("bounded"))
    lines = [b"line %07d " % i + b"x" * 86 for i in range(100_000)]  # 100 bytes with the newline: 10 MB
    with open(m.path("bounded", 0), "wb") as f:  # (no O_APPEND: every write of a Kafka cluster mount appends)
        for i in range(0, len(lines), 10_000):
            f.write(b"".join(line + b"\n" for line in lines[i:i + 10_000]))
            f.flush()
        os.fsync(f.fileno())

    replica = tmp_path / "m-cache" / "replica" / "bounded-0"

    def live() -> dict[str, int]:
        """The replica's segments and their sizes (one the bound retires meanwhile is left out)."""
        sizes = {}
        for name in os.listdir(replica):
            if name.endswith(".log"):
                try:
                    sizes[name] = os.stat(replica / name).st_size
                except FileNotFoundError:
                    pass
        return sizes

    def caught_up():
        start = int(m.getx("bounded/0", "log_start_offset"))
        return (start > 0 and read(m.path("bounded", 0)) == b"".join(line + b"\n" for line in lines[start:])
                and sum(live().values()) <= bound)

    # (the replica enforces the bound after each fetch: the file can show the last lines just before the oldest
    # segments go, so the wait is for both)
    wait_for(caught_up, 60, what="the replica to hold the newest lines only, within its bound")
    assert len(live()) >= 2


def test_the_clusters_refusals_as_errno():
    """The admin API's errors as a caller sees them (storage/cluster ``_refusal``): an authorization refused is
    EACCES (librdkafka's own error codes; a broker that refuses: tests/kafka/test_kafka_store_authorization.py)."""
    from confluent_kafka import KafkaError

    from logfs.storage.cluster import _refusal

    for code, want in ((KafkaError.TOPIC_AUTHORIZATION_FAILED, errno.EACCES),
                       (KafkaError.CLUSTER_AUTHORIZATION_FAILED, errno.EACCES),
                       (KafkaError.INVALID_CONFIG, errno.EINVAL), (KafkaError.POLICY_VIOLATION, errno.EINVAL),
                       (KafkaError.OFFSET_OUT_OF_RANGE, errno.EINVAL), (KafkaError.TOPIC_ALREADY_EXISTS, errno.EEXIST),
                       (KafkaError.UNKNOWN_TOPIC_OR_PART, errno.ENOENT), (KafkaError.REQUEST_TIMED_OUT, errno.EIO)):
        assert _refusal(KafkaError(code), "altering").errno == want, KafkaError(code).name()


def test_the_units_exec_start_serves_a_kafka_mount(kafka_broker, kafka_client, tmp_path):
    """README's systemd example: the template service's ``ExecStart`` with ``DATA_DIR=kafka://...`` and the cache in
    ``LOGFS_OPTIONS``, under the unit's own restrictions (its seccomp filter, address families, no new privileges:
    logfs/testing/unit_sandbox.py), mounts, says ``READY=1``, appends to the cluster, and stops cleanly on SIGTERM."""
    import platform
    import shutil
    import sys

    from service.service_helpers import SERVICE_UNIT, NotifySocket, ServiceDaemon

    if platform.machine() != "x86_64" or shutil.which("systemd-analyze") is None or not os.path.exists(
            "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"):
        pytest.skip("logfs.testing.unit_sandbox needs x86-64, systemd-analyze and the kernel headers")
    svc = ServiceDaemon(tmp_path / "svc")
    svc.data = f"kafka://{kafka_broker.bootstrap}"
    sock = NotifySocket(tmp_path)
    try:
        proc = svc.start(sock, f"logfs.remote.cache.dir={tmp_path / 'unit-cache'},num.partitions=2",
                         wrapper=[sys.executable, "-m", "logfs.testing.unit_sandbox", str(SERVICE_UNIT), "--"])
        assert sock.wait_for("READY", proc=proc).mounted
        status = open(f"/proc/{proc.pid}/status").read()
        assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status, "the daemon is not running sandboxed"
        os.mkdir(svc.mnt / "from-the-unit")
        assert sorted(os.listdir(svc.mnt / "from-the-unit")) == ["0", "1"]
        with open(svc.mnt / "from-the-unit" / "1", "ab") as f:
            f.write(b"appended under the unit\n")
        assert [r.value for r in kafka_client.consume(kafka_broker.bootstrap, "from-the-unit", 1)] == [
            b"appended under the unit"]
        assert svc.stop() == 0
        assert "Traceback" not in svc.stderr(), svc.stderr()
    finally:
        svc.cleanup()
        sock.close()


@needs_mount_helper
def test_mount_t_fuse_logfs_and_an_fstab_line(kafka_broker, kafka_client, logfs_on_default_path, tmp_path):
    """CONTRACT section 15's first paragraph: ``mount -t fuse.logfs kafka://HOST:PORT MNT -o ...`` and the same source
    in an fstab line (``mount -T FSTAB MNT``): mount(8) hands the source to mount.fuse3 as given, which runs ``logfs``
    with it; the mount serves the cluster (the mount table names the source), and ``umount`` ends the daemon."""
    source = f"kafka://{kafka_broker.bootstrap}"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cache = tmp_path / "cache"

    def mounted(cmd: list[str]) -> None:
        r = subprocess.run(cmd, capture_output=True, timeout=60, env=code_env())
        assert r.returncode == 0, r.stderr.decode()
        assert mounted_at(mnt) and mount_fstype(mnt) == "fuse.logfs"
        with open("/proc/self/mounts") as f:
            assert any(line.split()[:2] == [source, str(mnt)] for line in f)

    def unmounted() -> None:
        pids = daemon_pids(source, mnt)
        sh(f"umount {mnt}")
        wait_for(lambda: not mounted_at(mnt) and not daemon_pids(source, mnt), 30, what="the daemon to exit")
        assert pids

    try:
        mounted(["mount", "-t", "fuse.logfs", source, str(mnt), "-o",
                 f"logfs.remote.cache.dir={cache},num.partitions=2"])
        os.mkdir(mnt / "via-mount")
        assert sorted(os.listdir(mnt / "via-mount")) == ["0", "1"]
        with open(mnt / "via-mount" / "1", "ab") as f:
            f.write(b"through mount(8)\n")
        unmounted()
        fstab = tmp_path / "fstab"
        fstab.write_text(f"# a Kafka cluster\n{source} {mnt} fuse.logfs defaults,_netdev,noauto,nofail,"
                         f"x-systemd.after=network-online.target,logfs.remote.cache.dir={cache} 0 0\n")
        mounted(["mount", "-T", str(fstab), str(mnt)])
        with open(mnt / "via-mount" / "1", "ab") as f:
            f.write(b"through fstab\n")
        wait_content(str(mnt / "via-mount" / "1"), b"through mount(8)\nthrough fstab\n")
        unmounted()
    finally:
        if mounted_at(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
    assert [r.value for r in kafka_client.consume(kafka_broker.bootstrap, "via-mount", 1)] == [
        b"through mount(8)", b"through fstab"]


def replica_segments(cache, topic: str, partition: int = 0) -> dict[int, int]:
    """The replica's live segments of a partition: base offset -> bytes."""
    directory = cache / "replica" / f"{topic}-{partition}"
    return {int(p.name[:-4]): p.stat().st_size for p in directory.iterdir() if p.name.endswith(".log")}


def test_delete_records_kept_by_the_replica(mounts, kafka_broker, tmp_path):
    """DeleteRecords through the mount: the replica notes the new log start offset in its
    ``log-start-offset-checkpoint`` and removes its segments wholly below it; a remount with the same cache starts
    the file there (the records below are not fetched again: the cluster has them no more, and the replica resumes).
    ``-1`` (the high watermark) rolls the replica's active segment and removes the rest."""
    m = mounts("m", "logfs.remote.cache.bytes=16777216")  # (the replica's segments roll at 2 MiB)
    cache = tmp_path / "m-cache"
    os.mkdir(m.path("kept"))
    lines = [b"line %07d " % i + b"x" * 86 for i in range(60_000)]  # 100 bytes with the newline: 6 MB
    with open(m.path("kept", 0), "ab") as f:
        for i in range(0, len(lines), 10_000):
            f.write(b"".join(line + b"\n" for line in lines[i:i + 10_000]))
    wait_for(lambda: m.getx("kept/0", "log_end_offset") == str(len(lines)), 60, what="the replica to hold the lines")
    before = replica_segments(cache, "kept")
    assert len(before) >= 3, before
    bases = sorted(before)
    start = bases[2] + 5  # inside the third segment: the first two are wholly below it
    os.setxattr(m.path("kept", 0), "user.logfs.log_start_offset", str(start).encode())
    assert m.getx("kept/0", "log_start_offset") == str(start)
    checkpoint = cache / "replica" / "log-start-offset-checkpoint"
    assert f"kept 0 {start}" in checkpoint.read_text().splitlines()
    wait_for(lambda: sorted(replica_segments(cache, "kept")) == bases[2:], 10,
             what="the segments below the start to leave the replica")
    want = b"".join(line + b"\n" for line in lines[start:])
    assert read(m.path("kept", 0)) == want

    m.remount(foreground=True)
    assert m.getx("kept/0", "log_start_offset") == str(start)
    assert m.getx("kept/0", f"position.{start}") == "0"
    assert read(m.path("kept", 0)) == want
    assert sorted(replica_segments(cache, "kept")) == bases[2:]  # (resumed, not fetched again)

    os.setxattr(m.path("kept", 0), "user.logfs.log_start_offset", b"-1")
    assert m.getx("kept/0", "log_start_offset") == str(len(lines)) and read(m.path("kept", 0)) == b""
    wait_for(lambda: replica_segments(cache, "kept") == {len(lines): 0}, 10,
             what="the replica to hold one empty segment at the end")
    m.remount(foreground=True)
    assert m.getx("kept/0", "log_start_offset") == str(len(lines)) and read(m.path("kept", 0)) == b""
    with open(m.path("kept", 0), "ab") as f:
        f.write(b"after\n")
    wait_content(m.path("kept", 0), b"after\n")


# How long a mounted file may take to start where the cluster's partition starts (README: "within 2 s"; the
# waits give it room on a loaded machine, and a mount that does not follow never gets there)
START_FOLLOWED_S = 10


def test_the_clusters_log_start_offset_followed(mounts, kafka_broker, tmp_path):
    """The cluster's log start offset moved while mounted, by Kafka's own admin client (DeleteRecords) and by another
    host's mount: both mounts' files start there (``log_start_offset``, ``position.``, the content), the replica
    notes it in its checkpoint; a descriptor opened before reads on in its own view (as on a local log whose
    retention or DeleteRecords ran under it), and a ``tail -f`` started before shows every line once."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    a, b = mounts("a"), mounts("b")  # two hosts
    os.mkdir(a.path("moved"))
    lines = [b"line %d" % i for i in range(100)]
    with open(a.path("moved", 0), "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    text = b"".join(line + b"\n" for line in lines)
    wait_content(a.path("moved", 0), text)
    wait_content(b.path("moved", 0), text)
    with TailF(b.path("moved", 0)) as tail:  # (started before the start moves)
        reader = os.open(a.path("moved", 0), os.O_RDONLY)
        try:
            head = os.read(reader, len(b"".join(line + b"\n" for line in lines[:5])))
            admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
            tp = TopicPartition("moved", 0, 40)
            assert admin.delete_records([tp], request_timeout=30)[tp].result(30).low_watermark == 40

            def starts_at(m, start: int) -> bool:
                return (m.getx("moved/0", "log_start_offset") == str(start)
                        and read(m.path("moved", 0)) == b"".join(line + b"\n" for line in lines[start:]))

            for m in (a, b):
                wait_for(lambda: starts_at(m, 40), START_FOLLOWED_S, what=f"{m.mnt} to start at 40")
                assert m.getx("moved/0", "position.40") == "0"
            assert "moved 0 40" in (tmp_path / "a-cache" / "replica" / "log-start-offset-checkpoint").read_text()
            # another host's DeleteRecords (its mount's setfattr)
            os.setxattr(b.path("moved", 0), "user.logfs.log_start_offset", b"70")
            wait_for(lambda: starts_at(a, 70), START_FOLLOWED_S, what="the first mount to start at 70")
            # the descriptor opened before: its view, whatever the cluster's start did meanwhile
            assert os.getxattr(reader, "user.logfs.log_start_offset") == b"0"
            rest = b""
            while chunk := os.read(reader, 65536):
                rest += chunk
            assert head + rest == text
        finally:
            os.close(reader)
        added = [b"after %d" % i for i in range(20)]
        with open(a.path("moved", 0), "ab") as f:
            f.write(b"".join(line + b"\n" for line in added))
        tail.shows(text + b"".join(line + b"\n" for line in added))


def test_a_reader_keeps_what_the_start_moved_past(mounts, kafka_broker, tmp_path):
    """A descriptor opened before the cluster's start moved past whole segments of the replica reads on through them
    after the replica removed them (renamed ``.deleted``, unlinked later: here the test unlinks them at once, as the
    replica's purge does 30 s later), as a local log's retention leaves a reader what it pinned; once it is closed,
    the daemon holds no descriptor of a removed file."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    m = mounts("m", "logfs.remote.cache.bytes=8388608")  # (the replica's segments roll at 1 MiB)
    cache = tmp_path / "m-cache"
    os.mkdir(m.path("pinned"))
    lines = [b"line %07d " % i + b"x" * 86 for i in range(30_000)]  # 100 bytes with the newline: 3 MB
    text = b"".join(line + b"\n" for line in lines)
    with open(m.path("pinned", 0), "ab") as f:
        f.write(text)
    wait_for(lambda: m.getx("pinned/0", "log_end_offset") == str(len(lines)), 60, what="the replica to hold the lines")
    bases = sorted(replica_segments(cache, "pinned"))
    assert len(bases) >= 3, bases
    start = bases[2] + 5
    reader = os.open(m.path("pinned", 0), os.O_RDONLY)
    try:
        head = os.read(reader, 1000)
        tp = TopicPartition("pinned", 0, start)
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})  # (kept: its futures need it alive)
        assert admin.delete_records([tp], request_timeout=30)[tp].result(30).low_watermark == start
        wait_for(lambda: m.getx("pinned/0", "log_start_offset") == str(start)
                 and m.getx("pinned/0", "segment_count") == str(len(bases) - 2), START_FOLLOWED_S,
                 what="the mount to start there, without the segments below")
        removed = sorted((cache / "replica" / "pinned-0").glob("*.log.deleted"))
        assert len(removed) == 2, removed
        for path in removed:  # (the replica's purge)
            path.unlink()
        rest = b""
        while chunk := os.read(reader, 1 << 20):
            rest += chunk
        assert head + rest == text
    finally:
        os.close(reader)
    pid = m.pid()

    def removed_held() -> list[str]:
        return [path for path in deleted_files_held(pid).values() if "pinned-0" in path]

    wait_for(lambda: not removed_held(), 10, what="the descriptors of the removed segments to be let go")
    assert read(m.path("pinned", 0)) == b"".join(line + b"\n" for line in lines[start:])


def test_retention_on_the_cluster_followed(mounts, kafka_broker, kafka_client, tmp_path):
    """The broker's retention (``retention.bytes`` and ``segment.bytes`` of the topic, the session broker checking
    every second) deletes the oldest segments of a partition while mounted: the file starts where Kafka's ListOffsets
    says the partition starts, and the replica's segments wholly below are removed."""
    m = mounts("m", "logfs.remote.cache.bytes=8388608")  # (the replica's segments roll at 1 MiB)
    kafka_client.create_topics(kafka_broker.bootstrap, [{
        "name": "retained", "partitions": 1, "replication_factor": 1,
        "configs": {"segment.bytes": "1048576", "retention.bytes": "1048576"}}])
    wait_for(lambda: os.path.exists(m.path("retained", 0)), 10, what="the topic on the mount")
    lines = [b"line %07d " % i + b"x" * 86 for i in range(35_000)]  # 100 bytes with the newline: 3.5 MB
    with open(m.path("retained", 0), "ab") as f:
        for i in range(0, len(lines), 5_000):
            f.write(b"".join(line + b"\n" for line in lines[i:i + 5_000]))

    def follows() -> bool:
        earliest = kafka_client.list_offsets(kafka_broker.bootstrap, "retained", 0)["earliest"]
        return (earliest > 0 and m.getx("retained/0", "log_start_offset") == str(earliest)
                and read(m.path("retained", 0)) == b"".join(line + b"\n" for line in lines[earliest:]))

    wait_for(follows, 60, interval=0.5, what="the broker's retention, and the file to start where the partition does")
    start = int(m.getx("retained/0", "log_start_offset"))
    wait_for(lambda: sorted(replica_segments(tmp_path / "m-cache", "retained"))[1:2] > [start] or
             len(replica_segments(tmp_path / "m-cache", "retained")) == 1, START_FOLLOWED_S,
             what="the replica's segments below the start to go")
    assert min(replica_segments(tmp_path / "m-cache", "retained")) <= start


def test_a_remount_resumes_the_replica(mounts, kafka_broker, kafka_client, tmp_path):
    """A second mount with the same cache directory fetches only what the cluster got since (the fetched-records
    metric counts the records of every topic of the session's broker: the ones the replica held are not fetched
    again), after a clean unmount and after a kill -9."""
    metrics = tmp_path / "metrics.prom"
    m = mounts("m", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")
    os.mkdir(m.path("resumed"))
    first = b"".join(b"first %d\n" % i for i in range(1000))
    with open(m.path("resumed", 0), "ab") as f:
        f.write(first)
    wait_content(m.path("resumed", 0), first)

    def metric(name: str) -> str | None:
        for line in metrics.read_text().splitlines() if metrics.exists() else ():
            if line.startswith(name + " "):
                return line.split()[1]
        return None

    def caught_up(text: bytes) -> bool:
        return (metric('logfs_kafka_replica_lag_offsets{topic="resumed",partition="0"}') == "0"
                and os.path.exists(m.path("resumed", 0)) and read(m.path("resumed", 0)) == text)

    wait_for(lambda: caught_up(first), 30, what="the replica to catch up")
    # the topic's id, in Kafka's own partition.metadata: the same file as the broker's
    held = tmp_path / "m-cache" / "replica" / "resumed-0" / "partition.metadata"
    assert held.read_text() == (kafka_broker.log_dirs[0] / "resumed-0" / "partition.metadata").read_text()
    expected = first
    segment = max((tmp_path / "m-cache" / "replica" / "resumed-0").glob("*.log"))
    for stop in ("unmount", "kill -9"):
        if stop == "unmount":
            m.unmount()
            # A torn tail, as a kill in the middle of the replica's write leaves it: the start of a batch. The
            # resume cuts it, and the fetch writes the next batch where it was.
            whole = segment.stat().st_size
            with open(segment, "ab") as f:
                f.write(rec.build_batch_generic(len(first), 0, [b"torn"])[:40])
        else:
            m.kill9()
        metrics.unlink()
        added = [b"%s %d" % (stop.encode(), i) for i in range(10)]
        kafka_client.produce(kafka_broker.bootstrap, [{"topic": "resumed", "partition": 0, "value": v} for v in added])
        expected += b"".join(v + b"\n" for v in added)
        m.mount(*m.options, foreground=True)
        wait_for(lambda: caught_up(expected), 30, what="the resumed replica to catch up")
        assert metric("logfs_kafka_fetched_records_total") == str(len(added))
        if stop == "unmount":
            assert "cut at %d of %d bytes (a torn tail)" % (whole, whole + 40) in m.stderr()


def test_a_remount_after_topics_changed_meanwhile(mounts, kafka_broker, kafka_client, tmp_path):
    """While unmounted, one topic is deleted and made again with more records, another deleted: the remount with the
    same cache fetches the first afresh (its topic id is another: the replica's ``partition.metadata``) and no longer
    shows the second."""
    from confluent_kafka.admin import AdminClient, NewTopic

    m = mounts("m")
    for topic in ("remade", "gone"):
        os.mkdir(m.path(topic))
        with open(m.path(topic, 0), "ab") as f:
            f.write(b"".join(b"old %d\n" % i for i in range(10)))
        wait_content(m.path(topic, 0), b"".join(b"old %d\n" % i for i in range(10)))
    m.unmount()
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_topics(["remade", "gone"], request_timeout=30).values():
        future.result(60)

    def made_again() -> bool:
        try:
            admin.create_topics([NewTopic("remade", 1, 1)], request_timeout=30)["remade"].result(60)
        except Exception:  # (the deletion not finished yet: TOPIC_ALREADY_EXISTS)
            return False
        return True

    wait_for(made_again, 30, what="the topic to be made again")
    kafka_client.produce(kafka_broker.bootstrap, [{"topic": "remade", "partition": 0, "value": b"new %d" % i}
                                                  for i in range(15)])
    m.mount(*m.options, foreground=True)
    wait_content(m.path("remade", 0), b"".join(b"new %d\n" % i for i in range(15)))
    assert m.getx("remade/0", "log_start_offset") == "0"
    assert "remade-0: the replica holds another topic of that name (deleted and made again)" in m.stderr()
    assert "gone" not in os.listdir(m.path())
    expect_errno(errno.ENOENT, os.stat, m.path("gone"))


@pytest.mark.daemon_errors(r"in use by another mount")
def test_one_mount_per_cache_directory(mounts, mount_logfs, kafka_broker, tmp_path):
    """The replica is resumed by the next mount, so two mounts at once must not write it: the second fails with one
    line, and the first goes on."""
    from harness import MountError

    m = mounts("m")
    os.mkdir(m.path("first"))
    with pytest.raises(MountError, match="is in use by another mount"):
        kafka_mount(mount_logfs, kafka_broker.bootstrap, "second", tmp_path / "m-cache")
    sh(f"echo still >> {m.path('first', 0)}")
    wait_content(m.path("first", 0), b"still\n")

"""Follower mounts (CONTRACT section 10), against a real SeaweedFS: a writer tiers to a bucket prefix, followers
mount ``s3://BUCKET/PREFIX`` read-only with their own cache directory and no access to the writer's DATA_DIR.

Listing, byte-for-byte text and positions against the writer's mount up to ``remote_log_end_offset``, the xattrs,
a keyed topic's text (the writer's settings, as published), EROFS for every writing call, following (a segment
tiered shows within the interval; ``tail -f`` sees every line once), retention and deletion, two followers, the
store stopped and started again, and the requests an idle follower sends.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid

import pytest

from harness import LOGFS_SCRIPT, FollowerMount, daemon_env, expect_errno, sh, wait_for
from remote_store import s3_tiering

SEGMENT = 64 * 1024
FOLLOW_MS = 200


def writer_opts(seaweed, prefix):
    return s3_tiering(seaweed, prefix, segment_bytes=SEGMENT, interval_ms=100) + (
        "log.retention.check.interval.ms=100",)


@pytest.fixture
def follower(tmp_path, creds):
    made = []

    def make(prefix: str, name: str = "follower", *options: str) -> FollowerMount:
        m = FollowerMount(tmp_path / name, f"s3://{creds.bucket}/{prefix}")
        made.append(m)
        m.mount(f"logfs.remote.s3.endpoint={creds.endpoint}", f"logfs.follow.interval.ms={FOLLOW_MS}",
                "logfs.remote.cache.bytes=8388608", *options, foreground=True)
        return m

    yield make
    for m in made:
        m.cleanup()


def tier(fs, topic, *settings):
    os.mkdir(fs.path(topic))
    for key, value in (("remote.storage.enable", "true"), ("local.retention.bytes", str(SEGMENT))) + settings:
        os.setxattr(fs.path(topic), f"user.logfs.config.{key}", value.encode())


def lines(prefix: str, first: int, n: int, sep: bytes = b"") -> bytes:
    return b"".join(b"%s%s%s-%06d-%s\n" % (b"k%d" % (i % 7), sep, prefix.encode(), i, b"v" * (40 + i % 30))
                    if sep else b"%s-%06d-%s\n" % (prefix.encode(), i, b"v" * (40 + i % 30))
                    for i in range(first, first + n))


def tiered_text(fs, rel: str) -> bytes:
    """The writer's text up to its remote_log_end_offset: what a follower shows."""
    end = int(fs.getx(rel, "remote_log_end_offset"))
    return fs.read(rel)[: int(fs.getx(rel, f"position.{end}"))] if end else b""


def test_a_follower_shows_the_writers_tiered_text_read_only(mount_logfs, follower, creds):
    prefix = "fol-" + uuid.uuid4().hex[:8]
    w = mount_logfs(*writer_opts(creds, prefix))
    tier(w, "plain")
    tier(w, "keyed", ("logfs.key.separator", "="))
    w.append("plain/0", lines("p", 0, 6000))
    w.append("keyed/0", lines("k", 0, 4000, b"="))
    wait_for(lambda: int(w.getx("plain/0", "remote_segment_count")) >= 3
             and int(w.getx("keyed/0", "remote_segment_count")) >= 2, 60, interval=0.2, what="tiering")
    f = follower(prefix)
    for rel in ("plain/0", "keyed/0"):
        wait_for(lambda: f.getx(rel, "log_end_offset") == w.getx(rel, "remote_log_end_offset"), 10,
                 what=f"the follower to show the tiered end of {rel}")
        text = tiered_text(w, rel)
        assert f.read(rel) == text  # byte for byte, the keyed one with the writer's separator
        assert os.stat(f.path(*rel.split("/"))).st_size == len(text)
        end = int(f.getx(rel, "log_end_offset"))
        for offset in (0, end // 3, end - 1):
            assert f.getx(rel, f"position.{offset}") == w.getx(rel, f"position.{offset}")
            position = int(w.getx(rel, f"position.{offset}"))
            assert f.getx(rel, f"offset.{position}") == w.getx(rel, f"offset.{position}")
        assert f.getx(rel, "log_start_offset") == w.getx(rel, "log_start_offset")
        assert f.getx(rel, "remote_log_end_offset") == f.getx(rel, "log_end_offset")
        assert int(f.getx(rel, f"time.{int(time.time() * 1000) + 60_000}")) == end  # after the last: the end
    assert sorted(os.listdir(f.mnt)) == ["keyed", "plain"]
    assert f.getx("keyed", "config.logfs.key.separator") == "="
    assert b"=" in f.read("keyed/0").splitlines()[0]
    # Everything that would write: EROFS.
    path = f.path("plain", 0)
    expect_errno(errno.EROFS, os.open, path, os.O_WRONLY | os.O_APPEND)
    expect_errno(errno.EROFS, os.mkdir, f.path("new"))
    expect_errno(errno.EROFS, os.unlink, path)
    expect_errno(errno.EROFS, os.rmdir, f.path("plain"))
    expect_errno(errno.EROFS, os.rename, path, f.path("plain", 1))
    expect_errno(errno.EROFS, os.setxattr, path, "user.logfs.log_start_offset", b"1")
    expect_errno(errno.EROFS, os.setxattr, f.path("plain"), "user.logfs.config.retention.ms", b"1")
    expect_errno(errno.EROFS, os.removexattr, f.path("keyed"), "user.logfs.config.logfs.key.separator")
    expect_errno(errno.EROFS, os.open, f.path("plain", 1), os.O_WRONLY | os.O_CREAT)
    expect_errno(errno.EROFS, os.truncate, path, 0)
    # Nothing of the writer's DATA_DIR was used: the follower's files are its cache.
    assert not any(str(w.data) in str(p) for p in f.cache.rglob("*"))


def test_a_follower_follows_retention_and_deletion(mount_logfs, follower, creds):
    prefix = "fol-" + uuid.uuid4().hex[:8]
    w = mount_logfs(*writer_opts(creds, prefix))
    tier(w, "t")
    w.append("t/0", lines("a", 0, 3000))
    wait_for(lambda: int(w.getx("t/0", "remote_segment_count")) >= 2, 60, interval=0.2, what="tiering")
    f = follower(prefix)
    f2 = follower(prefix, "follower2")  # two followers at once
    out = f.root / "tail.out"
    with open(out, "wb") as o:
        tail = subprocess.Popen(["tail", "-n", "+1", "-s", "0.05", "-f", f.path("t", 0)], stdout=o,
                                stderr=subprocess.DEVNULL)
    try:
        w.append("t/0", lines("b", 3000, 3000))
        # A segment tiered shows within the follow interval (plus a request).
        wait_for(lambda: int(w.getx("t/0", "remote_segment_count")) >= 4, 60, interval=0.2, what="more tiering")
        for m in (f, f2):
            wait_for(lambda: m.getx("t/0", "log_end_offset") == w.getx("t/0", "remote_log_end_offset"), 10,
                     interval=0.05, what="the follower to follow")
        final = tiered_text(w, "t/0")
        wait_for(lambda: out.stat().st_size >= len(final), 15, what="tail -f on the follower")
    finally:
        tail.terminate()
        tail.wait(10)
    assert out.read_bytes() == final  # every line once, in order
    with open(f.path("t", 0), "rb") as held:  # an open handle keeps its view through retention
        before = held.read(1000)
        os.setxattr(w.path("t", 0), "user.logfs.log_start_offset", w.getx("t/0", "remote_log_end_offset").encode())
        wait_for(lambda: f.getx("t/0", "log_start_offset") == w.getx("t/0", "log_start_offset"), 10,
                 what="the follower to see the new log start")
        assert f.read("t/0") == b""
        assert before == final[:1000]
    sh(f"rm -r {w.path('t')}")
    wait_for(lambda: "t" not in os.listdir(f.mnt), 10, what="the deleted topic to disappear")


def _writer_and_metered_follower(mount_logfs, follower, creds, tmp_path, topics: str, n: int, segments: int):
    """A writer with tiered topics (one letter each) of ``n`` lines, once each has ``segments`` tiered segments,
    and a follower of its prefix writing its metrics file every 100 ms: (prefix, writer, follower, metrics path)."""
    prefix = "fol-" + uuid.uuid4().hex[:8]
    w = mount_logfs(*writer_opts(creds, prefix))
    for topic in topics:
        tier(w, topic)
        w.append(f"{topic}/0", lines(topic, 0, n))
    wait_for(lambda: all(int(w.getx(f"{t}/0", "remote_segment_count")) >= segments for t in topics), 60,
             interval=0.2, what="tiering")
    metrics = tmp_path / "follower.prom"
    f = follower(prefix, "follower", f"logfs.metrics.file={metrics}", "logfs.metrics.interval.ms=100")
    return prefix, w, f, metrics


def test_an_idle_follower_costs_one_request_an_interval_and_rides_out_an_outage(mount_logfs, follower, creds,
                                                                                 seaweed_outage, tmp_path):
    prefix, w, f, metrics = _writer_and_metered_follower(mount_logfs, follower, creds, tmp_path, "abc", 2000, 1)
    wait_for(lambda: f.getx("c/0", "log_end_offset") == w.getx("c/0", "remote_log_end_offset"), 10,
             what="the follower")

    def requests() -> int:
        text = metrics.read_text() if metrics.exists() else ""
        values = [line.split()[-1] for line in text.splitlines() if line.startswith("logfs_follow_requests_total")]
        return int(float(values[0])) if values else -1

    wait_for(lambda: requests() >= 0, 5, what="the metrics")
    first, started = requests(), time.monotonic()
    time.sleep(3)
    rate = (requests() - first) / (time.monotonic() - started)
    assert rate <= 1.5 * 1000 / FOLLOW_MS, rate  # one index look an interval, nothing per partition
    text = f.read("a/0")
    seaweed_outage.stop()
    try:
        # Stat, listing and xattrs answer from what was seen last; nothing hangs.
        started = time.monotonic()
        assert sorted(os.listdir(f.mnt)) == ["a", "b", "c"]
        assert os.stat(f.path("a", 0)).st_size == len(text)
        assert int(f.getx("a/0", "log_end_offset")) > 0
        assert time.monotonic() - started < 5
        time.sleep(1)
    finally:
        seaweed_outage.start()
    w.append("a/0", lines("a", 2000, 3000))
    wait_for(lambda: f.getx("a/0", "log_end_offset") == w.getx("a/0", "remote_log_end_offset")
             and int(f.getx("a/0", "log_end_offset")) > 2000, 60, interval=0.2, what="following after the outage")
    assert f.read("a/0") == tiered_text(w, "a/0")


@pytest.mark.skipif(not (os.path.exists("/sbin/mount.fuse3") or os.path.exists("/usr/sbin/mount.fuse3"))
                    or os.geteuid() != 0 or not os.path.exists(LOGFS_SCRIPT),
                    reason="needs root, mount.fuse3 and the logfs console script")
def test_a_follower_through_mount_fuse3(mount_logfs, creds, tmp_path):
    """What `mount -t fuse.logfs s3://BUCKET/PREFIX MNT -o ...` and an fstab line run: mount.fuse3 with the source
    as given."""
    prefix = "fol-" + uuid.uuid4().hex[:8]
    w = mount_logfs(*writer_opts(creds, prefix))
    tier(w, "t")
    w.append("t/0", lines("m", 0, 3000))
    wait_for(lambda: int(w.getx("t/0", "remote_segment_count")) >= 1, 60, interval=0.2, what="tiering")
    f = FollowerMount(tmp_path / "viahelper", f"s3://{creds.bucket}/{prefix}")
    env = daemon_env(PATH=os.path.dirname(LOGFS_SCRIPT) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"))
    try:
        r = subprocess.run(["mount.fuse3", f.source, str(f.mnt), "-t", "logfs", "-o",
                            f"defaults,_netdev,logfs.remote.s3.endpoint={creds.endpoint},"
                            f"logfs.remote.cache.dir={f.cache},logfs.follow.interval.ms={FOLLOW_MS}"],
                           capture_output=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr.decode()
        wait_for(lambda: f.getx("t/0", "log_end_offset") == w.getx("t/0", "remote_log_end_offset"), 10,
                 what="the follower")
        assert f.read("t/0") == tiered_text(w, "t/0")
        with open("/proc/self/mountinfo") as info:
            mine = [line for line in info if f" {f.mnt} " in line]
        assert mine and "fuse.logfs" in mine[0] and f.source in mine[0] and " ro" in mine[0]
    finally:
        f.cleanup()


def test_a_followers_lag_in_its_metrics(mount_logfs, follower, creds, seaweed_outage, tmp_path):
    """The metrics file of a follower: its lag in offsets (per topic, the writer's published remote_log_end_offset
    less what the follower shows), in seconds (since it last knew it showed everything published), the writer's
    publish time of the index it applied and the delay from that publish to the follower showing it."""
    started = time.time()
    prefix, w, f, metrics = _writer_and_metered_follower(mount_logfs, follower, creds, tmp_path, "ab", 3000, 2)

    def sample() -> dict[str, float]:
        text = metrics.read_text() if metrics.exists() else ""
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("logfs_follow_")}

    def caught_up() -> bool:
        return all(f.getx(f"{t}/0", "log_end_offset") == w.getx(f"{t}/0", "remote_log_end_offset") for t in "ab")

    wait_for(caught_up, 10, what="the follower")
    wait_for(lambda: sample().get('logfs_follow_lag_offsets{topic="b"}') == 0
             and sample().get('logfs_follow_lag_offsets{topic="a"}') == 0, 10, what="the lag metrics")
    m = sample()
    assert 0 <= m["logfs_follow_lag_seconds"] <= FOLLOW_MS / 1000 + 1, m
    assert started - 1 <= m["logfs_follow_index_published_seconds"] <= time.time(), m
    assert m["logfs_follow_apply_delay_seconds"] >= 0, m

    # A change: a newer publish time, shown within the follow interval and a request (generous on a busy machine).
    changed = time.time()
    w.append("a/0", lines("a", 3000, 3000))
    wait_for(lambda: int(w.getx("a/0", "remote_log_end_offset")) > 4000, 60, interval=0.2, what="more tiering")
    wait_for(lambda: sample().get("logfs_follow_index_published_seconds", 0) >= changed, 30,
             what="the follower to apply the writer's newer index")
    wait_for(caught_up, 10, what="the follower")
    wait_for(lambda: sample().get('logfs_follow_lag_offsets{topic="a"}') == 0, 10, what="no lag in offsets")
    m = sample()
    assert 0 <= m["logfs_follow_apply_delay_seconds"] <= FOLLOW_MS / 1000 + 5, m
    assert m["logfs_follow_lag_seconds"] <= FOLLOW_MS / 1000 + 1, m

    # The store down: the follower no longer knows it is current, and its lag in seconds grows; back, it recovers.
    seaweed_outage.stop()
    try:
        wait_for(lambda: sample().get("logfs_follow_lag_seconds", 0) >= 2, 30, what="the lag to grow in an outage")
        assert sample()['logfs_follow_lag_offsets{topic="a"}'] == 0  # (the writer cannot tier meanwhile either)
    finally:
        seaweed_outage.start()
    wait_for(lambda: 0 <= sample().get("logfs_follow_lag_seconds", -1) <= FOLLOW_MS / 1000 + 1, 60,
             what="the lag to come back after the outage")


def test_the_follower_index_of_an_older_or_newer_writer_reads():
    """Version 1 (no publish time, no end offsets) reads with published_ms -1 and no end offsets; a newer version's
    unknown fields are ignored; this version's index reads back as written."""
    from logfs.remote.manifest import FollowerIndex, decode_index, encode_index

    old = decode_index(b'{"format": "logfs-follower-index", "version": 1, "generation": 3, '
                       b'"topics": {"t": {"config": {"logfs.key.separator": "="}, "partitions": {"0": 7}}}}')
    assert (old.generation, old.published_ms) == (3, -1)
    assert old.topics == {"t": {"config": {"logfs.key.separator": "="}, "partitions": {0: 7}, "end_offsets": {}}}
    newer = decode_index(b'{"format": "logfs-follower-index", "version": 9, "generation": 4, "published_ms": 5, '
                         b'"shiny": 1, "topics": {"t": {"config": {}, "partitions": {"0": 7}, '
                         b'"end_offsets": {"0": 100}, "more": {}}}}')
    assert (newer.generation, newer.published_ms, newer.topics["t"]["end_offsets"]) == (4, 5, {0: 100})
    index = FollowerIndex(2, {"t": {"config": {"a": "b"}, "partitions": {0: 1, 1: 2},
                                    "end_offsets": {0: 10, 1: 0}}}, 1_700_000_000_123)
    assert decode_index(encode_index(index)) == index


def test_manifests_of_many_changed_partitions_are_read_at_once_and_applied_in_order():
    """Catching up on many partitions: their manifests are read by a few threads at once (not one GET after
    another), each applied in the index's order; a failure stops the apply there and the readers take no more."""
    import random
    import threading
    import types

    from logfs.storage.tiered import follower as follower_mod
    from logfs.storage.tiered.follower import Follower

    keys = [("t", p) for p in range(follower_mod.MANIFEST_CHUNK * 2 + 17)]
    active, most, read, lock = [0], [0], [], threading.Lock()

    def slow_read(topic, partition):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            read.append(partition)
        time.sleep(random.random() * 0.002)
        with lock:
            active[0] -= 1
        if partition == fail_at[0]:
            raise OSError("the store failed")
        return (topic, partition)

    fail_at = [-1]
    fake = types.SimpleNamespace(manifests=types.SimpleNamespace(read=slow_read), requests=0)
    got = list(Follower._read_manifests(fake, keys))
    assert got == [(k, k) for k in keys]
    assert fake.requests == len(keys)
    assert 1 < most[0] <= follower_mod.MANIFEST_READERS

    read.clear()
    fail_at[0] = 40
    fake.requests = 0
    applied = []
    with pytest.raises(OSError, match="the store failed"):
        for key, m in Follower._read_manifests(fake, keys):
            applied.append(key)
    assert applied == keys[:40]
    time.sleep(0.1)
    assert len(read) < follower_mod.MANIFEST_CHUNK  # the next chunk was never started
    assert list(Follower._read_manifests(fake, keys[:1])) == [(keys[0], keys[0])]  # one: read inline


def test_descriptor_positions_on_tiered_and_follower_partitions(mount_logfs, follower, creds):
    """CONTRACT section 4, "Positions belong to a view", for a tiered partition (its local copies deleted by local
    retention) on the writer and the same partition on a follower: a descriptor opened before DeleteRecords answers
    position./offset. in its own view, and reading there gives the record asked for. Below the new start, the
    tiered objects are deleted from the bucket: there the answer is the record's, or EIO once its objects are gone
    and not cached (README, "Tiered storage"), never another record's."""
    prefix = "fol-" + uuid.uuid4().hex[:8]
    w = mount_logfs(*writer_opts(creds, prefix))
    tier(w, "t")
    text = lines("p", 0, 4000)
    w.append("t/0", text)
    wait_for(lambda: int(w.getx("t/0", "remote_segment_count")) >= 3, 60, interval=0.2, what="tiering")
    wait_for(lambda: int(w.getx("t/0", "local_log_start_offset")) > 0, 30, what="local retention")
    f = follower(prefix)
    end = int(w.getx("t/0", "remote_log_end_offset"))
    wait_for(lambda: f.getx("t/0", "log_end_offset") == str(end), 10, what="the follower to follow")
    records = text.splitlines(keepends=True)
    fds = [os.open(w.path("t", 0), os.O_RDONLY), os.open(f.path("t", 0), os.O_RDONLY)]
    try:
        cut = end // 2
        os.setxattr(w.path("t", 0), "user.logfs.log_start_offset", str(cut).encode())
        wait_for(lambda: f.getx("t/0", "log_start_offset") == str(cut), 10, what="the follower to see the start")
        assert f.getx("t/0", f"position.{cut}") == "0"
        for fd in fds:
            assert int(os.getxattr(fd, "user.logfs.log_start_offset")) == 0
            for n in range(0, end, end // 23):
                try:
                    pos = int(os.getxattr(fd, f"user.logfs.position.{n}"))
                    assert os.pread(fd, len(records[n]), pos) == records[n], n
                    assert int(os.getxattr(fd, f"user.logfs.offset.{pos}")) == n
                except OSError as exc:
                    assert exc.errno == errno.EIO and n < cut, (n, exc)  # (from the new start on: all there)
    finally:
        for fd in fds:
            os.close(fd)

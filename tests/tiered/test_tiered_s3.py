"""Tiered storage through the mount, against a real S3-compatible server (SeaweedFS, with auth): the issue's
acceptance (whole log readable through the mount, segments in the bucket in Kafka's format, remount), an outage,
the secret kept out of DATA_DIR and the logs, and every mount-time error."""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid

from harness import daemon_env, expect_errno, sh, wait_for
from remote_store import s3_tiering

SEGMENT = 1 << 20


def opts(seaweed, prefix, *extra, endpoint=None, bucket=None):
    return s3_tiering(seaweed, prefix, segment_bytes=SEGMENT, interval_ms=200, endpoint=endpoint, bucket=bucket) + (
        "logfs.remote.cache.bytes=4194304",) + extra


def records(start: int, n: int) -> bytes:
    return b"".join(b"rec-%08d-%s\n" % (i, b"v" * (60 + i % 50)) for i in range(start, start + n))


def tier_topic(fs, topic="t", local_bytes=3 * SEGMENT):
    os.mkdir(fs.path(topic))
    sh(f"setfattr -n user.logfs.config.remote.storage.enable -v true {fs.path(topic)}")
    sh(f"setfattr -n user.logfs.config.local.retention.bytes -v {local_bytes} {fs.path(topic)}")


def bucket_logs(seaweed, prefix, topic="t", partition=0) -> dict[str, bytes]:
    client = seaweed._client()
    out = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=seaweed.bucket,
                                                             Prefix=f"{prefix}/{topic}-{partition}/")
    for page in pages:
        for o in page.get("Contents", []):
            if o["Key"].endswith(".log"):
                try:
                    out[o["Key"]] = client.get_object(Bucket=seaweed.bucket, Key=o["Key"])["Body"].read()
                except client.exceptions.NoSuchKey:
                    pass  # deleted since the listing (retention runs meanwhile): not in the bucket any more
    return out


def kafka_offsets(blobs: dict[str, bytes]) -> list[int]:
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    offsets = []
    for key in sorted(blobs):
        data = blobs[key]
        mr = MemoryRecords(data)
        consumed = 0
        while mr.has_next():
            batch = mr.next_batch()
            assert isinstance(batch, DefaultRecordBatch) and batch.magic == 2 and batch.validate_crc()
            consumed += batch.size_in_bytes
            offsets.extend(r.offset for r in batch)
        assert consumed == len(data), key
    return offsets


def append_in_chunks(fs, start: int, total: int, chunk: int = 20000) -> bytes:
    out = []
    for s in range(start, start + total, chunk):
        data = records(s, min(chunk, start + total - s))
        fs.append("t/0", data)
        out.append(data)
    return b"".join(out)


def test_acceptance_whole_log_through_the_mount(mount_logfs, creds):
    prefix = "acc-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix))
    tier_topic(fs)
    appended = append_in_chunks(fs, 0, 310_000)  # ~30 MB
    assert len(appended) > 30_000_000
    wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= 20
             and int(fs.getx("t/0", "segment_count")) <= 5, 180, interval=0.5, what="segments tiered")
    # In the bucket, in Kafka's format: kafka-python parses them, every offset once from 0. Tiering may still be
    # uploading the last rolled segments: the bucket is compared with the remote log end when neither moved.
    deadline = time.monotonic() + 60
    while True:
        remote_end = int(fs.getx("t/0", "remote_log_end_offset"))
        logs = bucket_logs(creds, prefix)
        offsets = kafka_offsets(logs)
        if int(fs.getx("t/0", "remote_log_end_offset")) == remote_end == len(offsets) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(logs) >= 20
    assert offsets == list(range(len(offsets))) and offsets[0] == 0
    assert remote_end == len(offsets)
    assert int(fs.getx("t/0", "local_log_start_offset")) > 0
    assert int(fs.getx("t/0", "remote_size_bytes")) >= 20 * (SEGMENT - 70_000)
    assert fs.getx("t/0", "log_start_offset") == "0"

    def check():
        assert os.stat(fs.path("t", 0)).st_size == len(appended)
        target = 1234
        pos = int(fs.getx("t/0", f"position.{target}"))
        with open(fs.path("t", 0), "rb") as f:
            f.seek(pos)
            assert f.readline() == records(target, 1)
        assert int(fs.getx("t/0", f"offset.{pos + 5}")) == target
        assert fs.read("t/0") == appended

    check()
    fs.remount()
    check()


def test_store_down_appends_go_on_tiered_reads_fail_fast_then_resume(mount_logfs, creds, seaweed_outage):
    prefix = "out-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix))
    tier_topic(fs, local_bytes=2 * SEGMENT)
    first = append_in_chunks(fs, 0, 80_000)
    wait_for(lambda: int(fs.getx("t/0", "local_log_start_offset")) > 0, 120, interval=0.3, what="local deletes")
    seaweed_outage.stop()
    try:
        # Appends and local reads go on; local segments wait for their upload instead of being deleted.
        second = append_in_chunks(fs, 80_000, 60_000)
        local_start = int(fs.getx("t/0", "local_log_start_offset"))
        local_pos = int(fs.getx("t/0", f"position.{local_start}"))
        with open(fs.path("t", 0), "rb") as f:
            f.seek(local_pos)
            assert f.read(4096) == (first + second)[local_pos:local_pos + 4096]
            # A tiered range that is not cached: EIO, at once with connections refused (bound: 22 s).
            t0 = time.monotonic()
            f.seek(10)
            expect_errno(errno.EIO, f.read, 100)
            assert time.monotonic() - t0 < 25
        time.sleep(1.5)
        assert int(fs.getx("t/0", "segment_count")) >= 5  # nothing deleted locally while the store is down
    finally:
        seaweed_outage.start()
    # Uploads resume; nothing is lost.
    wait_for(lambda: int(fs.getx("t/0", "segment_count")) <= 4, 120, interval=0.5, what="uploads to resume")
    assert fs.read("t/0") == first + second
    # Mounting with the store down: the mount comes up showing the whole log (from the local copy of the
    # manifest); tiered ranges fail with EIO until the store is back.
    fs.unmount()
    seaweed_outage.stop()
    try:
        fs.mount(*fs.options)
        assert os.stat(fs.path("t", 0)).st_size == len(first + second)
        assert fs.getx("t/0", "log_start_offset") == "0"
        with open(fs.path("t", 0), "rb") as f:
            expect_errno(errno.EIO, f.read, 100)
    finally:
        seaweed_outage.start()
    assert fs.read("t/0") == first + second
    offsets = kafka_offsets(bucket_logs(creds, prefix))
    assert offsets == list(range(len(offsets)))


def test_secret_in_no_file_and_no_log_line(mount_logfs, creds):
    prefix = "sec-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix, "debug"), foreground=True)  # every module's DEBUG lines too
    tier_topic(fs, local_bytes=SEGMENT)
    append_in_chunks(fs, 0, 40_000)
    wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= 2, 60, interval=0.3, what="uploads")
    with open(fs.path("t", 0), "rb") as f:
        f.read(1000)
    fs.unmount()
    secret = creds.secret_key.encode()
    for dirpath, _, files in os.walk(fs.data):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                assert secret not in f.read(), os.path.join(dirpath, name)
    assert creds.secret_key not in fs.stderr()
    assert "tiered storage to s3://" in fs.stderr() and " DEBUG " in fs.stderr()


def _mount_fails(tmp_path, *options, env=None) -> str:
    data, mnt = tmp_path / "d", tmp_path / "m"
    mnt.mkdir(exist_ok=True)
    cmd = [os.sys.executable, "-m", "logfs.cli", str(data), str(mnt), "-o", ",".join(options)]
    r = subprocess.run(cmd, capture_output=True, timeout=120, env=env or daemon_env(), stdin=subprocess.DEVNULL)
    assert r.returncode != 0, r.stderr
    assert not os.path.ismount(mnt)
    return r.stderr.decode()


def test_mount_errors(tmp_path, mount_logfs, creds):
    err = _mount_fails(tmp_path, *opts(creds, "x", bucket="no-such-bucket-" + uuid.uuid4().hex[:6]))
    assert "bucket does not exist" in err
    err = _mount_fails(tmp_path, *opts(creds, "x", endpoint="not a url"))
    assert "endpoint" in err
    bad = daemon_env(AWS_SECRET_ACCESS_KEY="wrong-" + creds.secret_key[:4])
    err = _mount_fails(tmp_path, *opts(creds, "x"), env=bad)
    assert "SignatureDoesNotMatch" in err or "AccessDenied" in err or "credentials" in err
    assert "wrong-" not in err
    err = _mount_fails(tmp_path, "remote.log.storage.system.enable=true")
    assert "logfs.remote.s3.bucket" in err
    err = _mount_fails(tmp_path, *opts(creds, "x", "logfs.remote.cache.bytes=-5"))
    assert "logfs.remote.cache.bytes" in err
    err = _mount_fails(tmp_path, *opts(creds, "x", "remote.log.manager.task.interval.ms=abc"))
    assert "remote.log.manager.task.interval.ms" in err
    # An unreachable store at mount is logged and retried: the mount comes up.
    fs = mount_logfs(*opts(creds, "x", endpoint="http://127.0.0.1:9"))
    os.mkdir(fs.path("c"))
    sh(f"setfattr -n user.logfs.config.cleanup.policy -v compact {fs.path('c')}")
    expect_errno(errno.EINVAL, os.setxattr, fs.path("c"), "user.logfs.config.remote.storage.enable", b"true")
    os.mkdir(fs.path("t"))
    os.setxattr(fs.path("t"), "user.logfs.config.remote.storage.enable", b"true")
    expect_errno(errno.EINVAL, os.setxattr, fs.path("t"), "user.logfs.config.cleanup.policy", b"compact")
    expect_errno(errno.EINVAL, os.setxattr, fs.path("t"), "user.logfs.config.remote.storage.enable", b"false")
    expect_errno(errno.EINVAL, os.setxattr, fs.path("t"), "user.logfs.config.local.retention.ms", b"-3")
    fs.append("t/0", b"still appends\n")
    assert fs.read("t/0") == b"still appends\n"


def test_stalled_store_fails_a_tiered_read_in_bounded_time_and_blocks_nothing_else(mount_logfs, creds,
                                                                                    stall_proxy):
    import threading

    prefix = "stall-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix, endpoint=stall_proxy.endpoint))
    tier_topic(fs, local_bytes=SEGMENT)
    data = append_in_chunks(fs, 0, 40_000)
    wait_for(lambda: int(fs.getx("t/0", "local_log_start_offset")) > 0, 60, interval=0.3, what="local deletes")
    stall_proxy.stalled = True
    outcome = {}

    def tiered_read():
        t0 = time.monotonic()
        try:
            with open(fs.path("t", 0), "rb") as f:
                f.read(100)
            outcome["result"] = "read"
        except OSError as exc:
            outcome["result"] = exc.errno
        outcome["seconds"] = time.monotonic() - t0

    reader = threading.Thread(target=tiered_read)
    reader.start()
    time.sleep(1)
    # The mount goes on meanwhile: stat, xattrs, appends, local reads.
    t0 = time.monotonic()
    assert os.stat(fs.path("t", 0)).st_size == len(data)
    fs.append("t/0", b"during the stall\n")
    local = int(fs.getx("t/0", "local_log_start_offset"))
    pos = int(fs.getx("t/0", f"position.{local}"))
    with open(fs.path("t", 0), "rb") as f:
        f.seek(pos)
        assert f.read(100) == data[pos:pos + 100]
    assert time.monotonic() - t0 < 2
    reader.join(40)
    assert outcome.get("result") == errno.EIO and outcome["seconds"] < 25, outcome
    stall_proxy.stalled = False


def test_a_stalled_store_at_mount_is_logged_and_the_mount_comes_up(mount_logfs, creds, stall_proxy):
    stall_proxy.stalled = True
    start = time.monotonic()
    fs = mount_logfs(*opts(creds, "stalled-" + uuid.uuid4().hex[:6], endpoint=stall_proxy.endpoint),
                     foreground=True)
    assert time.monotonic() - start < 30
    assert "cannot be reached" in fs.stderr() and "no answer within 10 s" in fs.stderr()
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"x\n")
    assert fs.read("t/0") == b"x\n"
    stall_proxy.stalled = False


def test_unmount_does_not_wait_for_an_upload_stalled_midway(mount_logfs, creds, stall_proxy):
    """A store that stops answering in the middle of an upload holds that call for its whole time bound (~50 s);
    a clean unmount does not wait for it: nothing is committed for that segment, and after a remount it is
    uploaded again, with nothing lost or doubled."""
    prefix = "unmount-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix, endpoint=stall_proxy.endpoint), foreground=True)
    tier_topic(fs, local_bytes=SEGMENT)
    data = append_in_chunks(fs, 0, 10_000)
    wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= 1, 60, interval=0.2, what="a first upload")
    stall_proxy.stall_after_bytes = 64 * 1024  # every connection, once it has sent 64 KiB more, goes quiet
    data += append_in_chunks(fs, 10_000, 20_000)
    tiered = int(fs.getx("t/0", "remote_segment_count"))
    time.sleep(2)  # the next upload has started (every 200 ms) and stalled
    assert int(fs.getx("t/0", "remote_segment_count")) == tiered
    start = time.monotonic()
    fs.unmount()
    took = time.monotonic() - start
    assert took < 10, f"the unmount took {took:.1f} s"
    assert "clean shutdown complete" in fs.stderr()

    stall_proxy.stall_after_bytes = None
    fs.mount(*fs.options, foreground=True)
    # 30,000 records of ~120 bytes in 1 MiB segments: three rolled ones, the last ending past offset 20,000.
    wait_for(lambda: int(fs.getx("t/0", "remote_log_end_offset")) > 20_000, 60, interval=0.3,
             what="the uploads after the remount")
    assert fs.read("t/0") == data
    end = int(fs.getx("t/0", "remote_log_end_offset"))
    assert kafka_offsets(bucket_logs(creds, prefix)) == list(range(end))  # once each: no orphan left over
    fs.unmount()


def test_delete_records_on_a_tiered_partition(mount_logfs, creds):
    """DeleteRecords (CONTRACT section 4) on a tiered partition: the manifest, the whole log's start, holds the new
    start before the call returns (a remount or the Spark source from the bucket never shows the records again),
    and whole-log retention deletes the tiered segments wholly below it from the bucket."""
    from logfs.remote.manifest import decode, manifest_key

    prefix = "dr-" + uuid.uuid4().hex[:8]
    fs = mount_logfs(*opts(creds, prefix), foreground=True)
    tier_topic(fs, local_bytes=SEGMENT)
    appended = append_in_chunks(fs, 0, 60_000)
    wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= 3, 120, interval=0.3, what="uploads")
    remote_end = int(fs.getx("t/0", "remote_log_end_offset"))
    target = remote_end - 10  # inside the last tiered segment: the ones before it are wholly below
    os.setxattr(fs.path("t", 0), "user.logfs.log_start_offset", str(target).encode())
    key = manifest_key(prefix, "t", 0)

    def manifest():  # (SeaweedFS may answer NoSuchKey for a moment while an object is replaced)
        try:
            return decode(creds._client().get_object(Bucket=creds.bucket, Key=key)["Body"].read())
        except creds._client().exceptions.NoSuchKey:
            return None

    # Durable in the bucket before the call returned (a later pass only moves the start further with retention).
    assert wait_for(manifest, 10, what="the manifest").log_start_offset == target
    lines = appended.splitlines()
    assert fs.read("t/0").splitlines() == lines[target:]

    def below_gone() -> bool:  # no .log object left whose records all lie below the new start
        blobs = bucket_logs(creds, prefix)
        return bool(blobs) and all(max(kafka_offsets({k: v})) >= target for k, v in blobs.items())

    wait_for(below_gone, 60, interval=0.3, what="whole-log retention to delete the tiered segments below the start")
    assert min(kafka_offsets(bucket_logs(creds, prefix))) <= target  # the segment holding it stays
    fs.remount()
    assert int(fs.getx("t/0", "log_start_offset")) == target
    assert fs.read("t/0").splitlines() == lines[target:]


def test_tiering_in_every_log_directory(mount_logfs, creds):
    """Two log directories (CONTRACT section 12): each one's partitions tier, read back whole through the mount,
    and a tiered partition is not moved (EOPNOTSUPP: its remote cache and tiering state live in its directory)."""
    prefix = "dirs-" + uuid.uuid4().hex[:8]
    dirs: list[str] = []

    def prepare(m):
        dirs.extend(str(m.root / f"disk{i}") for i in (1, 2))
        m.source = ",".join(dirs)

    fs = mount_logfs(*opts(creds, prefix, "num.partitions=2"), prepare=prepare)
    tier_topic(fs, local_bytes=2 * SEGMENT)
    assert [fs.getx(f"t/{p}", "log_dir") for p in (0, 1)] == dirs
    appended = {0: b"", 1: b""}
    for start in range(0, 60_000, 20_000):  # ~6 MB each
        for p in (0, 1):
            data = records(start, 20_000)
            fs.append(f"t/{p}", data)
            appended[p] += data
    wait_for(lambda: all(int(fs.getx(f"t/{p}", "remote_segment_count")) >= 3 for p in (0, 1)), 120, interval=0.5,
             what="both directories' partitions tiered")
    wait_for(lambda: all(int(fs.getx(f"t/{p}", "local_log_start_offset")) > 0 for p in (0, 1)), 120, interval=0.5,
             what="local retention in both directories")
    for p in (0, 1):
        with open(fs.path("t", p), "rb") as f:
            assert f.read() == appended[p]
    expect_errno(errno.EOPNOTSUPP, os.setxattr, fs.path("t", 0), "user.logfs.log_dir", dirs[1].encode())

"""The ``logfs`` source reading a tiered log from its bucket (``load("s3://BUCKET/PREFIX")``): a daemon tiers a
topic to SeaweedFS, then the 2-worker standalone cluster reads it from the bucket alone (no mount, no DATA_DIR);
the error cases come back to the driver as clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import threading
import time
import uuid

import pytest

pytest.importorskip("pyspark")
from logfs.testing.spark_standalone import ClusterJobError  # noqa: E402

from logfs.remote.s3 import S3Store  # noqa: E402
from logfs.spark.bucket import BucketPartitionReader, TieredPartitionReader  # noqa: E402
from logfs.spark.options import OptionError, SourceOptions, plan_batch  # noqa: E402
from logfs.spark.segments import PartitionReader, TopicPartition  # noqa: E402
from logfs.storage.errors import DataLossError  # noqa: E402
from logfs.storage.format.records import decode_raw  # noqa: E402
from harness import wait_for  # noqa: E402

SEGMENT = 64 * 1024
ROLL_MS = 2000  # segment.ms of the streaming test


def records(start: int, n: int) -> bytes:
    return b"".join(b"rec-%06d-%s\n" % (i, b"v" * (40 + i % 50)) for i in range(start, start + n))


def bucket_records(seaweed, prefix: str, topic: str, partition: int, only=None) -> list[tuple]:
    """(offset, timestamp, key, value) of every record in the partition's .log objects (or only in those whose key
    is in ``only``), parsed by kafka-python."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    client = seaweed._client()
    out = []
    listing = client.list_objects_v2(Bucket=seaweed.bucket, Prefix=f"{prefix}/{topic}-{partition}/")
    for obj in sorted(listing.get("Contents", []), key=lambda o: o["Key"]):
        if obj["Key"].endswith(".log") and (only is None or obj["Key"] in only):
            mr = MemoryRecords(client.get_object(Bucket=seaweed.bucket, Key=obj["Key"])["Body"].read())
            while mr.has_next():
                batch = mr.next_batch()
                assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
                out += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    return out


class CountingS3Store(S3Store):
    """The real store, counting the bytes its ranged GETs return per object kind."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.fetched: dict[str, int] = {}

    def get_range(self, key, start, length):
        data = super().get_range(key, start, length)
        ext = key.rsplit(".", 1)[-1]
        self.fetched[ext] = self.fetched.get(ext, 0) + len(data)
        return data


def tier(mount_logfs, seaweed, prefix: str, n: int, *extra, unmount: bool = True):
    """A daemon tiers ``n`` records of topic t (partition 0) to the bucket, then is unmounted (the bucket then
    holds exactly what the manifest lists). Returns (remote log end offset, remote segment count) (and the
    mount, with ``unmount=False``)."""
    fs = mount_logfs(*extra, "remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={seaweed.bucket}",
                     f"logfs.remote.s3.endpoint={seaweed.endpoint}", f"logfs.remote.s3.prefix={prefix}",
                     f"log.segment.bytes={SEGMENT}", "log.index.interval.bytes=2048",
                     "remote.log.manager.task.interval.ms=200", "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("t"))
    subprocess.run(["setfattr", "-n", "user.logfs.config.remote.storage.enable", "-v", "true", fs.path("t")],
                   check=True)
    for s in range(0, n, 40):  # a write is one batch: ~3 KB batches, several index entries per segment
        fs.append("t/0", records(s, min(40, n - s)))
    if unmount:  # every rolled segment tiered
        wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) >= int(fs.getx("t/0", "segment_count")) - 1
                 > 5, 60, interval=0.3, what="segments tiered")
    else:  # tiered, and some deleted locally
        wait_for(lambda: int(fs.getx("t/0", "remote_segment_count")) > 5
                 and int(fs.getx("t/0", "local_log_start_offset")) > 0, 60, interval=0.3, what="segments tiered")
    end, count = int(fs.getx("t/0", "remote_log_end_offset")), int(fs.getx("t/0", "remote_segment_count"))
    if not unmount:
        return end, count, fs
    fs.unmount()
    return end, count


@pytest.mark.mount
def test_cluster_reads_exactly_the_tiered_records_from_the_bucket(cluster_driver, mount_logfs, creds):
    prefix = "spark-" + uuid.uuid4().hex[:8]
    remote_end, segments = tier(mount_logfs, creds, prefix, 12_000)
    assert remote_end > 5000
    path = f"s3://{creds.bucket}/{prefix}"
    expected = bucket_records(creds, prefix, "t", 0)
    assert [r[0] for r in expected] == list(range(remote_end))

    result = cluster_driver.run("read", path=path, options={
        "s3.endpoint": creds.endpoint, "s3.region": "us-east-1", "subscribe": "t",
        "maxRecordsPerPartition": "2500"}, columns=["offset", "timestamp", "key", "value", "topic", "partition"])
    parts = result["partitions"]
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["offset"])
    assert [(r["offset"], r["timestamp"], r["key"], r["value"]) for r in rows] == expected
    assert {(r["topic"], r["partition"]) for r in rows} == {("t", 0)}
    assert rows[7]["value"] == records(7, 1).rstrip(b"\n")
    assert len({p["executor"]["executor_id"] for p in parts if p["rows"]}) == 2  # both workers read

    # An offset range inside the log, by options, on the cluster too.
    result = cluster_driver.run("read", path=path, options={
        "s3.endpoint": creds.endpoint, "assign": '{"t":[0]}', "startingOffsets": '{"t":{"0":3001}}',
        "endingOffsets": '{"t":{"0":3011}}'}, columns=["offset", "value"])
    assert sorted((r["offset"], r["value"]) for p in result["partitions"] for r in p["rows"]) == [
        (r[0], r[3]) for r in expected[3001:3011]]

    # An executor fetches only the bytes of its range: ten records in a middle segment cost a few KB of one
    # segment's .log (ranged GETs guided by its remote .index), not the segment, let alone the log.
    store = CountingS3Store(creds.bucket, endpoint=creds.endpoint)
    reader = BucketPartitionReader(store, prefix, TopicPartition("t", 0))
    got = [(r.offset, r.value) for _, data in reader.batches(3001, 3011) for r in decode_raw(data)
           if 3001 <= r.offset < 3011]
    assert got == [(r[0], r[3]) for r in expected[3001:3011]]
    assert 0 < store.fetched["log"] < 4 * 4096 < SEGMENT, store.fetched
    assert reader.offsets() == (0, remote_end)

    # The plan cuts on segment boundaries (segments of ~650 records here, input partitions of at most 2500):
    # reading every input partition fetches each segment's bytes exactly once in all, however the work spreads.
    segments = reader.manifest().segments
    plan = plan_batch(SourceOptions.parse({"path": path, "s3.endpoint": creds.endpoint, "subscribe": "t",
                                           "maxRecordsPerPartition": "2500"}))
    assert len(plan) >= remote_end // 2500 and max(r.size for r in plan) <= 2500
    assert {r.start for r in plan} <= {s.base_offset for s in segments}
    counting = CountingS3Store(creds.bucket, endpoint=creds.endpoint)
    for r in plan:
        assert sum(1 for _ in BucketPartitionReader(counting, prefix, TopicPartition("t", 0)).batches(r.start, r.end))
    assert counting.fetched["log"] == sum(s.size for s in segments)

    # A segment deleted from the bucket after its manifest was read (as the daemon's retention does: manifest
    # first, objects next): skipped, or with failOnDataLoss a DataLossError naming it.
    gone = reader.manifest().segments[1]
    for key in gone.keys():
        creds._client().delete_object(Bucket=creds.bucket, Key=key)
    got = [r.offset for _, data in reader.batches(0, remote_end) for r in decode_raw(data)]
    assert got == [o for o in range(remote_end) if not gone.base_offset <= o < gone.next_offset]
    with pytest.raises(DataLossError, match=rf"t-0: segment {gone.base_offset} was removed from the bucket"):
        list(reader.batches(0, remote_end, fail_on_data_loss=True))

    # A corrupt segment object (a flipped byte in a record of segment 2): a clear error naming the object, from
    # the executor that read it, and nothing returned.
    client = creds._client()
    key = [o.key for o in store.list(f"{prefix}/t-0/") if o.key.endswith(".log")][2]
    blob = bytearray(client.get_object(Bucket=creds.bucket, Key=key)["Body"].read())
    blob[len(blob) // 2] ^= 0xFF
    client.put_object(Bucket=creds.bucket, Key=key, Body=bytes(blob))
    with pytest.raises(ClusterJobError, match=rf"RemoteCorruptError: {key}: .*(CRC|batch)") as caught:
        cluster_driver.run("read", path=path, options={"s3.endpoint": creds.endpoint, "subscribe": "t"})
    assert "CorruptRecordError" not in str(caught.value)


@pytest.mark.mount
def test_local_data_dir_reads_the_whole_log_as_cat_shows_it(cluster_driver, mount_logfs, creds):
    prefix = "whole-" + uuid.uuid4().hex[:8]
    remote_end, _, fs = tier(mount_logfs, creds, prefix, 9_000, f"log.local.retention.bytes={3 * SEGMENT}",
                             unmount=False)
    fs.append("t/0", records(9_000, 500))  # beyond the tiered offsets: only in the local segments
    remote_end = int(fs.getx("t/0", "remote_log_end_offset"))
    assert 0 < int(fs.getx("t/0", "local_log_start_offset")) <= remote_end < 9_500
    options = {"s3.endpoint": creds.endpoint, "subscribe": "t", "maxRecordsPerPartition": "2000"}
    path = f"s3://{creds.bucket}/{prefix}"

    rows = sorted((r for p in cluster_driver.run("read", path=path, options={
        **options, "localDataDir": str(fs.data)}, columns=["offset", "value"])["partitions"] for r in p["rows"]),
        key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == list(range(9_500))  # no gap, no duplicate at the seam
    assert b"".join(r["value"] + b"\n" for r in rows) == fs.read("t/0")
    # Without it, the tiered offsets only (the daemon may have tiered more meanwhile).
    rows = [r for p in cluster_driver.run("read", path=path, options=options, columns=["offset"])["partitions"]
            for r in p["rows"]]
    offsets = sorted(r["offset"] for r in rows)
    assert offsets == list(range(len(offsets))) and remote_end <= len(offsets) < 9_500

    # The seam moving under a read, made deterministic: the reader's first look at the manifest is the one the
    # daemon wrote before its last uploads (its end below the local log start: those segments are gone locally
    # by now); the local part then finds its start deleted and the rest comes from the bucket's current
    # manifest. No offset is skipped or read twice.
    local_start = int(fs.getx("t/0", "local_log_start_offset"))

    class Local(PartitionReader):
        started = False

        def batches(self, *args, **kw):
            Local.started = True
            return super().batches(*args, **kw)

    class Stale(BucketPartitionReader):
        looks = 0

        def manifest(self):
            m = super().manifest()
            Stale.looks += 1
            if not Local.started:  # until the local part starts, the earlier manifest
                m = dataclasses.replace(m, segments=tuple(s for s in m.segments if s.next_offset < local_start))
                assert 0 < m.remote_log_end_offset < local_start
            return m

    store = S3Store(creds.bucket, endpoint=creds.endpoint)
    tp = TopicPartition("t", 0)
    whole = TieredPartitionReader(Stale(store, prefix, tp), Local(str(fs.data), tp))
    got = [r.offset for _, data in whole.batches(0, 9_500) for r in decode_raw(data)]
    assert got == list(range(9_500)) and Local.started

    # Again while appends go on, so that segments are rolled, tiered and deleted locally under the read: every
    # offset up to the planned end once, each its own line.
    stop = threading.Event()

    def append():
        s = 9_500
        while not stop.is_set():
            fs.append("t/0", records(s, 40))
            s += 40
            time.sleep(0.01)  # ~5 segments a second: rolled, tiered and deleted while the read runs

    writer = threading.Thread(target=append)
    writer.start()
    try:
        # Both: the tiering of what was there before the writer started can alone move the remote end.
        wait_for(lambda: int(fs.getx("t/0", "remote_log_end_offset")) > remote_end + 500
                 and int(fs.getx("t/0", "log_end_offset")) > 9_500 + 200, 30, interval=0.2,
                 what="tiering under the appends")
        appended = int(fs.getx("t/0", "log_end_offset"))  # the read plans at least this far
        rows = sorted((r for p in cluster_driver.run("read", path=path, options={
            **options, "localDataDir": str(fs.data)}, columns=["offset", "value"])["partitions"]
            for r in p["rows"]), key=lambda r: r["offset"])
    finally:
        stop.set()
        writer.join()
    assert [r["offset"] for r in rows] == list(range(len(rows))) and len(rows) >= appended > 9_500
    assert all(r["value"] == records(r["offset"], 1).rstrip(b"\n") for r in rows)


@pytest.mark.mount
def test_a_stream_from_the_bucket_picks_up_new_segments_and_restarts_from_its_checkpoint(
        cluster_driver, mount_logfs, creds, tmp_path):
    prefix = "stream-" + uuid.uuid4().hex[:8]
    first_end, segments, fs = tier(mount_logfs, creds, prefix, 6_000, f"log.local.retention.bytes={3 * SEGMENT}",
                                   f"log.roll.ms={ROLL_MS}", unmount=False)
    path = f"s3://{creds.bucket}/{prefix}"
    run = dict(path=path, options={"s3.endpoint": creds.endpoint, "subscribe": "t", "startingOffsets": "earliest",
                                   "maxOffsetsPerTrigger": "2500"},
               checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"))
    first = cluster_driver.run("stream", **run)
    assert first["offsets"]["0"] == list(range(len(first["offsets"]["0"])))
    assert len(first["offsets"]["0"]) >= first_end

    # More records; once their segments are tiered, a restart from the checkpoint reads exactly those.
    for s in range(6_000, 9_000, 40):
        fs.append("t/0", records(s, 40))
    wait_for(lambda: int(fs.getx("t/0", "remote_log_end_offset")) > len(first["offsets"]["0"]) + 1500, 30,
             interval=0.3, what="the new segments tiered")
    second = cluster_driver.run("stream", **run)
    offsets = second["offsets"]["0"]
    assert offsets == list(range(len(offsets))) and len(offsets) > len(first["offsets"]["0"]) + 1500  # once each
    assert json.loads(second["end"]) == {"t": {"0": len(offsets)}}

    # A running query (processing-time trigger, 1 s), restarted from the same checkpoint, picks up each newly
    # tiered segment within a bound: the trigger interval plus one micro-batch. And a line appended to a partition
    # that then goes idle reaches the stream within segment.ms (the daemon rolls idle segments on time) + the
    # upload interval + that bound.
    started = cluster_driver.run("stream_start", interval="1 second", **run)["id"]
    try:
        def stream_end():
            progress = cluster_driver.run("stream_progress", id=started)
            return progress["end"]["t"]["0"] if progress["end"] else 0

        wait_for(lambda: stream_end() >= int(fs.getx("t/0", "remote_log_end_offset")), 60, interval=0.2,
                 what="the restarted stream catching up")
        pickups = []
        s = int(fs.getx("t/0", "log_end_offset"))
        for _ in range(3):  # one segment at a time: append until a new segment is tiered, then time the pickup
            tiered = int(fs.getx("t/0", "remote_log_end_offset"))
            while int(fs.getx("t/0", "remote_log_end_offset")) == tiered:
                fs.append("t/0", records(s, 40))
                s += 40
                time.sleep(0.02)
            seen_tiered = time.monotonic()
            tiered = int(fs.getx("t/0", "remote_log_end_offset"))
            wait_for(lambda: stream_end() >= tiered, 30, interval=0.1, what=f"the stream reaching offset {tiered}")
            pickups.append(time.monotonic() - seen_tiered)
        marker = s
        fs.append("t/0", records(marker, 1))
        appended = time.monotonic()
        wait_for(lambda: stream_end() > marker, 60, interval=0.1, what="the idle partition's last line")
        lag = time.monotonic() - appended
        print(f"pickup after tiering: {', '.join(f'{p:.2f}' for p in pickups)} s; append to stream: {lag:.2f} s")
        # Bounds with room for a loaded 2-core machine: the trigger (1 s) + a micro-batch on the cluster.
        assert max(pickups) < 12, pickups
        assert lag < ROLL_MS / 1000 + 0.2 + 12, lag
    finally:
        final = cluster_driver.run("stream_stop", id=started, output=run["output"])
    offsets = final["offsets"]["0"]
    assert offsets == list(range(marker + 1))  # every offset once, over the three runs from one checkpoint


def test_bucket_errors_reach_the_driver_clearly(cluster_driver, creds):
    prefix = "err-" + uuid.uuid4().hex[:8]
    path = f"s3://{creds.bucket}/{prefix}"
    client = creds._client()
    client.put_object(Bucket=creds.bucket, Key=f"{prefix}/bad-0/manifest.json", Body=b"{not json")
    base = {"s3.endpoint": creds.endpoint}

    # Unknown topic: subscribe/subscribePattern read nothing; assign names it.
    for how in ({"subscribe": "nosuch"}, {"subscribePattern": "nos.*"}):
        assert [r for p in cluster_driver.run("read", path=path, options={**base, **how})["partitions"]
                for r in p["rows"]] == []
    with pytest.raises(ClusterJobError, match=r"unknown topic or partition nosuch-0 \(no topic 'nosuch'\)"):
        cluster_driver.run("read", path=path, options={**base, "assign": '{"nosuch":[0]}'})
    # A corrupt manifest: named, with what is wrong.
    with pytest.raises(ClusterJobError, match=rf"RemoteCorruptError: {prefix}/bad-0/manifest.json: not a valid "
                                              "logfs manifest"):
        cluster_driver.run("read", path=path, options={**base, "subscribe": "bad"})
    # A bad endpoint (nothing listens there): the store is unreachable, said with the endpoint.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterJobError, match=rf"RemoteUnavailableError: list s3://{creds.bucket}/{prefix}/ at "
                                              rf"http://127.0.0.1:{port}: unreachable"):
        cluster_driver.run("read", path=path, options={"s3.endpoint": f"http://127.0.0.1:{port}",
                                                       "subscribe": "t"})


def test_missing_credentials_and_bad_paths_are_clear(aws_env, seaweed):
    # No credentials in the chain at all: a RemoteAuthError naming the endpoint, nothing about keys.
    options = SourceOptions.parse({"path": f"s3://{seaweed.bucket}/x", "s3.endpoint": seaweed.endpoint,
                                   "subscribe": "t"})
    with pytest.raises(Exception) as caught:
        plan_batch(options)
    assert type(caught.value).__name__ == "RemoteAuthError", caught.value
    assert str(caught.value) == (f"list s3://{seaweed.bucket}/x/ at {seaweed.endpoint}: no usable credentials in "
                                 "the AWS chain (NoCredentialsError)")
    with pytest.raises(OptionError, match="no bucket"):
        SourceOptions.parse({"path": "s3:///x", "subscribe": "t"})
    with pytest.raises(OptionError, match="s3.endpoint, s3.region and localDataDir are for a path s3://"):
        SourceOptions.parse({"path": "/var/lib/logfs", "s3.endpoint": "http://x", "subscribe": "t"})


def test_byte_range_from_the_remote_index():
    """The bytes fetched for an offset range: from the greatest indexed batch below it to where the indexed batch
    after the one reaching its last offset starts (segment of 10 batches x 10 records x 1000 bytes at base 100,
    every other batch indexed)."""
    from logfs.remote.api import RemoteCorruptError
    from logfs.remote.manifest import RemoteFile, RemoteSegment
    from logfs.spark.bucket import byte_range
    from logfs.storage.local.index import OffsetIndex

    seg = RemoteSegment(100, 200, 10_000, -1, {e: RemoteFile(f"k.{e}", 0) for e in
                                              ("log", "index", "timeindex", "viewindex")})
    index = b"".join(OffsetIndex.ENTRY.pack(rel, pos) for rel, pos in
                     [(9, 0), (29, 2000), (49, 4000), (69, 6000), (89, 8000)]) + bytes(16)  # 2 empty slots
    assert byte_range(index, seg, 135, 137) == (2000, 6000)
    assert byte_range(index, seg, 100, 101) == (0, 2000)
    assert byte_range(index, seg, 110, 130) == (0, 4000)
    assert byte_range(index, seg, 185, 200) == (6000, 10_000)
    assert byte_range(b"", seg, 150, 160) == (0, 10_000)  # no index: the whole segment, still correct
    with pytest.raises(RemoteCorruptError, match="k.index: positions"):
        byte_range(OffsetIndex.ENTRY.pack(9, 0) + OffsetIndex.ENTRY.pack(29, 20_000), seg, 100, 101)


@pytest.mark.mount
def test_a_compressed_tiered_topic_reads_whole_through_the_mount_and_from_the_bucket(cluster_driver, mount_logfs,
                                                                                      creds):
    """compression.type=zstd on a tiered topic: the bucket holds the rewritten (compressed) segments, and both the
    mount (tiered part fetched from the bucket) and the cluster reading the bucket see every record once."""
    from kafka.record.memory_records import MemoryRecords

    prefix = "zstd-" + uuid.uuid4().hex[:8]
    n = 12_000
    remote_end, _, fs = tier(mount_logfs, creds, prefix, n, "compression.type=zstd",
                             f"log.local.retention.bytes={2 * SEGMENT}", unmount=False)
    appended = records(0, n)
    assert fs.read("t/0") == appended  # the whole log from offset 0, most of it read back from the bucket
    assert int(fs.getx("t/0", "local_log_start_offset")) > 0
    assert int(fs.getx("t/0", "remote_size_bytes")) > 0
    fs.unmount()  # the bucket now holds exactly what its manifest lists
    client = creds._client()
    manifest = json.loads(client.get_object(Bucket=creds.bucket, Key=f"{prefix}/t-0/manifest.json")["Body"].read())
    remote_end = manifest["segments"][-1]["next_offset"]
    listing = client.list_objects_v2(Bucket=creds.bucket, Prefix=f"{prefix}/t-0/")
    codecs_seen, stored = set(), 0
    named = {seg["objects"]["log"]["key"] for seg in manifest["segments"]}  # (an upload cut by the unmount: orphan)
    for obj in listing.get("Contents", []):
        if obj["Key"] in named:
            body = client.get_object(Bucket=creds.bucket, Key=obj["Key"])["Body"].read()
            stored += len(body)
            mr = MemoryRecords(body)
            while mr.has_next():
                batch = mr.next_batch()
                assert batch.validate_crc()
                codecs_seen.add(batch.compression_type)
    assert codecs_seen == {4}  # zstd: tiering waited for the rewrite
    assert stored == sum(seg["size"] for seg in manifest["segments"])
    tiered_text = len(b"".join(appended.splitlines(keepends=True)[:remote_end]))
    assert stored * 2 < tiered_text, (stored, tiered_text)
    expected = bucket_records(creds, prefix, "t", 0, only=named)  # (not an orphan the unmount cut)
    assert [r[0] for r in expected] == list(range(remote_end))
    result = cluster_driver.run("read", path=f"s3://{creds.bucket}/{prefix}", options={
        "s3.endpoint": creds.endpoint, "subscribe": "t"}, columns=["offset", "value"])
    rows = sorted((r["offset"], r["value"]) for p in result["partitions"] for r in p["rows"])
    assert rows == [(r[0], r[3]) for r in expected]

"""kill -9 at random moments while segments are uploaded and local segments deleted (SeaweedFS and the directory
store): after each remount the log is whole, and once orphans are reconciled the bucket holds every tiered offset
exactly once. 5 cycles per store; 30 with LOGFS_LONG=1."""

from __future__ import annotations

import json
import os
import random
import time
import uuid

import pytest

from harness import sh, wait_for
from test_tiered_s3 import kafka_offsets, records

CYCLES = 30 if os.environ.get("LOGFS_LONG") else 5
SEGMENT = 64 << 10


def _opts(store_opts):
    return store_opts + ("remote.log.storage.system.enable=true", f"log.segment.bytes={SEGMENT}",
                         "remote.log.manager.task.interval.ms=30", "log.segment.delete.delay.ms=0",
                         "log.retention.check.interval.ms=50")


class S3Bucket:
    def __init__(self, seaweed, prefix):
        self.seaweed, self.prefix = seaweed, prefix
        self.client = seaweed._client()
        self.opts = (f"logfs.remote.s3.bucket={seaweed.bucket}", f"logfs.remote.s3.endpoint={seaweed.endpoint}",
                     f"logfs.remote.s3.prefix={prefix}")

    def objects(self) -> dict[str, bytes]:
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.seaweed.bucket,
                                                                           Prefix=f"{self.prefix}/t-0/"):
            for o in page.get("Contents", []):
                out[o["Key"]] = self.client.get_object(Bucket=self.seaweed.bucket, Key=o["Key"])["Body"].read()
        return out


class DirBucket:
    def __init__(self, root):
        self.root = root
        root.mkdir()
        self.opts = (f"logfs.remote.dir={root}",)

    def objects(self) -> dict[str, bytes]:
        d = self.root / "t-0"
        if not d.exists():
            return {}
        return {f"t-0/{n}": (d / n).read_bytes() for n in sorted(os.listdir(d)) if not n.startswith(".")}


@pytest.fixture(params=["s3", "dir"])
def bucket(request, tmp_path):
    if request.param == "dir":
        return DirBucket(tmp_path / "archive")
    seaweed = request.getfixturevalue("seaweed")
    env = request.getfixturevalue("aws_env")
    for k, v in seaweed.env().items():
        env.setenv(k, v)
    return S3Bucket(seaweed, "crash-" + uuid.uuid4().hex[:8])


def test_kill9_during_uploads_and_local_deletes(mount_logfs, bucket):
    rng = random.Random(16)
    fs = mount_logfs(*_opts(bucket.opts))
    os.mkdir(fs.path("t"))
    sh(f"setfattr -n user.logfs.config.remote.storage.enable -v true {fs.path('t')}")
    sh(f"setfattr -n user.logfs.config.local.retention.bytes -v {2 * SEGMENT} {fs.path('t')}")
    appended = b""
    n = 0
    for cycle in range(CYCLES):
        for _ in range(rng.randint(1, 4)):
            count = rng.randint(500, 3000)
            data = records(n, count)
            fs.append("t/0", data)
            appended += data
            n += count
        time.sleep(rng.uniform(0, 0.4))
        fs.kill9()
        fs.mount(*_opts(bucket.opts))
        assert fs.read("t/0") == appended, f"cycle {cycle}: the log is not whole after kill -9"
    # Once the task has reconciled orphans, the bucket holds exactly what the manifest names, each offset once.
    wait_for(lambda: int(fs.getx("t/0", "segment_count")) <= 3, 60, interval=0.2, what="uploads")

    def reconciled():
        objs = bucket.objects()
        manifest_key = next((k for k in objs if k.endswith("manifest.json")), None)
        if manifest_key is None:
            return None
        m = json.loads(objs[manifest_key])
        named = {o["key"] for s in m["segments"] for o in s["objects"].values()} | {manifest_key}
        return (m, objs) if set(objs) == named else None

    fs.remount()  # startup reconciles orphans before any upload
    m, objs = wait_for(reconciled, 60, interval=0.3, what="orphans to be removed")
    offsets = kafka_offsets({k: v for k, v in objs.items() if k.endswith(".log")})
    assert offsets == list(range(len(offsets))) and len(offsets) > 0
    assert m["segments"][-1]["next_offset"] == len(offsets)
    assert fs.read("t/0") == appended

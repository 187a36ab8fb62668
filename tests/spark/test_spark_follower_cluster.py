"""Spark on a standalone cluster reading a follower mount (CONTRACT section 10): the executors (two Worker JVMs)
read ``spark.read.text(FOLLOWER/<topic>/*)`` through a follower mount that is not the writer's (its own cache
directory, no access to DATA_DIR), and get the writer's text up to ``remote_log_end_offset``."""

from __future__ import annotations

import os
import uuid

import pytest

pytest.importorskip("pyspark")
from harness import FollowerMount, wait_for  # noqa: E402

SEGMENT = 64 * 1024


def test_workers_read_a_follower_mount_as_plain_files(mount_logfs, creds, cluster_driver, spark_cluster, tmp_path):
    prefix = "fspark-" + uuid.uuid4().hex[:8]
    writer = mount_logfs("remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={creds.bucket}",
                         f"logfs.remote.s3.endpoint={creds.endpoint}", f"logfs.remote.s3.prefix={prefix}",
                         f"log.segment.bytes={SEGMENT}", "remote.log.manager.task.interval.ms=100",
                         "num.partitions=2")
    os.mkdir(writer.path("ev"))
    os.setxattr(writer.path("ev"), "user.logfs.config.remote.storage.enable", b"true")
    for p in (0, 1):
        writer.append(f"ev/{p}", b"".join(b"ev-%d-%06d-%s\n" % (p, i, b"z" * (i % 50)) for i in range(8000)))
    wait_for(lambda: all(int(writer.getx(f"ev/{p}", "remote_segment_count")) >= 3 for p in (0, 1)), 60,
             interval=0.2, what="tiering")
    follower = FollowerMount(tmp_path / "follower", f"s3://{creds.bucket}/{prefix}")
    try:
        follower.mount(f"logfs.remote.s3.endpoint={creds.endpoint}", "logfs.follow.interval.ms=200",
                       "allow_other", foreground=True)
        expected = []
        for p in (0, 1):
            wait_for(lambda: follower.getx(f"ev/{p}", "log_end_offset")
                     == writer.getx(f"ev/{p}", "remote_log_end_offset"), 10, what="the follower")
            end = int(writer.getx(f"ev/{p}", "remote_log_end_offset"))
            text = writer.read(f"ev/{p}")[: int(writer.getx(f"ev/{p}", f"position.{end}"))]
            expected += text.decode().splitlines()
        result = cluster_driver.run("read_text", path=follower.path("ev") + "/*")
        parts = result["partitions"]
        lines = sorted(line for part in parts for line in part["lines"])
        assert lines == sorted(expected) and len(lines) > 1000
        executors = {part["executor"]["executor_id"] for part in parts if part["lines"]}
        assert executors  # read by the cluster's executors, through the follower's files
        assert {part["executor"]["jvm_parent_pid"] for part in parts} <= {w.pid for w in spark_cluster.workers}
    finally:
        follower.cleanup()

"""Tiered storage through the mount with the directory store (``logfs.remote.dir``, e.g. an NFS archive): the
whole log readable, and deleting a tiered topic deletes its objects too."""

from __future__ import annotations

import os
import shutil

from harness import sh, wait_for
from test_tiered_s3 import records


def test_directory_store_whole_log_and_topic_deletion(mount_logfs, tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    opts = (f"logfs.remote.dir={archive}", "remote.log.storage.system.enable=true", "log.segment.bytes=65536",
            "remote.log.manager.task.interval.ms=50", "log.segment.delete.delay.ms=0")
    fs = mount_logfs(*opts)
    os.mkdir(fs.path("t"))
    sh(f"setfattr -n user.logfs.config.remote.storage.enable -v true {fs.path('t')}")
    sh(f"setfattr -n user.logfs.config.local.retention.bytes -v 65536 {fs.path('t')}")
    data = records(0, 20_000)
    fs.append("t/0", data)
    wait_for(lambda: int(fs.getx("t/0", "segment_count")) <= 3, 60, interval=0.2, what="uploads")
    assert int(fs.getx("t/0", "remote_segment_count")) >= 10
    assert fs.read("t/0") == data
    assert len(os.listdir(archive / "t-0")) >= 41
    fs.remount()
    assert fs.read("t/0") == data
    shutil.rmtree(fs.path("t"))
    wait_for(lambda: os.listdir(archive / "t-0") == [], 30, interval=0.2, what="the topic's objects deleted")
    assert (fs.data / "logfs-remote-deletes.json").read_text() == "[]"

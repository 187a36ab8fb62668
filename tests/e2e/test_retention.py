"""Retention while a file is open (CONTRACT section 3): the open handle keeps its view, new opens start at the new
log start."""

from __future__ import annotations

import os
import shlex

from logfs_e2e import sh, wait_for

OPTS = ("log.segment.bytes=2048", "log.retention.check.interval.ms=50", "log.segment.delete.delay.ms=0")


def lines(prefix: str, n: int) -> bytes:
    return b"".join(b"%s-%05d-%s\n" % (prefix.encode(), i, b"r" * 20) for i in range(n))


def test_open_handle_keeps_view_through_retention(mount_logfs):
    fs = mount_logfs(*OPTS)
    os.mkdir(fs.path("t"))
    path = fs.path("t", 0)
    old = lines("old", 600)
    fs.append("t/0", old)
    segments_before = int(fs.getx("t/0", "segment_count"))
    assert segments_before > 5
    with open(path, "rb", buffering=0) as handle:
        head = handle.read(1000)
        assert head == old[:1000]
        sh(f"setfattr -n user.logfs.config.retention.bytes -v 4096 {shlex.quote(fs.path('t'))}")
        wait_for(lambda: int(fs.getx("t/0", "log_start_offset")) > 0, 10, what="retention to delete segments")
        start = int(fs.getx("t/0", "log_start_offset"))
        assert int(fs.getx("t/0", "segment_count")) < segments_before
        # New opens see the view from the new log start: the file shrank from the front.
        record_len = len(old) // 600
        fresh = fs.read("t/0")
        assert fresh == old[start * record_len:]
        assert os.stat(path).st_size == len(fresh)
        assert fs.getx("t/0", "position.%d" % start) == "0"
        # The open handle still reads its original view, plus what is appended now.
        new = lines("new", 50)
        fs.append("t/0", new)
        rest = b""
        while chunk := handle.read(4096):
            rest += chunk
        assert head + rest == old + new
        handle.seek(0)
        assert handle.read(len(old) + len(new) + 10) == old + new
    assert fs.read("t/0") == old[start * record_len:] + new


def test_open_handle_keeps_view_through_compaction(mount_logfs):
    fs = mount_logfs("log.segment.bytes=2048", "log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.01")
    os.mkdir(fs.path("kv"))
    t = shlex.quote(fs.path("kv"))
    sh(f"setfattr -n user.logfs.config.logfs.key.separator -v = {t}")
    text = b"".join(b"key%02d=value-%05d\n" % (i % 10, i) for i in range(1000))
    fs.append("kv/0", text)
    with open(fs.path("kv", 0), "rb", buffering=0) as handle:
        head = handle.read(500)
        size_before = int(fs.getx("kv/0", "size_bytes"))
        sh(f"setfattr -n user.logfs.config.cleanup.policy -v compact {t}")
        wait_for(lambda: int(fs.getx("kv/0", "size_bytes")) < size_before // 2, 20, what="the cleaner")
        compacted = fs.read("kv/0")
        assert len(compacted) < len(text) // 2
        # Compaction keeps the latest value of every key, in offset order.
        latest = {}
        for line in text.splitlines(keepends=True):
            latest[line.split(b"=")[0]] = line
        assert all(line in compacted.splitlines(keepends=True) for line in latest.values())
        assert compacted.endswith(text[-200:].split(b"\n", 1)[1])  # the active segment is never cleaned
        # The open handle reads exactly what it would have without compaction.
        rest = b""
        while chunk := handle.read(3000):
            rest += chunk
        assert head + rest == text
    assert fs.getx("kv/0", "log_end_offset") == "1000"

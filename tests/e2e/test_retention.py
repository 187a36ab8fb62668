"""Retention while a file is open (CONTRACT section 3): the open handle keeps its view, new opens start at the new
log start."""

from __future__ import annotations

import errno
import os
import shlex

from harness import sh, wait_for

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
        # Back into what it read and retention removed since: EIO (its disk was freed once the handle had read
        # past it, CONTRACT section 3 "Readers that stay open"), or the same bytes, never others.
        handle.seek(0)
        try:
            again = handle.read(len(old) + len(new) + 10)
        except OSError as exc:
            assert exc.errno == errno.EIO, exc
        else:
            assert again == old + new
    # A new open reads whole records from some log start to the end (the appends may have let retention delete
    # another segment meanwhile).
    content = fs.read("t/0")
    assert (old + new).endswith(content) and len(content) % record_len == 0 and len(content) >= len(new)


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


def test_time_retention_on_schedule_and_idle_roll(mount_logfs):
    """retention.ms by the segments' largest timestamp, checked every log.retention.check.interval.ms; the idle
    active segment is sealed by log.roll.ms and then deleted too, so the file ends up empty."""
    fs = mount_logfs("log.segment.bytes=2048", "log.retention.ms=1500", "log.retention.check.interval.ms=50",
                     "log.roll.ms=700", "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("t"))
    first = lines("a", 300)
    fs.append("t/0", first)
    assert int(fs.getx("t/0", "segment_count")) > 3
    wait_for(lambda: int(fs.getx("t/0", "log_start_offset")) == 300, 15, what="time retention of every segment")
    assert fs.read("t/0") == b""
    assert os.stat(fs.path("t", 0)).st_size == 0
    assert fs.getx("t/0", "log_end_offset") == "300"
    assert int(fs.getx("t/0", "segment_count")) == 1
    # The partition keeps working after everything aged out.
    fs.append("t/0", b"after\n")
    assert fs.read("t/0") == b"after\n"
    assert fs.getx("t/0", "position.300") == "0"


def test_retention_shows_exactly_the_retained_records(mount_logfs):
    fs = mount_logfs("log.segment.bytes=2048", "log.retention.check.interval.ms=50", "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("t"))
    old = lines("x", 500)
    fs.append("t/0", old)
    sh(f"setfattr -n user.logfs.config.retention.bytes -v 6000 {shlex.quote(fs.path('t'))}")
    wait_for(lambda: int(fs.getx("t/0", "log_start_offset")) > 0, 10, what="size retention")
    start = int(fs.getx("t/0", "log_start_offset"))
    record_len = len(old) // 500
    assert fs.read("t/0") == old[start * record_len:]
    assert int(fs.getx("t/0", "size_bytes")) <= 6000 + 2048
    # On disk: the deleted segments are gone, and the checkpoint says where the log starts.
    names = os.listdir(os.path.join(fs.data, "t-0"))
    assert not [n for n in names if n.endswith(".deleted")]
    assert min(int(n[:20]) for n in names if n.endswith(".log")) == start
    fs.unmount()
    with open(os.path.join(fs.data, "log-start-offset-checkpoint")) as f:
        assert f"t 0 {start}" in f.read()
    fs.mount()
    assert fs.read("t/0") == old[start * record_len:]


def test_compaction_with_tombstones_after_delete_retention(mount_logfs):
    fs = mount_logfs("log.segment.bytes=1024", "log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.01",
                     "log.cleaner.delete.retention.ms=1500", "log.roll.ms=300", "log.segment.delete.delay.ms=0")
    os.mkdir(fs.path("kv"))
    t = shlex.quote(fs.path("kv"))
    sh(f"setfattr -n user.logfs.config.logfs.key.separator -v = {t}")
    sh(f"setfattr -n user.logfs.config.logfs.null.marker -v NULL {t}")
    sh(f"setfattr -n user.logfs.config.cleanup.policy -v compact {t}")
    fs.append("kv/0", b"".join(b"k%d=v%d-%d\n" % (i % 5, i, i) for i in range(200)))
    fs.append("kv/0", b"k1=NULL\n")
    filler = iter(range(10**6))

    def feed_and_check(check):
        fs.append("kv/0", b"f=%d\n" % next(filler))  # new dirty data keeps the cleaner coming back
        return check(fs.read("kv/0").splitlines())

    # First the cleaner keeps only the latest line per key, with k1's tombstone shown as the marker.
    latest = [b"k0=v195-195", b"k1=NULL", b"k2=v197-197", b"k3=v198-198", b"k4=v199-199"]
    wait_for(lambda: feed_and_check(lambda ls: sorted(l for l in ls if l.startswith(b"k")) == latest),
             20, interval=0.1, what="compaction to the latest line per key")
    # After delete.retention.ms the tombstone itself is removed: k1 is gone entirely.
    wait_for(lambda: feed_and_check(lambda ls: not [l for l in ls if l.startswith(b"k1=")]), 20, interval=0.1,
             what="the tombstone to be dropped")
    remaining = [l for l in fs.read("kv/0").splitlines() if l.startswith(b"k")]
    assert sorted(remaining) == [b"k0=v195-195", b"k2=v197-197", b"k3=v198-198", b"k4=v199-199"]
    assert fs.getx("kv/0", "log_end_offset") == str(201 + next(filler))

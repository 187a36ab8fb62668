"""``-o logfs.metrics.file=PATH``: a real mount, a scripted workload through the kernel (appends of known counts
and bytes, reads, refused requests, a tiered upload to a directory store), then the file parsed with
Prometheus's own parser (prometheus_client): its counters are what the workload did. Also: the file written at
mount and at clean shutdown, the recovery gauge after a kill -9, and the settings refused at mount."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import LogfsMount, daemon_env, expect_errno, mounted_at, sh, wait_for


def parse(path) -> dict[tuple[str, frozenset], float]:
    with open(path) as f:
        text = f.read()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def part(topic: str, partition: int) -> frozenset:
    return frozenset({"topic": topic, "partition": str(partition)}.items())


def errors(got: dict, op: str, code: int) -> float:
    return got.get(("logfs_fuse_errors_total", frozenset({"op": op, "errno": errno.errorcode[code]}.items())), 0)


LINES = [b"event %04d %s\n" % (i, b"x" * (i % 37)) for i in range(500)]


def workload(fs) -> None:
    """t/0: 500 lines in 3 writes; t/1: 2 lines, one of them sent in two writes; reads; three refusals."""
    os.mkdir(fs.path("t"))
    data = b"".join(LINES)
    fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        for chunk in (data[:1000], data[1000:15000], data[15000:]):
            assert os.write(fd, chunk) == len(chunk)
    finally:
        os.close(fd)
    fd = os.open(fs.path("t", 1), os.O_WRONLY | os.O_APPEND)
    try:
        for chunk in (b"first ", b"half\nsecond\n"):
            os.write(fd, chunk)
    finally:
        os.close(fd)
    assert fs.read("t/0") == data  # cat: every byte once, then a read that returns nothing
    with open(fs.path("t", 0), "rb", buffering=0) as f:
        f.seek(len(LINES[0]) - 1)
        assert f.read(len(LINES[1]) + 1) == b"\n" + LINES[1]  # the lines of records 0 and 1 end in it
    expect_errno(errno.EINVAL, os.mkdir, fs.path("no spaces"))
    expect_errno(errno.EPERM, os.rename, fs.path("t", 0), fs.path("t", 5))
    expect_errno(errno.EPERM, os.truncate, fs.path("t", 0), 10)


def check_workload(got: dict) -> None:
    data = b"".join(LINES)
    assert got[("logfs_partition_appended_records_total", part("t", 0))] == 500
    assert got[("logfs_partition_appended_bytes_total", part("t", 0))] == len(data)
    assert got[("logfs_partition_appended_records_total", part("t", 1))] == 2
    assert got[("logfs_partition_appended_bytes_total", part("t", 1))] == len(b"first half\nsecond\n")
    assert got[("logfs_partition_read_bytes_total", part("t", 0))] == len(data) + len(LINES[1]) + 1
    assert got[("logfs_partition_read_records_total", part("t", 0))] == 500 + 2
    assert got[("logfs_partition_read_records_total", part("t", 1))] == 0
    assert got[("logfs_partition_log_end_offset", part("t", 0))] == 500
    assert got[("logfs_partition_log_end_offset", part("t", 1))] == 2
    assert errors(got, "mkdir", errno.EINVAL) == 1
    assert errors(got, "rename", errno.EPERM) == 1
    assert errors(got, "setattr", errno.EPERM) == 1  # truncate


def test_counters_after_a_workload_and_the_final_write_at_clean_shutdown(mount_logfs, tmp_path):
    """With a long interval the file is written at mount and again only at clean shutdown: the first shows
    nothing done yet, the last exactly the workload."""
    prom = tmp_path / "textfile" / "logfs.prom"
    prom.parent.mkdir()
    fs = mount_logfs(f"logfs.metrics.file={prom}", "logfs.metrics.interval.ms=600000", "num.partitions=2")
    wait_for(prom.exists, 10, what="the metrics file written at mount")
    first = parse(prom)
    assert first[("logfs_partitions", frozenset())] == 0
    assert first[("logfs_startup_recovery", frozenset())] == 0
    assert oct(os.stat(prom).st_mode & 0o777) == "0o644"
    workload(fs)
    assert parse(prom) == first  # not re-written before the interval
    fs.unmount()
    last = parse(prom)
    check_workload(last)
    assert last[("logfs_partitions", frozenset())] == 2 and last[("logfs_topics", frozenset())] == 1
    assert sorted(os.listdir(prom.parent)) == ["logfs.prom"]  # no temporary file left behind


def test_periodic_writes_follow_the_workload_and_a_tiered_upload(mount_logfs, tmp_path):
    prom = tmp_path / "logfs.prom"
    archive = tmp_path / "archive"
    archive.mkdir()
    fs = mount_logfs(f"logfs.metrics.file={prom}", "logfs.metrics.interval.ms=200", "num.partitions=2",
                     "remote.log.storage.system.enable=true", f"logfs.remote.dir={archive}",
                     "remote.log.manager.task.interval.ms=100")
    workload(fs)
    # A tiered topic: 1 KiB segments, so that a few roll and are uploaded.
    os.mkdir(fs.path("tiered"))
    sh(f"setfattr -n user.logfs.config.remote.storage.enable -v true {fs.path('tiered')}")
    sh(f"setfattr -n user.logfs.config.segment.bytes -v 1024 {fs.path('tiered')}")
    fs.append("tiered/0", b"".join(LINES[:100]))
    wait_for(lambda: int(fs.getx("tiered/0", "remote_segment_count")) >= 2, 30, what="segments tiered")

    def caught_up():
        got = parse(prom) if prom.exists() else {}
        key = ("logfs_partition_remote_segments", part("tiered", 0))
        return got if got.get(key) == int(fs.getx("tiered/0", "remote_segment_count")) else None

    got = wait_for(caught_up, 10, interval=0.1, what="a periodic write showing the upload")
    check_workload(got)
    tiered = part("tiered", 0)
    assert got[("logfs_partition_remote_copied_segments_total", tiered)] == int(fs.getx("tiered/0",
                                                                                        "remote_segment_count"))
    assert got[("logfs_partition_remote_copied_bytes_total", tiered)] == int(fs.getx("tiered/0",
                                                                                     "remote_size_bytes"))
    assert got[("logfs_partition_remote_size_bytes", tiered)] == int(fs.getx("tiered/0", "remote_size_bytes"))
    assert got[("logfs_partition_remote_log_end_offset", tiered)] == int(fs.getx("tiered/0",
                                                                                 "remote_log_end_offset"))
    assert got[("logfs_partition_tiering_failures_total", tiered)] == 0
    # Copy lag: the rolled local segments not yet tiered (none, once caught up), never the active one.
    assert got[("logfs_partition_remote_copy_lag_segments", tiered)] in (0, 1)
    assert ("logfs_partition_remote_segments", part("t", 0)) not in got  # t is not tiered
    assert got[("logfs_partition_appended_records_total", tiered)] == 100
    assert got[("process_open_fds", frozenset())] > 3


def test_recovery_is_reported_after_a_kill(mount_logfs, tmp_path):
    prom = tmp_path / "logfs.prom"
    fs = mount_logfs(f"logfs.metrics.file={prom}")
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"".join(LINES))
    fs.kill9()
    prom.unlink()
    fs.mount(*fs.options)
    wait_for(prom.exists, 10, what="the metrics file")
    got = parse(prom)
    assert got[("logfs_startup_recovery", frozenset())] == 1
    assert got[("logfs_startup_segments", frozenset())] >= 1
    assert got[("logfs_startup_duration_seconds", frozenset())] > 0
    assert got[("logfs_partition_log_end_offset", part("t", 0))] == 500
    assert got[("logfs_partition_appended_records_total", part("t", 0))] == 0  # counted from this start


@pytest.mark.parametrize("option,message", [
    ("logfs.metrics.file=metrics.prom", "absolute"),
    ("logfs.metrics.file={tmp}/missing/logfs.prom", "does not exist"),
    ("logfs.metrics.file={tmp}/m/mnt/logfs.prom", "inside the mount point"),
    ("logfs.metrics.file={tmp}/m/data/logfs.prom", "inside the data directory"),
    ("logfs.metrics.file={tmp}", "is a directory"),
    ("logfs.metrics.interval.ms=0", "logfs.metrics.interval.ms"),
    ("logfs.metrics.interval.ms=ten", "logfs.metrics.interval.ms"),
])
def test_bad_settings_are_a_mount_time_error(tmp_path, option, message):
    mnt = tmp_path / "m" / "mnt"
    mnt.mkdir(parents=True)
    option = option.format(tmp=tmp_path)
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(tmp_path / "m" / "data"), str(mnt), "-o", option],
                       capture_output=True, text=True, timeout=60, env=daemon_env())
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not mounted_at(mnt)


def test_settings_from_a_config_file(tmp_path):
    prom = tmp_path / "logfs.prom"
    config = tmp_path / "server.properties"
    config.write_text(f"logfs.metrics.file={prom}\nlogfs.metrics.interval.ms=100\n")
    m = LogfsMount(tmp_path / "cfg")
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(m.data), str(m.mnt), "--config", str(config)],
                       capture_output=True, text=True, timeout=60, env=daemon_env())
    try:
        assert r.returncode == 0, r.stderr
        os.mkdir(m.path("t"))
        wait_for(lambda: prom.exists() and parse(prom).get(("logfs_partitions", frozenset())) == 1, 10,
                 what="a periodic write")
    finally:
        m.cleanup()


def test_compression_and_tiered_read_cache_through_the_mount(mount_logfs, tmp_path):
    """A zstd topic's background rewrite and the reads of a tiered range through the mount show in the metrics
    file: segments rewritten with their bytes before and after (what the partition holds now), and the GETs the
    reads sent, their bytes and the cache's use under its bound."""
    prom = tmp_path / "logfs.prom"
    archive = tmp_path / "archive"
    archive.mkdir()
    fs = mount_logfs(f"logfs.metrics.file={prom}", "logfs.metrics.interval.ms=200",
                     "remote.log.storage.system.enable=true", f"logfs.remote.dir={archive}",
                     "remote.log.manager.task.interval.ms=100", f"logfs.remote.cache.bytes={4 << 20}")
    os.mkdir(fs.path("z"))
    sh(f"setfattr -n user.logfs.config.compression.type -v zstd {fs.path('z')}")
    sh(f"setfattr -n user.logfs.config.segment.bytes -v 65536 {fs.path('z')}")
    zdata = b"".join(b"GET /api/v1/orders/%d 200 %d ms\n" % (i, i % 97) for i in range(12000))
    fs.append("z/0", zdata)
    os.mkdir(fs.path("h"))
    for key, value in (("remote.storage.enable", "true"), ("segment.bytes", "16384"), ("local.retention.bytes", "0")):
        sh(f"setfattr -n user.logfs.config.{key} -v {value} {fs.path('h')}")
    hdata = b"".join(LINES) * 4
    fs.append("h/0", hdata)
    wait_for(lambda: int(fs.getx("h/0", "local_log_start_offset")) >= 1000, 30, what="h tiered and deleted locally")

    def compressed():
        got = parse(prom) if prom.exists() else {}
        return got if got.get(("logfs_compression_segments_total", frozenset()), 0) >= 5 else None

    got = wait_for(compressed, 30, interval=0.2, what="the rewrite in the metrics")
    assert got[("logfs_compression_failures_total", frozenset())] == 0
    before = got[("logfs_compression_input_bytes_total", frozenset())]
    after = got[("logfs_compression_output_bytes_total", frozenset())]
    assert 0 < after < before / 4, (after, before)
    assert got[("logfs_remote_cache_limit_bytes", frozenset())] == 4 << 20
    fetched_before = got[("logfs_remote_fetched_bytes_total", frozenset())]
    assert fs.read("h/0") == hdata  # the tiered range through the bucket
    assert fs.read("z/0") == zdata

    def fetched():
        got = parse(prom)
        return got if got[("logfs_remote_fetched_bytes_total", frozenset())] > fetched_before else None

    got = wait_for(fetched, 10, interval=0.1, what="the reads' GETs in the metrics")
    assert got[("logfs_remote_fetch_requests_total", frozenset())] >= 1
    assert 0 < got[("logfs_remote_cache_bytes", frozenset())] <= 4 << 20

"""The metrics without a kernel: an Operations object driven by handler calls, then the text the metrics file
would hold, parsed with Prometheus's own parser (prometheus_client). Every counter is what the calls did; the
file is replaced atomically and readable by all."""

from __future__ import annotations

import errno
import os
import stat

import pytest
from prometheus_client.parser import text_string_to_metric_families

from logfs.fuse.errors import error_counts
from logfs.service.metrics import Metrics, MetricsFile, write_atomically
from logfs.service.runtime import LogService
from ops_helpers import APPEND, fuse_errno

STARTUP = {"seconds": 1.25, "recovering": True, "segments": 7, "partitions": 2}


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} through the official parser (which refuses malformed text)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def part(topic: str, partition: int) -> frozenset:
    return frozenset({"topic": topic, "partition": str(partition)}.items())


def render(fs, service=None) -> dict:
    return parse(Metrics(fs.manager, fs.ops, service or LogService(fs.manager), STARTUP).render())


async def test_counters_are_what_the_requests_did(ops_fs):
    fs = ops_fs(num_partitions=2)
    await fs.mkdir("t")
    lines = b"".join(b"record %03d\n" % i for i in range(40))  # 11 bytes each
    await fs.append("t/0", lines[:220])  # 20 records
    await fs.append("t/0", lines[220:])  # 20 more
    fh = await fs.open("t/1", APPEND)
    await fs.write(fh, b"held")  # a partial line: bytes taken now, the record when its newline comes
    await fs.write(fh, b" then ended\nand one more\n")
    await fs.release(fh)
    assert await fs.cat("t/0") == lines  # 440 bytes, 40 records
    fh = await fs.open("t/0")
    assert await fs.read(fh, 5, 20) == lines[5:25]  # the lines of records 0 and 1 end in it
    await fs.release(fh)
    before = error_counts()
    with fuse_errno(errno.EINVAL):
        await fs.mkdir("bad name")
    with fuse_errno(errno.EPERM):
        fh = await fs.open("t/1", os.O_WRONLY)
        try:
            await fs.write(fh, b"not at the end\n", offset=0)
        finally:
            await fs.release(fh)
    with fuse_errno(errno.ENOENT):
        await fs.lookup("t/7")

    got = render(fs)
    assert got[("logfs_partition_appended_records_total", part("t", 0))] == 40
    assert got[("logfs_partition_appended_bytes_total", part("t", 0))] == 440
    assert got[("logfs_partition_appended_records_total", part("t", 1))] == 2
    assert got[("logfs_partition_appended_bytes_total", part("t", 1))] == len(b"held then ended\nand one more\n")
    assert got[("logfs_partition_read_bytes_total", part("t", 0))] == 440 + 20
    assert got[("logfs_partition_read_records_total", part("t", 0))] == 40 + 2
    assert got[("logfs_partition_read_bytes_total", part("t", 1))] == 0
    assert got[("logfs_partition_log_end_offset", part("t", 0))] == 40
    assert got[("logfs_partition_log_start_offset", part("t", 0))] == 0
    assert got[("logfs_partition_segments", part("t", 0))] == 1
    assert got[("logfs_partition_size_bytes", part("t", 0))] == fs.manager.logs[("t", 0)].size_bytes > 440
    assert got[("logfs_partitions", frozenset())] == 2 and got[("logfs_topics", frozenset())] == 1

    def errors(op: str, code: int) -> float:
        return got.get(("logfs_fuse_errors_total", frozenset({"op": op, "errno": errno.errorcode[code]}.items())), 0)

    delta = {key: n - before.get(key, 0) for key, n in error_counts().items() if n != before.get(key, 0)}
    assert delta == {("mkdir", errno.EINVAL): 1, ("write", errno.EPERM): 1, ("lookup", errno.ENOENT): 1}
    for (op, code), n in error_counts().items():  # (the counts are per process: earlier tests add to them)
        assert errors(op, code) == n
    assert got[("logfs_startup_duration_seconds", frozenset())] == 1.25
    assert got[("logfs_startup_recovery", frozenset())] == 1
    assert got[("logfs_startup_segments", frozenset())] == 7
    assert got[("process_open_fds", frozenset())] > 0
    assert got[("process_resident_memory_bytes", frozenset())] > 1 << 20
    assert not any(name.startswith("logfs_partition_remote") for name, _ in got)  # nothing tiered


async def test_counters_of_a_recreated_partition_start_again(ops_fs):
    fs = ops_fs(num_partitions=1)
    await fs.mkdir("t")
    await fs.append("t/0", b"a\nb\n")
    assert render(fs)[("logfs_partition_appended_records_total", part("t", 0))] == 2
    await fs.unlink("t/0")
    await fs.rmdir("t")
    assert ("logfs_partition_appended_records_total", part("t", 0)) not in render(fs)
    await fs.mkdir("t")
    await fs.append("t/0", b"c\n")
    assert render(fs)[("logfs_partition_appended_records_total", part("t", 0))] == 1


async def test_records_appended_count_from_the_load(ops_fs, open_manager, tmp_path):
    """After a restart the counters start at zero: records appended is the log end offset's advance since load."""
    fs = ops_fs(num_partitions=1)
    await fs.mkdir("t")
    await fs.append("t/0", b"a\nb\nc\n")
    fs.ops.release_all()
    fs.manager.close()
    again = ops_fs(manager=open_manager({}, data_dir=fs.manager.data_dir))
    await again.append("t/0", b"d\n")
    got = render(again)
    assert got[("logfs_partition_log_end_offset", part("t", 0))] == 4
    assert got[("logfs_partition_appended_records_total", part("t", 0))] == 1


async def test_service_counts(ops_fs, clock):
    """Cleaner and retention counts come from the service's own passes."""
    fs = ops_fs(num_partitions=1, log_cleanup_policy="compact", log_segment_bytes=1024,
                log_cleaner_min_cleanable_ratio="0.01")
    service = LogService(fs.manager)
    service.cleaner_mode = "thread"
    await fs.mkdir("t")
    await fs.setconfig("t", "logfs.key.separator", "=")
    for round_ in range(20):
        await fs.append("t/0", b"".join(b"k%d=v%d-%d\n" % (k, k, round_) for k in range(10)))
    assert service.clean_once(clock.time_ms())
    got = render(fs, service)
    assert got[("logfs_cleaner_runs_total", frozenset())] == 1
    removed = got[("logfs_cleaner_removed_records_total", frozenset())]
    assert removed > 0
    assert got[("logfs_cleaner_reclaimed_bytes_total", frozenset())] > 0
    assert got[("logfs_cleaner_failures_total", frozenset())] == 0


async def test_compression_counts(ops_fs, clock):
    """The compression rewrite's counts come from the service's own passes: segments rewritten, and the bytes they
    took before and after (the ratio an operator watches)."""
    fs = ops_fs(num_partitions=1, log_segment_bytes=4096)
    service = LogService(fs.manager)
    service.cleaner_mode = "thread"
    await fs.mkdir("z")
    await fs.setconfig("z", "compression.type", "zstd")
    for round_ in range(12):
        await fs.append("z/0", b"".join(b"GET /api/v1/orders/%d 200 %d ms\n" % (i, round_) for i in range(40)))
    plog = fs.manager.get_log("z", 0)
    sealed = len(plog.segments.as_list()) - 1
    assert sealed >= 3
    before = sum(s.size for s in plog.segments.as_list()[:-1])
    while service.compress_once(clock.time_ms()):
        pass
    after = sum(s.size for s in plog.segments.as_list()[:-1])
    got = render(fs, service)
    assert got[("logfs_compression_segments_total", frozenset())] == sealed
    assert got[("logfs_compression_input_bytes_total", frozenset())] == before
    assert got[("logfs_compression_output_bytes_total", frozenset())] == after < before / 3
    assert got[("logfs_compression_failures_total", frozenset())] == 0
    assert ("logfs_remote_cache_bytes", frozenset()) not in got  # no tiered storage on this mount


def test_remote_cache_counts(tmp_path, clock):
    """With tiered storage on: the cache's bytes and bound, and the GETs reads sent and the bytes they fetched."""
    from logfs.remote import DirectoryStore
    from logfs.storage import BrokerConfig, LogManager
    from logfs.storage.tiered.manager import RemoteLogManager
    from logfs.view.text import open_view

    archive = tmp_path / "archive"
    archive.mkdir()
    props = {"log.segment.bytes": "4096", "log.index.interval.bytes": "512", "log.segment.delete.delay.ms": "0",
             "remote.log.storage.system.enable": "true", "logfs.remote.dir": str(archive)}
    manager = LogManager(str(tmp_path / "data"), BrokerConfig.from_properties(props), clock=clock)
    try:
        manager.remote = RemoteLogManager(manager.data_dir, manager.logs, DirectoryStore(archive),
                                          cache_bytes=64 << 10)
        manager.create_topic("t", 1)
        manager.set_topic_config("t", "remote.storage.enable", "true")
        manager.set_topic_config("t", "local.retention.bytes", "8192")
        plog = manager.get_log("t", 0)
        data = b"".join(b"record-%06d\n" % i for i in range(3000))
        plog.append_lines(b"", data, len(data))
        plog.roll()
        plog.flush()
        manager.remote.sync(plog, clock.time_ms())
        assert plog.remote_segments
        metrics = Metrics(manager, None, LogService(manager), STARTUP)
        got = parse(metrics.render())
        assert got[("logfs_remote_cache_limit_bytes", frozenset())] == 64 << 10
        assert got[("logfs_remote_fetch_requests_total", frozenset())] == 0
        view = open_view(plog)
        try:
            assert view.read(0, len(data) + 10) == data
        finally:
            view.release()
        got = parse(metrics.render())
        cache = manager.remote.blocks
        assert got[("logfs_remote_fetch_requests_total", frozenset())] == cache.requests > 0
        local_start = plog.segments.as_list()[0].base_offset  # below it, the view read the bucket's copies
        tiered_only = sum(s.size for s in plog.remote_segments if s.next_offset <= local_start)
        assert got[("logfs_remote_fetched_bytes_total", frozenset())] == cache.fetched_bytes >= tiered_only > 0
        assert 0 < got[("logfs_remote_cache_bytes", frozenset())] == cache.used <= 64 << 10
    finally:
        manager.close()


def test_metrics_file_is_replaced_atomically_and_readable_by_all(tmp_path):
    path = tmp_path / "logfs.prom"
    old = os.umask(0o077)
    try:
        write_atomically(str(path), b"a 1\n")
        inode = os.stat(path).st_ino
        write_atomically(str(path), b"a 2\n")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"a 2\n"
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["logfs.prom"]  # no temporary file left


def test_a_failed_write_is_logged_once_and_leaves_nothing(tmp_path, caplog):
    class Fixed:
        def render(self):
            return "a 1\n"

    missing = tmp_path / "gone" / "logfs.prom"
    writer = MetricsFile(str(missing), Fixed(), 10)
    assert not writer.write() and not writer.write()
    assert [r.levelname for r in caplog.records].count("ERROR") == 1
    (tmp_path / "gone").mkdir()
    assert writer.write()
    assert missing.read_text() == "a 1\n" and os.listdir(tmp_path / "gone") == ["logfs.prom"]


@pytest.mark.parametrize("partitions", [2000])
async def test_many_partitions_render_whole(ops_fs, partitions):
    """Many partitions: one series per partition and metric, parsed back whole, and the render's own duration
    kept (what it is against the partition count is a figure for a benchmark, not a test)."""
    fs = ops_fs(num_partitions=partitions // 10)
    for t in range(10):
        await fs.mkdir(f"t{t}")
    metrics = Metrics(fs.manager, fs.ops, LogService(fs.manager), STARTUP)
    text = metrics.render()
    got = parse(text)
    assert sum(1 for name, _ in got if name == "logfs_partition_log_end_offset") == partitions
    assert metrics.render_seconds > 0

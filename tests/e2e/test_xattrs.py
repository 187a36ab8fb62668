"""CONTRACT section 4: extended attributes of partitions and topics, through getfattr/setfattr and the
`xattr` Python package."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import sys
import time

import pytest
import xattr

from harness import daemon_env, daemon_pids, expect_errno, mounted_at, sh, wait_for

FIXED = ["log_start_offset", "log_end_offset", "recovery_point", "segment_count", "size_bytes",
         "local_log_start_offset", "remote_log_end_offset", "remote_segment_count", "remote_size_bytes"]
TOPIC_KEYS = [
    "cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "segment.jitter.ms",
    "segment.index.bytes", "index.interval.bytes", "file.delete.delay.ms", "delete.retention.ms",
    "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms", "max.message.bytes",
    "flush.messages", "flush.ms", "remote.storage.enable", "local.retention.ms", "local.retention.bytes",
    "compression.type", "compression.zstd.level", "compression.lz4.level", "compression.gzip.level",
    "logfs.key.separator", "logfs.null.marker", "logfs.writer.headers", "logfs.isolation.level",
]


def getfattr(path: str, name: str) -> str:
    """`getfattr --only-values`, asserting success."""
    return sh(f"getfattr --only-values -n {shlex.quote(name)} {shlex.quote(path)}").stdout.decode()


def getfattr_fails(path: str, name: str) -> bytes:
    r = sh(f"getfattr --only-values -n {shlex.quote(name)} {shlex.quote(path)}", check=False)
    assert r.returncode != 0, f"getfattr {name} unexpectedly succeeded: {r.stdout!r}"
    return r.stderr


def setfattr(path: str, name: str, value: str, check: bool = True):
    return sh(f"setfattr -n {shlex.quote(name)} -v {shlex.quote(value)} {shlex.quote(path)}", check=check)


def px(name: str) -> str:
    return "user.logfs." + name


@pytest.fixture
def loaded(mount_logfs):
    """A partition with 300 records over several small segments, with a record index every 512 bytes."""
    fs = mount_logfs("log.segment.bytes=4096", "log.index.interval.bytes=512")
    os.mkdir(fs.path("t"))
    lines = [f"record-{i:04d}-{'v' * (i % 23)}\n".encode() for i in range(300)]
    fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(0, 300, 10):
            os.write(fd, b"".join(lines[i:i + 10]))
    finally:
        os.close(fd)
    return fs, lines


def test_partition_fixed_attributes(loaded):
    fs, lines = loaded
    p = fs.path("t", 0)
    assert getfattr(p, px("log_start_offset")) == "0"
    assert getfattr(p, px("log_end_offset")) == "300"
    assert xattr.getxattr(p, px("log_end_offset")) == b"300"
    segments = int(getfattr(p, px("segment_count")))
    assert segments > 1
    log_files = sorted(f for f in os.listdir(os.path.join(fs.data, "t-0")) if f.endswith(".log"))
    assert segments == len(log_files)
    size = int(xattr.getxattr(p, px("size_bytes")))
    assert size == sum(os.path.getsize(os.path.join(fs.data, "t-0", f)) for f in log_files)
    assert size > len(b"".join(lines))  # v2 batches carry headers
    # Values are plain ASCII decimal, no newline.
    for name in FIXED:
        raw = xattr.getxattr(p, px(name))
        assert raw.isdigit(), (name, raw)
    fs.append("t/0", "one more\n")
    assert getfattr(p, px("log_end_offset")) == "301"


def test_recovery_point_advances_after_fsync(mount):
    os.mkdir(mount.path("t"))
    p = mount.path("t", 0)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"a\nb\nc\n")
        assert int(mount.getx("t/0", "recovery_point")) <= 3
        os.fsync(fd)
        assert mount.getx("t/0", "recovery_point") == "3"
        os.write(fd, b"d\ne\npartial")
        os.fsync(fd)  # the complete lines; the held partial line is not a record until its newline or close
        assert mount.getx("t/0", "log_end_offset") == "5"
        assert mount.getx("t/0", "recovery_point") == "5"
    finally:
        os.close(fd)
    assert mount.read("t/0") == b"a\nb\nc\nd\ne\npartial\n"


def test_flush_settings_advance_recovery_point(mount_logfs):
    fs = mount_logfs("log.flush.interval.messages=1")
    os.mkdir(fs.path("t"))
    fs.append("t/0", "a\nb\nc\n")
    assert fs.getx("t/0", "recovery_point") == "3"  # flushed as the messages arrive, no fsync needed
    os.mkdir(fs.path("u"))
    sh(f"setfattr -n user.logfs.config.flush.messages -v {2**63 - 1} {shlex.quote(fs.path('u'))}")
    sh(f"setfattr -n user.logfs.config.flush.ms -v 100 {shlex.quote(fs.path('u'))}")
    fs.append("u/0", "x\ny\n")
    wait_for(lambda: fs.getx("u/0", "recovery_point") == "2", 5, what="the flush.ms flush")


def test_position_and_offset_attributes(loaded):
    fs, lines = loaded
    p = fs.path("t", 0)
    data = b"".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    fd = os.open(p, os.O_RDONLY)
    try:
        for offset in list(range(0, 300, 7)) + [299]:
            pos = int(getfattr(p, px(f"position.{offset}")))
            assert pos == starts[offset], offset
            assert int(xattr.getxattr(p, px(f"position.{offset}"))) == pos
            # Reading the file from there starts with that record.
            assert os.pread(fd, len(lines[offset]), pos) == lines[offset]
        # offset.<position>: the record whose line holds that byte (first, middle and newline of lines).
        for offset in list(range(0, 300, 11)) + [299]:
            for pos in (starts[offset], starts[offset] + len(lines[offset]) // 2, starts[offset + 1] - 1):
                assert getfattr(p, px(f"offset.{pos}")) == str(offset), pos
        assert getfattr(p, px(f"offset.{len(data) - 1}")) == "299"
    finally:
        os.close(fd)


def test_time_attribute(mount):
    os.mkdir(mount.path("t"))
    p = mount.path("t", 0)
    mount.append("t/0", "early-0\nearly-1\n")
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    mount.append("t/0", "late-2\nlate-3\n")
    assert getfattr(p, px("time.0")) == "0"
    assert getfattr(p, px(f"time.{middle}")) == "2"
    assert xattr.getxattr(p, px(f"time.{middle}")) == b"2"
    future = int(time.time() * 1000) + 3_600_000
    assert getfattr(p, px(f"time.{future}")) == "4"  # the log end offset


@pytest.mark.parametrize("name", [
    "position.301", "position.999999", "position.-1", "position.abc", "position.", "position.1x",
    "position.99999999999999999999999999", "offset.-5", "offset.abc", "offset.", "offset.99999999",
    "offset.1e3", "time.abc", "time.", "time.-1", "time.12.5",
    "nonsense", "log_end_offset.1", "partitions", "config.retention.ms", "LOG_END_OFFSET",
])
def test_bad_or_unknown_partition_attribute_is_enodata(loaded, name):
    fs, lines = loaded
    p = fs.path("t", 0)
    err = getfattr_fails(p, px(name))
    assert b"No such attribute" in err or b"No data available" in err, err
    expect_errno(errno.ENODATA, xattr.getxattr, p, px(name))
    expect_errno(errno.ENODATA, os.getxattr, p, px(name))


def test_offset_at_file_size_is_enodata(loaded):
    fs, lines = loaded
    p = fs.path("t", 0)
    size = os.stat(p).st_size
    expect_errno(errno.ENODATA, os.getxattr, p, px(f"offset.{size}"))
    assert os.getxattr(p, px(f"offset.{size - 1}")) == b"299"


def test_unknown_attribute_namespaces_are_enodata(mount):
    os.mkdir(mount.path("t"))
    for path in (mount.path("t", 0), mount.path("t")):
        for name in ("user.other", "user.logfs.nope", "user.logfs.config.nope", "user.logfs.config."):
            expect_errno(errno.ENODATA, os.getxattr, path, name)


def test_listxattr_lists_fixed_names(mount):
    os.mkdir(mount.path("t"))
    names = set(xattr.listxattr(mount.path("t", 0)))
    assert names == {px(n) for n in FIXED}
    assert set(os.listxattr(mount.path("t", 0))) == names
    listed = sh(f"getfattr -m - {shlex.quote(mount.path('t', 0))}").stdout.decode().split()
    assert set(listed[3:]) == names  # after "# file: <path>"
    topic_names = set(xattr.listxattr(mount.path("t")))
    assert topic_names == {px("partitions")} | {px("config." + k) for k in TOPIC_KEYS}
    # Every listed fixed name of a topic can be read.
    for name in topic_names:
        os.getxattr(mount.path("t"), name)


def test_topic_partitions_and_config_defaults(mount_logfs):
    fs = mount_logfs("num.partitions=2", "log.retention.ms=600000", "message.max.bytes=5000",
                     "log.cleanup.policy=compact")
    os.mkdir(fs.path("t"))
    t = fs.path("t")
    assert getfattr(t, px("partitions")) == "2"
    assert xattr.getxattr(t, px("partitions")) == b"2"
    assert getfattr(t, px("config.retention.ms")) == "600000"
    assert getfattr(t, px("config.max.message.bytes")) == "5000"
    assert getfattr(t, px("config.cleanup.policy")) == "compact"
    assert getfattr(t, px("config.segment.bytes")) == "1073741824"  # Kafka's default
    assert getfattr(t, px("config.index.interval.bytes")) == "4096"
    assert getfattr(t, px("config.min.cleanable.dirty.ratio")) == "0.5"
    sh(f"touch {shlex.quote(fs.path('t', 2))}")
    assert getfattr(t, px("partitions")) == "3"


def test_topic_config_set_applies_at_once_survives_remount_and_reverts(mount_logfs):
    fs = mount_logfs("message.max.bytes=1000")
    os.mkdir(fs.path("t"))
    os.mkdir(fs.path("other"))
    t = fs.path("t")
    p = fs.path("t", 0)
    # setfattr: takes effect at once for new writes (and for an already open handle).
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"x" * 500 + b"\n")
        setfattr(t, px("config.max.message.bytes"), "100")
        assert getfattr(t, px("config.max.message.bytes")) == "100"
        expect_errno(errno.EFBIG, os.write, fd, b"y" * 101 + b"\n")
        os.write(fd, b"z" * 100 + b"\n")
    finally:
        os.close(fd)
    assert fs.read("t/0") == b"x" * 500 + b"\n" + b"z" * 100 + b"\n"
    # Other topics keep the broker default.
    assert getfattr(fs.path("other"), px("config.max.message.bytes")) == "1000"
    # The Python package sets too.
    xattr.setxattr(t, px("config.retention.ms"), b"123456")
    assert xattr.getxattr(t, px("config.retention.ms")) == b"123456"
    setfattr(t, px("config.cleanup.policy"), "compact,delete")
    assert getfattr(t, px("config.cleanup.policy")) in ("compact,delete", "delete,compact")
    setfattr(t, px("config.logfs.key.separator"), ":")

    fs.remount()
    assert getfattr(t, px("config.max.message.bytes")) == "100"
    assert getfattr(t, px("config.retention.ms")) == "123456"
    assert getfattr(t, px("config.logfs.key.separator")) == ":"
    expect_errno(errno.EFBIG, fs.append, "t/0", b"w" * 101 + b"\n")

    # setfattr -x reverts to the broker default, at once and across a remount.
    sh(f"setfattr -x {px('config.max.message.bytes')} {shlex.quote(t)}")
    assert getfattr(t, px("config.max.message.bytes")) == "1000"
    fs.append("t/0", b"k:" + b"w" * 101 + b"\n")  # keyed: the topic is compacted now
    xattr.removexattr(t, px("config.retention.ms"))
    assert getfattr(t, px("config.retention.ms")) == "604800000"
    fs.remount()
    assert getfattr(t, px("config.max.message.bytes")) == "1000"
    assert getfattr(t, px("config.retention.ms")) == "604800000"
    assert getfattr(t, px("config.cleanup.policy")) in ("compact,delete", "delete,compact")


# Every refused value is tested at the handler level (tests/ops/test_ops_xattrs.py); through the kernel, that the
# errno reaches setfattr(1) and the syscall, and nothing changes: one bad value, one unknown key.
@pytest.mark.parametrize("name,value", [("config.retention.ms", "abc"), ("config.no.such.key", "1")])
def test_topic_config_invalid_value_or_unknown_key_is_einval(mount, name, value):
    os.mkdir(mount.path("t"))
    t = mount.path("t")
    before = {n: os.getxattr(t, n) for n in os.listxattr(t)}
    r = setfattr(t, px(name), value, check=False)
    assert r.returncode != 0 and b"Invalid argument" in r.stderr, r.stderr
    expect_errno(errno.EINVAL, xattr.setxattr, t, px(name), value.encode())
    after = {n: os.getxattr(t, n) for n in os.listxattr(t)}
    assert after == before


def test_fixed_attributes_are_read_only_and_unknown_keys_einval(mount):
    os.mkdir(mount.path("t"))
    part, topic = mount.path("t", 0), mount.path("t")
    for name in ("log_end_offset", "size_bytes", "position.0", "time.0"):
        expect_errno(errno.EPERM, xattr.setxattr, part, px(name), b"5")
    # log_start_offset is writable (DeleteRecords, CONTRACT section 4): past the log end offset it is EINVAL.
    expect_errno(errno.EINVAL, xattr.setxattr, part, px("log_start_offset"), b"5")
    expect_errno(errno.EPERM, xattr.setxattr, topic, px("partitions"), b"7")
    for path in (part, topic):
        expect_errno(errno.EINVAL, xattr.setxattr, path, px("no_such_key"), b"1")
        with pytest.raises(OSError):
            xattr.setxattr(path, "user.somethingelse", b"1")
    expect_errno(errno.EPERM, xattr.removexattr, part, px("log_end_offset"))
    assert mount.getx("t/0", "log_end_offset") == "0"
    assert mount.getx("t", "partitions") == "1"
    assert set(os.listxattr(part)) == {px(n) for n in FIXED}


def test_compression_settings_through_setfattr_survive_remount(mount_logfs, tmp_path):
    """CONTRACT section 8: `setfattr -n user.logfs.config.compression.type -v zstd` works and persists; bad values
    are EINVAL and change nothing; the broker default comes from -o, and a bad one fails the mount clearly."""
    fs = mount_logfs("compression.type=gzip", "compression.gzip.level=4")
    os.mkdir(fs.path("t"))
    t = fs.path("t")
    assert getfattr(t, px("config.compression.type")) == "gzip"  # the broker default
    assert getfattr(t, px("config.compression.gzip.level")) == "4"
    assert getfattr(t, px("config.compression.zstd.level")) == "3"
    setfattr(t, px("config.compression.type"), "zstd")
    setfattr(t, px("config.compression.zstd.level"), "19")
    assert getfattr(t, px("config.compression.type")) == "zstd"
    assert getfattr(t, px("config.compression.zstd.level")) == "19"
    for name, value in (("compression.type", "bogus"), ("compression.type", "ZSTD"), ("compression.zstd.level", "23"),
                        ("compression.lz4.level", "0"), ("compression.gzip.level", "10")):
        r = setfattr(t, px("config." + name), value, check=False)
        assert r.returncode != 0 and b"Invalid argument" in r.stderr, (name, value, r.stderr)
        expect_errno(errno.EINVAL, xattr.setxattr, t, px("config." + name), value.encode())
    assert getfattr(t, px("config.compression.type")) == "zstd"
    fs.append("t/0", "one\ntwo\n")
    assert fs.read("t/0") == b"one\ntwo\n"

    fs.remount()
    assert getfattr(t, px("config.compression.type")) == "zstd"
    assert getfattr(t, px("config.compression.zstd.level")) == "19"
    sh(f"setfattr -x {px('config.compression.type')} {shlex.quote(t)}")
    assert getfattr(t, px("config.compression.type")) == "gzip"
    assert fs.read("t/0") == b"one\ntwo\n"

    data, mnt = tmp_path / "bad-data", tmp_path / "bad-mnt"
    mnt.mkdir()
    for opts in ("compression.type=bogus", "compression.zstd.level=99"):
        r = subprocess.run([sys.executable, "-m", "logfs.cli", str(data), str(mnt), "-o", opts],
                           capture_output=True, timeout=30, env=daemon_env())
        err = r.stderr.decode()
        assert r.returncode != 0 and opts.split("=")[0] in err, err
        assert "Traceback" not in err
        assert not mounted_at(mnt)
        assert not daemon_pids(data)

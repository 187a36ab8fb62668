"""Extended attributes through Operations, with no kernel: partition offsets, topic configs and their errors."""

from __future__ import annotations

import errno

import pytest

from ops_helpers import fuse_errno
from logfs.storage import TOPIC_SETTINGS
from logfs.storage.format import codecs

FIXED = ["log_start_offset", "log_end_offset", "recovery_point", "segment_count", "size_bytes"]


@pytest.fixture
async def loaded(ops):
    await ops.mkdir("t")
    lines = [f"record-{i:03d}".encode() for i in range(300)]
    await ops.append("t/0", b"".join(line + b"\n" for line in lines))
    return ops, lines


async def test_partition_fixed_attributes(loaded):
    fs, _ = loaded
    assert await fs.getx("t/0", "log_start_offset") == "0"
    assert await fs.getx("t/0", "log_end_offset") == "300"
    assert await fs.getx("t/0", "segment_count") == "1"
    assert int(await fs.getx("t/0", "size_bytes")) > 300 * 10
    assert int(await fs.getx("t/0", "recovery_point")) <= 300


async def test_position_offset_and_time(loaded, clock):
    fs, lines = loaded
    for offset in (0, 1, 150, 299):
        pos = int(await fs.getx("t/0", f"position.{offset}"))
        assert pos == offset * 11
        assert await fs.getx("t/0", f"offset.{pos}") == str(offset)
        assert await fs.getx("t/0", f"offset.{pos + 10}") == str(offset)  # the newline of that line
    assert await fs.getx("t/0", "time.0") == "0"
    assert await fs.getx("t/0", f"time.{clock.now_ms + 1}") == "300"  # the log end offset


@pytest.mark.parametrize("name", [
    "position.301", "position.999999", "position.-1", "position.abc", "position.", "position.1x", "position.²",
    "position.99999999999999999999999999", "offset.-5", "offset.abc", "offset.", "offset.3300",
    "offset.1e3", "time.abc", "time.", "time.-1", "time.12.5",
    "nonsense", "log_end_offset.1", "partitions", "config.retention.ms", "LOG_END_OFFSET",
])
async def test_bad_or_unknown_partition_attribute_is_enodata(loaded, name):
    fs, _ = loaded
    with fuse_errno(errno.ENODATA):
        await fs.getx("t/0", name)


@pytest.mark.parametrize("name", ["user.other", "user.logfs.nope", "user.logfs.config.nope",
                                  "user.logfs.config.", "security.capability", "trusted.x"])
async def test_unknown_attribute_names_are_enodata(ops, name):
    await ops.mkdir("t")
    for path in ("", "t", "t/0"):
        with fuse_errno(errno.ENODATA):
            await ops.getxattr(path, name)


async def test_topic_partitions_and_config_defaults(ops_fs):
    fs = ops_fs(num_partitions=2, log_retention_ms=600000, message_max_bytes=5000,
                props={"log.cleanup.policy": "compact"})
    await fs.mkdir("t")
    assert await fs.getx("t", "partitions") == "2"
    assert await fs.getx("t", "config.retention.ms") == "600000"
    assert await fs.getx("t", "config.max.message.bytes") == "5000"
    assert await fs.getx("t", "config.cleanup.policy") == "compact"
    assert await fs.getx("t", "config.segment.bytes") == "1073741824"
    assert await fs.getx("t", "config.min.cleanable.dirty.ratio") == "0.5"
    assert await fs.getx("t", "config.logfs.key.separator") == ""


async def test_topic_listxattr_lists_every_readable_name(ops):
    await ops.mkdir("t")
    names = await ops.listxattr("t")
    assert set(names) == {"user.logfs.partitions"} | {f"user.logfs.config.{k}" for k in TOPIC_SETTINGS}
    for name in names:
        await ops.getxattr("t", name)
    # The root has one: the sink's protocol version (how the Spark sink recognises a logfs mount).
    assert await ops.listxattr("") == ["user.logfs.sink.protocol"]
    assert await ops.getxattr("", "user.logfs.sink.protocol") == b"1"


async def test_config_set_applies_at_once_survives_restart_and_reverts(ops_fs, open_manager):
    fs = ops_fs(message_max_bytes=1000)
    await fs.mkdir("t")
    await fs.mkdir("other")
    await fs.setconfig("t", "max.message.bytes", "100")
    assert await fs.getx("t", "config.max.message.bytes") == "100"
    with fuse_errno(errno.EFBIG):
        await fs.append("t/0", b"y" * 101 + b"\n")
    assert await fs.getx("other", "config.max.message.bytes") == "1000"
    await fs.setconfig("t", "logfs.key.separator", ":")
    fs.ops.release_all()
    fs.manager.close()

    fs = ops_fs(manager=open_manager({"message.max.bytes": "1000"}))
    assert await fs.getx("t", "config.max.message.bytes") == "100"
    assert await fs.getx("t", "config.logfs.key.separator") == ":"
    await fs.removexattr("t", "user.logfs.config.max.message.bytes")
    assert await fs.getx("t", "config.max.message.bytes") == "1000"
    await fs.append("t/0", b"w" * 101 + b"\n")


@pytest.mark.parametrize("name,value", [
    ("config.retention.ms", "abc"),
    ("config.retention.ms", "-2"),
    ("config.segment.bytes", "10"),
    ("config.cleanup.policy", "shred"),
    ("config.min.cleanable.dirty.ratio", "1.5"),
    ("config.max.message.bytes", ""),
    ("config.max.message.bytes", "é"),
    ("config.no.such.key", "1"),
    ("config.log.retention.ms", "1000"),  # a broker name is not a topic setting
    ("config.compression.type", "bogus"),
    ("config.compression.type", "ZSTD"),
    ("config.compression.type", "none"),
    ("config.compression.zstd.level", "23"),
    ("config.compression.lz4.level", "0"),
    ("config.compression.gzip.level", "0"),
    ("config.compression.gzip.level", "10"),
])
async def test_topic_config_invalid_value_or_unknown_key_is_einval(ops, name, value):
    await ops.mkdir("t")
    before = {n: await ops.getxattr("t", n) for n in await ops.listxattr("t")}
    with fuse_errno(errno.EINVAL):
        await ops.setxattr("t", "user.logfs." + name, value)
    assert {n: await ops.getxattr("t", n) for n in await ops.listxattr("t")} == before


async def test_fixed_attributes_are_read_only(ops):
    await ops.mkdir("t")
    for name in ("log_end_offset", "size_bytes", "position.0", "time.0"):
        with fuse_errno(errno.EPERM):
            await ops.setxattr("t/0", "user.logfs." + name, "5")
    with fuse_errno(errno.EINVAL):  # writable (DeleteRecords), but past the log end offset
        await ops.setxattr("t/0", "user.logfs.log_start_offset", "5")
    with fuse_errno(errno.EPERM):
        await ops.setxattr("t", "user.logfs.partitions", "7")
    for path in ("t/0", "t"):
        with fuse_errno(errno.EINVAL):
            await ops.setxattr(path, "user.logfs.no_such_key", "1")
        with fuse_errno(errno.ENOTSUP):
            await ops.setxattr(path, "user.somethingelse", "1")
    with fuse_errno(errno.ENOTSUP):
        await ops.setxattr("", "user.logfs.x", "1")
    with fuse_errno(errno.EPERM):
        await ops.removexattr("t/0", "user.logfs.log_end_offset")
    with fuse_errno(errno.ENODATA):
        await ops.removexattr("t/0", "user.other")
    with fuse_errno(errno.ENODATA):
        await ops.removexattr("t", "user.other")
    assert await ops.getx("t/0", "log_end_offset") == "0"
    assert await ops.getx("t", "partitions") == "1"


async def test_config_values_parse_as_kafka_and_read_back_effective(ops_fs, open_manager):
    fs = ops_fs()
    await fs.mkdir("t")
    for bad in ("1_000", "1e3", "0x10", "+", "١٢"):
        with fuse_errno(errno.EINVAL):
            await fs.setconfig("t", "retention.ms", bad)
    assert await fs.getx("t", "config.retention.ms") == "604800000"
    await fs.setconfig("t", "retention.ms", "+100")
    assert await fs.getx("t", "config.retention.ms") == "100"
    await fs.setconfig("t", "min.cleanable.dirty.ratio", " .25 ")
    assert await fs.getx("t", "config.min.cleanable.dirty.ratio") == "0.25"
    await fs.setconfig("t", "cleanup.policy", "delete, compact")
    assert await fs.getx("t", "config.cleanup.policy") == "compact,delete"
    fs.ops.release_all()
    fs.manager.close()
    fs = ops_fs(manager=open_manager())
    assert await fs.getx("t", "config.retention.ms") == "100"
    assert fs.manager.get_log("t", 0).config.retention_ms == 100


async def test_compression_settings_defaults_set_survive_restart_and_revert(ops_fs, open_manager):
    """CONTRACT section 8: compression.type and the KIP-390 levels as topic xattrs over broker defaults; the
    partition's LogConfig resolves the codec and level the writer will use."""
    fs = ops_fs()
    await fs.mkdir("t")
    assert await fs.getx("t", "config.compression.type") == "producer"  # Kafka's default
    assert await fs.getx("t", "config.compression.zstd.level") == "3"
    assert await fs.getx("t", "config.compression.lz4.level") == "9"
    assert await fs.getx("t", "config.compression.gzip.level") == "-1"
    assert fs.manager.get_log("t", 0).config.codec == codecs.NONE
    await fs.setconfig("t", "compression.type", " zstd ")
    await fs.setconfig("t", "compression.zstd.level", "+19")
    assert await fs.getx("t", "config.compression.type") == "zstd"
    assert await fs.getx("t", "config.compression.zstd.level") == "19"
    config = fs.manager.get_log("t", 0).config
    assert (config.codec, config.codec_level) == (codecs.ZSTD, 19)
    fs.ops.release_all()
    fs.manager.close()

    fs = ops_fs(manager=open_manager({"compression.type": "lz4", "compression.zstd.level": "5"}))
    assert await fs.getx("t", "config.compression.type") == "zstd"
    assert await fs.getx("t", "config.compression.zstd.level") == "19"
    await fs.removexattr("t", "user.logfs.config.compression.type")
    await fs.removexattr("t", "user.logfs.config.compression.zstd.level")
    assert await fs.getx("t", "config.compression.type") == "lz4"  # the broker default
    assert await fs.getx("t", "config.compression.zstd.level") == "5"
    config = fs.manager.get_log("t", 0).config
    assert (config.codec, config.codec_level) == (codecs.LZ4, 9)

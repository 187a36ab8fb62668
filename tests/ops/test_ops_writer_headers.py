"""``logfs.writer.headers`` without a kernel: records appended through a handle carry the opener's pid, uid and
command name as Kafka record headers (handler calls have no FUSE context: the opener is this process), the text
view does not show them, and the setting is validated like any topic setting."""

from __future__ import annotations

import errno
import os

from ops_helpers import APPEND, fuse_errno

HEADER_KEYS = ["logfs.pid", "logfs.uid", "logfs.comm"]


def own_headers() -> list[tuple[str, bytes]]:
    with open("/proc/self/comm", "rb") as f:
        comm = f.read().rstrip(b"\n")
    return [("logfs.pid", str(os.getpid()).encode()), ("logfs.uid", str(os.getuid()).encode()),
            ("logfs.comm", comm)]


def records(fs, topic="t", partition=0):
    return fs.manager.logs[(topic, partition)].read(0, max_bytes=1 << 30)


async def test_headers_on_every_record_and_not_in_the_view(ops):
    await ops.mkdir("t")
    assert await ops.getx("t", "config.logfs.writer.headers") == "false"
    await ops.append("t/0", b"before\n")
    await ops.setconfig("t", "logfs.writer.headers", "true")
    assert await ops.getx("t", "config.logfs.writer.headers") == "true"
    fh = await ops.open("t/0", APPEND)
    await ops.write(fh, b"one\ntwo\nthr")
    await ops.write(fh, b"ee\n")
    await ops.write(fh, b"held")  # a partial line: appended at release, with the headers too
    await ops.release(fh)
    await ops.setconfig("t", "logfs.writer.headers", "false")
    await ops.append("t/0", b"after\n")
    got = records(ops)
    assert [r.value for r in got] == [b"before", b"one", b"two", b"three", b"held", b"after"]
    assert [list(r.headers) for r in got] == [[]] + [own_headers()] * 4 + [[]]
    assert await ops.cat("t/0") == b"before\none\ntwo\nthree\nheld\nafter\n"
    assert (await ops.getattr("t/0")).st_size == len(b"before\none\ntwo\nthree\nheld\nafter\n")


async def test_headers_with_a_key_separator(ops):
    await ops.mkdir("t")
    await ops.setconfig("t", "logfs.key.separator", "=")
    await ops.setconfig("t", "logfs.writer.headers", "true")
    await ops.append("t/0", b"k=v\nnokey\n")
    got = records(ops)
    assert [(r.key, r.value) for r in got] == [(b"k", b"v"), (None, b"nokey")]
    assert all([k for k, _ in r.headers] == HEADER_KEYS for r in got)
    assert await ops.cat("t/0") == b"k=v\nnokey\n"


async def test_small_appends_with_headers_never_grow_a_headerless_batch(ops):
    """The tail batch in-place growth is for records without headers: with the setting on, each append is a
    batch of its own records, all carrying headers; turned off again, growth resumes."""
    await ops.mkdir("t")
    for i in range(3):
        await ops.append("t/0", b"plain %d\n" % i)
    await ops.setconfig("t", "logfs.writer.headers", "true")
    for i in range(3):
        await ops.append("t/0", b"tagged %d\n" % i)
    await ops.setconfig("t", "logfs.writer.headers", "false")
    for i in range(3):
        await ops.append("t/0", b"plain again %d\n" % i)
    got = records(ops)
    assert [bool(r.headers) for r in got] == [False] * 3 + [True] * 3 + [False] * 3
    assert await ops.cat("t/0") == b"".join([b"plain %d\n" % i for i in range(3)]
                                           + [b"tagged %d\n" % i for i in range(3)]
                                           + [b"plain again %d\n" % i for i in range(3)])


async def test_invalid_values_are_refused(ops):
    await ops.mkdir("t")
    for bad in ("yes", "1", ""):
        with fuse_errno(errno.EINVAL):
            await ops.setconfig("t", "logfs.writer.headers", bad)
    await ops.setconfig("t", "logfs.writer.headers", " TRUE ")
    assert await ops.getx("t", "config.logfs.writer.headers") == "true"


def test_broker_default(open_manager):
    from logfs.storage import BrokerConfig, InvalidConfigError

    manager = open_manager({"logfs.writer.headers": "true"})
    manager.create_topic("t")
    assert manager.logs[("t", 0)].config.writer_headers is True
    try:
        BrokerConfig.from_properties({"logfs.writer.headers": "on"})
    except InvalidConfigError as exc:
        assert "logfs.writer.headers" in str(exc)
    else:
        raise AssertionError("logfs.writer.headers=on accepted")

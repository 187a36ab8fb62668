"""`logfs.key.separator` and `logfs.null.marker`: lines become keyed records and tombstones, and are shown back
the same way; verified through the storage engine after unmounting."""

from __future__ import annotations

import os
import shlex
import time

from logfs.storage import LogManager
from harness import sh


def read_records(data_dir, topic: str, partition: int = 0):
    manager = LogManager(str(data_dir))
    try:
        log = manager.get_log(topic, partition)
        out, offset = [], log.log_start_offset
        while offset < log.log_end_offset:
            batch = log.read(offset)
            assert batch, f"no records at {offset}"
            out.extend(batch)
            offset = batch[-1].offset + 1
        return out
    finally:
        manager.close()


def test_key_separator_and_null_marker(mount):
    os.mkdir(mount.path("kv"))
    os.mkdir(mount.path("plain"))
    t = shlex.quote(mount.path("kv"))
    sh(f"setfattr -n user.logfs.config.logfs.key.separator -v = {t}")
    sh(f"setfattr -n user.logfs.config.logfs.null.marker -v __NULL__ {t}")
    text = b"k1=v1\nno separator here\nk2=v=2\n=empty key\nk3=__NULL__\nk4=\n__NULL__\n"
    before_ms = int(time.time() * 1000)
    mount.append("kv/0", text)
    after_ms = int(time.time() * 1000) + 1
    mount.append("plain/0", b"a=b\n__NULL__\n")
    assert mount.read("kv/0") == text
    assert os.stat(mount.path("kv", 0)).st_size == len(text)
    assert mount.getx("kv/0", "log_end_offset") == "7"
    assert mount.read("plain/0") == b"a=b\n__NULL__\n"
    mount.unmount()

    records = read_records(mount.data, "kv")
    assert [(r.key, r.value) for r in records] == [
        (b"k1", b"v1"),
        (None, b"no separator here"),
        (b"k2", b"v=2"),
        (b"", b"empty key"),
        (b"k3", None),  # tombstone
        (b"k4", b""),
        (None, None),  # unkeyed tombstone
    ]
    assert [r.offset for r in records] == list(range(7))
    for r in records:  # the record timestamp is the append time
        assert before_ms <= r.timestamp <= after_ms, (r.timestamp, before_ms, after_ms)
    plain = read_records(mount.data, "plain")
    assert [(r.key, r.value) for r in plain] == [(None, b"a=b"), (None, b"__NULL__")]

    # Remounted, the keyed view is unchanged; removing the separator shows values only.
    mount.mount()
    assert mount.read("kv/0") == text
    sh(f"setfattr -x user.logfs.config.logfs.key.separator {t}")
    expected = b"v1\nno separator here\nv=2\nempty key\n__NULL__\n\n__NULL__\n"
    assert mount.read("kv/0") == expected
    assert os.stat(mount.path("kv", 0)).st_size == len(expected)
    sh(f"setfattr -n user.logfs.config.logfs.key.separator -v '::' {t}")
    assert mount.read("kv/0") == b"k1::v1\nno separator here\nk2::v=2\n::empty key\nk3::__NULL__\nk4::\n__NULL__\n"
    assert mount.getx("kv", "config.logfs.key.separator") == "::"
    assert int(mount.getx("kv/0", "position.2")) == len(b"k1::v1\nno separator here\n")

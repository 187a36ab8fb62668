"""The engine's half of a broker mount (logfs/storage/broker.py): a log directory that another process writes,
read in place by a LogManager whose own directory is a cache. The bytes are written here as a broker writes them
(v2 batches appended to the active ``.log``, a roll, a rename to ``.deleted``, transactional and control
batches, a truncation, a move between directories), so each case is exact: a batch the writer has not finished
(short, or its CRC not yet right) is neither shown nor cut, and shows once whole; an open transaction holds the end
at its first offset; nothing under the directory changes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from pathlib import Path

import pytest

from logfs.storage.config import BrokerConfig
from logfs.storage.errors import StorageIOError
from logfs.storage.format import records as rec
from logfs.storage.manager import LogManager
from logfs.storage.names import filename_prefix
from logfs.view.text import live_view, open_view


def batch(base: int, n: int) -> bytes:
    return rec.build_batch(base, 1_700_000_000_000 + base, [b"line %d" % (base + i) for i in range(n)])


def lines(start: int, end: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(start, end))


def snapshot(root: Path) -> dict:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.stat()
        out[str(path)] = (st.st_size, st.st_mtime_ns, hashlib.sha1(path.read_bytes()).hexdigest()
                          if path.is_file() else None)
    return out


def read_view(manager, key) -> bytes:
    plog = manager.logs[key]
    out, offset = b"", plog.log_start_offset
    while offset < plog.log_end_offset:
        records = plog.read(offset, 1 << 20)
        if not records:
            break
        out += b"".join(r.value + b"\n" for r in records)
        offset = records[-1].offset + 1
    return out


def test_an_unfinished_batch_is_neither_shown_nor_cut_and_rolls_and_retention_follow(tmp_path):
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    (broker_dir / ".lock").write_bytes(b"")
    first = part / (filename_prefix(0) + ".log")
    whole = batch(0, 5) + batch(5, 5)
    torn = batch(10, 5)
    first.write_bytes(whole + torn[: len(torn) // 2])  # the broker is writing its third batch
    before = snapshot(broker_dir)
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    try:
        key = ("t", 0)
        assert manager.logs[key].log_end_offset == 10 and read_view(manager, key) == lines(0, 10)
        assert snapshot(broker_dir) == before  # not cut, nothing written

        # The rest of the batch, with its CRC still wrong (a writer that fills the header last): not shown yet.
        bad = bytearray(torn)
        bad[rec.HEADER_SIZE + 2] ^= 0xFF
        with open(first, "r+b") as f:
            f.seek(len(whole))
            f.write(bytes(bad))
        manager.broker_logs.sync_once()
        assert manager.logs[key].log_end_offset == 10
        with open(first, "r+b") as f:
            f.seek(len(whole))
            f.write(torn)
        manager.broker_logs.sync_once()
        assert manager.logs[key].log_end_offset == 15 and read_view(manager, key) == lines(0, 15)

        # A roll: a new segment at 15, then its first batch.
        second = part / (filename_prefix(15) + ".log")
        second.write_bytes(batch(15, 3))
        manager.broker_logs.sync_once()
        assert manager.logs[key].log_end_offset == 18 and read_view(manager, key) == lines(0, 18)
        assert [s.base_offset for s in manager.logs[key].segments] == [0, 15]

        # Retention: the first segment renamed .deleted, then removed; the log starts at 15.
        os.rename(first, str(first) + ".deleted")
        manager.broker_logs.sync_once()
        assert manager.logs[key].log_start_offset == 15 and read_view(manager, key) == lines(15, 18)
        os.unlink(str(first) + ".deleted")
        manager.broker_logs.sync_once()
        assert read_view(manager, key) == lines(15, 18)
        after = snapshot(broker_dir)
    finally:
        manager.close()
    assert snapshot(broker_dir) == after  # the close wrote nothing there either
    assert (broker_dir / ".lock").read_bytes() == b""


def test_the_topics_are_the_brokers_at_each_mount(tmp_path):
    """The cache keeps the mount's state between mounts; a topic the broker no longer has is not listed."""
    broker_dir, cache = tmp_path / "kafka", tmp_path / "cache"
    for topic in ("a", "b"):
        (broker_dir / f"{topic}-0").mkdir(parents=True)
        (broker_dir / f"{topic}-0" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 2))
    manager = LogManager(str(cache), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    assert sorted(manager.topics) == ["a", "b"]
    manager.close()
    for name in os.listdir(broker_dir / "b-0"):
        os.unlink(broker_dir / "b-0" / name)
    os.rmdir(broker_dir / "b-0")
    manager = LogManager(str(cache), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    try:
        assert sorted(manager.topics) == ["a"] and list(manager.logs) == [("a", 0)]
        assert read_view(manager, ("a", 0)) == lines(0, 2)
    finally:
        manager.close()


def test_the_cleaners_swap_is_followed(tmp_path):
    """Kafka's swap: the cleaned segment written as ``.cleaned``, renamed ``.swap``, the old segments renamed
    ``.deleted``, the ``.swap`` renamed live. Half done, the log is shown as it was; done, the cleaned segment
    replaces the ones it covers (a new file at the same base offset: new indexes), and an open snapshot of the old
    segments still reads them while their files exist."""
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    paths = {base: part / (filename_prefix(base) + ".log") for base in (0, 5, 10)}
    for base in (0, 5, 10):
        paths[base].write_bytes(batch(base, 5))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    key = ("t", 0)
    try:
        plog = manager.logs[key]
        assert read_view(manager, key) == lines(0, 15)
        pinned = plog.snapshot()
        kept = [0, 2, 4, 6, 8, 9]  # the records the cleaner keeps of offsets 0-9
        cleaned = rec.build_batch(0, 1_700_000_000_000, [b"line %d" % i for i in kept], offset_deltas=kept)
        (part / (filename_prefix(0) + ".log.swap")).write_bytes(cleaned)
        for base in (0, 5):
            os.rename(paths[base], str(paths[base]) + ".deleted")
        manager.broker_logs.sync_once()
        assert read_view(manager, key) == lines(0, 15)  # half done: as it was
        os.rename(part / (filename_prefix(0) + ".log.swap"), paths[0])
        manager.broker_logs.sync_once()
        assert [s.base_offset for s in plog.segments] == [0, 10]
        assert read_view(manager, key) == b"".join(b"line %d\n" % i for i in kept) + lines(10, 15)
        # The snapshot taken before still reads the old segments (by their .deleted names, while they exist).
        assert b"".join(s.read(0, s.size) for s in pinned.segments[:2]) == batch(0, 5) + batch(5, 5)
        pinned.release()
    finally:
        manager.close()


def test_a_roll_and_the_removal_of_the_old_active_segment_seen_in_one_look(tmp_path):
    """Retention expiring the whole log: the broker rolls, then removes the segment that was active. Seen in one
    look (its descriptor closed meanwhile, by the open-file budget), the log is the new segment alone, without an
    error."""
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    first = part / (filename_prefix(0) + ".log")
    first.write_bytes(batch(0, 5))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    key = ("t", 0)
    try:
        plog = manager.logs[key]
        with plog.lock:
            plog.segments.active.release()
        (part / (filename_prefix(5) + ".log")).write_bytes(b"")
        os.unlink(first)
        manager.broker_logs.sync_once()
        assert [s.base_offset for s in plog.segments] == [5]
        assert (plog.log_start_offset, plog.log_end_offset) == (5, 5) and read_view(manager, key) == b""
        (part / (filename_prefix(5) + ".log")).write_bytes(batch(5, 2))
        manager.broker_logs.sync_once()
        assert read_view(manager, key) == lines(5, 7)
    finally:
        manager.close()


def test_several_broker_directories_are_one_namespace(tmp_path):
    """Kafka's log.dirs: each partition in one of them, the topics of all of them served together."""
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    for i, d in enumerate(dirs):
        (d / f"t-{i}").mkdir(parents=True)
        (d / f"t-{i}" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 3 + i))
    before = snapshot(tmp_path)
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}),
                         broker_dirs=[str(d) for d in dirs])
    try:
        assert sorted(manager.logs) == [("t", 0), ("t", 1)]
        assert read_view(manager, ("t", 0)) == lines(0, 3) and read_view(manager, ("t", 1)) == lines(0, 4)
    finally:
        manager.close()
    assert {k: v for k, v in snapshot(tmp_path).items() if "/cache" not in k} == before


def test_topics_and_partitions_come_and_go(tmp_path):
    """A partition directory the broker makes after the mount is served once its first segment is there; one it
    renames for deletion (``-delete``) is served no more, and a topic with no partition left is not listed."""
    broker_dir = tmp_path / "kafka"
    (broker_dir / "a-0").mkdir(parents=True)
    (broker_dir / "a-0" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 2))
    before = snapshot(broker_dir)
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    try:
        assert list(manager.logs) == [("a", 0)]
        (broker_dir / "b-0").mkdir()
        manager.broker_logs.sync_once()
        assert "b" not in manager.topics  # (no segment yet)
        (broker_dir / "b-0" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 3))
        manager.broker_logs.sync_once()
        assert sorted(manager.logs) == [("a", 0), ("b", 0)] and read_view(manager, ("b", 0)) == lines(0, 3)
        os.rename(broker_dir / "a-0", broker_dir / ("a-0." + "0" * 32 + "-delete"))
        manager.broker_logs.sync_once()
        assert sorted(manager.logs) == [("b", 0)] and sorted(manager.topics) == ["b"]
        os.rename(broker_dir / ("a-0." + "0" * 32 + "-delete"), broker_dir / "a-0")
    finally:
        manager.close()
    assert {k: v for k, v in snapshot(broker_dir).items() if "b-0" not in k} == {
        k: v for k, v in before.items() if k != str(broker_dir)}  # (the renames were this test's)


def txn_batch(base: int, values: list[bytes], producer_id: int) -> bytes:
    return rec.build_batch_generic(base, 1_700_000_000_000, values, attributes=rec.ATTR_TRANSACTIONAL,
                                   producer=(producer_id, 0, base))


def marker(offset: int, producer_id: int, commit: bool) -> bytes:
    return rec.build_batch_generic(offset, 1_700_000_000_000, [struct.pack(">hi", 0, 0)],
                                   [struct.pack(">hh", 0, 1 if commit else 0)],
                                   attributes=rec.ATTR_TRANSACTIONAL | rec.ATTR_CONTROL, producer=(producer_id, 0, -1))


def plain(base: int, values: list[bytes]) -> bytes:
    return rec.build_batch(base, 1_700_000_000_000, values)


def test_transactions_decide_what_is_shown_as_the_broker_writes_them(tmp_path):
    """No ``.txnindex`` (the broker writes it with the abort marker, later than the records): the data decides. A
    transaction left open holds the view's end at its first offset (the LSO), across the broker's roll; its abort
    hides its records, a commit shows them, and what came after shows then."""
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    first, second = (part / (filename_prefix(base) + ".log") for base in (0, 8))
    first.write_bytes(plain(0, [b"a0", b"a1", b"a2"]) + txn_batch(3, [b"t7-3", b"t7-4"], 7)
                      + txn_batch(5, [b"t8-5", b"t8-6"], 8) + plain(7, [b"p7"]))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    key = ("t", 0)

    def shown() -> bytes:
        return live_view(manager.logs[key]).read(0, 1 << 20)

    try:
        assert manager.logs[key].log_end_offset == 3 and shown() == b"a0\na1\na2\n"  # producer 7's is open at 3
        # The broker rolls; producer 7 writes on and aborts; producer 8's transaction (from 5) is still open.
        second.write_bytes(txn_batch(8, [b"t7-8"], 7) + marker(9, 7, commit=False))
        manager.broker_logs.sync_once()
        plog = manager.logs[key]
        assert plog.log_end_offset == 5 and shown() == b"a0\na1\na2\n"
        assert [s.base_offset for s in plog.segments.as_list()] == [0]  # (the roll waits: segment 0 is not whole)
        with open(second, "ab") as f:
            f.write(marker(10, 8, commit=True) + plain(11, [b"p11", b"p12"]))
        manager.broker_logs.sync_once()
        assert plog.log_end_offset == 13 and [s.base_offset for s in plog.segments.as_list()] == [0, 8]
        assert shown() == b"a0\na1\na2\nt8-5\nt8-6\np7\np11\np12\n"
        with open(second, "ab") as f:
            f.write(txn_batch(13, [b"t9-13"], 9) + plain(14, [b"p14"]))
        manager.broker_logs.sync_once()
        assert plog.log_end_offset == 13
        with open(second, "ab") as f:
            f.write(marker(15, 9, commit=False))
        manager.broker_logs.sync_once()
        assert plog.log_end_offset == 16 and shown() == b"a0\na1\na2\nt8-5\nt8-6\np7\np11\np12\np14\n"
    finally:
        manager.close()


def test_inotify_says_which_partitions_to_look_at(tmp_path):
    """With inotify (the default), a look reads only the partitions whose directory reported a change, and new
    topics; a full look comes every ``logfs.broker.full.look.ms``, and after the kernel dropped events (its queue
    overflowed). Without inotify every look is a full one."""
    broker_dir = tmp_path / "kafka"
    for p in range(3):
        (broker_dir / f"t-{p}").mkdir(parents=True)
        (broker_dir / f"t-{p}" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 2))
    config = BrokerConfig.from_properties({"logfs.broker.full.look.ms": str((1 << 31) - 1)})
    manager = LogManager(str(tmp_path / "cache"), config, broker_dirs=[str(broker_dir)])
    try:
        logs = manager.broker_logs
        assert logs.watch is not None and not logs.unwatched
        with open(broker_dir / "t-1" / (filename_prefix(0) + ".log"), "ab") as f:
            f.write(batch(2, 3))
        logs.sync_once()
        assert manager.logs[("t", 1)].log_end_offset == 5 and logs.full_looks == 0
        # A new topic: its directory, then its first segment.
        (broker_dir / "u-0").mkdir()
        logs.sync_once()
        (broker_dir / "u-0" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 4))
        logs.sync_once()
        assert manager.logs[("u", 0)].log_end_offset == 4 and logs.full_looks == 0
        # More events than the kernel queues (fs.inotify.max_queued_events): dropped, so everything is looked at.
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        noise = tmp_path / "kafka" / "t-2"
        for i in range(limit + 10):
            (noise / f"leader-epoch-checkpoint.{i}.tmp").write_bytes(b"")
        with open(broker_dir / "t-0" / (filename_prefix(0) + ".log"), "ab") as f:
            f.write(batch(2, 1))
        logs.sync_once()
        assert logs.full_looks == 1 and manager.logs[("t", 0)].log_end_offset == 3
    finally:
        manager.close()

    manager = LogManager(str(tmp_path / "cache2"), BrokerConfig.from_properties({"logfs.broker.inotify": "false"}),
                         broker_dirs=[str(broker_dir)])
    try:
        logs = manager.broker_logs
        assert logs.watch is None
        logs.sync_once()
        logs.sync_once()
        assert logs.full_looks == 2
    finally:
        manager.close()


def test_a_truncation_by_the_broker_is_followed(tmp_path):
    """The broker removed batches the mount showed (its recovery after a crash cut the tail it had not synced; a
    follower truncates after a leader change) and appended others at the same offsets: the partition is loaded
    again, a fresh read shows what the files hold, never the bytes that are gone; an open file's read of the
    truncated segment fails with ESTALE (its view reads whole batches, some gone); later appends are shown."""
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    seg = part / (filename_prefix(0) + ".log")
    kept = batch(0, 5) + batch(5, 5)
    seg.write_bytes(kept + batch(10, 5) + batch(15, 5))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    key = ("t", 0)
    try:
        assert read_view(manager, key) == lines(0, 20)
        held = open_view(manager.logs[key])
        assert held.read(0, 1 << 20) == lines(0, 20)
        with open(seg, "r+b") as f:
            f.truncate(len(kept))  # (the broker's recovery: the batches after 10 were lost)
        manager.broker_logs.sync_once()
        assert manager.logs[key].log_end_offset == 10 and live_view(manager.logs[key]).read(0, 1 << 20) == lines(0, 10)
        with pytest.raises(StorageIOError) as info:
            held.read(0, 1 << 20)
        assert info.value.errno == errno.ESTALE
        held.release()
        # New batches at the same offsets, other records: shown.
        with open(seg, "ab") as f:
            f.write(rec.build_batch(10, 1_700_000_000_000, [b"new %d" % i for i in range(3)]))
        manager.broker_logs.sync_once()
        assert live_view(manager.logs[key]).read(0, 1 << 20) == lines(0, 10) + b"new 0\nnew 1\nnew 2\n"
        # Truncated and grown past its old end before a look: the last batch's CRC changed, so it is seen too.
        with open(seg, "r+b") as f:
            f.truncate(len(kept))
            f.seek(len(kept))
            f.write(rec.build_batch(10, 1_700_000_000_001, [b"again %d" % i for i in range(40)]))
        manager.broker_logs.sync_once()
        assert live_view(manager.logs[key]).read(0, 1 << 20) == lines(0, 10) + b"".join(
            b"again %d\n" % i for i in range(40))
    finally:
        manager.close()


def test_a_transaction_open_across_a_roll_at_mount(tmp_path):
    """Mounted while a transaction is open and the broker has rolled since its first record: the log ends at the
    LSO (in the first segment); the later segment waits, and shows once the transaction commits."""
    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    (part / (filename_prefix(0) + ".log")).write_bytes(plain(0, [b"a0", b"a1"]) + txn_batch(2, [b"t5-2"], 5)
                                                       + plain(3, [b"p3"]))
    second = part / (filename_prefix(4) + ".log")
    second.write_bytes(txn_batch(4, [b"t5-4"], 5) + plain(5, [b"p5"]))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    key = ("t", 0)
    try:
        plog = manager.logs[key]
        assert plog.log_end_offset == 2 and [s.base_offset for s in plog.segments.as_list()] == [0]
        assert live_view(plog).read(0, 1 << 20) == b"a0\na1\n"
        with open(second, "ab") as f:
            f.write(marker(6, 5, commit=True))
        manager.broker_logs.sync_once()
        assert plog.log_end_offset == 7 and [s.base_offset for s in plog.segments.as_list()] == [0, 4]
        assert live_view(plog).read(0, 1 << 20) == b"a0\na1\nt5-2\np3\nt5-4\np5\n"
    finally:
        manager.close()


def test_a_partition_moved_between_the_brokers_directories(tmp_path):
    """Kafka's move (AlterReplicaLogDirs): a ``-future`` copy in the other directory, then the source renamed
    ``-delete`` and the copy ``<topic>-<n>``. A copy with the same segments: the log's segments are pointed at it,
    and a view opened before goes on with the appends after. A copy rolled elsewhere: the partition is loaded from
    it, and a view opened before reads what it read through the ``-delete`` directory."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    for d in (d1, d2):
        d.mkdir()
    for topic in ("same", "other"):
        (d1 / f"{topic}-0").mkdir()
        (d1 / f"{topic}-0" / (filename_prefix(0) + ".log")).write_bytes(batch(0, 5))
        (d1 / f"{topic}-0" / (filename_prefix(5) + ".log")).write_bytes(batch(5, 5))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}),
                         broker_dirs=[str(d1), str(d2)])
    try:
        views = {t: open_view(manager.logs[(t, 0)]) for t in ("same", "other")}
        logs = {t: manager.logs[(t, 0)] for t in ("same", "other")}
        for topic, copy in (("same", {0: batch(0, 5), 5: batch(5, 5)}), ("other", {0: batch(0, 5) + batch(5, 5)})):
            future = d2 / f"{topic}-0.{'a' * 32}-future"
            future.mkdir()
            for base, data in copy.items():
                (future / (filename_prefix(base) + ".log")).write_bytes(data)
            manager.broker_logs.sync_once()  # (a -future copy is not a partition)
            assert manager.logs[(topic, 0)] is logs[topic]
            os.rename(d1 / f"{topic}-0", d1 / f"{topic}-0.{'b' * 32}-delete")
            os.rename(future, d2 / f"{topic}-0")
        manager.broker_logs.sync_once()
        for topic in ("same", "other"):
            with open(d2 / f"{topic}-0" / (filename_prefix(0 if topic == "other" else 5) + ".log"), "ab") as f:
                f.write(batch(10, 3))
        manager.broker_logs.sync_once()
        assert manager.logs[("same", 0)] is logs["same"]  # (followed in place)
        assert manager.logs[("other", 0)] is not logs["other"]  # (loaded afresh)
        for topic in ("same", "other"):
            assert live_view(manager.logs[(topic, 0)]).read(0, 1 << 20) == lines(0, 13)
        assert views["same"].read(0, 1 << 20) == lines(0, 13)  # the open view goes on
        assert views["other"].read(0, 1 << 20) == lines(0, 10)  # it reads what it read, from the -delete directory
        for view in views.values():
            view.release()
    finally:
        manager.close()


def test_a_segment_renamed_between_the_look_and_the_open_is_read_under_its_new_name(tmp_path, monkeypatch):
    """Retention renames a segment ``.deleted`` just after a read looked up its name and before it opened it (the
    ``kafka://`` replica's cache bound did this under a reader in a clean-clone run: the read answered ENOENT): the
    read opens the same inode under its new name."""
    from logfs.storage.local.open_files import release_unit

    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    (part / (filename_prefix(0) + ".log")).write_bytes(batch(0, 5))
    (part / (filename_prefix(5) + ".log")).write_bytes(batch(5, 3))
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    try:
        segment = next(iter(manager.logs[("t", 0)].segments))
        release_unit(segment)  # (its next read opens the file again)
        looked = segment._path_now

        def renamed_after_the_look() -> str:
            path = looked()
            if not path.endswith(".deleted"):
                os.rename(path, path + ".deleted")
            return path

        monkeypatch.setattr(segment, "_path_now", renamed_after_the_look)
        assert segment.read(0, segment.size) == batch(0, 5)
        assert os.path.exists(part / (filename_prefix(0) + ".log.deleted"))
    finally:
        manager.close()


def test_the_brokers_log_start_offset_checkpoint_is_followed(tmp_path):
    """A start moved inside a segment (DeleteRecords: the broker, or the ``kafka://`` replica, rewrites its
    ``log-start-offset-checkpoint``) is followed at the next look; a start past the end shown waits for the appends
    up to it; an open view keeps its start."""
    from logfs.storage import checkpoints as ckpt

    broker_dir = tmp_path / "kafka"
    part = broker_dir / "t-0"
    part.mkdir(parents=True)
    segment = part / (filename_prefix(0) + ".log")
    segment.write_bytes(batch(0, 10))
    checkpoint = str(broker_dir / ckpt.LOG_START_OFFSET)
    manager = LogManager(str(tmp_path / "cache"), BrokerConfig.from_properties({}), broker_dirs=[str(broker_dir)])
    try:
        key = ("t", 0)
        plog = manager.logs[key]
        opened = open_view(plog)
        ckpt.write_checkpoint(checkpoint, {key: 4})
        manager.broker_logs.sync_once()
        assert plog.log_start_offset == 4 and read_view(manager, key) == lines(4, 10)
        assert live_view(plog).length() == len(lines(4, 10))
        assert opened.length() == len(lines(0, 10))  # (an open view keeps its own)
        ckpt.write_checkpoint(checkpoint, {key: 15})  # past the end shown: waits for the appends
        manager.broker_logs.sync_once()
        assert plog.log_start_offset == 4
        with open(segment, "ab") as f:
            f.write(batch(10, 10))
        manager.broker_logs.sync_once()
        assert plog.log_end_offset == 20 and plog.log_start_offset == 15
        assert read_view(manager, key) == lines(15, 20)
        opened.release()
    finally:
        manager.close()

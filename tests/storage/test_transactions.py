"""The Spark sink's publish primitive in the engine (logfs.storage.publish.transactions): staged batches appended once per
writer, every check before anything changes, one publish per partition, and a crash at any step completed (or
never begun) after a restart, each partition holding all of a commit's records or none."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from logfs.storage.format import records as rec
from logfs.storage.local import segment as segment_mod
from logfs.storage.publish import transaction_log
from logfs.storage.publish import transactions as txn
from logfs.storage.errors import (
    CommitIncompleteError, InvalidRecordError, StorageIOError, InvalidRequestError, NoSuchStagedFileError, NoSuchTopicError, RecordTooLargeError,
    StagingClosedError,
)
from logfs.storage.names import STAGING_DIR, TRANSACTIONS_FILE
from logfs.storage.local.reader import PartitionReader


class Crash(BaseException):
    """A kill at an injected point: nothing after it runs, nothing is rolled back."""


def batches(n, start=0, per_batch=50, tag="v", keyed=True, size=0):
    """Staged bytes of n records in batches of per_batch, as the sink stages them (base offset 0, producer -1)."""
    out = []
    for first in range(start, start + n, per_batch):
        ids = range(first, min(start + n, first + per_batch))
        values = [f"{tag}{i}".encode() + b"x" * size for i in ids]
        keys = [f"k{i}".encode() for i in ids] if keyed else None
        out.append(rec.build_batch(0, 1, values, keys))
    return b"".join(out)


def stage(manager, name, data):
    fd = manager.transactions.staging.create(name)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return name


def commit(manager, app, version, parts, **kw):
    return manager.transactions.request(json.dumps(
        {"op": "commit", "app": app, "version": version, "parts": parts, **kw}).encode())


def values(plog):
    return [r.value.decode() for r in plog.read(0, 1 << 30)] if plog.log_end_offset else []


def staged(data_dir):
    path = os.path.join(data_dir, STAGING_DIR)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@pytest.fixture
def mgr(open_manager):
    manager = open_manager({"num.partitions": "3"})
    manager.create_topic("out")
    return manager


def test_commit_appends_each_span_in_order_once(mgr, clock):
    a, b = batches(120, 0), batches(80, 120)
    stage(mgr, "j-1.0", a)
    stage(mgr, "j-1.1", b)
    stage(mgr, "j-1.9", batches(5, 1000))  # a losing attempt: not named
    clock.advance(5000)
    answer = commit(mgr, "j-1", 0, [["out", 0, [["j-1.1", 0, len(b)], ["j-1.0", 0, len(a)]]],
                                    ["out", 2, [["j-1.0", 0, len(a)]]]], cleanup="j-1.", close=True)
    assert answer == {"ok": True, "duplicate": False, "offsets": {"out": {"0": [0, 199], "2": [0, 119]}}}
    p0 = mgr.logs[("out", 0)]
    assert values(p0) == [f"v{i}" for i in range(120, 200)] + [f"v{i}" for i in range(120)]
    assert values(mgr.logs[("out", 1)]) == []
    # Kafka's terms: one producer id for the commit, sequences counting its records in the partition, the
    # append time as timestamp; flushed before the answer.
    headers = [h for _, h, _, _ in p0.segments.active.batches_from(0)]
    pid = txn.producer_id("j-1", 0)
    assert {h.producer_id for h in headers} == {pid} and {h.producer_epoch for h in headers} == {0}
    assert [h.base_sequence for h in headers] == [h.base_offset for h in headers]
    assert {h.max_timestamp for h in headers} == {clock.time_ms()}
    assert all(r.timestamp == clock.time_ms() and r.key == f"k{r.value.decode()[1:]}".encode()
               for r in p0.read(0, 1 << 30))
    assert p0.recovery_point == p0.log_end_offset
    assert staged(mgr.data_dir) == []
    # Replays of the same writer are duplicates: nothing appended, its new files cleaned up.
    stage(mgr, "j-1x.0", a)
    assert commit(mgr, "j-1", 0, [["out", 0, [["j-1x.0", 0, len(a)]]]], cleanup="j-1x.")["duplicate"]
    assert p0.log_end_offset == 200 and staged(mgr.data_dir) == []
    # The closed prefix refuses a late attempt's file.
    with pytest.raises(StagingClosedError):
        mgr.transactions.staging.create("j-1.7")
    # A streaming writer: each version once, earlier versions are duplicates.
    for version in (0, 1, 1, 0, 2):
        body = batches(10, 1000 + version * 10)
        stage(mgr, f"q-9.{version}.0", body)
        answer = commit(mgr, "q-9", version, [["out", 1, [[f"q-9.{version}.0", 0, len(body)]]]], cleanup="q-9.")
    assert values(mgr.logs[("out", 1)]) == [f"v{i}" for i in range(1000, 1030)]
    assert mgr.transactions.status("q-9", 2) == {"ok": True, "applied": True, "pending": False, "last_version": 2}
    assert mgr.transactions.status("q-9", 3)["applied"] is False


def test_applied_writers_survive_restarts(tmp_path, open_manager, clock):
    data = tmp_path / "data"
    m = open_manager({"num.partitions": "1"}, data_dir=data)
    m.create_topic("out")
    stage(m, "j-1.0", batches(10))
    commit(m, "j-1", 0, [["out", 0, [["j-1.0", 0, len(batches(10))]]]])
    m.abandon()  # unclean
    m = open_manager(data_dir=data)
    stage(m, "j-1.1", batches(10))
    assert commit(m, "j-1", 0, [["out", 0, [["j-1.1", 0, len(batches(10))]]]])["duplicate"]
    m.close()  # clean
    assert not os.path.exists(data / STAGING_DIR)  # (Kafka would refuse a directory that is not a partition)
    m = open_manager(data_dir=data)
    assert m.transactions.log.applied("j-1", 0) and m.logs[("out", 0)].log_end_offset == 10
    # Expired after transactional.id.expiration.ms without a commit.
    m.close()
    clock.advance(10_000)
    m = open_manager({"transactional.id.expiration.ms": "5000"}, data_dir=data)
    assert not m.transactions.log.applied("j-1", 0)


@pytest.mark.parametrize("case", ["topic", "partition", "file", "range", "boundary", "crc", "compressed",
                                  "too large", "keyless", "segment", "malformed"])
def test_every_refusal_comes_before_anything_is_appended(open_manager, case):
    m = open_manager({"num.partitions": "2", "message.max.bytes": "1000", "log.segment.bytes": "20000"})
    m.create_topic("out")
    m.create_topic("kv")
    m.set_topic_config("kv", "cleanup.policy", "compact")
    good = batches(20)
    stage(m, "j-1.0", good)
    bad, topic, part = good, "out", 1
    if case == "topic":
        topic = "nope"
    elif case == "partition":
        part = 7
    elif case == "crc":
        bad = bytearray(good)
        bad[100] ^= 1
    elif case == "compressed":
        bad = rec.compress_batch(batches(20, per_batch=20), 4)
    elif case == "too large":
        bad = batches(1, size=1200)
    elif case == "keyless":
        topic, bad = "kv", batches(3, keyed=False)
    elif case == "segment":
        bad = batches(400, size=50)
    stage(m, "j-1.1", bytes(bad))
    span = ["j-1.1", 0, len(bad)]
    if case == "file":
        span = ["j-1.5", 0, 10]
    elif case == "range":
        span = ["j-1.1", 0, len(bad) + 1]
    elif case == "boundary":
        span = ["j-1.1", 0, len(bad) - 3]
    request = {"op": "commit", "app": "j-1", "version": 0,
               "parts": [["out", 0, [["j-1.0", 0, len(good)]]], [topic, part, [span]]]}
    if case == "malformed":
        request["parts"][1] = ["out", "1", [span]]
    expected = {"topic": NoSuchTopicError, "partition": NoSuchTopicError, "file": NoSuchStagedFileError,
                "too large": RecordTooLargeError, "segment": RecordTooLargeError,
                "keyless": InvalidRecordError}.get(case, InvalidRequestError)
    with pytest.raises(expected):
        m.transactions.request(json.dumps(request).encode())
    assert all(plog.log_end_offset == 0 for plog in m.logs.values())
    assert not m.transactions.log.pending and not m.transactions.log.applied("j-1", 0)
    with open(os.path.join(m.data_dir, TRANSACTIONS_FILE), "rb") as f:
        assert b'"commit"' not in f.read()


def test_abort_and_sweep_remove_what_no_commit_names(mgr, clock):
    for name in ("j-2.0", "j-2.1", "j-3.0"):
        stage(mgr, name, batches(3))
    assert mgr.transactions.abort("j-2.") == {"ok": True, "removed": 2}
    assert staged(mgr.data_dir) == ["j-3.0"]
    with pytest.raises(StagingClosedError):
        mgr.transactions.staging.create("j-2.2")
    mgr.transactions.staging.create("j-22.0")  # (another writer, whose id starts the same way)
    old = time.time() - 2 * 86400
    os.utime(os.path.join(mgr.data_dir, STAGING_DIR, "j-3.0"), (old, old))
    assert mgr.transactions.sweep() == 1
    assert staged(mgr.data_dir) == ["j-22.0"]


def _crash_at(monkeypatch, point, after=1):
    """Raise Crash at ``point`` of a commit, the ``after``-th time it is reached."""
    seen = [0]

    def hit():
        seen[0] += 1
        if seen[0] == after:
            raise Crash(point)

    if point == "commit point":
        original = txn.TransactionLog.append

        def append(self, record):
            original(self, record)
            if record["t"] == "commit":
                hit()
        monkeypatch.setattr(txn.TransactionLog, "append", append)
    elif point == "partition appended":
        original_flush = txn.Transactions._append

        def _append(self, plog, part, pid):
            out = original_flush(self, plog, part, pid)
            hit()
            return out
        monkeypatch.setattr(txn.Transactions, "_append", _append)
    elif point == "header not written":
        original_pwrite = segment_mod.LogSegment._pwrite

        def _pwrite(self, data, position):
            if len(data) == rec.HEADER_SIZE:  # the group's first header, written last
                hit()
            return original_pwrite(self, data, position)
        monkeypatch.setattr(segment_mod.LogSegment, "_pwrite", _pwrite)
    elif point == "before done":
        original = txn.TransactionLog.append

        def append(self, record):
            if record["t"] == "done":
                hit()
            original(self, record)
        monkeypatch.setattr(txn.TransactionLog, "append", append)


@pytest.mark.parametrize("point,after", [("commit point", 1), ("partition appended", 1), ("partition appended", 2),
                                         ("header not written", 1), ("header not written", 2),
                                         ("before done", 1)])
def test_a_crash_at_any_step_is_completed_at_restart(tmp_path, open_manager, monkeypatch, point, after):
    data = tmp_path / "data"
    m = open_manager({"num.partitions": "3"}, data_dir=data)
    m.create_topic("out")
    for p in range(3):  # records of other writers before
        m.logs[("out", p)].append([b"before"])
    parts = []
    for p in range(3):
        body = batches(100 + p, 1000 * p)
        stage(m, f"j-1.{p}", body)
        parts.append(["out", p, [[f"j-1.{p}", 0, len(body)]]])
    _crash_at(monkeypatch, point, after)
    with pytest.raises(Crash):
        commit(m, "j-1", 0, parts, cleanup="j-1.")
    monkeypatch.undo()
    m.abandon()  # as kill -9: the page cache keeps what was written, nothing is rolled back or flushed
    m = open_manager(data_dir=data)
    for p in range(3):  # every partition: the commit's records once, after what was there
        assert values(m.logs[("out", p)]) == ["before"] + [f"v{i}" for i in range(1000 * p, 1000 * p + 100 + p)]
    assert m.transactions.log.applied("j-1", 0) and not m.transactions.log.pending
    assert staged(str(data)) == []
    # The driver's retry after the restart is a duplicate.
    assert commit(m, "j-1", 0, parts)["duplicate"]


def _one_span_commit_crashes(open_manager, monkeypatch, data, n, point):
    """A manager on ``data`` whose commit of ``n`` records staged for partition out-0 crashed at ``point``."""
    m = open_manager({"num.partitions": "1"}, data_dir=data)
    m.create_topic("out")
    body = batches(n)
    stage(m, "j-1.0", body)
    _crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        commit(m, "j-1", 0, [["out", 0, [["j-1.0", 0, len(body)]]]])
    monkeypatch.undo()
    return m


def test_a_commit_lost_in_part_by_a_power_cut_is_cut_back_and_appended_again(tmp_path, open_manager, monkeypatch):
    """A power cut may keep the first batches of a partition's share and lose the rest (the page cache is written
    back in any order before the fsync): recovery finds part of the commit at the end of the log, cuts it, and
    appends it all again."""
    data = tmp_path / "data"
    m = _one_span_commit_crashes(open_manager, monkeypatch, data, 300, "before done")
    plog = m.logs[("out", 0)]
    path = plog.segments.active.log_path
    size = plog.segments.active.size
    m.abandon()
    os.truncate(path, size - 100)  # the last batch torn
    m = open_manager(data_dir=data)
    assert values(m.logs[("out", 0)]) == [f"v{i}" for i in range(300)]


def test_a_commit_whose_staged_files_are_lost_is_never_applied_again(tmp_path, open_manager, monkeypatch, caplog):
    data = tmp_path / "data"
    m = _one_span_commit_crashes(open_manager, monkeypatch, data, 10, "commit point")
    m.abandon()
    os.unlink(data / STAGING_DIR / "j-1.0")
    m = open_manager(data_dir=data)
    assert "could not be completed" in caplog.text
    assert m.logs[("out", 0)].log_end_offset == 0 and m.transactions.log.applied("j-1", 0)


def test_readers_never_see_part_of_a_commit(mgr):
    """While commits of 500 records each go to a partition, the daemon's view and a reader of the files (the Spark
    source's) only ever see whole commits."""
    plog = mgr.logs[("out", 0)]
    stop = threading.Event()
    seen = set()
    errors = []
    reader = PartitionReader(mgr.data_dir, "out", 0)

    def watch():
        try:
            while not stop.is_set():
                seen.add(reader.log_end_offset())
                seen.add(plog.log_end_offset)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        for version in range(30):
            body = batches(500, per_batch=37, size=40)
            stage(mgr, f"q-1.{version}.0", body)
            commit(mgr, "q-1", version, [["out", 0, [[f"q-1.{version}.0", 0, len(body)]]]])
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert plog.log_end_offset == 15000
    assert seen <= set(range(0, 15001, 500)) and len(seen) > 3


def test_the_transaction_log_is_compacted_and_cut_at_a_torn_record(tmp_path, open_manager, monkeypatch):
    monkeypatch.setattr(transaction_log, "COMPACT_EVERY", 10)
    data = tmp_path / "data"
    m = open_manager({"num.partitions": "1"}, data_dir=data)
    m.create_topic("out")
    for version in range(20):
        stage(m, f"q-1.{version}.0", batches(2))
        commit(m, "q-1", version, [["out", 0, [[f"q-1.{version}.0", 0, len(batches(2))]]]])
    path = data / TRANSACTIONS_FILE
    assert len(path.read_bytes().splitlines()) <= 12
    m.abandon()
    with open(path, "ab") as f:
        f.write(b'0badc0de {"t":"done","app":"q-1"')  # an append a crash cut
    m = open_manager(data_dir=data)
    assert m.transactions.log.apps["q-1"][0] == 19
    assert path.read_bytes().endswith(b"\n")


def test_a_disk_error_after_the_commit_point_is_completed_not_refused(mgr, monkeypatch):
    """A commit whose second partition's append fails (a full disk) after its commit point: the error says it will
    be completed, with the failure's errno; the service's sweep completes it (its staged files kept until then),
    each record once."""
    import errno

    from logfs.storage.local.log import Log

    parts = []
    for p in range(3):
        body = batches(40, 100 * p)
        stage(mgr, f"j-1.{p}", body)
        parts.append(["out", p, [[f"j-1.{p}", 0, len(body)]]])
    original = Log.append_staged
    calls = [0]

    def append_staged(self, batches_, timestamp_ms):
        calls[0] += 1
        if calls[0] == 2:
            raise StorageIOError("write failed: No space left on device", errno.ENOSPC)
        return original(self, batches_, timestamp_ms)

    monkeypatch.setattr(Log, "append_staged", append_staged)
    with pytest.raises(CommitIncompleteError, match="passed its commit point, and will be completed") as info:
        commit(mgr, "j-1", 0, parts, cleanup="j-1.", close=True)
    assert info.value.errno == errno.ENOSPC
    assert mgr.transactions.log.pending and staged(mgr.data_dir) == ["j-1.0", "j-1.1", "j-1.2"]
    assert mgr.transactions.abort("j-1.")["removed"] == 0  # (Spark's abort: the files are still needed)
    monkeypatch.undo()
    mgr.transactions.sweep()
    for p in range(3):
        assert values(mgr.logs[("out", p)]) == [f"v{i}" for i in range(100 * p, 100 * p + 40)]
    assert not mgr.transactions.log.pending and mgr.transactions.log.applied("j-1", 0)
    assert staged(mgr.data_dir) == []

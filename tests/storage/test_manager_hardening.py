"""LogManager and the namespace on disk (issue 13: strays, -delete dirs, whole-or-nothing deletes on a full disk
and for the longest names, colliding topics, holes in partition numbers, num.partitions and its creation)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from logfs.storage import BrokerConfig, InvalidConfigError, InvalidPartitionError, InvalidTopicError, StorageIOError
from logfs.storage import names
from logfs.storage.errors import NoSuchTopicError, ShuttingDownError
from test_loader import managers  # noqa: F401  (the storage tests' one LogManager fixture)

UNIQUE = "0123456789abcdef0123456789abcdef"


def listing(path):
    return sorted(os.listdir(path))


def fill(log, chunk=b"z" * 60_000):
    with pytest.raises(StorageIOError):
        for _ in range(10_000):
            log.append([chunk])
            log.flush()


# -- strays ----------------------------------------------------------------------------------------------------

def test_strays_are_logged_once_and_never_touched(managers, tmp_path, caplog):
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    strays = ["t-²", "t-01", "lost+found", "x-0-delete", "stray.txt", "s-0", "u-0", "__cluster_metadata-0",
              "__consumer_offsets-3"]
    for d in ("t-²", "t-01", "lost+found", "x-0-delete", "__cluster_metadata-0", "__consumer_offsets-3"):
        (data / d).mkdir(parents=True)
        (data / d / "00000000000000000000.log").write_bytes(b"not ours")
    (data / "stray.txt").write_text("stray")
    (data / "u-0").write_text("a file named like a partition")
    os.symlink(outside, data / "s-0")
    before = {n: listing(data / n) if (data / n).is_dir() else (data / n).read_bytes() for n in strays}
    with caplog.at_level(logging.WARNING, logger="logfs.storage.manager"):
        mgr = managers()
    assert mgr.list_topics() == []
    for name in strays:
        assert sum(name in r.getMessage() for r in caplog.records) == 1, name
    mgr.create_topic("t")  # t-0 is free: t-01 and t-² are not partitions of t
    assert mgr.partitions("t") == [0]
    with pytest.raises(InvalidTopicError):
        mgr.create_topic("__cluster_metadata")
    mgr.close()
    managers().close()
    after = {n: listing(data / n) if (data / n).is_dir() else (data / n).read_bytes() for n in strays}
    assert after == before
    assert listing(outside) == ["keep"]


def test_only_logfs_own_delete_dirs_are_purged(managers, tmp_path):
    data = tmp_path / "data"
    for d in ("x-0-delete", f"x-0.{UNIQUE}-delete", f"x-0.{UNIQUE}-delete.bak", "x-delete"):
        (data / d).mkdir(parents=True)
    managers().close()
    assert [n for n in listing(data) if "delete" in n] == ["x-0-delete", f"x-0.{UNIQUE}-delete.bak", "x-delete"]


# -- deletes -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [213, 214, 240, 249])
def test_delete_works_for_every_legal_topic_length(managers, tmp_path, length):
    topic = "x" * length
    mgr = managers(**{"num.partitions": "3"})
    mgr.create_topic(topic)
    mgr.get_log(topic, 2).append([b"data"])
    for p in (0, 1, 2):
        mgr.delete_partition(topic, p)
    deleted = [n for n in os.listdir(tmp_path / "data") if names.is_delete_dir(n)]
    assert len(deleted) == 3 and all(len(n) <= 255 for n in deleted)
    mgr.delete_topic(topic)
    mgr.abandon()  # a crash before the purge: the -delete dirs are purged at the next start
    mgr = managers()
    assert mgr.list_topics() == []
    assert not [n for n in os.listdir(tmp_path / "data") if n.endswith("-delete")]


def test_delete_on_a_full_disk_succeeds_and_stays_deleted(small_tmpfs, managers):
    data = small_tmpfs.path / "data"
    mgr = managers(data, **{"num.partitions": "2", "log.segment.bytes": "1048576"})
    mgr.create_topic("keep")
    mgr.get_log("keep", 0).append([b"kept"])
    mgr.create_topic("big")
    fill(mgr.get_log("big", 1))
    small_tmpfs.top_up()
    for p in (0, 1):
        mgr.delete_partition("big", p)  # (was ENOSPC, with the partitions gone from the listing)
    mgr.delete_topic("big")
    assert mgr.list_topics() == ["keep"]
    mgr.get_log("keep", 0).append([b"y" * 500_000])  # the space came back at once, not after the delete delay
    mgr.close()
    assert os.path.exists(data / names.CLEAN_SHUTDOWN)  # the clean shutdown was complete
    mgr = managers(data)
    assert mgr.list_topics() == ["keep"]
    assert [r.value for r in mgr.get_log("keep", 0).read(0)] == [b"kept", b"y" * 500_000]
    assert not [n for n in os.listdir(data) if n.startswith("big")]
    mgr.close()


def test_delete_when_another_file_fills_the_disk(small_tmpfs, managers):
    data = small_tmpfs.path / "data"
    mgr = managers(data)
    mgr.create_topic("t")
    mgr.get_log("t", 0).append([b"small"])
    small_tmpfs.top_up()
    mgr.delete_partition("t", 0)  # commits at the rename; recording it may fail, and is only logged
    assert mgr.partitions("t") == []
    small_tmpfs.top_up()  # (whatever the purge gave back)
    try:  # the emptied topic: gone whole, or still there whole
        mgr.delete_topic("t")
        expected = []
    except OSError:
        expected = ["t"]
    assert mgr.list_topics() == expected
    mgr.abandon()
    os.unlink(small_tmpfs.path / "filler")
    mgr = managers(data)
    assert ("t", 0) not in mgr.logs  # the partition is gone for good
    assert mgr.list_topics() == expected
    assert not [n for n in os.listdir(data) if n.startswith("t-")]


def test_rmdir_of_a_topic_the_topics_file_names_fails_whole_on_a_full_disk(small_tmpfs, managers):
    data = small_tmpfs.path / "data"
    mgr = managers(data)
    mgr.create_topic("empty", partitions=0)  # known only from the topics file
    small_tmpfs.top_up()
    with pytest.raises(OSError):
        mgr.delete_topic("empty")
    assert mgr.list_topics() == ["empty"]  # unchanged, as on disk
    os.unlink(small_tmpfs.path / "filler")
    mgr.delete_topic("empty")
    mgr.close()
    assert managers(data).list_topics() == []


def test_a_failed_rename_changes_nothing(managers, tmp_path):
    mgr = managers()
    mgr.create_topic("t")
    mgr.get_log("t", 0).append([b"a"])
    data = tmp_path / "data"
    if subprocess.run(["chattr", "+i", str(data)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        with pytest.raises(PermissionError):
            mgr.delete_partition("t", 0)  # an immutable directory: even root cannot rename in it
    finally:
        subprocess.run(["chattr", "-i", str(data)], check=True)
    assert mgr.partitions("t") == [0]
    log = mgr.get_log("t", 0)
    log.append([b"b"])
    assert [r.value for r in log.read(0)] == [b"a", b"b"]


# -- creation ------------------------------------------------------------------------------------------------

def test_colliding_topic_names_are_refused(managers):
    mgr = managers()
    mgr.create_topic("a.b")
    with pytest.raises(InvalidTopicError, match="collides"):
        mgr.create_topic("a_b")
    mgr.create_topic("a-b")  # '-' is not one of the colliding characters
    mgr.close()
    mgr = managers()  # known again from the partition directories
    with pytest.raises(InvalidTopicError):
        mgr.create_topic("a_b")
    mgr.delete_partition("a.b", 0)
    mgr.delete_topic("a.b")
    mgr.create_topic("a_b")
    assert mgr.list_topics() == ["a-b", "a_b"]


def test_holes_in_partition_numbers_can_be_filled(managers, tmp_path):
    (tmp_path / "data" / "y-1").mkdir(parents=True)
    mgr = managers(**{"num.partitions": "3"})
    assert mgr.partitions("y") == [1]
    mgr.create_partition("y", 0)  # (was InvalidPartitionError: only 2 could be added)
    with pytest.raises(InvalidPartitionError):
        mgr.create_partition("y", 1)  # exists
    with pytest.raises(InvalidPartitionError):
        mgr.create_partition("y", 3)  # past the next one
    mgr.create_partition("y", 2)
    assert mgr.partitions("y") == [0, 1, 2]
    mgr.create_topic("t")
    mgr.get_log("t", 0).append([b"old"])
    mgr.delete_partition("t", 0)
    mgr.create_partition("t", 0)  # recreated, empty
    assert mgr.get_log("t", 0).log_end_offset == 0
    mgr.close()
    assert managers().partitions("t") == [0, 1, 2]


def test_partition_numbers_stay_ascending_without_sorting_per_creation(managers, tmp_path):
    """The manager keeps each topic's partition numbers in order as logs come and go (a follower catching up on
    20,000 partitions sorted them twice per creation: quadratic): loaded in any order, holes filled, deletions."""
    for n in (7, 3, 5):
        (tmp_path / "data" / f"y-{n}").mkdir(parents=True)
    mgr = managers()
    assert mgr.partitions("y") == [3, 5, 7]
    assert (mgr.partition_count("y"), mgr.next_partition("y")) == (3, 8)
    for n in (0, 4, 8, 1):
        mgr.create_partition("y", n)
    assert mgr.partitions("y") == [0, 1, 3, 4, 5, 7, 8]
    listed = mgr.partitions("y")
    listed.append(99)  # a copy: the caller cannot change the manager's list
    assert mgr.partitions("y") == [0, 1, 3, 4, 5, 7, 8]
    for n in (8, 0, 4):
        mgr.delete_partition("y", n)
    assert mgr.partitions("y") == [1, 3, 5, 7]
    assert (mgr.partition_count("y"), mgr.next_partition("y")) == (4, 8)
    for n in (1, 3, 5, 7):
        mgr.delete_partition("y", n)
    assert (mgr.partitions("y"), mgr.partition_count("y"), mgr.next_partition("y")) == ([], 0, 0)
    mgr.create_partition("y", 0)
    assert mgr.partitions("y") == [0]
    mgr.delete_partition("y", 0)
    mgr.delete_topic("y")
    with pytest.raises(NoSuchTopicError):
        mgr.next_partition("y")
    with pytest.raises(NoSuchTopicError):
        mgr.partition_count("y")
    mgr.create_topic("z", partitions=5)
    assert (mgr.partitions("z"), mgr.next_partition("z")) == ([0, 1, 2, 3, 4], 5)
    mgr.close()
    assert managers().partitions("z") == [0, 1, 2, 3, 4]


def test_creation_refuses_a_name_a_stray_holds(managers, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(outside, data / "t-1")
    mgr = managers(**{"num.partitions": "3"})
    with pytest.raises(FileExistsError):
        mgr.create_topic("t")
    assert mgr.list_topics() == []
    assert listing(outside) == []  # nothing written through the symlink
    assert os.path.islink(data / "t-1")
    assert not [n for n in os.listdir(data) if n.startswith("t-") and n != "t-1"]  # t-0 rolled back


@pytest.mark.parametrize("value", ["10001", "2147483647"])
def test_num_partitions_is_bounded(value):
    with pytest.raises(InvalidConfigError, match="10000"):
        BrokerConfig.from_properties({"num.partitions": value})
    assert BrokerConfig.from_properties({"num.partitions": "10000"}).get("num.partitions") == 10000


def test_creation_fails_fast_on_emfile_and_undoes_only_what_it_made(tmp_path):
    """A huge creation hits EMFILE; only the partitions made are undone (the rollback used to walk every number
    up to the requested count: 2**31 of them)."""
    script = textwrap.dedent(f"""
        import os, resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from logfs.storage import LogManager
        mgr = LogManager({str(tmp_path / 'data')!r})
        try:
            mgr.create_topic("t", partitions=2**31 - 1)
        except OSError as exc:
            print("failed", exc.errno)
        print(sorted(n for n in os.listdir({str(tmp_path / 'data')!r}) if n.startswith("t-")))
        print(mgr.list_topics())
        mgr.close()
    """)
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split("\n")[:3] == ["failed 24", "[]", "[]"]
    assert time.monotonic() - started < 30


def test_stopping_cuts_a_long_creation_short_and_undoes_it(managers, tmp_path):
    mgr = managers(**{"num.partitions": "10000"})
    outcome = []

    def create():
        try:
            mgr.create_topic("t")
            outcome.append("created")
        except ShuttingDownError:
            outcome.append("stopped")

    worker = threading.Thread(target=create)
    worker.start()
    while not any(n.startswith("t-") for n in os.listdir(tmp_path / "data")):
        time.sleep(0.01)
    mgr.stopping.set()
    worker.join(timeout=20)
    assert not worker.is_alive() and outcome == ["stopped"]
    assert not [n for n in os.listdir(tmp_path / "data") if n.startswith("t-")]
    mgr.close()
    assert managers().list_topics() == []


def test_concurrent_checkpoints_and_delete_records(open_manager):
    """DeleteRecords in several worker threads at once (concurrent ``setfattr``s) and the periodic checkpoint
    write the directory's checkpoint files through one temporary name each: one at a time, or a writer renames
    another's file away (ENOENT, and the directory went offline: seen with DeleteRecords from a thread while
    opens ran)."""
    manager = open_manager({"num.partitions": "4"})
    manager.create_topic("t")
    for p in range(4):
        plog = manager.get_log("t", p)
        for i in range(0, 400, 50):
            data = b"".join(b"r%d\n" % j for j in range(i, i + 50))
            plog.append_lines(b"", data, len(data))
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def deletes(p):
        for start in range(1, 400, 2):
            manager.delete_records("t", p, start)

    def checkpoints():
        for _ in range(300):
            manager.checkpoint()

    threads = [threading.Thread(target=run, args=(lambda p=p: deletes(p),)) for p in range(4)]
    threads.append(threading.Thread(target=run, args=(checkpoints,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not any(d.offline for d in manager.dirs)
    assert all(manager.get_log("t", p).log_start_offset == 399 for p in range(4))

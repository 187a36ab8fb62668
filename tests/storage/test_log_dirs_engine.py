"""The engine's log directories (storage/log_dirs.py, storage/moves.py): parsing, placement, moves, and how a
crash at each point of a move is settled at the next load. The mounted behaviour: tests/e2e/test_log_dirs_mounted.py."""

from __future__ import annotations

import os
import shutil

import pytest

from logfs.storage.errors import InvalidConfigError, LogfsError, PartitionBusyError
from logfs.storage.log_dirs import parse_log_dirs
from logfs.storage.names import future_dir_name, parse_future_dir

LINE = b"a line of the partition that moves\n"


def _dirs(tmp_path, n: int) -> str:
    return ",".join(str(tmp_path / f"d{i}") for i in range(n))


def _fill(plog, n: int = 2000) -> bytes:
    data = LINE * n
    plog.append_lines(b"", data, len(data))
    plog.flush()
    return data


def _read_all(plog) -> bytes:
    out = b""
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        records = plog.read(offset, 1 << 20)
        out += b"".join(r.value + b"\n" for r in records)
        offset = records[-1].offset + 1
    return out


def test_parse_log_dirs(tmp_path):
    assert parse_log_dirs(f"{tmp_path}/a,{tmp_path}/b") == [f"{tmp_path}/a", f"{tmp_path}/b"]
    for bad in (f"{tmp_path}/a,", f"{tmp_path}/a,{tmp_path}/a", f"{tmp_path}/a,{tmp_path}/a/b", ","):
        with pytest.raises(ValueError):
            parse_log_dirs(bad)


def test_future_dir_names():
    name = future_dir_name("orders.v1", 12)
    assert name.endswith("-future") and parse_future_dir(name) == ("orders.v1", 12)
    assert parse_future_dir("orders-12") is None
    with pytest.raises(ValueError):
        future_dir_name("t" * 240, 1)


def test_placement_is_kafkas(open_manager, tmp_path):
    manager = open_manager(data_dir=_dirs(tmp_path, 3), props={"num.partitions": "4"})
    manager.create_topic("t")
    assert [manager.log_dir_of("t", p) for p in range(4)] == [str(tmp_path / f"d{i}") for i in (0, 1, 2, 0)]
    assert [d.partitions for d in manager.dirs] == [2, 1, 1]
    manager.delete_partition("t", 3)
    assert [d.partitions for d in manager.dirs] == [1, 1, 1]


def test_a_move_and_its_refusals(open_manager, tmp_path):
    manager = open_manager(data_dir=_dirs(tmp_path, 2), props={"num.partitions": "1", "log.segment.bytes": "8192"})
    manager.create_topic("t")
    plog = manager.get_log("t", 0)
    data = _fill(plog)
    with pytest.raises(InvalidConfigError):
        manager.move_partition("t", 0, str(tmp_path / "elsewhere"))
    assert manager.move_partition("t", 0, str(tmp_path / "d0")) is False  # already there
    plog.rewrite_lock.acquire()  # (the move waits for it: the cleaner's lock)
    try:
        thread = manager.start_move("t", 0, str(tmp_path / "d1"))
        with pytest.raises(PartitionBusyError):
            manager.start_move("t", 0, str(tmp_path / "d1"))
        assert manager.moving == {("t", 0): str(tmp_path / "d1")}
    finally:
        plog.rewrite_lock.release()
    thread.join(60)
    assert thread.failure is None and not manager.moving
    assert manager.log_dir_of("t", 0) == str(tmp_path / "d1")
    assert plog.directory == str(tmp_path / "d1" / "t-0")
    assert _read_all(plog) == data
    more = _fill(plog, 10)  # appends go to the copy's files
    assert _read_all(plog) == data + more
    assert os.path.getsize(os.path.join(plog.directory, f"{plog.segments.active.base_offset:020d}.log")) == \
        plog.segments.active.size
    manager.close()
    again = open_manager(data_dir=_dirs(tmp_path, 2))
    assert again.log_dir_of("t", 0) == str(tmp_path / "d1")
    assert _read_all(again.get_log("t", 0)) == data + more


@pytest.mark.parametrize("state", ["future-only-copy", "future-beside-live", "delete-and-future"])
def test_a_crash_in_a_move_is_settled_at_load(open_manager, tmp_path, state):
    """The states a crash leaves (storage/moves.py): before the commit point a -future copy beside the live
    partition (removed at load), after it the copy alone (renamed live), the source renamed -delete or gone."""
    dirs = _dirs(tmp_path, 2)
    manager = open_manager(data_dir=dirs, props={"num.partitions": "1"})
    manager.create_topic("t")
    data = _fill(manager.get_log("t", 0))
    manager.close()
    live = tmp_path / "d0" / "t-0"
    future = tmp_path / "d1" / future_dir_name("t", 0)
    shutil.copytree(live, future)
    if state == "future-only-copy":
        shutil.rmtree(live)
    elif state == "delete-and-future":
        live.rename(tmp_path / "d0" / "t-0.0123456789abcdef0123456789abcdef-delete")
    manager = open_manager(data_dir=dirs)
    expected = str(tmp_path / ("d0" if state == "future-beside-live" else "d1"))
    assert manager.log_dir_of("t", 0) == expected
    assert _read_all(manager.get_log("t", 0)) == data
    assert not [n for d in ("d0", "d1") for n in os.listdir(tmp_path / d) if n.endswith(("-future", "-delete"))]


def test_a_partition_live_in_two_directories_is_refused(open_manager, tmp_path):
    dirs = _dirs(tmp_path, 2)
    manager = open_manager(data_dir=dirs, props={"num.partitions": "1"})
    manager.create_topic("t")
    manager.close()
    shutil.copytree(tmp_path / "d0" / "t-0", tmp_path / "d1" / "t-0")
    with pytest.raises(LogfsError, match="in two log directories"):
        open_manager(data_dir=dirs)


def test_a_move_whose_files_cannot_be_switched_takes_the_target_offline(open_manager, tmp_path, monkeypatch):
    """Past the commit point, a descriptor that will not open on the copy (EMFILE: the one error of that step that
    is not the disk's) must not leave the log appending to the source's files, which are purged: the target goes
    offline, and the next load finds the partition whole there. (The failing open is injected: the process's
    descriptor limit cannot be made to run out at exactly that call.)"""
    from logfs.storage import moves
    from logfs.storage.errors import StorageIOError

    dirs = _dirs(tmp_path, 2)
    manager = open_manager(data_dir=dirs, props={"num.partitions": "1", "log.segment.bytes": "8192"})
    manager.create_topic("t")
    plog = manager.get_log("t", 0)
    data = _fill(plog)

    def no_descriptor(attrs, name, path, old_dir, new_dir):
        if attrs.get(name) is not None:
            raise OSError(24, "Too many open files")

    monkeypatch.setattr(moves, "_switch", no_descriptor)
    with pytest.raises(OSError):
        manager.move_partition("t", 0, str(tmp_path / "d1"))
    assert manager.dirs[1].offline and not manager.dirs[0].offline
    assert manager.log_dir_of("t", 0) == str(tmp_path / "d1")  # (the target's now: its partitions answer EIO)
    assert [d.partitions for d in manager.dirs] == [0, 1]
    with pytest.raises(StorageIOError):
        _fill(plog, 1)  # no append reaches the source's files
    manager.close()  # (the clean shutdown of a mount with an offline directory: no error out of it)
    monkeypatch.undo()
    again = open_manager(data_dir=dirs)
    assert again.log_dir_of("t", 0) == str(tmp_path / "d1")
    assert _read_all(again.get_log("t", 0)) == data


@pytest.mark.parametrize("rate, share, busy, want", [
    (10**18, 1.0, 0.01, 0.0),   # unthrottled (Kafka's default): never sleeps
    (10**18, 0.2, 0.01, 0.04),  # a fifth of the time: 10 ms of copying, then 40 ms asleep
    (100e6, 1.0, 0.01, 0.07),   # 8 MB at 100 MB/s take 80 ms: 70 ms asleep after 10 ms of copying
    (100e6, 0.2, 0.01, 0.07),   # both limits: the slower one wins
    (400e6, 0.2, 0.01, 0.04),
])
def test_a_moves_pacing(rate, share, busy, want):
    from logfs.storage.moves import _Throttle

    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    throttle = _Throttle(rate, share, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):  # three chunks of 8 MB, each taking ``busy`` seconds to copy and write back
        now[0] += busy
        throttle.spent(8_000_000, busy)
    assert sum(slept) == pytest.approx(3 * want, abs=1e-9)
    assert (len(slept) == 3) == (want > 0)

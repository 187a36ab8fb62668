"""Opening a partition with recovery (Kafka's LogLoaderTest), through load_log and LogManager."""

import os
import shutil

import pytest

from logfs.storage import LockedError, LogConfig, load_log
from logfs.storage import checkpoints as ckpt
from logfs.storage.format import records as rec
from logfs.storage.local.segment import LogSegment



def segment_files(directory):
    return sorted(n for n in os.listdir(directory) if n[:20].isdigit())

SMALL = dict(segment_bytes=2048, index_interval_bytes=128)
BROKER = {"log.segment.bytes": "2048", "log.index.interval.bytes": "128"}


def values(n, start=0):
    return [f"value-{i:06d}".encode() for i in range(start, start + n)]


def read_values(log):
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        got = log.read(offset)
        out += [r.value for r in got]
        offset = got[-1].offset + 1
    return out


@pytest.fixture
def recover_calls(monkeypatch):
    """Base offsets of the segments LogSegment.recover() runs on (a spy; the real method still runs)."""
    calls = []
    original = LogSegment.recover

    def spy(self, *args, **kwargs):
        calls.append(self.base_offset)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LogSegment, "recover", spy)
    return calls


@pytest.fixture
def managers(open_manager):
    """open_manager(data_dir=None, **props) over the shared factory, with the small segments of BROKER."""

    def open(data_dir=None, **props):
        return open_manager({**BROKER, **props}, data_dir=data_dir)

    return open


def flushed_log(managers, n):
    """A new manager with topic t, whose partition 0 holds ``n`` values, flushed and checkpointed: (manager, log)."""
    mgr = managers()
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    log.append(values(n))
    log.flush()
    mgr.checkpoint()
    return mgr, log


def build_closed_log(open_log, n=200):
    log = open_log(LogConfig.for_tests(**SMALL))
    for i in range(0, n, 4):
        log.append(values(4, i))
    segs = [(s.base_offset, s.next_offset) for s in log.segments]
    log.close()
    assert len(segs) > 3
    return log.directory, segs


# -- indexes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["garbage", "missing", "truncated", "past_end"])
def test_corrupt_or_missing_index_is_rebuilt(open_log, recover_calls, damage):
    directory, segs = build_closed_log(open_log)
    victim = segs[1][0]
    stem = os.path.join(directory, f"{victim:020d}")
    original = open(stem + ".index", "rb").read()
    assert len(original) >= 16
    if damage == "garbage":
        with open(stem + ".index", "wb") as f:
            f.write(b"\xff" * 8 + b"\x00\x00\x00\x01\x00\x00\x00\x01" * 3)  # negative, then repeated
    elif damage == "missing":
        os.unlink(stem + ".index")
        os.unlink(stem + ".timeindex")
    elif damage == "truncated":
        with open(stem + ".timeindex", "wb"):
            pass
        os.unlink(stem + ".index")
    else:
        with open(stem + ".index", "r+b") as f:
            f.seek(len(original) - 4)
            f.write((10**6).to_bytes(4, "big"))  # a position past the end of the log
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert recover_calls == [victim]
    assert read_values(log) == values(200)
    seg = log.segments.floor(victim)
    seg.offset_index.sanity_check(seg.size)
    assert seg.offset_index.entries == len(original) // 8
    assert [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)] == [
        (int.from_bytes(original[i:i + 4], "big"), int.from_bytes(original[i + 4:i + 8], "big"))
        for i in range(0, len(original), 8)]
    for offset in range(victim, segs[1][1]):
        assert log.read(offset, max_bytes=1)[0].offset == offset
    log.close()
    # The rebuilt indexes were written trimmed and survive the next clean open without recovery.
    assert os.path.getsize(stem + ".index") == len(original)
    recover_calls.clear()
    again = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert recover_calls == [] and read_values(again) == values(200)


def test_missing_view_index_is_rebuilt_from_the_log(open_log, recover_calls):
    directory, segs = build_closed_log(open_log)
    os.unlink(os.path.join(directory, f"{segs[2][0]:020d}.viewindex"))
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    seg = log.segments.floor(segs[2][0])
    assert seg.next_offset == segs[2][1]
    assert seg.stats.records == segs[2][1] - segs[2][0]
    assert seg.view_index.last().position == seg.size  # its end entry is back
    assert read_values(log) == values(200)


def test_clean_shutdown_uses_indexes_without_recovery(open_log, recover_calls):
    directory, segs = build_closed_log(open_log)
    # Flip a byte inside a record of a sealed segment: only a CRC check (recovery) would notice.
    path = os.path.join(directory, f"{segs[1][0]:020d}.log")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        positions = [pos for pos, _ in rec.iter_headers(f.read())]
    assert len(positions) > 6
    flip = positions[5] + 70  # inside the records of the sixth batch
    with open(path, "r+b") as f:
        f.seek(flip)
        b = f.read(1)
        f.seek(flip)
        f.write(bytes([b[0] ^ 1]))
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert recover_calls == []
    assert os.path.getsize(path) == size  # not validated, not truncated
    assert [(s.base_offset, s.next_offset) for s in log.segments] == segs
    assert log.recovery_point == log.log_end_offset == 200
    log.close_without_flush()
    # The same directory after an unclean shutdown is validated from the recovery point and truncated.
    recover_calls.clear()
    log = open_log(LogConfig.for_tests(**SMALL), recovery_point=0)
    assert recover_calls == [s for s, _ in segs[:2]]
    assert os.path.getsize(path) == positions[5]
    assert segs[1][0] < log.log_end_offset < segs[1][1]
    assert len(log.segments) == 2  # everything after the invalid byte is gone
    assert segment_files(directory) == sorted(
        f"{s:020d}{x}" for s, _ in segs[:2] for x in (".log", ".index", ".timeindex", ".viewindex"))
    # The truncated segment is the active one now, and appends continue right after its valid prefix.
    end = log.log_end_offset
    assert log.active_segment.base_offset == segs[1][0] and log.active_segment.active
    for i in range(30):
        log.append(values(4, end + 4 * i))
    got = log.read(segs[1][0], max_records=10**6)
    assert [r.offset for r in got] == list(range(segs[1][0], end + 120))
    assert [r.value for r in got[-120:]] == values(120, end)


def test_unclean_recovery_starts_at_the_segment_holding_the_recovery_point(open_log, recover_calls):
    directory, segs = build_closed_log(open_log)
    rp = segs[2][0] + 3
    log = open_log(LogConfig.for_tests(**SMALL), recovery_point=rp)
    assert recover_calls == [s for s, _ in segs[2:]]
    assert log.recovery_point == 200  # validated and fsynced, so durable
    assert read_values(log) == values(200)


def test_garbage_after_unclean_shutdown_is_truncated(managers):
    mgr = managers()
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    log.append(values(150))
    log.flush(up_to=100)
    mgr.checkpoint()
    active = log.active_segment.log_path
    size = os.path.getsize(active)
    mgr.abandon()
    with open(active, "ab") as f:
        f.write(rec.build_batch(150, 0, [b"torn"])[:-3])
    with open(active, "ab") as f:
        f.write(os.urandom(300))
    mgr = managers()
    log = mgr.get_log("t", 0)
    assert os.path.getsize(active) == size
    assert log.log_end_offset == 150
    assert read_values(log) == values(150)
    log.append([b"after"])
    assert log.read(150)[0].value == b"after"


@pytest.mark.parametrize("new_segment_has_records", [False, True])
def test_a_roll_whose_predecessor_lost_its_tail_skips_no_offset(managers, new_segment_has_records):
    """A power cut after a roll: the new segment's name reached the disk, the old segment's last records did not
    (found by tests/reliability/test_rel_powercut.py). An empty segment past the gap goes, and the log goes on
    from the recovered end; one with records is kept (it holds what was written, and its offsets are its own)."""
    mgr, log = flushed_log(managers, 100)
    first_unflushed = len(log.segments)
    while len(log.segments) < first_unflushed + 2:
        log.append(values(10, 100))  # unflushed; rolls twice
    segments = [(s.base_offset, s.log_path) for s in log.segments]
    mgr.abandon()
    last_base, last_path = segments[-1]
    prev_base, prev_path = segments[-2]
    open(last_path, "wb").close()  # the newest segment's records were lost, its name was not
    with open(prev_path, "r+b") as f:  # and the old segment's tail: cut back to its first batch
        first = rec.parse_header(f.read(61))
        f.truncate(first.size)
    if new_segment_has_records:
        with open(last_path, "ab") as f:
            f.write(rec.build_batch(last_base, 0, [b"kept past the gap"]))
    mgr = managers()
    log = mgr.get_log("t", 0)
    names = segment_files(os.path.dirname(last_path))
    if new_segment_has_records:
        assert os.path.basename(last_path) in names
        assert log.log_end_offset == last_base + 1
    else:
        assert os.path.basename(last_path) not in names
        assert log.log_end_offset == log.active_segment.next_offset
        assert log.active_segment.base_offset == prev_base
        end = log.log_end_offset
        log.append([b"after the cut"])
        assert log.read(end)[0].offset == end  # no offset skipped
        assert log.read(end)[0].value == b"after the cut"


def test_crash_image_with_preallocated_indexes_recovers(managers, tmp_path):
    """A copy of the directory taken while it is open, as a crash would leave it (indexes preallocated,
    no clean-shutdown marker, checkpoints stale)."""
    mgr = managers()
    mgr.create_topic("t", partitions=2)
    for p in (0, 1):
        mgr.get_log("t", p).append(values(120 + p))
    mgr.flush_all()
    mgr.checkpoint()
    mgr.get_log("t", 0).append(values(30, 120))  # unflushed, after the checkpoint
    image = tmp_path / "image"
    shutil.copytree(tmp_path / "data", image)
    active = mgr.get_log("t", 0).active_segment
    assert os.path.getsize(image / "t-0" / os.path.basename(active.offset_index.path)) == 10485760
    mgr2 = managers(image)
    assert mgr2.had_clean_shutdown is False
    assert read_values(mgr2.get_log("t", 0)) == values(150)
    assert read_values(mgr2.get_log("t", 1)) == values(121)
    mgr2.get_log("t", 0).append([b"more"])
    mgr2.close()
    mgr3 = managers(image)
    assert mgr3.had_clean_shutdown
    assert read_values(mgr3.get_log("t", 0)) == values(150) + [b"more"]


# -- leftovers of deletion and compaction --------------------------------------------------------------

def test_deleted_and_cleaned_files_removed_on_open(open_log):
    directory, segs = build_closed_log(open_log)
    stray = [f"{segs[0][0]:020d}.log.deleted", f"{segs[0][0]:020d}.index.deleted",
             f"{10**6:020d}.log.cleaned", f"{10**6:020d}.timeindex.cleaned", f"{segs[1][0]:020d}.log.cleaned"]
    for name in stray:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(b"junk")
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    names = os.listdir(directory)
    assert not any(n.endswith((".deleted", ".cleaned")) for n in names)
    assert read_values(log) == values(200)


def test_deleted_segments_are_gone_after_restart(open_log, clock):
    log = open_log(LogConfig.for_tests(file_delete_delay_ms=10**9, **SMALL))
    log.append(values(200))
    victims = log.segments.as_list()[:2]
    log.delete_segments(victims)
    start = log.log_start_offset
    log.close_without_flush()  # crash before the delay passed
    assert any(n.endswith(".deleted") for n in os.listdir(log.directory))
    log = open_log(LogConfig.for_tests(**SMALL), log_start_offset=start)
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))
    assert log.log_start_offset == start == log.segments.first.base_offset


def test_swap_is_completed(open_log, recover_calls):
    directory, segs = build_closed_log(open_log)
    # A compacted replacement for the first two segments, as the cleaner would leave it mid-swap: kept
    # records are every third one of [0, segs[1].next), in one file named after the first segment.
    end = segs[1][1]
    kept = list(range(0, end, 3))
    batch = b"".join(
        rec.build_batch(o, 1000 + o, [f"value-{o:06d}".encode()]) for o in kept)
    stem = os.path.join(directory, f"{0:020d}")
    with open(stem + ".log.swap", "wb") as f:
        f.write(batch)
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    names = os.listdir(directory)
    assert not any(n.endswith(".swap") for n in names)
    assert f"{segs[1][0]:020d}.log" not in names
    assert [s.base_offset for s in log.segments] == [0] + [s for s, _ in segs[2:]]
    got = log.read(0, max_records=1000)
    assert [r.offset for r in got[: len(kept)]] == kept
    assert [r.offset for r in got[len(kept):]] == list(range(end, got[-1].offset + 1))
    assert log.read(1)[0].offset == 3  # a read in a compacted gap starts at the next retained record
    assert log.log_end_offset == 200


def test_swap_indexes_without_their_log_are_renamed_live(open_log):
    directory, segs = build_closed_log(open_log)
    stem = os.path.join(directory, f"{segs[1][0]:020d}")
    os.rename(stem + ".index", stem + ".index.swap")  # crash between renaming the .log and its index
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert not any(n.endswith(".swap") for n in os.listdir(directory))
    seg = log.segments.floor(segs[1][0])
    assert os.path.exists(stem + ".index") and seg.offset_index.entries > 0  # renamed live or rebuilt
    seg.offset_index.sanity_check(seg.size)
    for offset in range(*segs[1]):
        assert log.read(offset, max_bytes=1)[0].offset == offset
    assert read_values(log) == values(200)


def test_orphan_indexes_removed(open_log):
    directory, segs = build_closed_log(open_log)
    orphans = [f"{10**7:020d}.index", f"{10**7:020d}.timeindex", f"{10**7:020d}.viewindex"]
    for name in orphans:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(b"\x00" * 24)
    os.unlink(os.path.join(directory, f"{segs[-1][0]:020d}.log"))  # the active segment's log is lost
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    names = os.listdir(directory)
    for name in orphans:
        assert name not in names
    assert not any(n.startswith(f"{segs[-1][0]:020d}") for n in names)
    assert log.log_end_offset == segs[-2][1]
    log.append([b"x"])  # the last remaining segment is active again
    assert log.read(segs[-2][1])[0].value == b"x"


def test_foreign_segment_without_indexes_is_loaded(tmp_path, open_log, recover_calls):
    directory = tmp_path / "t-0"
    directory.mkdir()
    offset = 0
    for base in (0, 40):
        data = b"".join(rec.build_batch(base + i * 4, 777, values(4, base + i * 4)) for i in range(10))
        (directory / f"{base:020d}.log").write_bytes(data)
    log = open_log(LogConfig.for_tests(**SMALL), had_clean_shutdown=True)
    assert recover_calls == [0, 40]
    assert read_values(log) == values(80)
    assert log.offset_for_timestamp(777) == 0
    assert sorted(os.listdir(directory)) == sorted(
        f"{b:020d}{x}" for b in (0, 40) for x in (".log", ".index", ".timeindex", ".viewindex"))


# -- manager: checkpoints, marker, lock ----------------------------------------------------------------

def read_text(path):
    with open(path) as f:
        return f.read()


def test_checkpoint_format_and_recovery_point_only_after_flush(managers, tmp_path):
    mgr = managers()
    mgr.create_topic("orders", partitions=2)
    mgr.create_topic("a.b_c-d")
    mgr.get_log("orders", 0).append(values(7))
    mgr.get_log("orders", 1).append(values(3))
    mgr.get_log("a.b_c-d", 0).append(values(2))
    mgr.checkpoint()
    data = tmp_path / "data"
    assert read_text(data / ckpt.RECOVERY_POINT) == "0\n3\na.b_c-d 0 0\norders 0 0\norders 1 0\n"
    assert read_text(data / ckpt.LOG_START_OFFSET) == "0\n3\na.b_c-d 0 0\norders 0 0\norders 1 0\n"
    mgr.get_log("orders", 0).flush()
    mgr.checkpoint()
    assert read_text(data / ckpt.RECOVERY_POINT) == "0\n3\na.b_c-d 0 0\norders 0 7\norders 1 0\n"
    mgr.flush_all()
    mgr.get_log("orders", 1).increment_log_start_offset(2)
    mgr.checkpoint()
    assert read_text(data / ckpt.RECOVERY_POINT) == "0\n3\na.b_c-d 0 2\norders 0 7\norders 1 3\n"
    assert read_text(data / ckpt.LOG_START_OFFSET) == "0\n3\na.b_c-d 0 0\norders 0 0\norders 1 2\n"
    assert not any(n.endswith(".tmp") for n in os.listdir(data))
    mgr.close()
    assert os.path.exists(data / ckpt.CLEAN_SHUTDOWN)
    mgr = managers()
    assert mgr.had_clean_shutdown
    assert not os.path.exists(data / ckpt.CLEAN_SHUTDOWN)  # a crash from here on is unclean
    assert mgr.get_log("orders", 1).log_start_offset == 2
    assert ckpt.read_checkpoint(str(data / ckpt.RECOVERY_POINT)) == {
        ("a.b_c-d", 0): 2, ("orders", 0): 7, ("orders", 1): 3}


def test_recovery_point_not_advanced_before_flush_across_a_crash(managers, recover_calls):
    mgr, log = flushed_log(managers, 100)
    log.append(values(100, 100))
    bases = [s.base_offset for s in log.segments]
    assert log.recovery_point == 100
    mgr.checkpoint()
    mgr.abandon()
    mgr = managers()
    rp_floor = max(b for b in bases if b <= 100)
    log = mgr.get_log("t", 0)
    assert recover_calls and recover_calls[0] == rp_floor  # recovery starts at the checkpointed point
    assert all(b >= rp_floor for b in recover_calls)
    assert read_values(log) == values(200)


def test_checkpoints_keep_the_entries_of_partitions_logfs_leaves_alone(managers, tmp_path):
    """A broker's log directory: its checkpoint files name Kafka's internal partitions too, which logfs never
    serves. Every checkpoint logfs writes (periodic, the cleaner's, at shutdown) keeps their entries as they were,
    so the broker given the directory again finds its own (Kafka's LogManager reads a missing entry as 0: the log
    start, recovery from the first segment, compaction from the start). A partition that is gone loses its entry,
    as in Kafka."""
    data = tmp_path / "data"
    for name in ("__consumer_offsets-0", "__transaction_state-0", "__cluster_metadata-0", "kept-0"):
        (data / name).mkdir(parents=True)
        (data / name / "00000000000000000000.log").write_bytes(rec.build_batch(0, 1, values(3)))
    ckpt.write_checkpoint(str(data / ckpt.RECOVERY_POINT), {
        ("__consumer_offsets", 0): 3, ("__transaction_state", 0): 2, ("kept", 0): 3, ("gone", 0): 9})
    ckpt.write_checkpoint(str(data / ckpt.LOG_START_OFFSET), {("__consumer_offsets", 0): 1, ("gone", 0): 4})
    ckpt.write_checkpoint(str(data / ckpt.CLEANER_OFFSET), {("__consumer_offsets", 0): 2, ("gone", 0): 4})
    (data / ckpt.CLEAN_SHUTDOWN).write_bytes(b"")
    mgr = managers()
    mgr.create_topic("t")
    mgr.get_log("t", 0).append(values(5))
    mgr.flush_all()
    mgr.checkpoint()
    mgr.update_cleaner_checkpoint("t", 0, 5)
    internal = {("__consumer_offsets", 0): 3, ("__transaction_state", 0): 2}
    for _ in range(2):  # the periodic checkpoint, then the clean shutdown's
        assert ckpt.read_checkpoint(str(data / ckpt.RECOVERY_POINT)) == {**internal, ("kept", 0): 3, ("t", 0): 5}
        assert ckpt.read_checkpoint(str(data / ckpt.LOG_START_OFFSET)) == {
            ("__consumer_offsets", 0): 1, ("kept", 0): 0, ("t", 0): 0}
        assert ckpt.read_checkpoint(str(data / ckpt.CLEANER_OFFSET)) == {("__consumer_offsets", 0): 2, ("t", 0): 5}
        mgr.close()
    # And again after a mount that found them in the files logfs wrote.
    mgr = managers()
    mgr.close()
    assert ckpt.read_checkpoint(str(data / ckpt.RECOVERY_POINT)) == {**internal, ("kept", 0): 3, ("t", 0): 5}
    assert ckpt.read_checkpoint(str(data / ckpt.CLEANER_OFFSET)) == {("__consumer_offsets", 0): 2, ("t", 0): 5}


def test_a_brokers_clean_shutdown_marker_is_written_back_as_it_was(managers, tmp_path):
    """Kafka's ``.kafka_cleanshutdown`` holds the broker's epoch (``CleanShutdownFileHandler``), which the broker
    sends the controller when it registers again: without it the controller takes the restart for an unclean
    shutdown (``handleBrokerUncleanShutdown``: the broker leaves its partitions' eligible leader replicas). A clean
    unmount writes back what a clean mount found; after an unclean one there is nothing to write back."""
    data = tmp_path / "data"
    data.mkdir()
    kafkas = b'{"version":0,"brokerEpoch":174}'
    (data / ckpt.CLEAN_SHUTDOWN).write_bytes(kafkas)
    mgr = managers()
    assert mgr.had_clean_shutdown and not (data / ckpt.CLEAN_SHUTDOWN).exists()
    mgr.close()
    assert (data / ckpt.CLEAN_SHUTDOWN).read_bytes() == kafkas
    managers().close()  # (again: still the broker's)
    assert (data / ckpt.CLEAN_SHUTDOWN).read_bytes() == kafkas
    managers().abandon()  # a crash: the next clean shutdown is logfs's own
    mgr = managers()
    assert not mgr.had_clean_shutdown
    mgr.close()
    assert (data / ckpt.CLEAN_SHUTDOWN).read_bytes() == b""


def test_checkpoint_write_is_atomic(tmp_path):
    path = str(tmp_path / ckpt.RECOVERY_POINT)
    ckpt.write_checkpoint(path, {("t", 0): 5})
    inode = os.stat(path).st_ino
    ckpt.write_checkpoint(path, {("t", 0): 6, ("t", 1): 1})
    assert os.stat(path).st_ino != inode  # replaced by rename, never rewritten in place
    assert ckpt.read_checkpoint(path) == {("t", 0): 6, ("t", 1): 1}
    os.mkdir(path + ".tmp")  # the temporary file cannot be written: the old file stays whole
    with pytest.raises(OSError):
        ckpt.write_checkpoint(path, {("t", 0): 7})
    assert ckpt.read_checkpoint(path) == {("t", 0): 6, ("t", 1): 1}


@pytest.mark.parametrize("text", [
    "", "garbage", "0\n", "0\n2\nt 0 5\n", "1\n1\nt 0 5\n", "0\nx\n", "0\n1\nt zero 5\n", "0\n1\nt 0\n",
    "\xff\xfe",
])
def test_read_checkpoint_tolerates_corruption(tmp_path, text):
    path = tmp_path / "cp"
    path.write_bytes(text.encode("latin-1"))
    assert ckpt.read_checkpoint(str(path)) == {}
    assert ckpt.read_checkpoint(str(tmp_path / "missing")) == {}


def test_corrupt_checkpoints_tolerated_on_open(managers, tmp_path, recover_calls):
    mgr = managers()
    mgr.create_topic("t")
    mgr.get_log("t", 0).append(values(200))
    mgr.get_log("t", 0).increment_log_start_offset(5)
    mgr.close()
    data = tmp_path / "data"
    (data / ckpt.RECOVERY_POINT).write_bytes(b"\x00\x01garbage")
    (data / ckpt.LOG_START_OFFSET).write_text("0\n7\n")
    os.unlink(data / ckpt.CLEAN_SHUTDOWN)
    mgr = managers()
    log = mgr.get_log("t", 0)
    assert recover_calls[0] == 0  # no usable recovery point: recover everything
    assert log.log_start_offset == 0  # the start offset checkpoint is lost: the first segment's base
    assert read_values(log) == values(200)


def test_stale_checkpoints_are_clamped(managers, tmp_path):
    mgr = managers()
    mgr.create_topic("t")
    mgr.get_log("t", 0).append(values(50))
    mgr.close()
    data = tmp_path / "data"
    # Offsets past the log end, and a partition that no longer exists.
    ckpt.write_checkpoint(str(data / ckpt.RECOVERY_POINT), {("t", 0): 10**6, ("gone", 3): 9})
    ckpt.write_checkpoint(str(data / ckpt.LOG_START_OFFSET), {("t", 0): 10**6, ("gone", 3): 9})
    mgr = managers()
    log = mgr.get_log("t", 0)
    assert log.log_end_offset == 50
    assert log.log_start_offset <= log.log_end_offset and log.recovery_point <= log.log_end_offset
    assert mgr.list_topics() == ["t"]
    mgr.close()
    os.unlink(data / ckpt.CLEAN_SHUTDOWN)
    ckpt.write_checkpoint(str(data / ckpt.RECOVERY_POINT), {("t", 0): 10**6})
    mgr = managers()
    log = mgr.get_log("t", 0)
    assert log.log_end_offset == 50 and log.recovery_point == 50


def test_log_start_offset_in_the_middle_of_a_segment_survives_restart(managers):
    mgr = managers()
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    log.append(values(100))
    log.increment_log_start_offset(37)
    mgr.close()
    mgr = managers()
    log = mgr.get_log("t", 0)
    assert log.log_start_offset == 37
    assert log.read(37)[0].value == values(1, 37)[0]


def test_second_manager_on_the_same_directory_is_locked_out(managers, tmp_path):
    mgr = managers()
    mgr.create_topic("t")
    with pytest.raises(LockedError):
        managers()
    assert os.path.exists(tmp_path / "data" / ".lock")
    mgr.close()
    again = managers()  # released on close
    assert again.list_topics() == ["t"]
    again.abandon()
    managers().close()  # and released by a crash-like abandon too


def test_delete_dirs_removed_on_open(managers, tmp_path):
    mgr = managers()
    mgr.create_topic("t", partitions=2)
    mgr.get_log("t", 1).append(values(3))
    mgr.delete_partition("t", 1)
    assert any(n.endswith("-delete") for n in os.listdir(tmp_path / "data"))
    mgr.abandon()
    mgr = managers()
    assert not any(n.endswith("-delete") for n in os.listdir(tmp_path / "data"))
    assert mgr.partitions("t") == [0]


def test_lowering_segment_index_bytes_keeps_the_active_segment_readable(managers):
    mgr = managers(**{"log.index.interval.bytes": "0", "log.segment.bytes": "1000000"})
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    for i in range(100):
        log.append(values(1, i))
    assert log.active_segment.offset_index.entries > 50 and len(log.segments) == 1
    mgr.set_topic_config("t", "segment.index.bytes", "120")  # room for 15 entries
    mgr.close()
    mgr = managers(**{"log.index.interval.bytes": "0", "log.segment.bytes": "1000000"})
    log = mgr.get_log("t", 0)
    assert read_values(log) == values(100)
    for offset in range(100):
        assert log.read(offset, max_bytes=1)[0].offset == offset
    log.append([b"next"])  # the over-full index makes the segment roll
    assert len(log.segments) == 2 and log.read(100)[0].value == b"next"


def test_clean_shutdown_marker_skips_recovery_through_the_manager(managers, tmp_path, recover_calls):
    mgr = managers()
    mgr.create_topic("t", partitions=2)
    for p in (0, 1):
        for i in range(0, 120, 4):
            mgr.get_log("t", p).append(values(4, i))
    mgr.close()
    assert os.path.exists(tmp_path / "data" / ckpt.CLEAN_SHUTDOWN)
    mgr = managers()
    assert recover_calls == []  # indexes trusted, nothing validated
    assert read_values(mgr.get_log("t", 1)) == values(120)
    mgr.get_log("t", 1).append([b"x"])  # unflushed, and no marker any more
    mgr.abandon()
    mgr = managers()
    assert recover_calls  # the unclean restart validates from the recovery points
    assert read_values(mgr.get_log("t", 1)) == values(120) + [b"x"]


def test_recovery_reads_only_the_unflushed_tail_of_a_large_segment(managers, monkeypatch):
    """After a crash, the segment holding the recovery point is validated from its last flushed index entry,
    not from its start: a byte flipped in flushed data (which recovery trusts, as Kafka does) is not reached,
    while the unflushed tail is validated and a torn last batch is cut."""
    mgr = managers(**{"log.segment.bytes": str(1 << 30)})
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    for i in range(50):
        log.append(values(100, i * 100))
    log.flush()
    flushed_size = log.active_segment.size
    mgr.checkpoint()
    log.append(values(10, 5000))
    path = log.active_segment.log_path
    mgr.abandon()
    with open(path, "r+b") as f:  # a flipped byte in the first (flushed) batch's payload
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x13\x88\x00\x00\x01")  # a torn batch header after the tail
    reads = []
    original = LogSegment.read

    def counting(self, position, length):
        reads.append(length)
        return original(self, position, length)

    monkeypatch.setattr(LogSegment, "read", counting)
    mgr = managers(**{"log.segment.bytes": str(1 << 30)})
    log = mgr.get_log("t", 0)
    assert log.log_end_offset == 5010  # the unflushed tail survived, the torn bytes are gone
    assert sum(reads) < flushed_size // 10  # nowhere near a scan of the segment
    assert [r.value for r in log.read(5000, max_records=10)] == values(10, 5000)


@pytest.mark.parametrize("roll", [False, True])
@pytest.mark.parametrize("clean", [False, True])
def test_last_append_time_survives_restart(managers, clock, roll, clean):
    """st_mtime's source: after a restart (clean, or a crash), the newest record's timestamp, also when a roll
    left the active segment empty; never the restart time."""
    mgr = managers()
    mgr.create_topic("t")
    log = mgr.get_log("t", 0)
    for i in range(3):
        clock.advance(7)
        log.append(values(2, 2 * i))
    appended = clock.time_ms()
    if roll:
        clock.advance(1000)
        log.roll()
    mgr.close() if clean else mgr.abandon()
    clock.advance(3_600_000)
    assert managers().get_log("t", 0).last_append_ms == appended


def test_empty_partition_time_is_stable_across_restart(managers, clock):
    mgr = managers()
    mgr.create_topic("t")
    created = mgr.get_log("t", 0).last_append_ms
    mgr.abandon()
    clock.advance(3_600_000)
    assert managers().get_log("t", 0).last_append_ms == created

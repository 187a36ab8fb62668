"""Tiered storage through power cuts, at the engine level (directory store, no mount): crash images of DATA_DIR
in which the tiered state's local files lost what a power cut would take, and a rolled segment whose last,
unflushed batch was lost.

A crash image is a copy of DATA_DIR taken while the daemon's LogManager is open (no clean shutdown), then damaged
the way lost unsynced writes would damage it, and loaded by a new manager (the daemon's restart). LazyFS runs of
the whole daemon (tests/reliability/test_rel_powercut_lazyfs.py, by hand) confirm the same at the syscall level.
"""

from __future__ import annotations

import os
import shutil

import pytest

from logfs.remote import DirectoryStore
from logfs.remote.manifest import ManifestStore
from logfs.spark.bucket import BucketPartitionReader, TieredPartitionReader
from logfs.spark.segments import PartitionReader, TopicPartition
from logfs.storage import BrokerConfig, LogManager
from logfs.storage.format import records as rec
from logfs.storage.names import REMOTE_CACHE_DIR
from logfs.storage.tiered.remote_segment import RemoteLogSegment, index_paths
from logfs.storage.tiered.manager import LOCAL_MANIFEST, RemoteLogManager, tier_stats
from logfs.view.text import live_view
from tiered_helpers import view_text

PROPS = {"log.segment.bytes": "4096", "log.index.interval.bytes": "512", "log.segment.delete.delay.ms": "0",
         "remote.log.storage.system.enable": "true"}


def lines(start, n):
    return b"".join(b"record-%06d-%s\n" % (i, b"y" * (i % 29)) for i in range(start, start + n))


def open_manager(data_dir, archive, clock, *, attach=True, reachable=False):
    props = dict(PROPS, **{"logfs.remote.dir": str(archive)})
    manager = LogManager(str(data_dir), BrokerConfig.from_properties(props), clock=clock)
    rlm = RemoteLogManager(manager.data_dir, manager.logs, DirectoryStore(archive), cache_bytes=1 << 20)
    manager.attach_tiering(rlm)
    if attach:
        rlm.attach_cached(store_reachable=True) if reachable else rlm.attach_cached()
    return manager, rlm


def offsets_of(data: bytes) -> list[int]:
    return [int(line.split(b"-")[1]) for line in data.splitlines()]


def crash_image(manager, dst):
    """DATA_DIR as a power cut finds it while ``manager`` is open: no clean-shutdown marker; the files' unsynced
    writes are damaged by the caller."""
    shutil.copytree(manager.data_dir, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.fixture
def tiered(tmp_path, clock):
    """A tiered partition with segments uploaded and deleted locally, more local ones, and the manager still
    open (a crash image is taken from it). Returns (manager, rlm, plog, text appended, archive)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    manager, rlm = open_manager(tmp_path / "data", archive, clock)
    manager.create_topic("t", 1)
    manager.set_topic_config("t", "remote.storage.enable", "true")
    manager.set_topic_config("t", "local.retention.bytes", "8192")
    plog = manager.get_log("t", 0)
    data = lines(0, 2000)
    plog.append_lines(b"", data, len(data))
    plog.roll()
    assert rlm.sync(plog, clock.time_ms()) >= 8
    assert plog.segments.first.base_offset > 0  # tiered segments are gone locally
    more = lines(2000, 100)
    plog.append_lines(b"", more, len(more))
    plog.flush()
    manager.checkpoint()
    yield manager, rlm, plog, data + more, archive
    manager.close()


def _reload(image, archive, clock, **kw):
    manager, rlm = open_manager(image, archive, clock, **kw)
    return manager, rlm, manager.get_log("t", 0)


@pytest.mark.parametrize("damage", ["empty", "truncated", "zeroed", "missing"])
def test_a_damaged_manifest_copy_is_never_used_and_the_store_restores_the_whole_log(tiered, tmp_path, clock,
                                                                                      damage):
    manager, _, _, appended, archive = tiered
    image = crash_image(manager, tmp_path / "image")
    path = image / "t-0" / REMOTE_CACHE_DIR / LOCAL_MANIFEST
    size = path.stat().st_size
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: size // 2])
    elif damage == "zeroed":
        path.write_bytes(b"\0" * size)
    else:
        path.unlink()
    # The store answered the check at mount: the state is read from it before the mount serves anything.
    m2, rlm2, plog2 = _reload(image, archive, clock, reachable=True)
    try:
        assert plog2.log_start_offset == 0
        assert view_text(plog2) == appended
        assert ManifestStore(DirectoryStore(archive)).read("t", 0).remote_log_end_offset == \
            tier_stats(plog2)["remote_log_end_offset"] > 0
        # ... and the copy was rewritten (durably) from it.
        assert path.stat().st_size == size
    finally:
        m2.close()


def test_with_the_store_down_a_damaged_copy_waits_for_the_first_pass(tiered, tmp_path, clock, caplog):
    manager, _, _, appended, archive = tiered
    image = crash_image(manager, tmp_path / "image")
    (image / "t-0" / REMOTE_CACHE_DIR / LOCAL_MANIFEST).write_bytes(b'{"format": "logfs-remote')
    m2, rlm2, plog2 = _reload(image, archive, clock, reachable=False)
    try:
        assert "local tiered state unusable" in caplog.text  # said loudly, never silently
        rlm2.sync(plog2, clock.time_ms())  # the store answers: the whole log, from offset 0
        assert plog2.log_start_offset == 0 and view_text(plog2) == appended
    finally:
        m2.close()


@pytest.mark.parametrize("ext", ["index", "timeindex", "viewindex"])
@pytest.mark.parametrize("damage", ["empty", "zeroed"])
def test_damaged_index_copies_are_fetched_again(tiered, tmp_path, clock, ext, damage):
    manager, _, plog, appended, archive = tiered
    first = plog.remote_segments[0]
    image = crash_image(manager, tmp_path / "image")
    path = index_paths(str(image / "t-0" / REMOTE_CACHE_DIR), first.base_offset)[ext]
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(b"" if damage == "empty" else b"\0" * size)
    # The store is down at mount (no fetch): a copy of the wrong size, or a view index without its end entry,
    # is caught at once; a zeroed offset or time index is caught on first use. Never used either way.
    m2, rlm2, plog2 = _reload(image, archive, clock, reachable=False)
    try:
        published = bool(plog2.remote_segments)
        if published:
            try:
                text = view_text(plog2)
                assert text == appended  # (a zeroed time index is not read by the view)
            except Exception as exc:
                assert "failed" in str(exc) or "corrupt" in str(exc)
        rlm2.sync(plog2, clock.time_ms())
        assert view_text(plog2) == appended
        assert os.path.getsize(path) == size
        seg = plog2.remote_segments[0]
        assert isinstance(seg, RemoteLogSegment) and not seg.broken
        assert plog2.offset_for_timestamp(0) == 0
        view = live_view(plog2)
        assert appended[view.position_of(17):].startswith(b"record-000017-")
    finally:
        m2.close()


def test_torn_cached_blocks_are_fetched_again(tiered, tmp_path, clock):
    manager, rlm, plog, appended, archive = tiered
    assert view_text(plog) == appended  # fills the block cache
    image = crash_image(manager, tmp_path / "image")
    blocks = image / "t-0" / REMOTE_CACHE_DIR / "blocks"
    files = sorted(blocks.iterdir())
    assert files
    for i, f in enumerate(files):  # what a power cut can leave of unsynced files
        data = f.read_bytes()
        f.write_bytes([b"", data[: len(data) // 2], b"\0" * len(data), data[:-1] + bytes([data[-1] ^ 1])][i % 4])
    m2, rlm2, plog2 = _reload(image, archive, clock)
    try:
        assert view_text(plog2) == appended
        assert all(f.stat().st_size in (0, len(f.read_bytes())) for f in blocks.iterdir())
        assert view_text(plog2) == appended  # from the blocks fetched again
    finally:
        m2.close()


def test_a_rolled_segment_that_lost_its_last_batch_does_not_stop_tiering(tiered, tmp_path, clock):
    """The cut lands after a roll, before the rolled segment's last batch was flushed: that batch is lost, the
    offsets skip, and tiering goes on past the gap."""
    manager, rlm, plog, appended, archive = tiered
    # One more segment rolled with two batches, not tiered yet, and a flushed active segment after it.
    a_first = plog.log_end_offset
    batch1, batch2 = lines(a_first, 40), lines(a_first + 40, 20)
    plog.roll()
    a = plog.active_segment
    plog.append_lines(b"", batch1, len(batch1))
    plog.flush()  # batch1 is durable; batch2 is a batch of its own (never grown into batch1's)
    lost_at = a.size
    plog.append_lines(b"", batch2, len(batch2))
    plog.roll()
    after = lines(a_first + 60, 60)  # one segment: still active at the cut
    plog.append_lines(b"", after, len(after))
    plog.flush()
    image = crash_image(manager, tmp_path / "image")
    # The power cut: segment A's last batch never reached the disk; the checkpoints are from before A.
    with open(image / "t-0" / os.path.basename(a.log_path), "r+b") as f:
        f.truncate(lost_at)
    for name in ("recovery-point-offset-checkpoint",):
        os.unlink(image / name)
    m2, rlm2, plog2 = _reload(image, archive, clock)
    try:
        survived = appended + batch1 + after
        assert view_text(plog2) == survived, "the mount must show the whole log, from offset 0, across the gap"
        gap = range(a_first + 40, a_first + 60)
        view = live_view(plog2)
        assert view.position_of(gap[0]) == len(appended + batch1)  # the first retained offset after it
        # Tiering goes on: A (shortened to its first batch) is uploaded and deleted locally; the tiered log then
        # ends at the gap, and the local one starts after it.
        m2.set_topic_config("t", "local.retention.bytes", "0")
        rlm2.sync(plog2, clock.time_ms())
        store = DirectoryStore(archive)
        m = ManifestStore(store).read("t", 0)
        assert m.remote_log_end_offset == a_first + 40 and plog2.segments.first.base_offset == a_first + 60
        assert view_text(plog2) == survived
        want = offsets_of(survived)
        tp = TopicPartition("t", 0)
        bucket = BucketPartitionReader(store, "", tp)
        # localDataDir's seam: the bucket to the gap, DATA_DIR after it; each offset once, no data loss reported.
        whole = TieredPartitionReader(bucket, PartitionReader(str(image), tp))
        got = [r.offset for _, data in whole.batches(0, plog2.log_end_offset, fail_on_data_loss=True)
               for r in rec.decode_raw(data) if r.offset >= 0]
        assert sorted(set(got)) == got and [o for o in got if o < plog2.log_end_offset] == want
        # The segment after the gap is uploaded too (the manifest keeps both real ranges), and local retention
        # deletes behind it: the local segment count stays bounded.
        plog2.roll()
        rlm2.sync(plog2, clock.time_ms())
        m = ManifestStore(store).read("t", 0)
        ranges = [(s.base_offset, s.next_offset) for s in m.segments]
        assert (a_first, a_first + 40) in ranges and (a_first + 60, plog2.log_end_offset) in ranges
        assert m.remote_log_end_offset == plog2.log_end_offset and len(plog2.segments) == 1
        assert view_text(plog2) == survived
        got = [r.offset for _, data in bucket.batches(0, m.remote_log_end_offset) for r in rec.decode_raw(data)]
        assert got == want
        # After a restart, from the durable local state alone: the whole log, across the gap.
        m2.close()
        m2, rlm2, plog2 = _reload(image, archive, clock)
        assert plog2.log_start_offset == 0 and view_text(plog2) == survived
    finally:
        m2.close()


def test_tiered_state_is_written_durably_before_it_is_relied_on(tmp_path, monkeypatch):
    """Every local file of the tiered state goes temporary -> fsync -> rename -> directory fsync (the order that
    survives a power cut), for copies from a file and from bytes alike."""
    from logfs.storage.tiered import remote_segment

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", "dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    src = tmp_path / "src.index"
    src.write_bytes(b"\1" * 4096)
    remote_segment.install_index(str(tmp_path / "copy" / "a.index"), source=str(src))
    remote_segment.install_index(str(tmp_path / "copy" / LOCAL_MANIFEST), data=b"{}")
    assert events == [("fsync", "file"), ("rename", "a.index"), ("fsync", "dir"),
                      ("fsync", "file"), ("rename", LOCAL_MANIFEST), ("fsync", "dir")]
    assert (tmp_path / "copy" / "a.index").read_bytes() == src.read_bytes()
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(["a.index", LOCAL_MANIFEST])


def test_a_roll_whose_index_work_was_lost_is_sealed_again_before_it_is_tiered(tiered, tmp_path, clock):
    """The cut lands after a roll whose records were flushed but whose index work (trim to the entries, the view
    index's end entry) was not: the loader seals the segment again, and tiering uploads indexes that are exactly
    their entries, the view index ending with its end entry (found by the LazyFS run: a 47 MB preallocated view
    index uploaded, its end entry missing, and every later pass refused it)."""
    manager, rlm, plog, appended, archive = tiered
    plog.roll()
    sealed = plog.segments.as_list()[-2]
    more = lines(2100, 50)
    plog.append_lines(b"", more, len(more))
    plog.flush()
    manager.checkpoint()  # the recovery point is past the sealed segment: the loader does not recover it
    image = crash_image(manager, tmp_path / "image")
    stem = str(image / "t-0" / os.path.basename(sealed.log_path))[: -len(".log")]
    for suffix, entry, keep_last in ((".index", 8, True), (".timeindex", 12, True), (".viewindex", 36, False)):
        with open(stem + suffix, "r+b") as f:
            valid = f.read()
            if not keep_last:
                valid = valid[:-entry]  # the end entry never reached the disk
            f.seek(0)
            f.write(valid)
            f.truncate(len(valid))
            f.truncate(10 << 20)  # the preallocated size the roll's trim would have cut
    m2, rlm2, plog2 = _reload(image, archive, clock)
    try:
        assert view_text(plog2) == appended + more
        seg = next(s for s in plog2.segments.as_list() if s.base_offset == sealed.base_offset)
        assert seg.sealed_on_disk()
        assert os.path.getsize(stem + ".viewindex") == seg.view_index.entries * 36
        m2.set_topic_config("t", "local.retention.bytes", "0")
        rlm2.sync(plog2, clock.time_ms())
        m = ManifestStore(DirectoryStore(archive)).read("t", 0)
        meta = next(s for s in m.segments if s.base_offset == sealed.base_offset)
        vi = (archive / meta.objects["viewindex"].key).read_bytes()
        assert len(vi) == meta.objects["viewindex"].size and len(vi) % 36 == 0 and len(vi) < 10 << 20
        rel, position = int.from_bytes(vi[-36:-32], "big"), int.from_bytes(vi[-32:-28], "big")
        assert (sealed.base_offset + rel, position) == (meta.next_offset, meta.size)
        assert view_text(plog2) == appended + more
    finally:
        m2.close()

"""Key naming and the partition manifest: encoding, validation, and the no-overlap rule (no store)."""

from __future__ import annotations

import json

import pytest

from logfs.remote import PartitionManifest, RemoteCorruptError, RemoteFile, RemoteSegment
from logfs.remote.manifest import (
    SEGMENT_EXTS, TXN_INDEX_EXT, decode, encode, manifest_key, partition_prefix, segment_key,
)


def seg(base: int, nxt: int, prefix: str = "p", min_timestamp: int = -1) -> RemoteSegment:
    return RemoteSegment(base, nxt, 10 * (nxt - base), 1000 + nxt,
                         {e: RemoteFile(segment_key(prefix, "t", 0, base, e), 7) for e in SEGMENT_EXTS}, min_timestamp)


def test_key_naming():
    assert segment_key("tier/a/", "orders", 2, 1234, "log") == "tier/a/orders-2/00000000000000001234.log"
    assert segment_key("", "orders", 2, 0, "viewindex") == "orders-2/00000000000000000000.viewindex"
    assert segment_key("/x", "o", 0, 2**63 - 1, "timeindex") == "x/o-0/09223372036854775807.timeindex"
    assert manifest_key("", "orders", 2) == "orders-2/manifest.json"
    assert partition_prefix("a//", "t", 1) == "a/t-1/"
    with pytest.raises(ValueError):
        segment_key("", "t", 0, 0, "snapshot")


def test_round_trip_and_offsets():
    m = PartitionManifest("t", 0).with_segment(seg(100, 250)).with_segment(seg(250, 300))
    assert (m.generation, m.log_start_offset, m.remote_log_end_offset, m.remote_size_bytes) == (2, 100, 300, 2000)
    assert decode(encode(m)) == m
    doc = json.loads(encode(m))
    assert doc["format"] == "logfs-remote-manifest" and doc["version"] == 1
    assert doc["segments"][0]["objects"]["log"] == {"key": "p/t-0/00000000000000000100.log", "size": 7}
    assert [m.segment_for(o) for o in (99, 100, 249, 250, 299, 300)] == [
        None, m.segments[0], m.segments[0], m.segments[1], m.segments[1], None]


def test_min_timestamp_round_trips_and_a_manifest_without_it_reads_as_unknown():
    m = PartitionManifest("t", 0).with_segment(seg(0, 10, min_timestamp=500)).with_segment(seg(10, 20))
    m = m.with_segment(seg(20, 30, min_timestamp=-7))
    assert [s.min_timestamp for s in decode(encode(m)).segments] == [500, -1, -7]
    assert decode(encode(m)) == m
    doc = json.loads(encode(m))
    assert doc["version"] == 1  # (a field older readers ignore: no new version)
    assert [s["min_timestamp"] for s in doc["segments"]] == [500, -1, -7]
    # A manifest of a logfs from before the field: every segment unknown, the rest as written.
    for s in doc["segments"]:
        del s["min_timestamp"]
    old = decode(json.dumps(doc).encode())
    assert [s.min_timestamp for s in old.segments] == [-1, -1, -1]
    assert [(s.base_offset, s.max_timestamp) for s in old.segments] == [(s.base_offset, s.max_timestamp)
                                                                        for s in m.segments]
    # Rewritten by this logfs (the next upload): still version 1, the unknown ones written as -1.
    assert decode(encode(old.with_segment(seg(30, 40, min_timestamp=9)))).segments[-1].min_timestamp == 9


def test_fields_a_reader_does_not_know_are_ignored():
    """What lets a field be added without a new version (min_timestamp was): an older reader of a newer manifest
    takes what it knows."""
    m = PartitionManifest("t", 0).with_segment(seg(0, 10, min_timestamp=3))
    doc = json.loads(encode(m))
    doc["written_by"] = "a later logfs"
    doc["segments"][0]["checksum"] = {"crc32c": 1}
    doc["segments"][0]["objects"]["log"]["etag"] = "x"
    assert decode(json.dumps(doc).encode()) == m


def test_with_segment_refuses_an_overlap_and_an_empty_segment_and_takes_a_gap():
    m = PartitionManifest("t", 0).with_segment(seg(0, 10))
    for bad in (seg(5, 20), seg(0, 10), seg(9, 12)):
        with pytest.raises(ValueError):
            m.with_segment(bad)
    with pytest.raises(ValueError):
        m.with_segment(seg(10, 10))
    # Offsets may skip (a batch lost unflushed in a power cut before a roll): the segment keeps its real range.
    gapped = m.with_segment(seg(12, 20))
    assert [(s.base_offset, s.next_offset) for s in gapped.segments] == [(0, 10), (12, 20)]
    assert gapped.remote_log_end_offset == 20 and decode(encode(gapped)) == gapped
    assert [gapped.segment_for(o) for o in (9, 10, 11, 12)] == [gapped.segments[0], None, None, gapped.segments[1]]


def test_retention_drops_whole_segments_and_advances_the_start():
    m = PartitionManifest("t", 0).with_segment(seg(0, 10)).with_segment(seg(10, 20)).with_segment(seg(20, 30))
    nxt, dropped = m.without_segments_below(15)
    assert [s.base_offset for s in dropped] == [0]
    assert [s.base_offset for s in nxt.segments] == [10, 20]
    assert nxt.log_start_offset == 15 and nxt.generation == m.generation + 1
    nxt2, dropped2 = nxt.without_segments_below(5)  # never moves back
    assert dropped2 == [] and nxt2.log_start_offset == 15
    empty, gone = m.without_segments_below(30)
    assert len(gone) == 3 and empty.remote_log_end_offset == 0 and empty.log_start_offset == 30


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(format="other"),
    lambda d: d.update(version=3),
    lambda d: d.update(partition="0"),
    lambda d: d["segments"][1].update(base_offset=5),  # overlaps the first
    lambda d: d["segments"][0].update(next_offset=0),  # empty
    lambda d: d["segments"][0]["objects"].pop("viewindex"),
    lambda d: d["segments"][0]["objects"].update(snapshot={"key": "k", "size": 1}),
    lambda d: d["segments"][0].update(min_timestamp="5"),
    lambda d: d.pop("segments"),
])
def test_decode_rejects_what_logfs_did_not_write(mutate):
    m = PartitionManifest("t", 0).with_segment(seg(0, 10)).with_segment(seg(10, 20))
    d = json.loads(encode(m))
    mutate(d)
    with pytest.raises(RemoteCorruptError):
        decode(json.dumps(d).encode())


def test_a_txnindex_object_is_optional_and_makes_the_manifest_version_2():
    """A segment that Kafka's aborted transactions reach into names a fifth object, its ``.txnindex``. A manifest
    without one is still version 1 (an older logfs reads it); one with one is version 2, which an older logfs
    refuses rather than show aborted records; both read back as written."""
    plain = PartitionManifest("t", 0).with_segment(seg(0, 10))
    assert json.loads(encode(plain))["version"] == 1
    with_txn = seg(10, 20)
    objects = {**with_txn.objects, TXN_INDEX_EXT: RemoteFile(segment_key("p", "t", 0, 10, TXN_INDEX_EXT), 68)}
    m = plain.with_segment(RemoteSegment(10, 20, with_txn.size, with_txn.max_timestamp, objects))
    d = json.loads(encode(m))
    assert d["version"] == 2
    assert decode(encode(m)) == m and decode(encode(plain)) == plain
    assert segment_key("p", "t", 0, 10, TXN_INDEX_EXT) == "p/t-0/00000000000000000010.txnindex"
    assert "p/t-0/00000000000000000010.txnindex" in m.segments[1].keys()  # (deleted with the segment, no orphan)


def test_decode_rejects_garbage():
    for data in (b"", b"\xff\xfe", b"[]", b"null"):
        with pytest.raises(RemoteCorruptError):
            decode(data)


def test_the_remote_package_imports_neither_fuse_nor_trio_and_loads_boto3_only_for_s3():
    import subprocess
    import sys
    code = ("import sys, logfs.remote, logfs.remote.directory, logfs.remote.manifest; "
            "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'boto3 loaded'; "
            "import logfs.remote.s3; "
            "bad = [m for m in ('pyfuse3', 'trio') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

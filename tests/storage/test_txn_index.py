"""Kafka's aborted transactions (``.txnindex``, storage/local/txn_index.py): a partition a broker wrote with
transactional producers shows what a ``read_committed`` consumer reads (CONTRACT section 13). Segments are built
here byte by byte as a broker lays them out (transactional batches, control batches with commit and abort markers,
an abort's entry in the ``.txnindex`` of the segment holding its marker); tests/kafka checks the same against a
real broker's directory."""

from __future__ import annotations

import os
import struct

import pytest

from logfs.storage import LogConfig, load_log
from logfs.storage.format import records as rec
from logfs.storage.local.txn_index import (
    ABORT, COMMIT, ENTRY, NO_OPEN_TRANSACTION, AbortedRanges, AbortedTxn, TransactionState, control_type,
    encode_txn_index, parse_txn_index, read_txn_index,
)
from logfs.storage.names import filename_prefix
from logfs.view import text as view_text
from logfs.view.text import live_view, open_view

T = 1_700_000_000_000


def txn_batch(base: int, values: list[bytes], producer_id: int) -> bytes:
    return rec.build_batch_generic(base, T, values, attributes=rec.ATTR_TRANSACTIONAL, producer=(producer_id, 0, base))


def marker(offset: int, producer_id: int, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return rec.build_batch_generic(offset, T, [value], [key], attributes=rec.ATTR_TRANSACTIONAL | rec.ATTR_CONTROL,
                                   producer=(producer_id, 0, -1))


def plain(base: int, values: list[bytes]) -> bytes:
    return rec.build_batch(base, T, values)


def write_partition(directory, segments: dict[int, list[bytes]], txn: dict[int, list[AbortedTxn]]) -> None:
    os.makedirs(directory, exist_ok=True)
    for base, batches in segments.items():
        with open(os.path.join(directory, filename_prefix(base) + ".log"), "wb") as f:
            f.write(b"".join(batches))
    for base, entries in txn.items():
        with open(os.path.join(directory, filename_prefix(base) + ".txnindex"), "wb") as f:
            f.write(b"".join(ENTRY.pack(0, *e) for e in entries))


# offsets 0-2 plain; 3-4 producer 7 (aborted); 5-6 producer 8 (committed); 7 plain | 8 producer 7 (aborted: the same
# transaction, in the next segment); 9 abort marker of 7; 10 commit marker of 8; 11-12 plain; 13 producer 9 (aborted,
# compressed); 14 its abort marker; 15 plain
SEGMENTS = {
    0: [plain(0, [b"a0", b"a1", b"a2"]), txn_batch(3, [b"t7-3", b"t7-4"], 7), txn_batch(5, [b"t8-5", b"t8-6"], 8),
        plain(7, [b"p7"])],
    8: [txn_batch(8, [b"t7-8"], 7), marker(9, 7, commit=False), marker(10, 8, commit=True),
        plain(11, [b"p11", b"p12"]), rec.compress_batch(txn_batch(13, [b"t9-13" * 50], 9), 1),
        marker(14, 9, commit=False), plain(15, [b"p15"])],
    16: [plain(16, [b"p16"])],
}
TXN = {8: [AbortedTxn(7, 3, 9, 3), AbortedTxn(9, 13, 14, 13)]}
COMMITTED = [b"a0", b"a1", b"a2", b"t8-5", b"t8-6", b"p7", b"p11", b"p12", b"p15", b"p16"]
OFFSETS = [0, 1, 2, 5, 6, 7, 11, 12, 15, 16]


@pytest.fixture(params=["c", "python"])
def speedups(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(view_text, "_speedups", None)
    return request.param


def load(tmp_path):
    directory = str(tmp_path / "t-0")
    write_partition(directory, SEGMENTS, TXN)
    return load_log(directory, "t", 0, LogConfig.for_tests(index_interval_bytes=1), had_clean_shutdown=True)


def test_aborted_ranges():
    ranges = AbortedRanges([AbortedTxn(7, 3, 9, 3), AbortedTxn(7, 20, 25, 20), AbortedTxn(8, 0, 4, 0)])
    assert [ranges.covers(7, o) for o in (2, 3, 9, 10, 19, 20, 25, 26)] == [False, True, True, False, False, True,
                                                                           True, False]
    assert ranges.covers(8, 0) and not ranges.covers(9, 5) and ranges.count == 3


def test_the_aborts_reaching_into_a_range_are_what_tiering_uploads():
    """``txns(first, end)``: the entries reaching into offsets [first, end) (a tiered segment's ``.txnindex``
    object), in marker order, each with its last stable offset, in Kafka's format and back; a union keeps them."""
    txns = [AbortedTxn(7, 3, 9, 3), AbortedTxn(8, 0, 4, 0), AbortedTxn(7, 20, 25, 18)]
    ranges = AbortedRanges(txns)
    assert ranges.txns() == [AbortedTxn(8, 0, 4, 0), AbortedTxn(7, 3, 9, 3), AbortedTxn(7, 20, 25, 18)]
    assert ranges.txns(5, 20) == [AbortedTxn(7, 3, 9, 3)]  # (the abort of 20..25 starts at the range's end)
    assert ranges.txns(9, 21) == [AbortedTxn(7, 3, 9, 3), AbortedTxn(7, 20, 25, 18)]
    assert ranges.txns(26, 40) == []
    assert parse_txn_index(encode_txn_index(ranges.txns())) == ranges.txns()
    both = AbortedRanges.union([AbortedRanges(txns[:2]), AbortedRanges(txns[1:]), None])
    assert both.txns() == ranges.txns() and both.count == 3


def test_read_txn_index_ignores_a_partial_entry(tmp_path):
    path = tmp_path / "x.txnindex"
    path.write_bytes(ENTRY.pack(0, 7, 3, 9, 3) + ENTRY.pack(0, 8, 10, 12, 10)[:20])
    assert read_txn_index(str(path)) == [AbortedTxn(7, 3, 9, 3)]


def test_view_shows_what_read_committed_reads(tmp_path, speedups):
    plog = load(tmp_path)
    try:
        text = b"".join(v + b"\n" for v in COMMITTED)
        view = live_view(plog)
        assert view.length() == len(text)
        handle_view = open_view(plog)
        try:
            assert handle_view.read(0, 1 << 20) == text
            # Small reads, one byte at a time: every batch boundary, aborted batches between them
            assert b"".join(handle_view.read(i, 1) for i in range(len(text))) == text
            positions = {}
            at = 0
            for value, offset in zip(COMMITTED, OFFSETS):
                positions[offset] = at
                assert handle_view.position_of(offset) == at
                assert handle_view.offset_at(at) == offset
                assert handle_view.offset_at(at + len(value)) == offset  # (its "\n")
                at += len(value) + 1
            # An aborted or control record's position is the next committed record's.
            assert handle_view.position_of(3) == positions[5]
            assert handle_view.position_of(8) == positions[11]
            assert handle_view.position_of(13) == positions[15]
            assert handle_view.position_of(17) == len(text)
        finally:
            handle_view.release()
        # Offsets stay Kafka's: the log end offset counts aborted records and markers.
        assert plog.log_end_offset == 17
    finally:
        plog.close()


def test_the_txn_index_stays_beside_its_segment_and_the_view_index_is_rebuilt_once(tmp_path):
    plog = load(tmp_path)
    directory = plog.directory
    plog.close()
    names = sorted(os.listdir(directory))
    assert filename_prefix(8) + ".txnindex" in names and filename_prefix(0) + ".viewindex" in names
    again = load_log(directory, "t", 0, LogConfig.for_tests(index_interval_bytes=1), had_clean_shutdown=True)
    try:
        assert live_view(again).read(0, 1 << 20) == b"".join(v + b"\n" for v in COMMITTED)
        # Retention deletes a segment with its .txnindex (renamed .deleted, then unlinked).
        again.delete_segments(list(again.segments)[:2])
        assert filename_prefix(8) + ".txnindex.deleted" in os.listdir(directory)
        again.purge_deleted(now_ms=1 << 62)
    finally:
        again.close()
    assert not any(n.startswith((filename_prefix(0), filename_prefix(8))) for n in os.listdir(directory))


def test_a_transaction_marker_counts_in_time_lookups_as_in_kafka(tmp_path):
    """A marker is a record with the coordinator's time, later than the records before it when producers stamp
    their own (CreateTime): Kafka's ListOffsets by timestamp finds it (``FileRecords.searchForTimestamp`` walks
    control batches too), and so do ``time.`` (the engine and the view) and the Spark source's
    ``startingTimestamp``. Its offset has no line: ``position.`` of it is the next line's, as for any offset
    without one."""
    from logfs.storage.local.reader import PartitionReader

    directory = str(tmp_path / "t-0")
    segments = {0: [rec.build_batch(0, T, [b"a0"]),
                    rec.build_batch_generic(1, T + 1, [b"t7-1"], attributes=rec.ATTR_TRANSACTIONAL,
                                            producer=(7, 0, 0)),
                    rec.build_batch_generic(2, T + 5000, [struct.pack(">hi", 0, 0)], [struct.pack(">hh", 0, 1)],
                                            attributes=rec.ATTR_TRANSACTIONAL | rec.ATTR_CONTROL,
                                            producer=(7, 0, -1)),
                    rec.build_batch(3, T + 2, [b"p3"]),
                    rec.build_batch(4, T + 6000, [b"p4"])]}
    write_partition(directory, segments, {})
    plog = load_log(directory, "t", 0, LogConfig.for_tests(index_interval_bytes=1), had_clean_shutdown=True)
    try:
        view = live_view(plog)
        reader = PartitionReader(str(tmp_path), "t", 0)
        # (timestamp -> Kafka's answer: the COMMIT marker at 2 is the first record at or after T+2 ... T+5000)
        for ts, kafka in ((T, 0), (T + 1, 1), (T + 2, 2), (T + 5000, 2), (T + 5001, 4), (T + 6001, None)):
            assert plog.offset_for_timestamp(ts) == kafka, ts
            assert view.offset_for_timestamp(ts) == (5 if kafka is None else kafka), ts
            assert reader.offset_for_timestamp(ts) == kafka, ts
        assert view.position_of(2) == view.position_of(3) == len(b"a0\nt7-1\n")
    finally:
        plog.close()


def test_transaction_state_from_the_data():
    """What a running broker's log shows before its ``.txnindex`` says it (storage/broker.py): the aborted ranges
    and the last stable offset, from the batches alone, in offset order."""
    state = TransactionState()
    stables = []
    for base in sorted(SEGMENTS):
        for batch in SEGMENTS[base]:
            state.see(batch, rec.parse_header(batch))
            stables.append(state.stable())
    assert stables == [NO_OPEN_TRANSACTION, 3, 3, 3, 3, 5, NO_OPEN_TRANSACTION, NO_OPEN_TRANSACTION, 13,
                       NO_OPEN_TRANSACTION, NO_OPEN_TRANSACTION, NO_OPEN_TRANSACTION]
    assert control_type(marker(9, 7, commit=False)) == ABORT and control_type(marker(10, 8, commit=True)) == COMMIT
    expected = AbortedRanges(TXN[8])
    for pid, offset in [(7, 3), (7, 8), (7, 9), (7, 10), (8, 5), (9, 13), (9, 14), (9, 15), (7, 2)]:
        assert state.aborted.covers(pid, offset) == expected.covers(pid, offset), (pid, offset)
    assert state.aborted.count == 2
    state.aborted.add(AbortedTxn(7, 3, 9, 3))  # (known already: no change)
    assert state.aborted.count == 2


# read_uncommitted (logfs.isolation.level): every record but the markers, in offset order
UNCOMMITTED = [b"a0", b"a1", b"a2", b"t7-3", b"t7-4", b"t8-5", b"t8-6", b"p7", b"t7-8", b"p11", b"p12", b"t9-13" * 50,
               b"p15", b"p16"]
UNCOMMITTED_OFFSETS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 15, 16]


def test_view_shows_what_read_uncommitted_reads(tmp_path, speedups):
    """``logfs.isolation.level=read_uncommitted``: the aborted records are lines too (the markers never are), in the
    length, every read (sequential, and each byte located afresh through the view index: one entry per batch here),
    ``position.`` and ``offset.``; the log's own view index is the read_committed one, and the config set back
    shows that again."""
    plog = load(tmp_path)
    try:
        committed = plog.config
        plog.measure_aborted()  # (the loader's or the setting's worker does it: a walk over the segments)
        assert [s.uncommitted is not None for s in plog.segments.as_list()] == [True, True, False]
        plog.config = LogConfig.for_tests(index_interval_bytes=1, isolation_level="read_uncommitted")
        text = b"".join(v + b"\n" for v in UNCOMMITTED)
        assert live_view(plog).length() == len(text)
        handle_view = open_view(plog)
        try:
            assert handle_view.read(0, 1 << 20) == text
            assert b"".join(handle_view.read(i, 1) for i in range(len(text))) == text
            for i in reversed(range(len(text))):  # (no cursor: each read locates its byte)
                assert live_view(plog).read(i, 3) == text[i : i + 3], i
            at = 0
            for value, offset in zip(UNCOMMITTED, UNCOMMITTED_OFFSETS):
                assert handle_view.position_of(offset) == at
                assert handle_view.offset_at(at) == offset
                assert handle_view.offset_at(at + len(value)) == offset
                at += len(value) + 1
            assert handle_view.position_of(9) == handle_view.position_of(11)  # (a marker: the next line's)
            assert handle_view.position_of(14) == handle_view.position_of(15)
            assert handle_view.position_of(17) == len(text)
        finally:
            handle_view.release()
        plog.config = committed
        assert live_view(plog).read(0, 1 << 20) == b"".join(v + b"\n" for v in COMMITTED)
    finally:
        plog.close()


def test_a_segment_not_measured_yet_is_measured_by_the_view(tmp_path):
    """A read_uncommitted view of a segment whose aborted batches were not measured (a partition that came in
    after the setting, as by a move between log directories) measures it itself, once, rather than show the
    committed lines."""
    plog = load(tmp_path)
    try:
        plog.config = LogConfig.for_tests(index_interval_bytes=1, isolation_level="read_uncommitted")
        assert live_view(plog).read(0, 1 << 20) == b"".join(v + b"\n" for v in UNCOMMITTED)
        assert plog.segments.as_list()[0].uncommitted is not None
    finally:
        plog.close()

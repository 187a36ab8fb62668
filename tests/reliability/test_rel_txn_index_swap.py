"""The cleaner's swap of segments that Kafka's aborted transactions reach into (a broker's log directory that logfs
owns, CONTRACT section 13), at every crash point of the swap, at the engine level.

A partition directory as a Kafka broker leaves it: segments of v2 batches (no indexes: the loader builds them, as for
a broker's directory), an idempotent producer's records among two transactional producers' aborts and a commit, the
first abort's records in an earlier segment than its marker, and a ``.txnindex`` beside each segment holding an
abort marker. Then it is rewritten, in this process (``compress_in_thread``, ``clean``): compressed (``zstd``), or
compacted. Every rename of the swap (``.cleaned`` -> ``.swap`` file by file, the ``.deleted`` retirements, ``.swap`` ->
live; the new segment's ``.txnindex`` among them, last of its files) is a crash point: the directory is copied as it
is before each rename and after the last one, and each copy is loaded uncleanly. Each must show, at
``read_committed``, the text before or after the rewrite (never aborted records), at ``read_uncommitted`` the same
state's, with Kafka's two aborted transactions in exactly one live ``.txnindex`` entry each and no leftover files.
The live log shows the same at once after the swap (the new segment carries the aborted ranges in memory), and
the markers and ``.txnindex`` entries that compaction keeps go as Kafka's cleaner lets them go (delete horizon).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct

import pytest

from logfs.storage import LogConfig, ManualClock, load_log
from logfs.storage.cleaner.compaction import OffsetMap, cleanable_range, clean
from logfs.storage.cleaner.process import compress_in_thread
from logfs.storage.format import records as rec
from logfs.storage.local.txn_index import ABORT, COMMIT, AbortedTxn, read_txn_index
from logfs.storage.names import filename_prefix
from logfs.view.text import live_view

T0 = 1_700_000_000_000
TX = rec.ATTR_TRANSACTIONAL
PLAIN, FIRST, SECOND = 0, 1, 2  # producer ids: the idempotent one, two transactional ones

# (segment base, [batch]); a batch: (producer, kind, [(offset, key, value)]), kind "data" or a marker.
SEGMENTS = [
    (0, [(PLAIN, "data", [(0, b"k0", b"plain 0"), (1, b"k1", b"plain 1")]),
         (FIRST, "data", [(2, b"k0", b"ABORTED 2"), (3, b"k2", b"ABORTED 3")]),
         (PLAIN, "data", [(4, b"k2", b"plain 4")])]),
    (5, [(FIRST, "data", [(5, b"k1", b"ABORTED 5"), (6, b"k3", b"ABORTED 6")]),
         (FIRST, ABORT, [(7, None, None)]),
         (FIRST, "data", [(8, b"k3", b"committed 8"), (9, b"k4", b"committed 9")]),
         (FIRST, COMMIT, [(10, None, None)])]),
    (11, [(SECOND, "data", [(11, b"k0", b"ABORTED 11")]),
          (PLAIN, "data", [(12, b"k5", b"plain 12")]),
          (SECOND, ABORT, [(13, None, None)]),
          (PLAIN, "data", [(14, b"k1", b"plain 14")])]),
    (15, [(PLAIN, "data", [(15, b"k9", b"plain 15")])]),  # the active segment
]
TXNS = {5: [AbortedTxn(FIRST, 2, 7, 2)], 11: [AbortedTxn(SECOND, 11, 13, 11)]}  # by the segment of the marker
COMMITTED = [0, 1, 4, 8, 9, 12, 14, 15]
EVERYTHING = list(range(16))
COMPACTED = [0, 4, 8, 9, 12, 14, 15]  # each key's latest committed record (an aborted one never counts)
VALUES = {o: v for _, batches in SEGMENTS for _, _, records in batches for o, _, v in records if v is not None}


def text(offsets) -> bytes:
    return b"".join(VALUES[o] + b"\n" for o in offsets if o in VALUES)


def batch(producer: int, kind, records) -> bytes:
    base = records[0][0]
    attributes = 0 if producer == PLAIN else TX
    if kind == "data":
        return rec.build_batch_generic(
            base, 0, [v for _, _, v in records], [k for _, k, _ in records], [()] * len(records),
            [T0 + o for o, _, _ in records], [o - base for o, _, _ in records], attributes=attributes,
            producer=(producer, 0, base))
    return rec.build_batch_generic(  # a marker: Kafka's control record (key: version, type; value: version, epoch)
        base, 0, [struct.pack(">hi", 0, 0)], [struct.pack(">hh", 0, kind)], [()], [T0 + base], [0],
        attributes=attributes | rec.ATTR_CONTROL, producer=(producer, 0, -1))


def broker_directory(directory: str) -> None:
    os.makedirs(directory)
    for base, batches in SEGMENTS:
        with open(os.path.join(directory, filename_prefix(base) + ".log"), "wb") as f:
            for producer, kind, records in batches:
                f.write(batch(producer, kind, records))
        if base in TXNS:
            with open(os.path.join(directory, filename_prefix(base) + ".txnindex"), "wb") as f:
                f.write(b"".join(struct.pack(">hqqqq", 0, *t) for t in TXNS[base]))  # (Kafka's 34-byte entries)


def config(mode: str, isolation: str = "read_committed") -> LogConfig:
    base = LogConfig.for_tests(isolation_level=isolation)
    if mode == "compress":
        return dataclasses.replace(base, compression_type="zstd")
    return dataclasses.replace(base, cleanup_policy="compact")


def view_text(plog) -> bytes:
    view = live_view(plog)
    return view.read(0, view.length() + 1)


def live_txns(directory: str) -> list:
    return sorted(t for n in os.listdir(directory) if n.endswith(".txnindex")
                  for t in read_txn_index(os.path.join(directory, n)))


def rewrite(plog, mode: str, clock) -> None:
    sealed = plog.segments.as_list()[:-1]
    if mode == "compress":
        result = compress_in_thread(plog, sealed, clock.time_ms())
    else:
        result = clean(plog, cleanable_range(plog, None, clock.time_ms()), OffsetMap(1000), clock.time_ms())
    assert result.segments_replaced == len(sealed)


@pytest.mark.parametrize("mode", ["compress", "compact"])
def test_a_rewritten_segment_keeps_kafkas_aborted_transactions(tmp_path, mode):
    """At once after the swap and after a clean reopen: the text of each isolation level, and the .txnindex."""
    directory = str(tmp_path / "t-0")
    broker_directory(directory)
    clock = ManualClock(T0 + 3_600_000)
    after = COMMITTED if mode == "compress" else COMPACTED
    for isolation, before, rewritten in (("read_committed", COMMITTED, after),
                                         ("read_uncommitted", EVERYTHING, after if mode == "compact" else EVERYTHING)):
        shutil.rmtree(directory)
        broker_directory(directory)
        plog = load_log(directory, "t", 0, config(mode, isolation), clock=clock)
        try:
            assert view_text(plog) == text(before)
            rewrite(plog, mode, clock)
            assert view_text(plog) == text(rewritten), isolation
        finally:
            plog.close()
        assert live_txns(directory) == sorted(t for ts in TXNS.values() for t in ts)
        plog = load_log(directory, "t", 0, config(mode, isolation), clock=clock, had_clean_shutdown=True)
        try:
            assert view_text(plog) == text(rewritten), isolation
        finally:
            plog.close()
    if mode == "compact":  # the markers stay (with a delete horizon once no pass removes their batches)
        plog = load_log(directory, "t", 0, config(mode), clock=clock, had_clean_shutdown=True)
        markers = [h.base_offset for s in plog.segments for _, h, _, _ in s.batches_from(0) if h.is_control]
        plog.close()
        assert markers == [7, 10, 13]


@pytest.mark.parametrize("mode", ["compress", "compact"])
def test_every_crash_point_of_the_swap_keeps_the_aborted_transactions(tmp_path, monkeypatch, mode):
    directory = str(tmp_path / "t-0")
    broker_directory(directory)
    clock = ManualClock(T0 + 3_600_000)
    plog = load_log(directory, "t", 0, config(mode), clock=clock)
    images: list[str] = []
    renames: list[tuple[str, str]] = []
    real_rename, real_replace = os.rename, os.replace

    def image() -> None:
        path = str(tmp_path / f"image-{len(images)}" / "t-0")
        shutil.copytree(directory, path)
        images.append(path)

    def renaming(real):
        def rename(src, dst, *args, **kwargs):
            if os.path.dirname(str(src)) == directory:
                image()  # (a crash just before this rename)
                renames.append((os.path.basename(str(src)), os.path.basename(str(dst))))
            return real(src, dst, *args, **kwargs)
        return rename

    monkeypatch.setattr(os, "rename", renaming(real_rename))
    monkeypatch.setattr(os, "replace", renaming(real_replace))
    try:
        rewrite(plog, mode, clock)
    finally:
        monkeypatch.undo()
    image()  # (after the last one)
    plog.close_without_flush()
    # The new segment's .txnindex is one of the swap's files: renamed .swap after its .log (the commit point) and
    # live with the others.
    new_txn = filename_prefix(0 if mode == "compact" else 5) + ".txnindex"
    assert (new_txn + ".cleaned", new_txn + ".swap") in renames and (new_txn + ".swap", new_txn) in renames
    log_swap = renames.index((filename_prefix(0 if mode == "compact" else 5) + ".log.cleaned",
                              filename_prefix(0 if mode == "compact" else 5) + ".log.swap"))
    assert log_swap < renames.index((new_txn + ".cleaned", new_txn + ".swap"))

    after = COMMITTED if mode == "compress" else COMPACTED
    seen = set()
    for path in images:
        for isolation in ("read_committed", "read_uncommitted"):
            reopened = load_log(path, "t", 0, config(mode, isolation), clock=clock, had_clean_shutdown=False)
            try:
                shown = view_text(reopened)
            finally:
                reopened.close()
            if isolation == "read_committed":
                assert shown in (text(COMMITTED), text(after)), (path, shown)
                state = "before" if shown == text(COMMITTED) and mode == "compact" else "after"
            else:  # the same state's
                rewritten = EVERYTHING if mode == "compress" else COMPACTED
                assert shown == (text(EVERYTHING) if state == "before" else text(rewritten)), (path, shown)
        seen.add(state)
        assert live_txns(path) == sorted(t for ts in TXNS.values() for t in ts), path
        assert not [n for n in os.listdir(path) if n.endswith((".cleaned", ".swap", ".deleted"))], path
    if mode == "compact":
        assert seen == {"before", "after"}
    assert len(images) == len(renames) + 1 >= 8


def test_an_abort_marker_goes_after_its_delete_horizon_with_its_entry(tmp_path):
    """Compaction as Kafka's cleaner: a pass that removes an aborted transaction's batches keeps its marker as it
    is; a later pass, which finds none of them, stamps the marker with a delete horizon (``delete.retention.ms``),
    and a pass past it removes the marker and its ``.txnindex`` entry. A commit marker stays while its
    transaction's records do. What each isolation level shows never changes."""
    directory = str(tmp_path / "t-0")
    broker_directory(directory)
    clock = ManualClock(T0 + 3_600_000)
    plog = load_log(directory, "t", 0, config("compact"), clock=clock)

    def markers() -> dict[int, int | None]:  # marker offset -> its delete horizon (None: none)
        return {h.base_offset: (h.base_timestamp if h.attributes & rec.ATTR_DELETE_HORIZON else None)
                for s in plog.segments for _, h, _, _ in s.batches_from(0) if h.is_control}

    try:
        rewrite(plog, "compact", clock)
        assert markers() == {7: None, 10: None, 13: None}
        clock.advance(1000)
        rewrite(plog, "compact", clock)
        horizon = clock.time_ms() + plog.config.delete_retention_ms
        assert markers() == {7: horizon, 10: None, 13: horizon}
        assert live_txns(directory) == sorted(t for ts in TXNS.values() for t in ts)
        clock.advance(plog.config.delete_retention_ms + 1)
        rewrite(plog, "compact", clock)
        assert markers() == {10: None}
        assert live_txns(directory) == []
        assert view_text(plog) == text(COMPACTED)
    finally:
        plog.close()
    for isolation in ("read_committed", "read_uncommitted"):
        reopened = load_log(directory, "t", 0, config("compact", isolation), clock=clock, had_clean_shutdown=True)
        try:
            assert view_text(reopened) == text(COMPACTED)
        finally:
            reopened.close()

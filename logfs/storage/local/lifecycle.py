"""Segment lifecycle: the one place segments are opened or created, and the one swap protocol.

:func:`open_segment` opens (creating if needed) a segment's four files with a log config's index sizes; the
log's roll and truncation, the loader, the cleaner and the cleaner process all call it.

:func:`replace_segments` is the swap that puts one new segment in place of the segments whose offsets it
covers (Kafka's ``LocalLog.replaceSegments``). The cleaner uses it for each cleaned group; the loader uses it
to finish a swap a crash interrupted. The protocol, crash-safe at every step:

  1. the new segment's files are renamed ``.cleaned`` -> ``.swap`` (skipped when recovery found them already
     ``.swap``), ``.log`` first, its Kafka ``.txnindex`` (when it has one) last; the ``.log.swap`` rename is the
     commit point; fsync the directory;
  2. the replaced segments are retired in descending offset order (the cleaner renames them ``.deleted`` and
     unlinks them after ``file.delete.delay.ms``; recovery unlinks them at once), their ``.txnindex`` with them;
  3. the new segment's files are renamed ``.swap`` -> live, ``.log`` first; fsync the directory.

A crash before 1 leaves ``.cleaned`` files, which the loader deletes (the swap never happened). From 1 on, the
loader completes the swap: it removes the live segments inside the ``.swap`` segment's offset range (the
cleaned segment always spans the whole range it replaces) and renames the swap live, by this same function.
Since every rename sequence moves the ``.log`` first, a swap index left without its ``.log.swap`` belongs to
a log that already went live, and is renamed live too.

The ``.txnindex`` is the one file of the new segment that cannot be rebuilt from its ``.log`` alone (Kafka rebuilds
it from producer state replayed from a ``.snapshot``, which logfs does not keep): so a ``.txnindex.cleaned`` beside
a ``.log.swap`` of the same base is that swap's (the cleaner wrote and fsynced it before the commit point, and
:func:`open_cleaned` removes a stale one before a pass writes anything) and the loader renames it ``.swap`` rather
than deleting it as a leftover.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Sequence

from ..checkpoints import fsync_dir
from .index import ViewIndex
from .open_files import OpenFiles
from ..names import ALL_SUFFIXES, CLEANED_SUFFIX, LOG_SUFFIX, TXN_INDEX_SUFFIX, filename_prefix, parse_segment_file
from .segment import SWAP_SUFFIX, LogSegment
from .txn_index import aborted_by_segment


def open_segment(directory: str, base_offset: int, config, *, created_ms: int = 0, suffix: str = "",
                 active: bool = True, jittered: bool = False, create: bool = True,
                 open_files: OpenFiles | None = None) -> LogSegment:
    """The segment at ``base_offset`` of ``directory`` (its files created if missing, unless ``create`` is false:
    then FileNotFoundError), with ``config``'s index sizes; ``jittered`` draws its roll jitter from
    ``segment.jitter.ms`` (a freshly rolled segment). Its files open within ``open_files`` (its log's budget; a
    segment alone gets one of its own)."""
    jitter = random_jitter(config.segment_jitter_ms, config.segment_ms) if jittered else 0
    view_index_size = ViewIndex.bytes_for(config.segment_index_bytes, config.segment_bytes,
                                          config.index_interval_bytes)
    return LogSegment(directory, base_offset, index_interval_bytes=config.index_interval_bytes,
                      max_index_size=config.segment_index_bytes, roll_jitter_ms=jitter, created_ms=created_ms,
                      suffix=suffix, active=active, max_view_index_size=view_index_size, create=create,
                      open_files=open_files)


def open_cleaned(directory: str, base_offset: int, config, now_ms: int, open_files: OpenFiles) -> LogSegment:
    """The ``.cleaned`` segment a rewrite (compaction, compression) writes at ``base_offset``, empty: what a pass
    abandoned there (a crash, a failed swap) is cleared first, its ``.txnindex.cleaned`` too, so that nothing of it
    can pass for this pass's files. ``open_files``: the log's budget (the segment joins the log)."""
    cleaned = open_segment(directory, base_offset, config, created_ms=now_ms, suffix=CLEANED_SUFFIX,
                           open_files=open_files)
    for index in (cleaned.offset_index, cleaned.time_index, cleaned.view_index):
        index.reset()
    if cleaned.size:
        os.ftruncate(cleaned.fd, 0)
        cleaned.size = 0
    try:
        os.unlink(cleaned.txn_index_path)
    except FileNotFoundError:
        pass
    return cleaned


def attach_transactions(directory: str, segments: Sequence[LogSegment]) -> None:
    """Give ``segments``, opened outside their log (the cleaner's process), what the loader gives a log's segments
    of Kafka's transactions: the aborted transactions reaching into each (so their batches count no lines, as in
    the view indexes), and whether each has a ``.txnindex`` of its own."""
    names = os.listdir(directory)
    bases = sorted(b for b in (parse_segment_file(n) for n in names) if b is not None and b[1] == LOG_SUFFIX
                   and not b[2])
    aborted = aborted_by_segment(directory, names, [b[0] for b in bases])
    present = set(names)
    for segment in segments:
        segment.aborted = aborted.get(segment.base_offset)
        segment.has_txn_index = filename_prefix(segment.base_offset) + TXN_INDEX_SUFFIX in present


def random_jitter(segment_jitter_ms: int, segment_ms: int) -> int:
    if segment_jitter_ms <= 0:
        return 0
    return random.randrange(min(segment_jitter_ms, segment_ms))


def replace_segments(directory: str, new: LogSegment, old: Sequence[LogSegment],
                     retire: Callable[[LogSegment], None]) -> None:
    """Put ``new`` (``.cleaned``, or ``.swap`` when recovery completes a swap) in place of ``old`` by the
    protocol above; ``retire`` takes each replaced segment away. The caller holds whatever keeps readers from
    seeing the steps in between (the log lock)."""
    if new.suffix != SWAP_SUFFIX:
        new.change_suffix(SWAP_SUFFIX)
        fsync_dir(directory)
    for segment in sorted(old, key=lambda s: s.base_offset, reverse=True):
        retire(segment)
    new.change_suffix("")
    fsync_dir(directory)


def remove_segment_files(directory: str, base_offset: int) -> None:
    """Unlink the live files of the segment at ``base_offset`` that exist (a segment whose creation failed)."""
    stem = os.path.join(directory, filename_prefix(base_offset))
    for suffix in ALL_SUFFIXES:
        try:
            os.unlink(stem + suffix)
        except FileNotFoundError:
            pass


def discard(segment: LogSegment) -> None:
    """Close a segment that no log holds, and unlink its files."""
    segment.deleted = True
    segment.close()
    segment.delete_files()

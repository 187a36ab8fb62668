"""Opening one partition directory, with recovery, in LogLoader's order.

1. Delete ``.deleted`` files and stray ``.cleaned`` files; complete interrupted swaps by the cleaner's own swap
   protocol (:func:`~logfs.storage.local.lifecycle.replace_segments`): a ``.swap`` segment replaces the live segments
   inside its offset range, then is renamed live (its ``.cleaned``/``.swap`` siblings were written completely
   before the first rename, so completing is always safe).
2. Remove orphan indexes (an index without its ``.log``).
3. Open segments in offset order. After a clean shutdown, state comes from the indexes (reading at most the
   tail after the last index entry). After an unclean shutdown, every segment from the one holding the
   recovery point is recovered: CRCs validated, the first invalid byte truncated away with all later
   segments, indexes rebuilt. A segment with a missing or inconsistent index is recovered either way. Empty
   segments past a gap at the recovered end (a roll, then a power cut that lost the old segment's tail) go too.
4. The log start offset is the larger of its checkpoint and the first segment's base offset.

Recovery is the one place allowed to read whole segments, and only the unflushed tail (or a segment whose
indexes are missing, such as one written by another Kafka writer).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from ..clock import SYSTEM_CLOCK, Clock
from ..config import LogConfig
from ..errors import CorruptRecordError, StorageIOError
from ..failure import LogDir
from .open_files import OpenFiles
from .lifecycle import discard, open_segment, replace_segments
from .log import Log
from ..names import (
    CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, SWAP_SUFFIX,
    TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, VIEW_INDEX_SUFFIX, filename_prefix, parse_segment_file,
)
from .segment import LogSegment
from .txn_index import AbortedRanges, aborted_by_segment, read_txn_index

log = logging.getLogger(__name__)


def _base_of(name: str) -> int | None:
    parsed = parse_segment_file(name)
    return None if parsed is None else parsed[0]


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def load_log(
    directory: str,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    had_clean_shutdown: bool = False,
    clock: Clock = SYSTEM_CLOCK,
    progress: Callable[[int, int], None] | None = None,
    log_dir: LogDir | None = None,
    open_files: OpenFiles | None = None,
) -> Log:
    """Open one partition's log from ``directory`` (made if missing), recovered in Kafka's LogLoader order. Its
    segments open their files within ``open_files`` (the manager's budget; a log alone gets one of its own)."""
    files = open_files if open_files is not None else OpenFiles()
    os.makedirs(directory, exist_ok=True)
    names = os.listdir(directory)

    # 1. Leftovers of deletion and compaction. (The directory is listed again only after something changed it: a
    # store of many small partitions is loaded with one listing each.) A .txnindex.cleaned beside a .log.swap of
    # its base is that swap's, written before its commit point, and the one file of it no .log can rebuild: it goes
    # to .swap with the others (lifecycle's swap protocol).
    swapped = {_base_of(n) for n in names if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)}
    for name in names:
        if name.endswith(TXN_INDEX_SUFFIX + CLEANED_SUFFIX) and name[:20].isdigit() and int(name[:20]) in swapped:
            stem = os.path.join(directory, name[: -len(CLEANED_SUFFIX)])
            os.replace(stem + CLEANED_SUFFIX, stem + SWAP_SUFFIX)
            names = os.listdir(directory)
    leftovers = [n for n in names if n.endswith(DELETED_SUFFIX) or n.endswith(CLEANED_SUFFIX)]
    for name in leftovers:
        _remove(os.path.join(directory, name))
    if leftovers:
        names = os.listdir(directory)
    swaps = sorted(n for n in names if n.endswith(LOG_SUFFIX + SWAP_SUFFIX))
    for swap_name in swaps:
        _complete_swap(directory, swap_name, config)
    if any(n.endswith(SWAP_SUFFIX) for n in names):
        for name in os.listdir(directory):  # swap indexes without a log (their log already went live)
            if name.endswith(SWAP_SUFFIX):
                live = os.path.join(directory, name[: -len(SWAP_SUFFIX)])
                os.replace(os.path.join(directory, name), live)
        names = os.listdir(directory)

    # 2. Orphan indexes, Kafka's .txnindex among them (as Kafka's loader): a segment a swap retired leaves one when a
    # crash came between the renames of its files; its entries are the swap's own .txnindex's.
    bases_with_log = {_base_of(n) for n in names if n.endswith(LOG_SUFFIX)}
    for name in names:
        if name.endswith(INDEX_SUFFIXES) and _base_of(name) not in bases_with_log:
            _remove(os.path.join(directory, name))
        elif name.endswith(TXN_INDEX_SUFFIX) and (not name[:20].isdigit() or int(name[:20]) not in bases_with_log):
            _remove(os.path.join(directory, name))

    # 3. Segments.
    present = set(names)
    bases = sorted(b for b in bases_with_log if b is not None)
    segments: list[LogSegment] = []
    recover_from = None
    if not had_clean_shutdown and bases:
        floor = [b for b in bases if b <= recovery_point]
        recover_from = floor[-1] if floor else bases[0]
    truncated_at = None
    aborted = aborted_by_segment(directory, present, bases)  # Kafka's aborted transactions (a broker's segments)
    for i, base in enumerate(bases):
        if progress is not None:
            progress(i, len(bases))
        if truncated_at is not None:  # everything after an invalid byte goes
            for suffix in (LOG_SUFFIX,) + INDEX_SUFFIXES:
                _remove(os.path.join(directory, filename_prefix(base) + suffix))
            continue
        active = i == len(bases) - 1
        try:
            segment, truncated = _load_segment(directory, base, config, clock, files, present, active,
                                               recover_from, recovery_point, aborted=aborted.get(base))
        except (OSError, StorageIOError) as exc:
            # Indexes are derived data: one the disk cannot read, write or fsync (a write-back that failed before
            # the restart reports its error to the first fsync after it) is rebuilt from the .log, in new files.
            log.warning("%s: I/O error loading segment %d (%s); rebuilding its indexes", directory, base, exc)
            for suffix in INDEX_SUFFIXES:
                _remove(os.path.join(directory, filename_prefix(base) + suffix))
            present = set(os.listdir(directory))
            segment, truncated = _load_segment(directory, base, config, clock, files, present, active,
                                               recover_from, recovery_point, rebuild=True,
                                               aborted=aborted.get(base))
        if truncated:
            truncated_at = base
        segments.append(segment)
        if not segment.active:
            segment.release()  # its files open again when read: a store's descriptors follow its use
    if recover_from is not None:
        # A roll whose predecessor lost its tail (a power cut: the new segment's name reached the disk, the last
        # records of the old one did not) leaves an empty segment past a gap. It holds nothing: the log goes on
        # from the recovered end, as if the roll had not happened, so no offset is skipped. (Kafka keeps such a
        # segment, and its offsets then skip the records no fsync acknowledged.) A segment with records is kept.
        while (len(segments) > 1 and segments[-1].size == 0 and segments[-1].base_offset >= recover_from
               and segments[-2].next_offset < segments[-1].base_offset):
            gone = segments.pop()
            log.warning("%s: segment %d is empty and starts past the recovered end %d (a lost tail); removed",
                        directory, gone.base_offset, segments[-1].next_offset)
            gone.close_readonly()
            gone.delete_files()
            truncated_at = gone.base_offset
    if truncated_at is not None and segments and not segments[-1].active:
        segments[-1].become_active(config.segment_index_bytes)
    if segments:
        segments[-1].release()
    if progress is not None:
        progress(len(bases), len(bases))

    if not segments:
        segments.append(open_segment(directory, log_start_offset, config, created_ms=clock.time_ms(),
                                     open_files=files))
    log_end = segments[-1].next_offset
    if log_start_offset > log_end:
        # No log starts past its end: the checkpoint is damaged (a stale one is only ever behind). Trusting it
        # would hide every record, and retention would then delete them as below the log start.
        log.warning("%s: log start offset checkpoint %d is past the log end offset %d; ignored",
                    directory, log_start_offset, log_end)
        log_start_offset = segments[0].base_offset
    start = min(max(log_start_offset, segments[0].base_offset), log_end)
    if had_clean_shutdown:
        recovery_point = log_end
    elif recover_from is not None:
        recovery_point = log_end  # everything from the recovery point was validated and fsynced above
    recovery_point = min(max(recovery_point, start), log_end)
    plog = Log(directory, topic, partition, config, segments, log_start_offset=start, recovery_point=recovery_point,
               clock=clock, log_dir=log_dir, open_files=files)
    # st_mtime's source: the newest record's timestamp, also when a roll left the active segment empty; a log
    # without records gives the time its segment file was written (created). A restart changes neither.
    newest = max(s.max_timestamp for s in segments)
    plog.last_append_ms = newest if newest >= 0 else os.stat(segments[-1].log_path).st_mtime_ns // 1_000_000
    return plog


def _load_segment(directory: str, base: int, config: LogConfig, clock: Clock, files: OpenFiles, present: set,
                  active: bool, recover_from: int | None, recovery_point: int, *, rebuild: bool = False,
                  aborted: AbortedRanges | None = None) -> tuple[LogSegment, bool]:
    """Open the segment at ``base``, recovering it when it holds unflushed data (``recover_from``), when its
    indexes are missing or inconsistent, or with ``rebuild`` (its indexes were removed). ``aborted``: the aborted
    transactions reaching into it (their batches have no lines). Returns it, and whether invalid bytes were cut
    from its end. On an I/O error the segment is closed before the error is raised."""
    prefix = filename_prefix(base)
    indexes_present = all(prefix + s in present for s in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, VIEW_INDEX_SUFFIX))
    index_trouble = rebuild or not indexes_present
    segment = open_segment(directory, base, config, created_ms=clock.time_ms(), active=active, open_files=files)
    segment.aborted = aborted
    segment.has_txn_index = prefix + TXN_INDEX_SUFFIX in present
    try:
        needs_recovery = rebuild or (recover_from is not None and base >= recover_from)
        if not needs_recovery and not indexes_present and segment.size > 0:
            # (Also a segment a Kafka broker wrote: it has no .viewindex, whose entries every read at a position
            # starts from; one built by a scan of the whole segment at each read would be the alternative.)
            log.info("rebuilding missing indexes of %s", segment.log_path)
            needs_recovery = True
        if not needs_recovery:
            try:
                segment.load_state()
            except CorruptRecordError as exc:
                log.warning("%s; rebuilding indexes of %s", exc, segment.log_path)
                needs_recovery = True
            else:
                if not segment.active and not segment.sealed_on_disk():
                    # Rolled, its records flushed, but the roll's index work (trim, the view index's end entry)
                    # lost in a power cut: sealed again now, so nothing (tiering) ever sees a preallocated index.
                    segment.on_become_inactive()
                    segment.flush()
        truncated = 0
        if needs_recovery:
            # The segment holding the recovery point is re-validated from its last flushed index entry only.
            truncated = segment.recover(recovery_point if base == recover_from and not index_trouble else None)
            if truncated:
                log.warning("truncated %d invalid bytes at the end of %s", truncated, segment.log_path)
            if not segment.active:
                segment.on_become_inactive()
            segment.flush()
        return segment, bool(truncated)
    except BaseException:
        segment.close_readonly()
        raise


def _complete_swap(directory: str, swap_name: str, config: LogConfig) -> None:
    """Finish a compaction swap interrupted by a crash: the live segments inside the swap's offset range go,
    then the swap files go live."""
    base = _base_of(swap_name)
    if base is None:
        _remove(os.path.join(directory, swap_name))
        return
    swap = open_segment(directory, base, config, suffix=SWAP_SUFFIX, active=False)
    try:
        names = set(os.listdir(directory))
        swap.has_txn_index = filename_prefix(base) + TXN_INDEX_SUFFIX + SWAP_SUFFIX in names
        # Its view index is rebuilt as the loader would give it: no lines for Kafka's aborted batches (any entry
        # that reaches its offsets; one past its end covers nothing in it).
        txns = [t for n in names if n.endswith(TXN_INDEX_SUFFIX) or n == filename_prefix(base) + TXN_INDEX_SUFFIX
                + SWAP_SUFFIX for t in read_txn_index(os.path.join(directory, n)) if t.last_offset >= base]
        swap.aborted = AbortedRanges(txns) if txns else None
        swap.recover()
        swap.on_become_inactive()
        bases = [_base_of(n) for n in names if n.endswith(LOG_SUFFIX)]
        replaced = [open_segment(directory, b, config, active=False)
                    for b in sorted(b for b in bases if b is not None and base <= b < swap.next_offset)]
        for segment in replaced:  # (their .txnindex files go with them)
            segment.has_txn_index = filename_prefix(segment.base_offset) + TXN_INDEX_SUFFIX in names
        replace_segments(directory, swap, replaced, discard)
    finally:
        swap.close()

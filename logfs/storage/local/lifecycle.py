"""Segment lifecycle: the one place segments are opened or created, and the one swap protocol.

:func:`open_segment` opens (creating if needed) a segment's four files with a log config's index sizes; the
log's roll and truncation, the loader, the cleaner and the cleaner process all call it.

:func:`replace_segments` is the swap that puts one new segment in place of the segments whose offsets it
covers (Kafka's ``LocalLog.replaceSegments``). The cleaner uses it for each cleaned group; the loader uses it
to finish a swap a crash interrupted. The protocol, crash-safe at every step:

  1. the new segment's files are renamed ``.cleaned`` -> ``.swap`` (skipped when recovery found them already
     ``.swap``), ``.log`` first; the ``.log.swap`` rename is the commit point; fsync the directory;
  2. the replaced segments are retired in descending offset order (the cleaner renames them ``.deleted`` and
     unlinks them after ``file.delete.delay.ms``; recovery unlinks them at once);
  3. the new segment's files are renamed ``.swap`` -> live, ``.log`` first; fsync the directory.

A crash before 1 leaves ``.cleaned`` files, which the loader deletes (the swap never happened). From 1 on, the
loader completes the swap: it removes the live segments inside the ``.swap`` segment's offset range (the
cleaned segment always spans the whole range it replaces) and renames the swap live, by this same function.
Since every rename sequence moves the ``.log`` first, a swap index left without its ``.log.swap`` belongs to
a log that already went live, and is renamed live too.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Sequence

from ..checkpoints import fsync_dir
from .index import ViewIndex
from .open_files import OpenFiles
from ..names import ALL_SUFFIXES, filename_prefix
from .segment import SWAP_SUFFIX, LogSegment


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

"""Cleaning in a separate process, so compaction's CPU work never competes with request handling for the GIL.

The cleaner process only reads sealed segments (immutable) and writes ``.cleaned`` files; it never renames or
deletes anything. The parent then swaps each cleaned segment in under the log lock (:meth:`Log.replace_segments`),
skipping a group whose segments retention removed meanwhile. Protocol: one JSON object on stdin, one on stdout.

    parent: {"directory", "bases", "first_dirty", "first_uncleanable", "config", "capacity", "now_ms", "parent"}
    child:  {"end": offset, "groups": [{"old": [base, ...], "base": base, "dropped": n}]}

With ``"mode": "compress"`` the child instead rewrites each of ``bases`` in the topic's codec
(:func:`~logfs.storage.cleaner.compression.write_compressed`), one group per segment.

The child dies with the daemon (``PR_SET_PDEATHSIG``): a pass orphaned by a crash of the daemon could otherwise
go on writing ``.cleaned`` files after the next daemon has loaded the directory, under the names that daemon's
own cleaner writes.

An error of the disk in the child (EIO writing or fsyncing a ``.cleaned`` file, ENOSPC...) reaches the parent as
that errno (exit status 3 and ``{"disk_error": {"errno", "message"}}``), raised as StorageIOError: the runtime
hands it to the directory's failure channel like any other I/O error of a background step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading

from .compaction import CleanableLog, CleanResult, OffsetMap, write_cleaned
from .compression import write_compressed
from ..config import LogConfig
from ..errors import LogfsError, StorageIOError
from ..failure import NOT_DISK_ERRNOS
from ..local.lifecycle import attach_transactions, open_segment
from ..local.log import Log
from ..local.segment import CLEANED_SUFFIX
from ..local.txn_index import AbortedRanges

_DISK_FAILED = 3  # the child's exit status after an error of the disk (its errno in the reply)
_CONFIG_FIELDS = ("segment_bytes", "segment_index_bytes", "index_interval_bytes", "delete_retention_ms",
                  "max_message_bytes", "compression_type", "compression_zstd_level", "compression_lz4_level",
                  "compression_gzip_level")


def clean_in_subprocess(plog: Log, target: CleanableLog, capacity: int, now_ms: int) -> CleanResult:
    """One cleaning pass with the file work in a child process (blocks the calling thread, not the GIL)."""
    with plog.snapshot(sealed_only=True) as snapshot:
        return _clean(plog, snapshot.segments, target, capacity, now_ms)


def _clean(plog: Log, sealed: list, target: CleanableLog, capacity: int, now_ms: int) -> CleanResult:
    config = plog.config
    request = {
        "directory": plog.directory,
        "bases": [s.base_offset for s in sealed],
        "first_dirty": target.first_dirty,
        "first_uncleanable": target.first_uncleanable,
        "config": {f: getattr(config, f) for f in _CONFIG_FIELDS},
        "capacity": capacity,
        "now_ms": now_ms,
        "parent": os.getpid(),
    }
    reply = _run(request)
    return _swap_in(plog, sealed, reply)


def compress_in_subprocess(plog: Log, segments: list, now_ms: int) -> CleanResult:
    """Rewrite sealed ``segments`` in the topic's codec (:mod:`~logfs.storage.cleaner.compression`) in a child process,
    then swap each in. Blocks the calling thread, not the GIL."""
    request = {
        "mode": "compress",
        "directory": plog.directory,
        "bases": [s.base_offset for s in segments],
        "config": {f: getattr(plog.config, f) for f in _CONFIG_FIELDS},
        "now_ms": now_ms,
        "parent": os.getpid(),
    }
    return _swap_in(plog, segments, _run(request))


def compress_in_thread(plog: Log, segments: list, now_ms: int) -> CleanResult:
    """The same as :func:`compress_in_subprocess` in this process (``LOGFS_CLEANER_MODE=thread``, and tests)."""
    groups = []
    for segment in segments:
        cleaned = write_compressed(plog.directory, plog.config, segment, now_ms)
        groups.append({"old": [segment.base_offset], "base": cleaned.base_offset, "dropped": 0})
        cleaned.close()
    return _swap_in(plog, segments, {"end": segments[-1].next_offset if segments else 0, "groups": groups})


def _run(request: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "logfs.storage.cleaner.process"], input=json.dumps(request),
                          capture_output=True, text=True, check=False)
    if proc.returncode == _DISK_FAILED:
        # The child met an error of the disk: the same error here, for the directory's failure channel (a failing
        # disk takes it offline, a full one is retried), as if this process had met it (CONTRACT section 12).
        failure = json.loads(proc.stdout)["disk_error"]
        raise StorageIOError(f"cleaner process: {failure['message']}", failure["errno"])
    if proc.returncode != 0:
        raise LogfsError(f"cleaner process failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
    return json.loads(proc.stdout)


def _swap_in(plog: Log, sealed: list, reply: dict) -> CleanResult:
    """Swap each segment the child wrote in for the ones it replaces (skipping a group the log lost meanwhile)."""
    before = after = removed = replaced = 0
    by_base = {s.base_offset: s for s in sealed}
    for group in reply["groups"]:
        cleaned = open_segment(plog.directory, group["base"], plog.config, suffix=CLEANED_SUFFIX, active=False,
                               create=False, open_files=plog.open_files)
        old = [by_base[b] for b in group["old"]]
        cleaned.has_txn_index = os.path.exists(cleaned.txn_index_path)  # (the child wrote one: it swaps in too)
        # (the view index the child wrote counts no lines for Kafka's aborted batches: loading checks it so)
        cleaned.aborted = AbortedRanges.union(s.aborted for s in old)
        cleaned.load_state()
        try:
            plog.replace_segments(old, cleaned)
        except LogfsError:
            continue  # the log changed under this group; its .cleaned files are gone, the rest goes on
        before += sum(s.size for s in old)
        after += cleaned.size
        removed += group["dropped"]
        replaced += len(old)
    return CleanResult(reply["end"], replaced, before, after, removed)


def _worker(request: dict) -> dict:
    config = dataclasses.replace(LogConfig(), **request["config"])
    directory = request["directory"]
    segments = []
    # This process reads these segments in one thread: the open-file budget may close any of them while it
    # reads another (they open again when read), so a pass over many segments holds few descriptors.
    owner = threading.RLock()
    try:
        compress = request.get("mode") == "compress"
        for base in request["bases"]:
            # Never created here: retention may have renamed a segment away since the daemon asked (an empty one
            # made in its place would be found by the next start). Gone: not compressed (its group is skipped in
            # the daemon anyway); for compaction the pass fails and is retried.
            try:
                segment = open_segment(directory, base, config, active=False, create=False)
            except FileNotFoundError:
                if compress:
                    continue
                raise
            segments.append(segment)
            segment.owner = owner
        # Kafka's aborted transactions, as the daemon's loader gives them: their batches count no lines in the
        # view indexes, which loading checks against the log, and the rewrites keep or write a .txnindex.
        attach_transactions(directory, segments)
        for segment in segments:
            segment.load_state()
        if compress:
            groups = []
            for segment in segments:
                cleaned = write_compressed(directory, config, segment, request["now_ms"])
                groups.append({"old": [segment.base_offset], "base": cleaned.base_offset, "dropped": 0})
                cleaned.close()
            return {"end": segments[-1].next_offset if segments else 0, "groups": groups}
        end, written = write_cleaned(directory, config, segments, request["first_dirty"],
                                     request["first_uncleanable"], OffsetMap(request["capacity"]),
                                     request["now_ms"])
        groups = []
        for group, cleaned, dropped in written:
            groups.append({"old": [s.base_offset for s in group], "base": cleaned.base_offset, "dropped": dropped})
            cleaned.close()
        return {"end": end, "groups": groups}
    finally:
        for segment in segments:  # read-only use: release without trimming or touching the files
            segment.close_readonly()


def _die_with_parent() -> None:
    """SIGKILL this process when the daemon that started it dies (Linux)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _die_with_parent()
    request = json.load(sys.stdin)
    if request.get("parent") not in (None, os.getppid()):  # the daemon died before the line above
        sys.exit("the daemon that started this cleaning pass is gone")
    try:
        reply = _worker(request)
    except (OSError, StorageIOError) as exc:
        code = getattr(exc, "errno", None)
        if code is None or code in NOT_DISK_ERRNOS:  # (a segment retention took meanwhile: the pass is retried)
            raise
        json.dump({"disk_error": {"errno": code, "message": str(exc)}}, sys.stdout)
        sys.exit(_DISK_FAILED)
    json.dump(reply, sys.stdout)

"""A disk that fails (issue 30, CONTRACT section 12): random fault runs, and a crash-point suite for every multi-file
protocol, with a real logfs daemon over faultfs (logfs/testing/faultfs.py).

**Random run** (:func:`test_random_disk_faults`). Four topics: ``multi`` (two writers on one partition), ``keyed``
(compacted, keyed lines), ``ret`` (``retention.bytes``), ``zstd`` (``compression.type=zstd``: sealed segments are
rewritten in the background by the cleaner's swap); 16 KiB segments, a retention check every 100 ms and a cleaner
backoff of 50 ms, so rolls, retention, compaction and compression rewrites run all the time. Each round, writer
processes (rel_helpers.WRITER: ``s N`` once an fsync() covering line N returned 0) append; a fault window then
fails calls of the daemon's DATA_DIR at random (seeded probability rules: EIO and ENOSPC, now and then EROFS,
EFBIG, EINVAL or EDQUOT, on writes, fsyncs, renames, unlinks, creates, truncates, reads...); the faults are
cleared; the daemon is killed with -9 or unmounted cleanly; and the remount must come up on its FIRST start. Then:

- every line whose fsync() returned 0 is there exactly once, in its writer's order, and no line appears that no
  writer wrote (each line is self-checking: rel_helpers.parse_line);
- a line a previous remount showed is still there at the same offset (unless retention or compaction removed it);
- writers saw only EIO or ENOSPC from the disk (ENOTCONN/ECONNABORTED once the test killed the daemon);
- the daemon never died on its own, and never logged a traceback or an "internal error".

SHORT runs a few rounds, LONG (``LOGFS_LONG=1``) 30.

**Crash points** (:func:`test_crash_points`). For each multi-file protocol, the Nth call of its syscalls (counted
on a path pattern, deterministic: faultfs's ``nth``) fails, once, for every N the protocol makes (a fault-free
calibration run counts them); then the daemon is killed with -9 right after the fault, or unmounted cleanly once
it reacted; the fault is cleared; the remount must come up on its first start; the log must be a valid prefix with
every fsync-acknowledged line once, in order (a compacted one: the latest acknowledged value of every key, each
offset once, increasing across segments, parsed from the ``.log`` files by kafka-python after a clean unmount);
an EIO (unmount variant) must have taken the directory offline: another partition answers EIO. Protocols: the
cleaner's swap and the compression rewrite's swap (``.cleaned`` -> ``.swap`` -> live, the replaced segments ->
``.deleted``), retirement to ``.deleted`` (retention), the unlink of ``.deleted`` files, a roll (the new segment's
four files, the old one's index trims), the undo of an append that met a full disk (truncations of the ``.log``
and its indexes), a clean shutdown (index trims, checkpoints, the clean-shutdown marker), and a partition deletion
(the directory renamed ``-delete``, the topics file and checkpoints, the directory's removal). SHORT runs a
seeded sample of (N, kill or unmount, errno) per protocol (``LOGFS_SEED`` picks another), LONG all of them. A crash
point that fails by an engine bug listed in KNOWN_BUGS is counted, not failed: each such bug has a test of its own
below, a strict xfail until it is fixed.

**fsync** (:func:`test_no_fsync_succeeds_after_a_failed_one`): after an injected fsync failure on a ``.log``,
no later fsync of that partition returns 0 (also once the disk is healthy again) until a remount, and after the
remount what the failed fsync covered is there once or not at all.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from rel_helpers import (
    MountError, counts, expect_errno, make_line, mounted_at, parse_line, parse_partition_dir_records, read_checkpoint_file,
    record_stats, scale, start_writer, stop_writers, wait_for,
)

# Logged as ERRORs by design: a directory taken offline (storage/failure.py, the manager at shutdown), a request
# the disk failed or refused (fuse/errors.py), a clean shutdown the disk cut short, and pyfuse3's note that the
# kernel had dropped the request it answered (a reader killed with its mount, at a crash point).
pytestmark = [pytest.mark.mount, pytest.mark.daemon_errors(
    "is offline", "was offline", "Input/output error", "No space left on device", "Disk quota exceeded",
    "clean shutdown of .* incomplete", r"fuse_reply_\* failed with No such file or directory")]

SEED = int(os.environ.get("LOGFS_SEED", "30"))
DISK_ERRNOS = {errno.EIO, errno.ENOSPC}
# What a writer may see once the test killed the daemon (a FUSE connection gone).
KILLED_ERRNOS = {errno.ENOTCONN, errno.ECONNABORTED}
KEYS = 16  # distinct keys per writer on compacted topics


# -- shared helpers --------------------------------------------------------------------------------------------
def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


def _mount_first_start(fs, options, what: str) -> None:
    """Mount once: it must come up on its first start (the daemon's stderr of this start in the message)."""
    mark = len(fs.stderr())
    try:
        fs.mount(*options, foreground=True)
    except MountError as exc:
        raise AssertionError(f"{what}: the remount did not come up on its first start "
                             f"({str(exc).splitlines()[0][:200]}); daemon stderr of this start:\n"
                             f"{_tail(fs.stderr()[mark:])}") from None


def _assert_alive(fs, what: str) -> None:
    proc = fs.proc
    if proc is None or proc.poll() is not None:
        raise AssertionError(f"{what}: the daemon died (exit status {None if proc is None else proc.returncode}) "
                             f"without being killed; its stderr:\n{_tail(fs.stderr())}")


def _problems(text: str) -> list[str]:
    """Lines of a daemon's stderr that show a bug rather than a disk error."""
    return [line for line in text.splitlines() if "Traceback" in line or "internal error" in line]


def _faults_total(ff) -> int:
    return sum(v["faults"] for v in ff.stats()["ops"].values())


def _rule(ff, rule_id: int) -> dict | None:
    for r in ff.stats()["rules"]:
        if r["id"] == rule_id:
            return r
    return None


def _stable_view(fs, rel: str) -> tuple[bytes, int, int]:
    """(content, log start offset, log end offset) of a partition, read while nothing moved (retention or the
    cleaner may still be at work right after a mount)."""
    last = None
    for _ in range(200):
        lso, leo = int(fs.getx(rel, "log_start_offset")), int(fs.getx(rel, "log_end_offset"))
        content = fs.read(rel)
        now = (content, lso, leo)
        if (int(fs.getx(rel, "log_start_offset")), int(fs.getx(rel, "log_end_offset"))) == (lso, leo) \
                and now == last:
            return now
        last = now
        time.sleep(0.05)
    raise AssertionError(f"{rel}: no stable view in 200 reads")


def _lines_of(content: bytes, rel: str) -> list[bytes]:
    assert content == b"" or content.endswith(b"\n"), f"{rel}: a partial line is served: {content[-80:]!r}"
    return content.split(b"\n")[:-1]


def _record_line(key: bytes | None, value: bytes | None) -> bytes:
    return (key + b"=" + value) if key is not None else value


# ================================================================================================================
# 1. The random run
# ================================================================================================================
RUN_OPTIONS = [
    "num.partitions=1", "log.segment.bytes=16384", "log.index.interval.bytes=1024",
    "log.retention.check.interval.ms=100", "log.cleaner.backoff.ms=50", "log.cleaner.min.cleanable.ratio=0.05",
    "log.segment.delete.delay.ms=100", "log.flush.offset.checkpoint.interval.ms=200",
]
# topic -> (its settings, writers per round, keyed)
RUN_TOPICS = {
    "multi": ({}, 2, False),
    "keyed": ({"cleanup.policy": "compact", "logfs.key.separator": "="}, 1, True),
    "ret": ({"retention.bytes": "20000"}, 1, False),
    "zstd": ({"compression.type": "zstd"}, 1, False),
}
# The operations a fault window fails, and the errnos: mostly EIO and ENOSPC, now and then one a disk may say
# that means something else on a logfs file (writers must still see EIO).
DATA_OPS = ["write", "fsync", "rename", "unlink", "create", "mkdir", "setattr", "read", "open", "fsyncdir"]
STEP_OPS = ["rename", "unlink", "create", "setattr", "fsyncdir", "fsync"]  # the steps of multi-file protocols
ODD_ERRNOS = ["EROFS", "EFBIG", "EINVAL", "EDQUOT"]


@dataclass
class RunWriter:
    """A writer of the run, across rounds (its process ran in one round)."""
    run: object  # rel_helpers.WriterRun
    topic: str
    round: int
    keys: int


@dataclass
class RunPartition:
    topic: str
    keyed: bool
    retention: bool
    writers: list = field(default_factory=list)  # RunWriter, oldest first
    known: dict = field(default_factory=dict)  # (writer, seq) -> offset of lines a remount showed


def _fault_window_rules(ff, rng, kind: str) -> list[int]:
    """Add the random fault rules of one window; returns their ids."""
    ids = []
    seed = rng.randrange(1 << 30)
    if kind == "mixed":
        p = rng.uniform(0.0005, 0.01)
        ids.append(ff.fail(DATA_OPS, "", errno="EIO", probability=p, seed=seed))
        ids.append(ff.fail(["write", "create", "setattr", "mkdir", "fsync", "rename"], "", errno="ENOSPC",
                           probability=p, seed=seed + 1))
        ids.append(ff.fail(DATA_OPS, "", errno=rng.choice(ODD_ERRNOS), probability=p / 4, seed=seed + 2))
    elif kind == "space":  # a full disk: the directory stays online (mostly), appends work again after it
        p = rng.uniform(0.002, 0.03)
        ids.append(ff.fail(["write", "create", "setattr", "mkdir"], "", errno="ENOSPC", probability=p, seed=seed))
        ids.append(ff.fail(["write", "create"], "", errno="EDQUOT", probability=p / 4, seed=seed + 1))
    elif kind == "steps":  # the steps of rolls, retention, swaps and deletions, often
        p = rng.uniform(0.02, 0.15)
        ids.append(ff.fail(STEP_OPS, r"\.(log|index|timeindex|viewindex)(\.\w+)?$|^[^/]*-\d+$",
                           errno=rng.choice(["EIO", "EIO", "ENOSPC"]), probability=p, seed=seed))
        ids.append(ff.fail(STEP_OPS, "", errno=rng.choice(ODD_ERRNOS), probability=p / 10, seed=seed + 1))
    elif kind == "lookups":  # path resolution and stat failing (an exists() check must not mistake EIO for "no")
        p = rng.uniform(0.002, 0.02)
        ids.append(ff.fail(["lookup", "getattr"], r"-\d+/", errno="EIO", probability=p, seed=seed))
        ids.append(ff.fail(STEP_OPS, "", errno="EIO", probability=p, seed=seed + 1))
    else:
        raise ValueError(kind)
    return ids


def _writer_errnos(w) -> list[int]:
    return [int(e.split()[0]) for e in w.errors]


def _verify_run_partition(fs, part: RunPartition, what: str) -> dict:
    """The checks after a remount, for one partition, against every writer it ever had."""
    rel = f"{part.topic}/0"
    content, lso, leo = _stable_view(fs, rel)
    lines = _lines_of(content, rel)
    keys = KEYS if part.keyed else 0
    ids = [parse_line(line, keys=keys) for line in lines]  # AssertionError for a line no writer wrote
    assert len(set(ids)) == len(ids), (
        f"{what}: {rel}: {len(ids) - len(set(ids))} duplicated lines, e.g. "
        f"{[i for i in ids if ids.count(i) > 1][:5]}")
    index_of = {ident: i for i, ident in enumerate(ids)}
    by_name = {w.run.name: w for w in part.writers}
    for ident in ids:
        assert ident[0] in by_name, f"{what}: {rel}: line {ident} of a writer that never wrote here"
    # A round's lines all come after the previous rounds' lines.
    rounds = [by_name[w].round for w, _ in ids]
    assert rounds == sorted(rounds), f"{what}: {rel}: lines of an earlier round after a later round's"

    # Offsets: contiguous from the log start; on the compacted topic the line of seq N of a writer (alone on
    # its partition) is at its open-time log end offset + N.
    if part.keyed:
        offsets = [by_name[w].run.start_leo + s for w, s in ids]
        assert offsets == sorted(set(offsets)), f"{what}: {rel}: offsets not strictly increasing"
        if offsets:
            assert offsets[-1] < leo, f"{what}: {rel}: last line at offset {offsets[-1]}, log end {leo}"
    else:
        assert leo - lso == len(lines), f"{what}: {rel}: log end {leo} - log start {lso} != {len(lines)} lines"
        offsets = [lso + i for i in range(len(lines))]

    latest: dict[tuple[str, int], int] = {}
    if part.keyed:
        for w, s in ids:
            latest[(w, s % KEYS)] = max(latest.get((w, s % KEYS), -1), s)

    def superseded(w: str, s: int) -> bool:
        return part.keyed and latest.get((w, s % KEYS), -1) > s

    # What an earlier remount showed is still there, at the same offset.
    for ident, off in part.known.items():
        if ident in index_of:
            got = offsets[index_of[ident]]
            assert got == off, f"{what}: {rel}: line {ident} moved from offset {off} to {got}"
        elif part.keyed:
            assert superseded(*ident), f"{what}: {rel}: line {ident} (offset {off}, shown by an earlier remount) " \
                                       f"lost without a later value of its key"
        else:
            assert part.retention and off < lso, (
                f"{what}: {rel}: line {ident} at offset {off}, shown by an earlier remount, is gone "
                f"(log start {lso})")

    first_round = by_name[ids[0][0]].round if ids else None
    synced_total = 0
    for w in part.writers:
        run = w.run
        seqs = [s for (name, s) in ids if name == run.name]
        assert seqs == sorted(seqs), f"{what}: {rel}: {run.name}'s lines out of order"
        synced_total += run.synced + 1
        if part.keyed:
            # the last fsync-acknowledged value of every key, or a later value of it
            for s in range(max(0, run.synced - KEYS + 1), run.synced + 1):
                assert (run.name, s) in index_of or superseded(run.name, s), (
                    f"{what}: {rel}: fsync-acknowledged line {s} of {run.name} lost (no later value of its key; "
                    f"present: {seqs[:3]}..{seqs[-3:]})")
            continue
        if seqs:
            assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"{what}: {rel}: a hole in {run.name}'s lines"
        retained_away = part.retention and first_round is not None and w.round <= first_round
        if seqs and seqs[0] > 0:
            assert retained_away and ids[0] == (run.name, seqs[0]), (
                f"{what}: {rel}: {run.name}'s first {seqs[0]} lines lost (log start {lso})")
        if run.synced >= 0:
            if not seqs:
                assert part.retention and (first_round is None or w.round < first_round) and lso > 0, (
                    f"{what}: {rel}: all {run.synced + 1} fsync-acknowledged lines of {run.name} lost")
                continue
            assert seqs[-1] >= run.synced, (
                f"{what}: {rel}: fsync-acknowledged lines {seqs[-1] + 1}..{run.synced} of {run.name} lost "
                f"(present up to {seqs[-1]})")
    for i, ident in enumerate(ids):
        part.known[ident] = offsets[i]
    if part.keyed:  # superseded values may go at the next cleaning: forget them
        part.known = {i: o for i, o in part.known.items() if i in index_of}
    return {"lines": len(lines), "synced": synced_total}


def _verify_run_on_disk(lower: Path, parts: dict[str, RunPartition], what: str) -> int:
    """After a clean unmount: every partition's .log files parse (kafka-python: CRCs, no trailing bytes, offsets
    increasing across segments), hold only lines writers wrote, at the offsets the mount showed."""
    starts = read_checkpoint_file(str(lower / "log-start-offset-checkpoint"))
    checked = 0
    for topic, part in parts.items():
        records = parse_partition_dir_records(str(lower / f"{topic}-0"))
        lso = starts.get((topic, 0), 0)
        live = [(o, k, v) for o, k, v in records if o >= lso]
        if not part.keyed:
            offsets = [o for o, _, _ in live]
            assert offsets == list(range(lso, lso + len(offsets))), f"{what}: {topic}-0: offsets on disk not contiguous"
        for o, k, v in live:
            ident = parse_line(_record_line(k, v), keys=KEYS if part.keyed else 0)
            known = part.known.get(ident)
            assert known is None or known == o, f"{what}: {topic}-0: {ident} at offset {o} on disk, {known} mounted"
            checked += 1
    return checked


def test_random_disk_faults(faultfs, mount_logfs, tmp_path, profile):
    rng = random.Random(SEED)
    rounds = scale(3, 30)
    window = scale(2.0, 4.0)
    fs = mount_logfs(*RUN_OPTIONS, name=".", foreground=True)
    lower = faultfs.source
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    parts: dict[str, RunPartition] = {}
    for topic, (settings, _, keyed) in RUN_TOPICS.items():
        os.mkdir(fs.path(topic))
        for key, value in settings.items():
            os.setxattr(fs.path(topic), f"user.logfs.config.{key}", value.encode())
        parts[topic] = RunPartition(topic, keyed, "retention.bytes" in settings)
    stats = {"rounds": 0, "kills": 0, "clean_unmounts": 0, "faults_injected": 0, "writers": 0,
             "writers_failed": 0, "writer_errors_eio": 0, "writer_errors_enospc": 0, "lines_fsync_acked": 0,
             "lines_verified": 0, "records_checked_on_disk": 0, "rounds_offline": 0, "lost": 0}
    kinds: dict[str, int] = {}
    mark = 0
    try:
        for rnd in range(rounds):
            what = f"round {rnd} (seed {SEED})"
            writers = []
            for topic, (_, count, keyed) in RUN_TOPICS.items():
                for i in range(count):
                    run = start_writer(fs, f"{topic}/0", f"r{rnd}{topic}{i}", ack_dir, seed=rng.randrange(1 << 30),
                                       keys=KEYS if keyed else 0, mode="lines", fsync_every=rng.choice([2, 4, 8]))
                    w = RunWriter(run, topic, rnd, KEYS if keyed else 0)
                    parts[topic].writers.append(w)
                    writers.append(w)
            stats["writers"] += len(writers)
            wait_for(lambda: all(w.run.collect().start_leo is not None or w.run.proc.poll() is not None
                                 for w in writers), 30, what="the writers to open their partitions")
            for w in writers:
                assert w.run.start_leo is not None, f"{what}: writer {w.run.name} could not open: {w.run.errors}"
            time.sleep(rng.uniform(1.0, 1.5))  # rolls, retention, cleaning and compression under way

            kind = rng.choice(["mixed", "mixed", "space", "steps", "lookups"])
            kinds[kind] = kinds.get(kind, 0) + 1
            before = _faults_total(faultfs)
            rules = _fault_window_rules(faultfs, rng, kind)
            time.sleep(window)
            faultfs.clear()
            stats["faults_injected"] += _faults_total(faultfs) - before
            time.sleep(rng.uniform(0.2, 0.6))
            _assert_alive(fs, f"{what}, after a fault window ({kind}, rules {rules})")

            # Errors the writers met from the disk (the ones that saw one have stopped).
            for w in writers:
                w.run.collect()
                bad = [e for e in _writer_errnos(w.run) if e not in DISK_ERRNOS]
                assert not bad, f"{what}: writer {w.run.name} saw {w.run.errors}: only EIO or ENOSPC may reach it"
            kill = rng.random() < 0.5
            if kill:
                fs.kill9()  # writers still running get ENOTCONN/ECONNABORTED
                stats["kills"] += 1
                stop_writers([w.run for w in writers])
            else:
                for w in writers:  # stop them first (an open file keeps the mount busy)
                    if w.run.proc.poll() is None:
                        w.run.proc.terminate()
                stop_writers([w.run for w in writers])
                fs.unmount()
                stats["clean_unmounts"] += 1
            for w in writers:
                codes = _writer_errnos(w.run)
                allowed = DISK_ERRNOS | (KILLED_ERRNOS if kill else set())
                assert all(c in allowed for c in codes), f"{what}: writer {w.run.name} saw {w.run.errors}"
                stats["writers_failed"] += bool(codes and codes[0] in DISK_ERRNOS)
                stats["writer_errors_eio"] += codes.count(errno.EIO)
                stats["writer_errors_enospc"] += codes.count(errno.ENOSPC)
            err = fs.stderr()
            stats["rounds_offline"] += "is offline" in err[mark:]
            assert not _problems(err[mark:]), f"{what}: the daemon logged a bug:\n{_tail(err[mark:])}"
            mark = len(err)

            _mount_first_start(fs, RUN_OPTIONS, f"{what}, after {'kill -9' if kill else 'a clean unmount'}")
            for part in parts.values():
                got = _verify_run_partition(fs, part, f"{what}, {'kill -9' if kill else 'clean unmount'}")
                stats["lines_verified"] += got["lines"]
            stats["rounds"] += 1
        stats["lines_fsync_acked"] = sum(w.run.synced + 1 for p in parts.values() for w in p.writers)
        fs.unmount()
        stats["records_checked_on_disk"] += _verify_run_on_disk(lower, parts, "after the last round")
        err = fs.stderr()
        assert not _problems(err), _tail(err)
        assert not _problems(faultfs.output()), _tail(faultfs.output())
    finally:
        err = fs.stderr()
        stats.update(counts(err, cleaning_passes=" cleaned keyed-0", compressions=" of zstd-0:",
                            retention_deletions="retention deleted", offline_logged="is offline:"))
        stats.update({f"windows_{k}": v for k, v in kinds.items()})
        record_stats("disk_fault_runs[random]", **stats)
    assert stats["faults_injected"] > 0, "no fault was injected: the run tests nothing"
    assert stats["cleaning_passes"] and stats["compressions"] and stats["retention_deletions"], (
        f"the background work did not run: {stats}")


# ================================================================================================================
# 2. Crash points of the multi-file protocols
# ================================================================================================================
PROBE = "probe"  # a partition no protocol touches: offline or not, it tells
CRASH_OPTIONS = [
    "num.partitions=1", "log.cleaner.backoff.ms=50", "log.retention.check.interval.ms=100",
    "log.segment.delete.delay.ms=200", "log.flush.offset.checkpoint.interval.ms=3600000",
]


class Stream:
    """The lines one test writer appended to one partition, chunk by chunk: which write() returned, and which an
    fsync() that returned 0 covered."""

    def __init__(self, path: str, name: str, keys: int = 0):
        self.path, self.name, self.keys = path, name, keys
        self.seq = 0
        self.chunks: list[list] = []  # [first seq, end seq, "acked" | "written" | errno of the failed write]
        self.errors: list[int] = []
        self.deleted = False  # (partition-delete: the unlink of the partition returned 0)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def write(self, n: int) -> bool:
        chunk = [self.seq, self.seq + n, "written"]
        buf = b"".join(make_line(self.name, s, self.keys) + b"\n" for s in range(self.seq, self.seq + n))
        self.seq += n
        self.chunks.append(chunk)
        try:
            done = os.write(self.fd, buf)
        except OSError as exc:
            chunk[2] = exc.errno
            self.errors.append(exc.errno)
            return False
        assert done == len(buf), (done, len(buf))
        return True

    def fsync(self) -> bool:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            self.errors.append(exc.errno)
            return False
        for chunk in self.chunks:
            if chunk[2] == "written":
                chunk[2] = "acked"
        return True

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError as exc:
                self.errors.append(exc.errno)
            self.fd = None

    @property
    def acked(self) -> int:
        return sum(c[1] - c[0] for c in self.chunks if c[2] == "acked")


def _check_stream(stream: Stream, ids: list[tuple[str, int]], what: str, *, compacted: bool = False,
                  retained: bool = False) -> None:
    """The lines present (in order) against what ``stream`` wrote: each once, in order; every fsync-acknowledged
    line there (unless retention removed a prefix, or a later value of its key replaced it); of a chunk not
    acknowledged, a prefix or nothing, and nothing after a chunk present in part; nothing of a write() that
    failed with ENOSPC once a later write() was appended (it was undone)."""
    seqs = [s for w, s in ids]
    assert all(w == stream.name for w, _ in ids), f"{what}: lines of another writer: {ids[:5]}"
    assert seqs == sorted(set(seqs)), (
        f"{what}: lines duplicated or out of order: {[s for i, s in enumerate(seqs) if i and s <= seqs[i - 1]][:10]}")
    present = set(seqs)
    if compacted:
        latest: dict[int, int] = {}
        for s in seqs:
            latest[s % stream.keys] = max(latest.get(s % stream.keys, -1), s)
        for first, end, state in stream.chunks:
            if state == "acked":
                lost = [s for s in range(first, end) if s not in present and latest.get(s % stream.keys, -1) <= s]
                assert not lost, f"{what}: fsync-acknowledged lines {lost[:10]} lost without a later value of their key"
        return
    first_present = seqs[0] if seqs else None
    later_present = False
    for first, end, state in reversed(stream.chunks):
        mine = [s for s in seqs if first <= s < end]
        if state == "acked":
            expected = list(range(first, end))
            if retained and first_present is not None:
                expected = [s for s in expected if s >= first_present]
            if retained and first_present is None:
                expected = []
            assert mine == expected, (
                f"{what}: fsync-acknowledged lines {sorted(set(expected) - set(mine))[:10]} of {first}..{end - 1} "
                f"lost (present: {mine[:3]}..{mine[-3:]})")
        else:
            start = first if not (retained and mine and mine[0] == first_present) else mine[0]
            assert mine == list(range(start, start + len(mine))), (
                f"{what}: lines of the unacknowledged write {first}..{end - 1} ({state}) present with holes: {mine}")
            if mine and len(mine) < end - start:
                assert not later_present, f"{what}: write {first}..{end - 1} present in part, and later lines too"
            if state == errno.ENOSPC and later_present:
                assert not mine, (f"{what}: lines {mine[:5]}.. of a write() that failed with ENOSPC are present, "
                                  f"and later writes were appended: it was not undone")
        later_present = later_present or bool(mine)


@dataclass
class Scenario:
    protocol: str
    nth: int
    variant: str  # "kill" | "unmount"
    errno: str

    @property
    def name(self) -> str:
        return f"{self.protocol}: call {self.nth} fails with {self.errno}, then {self.variant}"


@dataclass
class Protocol:
    """One multi-file protocol: how to set a partition up, which calls make it (ops on a path pattern), how to
    start it, and when it is over."""
    name: str
    settings: dict
    ops: list
    path: Callable[[str], str]  # the partition directory's name -> the pattern its calls match
    setup: Callable  # (ctx, topic, settings) -> Stream (its lines fsync-acknowledged)
    trigger: Callable  # (ctx, topic, stream) -> None: starts the protocol (may make syscalls that fail)
    done: Callable  # (ctx, topic, mark) -> bool: the protocol has finished (calibration)
    keyed: bool = False
    retained: bool = False
    after: Callable | None = None  # (ctx, topic, stream): more appends once the fault passed (unmount variant)
    extra_rules: Callable | None = None  # (ctx, d) -> rule ids added before the scenario's rule
    at_unmount: bool = False  # the unmount is the trigger (a clean shutdown)
    deletion: bool = False


@dataclass
class Ctx:
    fs: object
    ff: object
    lower: Path
    stream: Stream | None = None  # the scenario's writer (its descriptor keeps a mount busy)


def _write_lines(stream: Stream, n: int, chunk: int = 10) -> None:
    for start in range(0, n, chunk):
        assert stream.write(min(chunk, n - start)), f"setup write failed: {stream.errors}"
    assert stream.fsync(), f"setup fsync failed: {stream.errors}"


def _setup_lines(n: int, keys: int = 0):
    def setup(ctx: Ctx, topic: str) -> Stream:
        stream = Stream(ctx.fs.path(topic, 0), "s", keys)
        _write_lines(stream, n)
        return stream

    return setup


def _setup_almost_full(ctx: Ctx, topic: str) -> Stream:
    """Lines until the active segment is within a chunk of its segment.bytes (4096): the next chunk rolls."""
    stream = Stream(ctx.fs.path(topic, 0), "s")
    d = ctx.lower / f"{topic}-0"
    while True:
        _write_lines(stream, 3, 3)
        active = max(n for n in os.listdir(d) if n.endswith(".log"))
        if os.path.getsize(d / active) > 4096 - 700:
            return stream


def _setxattr(name: str, value: str):
    def trigger(ctx: Ctx, topic: str, stream: Stream) -> None:
        os.setxattr(ctx.fs.path(topic), f"user.logfs.config.{name}", value.encode())

    return trigger


def _logged(pattern: str):
    def done(ctx: Ctx, topic: str, mark: int) -> bool:
        return re.search(pattern.format(d=re.escape(f"{topic}-0")), ctx.fs.stderr()[mark:]) is not None

    return done


def _trigger_roll(ctx: Ctx, topic: str, stream: Stream) -> None:
    if stream.write(10):
        stream.fsync()


def _after_appends(ctx: Ctx, topic: str, stream: Stream) -> None:
    """Once the fault passed: appends go on (a full disk), or answer EIO (an offline directory)."""
    if stream.write(5):
        stream.fsync()


def _trigger_undo(ctx: Ctx, topic: str, stream: Stream) -> None:
    """One write() of several batches across a roll, whose second .log write meets a full disk: the batches
    already written are taken back (truncations of the .log and its indexes, the rolled segment retired)."""
    stream.write(120)
    stream.fsync()


def _undo_rules(ctx: Ctx, d: str) -> list[int]:
    return [ctx.ff.fail("write", rf"^{re.escape(d)}/.*\.log$", errno="ENOSPC", nth=2)]


def _trigger_delete(ctx: Ctx, topic: str, stream: Stream) -> None:
    stream.close()
    try:
        os.unlink(ctx.fs.path(topic, 0))
        stream.deleted = True
    except OSError as exc:
        stream.errors.append(exc.errno)
        stream.deleted = False


def _deletion_done(ctx: Ctx, topic: str, mark: int) -> bool:
    return not any(n.startswith(f"{topic}-0") for n in os.listdir(ctx.lower))


def _purge_done(ctx: Ctx, topic: str, mark: int) -> bool:
    return (_logged(r"retention deleted \d+ segment\(s\) of {d};")(ctx, topic, mark)
            and not any(n.endswith(".deleted") for n in os.listdir(ctx.lower / f"{topic}-0")))


def _in_dir(extra: str = ""):
    return lambda d: rf"^{re.escape(d)}(/{extra}|$)"


SWAP_OPS = ["create", "setattr", "fsync", "rename", "fsyncdir"]
PROTOCOLS = {p.name: p for p in [
    # The cleaner's swap: .cleaned files written (create, truncate, fsync), renamed .swap (the .log's rename is
    # the commit point), the replaced segments renamed .deleted, the .swap files renamed live, the directory
    # fsynced after each stage.
    Protocol("cleaner-swap", {"cleanup.policy": "compact", "logfs.key.separator": "=", "segment.bytes": "4096",
                              "min.compaction.lag.ms": "3600000"},
             SWAP_OPS, lambda d: rf"^{re.escape(d)}/.*\.(cleaned|swap|deleted)$|^{re.escape(d)}$",
             _setup_lines(200, KEYS), _setxattr("min.compaction.lag.ms", "0"),
             _logged(r" cleaned {d} up to offset"), keyed=True),
    # The compression rewrite: the same swap, one per sealed segment.
    Protocol("compression-swap", {"segment.bytes": "4096"},
             SWAP_OPS, lambda d: rf"^{re.escape(d)}/.*\.(cleaned|swap|deleted)$|^{re.escape(d)}$",
             _setup_lines(200), _setxattr("compression.type", "zstd"), _logged(r"segment\(s\) of {d}:")),
    # Retention: each sealed segment's four files renamed .deleted (on disk first, then out of the list).
    Protocol("retention-retire", {"segment.bytes": "4096", "file.delete.delay.ms": "60000"},
             ["rename", "fsyncdir"], lambda d: rf"^{re.escape(d)}/.*\.deleted$|^{re.escape(d)}$",
             _setup_lines(250), _setxattr("retention.bytes", "1"),
             _logged(r"retention deleted \d+ segment\(s\) of {d};"), retained=True, after=_after_appends),
    # Deletion: the .deleted files unlinked after file.delete.delay.ms.
    Protocol("deleted-unlink", {"segment.bytes": "4096", "file.delete.delay.ms": "200"},
             ["unlink"], lambda d: rf"^{re.escape(d)}/.*\.deleted$",
             _setup_lines(250), _setxattr("retention.bytes", "1"), _purge_done, retained=True,
             after=_after_appends),
    # A roll: the new segment's four files created (and their indexes sized), the old one sealed (its time and
    # view index end entries written, its indexes trimmed), the batch appended, the fsync after it.
    Protocol("roll", {"segment.bytes": "4096", "index.interval.bytes": "512"},
             ["create", "setattr", "write", "fsync", "unlink", "rename", "fsyncdir"], _in_dir(),
             _setup_almost_full, _trigger_roll, lambda ctx, topic, mark: True, after=_after_appends),
    # The undo of an append a full disk stopped half way: the .log and its indexes truncated back, the segment
    # the append rolled to retired.
    Protocol("append-undo", {"segment.bytes": "8192", "index.interval.bytes": "256"},
             ["setattr", "write", "create", "unlink", "rename", "fsync", "fsyncdir"], _in_dir(),
             _setup_lines(60), _trigger_undo, lambda ctx, topic, mark: True, after=_after_appends,
             extra_rules=_undo_rules),
    # A clean shutdown: the active segment's indexes trimmed (and its view index end entry), everything fsynced,
    # the checkpoints and the clean-shutdown marker written.
    Protocol("shutdown", {"segment.bytes": "8192", "index.interval.bytes": "256"},
             ["setattr", "write", "fsync", "create", "rename", "fsyncdir", "unlink"],
             lambda d: rf"^{re.escape(d)}(/|$)|^[^/]*(?<!-\d)(?<!-\d\d)$",
             _setup_lines(100), None, lambda ctx, topic, mark: True, at_unmount=True),
    # A partition deletion: the topics file kept naming the emptied topic, the directory renamed -delete (the
    # commit point), the directory fsynced, the checkpoints rewritten; later the -delete directory removed.
    Protocol("partition-delete", {"file.delete.delay.ms": "200"},
             ["rename", "fsyncdir", "unlink", "rmdir", "create", "write", "fsync", "setattr"],
             lambda d: rf"^{re.escape(d)}(\.[^/]*-delete)?(/|$)|^[^/]*(?<!-\d)(?<!-\d\d)$",
             _setup_lines(100), _trigger_delete, _deletion_done, deletion=True),
]}


def _scenarios(protocol: str, calls: int, rng: random.Random) -> list[Scenario]:
    """Every (N, variant, errno) under LONG; a seeded sample under SHORT (the first and the last call, one at random
    in each half)."""
    full = []
    for nth in range(1, calls + 1):
        full.append(Scenario(protocol, nth, "kill", "EIO"))
        full.append(Scenario(protocol, nth, "unmount", "EIO"))
        full.append(Scenario(protocol, nth, "kill" if nth % 2 else "unmount", "ENOSPC"))
    if scale(False, True):
        return full
    picks = [Scenario(protocol, 1, "kill", "EIO"), Scenario(protocol, calls, "unmount", "EIO")]
    half = max(2, (calls + 1) // 2)
    picks.append(Scenario(protocol, rng.randrange(1, half), "unmount", "ENOSPC"))  # (in the lower half)
    picks.append(Scenario(protocol, rng.randrange(min(half, calls), calls + 1), rng.choice(["kill", "unmount"]), "EIO"))
    return picks


def _wait_fired(ctx: Ctx, rule_id: int, timeout: float, done: Callable[[], bool] | None = None) -> dict | None:
    """The fault the rule injected, as soon as it is seen; None if the protocol ended (``done``) or the time ran
    out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in ctx.ff.injected():
            if entry["rule"] == rule_id and "errno" in entry:
                return entry
        if done is not None and done():
            time.sleep(0.2)  # (a last look: the fault may come with the protocol's very end)
            for entry in ctx.ff.injected():
                if entry["rule"] == rule_id and "errno" in entry:
                    return entry
            return None
        time.sleep(0.005)
    return None


def _verify_scenario(ctx: Ctx, proto: Protocol, topic: str, stream: Stream, what: str) -> int:
    """After the remount (mounted): the partition through the mount; then a clean unmount and its .log files
    through kafka-python. Returns the lines checked."""
    fs = ctx.fs
    rel = f"{topic}/0"
    if proto.deletion and stream.deleted:
        assert topic in os.listdir(fs.mnt), f"{what}: the emptied topic {topic} is gone"
        assert os.listdir(fs.path(topic)) == [], f"{what}: partition {rel} came back after its deletion returned 0"
        fs.unmount()
        leftovers = [n for n in os.listdir(ctx.lower) if n.startswith(f"{topic}-0")]
        assert not leftovers, f"{what}: {leftovers} left in DATA_DIR"
        return 0
    content, lso, leo = _stable_view(fs, rel)
    lines = _lines_of(content, rel)
    ids = [parse_line(line, keys=stream.keys) for line in lines]
    _check_stream(stream, ids, what, compacted=proto.keyed, retained=proto.retained)
    if not proto.keyed:
        assert leo - lso == len(lines), f"{what}: log end {leo} - log start {lso} != {len(lines)} lines"
    fs.unmount()
    records = parse_partition_dir_records(str(ctx.lower / f"{topic}-0"))
    starts = read_checkpoint_file(str(ctx.lower / "log-start-offset-checkpoint"))
    start = starts.get((topic, 0), 0)
    live = [(o, _record_line(k, v)) for o, k, v in records if o >= start]
    if proto.keyed:
        # Each offset once, increasing (parse_partition_dir_records), and every record where its writer put it:
        # the stream was the partition's only writer from offset 0, and nothing of it was undone.
        disk_ids = []
        for o, line in live:
            ident = parse_line(line, keys=stream.keys)
            assert o == ident[1], f"{what}: line {ident} at offset {o} on disk"
            disk_ids.append(ident)
        _check_stream(stream, disk_ids, what + ", on disk", compacted=True)
        # The cleaner may have run again between the look through the mount and the unmount: it only removes.
        shown = iter(ids)
        assert all(ident in shown for ident in disk_ids), f"{what}: the .log files hold what the mount did not show"
    else:
        assert start == lso, f"{what}: log start offset checkpoint {start}, mounted {lso}"
        assert [o for o, _ in live] == list(range(lso, leo)), f"{what}: offsets on disk are not {lso}..{leo - 1}"
        assert [line for _, line in live] == lines, f"{what}: the .log files differ from what the mount showed"
    # Checked: gone, so that the recoveries of the next crash points do not grow with every one before them
    # (through faultfs, unmounted: files removed behind its back could leave it a stale inode to reuse).
    shutil.rmtree(os.path.join(fs.data, f"{topic}-0"))
    return len(lines)


def _assert_offline(ctx: Ctx, what: str) -> None:
    """An EIO from the disk takes the directory offline (CONTRACT section 12): another partition, which the
    protocol never touched, answers EIO too."""
    try:
        os.getxattr(ctx.fs.path(PROBE, 0), "user.logfs.log_end_offset")
    except OSError as exc:
        assert exc.errno == errno.EIO, f"{what}: {PROBE}/0 answers {errno.errorcode.get(exc.errno)}, not EIO"
    else:
        raise AssertionError(f"{what}: an EIO from the disk did not take the directory offline "
                             f"({PROBE}/0 still answers)")


def _drop_fd(stream: Stream) -> None:
    """Forget the stream's descriptor on a killed mount (its close answers ENOTCONN: not the disk's)."""
    if stream.fd is not None:
        try:
            os.close(stream.fd)
        except OSError:
            pass
        stream.fd = None


def _run_scenario(ctx: Ctx, proto: Protocol, scenario: Scenario | None, topic: str, stats: dict) -> int | None:
    """One run of the protocol on a new topic: with ``scenario``'s fault, or none (calibration: returns the number
    of calls the protocol made). Starts mounted; ends mounted."""
    fs, ff = ctx.fs, ctx.ff
    what = (scenario.name if scenario else f"{proto.name}: calibration (no fault)") + f" [topic {topic}]"
    d = f"{topic}-0"
    os.mkdir(fs.path(topic))
    for key, value in proto.settings.items():
        os.setxattr(fs.path(topic), f"user.logfs.config.{key}", value.encode())
    stream = ctx.stream = proto.setup(ctx, topic)
    mark = len(fs.stderr())
    if proto.extra_rules:
        proto.extra_rules(ctx, d)
    if scenario is None:
        rule = ff.fail(proto.ops, proto.path(d), probability=0.0, seed=0)  # counts the calls, fails none
    else:
        rule = ff.fail(proto.ops, proto.path(d), errno=scenario.errno, nth=scenario.nth)
    kill = scenario is not None and scenario.variant == "kill"
    fired = None
    calls = None
    exit_status = None
    if proto.at_unmount:  # the trigger is the clean shutdown itself
        stream.close()
        _assert_alive(fs, what)
        if kill:  # SIGKILL as soon as the fault is seen, in the middle of the shutdown
            subprocess.run(["fusermount3", "-u", str(fs.mnt)], capture_output=True, timeout=30)
            fired = _wait_fired(ctx, rule, 10, done=lambda: fs.proc.poll() is not None)
            if fs.proc.poll() is None:
                fs.proc.kill()
            fs.proc.wait(30)
            fs.unmount()
        else:
            fs.unmount()
            exit_status = fs.proc.returncode
            fired = _wait_fired(ctx, rule, 0.1)
        calls = _rule(ff, rule)["seen"]
    else:
        proto.trigger(ctx, topic, stream)
        done = lambda: proto.done(ctx, topic, mark)  # noqa: E731
        if scenario is None:
            wait_for(done, 20, what=f"{what}: the protocol to finish")
            time.sleep(0.3)
            calls = _rule(ff, rule)["seen"]
        else:
            fired = _wait_fired(ctx, rule, 20, done=done)
        _assert_alive(fs, what)
        if kill:
            fs.kill9()  # right after the fault
            _drop_fd(stream)
        else:
            time.sleep(0.3)  # the engine's reaction: the directory offline, or the step retried
            if fired and scenario.errno == "EIO":
                _assert_offline(ctx, what + f" (the call: {fired['op']} {fired['path']})")
            if proto.after is not None:
                proto.after(ctx, topic, stream)
            _assert_alive(fs, what)
            stream.close()
            fs.unmount()
            exit_status = fs.proc.returncode
    ff.clear()
    if fired:
        to = f" -> {fired['path2']}" if "path2" in fired else ""
        what += f" (the call: {fired['op']} {fired['path']}{to})"
    elif scenario is not None:
        what += " (the fault was not reached)"
    bad = [e for e in stream.errors if e not in DISK_ERRNOS]
    assert not bad, f"{what}: the test's own syscalls saw {[errno.errorcode.get(e, e) for e in bad]}"
    err = fs.stderr()[mark:]
    assert not _problems(err), f"{what}: the daemon logged a bug:\n{_tail(err)}"
    if scenario is not None:
        stats["scenarios"] += 1
        stats["faults_injected"] += bool(fired)
        stats["not_reached"] += not fired
        stats["kills"] += kill
        stats["offline"] += "is offline" in err
        stats["unclean_exit"] += exit_status not in (None, 0)
    _mount_first_start(fs, CRASH_OPTIONS, what)
    stats["lines_verified"] += _verify_scenario(ctx, proto, topic, stream, what)
    stats["lines_fsync_acked"] += stream.acked
    _mount_first_start(fs, CRASH_OPTIONS, what + ", mounting again after the check")
    return calls


def _back_to_mounted(ctx: Ctx) -> None:
    """After a failed crash point: whatever state it left (mounted, dead, unmounted), faults cleared and a
    daemon serving again (on its second start if need be: the failure is reported already)."""
    fs = ctx.fs
    ctx.ff.clear()
    if ctx.stream is not None:
        _drop_fd(ctx.stream)
    if fs.proc is not None and fs.proc.poll() is None:
        try:
            fs.unmount()
        except TimeoutError:
            fs.proc.kill()
            fs.proc.wait(30)
    if mounted_at(fs.mnt):
        subprocess.run(["fusermount3", "-uz", str(fs.mnt)], capture_output=True, timeout=30)
    try:
        fs.mount(*CRASH_OPTIONS, foreground=True)
    except MountError:
        fs.mount(*CRASH_OPTIONS, foreground=True)


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_crash_points(faultfs, mount_logfs, profile, protocol):
    proto = PROTOCOLS[protocol]
    rng = random.Random(f"{SEED}-{protocol}")
    fs = mount_logfs(*CRASH_OPTIONS, name=".", foreground=True)
    ctx = Ctx(fs, faultfs, faultfs.source)
    stats = {"scenarios": 0, "faults_injected": 0, "not_reached": 0, "kills": 0, "offline": 0, "unclean_exit": 0,
             "lines_verified": 0, "lines_fsync_acked": 0}
    failures: list[str] = []
    known: list[str] = []  # failures of an engine bug in KNOWN_BUGS
    os.mkdir(fs.path(PROBE))
    try:
        calls = _run_scenario(ctx, proto, None, "cal", stats)
        assert calls and calls > 0, f"{protocol}: the calibration run made no call of the protocol"
        stats["calls"] = calls
        for i, scenario in enumerate(_scenarios(protocol, calls, rng)):
            try:
                _run_scenario(ctx, proto, scenario, f"s{i}", stats)
            except AssertionError as exc:
                if _known_bug(protocol, str(exc)):  # reproduced on its own by a strict xfail test below
                    known.append(str(exc))
                else:
                    failures.append(str(exc))
                _back_to_mounted(ctx)  # and on with the next crash point
    finally:
        stats["failed"] = len(failures)
        stats["known_bug"] = len(known)
        record_stats(f"disk_fault_runs[crash:{protocol}]", **stats)
    assert not failures, f"{len(failures)} crash point(s) of {protocol} failed:\n\n" + "\n\n".join(
        f[:3000] for f in failures)
    assert not _problems(faultfs.output()), _tail(faultfs.output())
    assert stats["faults_injected"] > 0, f"{protocol}: no scenario reached its fault: {stats}"


# ================================================================================================================
# 3. No fsync succeeds after a failed one
# ================================================================================================================
@pytest.mark.parametrize("gate", [True, False], ids=["fsyncgate", "pages-kept"])
@pytest.mark.parametrize("variant", ["kill", "unmount"])
def test_no_fsync_succeeds_after_a_failed_one(faultfs, mount_logfs, variant, gate):
    """After an injected fsync failure of a .log, every later fsync of the partition (by the same writer, by
    another writer that had it open) answers EIO, also once the disk is healthy again and after the background
    ticks, until a remount; after the remount, the lines the failed fsync covered are there once or not at all.
    ``fsyncgate``: the disk drops the pages of the failed write-back, as Linux may, so a retried fsync would
    return 0 over lost data."""
    options = ["num.partitions=1", "log.flush.offset.checkpoint.interval.ms=100"]
    fs = mount_logfs(*options, name=".", foreground=True)
    os.mkdir(fs.path("t"))
    a = Stream(fs.path("t", 0), "a")
    _write_lines(a, 50)
    other = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    if gate:
        faultfs.fsyncgate(r"\.log$")
    rule = faultfs.fail("fsync", r"^t-0/.*\.log$", errno="EIO", nth=1)
    assert a.write(50)
    assert not a.fsync() and a.errors == [errno.EIO], a.errors
    assert [f["op"] for f in faultfs.injected() if f["rule"] == rule] == ["fsync"]
    faultfs.clear(rule)  # the disk is healthy again (with fsyncgate: the failed write-back's pages are gone)
    for attempt in range(3):
        expect_errno(errno.EIO, os.fsync, a.fd)
        expect_errno(errno.EIO, os.fdatasync, a.fd)
        expect_errno(errno.EIO, os.fsync, other)
        time.sleep(0.5)  # flush and checkpoint ticks pass: none may make the bytes "durable" meanwhile
    expect_errno(errno.EIO, os.write, other, b"more\n")
    expect_errno(errno.EIO, os.getxattr, fs.path("t", 0), "user.logfs.recovery_point")
    _assert_alive(fs, "after the failed fsync")
    if variant == "kill":
        fs.kill9()
        for fd in (a.fd, other):
            try:
                os.close(fd)
            except OSError:
                pass
        a.fd = None
    else:
        a.close()
        try:
            os.close(other)
        except OSError:
            pass
        fs.unmount()
    faultfs.clear()
    assert not _problems(fs.stderr()), _tail(fs.stderr())
    _mount_first_start(fs, options, f"after a failed fsync and {variant}")
    content, lso, leo = _stable_view(fs, "t/0")
    ids = [parse_line(line) for line in _lines_of(content, "t/0")]
    seqs = [s for _, s in ids]
    assert seqs in (list(range(50)), list(range(100))), (
        f"the lines before the failed fsync, then all or none of those it covered, each once: got "
        f"{len(seqs)} lines {seqs[:3]}..{seqs[-3:]}")
    assert (lso, leo) == (0, len(seqs))
    assert int(fs.getx("t/0", "recovery_point")) == leo
    b = Stream(fs.path("t", 0), "b")  # appends and fsyncs work again after the remount
    _write_lines(b, 20)
    b.close()
    record_stats("disk_fault_runs[fsync]", cases=1, covered_lines_kept=int(len(seqs) == 100),
                 covered_lines_dropped=int(len(seqs) == 50))


# ================================================================================================================
# 4. Engine bugs the crash points found (issue 30), each reproduced on its own: all three are fixed, and each test
#    below guards its fix (the texts say what the bug was). A new one is added to KNOWN_BUGS with a strict xfail
#    test of its own until fixed
# ================================================================================================================
BUG_SHUTDOWN_TRIM = (
    "a clean shutdown whose index trim fails (EIO from the ftruncate of the active segment's .timeindex in "
    "Log.close -> LogSegment.close -> index.close) leaves that index closed and the segment open; LogManager.close "
    "then falls back to close_without_flush, whose LogSegment.close reads the closed index (time_index.maybe_append "
    "-> last_entry -> _open_fd) and raises StorageIOError(EBADF, 'index ... is closed') out of LogManager.close: "
    "'CRITICAL logfs: unexpected error' with a traceback, exit status 1 (the I/O error did not take the directory "
    "offline either, and the fallback went on writing index entries)")
BUG_CLEANER_CHILD_EIO = (
    "an I/O error in the cleaner's child process (writing, truncating or fsyncing the .cleaned files of a "
    "compaction or of a compression rewrite) does not take the directory offline: cleaner_process turns it into "
    "LogfsError('cleaner process failed: [...]'), which runtime._clean logs at INFO ('cleaning ... skipped') and "
    "retries, and compress_once logs as 'compressing ... failed' and gives the segments up; the partitions go on "
    "answering (CONTRACT section 12: any I/O error takes the directory offline)")
BUG_DELETION_EIO = (
    "an I/O error while deleting a partition does not take the directory offline: LogManager.delete_partition "
    "logs and goes on when the topics file cannot be written before the rename, _record_deletion catches the "
    "OSError of the fsync of DATA_DIR after the rename (and of the topics file and checkpoints), removes the "
    "renamed directory and retries, and purge_deleted_dirs removes it with shutil.rmtree(ignore_errors=True); the "
    "unlink() returns 0 although the fsync that makes the rename durable failed, and the partitions go on "
    "answering (CONTRACT section 12: any I/O error takes the directory offline; a failed fsync is never reported "
    "as durable)")
# (protocol, pattern searched in a crash point's failure message) -> the bug
KNOWN_BUGS: list[tuple[str, re.Pattern, str]] = []


def _known_bug(protocol: str, message: str) -> str | None:
    for name, pattern, bug in KNOWN_BUGS:
        if name == protocol and pattern.search(message):
            return bug
    return None


def test_a_failed_index_trim_at_shutdown(faultfs, mount_logfs):
    fs = mount_logfs("num.partitions=1", name=".", foreground=True)
    os.mkdir(fs.path("t"))
    stream = Stream(fs.path("t", 0), "a")
    _write_lines(stream, 100)
    stream.close()
    rule = faultfs.fail("setattr", r"^t-0/.*\.timeindex$", errno="EIO", nth=1)  # the trim at close
    mark = len(fs.stderr())
    fs.unmount()
    assert [(f["rule"], f["op"]) for f in faultfs.injected()] == [(rule, "setattr")]
    faultfs.clear()
    err = fs.stderr()[mark:]
    assert not _problems(err) and "unexpected error" not in err, _tail(err)
    _mount_first_start(fs, ["num.partitions=1"], "after a failed index trim at shutdown")
    ids = [parse_line(line) for line in _lines_of(fs.read("t/0"), "t/0")]
    _check_stream(stream, ids, "after a failed index trim at shutdown")


@pytest.mark.parametrize("rewrite", ["compaction", "compression"])
def test_an_eio_in_the_cleaner_child_takes_the_directory_offline(faultfs, mount_logfs, rewrite):
    fs = mount_logfs(*CRASH_OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path(PROBE))
    os.mkdir(fs.path("t"))
    settings = {"segment.bytes": "4096"}
    if rewrite == "compaction":
        settings.update({"cleanup.policy": "compact", "logfs.key.separator": "=", "min.compaction.lag.ms": "3600000"})
    for key, value in settings.items():
        os.setxattr(fs.path("t"), f"user.logfs.config.{key}", value.encode())
    stream = Stream(fs.path("t", 0), "a", KEYS if rewrite == "compaction" else 0)
    _write_lines(stream, 200)
    stream.close()
    rule = faultfs.fail("write", r"^t-0/.*\.log\.cleaned$", errno="EIO", nth=1)  # the cleaned segment's first write
    if rewrite == "compaction":
        os.setxattr(fs.path("t"), "user.logfs.config.min.compaction.lag.ms", b"0")
    else:
        os.setxattr(fs.path("t"), "user.logfs.config.compression.type", b"zstd")
    ctx = Ctx(fs, faultfs, faultfs.source)
    fired = _wait_fired(ctx, rule, 20)
    assert fired, "the cleaned segment was never written"
    time.sleep(0.5)
    _assert_offline(ctx, f"{rewrite}: EIO writing {fired['path']}")


@pytest.mark.parametrize("step", ["fsync-after-rename", "purge"])
def test_an_eio_while_deleting_a_partition_takes_the_directory_offline(faultfs, mount_logfs, step):
    fs = mount_logfs(*CRASH_OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path(PROBE))
    os.mkdir(fs.path("t"))
    os.setxattr(fs.path("t"), "user.logfs.config.file.delete.delay.ms", b"200")
    os.close(os.open(fs.path("t", 1), os.O_WRONLY | os.O_CREAT))  # partition 1: its deletion leaves the topic
    stream = Stream(fs.path("t", 1), "a")
    _write_lines(stream, 20)
    stream.close()
    if step == "fsync-after-rename":  # the first fsync of DATA_DIR after the rename to -delete (the commit point)
        rule = faultfs.fail("fsyncdir", r"^$", errno="EIO", nth=1)
    else:  # the removal of the renamed directory, file.delete.delay.ms later
        rule = faultfs.fail("unlink", r"-delete/", errno="EIO", nth=1)
    try:
        os.unlink(fs.path("t", 1))
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
    ctx = Ctx(fs, faultfs, faultfs.source)
    fired = _wait_fired(ctx, rule, 10)
    assert fired, f"the {step} step never came"
    time.sleep(0.3)
    _assert_offline(ctx, f"partition deletion, EIO from {fired['op']} {fired['path']}")

"""kill -9 of the daemon at random (seeded) moments during concurrent appends, segment rolls, retention deletion
and compaction swaps; after each kill: ``fusermount3 -uz``, remount, and check what survived.

Writers are separate processes (tests/reliability/rel_helpers.py WRITER) that record, line by line, what the
filesystem acknowledged: ``w N`` once the write() carrying line N's newline returned, ``s N`` once an fsync()
after it returned. Every line is unique and self-checking (writer, sequence number, derived padding, CRC), so a
torn, corrupt or spliced line never parses. After each crash and remount:

- every fsync-acknowledged line is present exactly once, at the same offset as before (contract); so is every
  write-acknowledged line (a process kill loses no page cache: nothing a write() acknowledged may vanish);
- no partial or corrupt record is served (every line parses as one a writer wrote, and the file ends in "\\n");
- offsets are contiguous (log_end_offset - log_start_offset == number of lines) except under compaction, where
  each writer's lines keep their offsets and whatever compaction removed was superseded by a later line with
  the same key; retention only ever removes a prefix;
- xattrs agree with the content: st_size == len(content), recovery_point == log_end_offset after recovery,
  position.<offset> / offset.<position> at sampled lines;
- every other cycle the store is unmounted cleanly and each partition's ``.log`` files are parsed by kafka-python:
  CRCs valid, no trailing bytes, and each record at exactly the offset the mount showed.

Some cycles kill the daemon a second time while it is starting up (recovering), before the real remount.
"""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest

from logfs.testing.mounts import children as children_of
from rel_helpers import (
    alive, counts, daemon_env, mounted_at, parse_line, parse_partition_dir_records, read_checkpoint_file,
    record_stats, scale, start_writer, stop_writers, wait_for,
)

pytestmark = pytest.mark.mount

SEED = int(os.environ.get("LOGFS_SEED", "8"))
KEYS = 12  # distinct keys per writer in the compacted scenario

COMMON = ["num.partitions=2", "log.flush.offset.checkpoint.interval.ms=200"]
SCENARIOS = {
    # tiny segments: rolls every few dozen appends
    "appends": COMMON + ["log.segment.bytes=16384", "log.index.interval.bytes=512"],
    # short retention checked often: segments deleted (renamed .deleted, unlinked 100 ms later) all the time
    "retention": COMMON + ["log.segment.bytes=8192", "log.index.interval.bytes=256", "log.retention.ms=1200",
                           "log.retention.check.interval.ms=50", "log.segment.delete.delay.ms=100"],
    # compacted, keyed lines, a cleaner that runs as soon as anything is dirty
    "compaction": COMMON + ["log.segment.bytes=8192", "log.index.interval.bytes=256",
                            "log.cleanup.policy=compact", "logfs.key.separator==", "log.cleaner.backoff.ms=50",
                            "log.cleaner.min.cleanable.ratio=0.05", "log.segment.delete.delay.ms=100"],
}
# The on-disk event a triggered kill waits for (else a random moment).
TRIGGERS = {"appends": (".log",), "retention": (".deleted",), "compaction": (".cleaned", ".swap", ".deleted")}
# The same with compression.type=zstd: sealed segments are rewritten in the background (the cleaner's swap), so
# kills also land inside those rewrites.
for _name in list(SCENARIOS):
    SCENARIOS[f"{_name}-zstd"] = SCENARIOS[_name] + ["compression.type=zstd"]
    TRIGGERS[f"{_name}-zstd"] = (".cleaned", ".swap", ".deleted")


class PartitionState:
    """What the test knows about one partition across cycles."""

    def __init__(self, rel: str, compacted: bool):
        self.rel = rel
        self.compacted = compacted
        self.known: dict[tuple[str, int], int] = {}  # (writer, seq) -> offset, of lines seen present
        self.last_content = b""
        self.last_lso = 0


def _wait_for_trigger(fs, suffixes, deadline: float) -> bool:
    """Poll the partition directories until a file with one of ``suffixes`` appears that was not there when
    polling started (a roll, a retention rename, a cleaning pass); False at the deadline."""
    def names():
        out = set()
        for d in os.listdir(fs.data):
            path = os.path.join(fs.data, d)
            if os.path.isdir(path) and not d.endswith("-delete"):
                try:
                    out.update(os.path.join(d, n) for n in os.listdir(path))
                except FileNotFoundError:
                    pass
        return out

    before = names()
    while time.monotonic() < deadline:
        now = names()
        if any(n.endswith(suffixes) for n in now - before):
            return True
        time.sleep(0.002)
    return False


def _kill_during_startup(fs, options, rng) -> str:
    """Start the daemon and SIGKILL it after a random short delay (loading, recovering, or just mounted)."""
    err = open(fs.stderr_path, "ab")
    proc = subprocess.Popen(fs.command(*options, foreground=True), stdin=subprocess.DEVNULL, stdout=err,
                            stderr=err, env=daemon_env())
    err.close()
    time.sleep(rng.uniform(0.0, 0.5))
    proc.kill()
    proc.wait(20)
    was_mounted = mounted_at(fs.mnt)
    if was_mounted:
        subprocess.run(["fusermount3", "-uz", str(fs.mnt)], capture_output=True, timeout=30)
        wait_for(lambda: not mounted_at(fs.mnt), 10, what="the lazy unmount")
    return "after-mount" if was_mounted else "before-mount"


def _stable_snapshot(fs, rel: str, rng, samples: int):
    """(content, lso, leo, rp, sampled {pos: offset}, sampled {offset: pos}) read while nothing changed: the
    content is read twice around the xattr reads and the whole thing retried if retention or cleaning moved."""
    path = fs.path(*rel.split("/"))
    for _ in range(100):
        lso = int(fs.getx(rel, "log_start_offset"))
        leo = int(fs.getx(rel, "log_end_offset"))
        rp = int(fs.getx(rel, "recovery_point"))
        content = subprocess.run(["cat", path], capture_output=True, check=True, timeout=60).stdout
        size = os.stat(path).st_size
        starts = []
        pos = 0
        for line in content.split(b"\n")[:-1]:
            starts.append((pos, len(line) + 1))
            pos += len(line) + 1
        picks = sorted(rng.sample(range(len(starts)), min(samples, len(starts)))) if starts else []
        offset_at = {}
        position_of = {}
        disagreements = []
        try:
            for i in picks:
                p, n = starts[i]
                offset_at[p] = int(os.getxattr(path, f"user.logfs.offset.{p}"))
                end_offset = int(os.getxattr(path, f"user.logfs.offset.{p + n - 1}"))
                if end_offset != offset_at[p]:
                    disagreements.append(f"offset.<{p}> = {offset_at[p]} but offset.<{p + n - 1}> = {end_offset}")
                position_of[offset_at[p]] = int(os.getxattr(path, f"user.logfs.position.{offset_at[p]}"))
            end_pos = int(os.getxattr(path, f"user.logfs.position.{leo}"))
        except OSError as exc:  # ENODATA: retention moved the start under the sampled names; checked below
            disagreements.append(f"getxattr: {exc}")
            end_pos = -1
        again = fs.read(rel)
        if (again == content and size == len(content) and end_pos == len(content)
                and int(fs.getx(rel, "log_start_offset")) == lso and int(fs.getx(rel, "log_end_offset")) == leo):
            # Nothing moved meanwhile (retention or cleaning would have): the xattrs must agree with each other.
            assert not disagreements, f"{rel}: " + "; ".join(disagreements)
            return content, lso, leo, rp, offset_at, position_of, starts
        time.sleep(0.05)
    raise AssertionError(f"{rel}: no stable view in 100 attempts (size {size} vs {len(content)})")


def _verify_partition(fs, state: PartitionState, writers, rng, *, after_recovery: bool, samples: int,
                      retention: bool) -> dict:
    rel = state.rel
    content, lso, leo, rp, offset_at, position_of, starts = _stable_snapshot(fs, rel, rng, samples)
    assert content == b"" or content.endswith(b"\n"), f"{rel}: a partial line is served: {content[-80:]!r}"
    lines = content.split(b"\n")[:-1]
    keys = KEYS if state.compacted else 0
    ids = [parse_line(line, keys=keys) for line in lines]
    assert len(set(ids)) == len(ids), f"{rel}: duplicated lines: {len(ids) - len(set(ids))}"
    index_of = {ident: i for i, ident in enumerate(ids)}
    if after_recovery:
        assert rp == leo, f"{rel}: recovery_point {rp} != log_end_offset {leo} right after recovery"
    assert lso <= leo

    # Offsets of the lines shown.
    if not state.compacted:
        assert leo - lso == len(lines), f"{rel}: log_end_offset {leo} - log_start_offset {lso} != {len(lines)} lines"
        offset_of_index = [lso + i for i in range(len(lines))]
    else:
        offset_of_index = [None] * len(lines)
        for ident, off in state.known.items():
            if ident in index_of:
                offset_of_index[index_of[ident]] = off
        for w in writers:
            if w.start_leo is not None and w.dedicated:
                for i, (wn, s) in enumerate(ids):
                    if wn == w.name:
                        offset_of_index[i] = w.start_leo + s
        if lines:
            last = offset_of_index[-1]
            if last is not None:
                assert last == leo - 1, f"{rel}: last line at offset {last}, log end offset {leo}"
    # Sampled xattrs agree with the content.
    pos_index = {p: i for i, (p, _) in enumerate(starts)}
    for p, off in offset_at.items():
        i = pos_index[p]
        if offset_of_index[i] is not None:
            assert off == offset_of_index[i], f"{rel}: offset.{p} = {off}, expected {offset_of_index[i]}"
        assert position_of[off] == p, f"{rel}: position.{off} = {position_of[off]}, expected {p}"
    offsets_known = [o for o in offset_of_index if o is not None]
    assert offsets_known == sorted(set(offsets_known)), f"{rel}: offsets not strictly increasing"
    latest: dict[tuple[str, int], int] = {}  # (writer, key number) -> highest sequence number present
    if state.compacted:
        for w, s in ids:
            latest[(w, s % KEYS)] = max(latest.get((w, s % KEYS), -1), s)

    def superseded(w: str, s: int) -> bool:
        return latest.get((w, s % KEYS), -1) > s

    # Lines known from earlier cycles keep their offsets; absent ones were retained away or compacted.
    for ident, off in state.known.items():
        if ident in index_of:
            got = offset_of_index[index_of[ident]]
            assert got is None or got == off, f"{rel}: line {ident} moved from offset {off} to {got}"
            if got is None:
                offset_of_index[index_of[ident]] = off
        elif state.compacted:
            assert superseded(*ident), f"{rel}: line {ident} (offset {off}) lost without a later value of its key"
        else:
            assert off < lso, f"{rel}: line {ident} at offset {off} >= log start {lso} is missing"

    # This cycle's writers.
    acked_written = acked_synced = 0
    for w in writers:
        seqs = [s for (wn, s) in ids if wn == w.name]
        assert seqs == sorted(seqs), f"{rel}: writer {w.name}'s lines out of order"
        acked_written += w.written + 1
        acked_synced += w.synced + 1
        if state.compacted:
            for level, upto in (("fsync", w.synced), ("write", w.written)):
                for s in range(max(0, upto - KEYS + 1), upto + 1):  # the last acknowledged value of every key
                    assert (w.name, s) in index_of or superseded(w.name, s), (
                        f"{rel}: {level}-acknowledged line {s} of {w.name} lost (no later value of its key)")
        else:
            if seqs:
                assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"{rel}: hole in {w.name}'s lines"
                assert seqs[0] == 0 or retention, f"{rel}: {w.name}'s first {seqs[0]} lines lost"
            for level, upto in (("fsync", w.synced), ("write", w.written)):
                if upto < 0:
                    continue
                if not seqs:
                    assert retention and lso > 0, f"{rel}: all {upto + 1} {level}-acknowledged lines of {w.name} lost"
                    continue
                assert seqs[-1] >= upto, (
                    f"{rel}: {level}-acknowledged lines {seqs[-1] + 1}..{upto} of {w.name} lost "
                    f"(present up to {seqs[-1]})")
        if w.dedicated and w.start_leo is not None:
            for s in seqs:
                i = index_of[(w.name, s)]
                if offset_of_index[i] is not None:
                    assert offset_of_index[i] == w.start_leo + s, f"{rel}: {w.name} line {s} at wrong offset"
    # Remember offsets for the next cycles.
    for i, ident in enumerate(ids):
        if offset_of_index[i] is not None:
            state.known[ident] = offset_of_index[i]
    state.last_content, state.last_lso = content, lso
    return {"lines": len(lines), "acked_written": acked_written, "acked_synced": acked_synced,
            "xattr_samples": len(offset_at)}


def _verify_on_disk(fs, states: dict[str, PartitionState]) -> int:
    """After a clean unmount: every partition's .log files parse with kafka-python, and every record the mount
    showed sits at the offset the mount said."""
    assert os.path.exists(os.path.join(fs.data, ".kafka_cleanshutdown"))
    recovery = read_checkpoint_file(os.path.join(fs.data, "recovery-point-offset-checkpoint"))
    starts = read_checkpoint_file(os.path.join(fs.data, "log-start-offset-checkpoint"))
    checked = 0
    for rel, state in states.items():
        topic, part = rel.split("/")
        records = parse_partition_dir_records(os.path.join(fs.data, f"{topic}-{part}"))
        lso = starts.get((topic, int(part)), 0)
        live = [(o, k, v) for o, k, v in records if o >= lso]
        if records:
            assert recovery[(topic, int(part))] == records[-1][0] + 1, f"{rel}: recovery point checkpoint"
        if not state.compacted:
            offsets = [o for o, _, _ in live]
            assert offsets == list(range(lso, lso + len(offsets))), f"{rel}: offsets on disk not contiguous"
        for o, k, v in live:
            line = (k + b"=" + v) if k is not None else v
            ident = parse_line(line, keys=KEYS if state.compacted else 0)
            known = state.known.get(ident)
            assert known is None or known == o, f"{rel}: {ident} at offset {o} on disk, {known} through the mount"
            state.known[ident] = o
            checked += 1
        # What the mount showed last (at or above today's start) is exactly what is on disk, unless compaction ran.
        if not state.compacted:
            shown = state.last_content.split(b"\n")[:-1]
            skip = lso - state.last_lso
            if skip >= 0:
                assert [v for _, _, v in live] == shown[skip:], f"{rel}: disk differs from what the mount showed"
    return checked


EXTRA_CYCLES = 6


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_kill9_at_random_moments(mount_logfs, tmp_path, profile, scenario):
    seed = SEED * 1000 + list(SCENARIOS).index(scenario)
    rng = random.Random(seed)
    options = SCENARIOS[scenario]
    cycles = scale(6 if "zstd" not in scenario else 3, 30)
    compacted = scenario.startswith("compaction")
    fs = mount_logfs(*options, foreground=True)
    os.mkdir(fs.path("t"))
    states = {rel: PartitionState(rel, compacted) for rel in ("t/0", "t/1")}
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    stats = {"cycles": 0, "kills": 0, "kills_on_event": 0, "startup_kills": 0, "writers": 0,
             "lines_write_acked": 0, "lines_fsync_acked": 0, "lines_verified": 0, "records_checked_on_disk": 0,
             "clean_remounts": 0, "children_at_kill": 0, "xattr_samples": 0, "lost": 0}
    # The log lines that show the scenario's background work ran (checked at the end). On a loaded machine a short
    # run can end before it did: then up to EXTRA_CYCLES more cycles run, each ending in a clean unmount.
    events = [ev for prefix, ev in (("compaction", " cleaned t-"), ("retention", "retention deleted"))
              if scenario.startswith(prefix)] + (["compressed "] if scenario.endswith("zstd") else [])
    mounted_now = True
    try:
        for cycle in range(cycles + EXTRA_CYCLES):
            if cycle >= cycles and all(ev in fs.stderr() for ev in events):
                break
            stats["extra_cycles"] = max(0, cycle + 1 - cycles)
            if not mounted_now:
                fs.mount(*options, foreground=True)
            # Writers: three share t/0 (whole lines, lines cut at random bytes, whole lines); one owns t/1, so
            # the offset of each of its lines is known exactly (log end offset at open + sequence number).
            writers = []
            keys = KEYS if compacted else 0
            roles = [("t/0", "lines"), ("t/0", "chunked"), ("t/0", "lines"), ("t/1", "lines")]
            for i, (rel, mode) in enumerate(roles):
                w = start_writer(fs, rel, f"c{cycle}w{i}", ack_dir, seed=rng.randrange(1 << 30), keys=keys,
                                 mode=mode, fsync_every=rng.choice([1, 2, 5]))
                w.dedicated = rel == "t/1"
                writers.append(w)
            stats["writers"] += len(writers)
            wait_for(lambda: all(w.collect().written >= 0 or w.proc.poll() is not None for w in writers), 30,
                     what="the writers to start")
            run_for = rng.uniform(0.2, 1.5)
            triggered = False
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0.1, 0.4))
                triggered = _wait_for_trigger(fs, TRIGGERS[scenario], time.monotonic() + run_for + 1.5)
            else:
                time.sleep(run_for)
            pid = fs.pid()
            children = children_of(pid)
            fs.kill9()
            stats["kills"] += 1
            stats["kills_on_event"] += int(triggered)
            stop_writers(writers)
            for w in writers:
                assert not w.ended, f"writer {w.name} finished before the kill?"
            # A cleaner child process of the killed daemon must not outlive it (it could otherwise write .cleaned
            # files under the next daemon).
            stats["children_at_kill"] += len(children)
            wait_for(lambda: not any(alive(c) for c in children), 2,
                     what=f"the killed daemon's children {children} to die with it")
            if rng.random() < 0.3:
                _kill_during_startup(fs, options, rng)
                stats["startup_kills"] += 1
            fs.mount(*options, foreground=True)
            by_partition = {rel: [w for w in writers if w.partition == rel] for rel in states}
            for rel, state in states.items():
                got = _verify_partition(fs, state, by_partition[rel], rng, after_recovery=True,
                                        samples=scale(8, 25), retention=scenario.startswith("retention"))
                stats["lines_verified"] += got["lines"]
                stats["lines_write_acked"] += got["acked_written"]
                stats["lines_fsync_acked"] += got["acked_synced"]
                stats["xattr_samples"] += got["xattr_samples"]
            stats["cycles"] += 1
            if cycle % 2 == 1 or cycle >= cycles - 1:
                fs.unmount()
                stats["clean_remounts"] += 1
                stats["records_checked_on_disk"] += _verify_on_disk(fs, states)
                mounted_now = False
            else:
                mounted_now = True  # the next cycle crashes a freshly recovered daemon
    finally:
        err = fs.stderr()
        stats.update(counts(err, cleaning_passes=" cleaned t-", retention_deletions="retention deleted",
                            compressions="compressed ", recoveries_logged="was not shut down cleanly"))
        record_stats(f"kill9[{scenario}]", **stats)
    assert "Traceback" not in err, err[-3000:]
    if scenario.startswith("compaction"):
        assert stats["cleaning_passes"] > 0, "the cleaner never ran: the scenario tests nothing"
    if scenario.startswith("retention"):
        assert stats["retention_deletions"] > 0, "retention never ran: the scenario tests nothing"
    if scenario.endswith("zstd"):
        assert stats["compressions"] > 0, "no segment was compressed: the scenario tests nothing"


def test_cleaner_child_dies_with_the_daemon(mount_logfs):
    """Regression: a compaction pass runs in a child process; when the daemon was killed in the middle of a long
    pass, the child lived on and went on writing ``.cleaned`` files, possibly under a newly started daemon (whose
    own cleaner writes the same names). It now dies with the daemon."""
    opts = ["log.segment.bytes=1048576", "log.cleanup.policy=compact", "logfs.key.separator==",
            "log.cleaner.backoff.ms=50"]
    fs = mount_logfs(*opts, "log.cleaner.enable=false", foreground=True)
    os.mkdir(fs.path("t"))
    for start in range(0, 300_000, 50_000):  # ~30 MB of keyed lines: a pass of several seconds
        fs.append("t/0", b"".join(b"k%d=value %09d %s\n" % (j % 1000, j, b"x" * 70)
                                  for j in range(start, start + 50_000)))
    fs.remount(*opts, foreground=True)
    pid = fs.pid()
    children = wait_for(lambda: children_of(pid), 30, interval=0.002, what="a cleaning pass to start")
    time.sleep(0.3)  # well inside the pass
    assert all(alive(c) for c in children), "the pass ended too soon to test anything"
    fs.kill9()
    wait_for(lambda: not any(alive(c) for c in children), 0.5, what=f"cleaner child {children} to die with the daemon")
    part = os.path.join(fs.data, "t-0")
    cleaned = sorted(n for n in os.listdir(part) if ".cleaned" in n)
    time.sleep(1.0)
    assert sorted(n for n in os.listdir(part) if ".cleaned" in n) == cleaned, "the dead daemon's cleaner still writes"
    fs.mount(*opts, foreground=True)
    lines = fs.read("t/0").split(b"\n")[:-1]
    assert lines and all(line.startswith(b"k") for line in lines)
    assert lines[-1] == b"k999=value %09d %s" % (299_999, b"x" * 70)

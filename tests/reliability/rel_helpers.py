"""Shared helpers of the reliability suite (issue 8).

The mount helpers come from ``tests/harness.py`` (imported, not copied). This module adds: the SHORT/LONG
profile switch, a whole-store hash (to prove an operation changed nothing on disk), uniquely identifiable,
self-checking lines, writer processes that record what the filesystem acknowledged, an independent parse of the
on-disk ``.log`` files (kafka-python), and the run statistics that ``docs/reliability.md`` summarises.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from harness import (  # noqa: E402,F401  (re-exported for the tests)
    LogfsMount, MountError, alive, daemon_env, daemon_pids, expect_errno, fuse_unusable_reason, mounted_at, sh,
    wait_for,
)

def mount_over_two_dirs(faultfs, mount_logfs, *options: str):
    """A foreground logfs mount (named "fs") over two log directories on faultfs, ``d1`` and ``d2`` (made here):
    (mount, d1, d2)."""
    d1, d2 = faultfs.mountpoint / "d1", faultfs.mountpoint / "d2"
    d1.mkdir()
    d2.mkdir()

    def prepare(m):
        m.source = f"{d1},{d2}"

    return mount_logfs(*options, name="fs", prepare=prepare, foreground=True), d1, d2


# -- profiles ----------------------------------------------------------------------------------------------
# Set by conftest.pytest_configure: LONG when LOGFS_LONG=1 or when the run selects `-m long`.
LONG = os.environ.get("LOGFS_LONG", "") not in ("", "0")


def scale(short, long):
    """The value for the current profile."""
    return long if LONG else short


# -- statistics (summarised in docs/reliability.md) ---------------------------------------------------------
STATS: dict[str, dict] = {}


def record_stats(name: str, **values) -> None:
    """Accumulate counters of one test (numbers add up across calls; other values are replaced)."""
    entry = STATS.setdefault(name, {})
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(entry.get(key), (int, float)):
            entry[key] += value
        else:
            entry[key] = value


def counts(text: str, **needles: str) -> dict[str, int]:
    """How often each of ``needles`` occurs in ``text`` (a daemon's log: what it says it did), by name."""
    return {name: text.count(needle) for name, needle in needles.items()}


def dump_stats(path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"profile": "long" if LONG else "short", "tests": STATS}, f, indent=1, sort_keys=True)


# -- the store on disk ----------------------------------------------------------------------------------------
def store_hash(data_dir: str | os.PathLike, *, with_mtimes: bool = True) -> dict[str, str]:
    """path -> sha256 of contents (+ mode, size and mtime) of every file and directory under ``data_dir``."""
    out = {}
    root = str(data_dir)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        st = os.lstat(dirpath)
        out[rel_dir + "/"] = f"dir {oct(st.st_mode)}"
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            stamp = f" mtime={st.st_mtime_ns}" if with_mtimes else ""
            out[os.path.join(rel_dir, name)] = f"{h.hexdigest()} mode={oct(st.st_mode)} size={st.st_size}{stamp}"
    return out


def diff_hashes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changes = []
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path):
            changes.append(f"{path}: {before.get(path)} -> {after.get(path)}")
    return changes


def parse_partition_dir_records(directory: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record in ``directory``'s live ``.log`` files, parsed by kafka-python (an
    implementation independent of logfs); every batch's CRC is checked and no trailing bytes may remain."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    out = []
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".log")):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        records = MemoryRecords(data)
        consumed = 0
        while records.has_next():
            batch = records.next_batch()
            assert isinstance(batch, DefaultRecordBatch) and batch.magic == 2
            assert batch.validate_crc(), f"CRC mismatch in {directory}/{name} at batch {batch.base_offset}"
            consumed += batch.size_in_bytes
            for r in batch:
                out.append((r.offset, r.key, r.value))
        assert consumed == len(data), f"{directory}/{name}: {len(data) - consumed} trailing bytes"
    offsets = [o for o, _, _ in out]
    assert offsets == sorted(set(offsets)), f"{directory}: offsets not strictly increasing across segments"
    return out


def read_checkpoint_file(path: str) -> dict[tuple[str, int], int]:
    from logfs.storage.checkpoints import read_checkpoint

    return read_checkpoint(path)


# -- self-checking lines ------------------------------------------------------------------------------------
# A line: [key SEP] "W<writer>:<seq>:<pad>:<crc>" where pad is derived from (writer, seq) and crc covers the
# rest, so a torn, corrupt or spliced line never parses, and a line can be regenerated from its id.
LINE_RE = re.compile(
    rb"^(?:(?P<key>[^=]*)=)?W(?P<w>[A-Za-z0-9_.-]+):(?P<seq>\d+):(?P<pad>[a-z]*):(?P<crc>[0-9a-f]{8})$")

LINE_CODE = r'''
import zlib
def make_line(writer, seq, keys=0, pad_max=120):
    """The unique line number ``seq`` of ``writer`` (bytes, without the newline)."""
    n = (seq * 7919 + zlib.crc32(writer.encode())) % (pad_max + 1)
    pad = bytes(97 + (seq + i) % 26 for i in range(n))
    body = b"W%s:%d:%s" % (writer.encode(), seq, pad)
    body += b":%08x" % zlib.crc32(body)
    if keys:
        body = b"k%s-%d=" % (writer.encode(), seq % keys) + body
    return body
'''
exec(LINE_CODE)  # defines make_line here too (the writers get the same source)


def parse_line(line: bytes, *, keys: int = 0) -> tuple[str, int]:
    """(writer, seq) of a line written by make_line; AssertionError for anything else (torn, corrupt, spliced)."""
    m = LINE_RE.match(line)
    assert m, f"line not written by any writer (torn/corrupt/interleaved): {line[:160]!r}"
    writer, seq = m.group("w").decode(), int(m.group("seq"))
    assert line == make_line(writer, seq, keys), f"corrupt line: {line[:160]!r}"  # noqa: F821
    return writer, seq


# -- writer processes -----------------------------------------------------------------------------------------
WRITER = LINE_CODE + textwrap.dedent(r'''
import os, random, sys, time
path, writer, ack_path, seed, keys, mode, fsync_every, duration = sys.argv[1:9]
seed, keys, fsync_every, duration = int(seed), int(keys), int(fsync_every), float(duration)
rng = random.Random(seed)
ack = open(ack_path, "a", buffering=1)
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
ack.write("open %s\n" % os.getxattr(path, "user.logfs.log_end_offset").decode())
seq = 0           # next line to generate
complete = -1     # last line whose newline went out in a write() that returned
pending = b""     # bytes generated, not yet written (chunked mode)
writes = 0
deadline = time.monotonic() + duration if duration > 0 else None
try:
    while deadline is None or time.monotonic() < deadline:
        if mode == "lines":
            n = rng.choice([1, 1, 2, 3, 8, 20])
            buf = b"".join(make_line(writer, seq + i, keys) + b"\n" for i in range(n))
            done = os.write(fd, buf)
            assert done == len(buf), (done, len(buf))
            seq += n
            complete = seq - 1
        else:  # chunked: lines split at arbitrary bytes across write() calls
            while len(pending) < 6000:
                pending += make_line(writer, seq, keys) + b"\n"
                seq += 1
            cut = rng.randrange(1, 3000)
            chunk, rest = pending[:cut], pending[cut:]
            done = os.write(fd, chunk)
            assert done == len(chunk)
            pending = rest
            # lines fully written so far: seq minus the lines still (partly) pending
            complete = seq - 1 - pending.count(b"\n")
        ack.write("w %d\n" % complete)
        writes += 1
        if fsync_every and writes % fsync_every == 0:
            if mode != "lines" and not chunk.endswith(b"\n"):
                # fsync commits a held partial line as a record (README): finish the line first
                nl = pending.index(b"\n") + 1
                os.write(fd, pending[:nl])
                pending = pending[nl:]
                complete += 1
                ack.write("w %d\n" % complete)
            os.fsync(fd)
            ack.write("s %d\n" % complete)
    if pending:  # finish the last line before closing (a clean end never leaves a partial line)
        nl = pending.index(b"\n") + 1
        os.write(fd, pending[:nl])
        complete += 1
        ack.write("w %d\n" % complete)
    os.fsync(fd)
    ack.write("s %d\n" % complete)
    os.close(fd)
    ack.write("end %d\n" % complete)
except OSError as exc:
    ack.write("error %d %s\n" % (exc.errno or 0, exc.strerror))
''')


@dataclass
class WriterRun:
    name: str
    partition: str  # "topic/N"
    ack_path: Path
    proc: subprocess.Popen
    keys: int = 0
    start_leo: int | None = None
    written: int = -1  # last seq acknowledged by a returned write()
    synced: int = -1   # last seq acknowledged by a returned fsync()
    errors: list[str] = field(default_factory=list)
    ended: bool = False
    dedicated: bool = False  # the only writer of its partition: line N is at offset start_leo + N

    def collect(self) -> "WriterRun":
        self.errors = []
        for line in self.ack_path.read_text().splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "open":
                self.start_leo = int(rest)
            elif kind == "w":
                self.written = max(self.written, int(rest))
            elif kind == "s":
                self.synced = max(self.synced, int(rest))
            elif kind == "error":
                self.errors.append(rest)
            elif kind == "end":
                self.ended = True
        return self


def start_writer(fs: LogfsMount, partition: str, name: str, ack_dir: Path, *, seed: int, keys: int = 0,
                 mode: str = "lines", fsync_every: int = 3, duration: float = 0.0) -> WriterRun:
    ack = ack_dir / f"{name}.ack"
    ack.write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, fs.path(*partition.split("/")), name, str(ack), str(seed), str(keys), mode,
         str(fsync_every), str(duration)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return WriterRun(name, partition, ack, proc, keys)


def stop_writers(writers: list[WriterRun], timeout: float = 30) -> None:
    for w in writers:
        try:
            _, err = w.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            _, err = w.proc.communicate()
            raise AssertionError(f"writer {w.name} hung")
        w.collect()
        if err and b"Traceback" in err:
            raise AssertionError(f"writer {w.name} crashed: {err.decode(errors='replace')[-2000:]}")


# -- tmpfs ------------------------------------------------------------------------------------------------------
def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True,
                   capture_output=True)


def umount_tmpfs(path: Path) -> None:
    for _ in range(50):
        if not mounted_at(path):
            return
        r = subprocess.run(["umount", str(path)], capture_output=True)
        if r.returncode == 0:
            return
        import time

        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def crc(data: bytes) -> int:
    return zlib.crc32(data)

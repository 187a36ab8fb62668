"""Load: many writer processes and readers (a sequential reader per partition, ``cat`` in a loop, ``tail -f``,
and a stat/xattr poller) on the same and on different partitions, for a bounded time (SHORT ~10 s).

Afterwards, per partition: the content is exactly the union of the lines the writers were told were written
(each once, each writer's in order), no line is interleaved with another (every line parses and checks its own
CRC), and log_end_offset / st_size agree. Every reader only ever saw whole lines in offset order: each read
that reached the end of the file ended at a newline, each stream (sequential reader, ``tail -f``) is exactly
the final content, each ``cat`` snapshot is a prefix of it, and sizes and offsets only grew.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest

from rel_helpers import parse_line, record_stats, scale, start_writer, stop_writers, wait_for

pytestmark = pytest.mark.mount

SEQUENTIAL_READER = textwrap.dedent(r'''
import os, sys, time
path, out_path, stop_path = sys.argv[1:4]
fd = os.open(path, os.O_RDONLY)
out = open(out_path, "wb")
pos = reads = eof_hits = 0
last_tail = b""
quiet = 0
while True:
    want = 1 << (8 + (reads % 9))  # 256 B .. 64 KiB
    data = os.pread(fd, want, pos)
    reads += 1
    if data:
        out.write(data)
        pos += len(data)
        last_tail = (last_tail + data)[-1:]
    if len(data) < want:  # reached the end of the file: it must end at a line boundary
        eof_hits += 1
        if pos and last_tail != b"\n":
            print("PARTIAL at %d" % pos, flush=True)
            sys.exit(3)
        if os.path.exists(stop_path):
            quiet += 1
            if quiet > 20:
                break
        time.sleep(0.002)
    else:
        quiet = 0
out.close()
print("reads %d eof %d bytes %d" % (reads, eof_hits, pos), flush=True)
''')

CAT_READER = textwrap.dedent(r'''
import hashlib, os, sys, time
path, stop_path = sys.argv[1:3]
snapshots = 0
while not os.path.exists(stop_path):
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        print("PARTIAL %d" % len(data), flush=True)
        sys.exit(3)
    print("snap %d %s" % (len(data), hashlib.sha256(data).hexdigest()), flush=True)
    snapshots += 1
''')

STAT_POLLER = textwrap.dedent(r'''
import os, sys
path, stop_path = sys.argv[1:3]
last_size = last_leo = -1
polls = 0
while not os.path.exists(stop_path):
    size = os.stat(path).st_size
    leo = int(os.getxattr(path, "user.logfs.log_end_offset"))
    end = int(os.getxattr(path, "user.logfs.position.%d" % leo))
    if size < last_size or leo < last_leo or end < size:
        print("SHRANK size %d->%d leo %d->%d end %d" % (last_size, size, last_leo, leo, end), flush=True)
        sys.exit(3)
    last_size, last_leo = size, leo
    polls += 1
print("polls %d" % polls, flush=True)
''')


def test_many_writers_and_readers(mount_logfs, tmp_path, profile):
    rng = random.Random(21)
    duration = scale(10.0, 60.0)
    fs = mount_logfs("num.partitions=3", "log.segment.bytes=65536", "log.index.interval.bytes=1024",
                     foreground=True)
    os.mkdir(fs.path("t"))
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    stop = tmp_path / "stop"
    # Writers: several on partition 0, two on 1, one on 2; whole lines or lines cut at random bytes.
    layout = scale([(0, "lines"), (0, "chunked"), (0, "lines"), (1, "lines"), (1, "chunked"), (2, "lines")],
                   [(0, "lines"), (0, "chunked"), (0, "lines"), (0, "chunked"), (1, "lines"), (1, "chunked"),
                    (1, "lines"), (2, "lines"), (2, "chunked"), (2, "lines")])
    readers = []

    def spawn(args, name):
        out = open(tmp_path / f"{name}.out", "wb")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        readers.append((name, p))
        return p

    for part in (0, 1, 2):
        spawn([sys.executable, "-c", SEQUENTIAL_READER, fs.path("t", part), str(tmp_path / f"stream{part}"),
               str(stop)], f"seq{part}")
    for part in (0, 2):
        spawn([sys.executable, "-c", CAT_READER, fs.path("t", part), str(stop)], f"cat{part}")
    spawn([sys.executable, "-c", STAT_POLLER, fs.path("t", 1), str(stop)], "stat1")
    tail = subprocess.Popen(["tail", "-n", "+1", "-f", "-s", "0.1", fs.path("t", 0)],
                            stdout=open(tmp_path / "tail0", "wb"), stderr=subprocess.PIPE)
    writers = [start_writer(fs, f"t/{part}", f"w{i}", ack_dir, seed=rng.randrange(1 << 30), mode=mode,
                            fsync_every=rng.choice([0, 0, 7]), duration=duration)
               for i, (part, mode) in enumerate(layout)]
    try:
        stop_writers(writers, timeout=duration + 60)
    finally:
        stop.touch()
    for w in writers:
        assert w.ended and not w.errors, f"writer {w.name}: {w.errors}"
    finals = {part: fs.read(f"t/{part}") for part in (0, 1, 2)}
    # Readers catch up and stop.
    outputs = {}
    for name, p in readers:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"reader {name} hung")
        outputs[name] = (tmp_path / f"{name}.out").read_text()
        assert p.returncode == 0, f"reader {name} failed: {outputs[name][-500:]}"
    try:
        wait_for(lambda: (tmp_path / "tail0").stat().st_size >= len(finals[0]), 20, interval=0.1,
                 what="tail -f to catch up")
        time.sleep(0.3)
    finally:
        tail.terminate()
        tail.wait(10)
        tail.stderr.close()

    total_lines = 0
    for part, content in finals.items():
        assert content.endswith(b"\n")
        lines = content.split(b"\n")[:-1]
        ids = [parse_line(line) for line in lines]  # no torn or interleaved line
        assert len(set(ids)) == len(ids), f"t/{part}: duplicated lines"
        acked = {(w.name, s) for w in writers if w.partition == f"t/{part}" for s in range(w.written + 1)}
        assert set(ids) == acked, (f"t/{part}: {len(acked - set(ids))} acknowledged lines missing, "
                                   f"{len(set(ids) - acked)} unacknowledged lines present")
        for w in writers:
            seqs = [s for name, s in ids if name == w.name]
            assert seqs == sorted(seqs), f"t/{part}: {w.name}'s lines out of order"
        assert int(fs.getx(f"t/{part}", "log_end_offset")) == len(lines)
        assert os.stat(fs.path("t", part)).st_size == len(content)
        stream = (tmp_path / f"stream{part}").read_bytes()
        assert stream == content, f"t/{part}: the sequential reader's stream differs from the final content"
        total_lines += len(lines)
    assert (tmp_path / "tail0").read_bytes() == finals[0], "tail -f output differs from the content"
    snapshots = 0
    for part in (0, 2):
        for line in outputs[f"cat{part}"].splitlines():
            _, size, digest = line.split()
            assert hashlib.sha256(finals[part][: int(size)]).hexdigest() == digest, (
                f"t/{part}: a cat snapshot of {size} bytes is not a prefix of the final content")
            snapshots += 1
    seq_reads = sum(int(outputs[f"seq{p}"].split()[1]) for p in (0, 1, 2))
    polls = int(outputs["stat1"].split()[1])
    record_stats("load", seconds=duration, writers=len(writers), readers=len(readers) + 1, lines=total_lines,
                 bytes=sum(map(len, finals.values())), sequential_reads=seq_reads, cat_snapshots=snapshots,
                 stat_polls=polls, lost=0, interleaved=0)
    assert "Traceback" not in fs.stderr()

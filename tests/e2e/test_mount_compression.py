"""compression.type through a real mount (CONTRACT section 8): per codec, what `cat` shows equals what was appended,
positions land on their lines, the sealed segments on disk are Kafka v2 batches in the codec that kafka-python
reads, the stored-bytes xattr shows the ratio; and kill -9 at random points of the background rewrite loses
nothing acknowledged and duplicates nothing."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from harness import sh, wait_for

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
SEGMENT = 256 << 10
KILL_CYCLES = 30 if os.environ.get("LOGFS_LONG") else 4


def log_lines(start: int, n: int, rng: random.Random) -> bytes:
    services = [b"api", b"db", b"auth", b"cache"]
    levels = [b"INFO", b"INFO", b"INFO", b"WARN", b"ERROR"]
    return b"".join(b'{"seq": %d, "service": "%s", "level": "%s", "msg": "request handled in %d ms", "user": %d}\n'
                    % (start + i, rng.choice(services), rng.choice(levels), rng.randrange(1, 900),
                       rng.randrange(1000)) for i in range(n))


def batches_of(path: str):
    """(codec, [(offset, value)]) of each batch of a .log file, read by kafka-python (an independent parser)."""
    from kafka.record.default_records import DefaultRecordBatch

    data = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        batch = DefaultRecordBatch(data[pos : pos + size])
        assert batch.validate_crc(), f"{path}: bad CRC at {pos}"
        out.append((batch.compression_type, [(r.offset, r.value) for r in batch]))
        pos += size
    return out


def sealed_logs(fs, topic="t", partition=0):
    d = fs.data / f"{topic}-{partition}"
    names = sorted(n for n in os.listdir(d) if n.endswith(".log"))
    return [str(d / n) for n in names[:-1]]


def active_log(fs, topic="t", partition=0):
    d = fs.data / f"{topic}-{partition}"
    return str(d / max(n for n in os.listdir(d) if n.endswith(".log")))


def all_compressed(fs, codec):
    logs = sealed_logs(fs)
    return bool(logs) and all(all(c == codec for c, _ in batches_of(p)) for p in logs)


@pytest.mark.parametrize("name", list(CODECS))
def test_a_compressed_topic_reads_as_it_was_appended(mount_logfs, name):
    codec = CODECS[name]
    rng = random.Random(codec)
    fs = mount_logfs(f"log.segment.bytes={SEGMENT}")
    os.mkdir(fs.path("t"))
    sh(f"setfattr -n user.logfs.config.compression.type -v {name} {fs.path('t')}")
    appended = b""
    for i in range(6):  # bulk appends (cat >>) and small ones (echo >>)
        chunk = log_lines(len(appended.splitlines()), 2000, rng)
        fs.append("t/0", chunk)
        appended += chunk
        for _ in range(20):
            line = log_lines(len(appended.splitlines()), 1, rng)
            sh(f"printf '%s' '{line.decode()}' >> {fs.path('t', 0)}")
            appended += line
    sh(f"setfattr -n user.logfs.config.segment.ms -v 100 {fs.path('t')}")  # seal the active one too
    wait_for(lambda: os.path.getsize(active_log(fs)) == 0, 30, interval=0.1, what="the time-based roll")
    wait_for(lambda: all_compressed(fs, codec) and len(sealed_logs(fs)) >= 4, 60, interval=0.2,
             what="the sealed segments to be rewritten")
    assert fs.read("t/0") == appended
    assert sh(f"cat {fs.path('t', 0)}").stdout == appended
    assert os.stat(fs.path("t", 0)).st_size == len(appended)
    lines = appended.splitlines(keepends=True)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line))
    for offset in rng.sample(range(len(lines)), 40):
        pos = int(fs.getx("t/0", f"position.{offset}"))
        assert pos == starts[offset]
        assert int(fs.getx("t/0", f"offset.{pos + 5}")) == offset
        with open(fs.path("t", 0), "rb") as f:  # dd skip= style: a read at the position starts with the line
            f.seek(pos)
            assert f.read(len(lines[offset])) == lines[offset]
    # kafka-python reads every sealed segment: batches in the codec, each offset once, the values appended.
    seen = []
    for path in sealed_logs(fs):
        for c, records in batches_of(path):
            assert c == codec
            seen.extend(records)
    assert [o for o, _ in seen] == list(range(len(seen)))
    assert [v + b"\n" for _, v in seen] == lines[: len(seen)]
    # Bytes as stored: st_size over size_bytes is the ratio.
    ratio = len(appended) / int(fs.getx("t/0", "size_bytes"))
    assert ratio > 2.0, ratio
    assert sh(f"getfattr --only-values -n user.logfs.config.compression.type {fs.path('t')}").stdout == name.encode()
    fs.remount(f"log.segment.bytes={SEGMENT}")
    assert fs.read("t/0") == appended


def test_dump_tool_shows_the_codec(mount_logfs):
    fs = mount_logfs(f"log.segment.bytes={SEGMENT}", "compression.type=zstd")
    os.mkdir(fs.path("t"))
    fs.append("t/0", log_lines(0, 4000, random.Random(1)))
    fs.append("t/0", log_lines(4000, 10, random.Random(2)))
    wait_for(lambda: all_compressed(fs, 4), 60, interval=0.2, what="the rewrite")
    out = subprocess.run([sys.executable, "-m", "logfs.tools.dump", "--deep-iteration", "--files",
                          sealed_logs(fs)[0]], capture_output=True, text=True, check=True).stdout
    assert "compresscodec: zstd" in out and "compresscodec: none" not in out
    records = [line for line in out.splitlines() if line.startswith("| offset: ")]
    assert records and records[0].startswith("| offset: 0 ") and "valueSize: " in records[0]


@pytest.mark.parametrize("cycle", range(KILL_CYCLES))
def test_kill9_during_the_rewrite_loses_nothing_and_duplicates_nothing(mount_logfs, cycle):
    rng = random.Random(1000 + cycle)
    opts = (f"log.segment.bytes={SEGMENT}", "compression.type=zstd")
    fs = mount_logfs(*opts)
    os.mkdir(fs.path("t"))
    appended = b""
    for _ in range(rng.randint(3, 8)):
        chunk = log_lines(len(appended.splitlines()), rng.randint(1000, 4000), rng)
        fs.append("t/0", chunk)
        appended += chunk
    time.sleep(rng.uniform(0, 0.6))  # somewhere in the rewrites of the sealed segments
    fs.kill9()
    fs.mount(*opts)
    assert fs.read("t/0") == appended  # every acknowledged line, once, in order
    wait_for(lambda: all_compressed(fs, 4), 60, interval=0.2, what="the rewrite after the restart")
    assert fs.read("t/0") == appended
    offsets = [o for p in sealed_logs(fs) for _, rs in batches_of(p) for o, _ in rs]
    assert offsets == list(range(len(offsets)))
    assert not [n for n in os.listdir(fs.data / "t-0") if n.endswith((".cleaned", ".swap"))]

"""kill -9 of the daemon during appends: after `fusermount3 -uz` and a remount, every line whose write+fsync
returned is present once and in order, and no partial line is ever served."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

from harness import wait_for

SYNCED_WRITER = textwrap.dedent("""
    import os, sys
    path, ack_path = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    ack = open(ack_path, "w", buffering=1)
    i = 0
    try:
        while True:
            os.write(fd, b"A-%06d-synced-line\\n" % i)
            os.fsync(fd)
            ack.write("%d\\n" % i)  # only after write+fsync returned
            i += 1
    except OSError as exc:
        sys.stderr.write("writer A stopped: %s\\n" % exc)
""")

CHUNKED_WRITER = textwrap.dedent("""
    import os, random, sys
    path = sys.argv[1]
    rng = random.Random(5)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    i = 0
    buf = b""
    try:
        while True:
            while len(buf) < 20000:
                buf += b"B-%06d-" % i + b"b" * rng.randrange(0, 300) + b"|\\n"
                i += 1
            n = rng.randrange(1, 5000)
            os.write(fd, buf[:n])  # lines split at arbitrary bytes, no fsync
            buf = buf[n:]
    except OSError as exc:
        sys.stderr.write("writer B stopped: %s\\n" % exc)
""")

LINE = re.compile(rb"^(?:A-(\d{6})-synced-line|B-(\d{6})-(b*)\|)$")


def test_kill9_during_appends_keeps_every_synced_line(mount_logfs, tmp_path):
    fs = mount_logfs("log.segment.bytes=16384", "log.index.interval.bytes=1024", foreground=True)
    os.mkdir(fs.path("t"))
    path = fs.path("t", 0)
    ack_path = tmp_path / "acks"
    ack_path.write_text("")
    writers = [
        subprocess.Popen([sys.executable, "-c", SYNCED_WRITER, path, str(ack_path)], stderr=subprocess.PIPE),
        subprocess.Popen([sys.executable, "-c", CHUNKED_WRITER, path], stderr=subprocess.PIPE),
    ]
    try:
        wait_for(lambda: ack_path.read_text().count("\n") >= 300, 60, what="300 synced appends")
        time.sleep(0.05)
        fs.kill9()
        for w in writers:
            w.wait(30)
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()
            w.stderr.close()
    acked = [int(x) for x in ack_path.read_text().splitlines()]
    assert acked == list(range(len(acked))) and len(acked) >= 300
    assert not os.path.exists(os.path.join(fs.data, ".kafka_cleanshutdown"))

    fs.mount("log.segment.bytes=16384", "log.index.interval.bytes=1024")
    data = fs.read("t/0")
    assert os.stat(path).st_size == len(data)
    assert data.endswith(b"\n"), "a partial line was served"
    lines = data[:-1].split(b"\n")
    a_seqs, b_seqs = [], []
    for line in lines:
        m = LINE.match(line)
        assert m, f"torn or foreign line served: {line[:100]!r}"
        if m.group(1) is not None:
            a_seqs.append(int(m.group(1)))
        else:
            b_seqs.append(int(m.group(2)))
    assert a_seqs == list(range(len(a_seqs))), "synced lines missing, duplicated or out of order"
    assert len(a_seqs) >= len(acked), f"only {len(a_seqs)} of {len(acked)} fsynced lines survived"
    assert b_seqs == list(range(len(b_seqs))), "unsynced lines must still form an in-order prefix"
    assert fs.getx("t/0", "log_end_offset") == str(len(lines))
    assert int(fs.getx("t/0", "segment_count")) > 1
    # The log is usable after recovery: appends continue, and a clean unmount/remount keeps everything.
    fs.append("t/0", "after-recovery\n")
    fs.remount()
    assert fs.read("t/0") == data + b"after-recovery\n"


def test_kill9_daemon_mode_then_lazy_unmount_and_remount(mount):
    os.mkdir(mount.path("t"))
    fd = os.open(mount.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"synced 1\nsynced 2\n")
        os.fsync(fd)
        os.write(fd, b"held partial")  # never committed: the daemon dies holding it
        mount.kill9()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert not mount.pids()
    mount.mount()
    data = mount.read("t/0")
    assert data == b"synced 1\nsynced 2\n"
    assert mount.getx("t/0", "recovery_point") == "2"

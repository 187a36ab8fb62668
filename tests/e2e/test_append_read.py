"""CONTRACT section 3: what reading a partition file shows, and appending to it."""

from __future__ import annotations

import errno
import os
import random
import select
import shlex
import subprocess
import sys
import textwrap
import time

import pytest

from harness import expect_errno, sh


@pytest.fixture
def topic(mount):
    os.mkdir(mount.path("t"))
    return mount


def size_of(path: str) -> int:
    return int(sh(f"stat -c %s {shlex.quote(path)}").stdout)


def test_shell_append_and_read_tools(topic):
    fs = topic
    p = fs.path("t", 0)
    q = shlex.quote(p)
    expected = b""
    assert size_of(p) == 0
    last_mtime = os.stat(p).st_mtime_ns
    for i in range(40):
        time.sleep(0.003)
        line = f"shell line {i} " + "x" * (i * 12) + "\n"
        sh(f"echo {shlex.quote(line[:-1])} >> {q}")
        expected += line.encode()
        assert size_of(p) == len(expected)
        st = os.stat(p)
        assert st.st_size == len(expected)
        assert st.st_mtime_ns > last_mtime, "st_mtime must move on append"
        last_mtime = st.st_mtime_ns
    for i in range(40):
        with open(p, "a") as f:
            f.write(f"python line {i}\n")
        expected += f"python line {i}\n".encode()
        assert size_of(p) == len(expected)
    assert len(expected) > 8192
    assert fs.read("t/0") == expected
    assert sh(f"cat {q}").stdout == expected
    assert sh(f"head -n 3 {q}").stdout == b"".join(expected.splitlines(keepends=True)[:3])
    assert sh(f"head -c 1000 {q}").stdout == expected[:1000]
    for n in (1, 5, 100, 4097, len(expected)):
        assert sh(f"tail -c {n} {q}").stdout == expected[-n:], n
    assert sh(f"tail -n 2 {q}").stdout == b"".join(expected.splitlines(keepends=True)[-2:])
    for skip in (0, 1, 17, 999, len(expected) - 3, len(expected)):
        out = sh(f"dd if={q} bs=1 skip={skip} status=none").stdout
        assert out == expected[skip:], skip
    for bs, skip in ((512, 3), (1000, 2), (4096, 1), (4096, 2), (65536, 0)):
        out = sh(f"dd if={q} bs={bs} skip={skip} status=none").stdout
        assert out == expected[bs * skip:], (bs, skip)
    assert sh(f"wc -l < {q}").stdout.strip() == b"80"
    assert fs.getx("t/0", "log_end_offset") == "80"


@pytest.mark.parametrize("segment_bytes", [None, 3000])
def test_pread_at_every_kind_of_position(mount_logfs, segment_bytes):
    fs = mount_logfs(*([f"log.segment.bytes={segment_bytes}", "log.index.interval.bytes=256"]
                       if segment_bytes else []))
    os.mkdir(fs.path("t"))
    lines = [f"{i}:{'y' * random.Random(i).randrange(0, 300)}\n".encode() for i in range(500)]
    data = b"".join(lines)
    fs.append("t/0", data)
    fd = os.open(fs.path("t", 0), os.O_RDONLY)
    try:
        rng = random.Random(7)
        for _ in range(200):
            pos = rng.randrange(0, len(data) + 10)
            size = rng.choice([1, 7, 100, 4096, 70000])
            assert os.pread(fd, size, pos) == data[pos:pos + size], (pos, size)
        # Sequential reads of odd sizes across every segment boundary.
        at, out = 0, b""
        while chunk := os.pread(fd, 333, at):
            out += chunk
            at += len(chunk)
        assert out == data
    finally:
        os.close(fd)
    if segment_bytes:
        assert int(fs.getx("t/0", "segment_count")) > 10
    assert sh(f"dd if={shlex.quote(fs.path('t', 0))} bs=1 skip=12345 count=3000 status=none").stdout == \
        data[12345:15345]


def test_partial_line_held_per_handle_until_newline_or_close(topic):
    fs = topic
    p = fs.path("t", 0)
    a = os.open(p, os.O_WRONLY | os.O_APPEND)
    b = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(a, b"alpha-")
        os.write(b, b"beta-")
        assert fs.read("t/0") == b"", "a partial line must not be visible"
        assert os.stat(p).st_size == 0
        os.write(a, b"one\nalpha-")
        assert fs.read("t/0") == b"alpha-one\n"
        os.write(b, b"two")
        os.write(b, b"\n")
        assert fs.read("t/0") == b"alpha-one\nbeta-two\n"
        assert os.stat(p).st_size == len(b"alpha-one\nbeta-two\n")
    finally:
        os.close(b)
    assert fs.read("t/0") == b"alpha-one\nbeta-two\n"
    os.close(a)  # closing commits the held partial line as a record
    assert fs.read("t/0") == b"alpha-one\nbeta-two\nalpha-\n"
    assert fs.getx("t/0", "log_end_offset") == "3"
    # The shell: printf without a trailing newline, appended at close.
    sh(f"printf 'no newline' >> {shlex.quote(p)}")
    assert fs.read("t/0").endswith(b"alpha-\nno newline\n")


def test_partial_line_survives_fork_and_child_processes(topic):
    """A forked child or an exec'd command closing its copy of the descriptor does not close the handle: the
    held partial line stays held (FUSE sends FLUSH for every such close, RELEASE only for the last)."""
    fs = topic
    p = fs.path("t", 0)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"start-")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        subprocess.run(["true"], check=True)  # its CLOEXEC copy is closed at exec
        os.write(fd, b"middle-")
        subprocess.run(["true"], check=True, pass_fds=(fd,))  # inherited and closed at exit
        assert fs.read("t/0") == b""
        os.write(fd, b"end\n")
        assert fs.read("t/0") == b"start-middle-end\n"
        os.write(fd, b"tail")
    finally:
        os.close(fd)
    assert fs.read("t/0") == b"start-middle-end\ntail\n"
    # The shell: an external command between two builtins inherits the redirected descriptor.
    sh(f"{{ printf 'x-'; /bin/true; printf 'y\\n'; }} >> {shlex.quote(p)}")
    assert fs.read("t/0") == b"start-middle-end\ntail\nx-y\n"
    assert fs.getx("t/0", "log_end_offset") == "3"


CLOSE_THEN_READ = textwrap.dedent("""
    import os, sys
    path = sys.argv[1]
    expected = b""
    for i in range(150):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"p%d" % i)  # no newline: appended when the handle is closed
        os.close(fd)
        expected += b"p%d\\n" % i
        r = os.open(path, os.O_RDONLY)
        try:
            got, size = os.pread(r, len(expected) + 100, 0), os.fstat(r).st_size
        finally:
            os.close(r)
        if got != expected or size != len(expected):
            sys.exit("after close %d: size %d, got ...%r" % (i, size, got[-20:]))
""")


def test_partial_line_visible_as_soon_as_close_returns(mount_logfs):
    fs = mount_logfs("num.partitions=6")
    os.mkdir(fs.path("t"))
    procs = [subprocess.Popen([sys.executable, "-c", CLOSE_THEN_READ, fs.path("t", p)], stderr=subprocess.PIPE)
             for p in range(6)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("segment_bytes", [None, 5000])
def test_writes_split_at_arbitrary_bytes(mount_logfs, segment_bytes):
    fs = mount_logfs(*([f"log.segment.bytes={segment_bytes}"] if segment_bytes else []))
    os.mkdir(fs.path("t"))
    rng = random.Random(1234)
    lines = [f"rec-{i}-" + "z" * rng.randrange(0, 200) for i in range(2000)]
    stream = "".join(l + "\n" for l in lines).encode()
    fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        at = 0
        while at < len(stream):
            n = rng.choice([1, 2, 3, rng.randrange(1, 50), rng.randrange(1, 700), rng.randrange(1, 9000)])
            at += os.write(fd, stream[at:at + n])
    finally:
        os.close(fd)
    assert fs.read("t/0") == stream
    assert fs.getx("t/0", "log_end_offset") == str(len(lines))


def test_large_single_write_split_by_kernel(topic):
    fs = topic
    data = b"".join(b"big-%08d-" % i + b"q" * (i % 97) + b"\n" for i in range(100_000))
    assert len(data) > 5 * 1024 * 1024
    fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    try:
        assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    assert os.stat(fs.path("t", 0)).st_size == len(data)
    assert fs.read("t/0") == data
    assert fs.getx("t/0", "log_end_offset") == "100000"


def test_empty_lines_are_records(topic):
    fs = topic
    fs.append("t/0", b"\n\na\n\n")
    assert fs.read("t/0") == b"\n\na\n\n"
    assert fs.getx("t/0", "log_end_offset") == "4"


def test_non_append_handle_only_at_end(topic):
    fs = topic
    p = fs.path("t", 0)
    fd = os.open(p, os.O_WRONLY)
    try:
        assert os.write(fd, b"first\n") == 6  # at offset 0 of an empty file = the end
        assert os.write(fd, b"second\n") == 7  # the fd position follows the end
        os.lseek(fd, 3, os.SEEK_SET)
        expect_errno(errno.EPERM, os.write, fd, b"XX\n")
        os.lseek(fd, 0, os.SEEK_END)
        assert os.write(fd, b"third\n") == 6
        expect_errno(errno.EPERM, os.pwrite, fd, b"Y\n", 0)
        expect_errno(errno.EPERM, os.pwrite, fd, b"Y\n", 100)  # beyond the end is not an append either
    finally:
        os.close(fd)
    assert fs.read("t/0") == b"first\nsecond\nthird\n"
    # A second handle opened earlier at position 0 cannot write into the middle after others appended.
    rw = os.open(p, os.O_RDWR)
    try:
        assert os.read(rw, 6) == b"first\n"
        expect_errno(errno.EPERM, os.write, rw, b"oops\n")
    finally:
        os.close(rw)
    assert fs.read("t/0") == b"first\nsecond\nthird\n"


def test_trunc_and_truncate_are_eperm(topic):
    fs = topic
    p = fs.path("t", 0)
    q = shlex.quote(p)
    fs.append("t/0", "keep me\n")
    expect_errno(errno.EPERM, os.open, p, os.O_WRONLY | os.O_TRUNC)
    r = sh(f"echo clobber > {q}", check=False)
    assert r.returncode != 0 and b"Operation not permitted" in r.stderr
    r = sh(f"truncate -s 2 {q}", check=False)
    assert r.returncode != 0 and b"Operation not permitted" in r.stderr
    r = sh(f"truncate -s 0 {q}", check=False)
    assert r.returncode != 0
    expect_errno(errno.EPERM, os.truncate, p, 3)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        expect_errno(errno.EPERM, os.ftruncate, fd, 1)
    finally:
        os.close(fd)
    assert fs.read("t/0") == b"keep me\n"
    assert os.stat(p).st_size == 8
    # O_TRUNC of an empty partition truncates nothing and is allowed (`>` on a fresh partition works).
    os.mkdir(fs.path("e"))
    sh(f"echo fresh > {shlex.quote(fs.path('e', 0))}")
    assert fs.read("e/0") == b"fresh\n"


def test_efbig_over_max_message_bytes(mount_logfs):
    fs = mount_logfs("message.max.bytes=1000")
    os.mkdir(fs.path("t"))
    p = fs.path("t", 0)
    fs.append("t/0", "before\n")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        expect_errno(errno.EFBIG, os.write, fd, b"x" * 1001 + b"\n")
        # Good lines around the long one: nothing of the write is appended.
        expect_errno(errno.EFBIG, os.write, fd, b"ok1\nok2\n" + b"y" * 1500 + b"\nok3\n")
        # A long trailing partial line fails too.
        expect_errno(errno.EFBIG, os.write, fd, b"ok4\n" + b"z" * 1001)
        assert fs.read("t/0") == b"before\n"
        assert fs.getx("t/0", "log_end_offset") == "1"
        # Exactly the limit is accepted.
        exact = b"e" * 1000 + b"\n"
        assert os.write(fd, exact) == len(exact)
        assert fs.read("t/0") == b"before\n" + exact
        # A partial line that grows over the limit across writes fails when it crosses it, and is refused
        # whole: its 600 bytes already taken are dropped, and so is the rest of it, up to its newline.
        os.write(fd, b"p" * 600)
        expect_errno(errno.EFBIG, os.write, fd, b"p" * 600 + b"\n")
        os.write(fd, b"\n")
        os.write(fd, b"q\n")
    finally:
        os.close(fd)
    assert fs.read("t/0") == b"before\n" + b"e" * 1000 + b"\n" + b"q\n"
    assert fs.getx("t/0", "log_end_offset") == "3"
    r = sh(f"head -c 1500 /dev/zero | tr '\\0' a >> {shlex.quote(p)}", check=False)
    assert r.returncode != 0 and b"too large" in r.stderr.lower()
    assert fs.getx("t/0", "log_end_offset") == "3"


@pytest.mark.parametrize("segment_bytes", [None, 4096])
def test_read_handle_keeps_its_view_and_sees_appends(mount_logfs, segment_bytes):
    fs = mount_logfs(*([f"log.segment.bytes={segment_bytes}"] if segment_bytes else []))
    os.mkdir(fs.path("t"))
    first = b"".join(b"old %d\n" % i for i in range(1000))
    fs.append("t/0", first)
    with open(fs.path("t", 0), "rb", buffering=0) as f:
        part = f.read(1234)
        assert part == first[:1234]
        more = b"".join(b"new %d\n" % i for i in range(500))
        fs.append("t/0", more)
        rest = b""
        while chunk := f.read(777):
            rest += chunk
        assert part + rest == first + more
        # Still following: another append shows up on the same handle.
        fs.append("t/0", "later\n")
        assert f.read() == b"later\n"
        # Seeking back re-reads the same bytes.
        f.seek(1000)
        assert f.read(5000) == (first + more + b"later\n")[1000:6000]
    if segment_bytes:
        assert int(fs.getx("t/0", "segment_count")) > 3


def test_write_visible_to_other_readers_at_once(topic):
    fs = topic
    p = fs.path("t", 0)
    reader = os.open(p, os.O_RDONLY)
    writer = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(50):
            os.write(writer, b"r%d\n" % i)
            expected = b"".join(b"r%d\n" % j for j in range(i + 1))
            assert os.pread(reader, 1 << 20, 0) == expected
            assert os.fstat(reader).st_size == len(expected)
    finally:
        os.close(reader)
        os.close(writer)


def _read_available(stream, want: bytes, timeout: float) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    while not got.endswith(want):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            got += chunk
    return got


@pytest.mark.parametrize("segment_bytes", [None, 4096])
def test_tail_f_follows_appends(mount_logfs, segment_bytes):
    fs = mount_logfs(*([f"log.segment.bytes={segment_bytes}"] if segment_bytes else []))
    os.mkdir(fs.path("t"))
    fs.append("t/0", "existing 1\nexisting 2\n")
    proc = subprocess.Popen(["tail", "-f", "-s", "0.1", "-n", "+1", fs.path("t", 0)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        got = _read_available(proc.stdout, b"existing 2\n", 10)
        assert got == b"existing 1\nexisting 2\n"
        for i in range(3):
            sh(f"echo follow-{i} >> {shlex.quote(fs.path('t', 0))}")
            got = _read_available(proc.stdout, f"follow-{i}\n".encode(), 10)
            assert got == f"follow-{i}\n".encode()
        big = b"".join(b"bulk %d\n" % i for i in range(2000))
        fs.append("t/0", big)
        got = _read_available(proc.stdout, b"bulk 1999\n", 10)
        assert got == big
        if segment_bytes:
            assert int(fs.getx("t/0", "segment_count")) > 3  # followed across segment rolls
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


WRITER = textwrap.dedent("""
    import os, random, sys
    path, wid, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(wid)
    data = b"".join(b"w%02d-%05d-" % (wid, i) + bytes([97 + wid]) * rng.randrange(0, 120) + b"|\\n"
                    for i in range(count))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    at = 0
    while at < len(data):
        at += os.write(fd, data[at:at + rng.choice([1, 5, 64, 333, 1000, 5000])])
    os.close(fd)
""")


def test_concurrent_writers_never_interleave(topic):
    fs = topic
    writers, count = 8, 500
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, fs.path("t", 0), str(w), str(count)])
             for w in range(writers)]
    for proc in procs:
        assert proc.wait(120) == 0
    lines = fs.read("t/0").split(b"\n")
    assert lines[-1] == b""
    lines = lines[:-1]
    assert len(lines) == writers * count
    assert len(set(lines)) == len(lines), "a line appears twice"
    seen: dict[int, list[int]] = {w: [] for w in range(writers)}
    for line in lines:
        assert line.startswith(b"w") and line.endswith(b"|"), line[:80]
        wid, seq = int(line[1:3]), int(line[4:9])
        body = line[10:-1]
        assert body == bytes([97 + wid]) * len(body), f"interleaved line: {line[:80]!r}"
        seen[wid].append(seq)
    for wid, seqs in seen.items():
        assert seqs == list(range(count)), f"writer {wid} lines missing or out of order"
    assert fs.getx("t/0", "log_end_offset") == str(writers * count)


def test_read_only_mount(mount_logfs):
    fs = mount_logfs()
    os.mkdir(fs.path("t"))
    fs.append("t/0", "written before\n")
    fs.remount("ro")
    assert fs.read("t/0") == b"written before\n"
    expect_errno(errno.EROFS, os.open, fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    expect_errno(errno.EROFS, os.mkdir, fs.path("u"))
    assert fs.getx("t/0", "log_end_offset") == "1"

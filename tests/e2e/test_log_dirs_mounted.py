"""Several log directories (CONTRACT section 12, issue 35): placement, user.logfs.log_dir, moves under appends and
readers, remounts. The crash points and disk faults of a move: tests/reliability/test_rel_log_dirs.py; the engine alone:
tests/storage/test_log_dirs_engine.py."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from harness import append_synced, daemon_env, wait_for

pytestmark = pytest.mark.mount

LOG_DIR = "user.logfs.log_dir"


def _dirs(root, n: int) -> list[str]:
    paths = [str(root / f"disk{i}") for i in range(1, n + 1)]
    for p in paths:
        os.makedirs(p, exist_ok=True)
    return paths


def _mount(mount_logfs, n: int, *options: str, name: str = "fs"):
    """A mount over ``n`` log directories (``disk1,...,diskN`` beside its mountpoint)."""
    dirs: list[str] = []

    def prepare(m):
        dirs.extend(_dirs(m.root, n))
        m.source = ",".join(dirs)

    fs = mount_logfs(*options, name=name, prepare=prepare)
    return fs, dirs


def _log_dir(fs, topic: str, partition: int) -> str:
    return os.getxattr(fs.path(topic, partition), LOG_DIR).decode()


def _move(fs, topic: str, partition: int, target: str) -> None:
    """``setfattr -n user.logfs.log_dir -v target``: the move starts (it runs in the background, as Kafka's
    reassignment does); wait until it is done."""
    path = fs.path(topic, partition)
    os.setxattr(path, LOG_DIR, target.encode())

    def done():
        try:
            os.getxattr(path, "user.logfs.future_log_dir")
            return False
        except OSError as exc:
            assert exc.errno == errno.ENODATA
            return True

    wait_for(done, 120, what=f"the move of {topic}/{partition} to {target}")
    assert _log_dir(fs, topic, partition) == target.rstrip("/")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_placement_over_three_directories_and_remounts(mount_logfs):
    fs, dirs = _mount(mount_logfs, 3, "num.partitions=5")
    os.mkdir(fs.path("t"))
    # Kafka's placement: the directory with the fewest partitions, the first named on a tie.
    assert [_log_dir(fs, "t", p) for p in range(5)] == [dirs[0], dirs[1], dirs[2], dirs[0], dirs[1]]
    for p in range(5):
        append_synced(fs.path("t", p), [f"{p}-{i}".encode() for i in range(100)])
    # Each directory is a Kafka log directory of its own: its partitions, its lock, its topics file.
    for i, d in enumerate(dirs):
        names = set(os.listdir(d))
        assert {f"t-{p}" for p in range(5) if p % 3 == i} <= names
        assert {".lock", "logfs-topics.json"} <= names
    fs.unmount()
    for d in dirs:
        assert ".kafka_cleanshutdown" in os.listdir(d), d  # each gets its own clean-shutdown marker
        assert "recovery-point-offset-checkpoint" in os.listdir(d)
    fs.mount("num.partitions=1")
    for p in range(5):
        assert _read(fs.path("t", p)) == b"".join(f"{p}-{i}\n".encode() for i in range(100))
        assert _log_dir(fs, "t", p) == dirs[p % 3]
    os.mkdir(fs.path("u"))  # the third directory holds the fewest (1)
    assert _log_dir(fs, "u", 0) == dirs[2]
    with open(fs.path("t", 5), "w"):  # a new partition of an existing topic: placed the same way
        pass
    assert _log_dir(fs, "t", 5) in dirs
    assert "user.logfs.log_dir" not in os.listxattr(fs.path("t", 0))  # read by name (listxattr: CONTRACT section 4)


def test_one_directory_is_the_one_directory_case(mount):
    os.mkdir(mount.path("t"))
    assert _log_dir(mount, "t", 0) == str(mount.data)


def test_log_dir_refusals(mount_logfs, tmp_path):
    fs, dirs = _mount(mount_logfs, 2, "num.partitions=1")
    os.mkdir(fs.path("t"))
    append_synced(fs.path("t", 0), [b"a", b"b"])
    for bad in (str(tmp_path), "", "relative-nowhere", dirs[0] + "x"):
        with pytest.raises(OSError) as info:
            os.setxattr(fs.path("t", 0), LOG_DIR, bad.encode())
        assert info.value.errno == errno.EINVAL, bad
    os.setxattr(fs.path("t", 0), LOG_DIR, dirs[0].encode())  # where it is: nothing to do
    assert _log_dir(fs, "t", 0) == dirs[0]
    with pytest.raises(OSError) as info:
        os.removexattr(fs.path("t", 0), LOG_DIR)
    assert info.value.errno == errno.EPERM
    _move(fs, "t", 0, dirs[1] + "/")  # a trailing slash is the same directory
    assert _read(fs.path("t", 0)) == b"a\nb\n"


def test_a_move_under_appends_and_a_tail_f_reader(mount_logfs):
    fs, dirs = _mount(mount_logfs, 2, "num.partitions=1", "log.segment.bytes=65536", "log.index.interval.bytes=512")
    os.mkdir(fs.path("t"))
    path = fs.path("t", 0)
    append_synced(path, [f"before {i:06d}".encode() for i in range(20000)])  # several segments to copy
    tail = subprocess.Popen(["tail", "-n", "+1", "-f", path], stdout=subprocess.PIPE)
    reader = os.open(path, os.O_RDONLY)  # a reader that stays open across both moves
    written: list[bytes] = [f"before {i:06d}".encode() for i in range(20000)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            i = 0
            while not stop.is_set():
                line = f"during {i:06d}".encode()
                assert os.write(fd, line + b"\n") == len(line) + 1
                written.append(line)
                i += 1
                if i % 500 == 0:
                    os.fsync(fd)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        finally:
            os.close(fd)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.3)
        _move(fs, "t", 0, dirs[1])
        time.sleep(0.3)
        _move(fs, "t", 0, dirs[0])  # and back
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    expected = b"".join(line + b"\n" for line in written)
    assert _read(path) == expected
    got = b""
    while len(got) < len(expected):
        chunk = os.read(reader, 1 << 20)
        assert chunk, f"the open reader stopped at {len(got)} of {len(expected)} bytes"
        got += chunk
    os.close(reader)
    assert got == expected

    tail_out = b""
    deadline = time.monotonic() + 20
    os.set_blocking(tail.stdout.fileno(), False)
    while time.monotonic() < deadline and len(tail_out) < len(expected):
        try:
            chunk = os.read(tail.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        tail_out += chunk
    tail.kill()
    tail.wait()
    assert tail_out == expected, "tail -f saw each line once, in order, across both moves"
    # The source copies go after file.delete.delay.ms (default 60 s): renamed for deletion meanwhile.
    assert not [n for n in os.listdir(dirs[1]) if n.startswith("t-0")] or \
        all(n.endswith("-delete") for n in os.listdir(dirs[1]) if n.startswith("t-0"))
    fs.remount()
    assert _read(path) == expected
    assert _log_dir(fs, "t", 0) == dirs[0]
    assert not [n for n in os.listdir(dirs[1]) if n.startswith("t-0")]  # purged at the mount


def test_a_moved_partition_keeps_its_offsets_start_and_settings(mount_logfs):
    fs, dirs = _mount(mount_logfs, 2, "num.partitions=1", "log.segment.bytes=4096")
    os.mkdir(fs.path("t"))
    os.setxattr(fs.path("t"), "user.logfs.config.retention.bytes", b"100000000")
    append_synced(fs.path("t", 0), [f"{i}".encode() for i in range(2000)])
    os.setxattr(fs.path("t", 0), "user.logfs.log_start_offset", b"1500")  # DeleteRecords, then the move
    before = {n: os.getxattr(fs.path("t", 0), f"user.logfs.{n}") for n in ("log_start_offset", "log_end_offset")}
    _move(fs, "t", 0, dirs[1])
    after = {n: os.getxattr(fs.path("t", 0), f"user.logfs.{n}") for n in ("log_start_offset", "log_end_offset")}
    assert before == after == {"log_start_offset": b"1500", "log_end_offset": b"2000"}
    assert _read(fs.path("t", 0)) == b"".join(f"{i}\n".encode() for i in range(1500, 2000))
    assert os.getxattr(fs.path("t", 0), "user.logfs.offset.0") == b"1500"
    fs.kill9()  # no clean shutdown: the target's checkpoints were written before the commit point
    fs.mount(*fs.options)
    assert _log_dir(fs, "t", 0) == dirs[1]
    assert os.getxattr(fs.path("t", 0), "user.logfs.log_start_offset") == b"1500"
    assert _read(fs.path("t", 0)) == b"".join(f"{i}\n".encode() for i in range(1500, 2000))
    assert os.getxattr(fs.path("t"), "user.logfs.config.retention.bytes") == b"100000000"


def test_a_partition_in_two_directories_is_refused_at_mount(mount_logfs):
    fs, dirs = _mount(mount_logfs, 2, "num.partitions=1")
    os.mkdir(fs.path("t"))
    append_synced(fs.path("t", 0), [b"x"])
    fs.unmount()
    subprocess.run(["cp", "-a", os.path.join(dirs[0], "t-0"), os.path.join(dirs[1], "t-0")], check=True)
    result = subprocess.run(fs.command(), capture_output=True, timeout=60)
    assert result.returncode != 0
    assert b"in two log directories" in result.stderr, result.stderr


def test_overlapping_or_repeated_log_directories_are_refused(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    a = tmp_path / "a"
    for source in (f"{a},{a}", f"{a},{a}/sub", f"{a},"):
        result = subprocess.run([sys.executable, "-m", "logfs.cli", source, str(mnt)], capture_output=True,
                                timeout=60, env=daemon_env())
        assert result.returncode == 2, (source, result.stderr)
        assert b"log directories" in result.stderr, result.stderr


def test_compaction_and_compression_in_every_directory(mount_logfs):
    fs, dirs = _mount(mount_logfs, 2, "num.partitions=2", "log.segment.bytes=2048", "log.cleaner.backoff.ms=50",
                      "log.cleaner.min.cleanable.ratio=0.01", "log.roll.ms=300")
    os.mkdir(fs.path("kv"))
    for key, value in (("logfs.key.separator", "="), ("cleanup.policy", "compact")):
        os.setxattr(fs.path("kv"), f"user.logfs.config.{key}", value.encode())
    os.mkdir(fs.path("z"))
    os.setxattr(fs.path("z"), "user.logfs.config.compression.type", b"zstd")
    assert [_log_dir(fs, "kv", p) for p in (0, 1)] == dirs
    assert _log_dir(fs, "z", 1) == dirs[1] or _log_dir(fs, "z", 0) == dirs[1]
    for p in (0, 1):
        append_synced(fs.path("kv", p), [f"k{i % 4}=v{i}".encode() for i in range(400)])
        append_synced(fs.path("z", p), [f"compressible line {i} {'x' * 80}".encode() for i in range(2000)])
    filler = iter(range(10 ** 6))

    def compacted(p: int) -> bool:
        append_synced(fs.path("kv", p), [f"f=filler{next(filler)}".encode()])  # new dirty data: the cleaner comes back
        keyed = [line for line in _read(fs.path("kv", p)).splitlines() if line.startswith(b"k")]
        return sorted(keyed) == [f"k{k}=v{396 + k}".encode() for k in range(4)]

    for p in (0, 1):
        wait_for(lambda: compacted(p), 30, what=f"compaction of kv/{p} in {dirs[p]}")
    plain = 2000 * len(b"compressible line 1000 " + b"x" * 80 + b"\n")
    wait_for(lambda: all(int(os.getxattr(fs.path("z", p), "user.logfs.size_bytes")) < plain // 3 for p in (0, 1)),
             60, what="both partitions of z compressed")
    for p in (0, 1):
        assert _read(fs.path("z", p)) == b"".join(f"compressible line {i} {'x' * 80}\n".encode()
                                                  for i in range(2000))


def test_descriptor_positions_across_a_move(mount_logfs):
    """A descriptor opened before a move between log directories answers in its own view after it, and after
    DeleteRecords there (CONTRACT section 4, "Positions belong to a view")."""
    fs, dirs = _mount(mount_logfs, 2, "log.segment.bytes=2048", "log.segment.delete.delay.ms=0",
                      "log.retention.check.interval.ms=50")
    os.mkdir(fs.path("t"))
    lines = [b"moved-%05d-%s\n" % (i, b"m" * (i % 13)) for i in range(800)]
    with open(fs.path("t", 0), "ab") as f:
        f.write(b"".join(lines))
    fd = os.open(fs.path("t", 0), os.O_RDONLY)
    try:
        source = _log_dir(fs, "t", 0)
        _move(fs, "t", 0, next(d for d in dirs if d != source))
        os.setxattr(fs.path("t", 0), "user.logfs.log_start_offset", b"500")
        assert int(os.getxattr(fd, "user.logfs.log_start_offset")) == 0
        for n in range(0, 800, 37):
            pos = int(os.getxattr(fd, f"user.logfs.position.{n}"))
            assert os.pread(fd, len(lines[n]), pos) == lines[n]
        assert int(os.getxattr(fs.path("t", 0), "user.logfs.position.500")) == 0
    finally:
        os.close(fd)

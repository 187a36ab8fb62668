"""Many partitions on one mount (CONTRACT.md section 1): the daemon's descriptors and maps follow the partitions in
use, within half of its RLIMIT_NOFILE, not the partitions on disk. 1,500 partitions under a limit of 512
descriptors (the daemon cannot raise it past the hard limit prlimit sets): every one takes appends and reads,
the store remounts, and a handle held open all along keeps reading what it pinned. (tools/bench_scale.py runs the
same at 20,000 with the figures in docs/benchmarks.md.)"""

from __future__ import annotations

import os
import subprocess

LIMIT = 512
BUDGET = LIMIT // 2  # storage/local/open_files.py: half of the soft limit
TOPICS = 300
PER_TOPIC = 5
# The daemon's own descriptors besides segment files: the FUSE device, trio's, the .lock, std streams...
OWN_FDS = 40
SHUTDOWN_TIMEOUT = 300


def daemon_figures(fs) -> tuple[int, int]:
    pid = fs.pid()
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    return len(os.listdir(f"/proc/{pid}/fd")), maps


def nofile_limits(fs) -> tuple[int, int]:
    with open(f"/proc/{fs.pid()}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def unmount(fs) -> None:
    """A clean unmount, waited for: it flushes every partition appended to (an fsync each, several for those with
    index entries), longer than the helpers' usual wait on a loaded machine."""
    pids = fs.pids()
    subprocess.run(["fusermount3", "-u", str(fs.mnt)], check=True, timeout=60)
    fs.wait_exit(pids, timeout=SHUTDOWN_TIMEOUT)


def first(i: int) -> bytes:
    return b"first line of partition %d\n" % i


def second(i: int) -> bytes:
    return b"second line %d\n" % i


def test_1500_partitions_within_512_descriptors(mount_logfs):
    def limited(m) -> None:
        m.wrapper = ["prlimit", f"--nofile={LIMIT}:{LIMIT}", "--"]

    fs = mount_logfs(f"num.partitions={PER_TOPIC}", prepare=limited)
    assert nofile_limits(fs) == (LIMIT, LIMIT)
    fds_at_start, maps_at_start = daemon_figures(fs)
    for t in range(TOPICS):
        os.mkdir(fs.path(f"t{t:04d}"))
    paths = [fs.path(f"t{t:04d}", p) for t in range(TOPICS) for p in range(PER_TOPIC)]

    fs.append(os.path.relpath(paths[0], fs.mnt), first(0))
    held = os.open(paths[0], os.O_RDONLY)  # pins partition 0's segment for as long as it stays open
    try:
        peak = 0
        for i, path in enumerate(paths[1:], start=1):
            fs.append(os.path.relpath(path, fs.mnt), first(i))
            if i % 250 == 0:
                peak = max(peak, daemon_figures(fs)[0])
        fds, maps = daemon_figures(fs)
        peak = max(peak, fds)
        assert peak <= BUDGET + OWN_FDS, f"{peak} descriptors for {len(paths)} partitions"
        assert maps <= maps_at_start + BUDGET
        for i, path in enumerate(paths):
            assert fs.read(os.path.relpath(path, fs.mnt)) == first(i), path
        assert daemon_figures(fs)[0] <= BUDGET + OWN_FDS
        # Partitions with index entries, looked up through them: index maps too stay within the budget.
        bulk = b"".join(b"%05d " % n + b"y" * 94 + b"\n" for n in range(300))  # 101-byte lines
        for i, path in enumerate(paths[1:BUDGET + 200], start=1):
            rel = os.path.relpath(path, fs.mnt)
            for start in range(0, len(bulk), 30 * 101):  # 3 KB writes: 10 batches, index entries every 2
                fs.append(rel, bulk[start:start + 30 * 101])
            assert fs.getx(rel, "position.200") == str(len(first(i)) + 199 * 101)
            assert fs.getx(rel, f"offset.{len(first(i)) + 250 * 101}") == "251"
            assert int(fs.getx(rel, "time.0")) == 0
        fds, maps = daemon_figures(fs)
        assert fds <= BUDGET + OWN_FDS and maps <= maps_at_start + BUDGET, (fds, maps)
        with os.scandir(fs.path(f"t{TOPICS - 1:04d}")) as entries:
            assert sorted(e.name for e in entries) == [str(p) for p in range(PER_TOPIC)]
        fs.append("t0000/0", second(0))
        assert os.pread(held, 1 << 16, 0) == first(0) + second(0)
    finally:
        os.close(held)

    unmount(fs)
    fs.mount(*fs.options)
    assert nofile_limits(fs) == (LIMIT, LIMIT)
    fds, maps = daemon_figures(fs)
    assert fds <= fds_at_start + 4, f"{fds} descriptors right after mounting {len(paths)} partitions"
    assert maps <= maps_at_start + 16
    assert fs.read("t0000/0") == first(0) + second(0)
    for i, path in enumerate(paths[1:], start=1):
        rel = os.path.relpath(path, fs.mnt)
        fs.append(rel, second(i))
        expect = first(i) + (bulk if i < BUDGET + 200 else b"") + second(i)
        assert fs.read(rel) == expect, path
    fds, maps = daemon_figures(fs)
    assert fds <= BUDGET + OWN_FDS and maps <= maps_at_start + BUDGET
    assert fs.getx(f"t{TOPICS - 79:04d}/3", "log_end_offset") == "2"
    unmount(fs)

"""Faults: a full disk, damaged index and checkpoint files, and a second daemon on a data directory in use.

- Disk full: DATA_DIR is a small tmpfs, filled by a file the test places there. Writers get ENOSPC (or EIO),
  never a crash (a store through an index mapping into a hole of a full filesystem is SIGBUS); the daemon logs
  a clear line, keeps serving reads and xattrs, loses nothing it acknowledged and appends nothing of a failed
  write(); once the filler is deleted appends resume; a clean remount and a kill -9 + remount keep everything.
- Index files (.index, .timeindex, .viewindex) missing, truncated, zeroed or garbage, in sealed and active
  segments, after clean and unclean shutdowns: the store mounts and serves exactly the data it held.
- Checkpoint files missing, garbage, stale (from earlier) or out of range: the same.
- A second daemon on the same DATA_DIR (or a DATA_DIR whose .lock another process holds) fails with one clear
  line and changes nothing on disk (a hash of every file, with mtimes, before and after).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from rel_helpers import (
    LogfsMount, daemon_env, diff_hashes, mount_tmpfs, mounted_at, record_stats, scale, store_hash, umount_tmpfs,
    wait_for,
)

pytestmark = pytest.mark.mount


# -- disk full ----------------------------------------------------------------------------------------------
def _try_write(fd: int, data: bytes):
    try:
        n = os.write(fd, data)
        assert n == len(data)
        return None
    except OSError as exc:
        return exc.errno


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_full_enospc_then_resume(tmp_path, profile):
    rng = random.Random(11)
    fs = LogfsMount(tmp_path / "fs")
    opts = ["num.partitions=2", "log.segment.bytes=131072", "log.index.interval.bytes=128",
            "log.flush.offset.checkpoint.interval.ms=100", "log.segment.delete.delay.ms=0"]
    mount_tmpfs(fs.data, "6m")
    fds: dict[int, int] = {}
    stats = {"fills": 0, "writes_ok": 0, "writes_enospc": 0, "writes_eio": 0, "failed_writes_appended": 0,
             "lost": 0, "kills_while_full": 0}
    try:
        fs.mount(*opts, foreground=True)
        os.mkdir(fs.path("t"))
        expected = {0: [], 1: []}  # acknowledged lines per partition, in order
        seq = 0
        fds.update({p: os.open(fs.path("t", p), os.O_WRONLY | os.O_APPEND) for p in (0, 1)})

        def one_write(p):
            nonlocal seq
            n = rng.choice([1, 3, 40, 900])  # 900 lines of ~110 bytes: several batches in one write()
            lines = [b"p%d-%07d-%s" % (p, seq + i, b"z" * rng.randrange(60, 140)) for i in range(n)]
            seq += n
            err = _try_write(fds[p], b"".join(line + b"\n" for line in lines))
            if err is None:
                expected[p].extend(lines)
                stats["writes_ok"] += 1
            else:
                assert err in (errno.ENOSPC, errno.EIO), f"unexpected errno {errno.errorcode.get(err, err)}"
                stats["writes_enospc" if err == errno.ENOSPC else "writes_eio"] += 1
            return err

        def check_content(where):
            for p in (0, 1):
                data = fs.read(f"t/{p}")
                want = b"".join(line + b"\n" for line in expected[p])
                if data != want:
                    shown = set(data.split(b"\n"))
                    missing = [line for line in expected[p] if line not in shown]
                    stats["lost"] += len(missing)
                    extra = len(data.split(b"\n")) - 1 - len(expected[p])
                    raise AssertionError(f"{where}: t/{p}: {len(missing)} acknowledged lines missing, "
                                         f"{extra} lines more than acknowledged (a failed write appended)")
                assert os.stat(fs.path("t", p)).st_size == len(want)
                assert int(fs.getx(f"t/{p}", "log_end_offset")) == len(expected[p])

        for round_ in range(scale(2, 5)):
            seen = len(fs.stderr())
            # Fill the tmpfs, leaving a little room for logfs.
            st = os.statvfs(fs.data)
            free = st.f_bavail * st.f_frsize
            filler = fs.data / "filler"
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - rng.randrange(100_000, 600_000)))
            stats["fills"] += 1
            failures = 0
            for _ in range(2000):
                if one_write(rng.randrange(2)) is not None:
                    failures += 1
                    if failures >= 25:
                        break
            assert failures >= 25, "the disk never filled up"
            # Take the last free bytes too, so that background work (checkpoints every 100 ms) fails as well; and
            # again while waiting, since the daemon may free a page meanwhile (a failed append's partial write cut
            # off), which a checkpoint, replacing its file with one of the same size, could then use forever.
            def take_the_rest() -> None:
                with open(fs.data / "filler2", "ab", buffering=0) as f:
                    for chunk in (4096, 1):
                        try:
                            while True:
                                f.write(b"\0" * chunk)
                        except OSError as exc:
                            assert exc.errno == errno.ENOSPC

            take_the_rest()
            wait_for(lambda: take_the_rest() or "writing checkpoints failed" in fs.stderr()[seen:], 10,
                     interval=0.2, what="a checkpoint to fail")
            for _ in range(5):  # (a failed append truncates its partial write: a small one may fit again)
                one_write(rng.randrange(2))
            # Still serving: reads, stat, xattrs, listing; nothing acknowledged lost, nothing failed appended.
            assert fs.proc.poll() is None, f"the daemon died on a full disk:\n{fs.stderr()[-3000:]}"
            check_content(f"round {round_}, disk full")
            assert os.listdir(fs.mnt) == ["t"]
            err = fs.stderr()
            assert "No space left on device" in err, err[-2000:]
            assert "Traceback" not in err, err[-3000:]
            if round_ % 2 == 1:
                # A crash while the disk is full: recovery keeps every acknowledged line.
                for fd in fds.values():
                    os.close(fd)
                fds.clear()
                fs.kill9()
                stats["kills_while_full"] += 1
                os.unlink(filler)
                os.unlink(fs.data / "filler2")
                fs.mount(*opts, foreground=True)
                fds.update({p: os.open(fs.path("t", p), os.O_WRONLY | os.O_APPEND) for p in (0, 1)})
                check_content(f"round {round_}, after kill -9 while full")
            else:
                os.unlink(filler)
                os.unlink(fs.data / "filler2")
                wait_for(lambda: "writing checkpoints works again" in fs.stderr()[seen:], 10,
                         what="checkpoints to work again")
            # Appends resume once space returns.
            wait_for(lambda: one_write(0) is None, 10, interval=0.05, what="appends to resume")
            for _ in range(20):
                assert one_write(rng.randrange(2)) is None
            check_content(f"round {round_}, after space returned")
        for fd in fds.values():
            os.close(fd)
        fds.clear()
        fs.remount(*opts, foreground=True)
        check_content("after a clean remount")
        err = fs.stderr()
        assert "Traceback" not in err, err[-3000:]
        stats["enospc_log_lines"] = err.count("No space left on device")
        stats["background_failures_logged"] = err.count("failed (will retry)")
    finally:
        record_stats("disk_full", **stats)
        for fd in fds.values():  # (a failed assertion leaves them open: the unmount would wait for them)
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            fs.cleanup()
        finally:
            umount_tmpfs(fs.data)
    assert stats["writes_enospc"] + stats["writes_eio"] > 0


# -- damaged index files ------------------------------------------------------------------------------------------
DAMAGES = ["missing", "truncated-odd", "truncated-half", "zeroed", "garbage", "garbage-prefix"]
KINDS = [".index", ".timeindex", ".viewindex"]


def _damage(path: str, how: str, rng: random.Random) -> None:
    size = os.path.getsize(path)
    if how == "missing":
        os.unlink(path)
    elif how == "truncated-odd":
        os.truncate(path, max(0, size - rng.randrange(1, 8)) if size else 0)
    elif how == "truncated-half":
        os.truncate(path, size // 2)
    elif how == "zeroed":
        with open(path, "r+b") as f:
            f.write(bytes(size))
    elif how == "garbage":
        with open(path, "r+b") as f:
            f.write(rng.randbytes(size or 37))
    elif how == "garbage-prefix":  # the first entries overwritten, the rest intact
        with open(path, "r+b") as f:
            f.write(rng.randbytes(min(size, 24) or 24))
    else:
        raise ValueError(how)


def _fill_store(fs: LogfsMount, topic: str, partitions: int, rng: random.Random) -> None:
    os.mkdir(fs.path(topic))
    for p in range(1, partitions):
        open(fs.path(topic, p), "a").close()
    for p in range(partitions):
        n = rng.randrange(300, 700)
        lines = b"".join(b"%s-%d line %05d %s\n" % (topic.encode(), p, i, b"v" * rng.randrange(0, 60))
                         for i in range(n))
        fd = os.open(fs.path(topic, p), os.O_WRONLY | os.O_APPEND)
        try:
            for at in range(0, len(lines), 1500):  # writes cut anywhere, many batches
                os.write(fd, lines[at:at + 1500])
        finally:
            os.close(fd)


def _snapshot(fs: LogfsMount, rels: list[str], rng: random.Random) -> dict:
    out = {}
    for rel in rels:
        path = fs.path(*rel.split("/"))
        data = fs.read(rel)
        lso, leo = int(fs.getx(rel, "log_start_offset")), int(fs.getx(rel, "log_end_offset"))
        starts, pos = [], 0
        for line in data.split(b"\n")[:-1]:
            starts.append(pos)
            pos += len(line) + 1
        picks = rng.sample(range(len(starts)), min(12, len(starts)))
        xattrs = {f"position.{lso + i}": str(starts[i]) for i in picks}
        xattrs.update({f"offset.{starts[i] + 1}": str(lso + i) for i in picks})
        xattrs[f"position.{leo}"] = str(len(data))
        out[rel] = (data, os.stat(path).st_size, lso, leo, fs.getx(rel, "segment_count"), fs.getx(rel, "size_bytes"),
                    xattrs)
    return out


def _mount_and_check(fs: LogfsMount, opts, want: dict, rels, stats: dict, what: str) -> None:
    """Mount the damaged store; it must serve exactly ``want``, keep working (an append to each partition), and
    keep the repair across a remount, with no traceback in the log."""
    fs.mount(*opts, foreground=True)
    stats["mounts"] += 1
    _compare(fs, want, what)
    for rel in rels:
        fs.append(rel, b"appended after repair\n")
    fs.remount(*opts, foreground=True)
    stats["mounts"] += 1
    for rel in rels:
        assert fs.read(rel) == want[rel][0] + b"appended after repair\n", (what, rel)
        assert int(fs.getx(rel, "log_end_offset")) == want[rel][3] + 1, (what, rel)
    err = fs.stderr()
    assert "Traceback" not in err, err[-3000:]


@contextlib.contextmanager
def _base_store(tmp_path, opts, stats: dict, stats_name: str):
    """The store (mounted with ``opts``) that the damaged copies are made of; ``stats`` recorded at the end."""
    base = LogfsMount(tmp_path / "base")
    try:
        base.mount(*opts)
        yield base
    finally:
        base.cleanup()
        record_stats(stats_name, **stats)


def _check_damaged_copies(base: LogfsMount, shutdown: str, copies: dict, opts, want: dict, rels, stats: dict):
    """Shut ``base`` down ("clean", or "unclean": kill -9, which leaves indexes preallocated with no end entries and
    stale checkpoints); then for each (root, what): damage of ``copies``, a copy of its data dir (a LogfsMount at
    root) damaged by ``damage(data_dir)`` must pass _mount_and_check."""
    if shutdown == "clean":
        base.unmount()
    else:
        base.kill9()
    for (root, what), damage in copies.items():
        fs = LogfsMount(root)
        shutil.copytree(base.data, fs.data)
        damage(fs.data)
        try:
            _mount_and_check(fs, opts, want, rels, stats, what)
        finally:
            fs.cleanup()


def _compare(fs: LogfsMount, want: dict, what: str) -> None:
    for rel, (data, size, lso, leo, segs, size_bytes, xattrs) in want.items():
        assert fs.read(rel) == data, f"{what}: {rel} content differs"
        assert os.stat(fs.path(*rel.split("/"))).st_size == size, f"{what}: {rel} st_size"
        assert int(fs.getx(rel, "log_start_offset")) == lso and int(fs.getx(rel, "log_end_offset")) == leo, what
        assert fs.getx(rel, "segment_count") == segs and fs.getx(rel, "size_bytes") == size_bytes, what
        for name, value in xattrs.items():
            assert fs.getx(rel, name) == value, f"{what}: {rel} {name}"


@pytest.mark.parametrize("shutdown", ["clean", "unclean"])
def test_damaged_index_files(tmp_path, profile, shutdown):
    rng = random.Random(f"index-{shutdown}")
    opts = ["log.segment.bytes=4096", "log.index.interval.bytes=200", "log.index.size.max.bytes=65536"]
    combos = [(k, d) for k in KINDS for d in DAMAGES]
    targets = ["sealed", "active", "all"]
    stats = {"mounts": 0, "damaged_files": 0, "combinations": 0}
    with _base_store(tmp_path, opts, stats, f"damaged_indexes[{shutdown}]") as base:
        _fill_store(base, "t", len(combos), rng)
        rels = [f"t/{p}" for p in range(len(combos))]
        want = _snapshot(base, rels, rng)

        def damage(data, target):
            for p, (kind, how) in enumerate(combos):
                part = os.path.join(data, f"t-{p}")
                logs = sorted(n for n in os.listdir(part) if n.endswith(".log"))
                assert len(logs) >= 3
                chosen = {"sealed": [logs[len(logs) // 2]], "active": [logs[-1]], "all": logs}[target]
                for name in chosen:
                    path = os.path.join(part, name[:-4] + kind)
                    if os.path.exists(path):
                        _damage(path, how, rng)
                        stats["damaged_files"] += 1
                stats["combinations"] += 1

        copies = {(tmp_path / f"damaged-{target}", f"{shutdown} shutdown, damaged {target} segments"):
                  functools.partial(damage, target=target) for target in targets}
        _check_damaged_copies(base, shutdown, copies, opts, want, rels, stats)


# -- damaged checkpoint files -------------------------------------------------------------------------------------
CHECKPOINTS = ["recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint"]


@pytest.mark.parametrize("shutdown", ["clean", "unclean"])
def test_stale_or_corrupt_checkpoints(tmp_path, profile, shutdown):
    rng = random.Random(f"ckpt-{shutdown}")
    # Retention by size keeps moving the log start offset, so a stale checkpoint is really behind.
    opts = ["num.partitions=2", "log.segment.bytes=4096", "log.retention.bytes=20000",
            "log.retention.check.interval.ms=50", "log.flush.offset.checkpoint.interval.ms=50",
            "log.segment.delete.delay.ms=0", "log.index.size.max.bytes=65536"]
    stats = {"mounts": 0, "variants": 0}
    with _base_store(tmp_path, opts, stats, f"damaged_checkpoints[{shutdown}]") as base:
        _fill_store(base, "a", 2, rng)
        time.sleep(0.5)
        stale = {n: (base.data / n).read_bytes() for n in CHECKPOINTS if (base.data / n).exists()}
        assert stale, "no checkpoints written"
        for p in (0, 1):
            base.append(f"a/{p}", b"".join(b"later %d\n" % i for i in range(2000)))
        os.mkdir(base.path("b"))
        base.append("b/0", b"b line\n" * 500)
        wait_for(lambda: int(base.getx("a/0", "log_start_offset")) > 0, 10, what="retention to move the start")
        time.sleep(0.3)
        rels = ["a/0", "a/1", "b/0", "b/1"]
        want = _snapshot(base, rels, rng)
        variants = {
            "missing": lambda d, n: os.unlink(d / n),
            "empty": lambda d, n: (d / n).write_bytes(b""),
            "garbage": lambda d, n: (d / n).write_bytes(rng.randbytes(200)),
            "bad-count": lambda d, n: (d / n).write_bytes(b"0\n7\na 0 1\n"),
            "bad-version": lambda d, n: (d / n).write_bytes(b"9\n1\na 0 1\n"),
            "stale": lambda d, n: (d / n).write_bytes(stale.get(n, b"")),
            "out-of-range": lambda d, n: (d / n).write_bytes(
                b"0\n4\na 0 999999999\na 1 -5\nb 0 123456789012\nb 1 77\n"),
        }

        def damage_all(data, name):
            for ckpt in CHECKPOINTS:
                if (data / ckpt).exists() or name != "missing":
                    variants[name](data, ckpt)
            stats["variants"] += 1

        copies = {(tmp_path / f"ckpt-{name}", f"{shutdown} shutdown, {name} checkpoints"):
                  functools.partial(damage_all, name=name) for name in variants}
        _check_damaged_copies(base, shutdown, copies, opts, want, rels, stats)


# -- a second daemon ------------------------------------------------------------------------------------------------
def _second_daemon(data, mnt, foreground):
    cmd = [sys.executable, "-m", "logfs.cli", str(data), str(mnt)] + (["-f"] if foreground else [])
    return subprocess.run(cmd, capture_output=True, timeout=30, env=daemon_env())


def test_second_daemon_fails_without_touching_the_store(mount_logfs, tmp_path, profile):
    fs = mount_logfs("num.partitions=2", "log.segment.bytes=4096")
    rng = random.Random(3)
    _fill_store(fs, "t", 2, rng)
    time.sleep(0.2)
    other = tmp_path / "other-mnt"
    other.mkdir()
    before = store_hash(fs.data)
    for foreground in (False, True):
        r = _second_daemon(fs.data, other, foreground)
        err = r.stderr.decode()
        assert r.returncode == 1, (r.returncode, err)
        # One error line naming the cause: `logfs: error: ...` from the daemonizing parent, a log line (ERROR) in
        # the foreground; nothing about recovering a store that is merely in use.
        errors = [line for line in err.splitlines() if "logfs: error:" in line or " ERROR " in line]
        assert len(errors) == 1 and "in use" in errors[0] and "Traceback" not in err, err
        assert "recover" not in err, err
        assert not mounted_at(other)
    assert diff_hashes(before, store_hash(fs.data)) == []
    assert fs.read("t/0") and len(fs.pids()) == 1

    # A store left unclean (kill -9) whose .lock another process (say, a Kafka broker) holds: same.
    fs.kill9()
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('locked', flush=True)\n"
                               "time.sleep(120)\n", str(fs.data / ".lock")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"locked\n"
        before = store_hash(fs.data)
        for foreground in (False, True):
            r = _second_daemon(fs.data, other, foreground)
            err = r.stderr.decode()
            assert r.returncode == 1 and "in use" in err and "Traceback" not in err, err
            assert "recover" not in err, err  # (an unclean store, but not this daemon's to recover)
            assert not mounted_at(other)
        assert diff_hashes(before, store_hash(fs.data)) == [], "a refused daemon changed the store"
    finally:
        holder.kill()
        holder.wait()
    fs.mount()
    assert fs.read("t/0")
    record_stats("second_daemon", refused=4, store_changes=0)

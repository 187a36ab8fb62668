"""The sink's entries of a mount, with real syscalls and shell tools: the staging directory (plain files, created
once, no truncation), the commit file (one JSON request per line, its errno, its answer read back), and kill -9 of
the daemon in the middle of a publish (after the remount each partition holds all of the commit's records or
none, and the commit is then applied exactly once)."""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time

from logfs.storage.format import records as rec
from harness import expect_errno, sh

LONG = os.environ.get("LOGFS_LONG") == "1"


def staged_batches(first: int, count: int, per_batch: int = 200, pad: int = 0) -> bytes:
    out = []
    for start in range(first, first + count, per_batch):
        ids = range(start, min(first + count, start + per_batch))
        out.append(rec.build_batch(0, 0, [b"r%d" % i + b"." * pad for i in ids], [b"k%d" % i for i in ids]))
    return b"".join(out)


def request(fs, req: dict) -> dict:
    """Write one request to the commit file; the answer (raises OSError with the request's errno)."""
    fd = os.open(fs.path(".logfs-commit"), os.O_RDWR)
    try:
        try:
            os.write(fd, (json.dumps(req) + "\n").encode())
        except OSError as exc:
            exc.answer = json.loads(os.pread(fd, 1 << 20, 0))
            exc.add_note(f"answer: {exc.answer}")
            raise
        answer = os.pread(fd, 1 << 20, 0)
        assert os.pread(fd, 1 << 20, 0) == b""  # read once, as from a pipe
        return json.loads(answer)
    finally:
        os.close(fd)


def test_the_commit_file_from_the_shell(mount_logfs):
    fs = mount_logfs("num.partitions=2", "log.segment.bytes=3000", foreground=True)
    os.mkdir(fs.path("t"))
    assert os.getxattr(str(fs.mnt), "user.logfs.sink.protocol") == b"1"
    assert os.listdir(fs.mnt) == ["t"]  # the sink's entries are not listed
    body = staged_batches(0, 10)
    with open(fs.path(".logfs-staging", "j-1.0"), "xb") as f:
        f.write(body)
    assert sh(f"ls {fs.path('.logfs-staging')}").stdout.split() == [b"j-1.0"]
    req = json.dumps({"op": "commit", "app": "j-1", "version": 0, "parts": [["t", 1, [["j-1.0", 0, len(body)]]]],
                      "cleanup": "j-1.", "close": True})
    out = sh(f"exec 3<>{fs.path('.logfs-commit')}; echo '{req}' >&3; head -c 4096 <&3").stdout
    assert json.loads(out) == {"ok": True, "duplicate": False, "offsets": {"t": {"1": [0, 9]}}}
    assert fs.read("t/1").decode().splitlines() == [f"r{i}" for i in range(10)]
    assert os.listdir(fs.path(".logfs-staging")) == []
    # Refusals: the errno of the write, the reason in the answer.
    err = expect_errno(errno.EINVAL, request, fs, {"op": "commit", "app": "j-2"})
    assert "version must be an integer" in err.answer["error"] and err.answer["errno"] == "EINVAL"
    err = expect_errno(errno.ENOENT, request, fs, {"op": "commit", "app": "j-2", "version": 0,
                                                    "parts": [["t", 0, [["j-2.0", 0, 10]]]]})
    assert err.answer == {"ok": False, "errno": "ENOENT", "error": "no staged file 'j-2.0'"}
    expect_errno(errno.EINVAL, request, fs, {"op": "launch"})
    r = sh(f"echo 'not json' > {fs.path('.logfs-commit')}", check=False)
    assert r.returncode != 0 and b"Invalid argument" in r.stderr
    assert request(fs, {"op": "status", "app": "j-1", "version": 0})["applied"] is True
    # Commits that do not fit the active segment roll it first (in the daemon's worker thread).
    for version in range(3):
        body = staged_batches(100 * version, 100, per_batch=50)
        with open(fs.path(".logfs-staging", f"q-1.{version}.0"), "xb") as f:
            f.write(body)
        request(fs, {"op": "commit", "app": "q-1", "version": version, "cleanup": "q-1.",
                     "parts": [["t", 0, [[f"q-1.{version}.0", 0, len(body)]]]]})
    assert fs.read("t/0").decode().splitlines() == [f"r{i}" for i in range(300)]
    assert int(fs.getx("t/0", "segment_count")) == 3
    assert "mounted" in fs.stderr() and "internal error" not in fs.stderr()


def test_the_staging_directory_holds_plain_files_only(mount_logfs):
    fs = mount_logfs()
    d = fs.path(".logfs-staging")
    with open(os.path.join(d, "a.1"), "xb") as f:
        f.write(b"x" * 5000)
        f.seek(100)
        f.write(b"y")  # (anywhere: the kernel may send pieces of a large write out of order)
    assert os.stat(os.path.join(d, "a.1")).st_size == 5000
    with open(os.path.join(d, "a.1"), "rb") as f:
        assert f.read()[99:102] == b"xyx"
    expect_errno(errno.EEXIST, open, os.path.join(d, "a.1"), "xb")
    expect_errno(errno.EPERM, os.truncate, os.path.join(d, "a.1"), 10)
    expect_errno(errno.EPERM, os.mkdir, os.path.join(d, "sub"))
    expect_errno(errno.EINVAL, open, os.path.join(d, ".hidden"), "xb")
    expect_errno(errno.EPERM, os.rename, os.path.join(d, "a.1"), os.path.join(d, "a.2"))
    expect_errno(errno.EEXIST, os.mkdir, fs.path(".logfs-commit"))  # (a reserved name, not a topic)
    os.unlink(os.path.join(d, "a.1"))
    assert os.listdir(d) == []
    request(fs, {"op": "abort", "prefix": "b."})
    expect_errno(errno.ECANCELED, open, os.path.join(d, "b.0"), "xb")  # a late attempt of an aborted write


def test_kill9_of_the_daemon_during_a_publish_leaves_all_or_nothing(mount_logfs):
    """A commit of ~60 MB over 3 partitions, the daemon killed with -9 at a random moment of it: after the remount
    every partition holds all of the commit's records or none of them (all, if it passed its commit point: the
    restart completes it), and committing again (with its files staged again if they are gone) appends it once."""
    fs = mount_logfs("num.partitions=3", "log.segment.bytes=100000000", foreground=True)
    os.mkdir(fs.path("t"))
    rng = random.Random(int(time.time()))
    rounds = 8 if LONG else 3
    counts = {0: 30_000, 1: 60_000, 2: 90_000}
    expected = {p: [] for p in range(3)}
    outcomes = []
    took = None
    for version in range(rounds + 1):
        bodies = {p: staged_batches(1_000_000 * version + 1000 * p * 1000, n, pad=300) for p, n in counts.items()}
        prefix = f"q-x.{version}."

        def stage():
            for p, body in bodies.items():
                with open(fs.path(".logfs-staging", f"{prefix}{p}"), "wb") as f:
                    f.write(body)

        req = {"op": "commit", "app": "q-x", "version": version, "cleanup": "q-x.",
               "parts": [["t", p, [[f"{prefix}{p}", 0, len(body)]]] for p, body in bodies.items()]}
        stage()
        for p, body in bodies.items():
            expected[p] += [r.value for pos, h in rec.iter_headers(body) for r in rec.decode(body, pos, h.size)]
        if took is None:  # the first commit, whole: how long one takes here
            started = time.monotonic()
            request(fs, req)
            took = time.monotonic() - started
            continue
        thread = threading.Thread(target=_try, args=(request, fs, req))
        thread.start()
        time.sleep(rng.uniform(0.0, took))
        fs.kill9()
        thread.join(30)
        fs.mount(*fs.options, foreground=True)
        ends = [int(fs.getx(f"t/{p}", "log_end_offset")) for p in range(3)]
        got = [ends[p] - (len(expected[p]) - counts[p]) for p in range(3)]
        # all or nothing, per partition and (the commit completed at restart) for the commit as a whole
        assert got == [0, 0, 0] or got == [counts[0], counts[1], counts[2]], got
        outcomes.append("applied" if got[0] else "not applied")
        if not got[0]:
            stage()  # (a restart removes every staged file: what no commit needed)
        assert request(fs, req)["duplicate"] == bool(got[0])
    for p in range(3):
        with open(fs.path("t", p), "rb") as f:
            assert f.read().split(b"\n")[:-1] == expected[p]
    print(f"one commit took {took:.2f} s; outcomes of the killed ones:", outcomes)


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError as exc:
        return exc

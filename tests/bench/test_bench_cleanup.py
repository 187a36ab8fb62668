"""A bench run that fails leaves nothing behind: no /var/tmp/logfs-bench-* directory, no mount, no process (logfs
daemons, nullfs, SeaweedFS servers). The runs here are interrupted the two ways a run usually ends early: SIGTERM
(a timeout, systemd, kill) in the middle of the small-writes scenario with logfs and nullfs mounted and writer
processes appending, and SIGINT (Ctrl-C) in the tiered scenario with SeaweedFS up and a tiering mount. Both take
the same path as a scenario raising an error (bench.py turns SIGTERM into SystemExit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness import daemon_env, wait_for
from logfs.testing.mounts import mountpoints_under, processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "bench.py")

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")


def processes_naming(root: str) -> list[str]:
    """``PID: command line`` of the processes whose command line mentions ``root``."""
    lines = (f"{pid}: {b' '.join(args).decode(errors='replace')}" for pid, args in processes())
    return [line for line in lines if root in line.split(": ", 1)[1]]


def interrupt_bench(only: str, ready, sig: int) -> tuple[str, subprocess.CompletedProcess]:
    """Start ``bench.py --quick --only ONLY`` (its own /var/tmp workdir), wait until ``ready(workdir)``, send
    ``sig``; returns the workdir and the finished process."""
    # (SIGINT as a terminal's Ctrl-C finds it: a run started in the background by a non-interactive shell, as a
    # CI script may be, inherits SIGINT ignored, and Python then keeps ignoring it)
    proc = subprocess.Popen([sys.executable, BENCH, "--quick", "--only", only], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=daemon_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()
        assert first.startswith("workdir /var/tmp/logfs-bench-"), first + proc.stderr.read()
        workdir = first.split(None, 1)[1].strip()
        assert os.path.isdir(workdir)
        wait_for(lambda: ready(workdir) or proc.poll() is not None, 180, what=f"the bench to reach the point ({only})")
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return workdir, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_nothing_left(workdir: str, result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0, "an interrupted run must not report success"
    assert not mountpoints_under(workdir), mountpoints_under(workdir)
    assert not processes_naming(workdir), processes_naming(workdir)
    assert not os.path.exists(workdir), os.listdir(workdir)


def test_sigterm_during_small_writes_leaves_nothing(tmp_path):
    def writing(workdir: str) -> bool:
        # logfs and nullfs both mounted, and writer processes appending (some lines in some partition)
        mounts = mountpoints_under(workdir)
        if not (any(m.endswith("/mnt") for m in mounts) and any(m.endswith("/nullmnt") for m in mounts)):
            return False
        mnt = next(m for m in mounts if m.endswith("/mnt"))
        try:
            return any(int(os.getxattr(os.path.join(mnt, t, "0"), "user.logfs.log_end_offset")) > 0
                       for t in os.listdir(mnt))
        except OSError:
            return False

    workdir, result = interrupt_bench("small_writes", writing, signal.SIGTERM)
    assert_nothing_left(workdir, result)


def test_ctrl_c_during_tiered_leaves_nothing(tmp_path):
    def store_and_mount_up(workdir: str) -> bool:
        return (any("weed" in p and " s3 " in p for p in processes_naming(workdir))
                and any(m.endswith("/tiered/mnt") for m in mountpoints_under(workdir)))

    workdir, result = interrupt_bench("tiered", store_and_mount_up, signal.SIGINT)
    assert "KeyboardInterrupt" in result.stderr
    assert_nothing_left(workdir, result)

"""A disk fault at the ``.txnindex`` step of the cleaner's swap (CONTRACT sections 12 and 13), with a real logfs
daemon over faultfs (logfs/testing/faultfs.py).

DATA_DIR holds a partition directory as a Kafka broker leaves it (test_rel_txn_index_swap.broker_directory: an
idempotent producer's records among two transactional producers' aborts and a commit, the first abort's records a
segment before its marker, a ``.txnindex`` beside each segment holding an abort marker), written through faultfs
before the mount. Then ``compression.type=zstd`` makes the cleaner rewrite its three sealed segments (in its child
process, then the swap in the daemon), and one step of the rewritten segments' ``.txnindex`` fails:

- ``write`` of ``.txnindex.cleaned`` (the child writes it), ENOSPC until the fault is cleared: a full disk is not a
  failure. Every round fails cleanly: nothing is swapped, the directory stays online, the text is unchanged; once
  the fault is gone the next round rewrites every segment;
- the same write failing with EIO: the directory goes offline (a failing disk, CONTRACT section 12); the next mount,
  the fault gone, recovers it and its first rounds rewrite every segment;
- the swap's rename of ``.txnindex.cleaned`` to ``.swap`` (after the ``.log``'s, the commit point) with EIO, and
  the rename of ``.txnindex.swap`` to the live name with ENOSPC (past the commit point a full disk takes the
  directory offline too): the next mount completes the swap from the files the crash-safe protocol left
  (lifecycle.py), and rewrites the rest.

In every case, at each look (with the fault on, after it, after the remount): ``read_committed`` shows exactly the
committed records (never an aborted one), ``read_uncommitted`` every record, and once the cleaner is done the
directory holds each of Kafka's two aborted transactions in exactly one live ``.txnindex`` entry, and no
``.cleaned`` or ``.swap`` file.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from rel_helpers import MountError, wait_for
from test_rel_txn_index_swap import COMMITTED, EVERYTHING, TXNS, broker_directory, live_txns, text

pytestmark = [pytest.mark.mount, pytest.mark.daemon_errors(
    "is offline", "was offline", "Input/output error", "No space left on device")]

OPTIONS = ("num.partitions=1", "log.retention.ms=-1", "log.cleaner.backoff.ms=50",
           "log.retention.check.interval.ms=100", "log.segment.delete.delay.ms=200")
PROBE = "probe"  # a partition the cleaner never touches: it tells whether the directory is offline
ISOLATION = "user.logfs.config.logfs.isolation.level"
SEALED = (0, 5, 11)  # the sealed segments' bases (15 is the active one)

# step -> (faultfs op, path regex, errno, nth matching call, count, whether the directory goes offline)
STEPS = {
    "write-enospc": ("write", r"^t-0/.*\.txnindex\.cleaned$", "ENOSPC", 1, -1, False),
    "write-eio": ("write", r"^t-0/.*\.txnindex\.cleaned$", "EIO", 1, 1, True),
    # (a rename matches on either name: the first such rename is .cleaned -> .swap, the second .swap -> live)
    "rename-cleaned-eio": ("rename", r"^t-0/.*\.txnindex\.cleaned$", "EIO", 1, 1, True),
    "rename-swap-enospc": ("rename", r"^t-0/.*\.txnindex\.swap$", "ENOSPC", 2, 1, True),
}


def compressed(lower) -> bool:
    """Every sealed segment rewritten (its first batch zstd: Kafka's attributes, codec 4) and the swaps complete."""
    directory = lower / "t-0"
    names = os.listdir(directory)
    if any(".cleaned" in n or ".swap" in n for n in names):
        return False
    for base in SEALED:
        with open(directory / f"{base:020d}.log", "rb") as f:
            header = f.read(23)
        if len(header) < 23 or header[22] & 0x07 != 4:
            return False
    return True


def check_text(fs, what: str) -> None:
    """read_committed: the committed records; read_uncommitted: every record (markers are never lines)."""
    assert fs.read("t/0") == text(COMMITTED), what
    os.setxattr(fs.path("t"), ISOLATION, b"read_uncommitted")
    try:
        assert fs.read("t/0") == text(EVERYTHING), what
    finally:
        os.removexattr(fs.path("t"), ISOLATION)
    assert fs.read("t/0") == text(COMMITTED), what


def online(fs) -> bool:
    try:
        os.getxattr(fs.path(PROBE, 0), "user.logfs.log_end_offset")
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
        return False
    return True


def fired(faultfs, rule: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in faultfs.injected():
            if entry["rule"] == rule and "errno" in entry:
                return entry
        time.sleep(0.01)
    raise AssertionError(f"rule {rule}: no fault injected within {timeout} s")


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_disk_fault_at_the_txnindex_step_of_the_swap(faultfs, mount_logfs, step):
    op, path, code, nth, count, goes_offline = STEPS[step]
    broker_directory(str(faultfs.mountpoint / "t-0"))
    fs = mount_logfs(*OPTIONS, name=".", foreground=True)
    os.mkdir(fs.path(PROBE))
    check_text(fs, "as the broker left it")
    assert live_txns(str(faultfs.source / "t-0")) == sorted(t for ts in TXNS.values() for t in ts)

    rule = faultfs.fail(op, path, errno=code, nth=nth, count=count)
    os.setxattr(fs.path("t"), "user.logfs.config.compression.type", b"zstd")
    fault = fired(faultfs, rule, 30)
    assert fault["op"] == op and ".txnindex" in fault["path"], fault

    if goes_offline:
        wait_for(lambda: not online(fs), 10, what="the directory to go offline")
        faultfs.clear()
        try:
            fs.unmount()
        except MountError:
            pass
        fs.mount(*OPTIONS, foreground=True)  # (its first start must do: the loader completes or drops the swap)
        assert online(fs)
        check_text(fs, f"{step}: after the remount, before the next round")
    else:
        # Rounds fail while the disk is full: nothing swapped (the segments are as the broker wrote them), the
        # directory online, the text unchanged.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert online(fs)
            assert not compressed(faultfs.source)
            time.sleep(0.1)
        assert faultfs.stats()["ops"]["write"]["faults"] >= 2  # (more than one round met it)
        check_text(fs, f"{step}: while the fault is on")
        faultfs.clear()
    wait_for(lambda: compressed(faultfs.source), 30, interval=0.1, what="the next round to rewrite every segment")
    check_text(fs, f"{step}: rewritten")
    assert live_txns(str(faultfs.source / "t-0")) == sorted(t for ts in TXNS.values() for t in ts)
    fs.remount(*OPTIONS, foreground=True)
    check_text(fs, f"{step}: rewritten, after a remount")

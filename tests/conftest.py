"""Fixtures shared by every suite: ONE factory for engine objects (partition logs and log managers).

``open_log`` and ``open_manager`` build real engine objects in ``tmp_path`` with an injected
:class:`~logfs.storage.ManualClock` (the ``clock`` fixture), and close whatever is still open at teardown. Suites
with their own vocabulary (tests/view's ``make_log``, tests/storage/test_loader.py's ``managers``) are thin
wrappers over these two.

Mounted tests get their mount from the harness plugin (tests/harness.py). Also ``small_tmpfs``: a real 8 MiB tmpfs, the disk that fills. ``LOGFS_TEST_OPEN_FILES=N`` runs the logs and
managers the fixtures open under an open-file budget of N segment files each (storage/local/open_files.py), whatever
the descriptor limit.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from logfs.storage import BrokerConfig, LogConfig, LogManager, ManualClock, load_log
from logfs.storage.local.open_files import OpenFiles

# The one harness (tests/harness.py: the mount fixture, FUSE marking, wait_for, the daemon-log check), and pytester
# for the harness's own test.
pytest_plugins = ["harness", "pytester"]

def _test_budget() -> OpenFiles | None:
    """The open-file budget ``LOGFS_TEST_OPEN_FILES`` asks for (None: the engine's own, from the descriptor limit)."""
    budget = os.environ.get("LOGFS_TEST_OPEN_FILES")
    if not budget:
        return None
    files = OpenFiles()
    files.budget = int(budget)
    return files


# Keyword arguments of load_log(); every other keyword of open_log() is a LogConfig field.
_LOAD_KWARGS = {"recovery_point", "log_start_offset", "had_clean_shutdown", "clock", "progress", "open_files"}


def _closed_at_teardown(factory, finish):
    """A fixture's body: yields ``factory`` wrapped so that whatever it makes is remembered, then (at teardown)
    calls ``finish`` on each of those not closed by then."""
    opened = []

    def make(*args, **kwargs):
        made = factory(*args, **kwargs)
        opened.append(made)
        return made

    yield make
    for made in opened:
        if not made.closed:
            finish(made)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def open_log(tmp_path, clock):
    """``open_log(config=None, directory=None, **kw)`` -> Log of topic ``t`` partition 0 (default directory
    ``tmp_path/t-0``). ``kw`` holds load_log keywords (``recovery_point``, ``had_clean_shutdown``, ``clock``, ...)
    and, when ``config`` is None, LogConfig fields (``segment_bytes=4096``). Closed (without flush) at teardown."""

    def open_log(config=None, directory=None, **kw):
        load_kw = {k: kw.pop(k) for k in list(kw) if k in _LOAD_KWARGS}
        if config is None:
            config = LogConfig.for_tests(**kw)
        elif kw:
            raise TypeError(f"LogConfig fields {sorted(kw)} given together with a config")
        load_kw.setdefault("clock", clock)
        load_kw.setdefault("open_files", _test_budget())
        return load_log(str(directory or tmp_path / "t-0"), "t", 0, config, **load_kw)

    yield from _closed_at_teardown(open_log, lambda log: log.close_without_flush())


@pytest.fixture
def open_manager(tmp_path, clock):
    """``open_manager(props=None, data_dir=None, clock=None)`` -> LogManager on ``tmp_path/data`` with broker
    settings ``props`` (server.properties names). Still-open managers are abandoned (as a crash) at teardown, so a
    test that wants a clean shutdown closes its manager itself."""

    def open_manager(props=None, data_dir=None, clock=clock):
        return LogManager(str(data_dir or tmp_path / "data"), BrokerConfig.from_properties(props or {}), clock=clock,
                          open_files=_test_budget())

    yield from _closed_at_teardown(open_manager, lambda manager: manager.abandon())


class SmallDisk:
    """A real 8 MiB tmpfs at ``path``: the disk that fills."""

    def __init__(self, path: Path):
        self.path = path

    def top_up(self) -> None:
        """Take its last free pages with a filler file (a failed append gives back its partial batch, so a disk
        an append filled is not quite full)."""
        with open(self.path / "filler", "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC


@pytest.fixture
def small_tmpfs(tmp_path):
    """A mounted :class:`SmallDisk` (root only, else the test is skipped). Request it before the fixtures that
    put things on it, so that it is unmounted after them."""
    where = tmp_path / "disk"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    yield SmallDisk(where)
    subprocess.run(["umount", "-l", str(where)], check=True)

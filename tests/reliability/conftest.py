"""The reliability suite (issue 8): crash, fault, load, bad-input and model-based tests.

Two profiles. SHORT (the default, what CI runs) bounds every test so the whole directory takes a few minutes on
two cores. LONG runs the same tests with many more crashes, operations and examples: ``LOGFS_LONG=1 pytest
tests/reliability`` or ``pytest tests/reliability -m long``. Tests take the ``profile`` fixture; in the LONG
profile each test is marked ``long``. With ``LOGFS_RELIABILITY_STATS=FILE`` the counts of what was injected
(kills, faults, operations, losses) are written to FILE at the end (docs/reliability.md summarises one run).
"""

from __future__ import annotations

import os

import pytest

import rel_helpers
from harness import items_in
from rel_helpers import fuse_unusable_reason


def _long_selected(config) -> bool:
    if os.environ.get("LOGFS_LONG", "") not in ("", "0"):
        return True
    expr = (config.getoption("markexpr", "") or "").replace(" ", "")
    return "long" in expr and "notlong" not in expr


def pytest_configure(config):
    config.addinivalue_line("markers", "long: the LONG profile of the reliability suite (LOGFS_LONG=1 or -m long)")
    config.addinivalue_line("markers", "reliability: part of the reliability suite (tests/reliability)")
    rel_helpers.LONG = _long_selected(config)


def pytest_generate_tests(metafunc):
    if "profile" in metafunc.fixturenames:
        if rel_helpers.LONG:
            metafunc.parametrize("profile", [pytest.param("long", marks=pytest.mark.long)], ids=["long"])
        else:
            metafunc.parametrize("profile", ["short"], ids=["short"])


def pytest_collection_modifyitems(config, items):
    reason = fuse_unusable_reason()
    for item in items_in(items, __file__):
        item.add_marker(pytest.mark.reliability)
        if item.get_closest_marker("mount") and reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not rel_helpers.STATS:
        return
    terminalreporter.section(f"reliability ({'long' if rel_helpers.LONG else 'short'} profile)")
    for name, values in sorted(rel_helpers.STATS.items()):
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())))
    path = os.environ.get("LOGFS_RELIABILITY_STATS")
    if path:
        rel_helpers.dump_stats(path)
        terminalreporter.write_line(f"statistics written to {path}")


@pytest.fixture
def faultfs(tmp_path):
    """A started FaultFS (logfs/testing/faultfs.py, issue 30): ``tmp_path/"lower"`` seen at
    ``faultfs.mountpoint`` (``tmp_path/"data"``), the DATA_DIR to give a logfs daemon; faults through
    ``faultfs.fail(...)``. Unmounted and its daemon reaped at teardown, even on failure. Tests using it are marked
    ``mount``. ``mount_logfs(..., name=".")`` mounts logfs on it (that LogfsMount's data is tmp_path/"data");
    request ``faultfs`` before ``mount_logfs`` so that the logfs mount on top is torn down first."""
    from logfs.testing.faultfs_client import FaultFS

    fs = FaultFS(tmp_path / "lower", tmp_path / "data")
    fs.start()
    try:
        yield fs
    finally:
        fs.stop()

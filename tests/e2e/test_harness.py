"""The harness's daemon-log check: a mounted test fails when its daemon logs an ERROR (or a traceback) that the test
did not declare, and passes when it declared it (tests/harness.py)."""

from __future__ import annotations

import os
from pathlib import Path

from harness import unexpected_daemon_errors

TESTS = str(Path(__file__).resolve().parent.parent)

# A daemon that logs one ERROR on demand: its metrics file's directory is removed under it, and the next write of
# the file (every 100 ms) fails with "cannot write the metrics to ...".
INNER = '''
import shutil

import pytest

from harness import wait_for


def _mount_and_break_the_metrics(mount_logfs, tmp_path):
    where = tmp_path / "metrics"
    where.mkdir()
    m = mount_logfs(f"logfs.metrics.file={where}/logfs.prom", "logfs.metrics.interval.ms=100", foreground=True)
    shutil.rmtree(where)
    wait_for(lambda: "cannot write the metrics" in m.stderr(), 20, what="the daemon's ERROR")


def test_undeclared(mount_logfs, tmp_path):
    _mount_and_break_the_metrics(mount_logfs, tmp_path)


@pytest.mark.daemon_errors("cannot write the metrics")
def test_declared(mount_logfs, tmp_path):
    _mount_and_break_the_metrics(mount_logfs, tmp_path)
'''


def test_an_undeclared_daemon_error_fails_the_test_and_a_declared_one_does_not(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]))
    pytester.makeconftest('pytest_plugins = ["harness"]\n')
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_undeclared*",
                                 "*the daemon logged what this test did not expect*",
                                 "*ERROR logfs.service.metrics: cannot write the metrics*"])


def test_what_counts_as_unexpected():
    log = "\n".join([
        "2026-11-27 02:00:00,000 INFO logfs.service.daemon: mounted",
        "2026-11-27 02:00:01,000 ERROR logfs.storage.failure: log directory /d is offline: EIO",
        "2026-11-27 02:00:02,000 WARNING logfs.service.runtime: slow",
        "Traceback (most recent call last):",
        "2026-11-27 02:00:03,000 CRITICAL logfs.service.startup: unexpected error",
    ])
    assert len(unexpected_daemon_errors(log)) == 3
    assert unexpected_daemon_errors(log, ["is offline", "unexpected error", "^Traceback"]) == []

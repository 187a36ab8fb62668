"""Fixtures for tiered storage: the shared SeaweedFS (tests/remote) and the mount factory (tests/e2e)."""

import sys
from pathlib import Path

import pytest

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "remote"))
sys.path.insert(0, str(here.parent / "e2e"))
from remote_store import aws_env, creds, seaweed, seaweed_outage, stall_proxy  # noqa: E402,F401  (fixtures)
from logfs_e2e import fuse_unusable_reason, mount_factory  # noqa: E402


@pytest.fixture
def mount_logfs(tmp_path):
    reason = fuse_unusable_reason()
    if reason:
        pytest.skip(reason)
    with mount_factory(tmp_path) as make:
        yield make

"""Fixtures for the mounted end-to-end suite: see logfs_e2e.py for the LogfsMount helper."""

from __future__ import annotations

from pathlib import Path

import pytest

from logfs_e2e import LogfsMount, fuse_unusable_reason, mount_factory


def pytest_collection_modifyitems(config, items):
    reason = fuse_unusable_reason()
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        item.add_marker(pytest.mark.mount)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def mount_logfs(tmp_path):
    """Factory: ``mount_logfs("num.partitions=3", foreground=False, name="m")`` -> a mounted LogfsMount.
    Every mount made through it is unmounted (and its daemon reaped) in teardown."""
    with mount_factory(tmp_path) as make:
        yield make


@pytest.fixture
def fs(mount_logfs) -> LogfsMount:
    """A default mount (num.partitions=1) with no topics yet."""
    return mount_logfs()

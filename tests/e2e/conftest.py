"""Fixtures for the mounted end-to-end suite: see logfs_e2e.py for the LogfsMount helper."""

from __future__ import annotations

from pathlib import Path

import pytest

from logfs_e2e import LogfsMount, fuse_unusable_reason


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
    made: list[LogfsMount] = []

    def make(*options: str, foreground: bool = False, name: str = "fs") -> LogfsMount:
        m = LogfsMount(tmp_path / name)
        made.append(m)
        m.mount(*options, foreground=foreground)
        return m

    yield make
    errors = []
    for m in made:
        try:
            m.cleanup()
        except Exception as exc:  # keep unmounting the others
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def fs(mount_logfs) -> LogfsMount:
    """A default mount (num.partitions=1) with no topics yet."""
    return mount_logfs()

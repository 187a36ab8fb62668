"""The kernel-free level (as S3QL's t3_fs_api): the FUSE ``Operations`` class called directly, no mount.

``ops_fs(**broker settings)`` builds a :class:`~logfs.storage.LogManager` in ``tmp_path`` and an
:class:`~logfs.fuse.operations.Operations` over it, with ``run_blocking`` running in a trio worker thread as in
production. The helpers are in ops_helpers.py (:class:`OpsFS`, ``fuse_errno``).
"""

from __future__ import annotations

import pytest

from logfs.fuse.operations import Operations
from ops_helpers import OpsFS, run_blocking


@pytest.fixture
def ops_fs(open_manager):
    """Factory: ``ops_fs(read_only=False, manager=None, **broker settings)`` -> OpsFS. Settings are given with
    underscores for dots (``num_partitions=3``) or as a ``props`` dict; a ``manager`` may be passed to build
    Operations over an existing one (e.g. after a simulated restart). Open handles are released and managers
    closed at teardown."""
    made: list[OpsFS] = []

    def make(read_only: bool = False, manager=None, props: dict | None = None, **settings) -> OpsFS:
        if manager is None:
            props = {**(props or {}), **{k.replace("_", "."): str(v) for k, v in settings.items()}}
            manager = open_manager(props)
        fs = OpsFS(Operations(manager, read_only=read_only, run_blocking=run_blocking))
        made.append(fs)
        return fs

    yield make
    for fs in made:
        if not fs.manager.closed:
            fs.ops.release_all()
            fs.manager.close()


@pytest.fixture
def ops(ops_fs) -> OpsFS:
    """Operations over a fresh store (num.partitions=1) with no topics yet."""
    return ops_fs()

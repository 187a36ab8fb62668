"""Fixtures shared by every test level."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest


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

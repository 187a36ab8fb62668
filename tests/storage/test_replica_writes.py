"""The replica's segment writes on a disk that fills (a real tmpfs of 256 KiB): a batch whose write fails part way
leaves the segment at its whole batches, and the write tried again once there is room appends after them."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from logfs.storage.cluster.replica import ReplicaPartition
from logfs.storage.format import records as rec


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)  # (-l: a failed test may hold a descriptor)


def test_a_write_that_fails_part_way_is_undone(small_disk):
    part = ReplicaPartition(str(small_disk / "t-0"))
    os.mkdir(part.directory)
    part.open_segment(0)
    first = rec.build_batch_generic(0, 1000, [b"a" * 100] * 100)
    part.write(first)
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # (the disk nearly full: the next batch fits only in part)
        f.write(b"\0" * (256 * 1024 - 40 * 1024))
    big = rec.build_batch_generic(100, 2000, [os.urandom(100) for _ in range(600)])
    with pytest.raises(OSError) as err:
        part.write(big)
    assert err.value.errno == errno.ENOSPC
    segment = os.path.join(part.directory, "%020d.log" % 0)
    assert os.path.getsize(segment) == part.segments[0] == len(first)
    os.unlink(filler)
    part.write(big)  # tried again with room: after the whole first batch
    with open(segment, "rb") as f:
        buf = f.read()
    assert [h.base_offset for _, h in rec.iter_headers(buf)] == [0, 100]
    assert rec.validate(buf, len(first)).records_count == 600
    part.close()

#!/usr/bin/env python3
"""A do-nothing pyfuse3 filesystem: the ceiling for any Python FUSE filesystem on this machine.

One file, ``f``, of ``--size`` bytes: reads are served from a constant buffer, writes are accepted and dropped,
fsync is accepted and does nothing.
It answers with the same FUSE settings logfs uses for partition files (``direct_io``, attribute timeout 0,
``st_blksize`` 1 MiB), so
the comparison measures logfs's own work, not a difference in kernel caching.

    python -m logfs.testing.nullfs MOUNTPOINT [--size BYTES]     (foreground; unmount with fusermount3 -u)
"""

import argparse
import errno
import os
import stat

import pyfuse3
import trio

FILE_INODE = pyfuse3.ROOT_INODE + 1
BLOCK = b"x" * 99 + b"\n"
BUFFER = BLOCK * (4 * 1024 * 1024 // len(BLOCK))


class NullOperations(pyfuse3.Operations):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def _attrs(self, inode):
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.attr_timeout = 0
        entry.entry_timeout = 1
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode = stat.S_IFDIR | 0o755
            entry.st_nlink = 2
        else:
            entry.st_mode = stat.S_IFREG | 0o644
            entry.st_nlink = 1
            entry.st_size = self.size
        entry.st_uid, entry.st_gid = os.getuid(), os.getgid()
        entry.st_blksize = 1 << 20  # as logfs: the same request sizes on both sides
        return entry

    async def getattr(self, inode, ctx=None):
        if inode not in (pyfuse3.ROOT_INODE, FILE_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode)

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == pyfuse3.ROOT_INODE and name == b"f":
            return self._attrs(FILE_INODE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        if start_id == 0:
            pyfuse3.readdir_reply(token, b"f", self._attrs(FILE_INODE), 1)

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode, direct_io=True, keep_cache=False)

    async def read(self, fh, off, size):
        size = max(0, min(size, self.size - off))
        start = off % len(BLOCK)
        out = BUFFER[start : start + size]
        while len(out) < size:  # reads larger than the buffer
            out += BUFFER[: size - len(out)]
        return out

    async def write(self, fh, off, buf):
        return len(buf)

    async def fsync(self, fh, datasync):
        # Answered, not ENOSYS: after ENOSYS the kernel stops sending FSYNC, and the benches' fsync would then
        # cost nullfs no round trip at all while it costs logfs one.
        return None

    async def setattr(self, inode, attr, fields, fh, ctx):
        return self._attrs(inode)

    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENODATA)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mountpoint")
    parser.add_argument("--size", type=int, default=1 << 30)
    args = parser.parse_args()
    pyfuse3.init(NullOperations(args.size), args.mountpoint, ["fsname=nullfs", "subtype=nullfs"])
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()

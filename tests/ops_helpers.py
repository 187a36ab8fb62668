"""Helpers of the kernel-free level (tests/ops): path-level calls on an ``Operations`` instance, errno checks.

The ``ops_fs`` fixture (conftest.py) builds the Operations; :class:`OpsFS` wraps the handlers in path-level helpers (``await ops.append("t/0", b"a\\n")``; the ``ops`` fixture is one), and
``fuse_errno(code)`` asserts that a block raises ``pyfuse3.FUSEError`` with that errno. Each test runs in
milliseconds; the mounted suites keep only what needs a kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pyfuse3
import pytest
import trio

from logfs.fuse.operations import ROOT, Operations

APPEND = os.O_WRONLY | os.O_APPEND


@dataclasses.dataclass
class SetattrFields:
    """Stand-in for pyfuse3.SetattrFields, whose attributes are read-only outside libfuse."""

    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


@contextlib.contextmanager
def fuse_errno(code: int):
    """Assert that the block raises ``pyfuse3.FUSEError(code)``."""
    with pytest.raises(pyfuse3.FUSEError) as info:
        yield info
    assert info.value.errno == code, f"expected {os.strerror(code)}, got {os.strerror(info.value.errno)}"


async def each_fails(code: int, *calls) -> None:
    """Await each of ``calls`` (coroutines of handler calls): every one must raise ``pyfuse3.FUSEError(code)``."""
    for call in calls:
        with fuse_errno(code):
            await call


async def run_blocking(fn, *args):
    """As production (Operations' default): blocking engine work goes to a trio worker thread."""
    return await trio.to_thread.run_sync(fn, *args)


class OpsFS:
    """Path-level calls on one Operations instance: paths are ``""`` (root), ``"topic"`` or ``"topic/N"``."""

    def __init__(self, ops: Operations):
        self.ops = ops
        self.manager = ops.manager

    # -- names -------------------------------------------------------------------------------------------
    async def inode(self, path: str) -> int:
        inode = ROOT
        for part in filter(None, path.split("/")):
            inode = (await self.ops.lookup(inode, part.encode(), None)).st_ino
        return inode

    async def _parent(self, path: str) -> tuple[int, bytes]:
        parent, _, name = path.rpartition("/")
        return await self.inode(parent), name.encode()

    async def lookup(self, path: str) -> pyfuse3.EntryAttributes:
        parent, name = await self._parent(path)
        return await self.ops.lookup(parent, name, None)

    async def getattr(self, path: str) -> pyfuse3.EntryAttributes:
        return await self.ops.getattr(await self.inode(path), None)

    async def setattr(self, path: str, attr: pyfuse3.EntryAttributes | None = None, fh=None,
                      **fields) -> pyfuse3.EntryAttributes:
        return await self.ops.setattr(await self.inode(path), attr or pyfuse3.EntryAttributes(),
                                      SetattrFields(**fields), fh, None)

    async def readdir(self, path: str = "") -> dict[str, pyfuse3.EntryAttributes]:
        """name -> attributes, in listing order, as readdir hands them to the kernel (pyfuse3.readdir_reply
        needs a kernel token, so the replies are collected here instead)."""
        fh = await self.ops.opendir(await self.inode(path), None)
        entries: dict[str, pyfuse3.EntryAttributes] = {}
        real_reply = pyfuse3.readdir_reply
        pyfuse3.readdir_reply = lambda token, name, attrs, next_id: entries.setdefault(name.decode(), attrs) and True
        try:
            await self.ops.readdir(fh, 0, None)
        finally:
            pyfuse3.readdir_reply = real_reply
        await self.ops.releasedir(fh)
        return entries

    async def listdir(self, path: str = "") -> list[str]:
        return list(await self.readdir(path))

    async def mkdir(self, path: str, mode: int = 0o755) -> pyfuse3.EntryAttributes:
        parent, name = await self._parent(path)
        return await self.ops.mkdir(parent, name, mode, None)

    async def topic(self, name: str = "t", **config) -> int:
        """``mkdir`` a topic, then set its ``config`` (topic settings by Kafka's names); its inode."""
        inode = (await self.mkdir(name)).st_ino
        for key, value in config.items():
            await self.setconfig(name, key, str(value))
        return inode

    async def rmdir(self, path: str) -> None:
        parent, name = await self._parent(path)
        await self.ops.rmdir(parent, name, None)

    async def unlink(self, path: str) -> None:
        parent, name = await self._parent(path)
        await self.ops.unlink(parent, name, None)

    # -- files -------------------------------------------------------------------------------------------
    async def create(self, path: str, flags: int = APPEND, mode: int = 0o644) -> int:
        parent, name = await self._parent(path)
        info, _ = await self.ops.create(parent, name, mode, flags, None)
        return info.fh

    async def open(self, path: str, flags: int = os.O_RDONLY) -> int:
        info = await self.ops.open(await self.inode(path), flags, None)
        return info.fh

    async def write(self, fh: int, data: bytes, offset: int = 0) -> int:
        return await self.ops.write(fh, offset, data)

    async def write_errno(self, fh: int, data: bytes, offset: int = 0) -> int:
        """The errno of a ``write`` that must fail."""
        with pytest.raises(pyfuse3.FUSEError) as info:
            await self.ops.write(fh, offset, data)
        return info.value.errno

    async def read(self, fh: int, offset: int = 0, size: int = 1 << 30) -> bytes:
        return await self.ops.read(fh, offset, size)

    async def read_all(self, fh: int, offset: int = 0, size: int = 1 << 17) -> bytes:
        """Read from ``offset`` until a read returns nothing, as ``cat`` does."""
        out = bytearray()
        while chunk := await self.read(fh, offset + len(out), size):
            out += chunk
        return bytes(out)

    async def release(self, fh: int) -> None:
        await self.ops.release(fh)

    async def fsync(self, fh: int) -> None:
        await self.ops.fsync(fh, False)

    async def append(self, path: str, data: bytes) -> int:
        """``open(O_APPEND)``, one ``write``, ``close``: as ``printf ... >> path``."""
        fh = await self.open(path, APPEND)
        try:
            return await self.write(fh, data)
        finally:
            await self.release(fh)

    async def cat(self, path: str) -> bytes:
        fh = await self.open(path)
        try:
            return await self.read_all(fh)
        finally:
            await self.release(fh)

    # -- the engine underneath ----------------------------------------------------------------------------
    def log(self, topic: str = "t", partition: int = 0):
        return self.manager.get_log(topic, partition)

    def records(self, topic: str = "t", partition: int = 0) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every record of the partition, read from the engine."""
        return [(r.key, r.value) for r in self.log(topic, partition).read(0, 1 << 30)]

    def values(self, topic: str = "t", partition: int = 0) -> list[bytes | None]:
        return [v for _, v in self.records(topic, partition)]

    # -- extended attributes -----------------------------------------------------------------------------
    async def getxattr(self, path: str, name: str) -> bytes:
        return await self.ops.getxattr(await self.inode(path), name.encode(), None)

    async def getx(self, path: str, key: str) -> str:
        """``user.logfs.<key>`` as text."""
        return (await self.getxattr(path, "user.logfs." + key)).decode()

    async def setxattr(self, path: str, name: str, value: bytes | str) -> None:
        value = value.encode() if isinstance(value, str) else value
        await self.ops.setxattr(await self.inode(path), name.encode(), value, None)

    async def setconfig(self, topic: str, key: str, value: str) -> None:
        await self.setxattr(topic, "user.logfs.config." + key, value)

    async def removexattr(self, path: str, name: str) -> None:
        await self.ops.removexattr(await self.inode(path), name.encode(), None)

    async def listxattr(self, path: str) -> list[str]:
        return [n.decode() for n in await self.ops.listxattr(await self.inode(path), None)]

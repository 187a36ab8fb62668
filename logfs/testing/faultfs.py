#!/usr/bin/env python3
r"""faultfs: a FUSE passthrough of a directory that fails chosen operations with chosen errnos (issue 30).

    python -m logfs.testing.faultfs SOURCE MOUNTPOINT --control SOCKET [-f]

MOUNTPOINT shows SOURCE as it is: a passthrough (pyfuse3 + trio like logfs) with one OS descriptor per open
handle, page-cache I/O so mmap works both ways, kernel-local flock/fcntl locks, posix_fallocate emulated by glibc
(no FUSE fallocate), renameat2's NOREPLACE and EXCHANGE, links and symlinks; xattrs only with --xattrs (else the
kernel would ask for security.capability before every write). Inode numbers follow SOURCE's files (a rename keeps
one). Without -f it daemonizes once the mount and the socket are ready.

A test drives it through SOCKET, a unix socket speaking JSON lines (one request, one reply per line):

    {"cmd": "add", "op": "write", "path": "\\.log$", "errno": "EIO", "nth": 3}  -> {"ok": true, "id": 1}
    {"cmd": "add", "op": "read", "path": "x$", "delay_ms": 200, "count": -1}          (slow, not failed)
    {"cmd": "add", "op": "*", "path": "", "errno": "EIO", "probability": 0.02, "seed": 7}
    {"cmd": "add", "kind": "fsyncgate", "path": "\\.log$"}                         (see below)
    {"cmd": "clear"}  {"cmd": "clear", "id": 1}  {"cmd": "stats"}  {"cmd": "injected", "since": SEQ}  {"cmd": "ping"}

A fault rule: ``op`` (a name below, a list of them, or "*"); ``path``, a regex searched in the path relative to
SOURCE ("" is SOURCE itself; a rename or link matches on either name); ``errno``, a name or a number; ``nth``, the
first matching call to fail, counting from when the rule was added, 1-based (default 1); ``count``, how many calls
to fail (default 1, or unlimited with ``probability``; -1 = until cleared); ``probability`` and ``seed`` (random
mode: each matching call from the nth on fails with that probability, drawn from the rule's own generator, so the
same sequence of calls fails at the same places again); ``delay_ms``: sleep that long first (without ``errno``
the call then proceeds). A call counts in every live rule it matches and fails with the errno of the oldest rule
that fires. A failed call does nothing on SOURCE. A rule that has fired ``count`` times is spent: it stops
counting (and costing anything) but stays in "stats" until cleared. "stats" answers, per op, the calls seen, the
faults and delays injected, the rules, and the last faults; "injected" the faults kept (the last 1000, each
{"seq", "rule", "op", "path", ["path2",] "errno", "time"}; fsyncgate's drops appear as op "fsyncgate").

Operations: lookup getattr setattr readlink mknod mkdir unlink rmdir symlink rename link open create read write
flush ("close": close(2) returns flush's error) release (its error is ignored by the kernel) fsync (fsync and
fdatasync; "fdatasync" is an alias) opendir readdir releasedir fsyncdir statfs getxattr setxattr listxattr removexattr.
What the kernel sends is what counts:
- a write(2) is one ``write`` call, or several if larger than the FUSE request size (1 MiB on this kernel);
  mmap'd pages are written back by ``write`` calls at msync/fsync/close (a failure is then msync's or fsync's
  error) and read by ``read`` calls, a failed one being SIGBUS in the process touching the page;
- a read(2) through the page cache whose ``read`` call fails is retried once by the kernel: it takes two failed
  calls (or count -1) to fail it;
- attribute and entry timeouts are 0 (--attr-timeout, --entry-timeout): every stat(2) and every path
  resolution reaches the daemon (``getattr``, ``lookup``).

fsyncgate (a rule of kind "fsyncgate" on a path regex; nothing of it happens unless added) models Linux dropping
dirty pages after a failed write-back. Writes and truncates of matching files are applied to SOURCE at once but
remembered until a successful fsync of the file; when an fsync of such a file fails (by a fault rule or for
real), the writes since its last successful fsync are undone on SOURCE and the kernel's pages of the file are
invalidated, and the next fsync, with nothing dirty any more, returns 0.

A power cut (``{"cmd": "powercut"}``, after a gate on "" or on the files that matter) uses the same records: every
gated file loses what was written to it since its last successful fsync (a file never fsynced goes back to the
size it had when the gate first saw it written: 0 for a new file), as LazyFS's ``clear-cache`` does; names
(creates, renames, unlinks) are kept, as LazyFS keeps them. Kill the daemons writing through faultfs first (a
power cut stops them too): writes that arrive after the cut are the next boot's. Answers
{"ok": true, "files": N, "writes": M, "paths": [...]}: the files cut back (and their paths relative to SOURCE) and
the writes they lost.

From a test: ``faultfs_client.FaultFS`` (logfs/testing/faultfs_client.py), or the ``faultfs`` fixture of
tests/reliability/conftest.py, whose ``faultfs.mountpoint`` is the DATA_DIR to give a logfs daemon; then e.g.
``faultfs.fail("rename", r"\.swap$")``, ``faultfs.injected()``, ``faultfs.clear()``.

Run as ``python -m logfs.testing.faultfs`` (its own process: a FUSE daemon). Its rules are in
logfs.testing.faultfs_rules. It is longer than 500 lines because it is one passthrough: each FUSE operation is a handler
of a few lines over SOURCE, the fsyncgate and power-cut records are kept by the same handlers that write, and
cutting the class by operation would only spread one state (inodes, handles, dirty records) over files.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import functools
import json
import logging
import os
import signal
import socket
import stat
import sys
import time
import traceback

import pyfuse3
import trio

from logfs.testing.faultfs_rules import Injector
from logfs.testing.mounts import mounted_at

log = logging.getLogger("faultfs")

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


# -- the passthrough ----------------------------------------------------------------------------------------
def handler(fn):
    """OSError -> its errno; anything unexpected -> EIO and a traceback on stderr (never the end of the loop)."""

    @functools.wraps(fn)
    async def wrapper(*args):
        try:
            return await fn(*args)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception:
            log.error("%s%r failed:\n%s", fn.__name__, args[1:], traceback.format_exc())
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


# what an EntryAttributes takes from SOURCE's os.stat_result as it is
_STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blksize", "st_blocks",
                "st_atime_ns", "st_mtime_ns", "st_ctime_ns")


class FaultOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False  # every write(2) reaches the daemon (and its faults) when it is made

    def __init__(self, source: str, inj: Injector, attr_timeout: float = 0.0, entry_timeout: float = 0.0,
                 direct_io: bool = False, xattrs: bool = False):
        super().__init__()
        self.xattrs = xattrs
        self.src = os.path.abspath(source)
        self.inj = inj
        self.attr_timeout = attr_timeout
        self.entry_timeout = entry_timeout
        self.direct_io = direct_io
        self.uid = os.getuid()
        st = os.lstat(self.src)
        # Inodes: one FUSE inode per file of SOURCE ((st_dev, st_ino)), so a rename keeps it and a hard link
        # shares it; names maps it to its current names (relative paths), last to the last one it had.
        self.ids: dict[tuple[int, int], int] = {(st.st_dev, st.st_ino): pyfuse3.ROOT_INODE}
        self.next_ino = pyfuse3.ROOT_INODE + 1
        self.names: dict[int, list[str]] = {pyfuse3.ROOT_INODE: [""]}
        self.inode_of: dict[str, int] = {"": pyfuse3.ROOT_INODE}
        self.last: dict[int, str] = {}
        self.keys: dict[int, tuple[int, int]] = {pyfuse3.ROOT_INODE: (st.st_dev, st.st_ino)}
        self.dir_inodes: set[int] = {pyfuse3.ROOT_INODE}
        self.handles: dict[int, int] = {}  # fh (= the OS descriptor) -> inode
        self.inode_fds: dict[int, set[int]] = {}
        self.dirs: dict[int, list] = {}  # dir fh (= the OS descriptor) -> [inode, listing]
        # fsyncgate: per inode, the undo records of the writes since its last successful fsync
        self.undo: dict[int, list[tuple[int, bytes, int]]] = {}
        self.gate_fds: dict[int, int] = {}
        inj.power_cut = self.power_cut

    # -- names and inodes ---------------------------------------------------------------------------------
    def abspath(self, rel: str) -> str:
        return self.src + "/" + rel if rel else self.src

    def path_of(self, ino: int) -> str:
        names = self.names.get(ino)
        if names:
            return names[0]
        return self.last.get(ino, "")

    def _child(self, parent: int, name: bytes) -> str:
        base = self.path_of(parent)
        name = os.fsdecode(name)
        return base + "/" + name if base else name

    def _register(self, rel: str, st: os.stat_result) -> int:
        key = (st.st_dev, st.st_ino)
        ino = self.ids.get(key)
        if ino is None:
            ino = self.next_ino
            self.next_ino += 1
            self.ids[key] = ino
            self.keys[ino] = key
            if stat.S_ISDIR(st.st_mode):
                self.dir_inodes.add(ino)
        old = self.inode_of.get(rel)
        if old != ino:
            if old is not None:
                self._drop_name(old, rel)
            self.inode_of[rel] = ino
            names = self.names.setdefault(ino, [])
            if rel not in names:
                names.append(rel)
        return ino

    def _drop_name(self, ino: int, rel: str) -> None:
        names = self.names.get(ino)
        if names and rel in names:
            names.remove(rel)
            if not names:
                del self.names[ino]
                self.last[ino] = rel
                self._unlinked(ino)
        if self.inode_of.get(rel) == ino:
            del self.inode_of[rel]

    def _unlinked(self, ino: int) -> None:
        """A file lost its last name: once no descriptor holds it either, what it had not fsynced matters to no
        power cut (its bytes are gone with it), so its undo records and gate descriptor go too."""
        if ino not in self.inode_fds and ino in self.undo:
            del self.undo[ino]
            self._close_gate_fd(ino)
        self._maybe_forget(ino)

    def _maybe_forget(self, ino: int) -> None:
        """A file with no name and no descriptor is gone from SOURCE, which may reuse its inode number: a file
        made later with that number gets a new FUSE inode."""
        if ino in self.names or ino in self.inode_fds or ino in self.gate_fds:
            return
        key = self.keys.pop(ino, None)
        if key is not None and self.ids.get(key) == ino:
            del self.ids[key]
        self.dir_inodes.discard(ino)
        self.last.pop(ino, None)

    def _moves(self, old: str, new: str) -> list[tuple[str, str, int]]:
        """(name, new name, inode) of ``old`` and, for a directory, of every known name under it."""
        ino = self.inode_of.get(old)
        if ino is None:
            return []
        out = [(old, new, ino)]
        if ino in self.dir_inodes:
            prefix = old + "/"
            out += [(rel, new + rel[len(old):], i) for rel, i in self.inode_of.items() if rel.startswith(prefix)]
        return out

    def _move(self, moves: list[tuple[str, str, int]]) -> None:
        for rel, _renamed, _ino in moves:
            del self.inode_of[rel]
        for rel, renamed, ino in moves:
            self.inode_of[renamed] = ino
            names = self.names.get(ino)
            if names is not None and rel in names:
                names[names.index(rel)] = renamed

    def _renamed(self, old: str, new: str, exchange: bool = False) -> None:
        """The name ``old`` is now ``new`` with everything under it, and ``new`` is gone or (``exchange``)
        is now ``old``."""
        a = self.inode_of.get(old)
        if old == new or (a is not None and a == self.inode_of.get(new)):
            return  # rename(2) of a name onto itself or onto another link of its file: nothing happens
        moves = self._moves(old, new)
        if exchange:
            moves += self._moves(new, old)
        else:
            for rel, _renamed, ino in self._moves(new, new):  # replaced: gone, with what was under it
                self._drop_name(ino, rel)
        self._move(moves)

    def _entry(self, ino: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.generation = 0
        entry.entry_timeout = self.entry_timeout
        entry.attr_timeout = self.attr_timeout
        for name in _STAT_FIELDS:
            setattr(entry, name, getattr(st, name))
        return entry

    def _stat(self, ino: int) -> os.stat_result:
        fds = self.inode_fds.get(ino)
        if fds:
            for fd in fds:
                return os.fstat(fd)  # right even when the file has no name any more
        names = self.names.get(ino)
        if not names:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return os.lstat(self.abspath(names[0]))

    def _own(self, path: str, ctx) -> None:
        if ctx is not None and (ctx.uid != self.uid or ctx.gid != os.getgid()):
            os.lchown(path, ctx.uid, ctx.gid)

    async def _fault(self, op: str, rules: list, path: str, path2: str | None = None) -> None:
        err, delay = self.inj.decide(op, rules, path, path2)
        if delay:
            await trio.sleep(delay)
        if err:
            raise pyfuse3.FUSEError(err)

    async def _enter(self, op: str, path: str, path2: str | None = None) -> None:
        """Count a call of ``op``, then apply the rules of ``op`` (if any) to it on ``path`` (and ``path2``)."""
        inj = self.inj
        inj.calls[op] += 1
        rules = inj.by_op.get(op)
        if rules:
            await self._fault(op, rules, path, path2)

    def _new_handle(self, fd: int, ino: int) -> None:
        self.handles[fd] = ino
        fds = self.inode_fds.get(ino)
        if fds is None:
            self.inode_fds[ino] = {fd}
        else:
            fds.add(fd)

    # -- metadata -----------------------------------------------------------------------------------------
    @handler
    async def lookup(self, parent_inode, name, ctx=None):
        rel = self._child(parent_inode, name)
        await self._enter("lookup", rel)
        st = os.lstat(self.abspath(rel))
        return self._entry(self._register(rel, st), st)

    @handler
    async def getattr(self, inode, ctx=None):
        await self._enter("getattr", self.path_of(inode))
        return self._entry(inode, self._stat(inode))

    @handler
    async def setattr(self, inode, attr, fields, fh, ctx):
        inj = self.inj
        rel = self.path_of(inode)
        await self._enter("setattr", rel)
        if fh is not None and fh not in self.handles:
            fh = None
        target = fh if fh is not None else self.abspath(rel)
        if fields.update_size:
            if inj.gates and inj.gated(rel):
                self._remember(inode, fh, attr.st_size, None)
            if fh is not None:
                os.ftruncate(fh, attr.st_size)
            else:
                os.truncate(target, attr.st_size)
        st = None
        if fields.update_mode:
            st = self._stat(inode)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(target, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            if fh is not None:
                os.fchown(fh, uid, gid)
            else:
                os.lchown(target, uid, gid)
        if fields.update_atime or fields.update_mtime:
            st = self._stat(inode)
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            if fh is not None:
                os.utime(fh, ns=(atime, mtime))
            else:
                os.utime(target, ns=(atime, mtime), follow_symlinks=False)
        return self._entry(inode, self._stat(inode))

    @handler
    async def readlink(self, inode, ctx):
        rel = self.path_of(inode)
        await self._enter("readlink", rel)
        return os.readlink(os.fsencode(self.abspath(rel)))

    async def _made(self, rel: str, ctx) -> pyfuse3.EntryAttributes:
        path = self.abspath(rel)
        self._own(path, ctx)
        st = os.lstat(path)
        return self._entry(self._register(rel, st), st)

    @handler
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        rel = self._child(parent_inode, name)
        await self._enter("mknod", rel)
        os.mknod(self.abspath(rel), mode, rdev)
        return await self._made(rel, ctx)

    @handler
    async def mkdir(self, parent_inode, name, mode, ctx):
        rel = self._child(parent_inode, name)
        await self._enter("mkdir", rel)
        os.mkdir(self.abspath(rel), mode)
        return await self._made(rel, ctx)

    @handler
    async def symlink(self, parent_inode, name, target, ctx):
        rel = self._child(parent_inode, name)
        await self._enter("symlink", rel)
        os.symlink(target, os.fsencode(self.abspath(rel)))
        return await self._made(rel, ctx)

    @handler
    async def link(self, inode, new_parent_inode, new_name, ctx):
        old = self.path_of(inode)
        rel = self._child(new_parent_inode, new_name)
        await self._enter("link", rel, old)
        os.link(self.abspath(old), self.abspath(rel), follow_symlinks=False)
        st = os.lstat(self.abspath(rel))
        return self._entry(self._register(rel, st), st)

    async def _remove(self, op: str, remove, parent_inode: int, name: bytes) -> None:
        rel = self._child(parent_inode, name)
        await self._enter(op, rel)
        remove(self.abspath(rel))
        ino = self.inode_of.get(rel)
        if ino is not None:
            self._drop_name(ino, rel)

    @handler
    async def unlink(self, parent_inode, name, ctx):
        await self._remove("unlink", os.unlink, parent_inode, name)

    @handler
    async def rmdir(self, parent_inode, name, ctx):
        await self._remove("rmdir", os.rmdir, parent_inode, name)

    @handler
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        await self._enter("rename", old, new)
        src, dst = self.abspath(old), self.abspath(new)
        if not flags:
            os.rename(src, dst)
        else:
            if _renameat2 is None:
                raise pyfuse3.FUSEError(errno.EINVAL)
            if _renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags)) != 0:
                raise pyfuse3.FUSEError(ctypes.get_errno())
        self._renamed(old, new, exchange=bool(flags & RENAME_EXCHANGE))

    # -- files --------------------------------------------------------------------------------------------
    def _reopen_path(self, inode: int) -> str:
        names = self.names.get(inode)
        if names:
            return self.abspath(names[0])
        fds = self.inode_fds.get(inode)
        if fds:
            for fd in fds:
                return f"/proc/self/fd/{fd}"
        raise pyfuse3.FUSEError(errno.ENOENT)

    @staticmethod
    def _flags(flags: int) -> int:
        # O_APPEND: the kernel gives the offset of each write (the size it knows); the descriptor must honour it,
        # and mmap write-back goes through it. O_DIRECT: our buffers are not aligned, the kernel did its part.
        return (flags & ~(os.O_APPEND | os.O_CREAT | os.O_EXCL | getattr(os, "O_DIRECT", 0))) | os.O_CLOEXEC

    @handler
    async def open(self, inode, flags, ctx):
        await self._enter("open", self.path_of(inode))
        fd = os.open(self._reopen_path(inode), self._flags(flags))
        self._new_handle(fd, inode)
        return pyfuse3.FileInfo(fh=fd, direct_io=self.direct_io, keep_cache=False)

    @handler
    async def create(self, parent_inode, name, mode, flags, ctx):
        rel = self._child(parent_inode, name)
        await self._enter("create", rel)
        path = self.abspath(rel)
        fd = os.open(path, self._flags(flags) | os.O_CREAT | (flags & os.O_EXCL), mode)
        try:
            self._own(path, ctx)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        ino = self._register(rel, st)
        self._new_handle(fd, ino)
        return pyfuse3.FileInfo(fh=fd, direct_io=self.direct_io, keep_cache=False), self._entry(ino, st)

    async def read(self, fh, off, size):
        inj = self.inj
        inj.calls["read"] += 1
        rules = inj.by_op.get("read")
        try:
            if rules:
                await self._fault("read", rules, self.path_of(self.handles[fh]))
            return os.pread(fh, size, off)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    async def write(self, fh, off, buf):
        inj = self.inj
        inj.calls["write"] += 1
        try:
            rules = inj.by_op.get("write")
            if rules or inj.gates:
                ino = self.handles[fh]
                rel = self.path_of(ino)
                if rules:
                    await self._fault("write", rules, rel)
                if inj.gates and inj.gated(rel):
                    self._remember(ino, fh, off, len(buf))
            return os.pwrite(fh, buf, off)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    @handler
    async def flush(self, fh):
        await self._enter("flush", self.path_of(self.handles[fh]))

    @handler
    async def release(self, fh):
        inj = self.inj
        inj.calls["release"] += 1
        ino = self.handles.pop(fh, None)
        fds = self.inode_fds.get(ino)
        if fds is not None:
            fds.discard(fh)
            if not fds:
                del self.inode_fds[ino]
                if ino not in self.undo:
                    self._close_gate_fd(ino)
                if ino in self.names:
                    self._maybe_forget(ino)
                else:
                    self._unlinked(ino)
        os.close(fh)
        rules = inj.by_op.get("release")
        if rules:  # the kernel ignores release's answer; the descriptor is closed either way
            await self._fault("release", rules, self.path_of(ino))

    @handler
    async def fsync(self, fh, datasync):
        inj = self.inj
        inj.calls["fsync"] += 1
        ino = self.handles[fh]
        rules = inj.by_op.get("fsync")
        try:
            if rules:
                await self._fault("fsync", rules, self.path_of(ino))
            if datasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)
        except (pyfuse3.FUSEError, OSError):
            if ino in self.undo:
                self._drop_dirty(ino)
                await self._invalidate(ino)
            raise
        if ino in self.undo:
            del self.undo[ino]
            if ino not in self.inode_fds:
                self._close_gate_fd(ino)
                self._maybe_forget(ino)

    # -- fsyncgate ----------------------------------------------------------------------------------------
    def _gate_fd(self, ino: int, fh: int | None) -> int:
        fd = self.gate_fds.get(ino)
        if fd is None:
            path = f"/proc/self/fd/{fh}" if fh is not None else self._reopen_path(ino)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            self.gate_fds[ino] = fd
        return fd

    def _close_gate_fd(self, ino: int) -> None:
        fd = self.gate_fds.pop(ino, None)
        if fd is not None:
            os.close(fd)

    def _remember(self, ino: int, fh: int | None, off: int, length: int | None) -> None:
        """Before a write of ``length`` bytes at ``off`` (None: a truncate to ``off``): what it replaces."""
        fd = self._gate_fd(ino, fh)
        size = os.fstat(fd).st_size
        if length is None:  # truncate: what lies beyond the new size
            old = os.pread(fd, size - off, off) if off < size else b""
        else:
            old = os.pread(fd, min(length, size - off), off) if off < size else b""
        self.undo.setdefault(ino, []).append((off, old, size))

    def _drop_dirty(self, ino: int, why: str = "fsyncgate") -> int:
        """A failed fsync: the writes it covered never reach the disk (Linux marks the pages clean and drops them).
        Also a power cut's, file by file. Returns how many writes were undone."""
        records = self.undo.pop(ino)
        fd = self.gate_fds[ino]
        for off, old, _size in reversed(records):
            if old:
                os.pwrite(fd, old, off)
        os.ftruncate(fd, records[0][2])
        seq = self.inj.seq = self.inj.seq + 1
        self.inj.log.append({"seq": seq, "rule": None, "op": why, "path": self.path_of(ino),
                             "time": time.time(), "dropped_writes": len(records)})
        if ino not in self.inode_fds:
            self._close_gate_fd(ino)
            self._maybe_forget(ino)
        return len(records)

    async def power_cut(self) -> dict:
        """Every gated file back to its last fsynced bytes; the kernel's pages of them dropped."""
        cut = list(self.undo)
        paths = sorted(self.path_of(ino) for ino in cut)
        writes = sum(self._drop_dirty(ino, "powercut") for ino in cut)
        for ino in cut:
            await self._invalidate(ino)
        return {"ok": True, "files": len(cut), "writes": writes, "paths": paths}

    @staticmethod
    async def _invalidate(ino: int) -> None:
        """Drop the kernel's pages (and mmaps) of a file: they hold bytes SOURCE no longer has. In a thread, the
        loop serving on (dirty mmap'd pages are written back through us first); waited for, within reason."""
        with trio.move_on_after(2):
            try:
                await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino, abandon_on_cancel=True)
            except OSError:
                pass

    # -- directories --------------------------------------------------------------------------------------
    @handler
    async def opendir(self, inode, ctx):
        await self._enter("opendir", self.path_of(inode))
        fd = os.open(self._reopen_path(inode), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.dirs[fd] = [inode, None]
        return fd

    @handler
    async def readdir(self, fh, start_id, token):
        state = self.dirs[fh]
        ino = state[0]
        base = self.path_of(ino)
        await self._enter("readdir", base)
        if start_id == 0 or state[1] is None:
            listing = []
            for name in os.listdir(fh):
                try:
                    st = os.lstat(name, dir_fd=fh)
                except FileNotFoundError:
                    continue
                listing.append((name, st))
            state[1] = listing
        listing = state[1]
        for index in range(start_id, len(listing)):
            name, st = listing[index]
            rel = base + "/" + name if base else name
            child = self._register(rel, st)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(child, st), index + 1):
                break

    @handler
    async def releasedir(self, fh):
        self.inj.calls["releasedir"] += 1
        self.dirs.pop(fh, None)
        os.close(fh)

    @handler
    async def fsyncdir(self, fh, datasync):
        await self._enter("fsyncdir", self.path_of(self.dirs[fh][0]))
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    @handler
    async def statfs(self, ctx):
        await self._enter("statfs", "")
        sv = os.statvfs(self.src)
        out = pyfuse3.StatvfsData()
        for attr in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                     "f_namemax"):
            setattr(out, attr, getattr(sv, attr))
        return out

    # -- xattrs -------------------------------------------------------------------------------------------
    async def _xattr_path(self, op: str, inode: int) -> str:
        """The xattr ops: counted, ENOSYS unless --xattrs, then faulted; the path of ``inode`` in SOURCE."""
        self.inj.calls[op] += 1
        if not self.xattrs:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        rel = self.path_of(inode)
        rules = self.inj.by_op.get(op)
        if rules:
            await self._fault(op, rules, rel)
        return self.abspath(rel)

    @handler
    async def getxattr(self, inode, name, ctx):
        path = await self._xattr_path("getxattr", inode)
        return os.getxattr(path, name, follow_symlinks=False)

    @handler
    async def setxattr(self, inode, name, value, ctx):
        path = await self._xattr_path("setxattr", inode)
        os.setxattr(path, name, value, follow_symlinks=False)

    @handler
    async def listxattr(self, inode, ctx):
        path = await self._xattr_path("listxattr", inode)
        return [os.fsencode(n) for n in os.listxattr(path, follow_symlinks=False)]

    @handler
    async def removexattr(self, inode, name, ctx):
        path = await self._xattr_path("removexattr", inode)
        os.removexattr(path, name, follow_symlinks=False)


# -- the control socket -------------------------------------------------------------------------------------
async def serve_control(inj: Injector, path: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)
    listener = trio.SocketListener(sock)
    task_status.started()

    async def client(stream):
        pending = b""
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if not line.strip():
                        continue
                    try:
                        req = json.loads(line)
                        if req.get("cmd") == "powercut":
                            reply = await inj.power_cut()
                        else:
                            reply = inj.request(req)
                    except Exception as exc:  # a bad request is answered, never fatal
                        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    try:
                        await stream.send_all(json.dumps(reply).encode() + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return

    await trio.serve_listeners(client, [listener])


async def run(ops: FaultOperations, inj: Injector, control: str, ready_fd: int | None) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, inj, control)

        async def signals():
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
                async for _ in received:
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(signals)
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        print(f"faultfs: {ops.src} mounted (pid {os.getpid()}, control {control})", file=sys.stderr, flush=True)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted (fusermount3 -u): the control server stops too


def _allow_other() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        with open("/etc/fuse.conf", encoding="utf-8") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--control", required=True, help="the unix socket of the control requests")
    parser.add_argument("-f", "--foreground", action="store_true")
    parser.add_argument("--attr-timeout", type=float, default=0.0)
    parser.add_argument("--entry-timeout", type=float, default=0.0)
    parser.add_argument("--direct-io", action="store_true", help="no page cache (then no shared writable mmap)")
    parser.add_argument("--xattrs", action="store_true",
                        help="pass extended attributes through (off: ENOSYS, so the kernel stops asking for "
                             "security.capability before every write)")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="faultfs %(levelname)s %(message)s")
    source = os.path.abspath(args.source)
    mountpoint = os.path.abspath(args.mountpoint)
    control = os.path.abspath(args.control)
    if not os.path.isdir(source):
        parser.error(f"{source} is not a directory")

    ready_fd = None
    if not args.foreground:
        r, w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(w)
            ok = os.read(r, 1)
            return 0 if ok == b"1" else 1
        os.close(r)
        os.setsid()
        ready_fd = w
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)

    os.umask(0)  # the kernel sends modes with the caller's umask applied
    inj = Injector()
    ops = FaultOperations(source, inj, attr_timeout=args.attr_timeout, entry_timeout=args.entry_timeout,
                          direct_io=args.direct_io, xattrs=args.xattrs)
    options = set(pyfuse3.default_options)
    options |= {"fsname=faultfs", "subtype=faultfs"}
    if _allow_other():
        options.add("allow_other")
    if args.debug:
        options.add("debug")
    pyfuse3.init(ops, mountpoint, options)
    try:
        trio.run(run, ops, inj, control, ready_fd)
    except BaseException:
        pyfuse3.close(unmount=True)
        raise
    pyfuse3.close(unmount=mounted_at(mountpoint))
    try:
        os.unlink(control)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

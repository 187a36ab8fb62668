"""Linux inotify through ctypes: how a broker mount learns which of the broker's partitions changed (storage/broker).

A few calls of libc (``inotify_init1``, ``inotify_add_watch``, ``inotify_rm_watch``) and ``os.read`` of the events;
no dependency (the PyPI wrappers are the same sixty lines, or asyncio's). The descriptor is non-blocking: the
follower drains it at each look (:meth:`Inotify.drain`) and never waits on it, so no thread of its own is needed.

One watch per directory: a directory's watch reports what happens to the files in it, by name (``IN_MODIFY`` of a
``.log`` the broker appends to, ``IN_CREATE`` of a new segment, the renames of retention and of the cleaner's
swap, ``IN_DELETE``), so a partition costs one watch (``fs.inotify.max_user_watches``: 10,000 partitions are 10,000
of its default 8192 on older kernels and of 192536 here; a watch the kernel refuses leaves its directory to
polling). The kernel queues at most ``fs.inotify.max_queued_events`` (16384) events, merging a repeat of the last
unread one; past that it drops them and says so (``IN_Q_OVERFLOW``): the caller then looks at everything once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What a directory of the broker's is watched for: the files in it written, created, renamed or removed, and the
# directory itself renamed or removed.
DIR_EVENTS = (IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
              | IN_ONLYDIR)

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name, NUL-padded)
_READ = 1 << 16

_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


class Event(NamedTuple):
    wd: int
    mask: int
    name: str


class Inotify:
    """One inotify instance: watches by path, events drained without blocking."""

    def __init__(self):
        fd = _lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd

    def add(self, path: str, mask: int = DIR_EVENTS) -> int:
        """Watch ``path``; its watch descriptor (a path watched already gives its descriptor again). OSError when
        the kernel refuses (ENOSPC: ``max_user_watches`` reached; ENOENT: gone)."""
        wd = _lib().inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch: {os.strerror(err)}", path)
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching (a watch the kernel dropped already, its directory removed, is no error)."""
        if _lib().inotify_rm_watch(self.fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_rm_watch: {os.strerror(err)}")

    def drain(self) -> list[Event]:
        """Every event queued now (none: an empty list). An overflow is an event with ``IN_Q_OVERFLOW``."""
        out: list[Event] = []
        while True:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return out
            at = 0
            while at < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                at += _EVENT.size
                name = data[at: at + length].rstrip(b"\0").decode("utf-8", "surrogateescape") if length else ""
                at += length
                out.append(Event(wd, mask, name))
            if len(data) < _READ - 4096:
                return out  # (a short read: the queue is empty; saves the read that says EAGAIN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

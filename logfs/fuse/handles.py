"""Open partition files: each handle's consistent view and its line buffer.

A handle reads through its own pinned :class:`~logfs.view.text.SegmentView`: the view as it was at ``open()``
plus everything appended since, unaffected by retention or compaction. Writes are split into lines; complete
lines are appended as records at once (one ``Log.append`` per ``write()``, so lines of concurrent writers never
interleave), and a trailing partial line waits in the handle until its newline arrives, the handle is fsynced, or
the handle is closed (released: the last close of the open file, not a forked child's close of its copy).
"""

from __future__ import annotations

import errno
import os

from ..storage.log import Log
from ..view.text import SegmentView, open_view
from .errors import fail


class PartitionHandle:
    __slots__ = ("log", "view", "append_mode", "writable", "pending", "inode")

    def __init__(self, log: Log, inode: int, flags: int):
        self.log = log
        self.inode = inode
        self.view: SegmentView = open_view(log)
        self.append_mode = bool(flags & os.O_APPEND)
        self.writable = (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
        self.pending = b""

    def length(self) -> int:
        """This handle's view length, picking up segments rolled since open."""
        view = self.view
        if view.segments and view.segments[-1].next_offset < self.log.log_end_offset:
            view.extend()
        return view.length()

    def read(self, offset: int, size: int) -> bytes:
        if offset >= self.view.length():
            self.length()
        return self.view.read(offset, size)

    def write(self, offset: int, data: bytes) -> int:
        if not self.append_mode and offset != self.length() + len(self.pending):
            fail(errno.EPERM)  # only appends: a write must land at the end of the file
        limit = self.log.config.max_message_bytes
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(self.pending) + len(data) > limit:
                fail(errno.EFBIG)
            self.pending += data
            return len(data)
        rest = data[cut + 1 :]
        if len(rest) > limit:
            fail(errno.EFBIG)
        # A line over the limit fails the whole write with EFBIG and nothing appended: the log checks every
        # record before writing (RecordTooLargeError); with a key separator, the line itself is checked here.
        # Each raises before ``pending`` changes, so a failed write leaves the handle as it was.
        config = self.log.config
        if config.key_separator is None and config.null_marker is None:
            self.log.append_lines(self.pending, data, cut + 1)  # the bulk path: no list of lines, no copy
        else:
            lines = (self.pending + data[:cut]).split(b"\n")
            if config.key_separator is not None and max(map(len, lines)) > limit:
                fail(errno.EFBIG)
            self._append(lines)
        self.pending = rest
        return len(data)

    def commit_pending(self) -> None:
        if self.pending:
            line, self.pending = self.pending, b""
            self._append([line])

    def _append(self, lines: list[bytes]) -> None:
        config = self.log.config
        sep, marker = config.key_separator, config.null_marker
        if sep is None and marker is None:
            self.log.append(lines, has_nulls=False)
            return
        keys: list[bytes | None] | None = None
        values: list[bytes | None] = lines  # type: ignore[assignment]
        if sep is not None:
            keys, values = [], []
            for line in lines:
                key, found, value = line.partition(sep)
                if found:
                    keys.append(key)
                    values.append(value)
                else:
                    keys.append(None)
                    values.append(line)
        if marker is not None:
            values = [None if v == marker else v for v in values]
        self.log.append(values, keys)

    def release(self) -> None:
        self.view.release()

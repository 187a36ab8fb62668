"""The mount's inode numbers: one per topic directory and per partition file, given the first time the entry is
seen; never reused, so a removed partition's open handles keep a number nobody else gets. The sink's entries (the
staging directory, its files, the commit file) take numbers from the same counter.

Generations: a partition's name keeps its inode until its log start moves (retention, DeleteRecords) while
handles are open on it; then those handles keep the old inode, whose size is their own view's (it never shrinks:
``tail -f`` never sees a truncation), and the name gets a new inode, the file as new opens see it. As logrotate
does, with the old file's name gone.

Not thread-safe: used on the trio thread only, by :class:`~logfs.fuse.operations.Operations`.
"""

from __future__ import annotations

import itertools
from typing import Callable

import pyfuse3

ROOT = pyfuse3.ROOT_INODE


class InodeTable:
    """Topic -> inode, (topic, partition) -> inode, and back (O(1) each). ``log_start(key)`` is the partition's
    log start offset now, or None once it is gone."""

    def __init__(self, log_start: Callable[[tuple[str, int]], int | None]):
        self._log_start = log_start
        self._next = itertools.count(ROOT + 1)
        self._topic: dict[str, int] = {}
        self._partition: dict[tuple[str, int], int] = {}
        self._entry: dict[int, tuple[str, int | None]] = {}
        self._gen_start: dict[tuple[str, int], int] = {}  # the log start when the name's inode was last checked
        self._open_on: dict[int, int] = {}  # inode -> partition handles open on it
        self._old: dict[int, tuple[str, int]] = {}  # earlier inodes of a name, while handles are open on them

    def allocate(self) -> int:
        """A new number, for an entry that is not a topic or a partition."""
        return next(self._next)

    def topic(self, topic: str) -> int:
        ino = self._topic.get(topic)
        if ino is None:
            ino = self._topic[topic] = next(self._next)
            self._entry[ino] = (topic, None)
        return ino

    def partition(self, topic: str, partition: int) -> int:
        """The inode of the partition's name now (a new one if its log start moved under open handles)."""
        key = (topic, partition)
        ino = self._partition.get(key)
        if ino is not None and self._moved_under_handles(ino, key):
            ino = None
        if ino is None:
            ino = self._partition[key] = next(self._next)
            self._entry[ino] = key
            start = self._log_start(key)
            self._gen_start[key] = start if start is not None else 0
        return ino

    def entry(self, inode: int) -> tuple[str, int | None]:
        """(topic, None) or (topic, partition), for a live name or an earlier inode of a partition held by open
        handles; KeyError for an inode that names neither (any more)."""
        entry = self._entry.get(inode)
        if entry is None:
            return self._old[inode]
        return entry

    def __contains__(self, inode: int) -> bool:
        """Whether ``inode`` is a live name (not an earlier inode held by handles)."""
        return inode in self._entry

    def forget_topic(self, topic: str) -> None:
        self._entry.pop(self._topic.pop(topic, None), None)

    def forget_partition(self, topic: str, partition: int) -> None:
        self._entry.pop(self._partition.pop((topic, partition), None), None)
        self._gen_start.pop((topic, partition), None)

    # -- handles and generations -------------------------------------------------------------------------------
    def opened(self, inode: int) -> None:
        self._open_on[inode] = self._open_on.get(inode, 0) + 1

    def closed(self, inode: int) -> None:
        left = self._open_on.get(inode, 0) - 1
        if left > 0:
            self._open_on[inode] = left
        else:
            self._open_on.pop(inode, None)
            self._old.pop(inode, None)

    def is_open(self, inode: int) -> bool:
        return inode in self._open_on

    def retire_if_moved(self, inode: int) -> None:
        """Give the name a new inode if its log start moved while handles hold ``inode`` (an fstat of a handle
        whose file shrank from the front since)."""
        key = self._entry.get(inode)
        if key is not None and key[1] is not None and self._partition.get(key) == inode:
            self._moved_under_handles(inode, key)

    def _moved_under_handles(self, ino: int, key: tuple[str, int]) -> bool:
        """Whether the log start of the partition moved since its inode ``ino`` was given out while handles are
        open on it: then the inode is retired to those handles (True), and the name needs a new one."""
        start = self._log_start(key)
        if start is None or start == self._gen_start.get(key, start):
            return False
        if not self._open_on.get(ino):
            self._gen_start[key] = start  # nobody holds the old view: the same inode serves the new one
            return False
        del self._partition[key]
        del self._entry[ino]
        self._old[ino] = key
        return True

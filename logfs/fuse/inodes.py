"""The mount's inode numbers: one per topic directory and per partition file, given the first time the entry is
seen and kept until it is removed; never reused, so a removed partition's open handles keep a number nobody else
gets. The sink's entries (the staging directory, its files, the commit file) take numbers from the same counter.

Not thread-safe: used on the trio thread only, by :class:`~logfs.fuse.operations.Operations`.
"""

from __future__ import annotations

import itertools

import pyfuse3

ROOT = pyfuse3.ROOT_INODE


class InodeTable:
    """Topic -> inode, (topic, partition) -> inode, and back (O(1) each)."""

    def __init__(self):
        self._next = itertools.count(ROOT + 1)
        self._topic: dict[str, int] = {}
        self._partition: dict[tuple[str, int], int] = {}
        self._entry: dict[int, tuple[str, int | None]] = {}

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
        key = (topic, partition)
        ino = self._partition.get(key)
        if ino is None:
            ino = self._partition[key] = next(self._next)
            self._entry[ino] = key
        return ino

    def entry(self, inode: int) -> tuple[str, int | None]:
        """(topic, None) or (topic, partition); KeyError for an inode that names neither (any more)."""
        return self._entry[inode]

    def __contains__(self, inode: int) -> bool:
        return inode in self._entry

    def forget_topic(self, topic: str) -> None:
        self._entry.pop(self._topic.pop(topic, None), None)

    def forget_partition(self, topic: str, partition: int) -> None:
        self._entry.pop(self._partition.pop((topic, partition), None), None)

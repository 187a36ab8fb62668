"""The mount's inode numbers: one per topic directory and per partition file, given the first time the entry is
seen; never reused, so a removed partition's open handles keep a number nobody else gets. The sink's entries (the
staging directory, its files, the commit file) take numbers from the same counter.

Generations: a partition's name keeps its inode until the positions of its text view change (the log start moves:
retention, DeleteRecords; records are rewritten: compaction, a truncation; the line format changes) while handles
are open on it; then those handles keep the old inode, whose size is their own view's (it never shrinks:
``tail -f`` never sees a truncation), and the name gets a new inode, the file as new opens see it. As logrotate
does, with the old file's name gone. So every handle open on one inode has the same positions, and an xattr asked
of that inode (FUSE's GETXATTR carries the inode, not the handle: ``fgetxattr``) answers in their view
(CONTRACT section 4, "Positions belong to a view"). An open whose view would not have the positions of the readers
already open on its inode (the view changed between the kernel's lookup of the name and the open) gets a twin of
their view instead: the file as it was when the kernel looked it up. Only when there is none to copy (they let
segments go, having read past them) is the open refused with ESTALE after the inode is retired: the kernel then
looks the name up again and opens its new inode.

Not thread-safe: used on the trio thread only, by :class:`~logfs.fuse.operations.Operations`.
"""

from __future__ import annotations

import itertools
from typing import Callable, Hashable

import pyfuse3

ROOT = pyfuse3.ROOT_INODE


class InodeTable:
    """Topic -> inode, (topic, partition) -> inode, and back (O(1) each). ``positions(key)`` says which positions
    the partition's view has now (any value that compares equal for equal positions), or None once it is gone;
    a handle passed to :meth:`opened` has a ``positions`` attribute, its own view's."""

    def __init__(self, positions: Callable[[tuple[str, int]], Hashable | None]):
        self._positions = positions
        self._next = itertools.count(ROOT + 1)
        self._topic: dict[str, int] = {}
        self._partition: dict[tuple[str, int], int] = {}
        self._entry: dict[int, tuple[str, int | None]] = {}
        self._gen: dict[tuple[str, int], Hashable] = {}  # the positions when the name's inode was last checked
        self._open_on: dict[int, list] = {}  # inode -> the partition handles open on it (its readers: one positions)
        self._old: dict[int, tuple[str, int]] = {}  # earlier inodes of a name, until the kernel forgets them

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
        """The inode of the partition's name now (a new one if its positions changed under open handles)."""
        key = (topic, partition)
        ino = self._partition.get(key)
        if ino is not None and self._moved_under_handles(ino, key):
            ino = None
        if ino is None:
            ino = self._partition[key] = next(self._next)
            self._entry[ino] = key
            self._gen[key] = self._positions(key)
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
        self._gen.pop((topic, partition), None)

    # -- handles and generations -------------------------------------------------------------------------------
    def reader(self, inode: int):
        """A readable handle open on ``inode``, or None: its positions are the inode's."""
        return next((h for h in self._open_on.get(inode, ()) if h.readable), None)

    def opened(self, inode: int, handle) -> bool:
        """Count ``handle`` as open on ``inode``, unless it can read and the readable handles already open there
        have other positions: then nothing is counted, the inode is retired if it is still the name's (the name's
        next lookup gives a new one), and False says so (the caller opens a twin of their view instead, or refuses
        the open). A handle that cannot read has no positions anyone asks for."""
        reader = self.reader(inode) if handle.readable else None
        if reader is not None and reader.positions != handle.positions:
            key = self._entry.get(inode)
            if key is not None and key[1] is not None and self._partition.get(key) == inode:
                self._retire(inode, key)
            return False
        held = self._open_on.get(inode)
        key = self._entry.get(inode)
        if handle.readable and key is not None and key[1] is not None and self._partition.get(key) == inode:
            self._gen[key] = handle.positions  # (the inode now stands for the view its readers have)
        if held is None:
            self._open_on[inode] = [handle]
        else:
            held.append(handle)
        return True

    def closed(self, inode: int, handle) -> None:
        """``handle`` is released. An earlier inode stays known after its last handle, until the kernel forgets
        it (:meth:`forget`): a request may still come for it (a lookup answered it just before it was retired),
        and answers for the partition as it is now."""
        held = self._open_on.get(inode)
        if held is None:
            return
        held[:] = [h for h in held if h is not handle]
        if not held:
            del self._open_on[inode]

    def forget(self, inode: int) -> None:
        """The kernel let go of ``inode`` (FORGET: no dentry, no open file of its refers to it): an earlier inode
        of a partition with no handle left is forgotten here too. Live names keep their numbers."""
        if inode not in self._open_on:
            self._old.pop(inode, None)

    def is_open(self, inode: int) -> bool:
        return inode in self._open_on

    def handles(self, inode: int) -> list:
        """The handles open on ``inode`` (those that can read have the same positions)."""
        return self._open_on.get(inode, [])

    def retire_if_moved(self, inode: int) -> None:
        """Give the name a new inode if its positions changed while handles hold ``inode`` (an fstat of a handle
        whose file shrank from the front since)."""
        key = self._entry.get(inode)
        if key is not None and key[1] is not None and self._partition.get(key) == inode:
            self._moved_under_handles(inode, key)

    def _moved_under_handles(self, ino: int, key: tuple[str, int]) -> bool:
        """Whether the positions of the partition changed since its inode ``ino`` was given out while handles are
        open on it: then the inode is retired to those handles (True), and the name needs a new one."""
        now = self._positions(key)
        if now is None or now == self._gen.get(key, now):
            return False
        if not self._open_on.get(ino):
            self._gen[key] = now  # nobody holds the old view: the same inode serves the new one
            return False
        self._retire(ino, key)
        return True

    def _retire(self, ino: int, key: tuple[str, int]) -> None:
        del self._partition[key]
        del self._entry[ino]
        self._old[ino] = key

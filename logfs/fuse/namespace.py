"""The namespace handlers of the mount: listing and creating topics (directories), removing partitions and topics.

Held by :class:`~logfs.fuse.operations.Operations`, whose handlers of the same names call these; partition files
themselves (create, open, read, write) stay in operations.py. Renames, links, symlinks and device nodes are refused: a
partition's name is its number, and a topic's its directory.
"""

from __future__ import annotations

import bisect
import errno

import pyfuse3

from ..storage.errors import LogfsError
from ..storage.names import MOUNT_COMMIT, MOUNT_STAGING, parse_partition_number
from .errors import fail, translate
from .inodes import ROOT


def decode_name(name: bytes) -> str:
    """A name from the kernel as text; EINVAL for one that is not UTF-8."""
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        fail(errno.EINVAL)


class Namespace:
    """Directory handlers, and the refused namespace operations. ``resolve`` is the mount's inode -> (topic,
    partition or None), ``attrs`` an entry's attributes, ``name_attrs`` a partition name's (its inode now, a log
    start measured first where that needs a fetch); the sink's entries are ``control``."""

    def __init__(self, manager, inodes, control, *, resolve, attrs, name_attrs, read_only: bool, run_blocking):
        self.manager = manager
        self.inodes = inodes
        self.control = control
        self._resolve, self._attrs, self._name_attrs = resolve, attrs, name_attrs
        self.read_only = read_only
        self.run_blocking = run_blocking
        self._root_listing: list[tuple[int, str]] | None = None  # the root's entries, as the listing began

    # -- directories -----------------------------------------------------------------------------------
    @translate
    async def opendir(self, inode, ctx):
        if inode == self.control.staging_ino:
            return inode
        if self.control.is_control(inode):
            fail(errno.ENOTDIR)
        if inode != ROOT:
            _, partition = self._resolve(inode)
            if partition is not None:
                fail(errno.ENOTDIR)
        return inode

    @translate
    async def readdir(self, fh, start_id, token):
        # Cookies are stable under concurrent changes: a topic's inode number, a partition's number + 1.
        if fh == self.control.staging_ino:  # (a staged file's inode number)
            entries = sorted((self.control.staged_inode(n), n) for n in self.manager.transactions.staging.names())
            for ino, name in entries:
                if ino <= start_id:
                    continue
                try:
                    attrs = self.control.attrs(ino)
                except LogfsError:
                    continue  # removed meanwhile
                if not pyfuse3.readdir_reply(token, name.encode(), attrs, ino):
                    return
            return
        if fh == ROOT:
            # The listing is sorted once, when it starts: each later call of the same listing resumes in it by
            # bisection (a listing of T topics costs O(T log T), not that per call). A topic created meanwhile
            # may be missed, as POSIX allows; one deleted meanwhile is skipped.
            if start_id == 0 or self._root_listing is None:
                self._root_listing = sorted((self.inodes.topic(t), t) for t in self.manager.list_topics())
            entries = self._root_listing
            for ino, topic in entries[bisect.bisect_right(entries, (start_id, "\U0010ffff")):]:
                if topic not in self.manager.topics:
                    continue
                if not pyfuse3.readdir_reply(token, topic.encode(), self._attrs(ino), ino):
                    return
            return
        topic, _ = self._resolve(fh)
        partitions = self.manager.partitions(topic)  # ascending: a later call of the listing resumes by bisection
        for partition in partitions[bisect.bisect_left(partitions, start_id):]:
            attrs = await self._name_attrs(topic, partition)
            if not pyfuse3.readdir_reply(token, str(partition).encode(), attrs, partition + 1):
                return

    async def releasedir(self, fh):
        return None

    @translate
    async def mkdir(self, parent_inode, name, mode, ctx):
        if self.read_only:
            fail(errno.EROFS)
        text = decode_name(name)
        if self.control.is_control(parent_inode):
            fail(errno.EPERM)  # the staging directory holds plain files only
        if parent_inode != ROOT:
            self._resolve(parent_inode)
            fail(errno.EINVAL)  # topics hold only partition files
        cluster = self.manager.cluster
        await self.run_blocking(cluster.create_topic if cluster is not None else self.manager.create_topic, text)
        return self._attrs(self.inodes.topic(text))

    @translate
    async def rmdir(self, parent_inode, name, ctx):
        if self.read_only:
            fail(errno.EROFS)
        text = decode_name(name)
        if parent_inode != ROOT:
            fail(errno.ENOTDIR)
        if text == MOUNT_STAGING:
            fail(errno.EPERM)
        if text not in self.manager.topics:
            fail(errno.ENOENT)
        cluster = self.manager.cluster
        await self.run_blocking(cluster.delete_topic if cluster is not None else self.manager.delete_topic, text)
        self.inodes.forget_topic(text)

    @translate
    async def unlink(self, parent_inode, name, ctx):
        if self.read_only:
            fail(errno.EROFS)
        text = decode_name(name)
        if parent_inode == self.control.staging_ino:
            await self.run_blocking(self.manager.transactions.staging.unlink, text)
            self.control.forget_staged(text)
            return
        if self.control.is_control(parent_inode):
            fail(errno.ENOTDIR)
        if parent_inode == ROOT:
            if text == MOUNT_COMMIT:
                fail(errno.EPERM)
            fail(errno.EISDIR if text in self.manager.topics else errno.ENOENT)
        topic, partition = self._resolve(parent_inode)
        number = parse_partition_number(text)
        if number is None or (topic, number) not in self.manager.logs:
            fail(errno.ENOENT)
        cluster = self.manager.cluster
        if cluster is not None:
            # (hidden on this mount: Kafka deletes topics, not partitions)
            await self.run_blocking(cluster.unlink_partition, topic, number)
        else:
            await self.run_blocking(self.manager.delete_partition, topic, number)
        self.inodes.forget_partition(topic, number)

    # -- refused operations ----------------------------------------------------------------------------
    @translate
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        fail(errno.EPERM)

    @translate
    async def link(self, inode, new_parent_inode, new_name, ctx):
        fail(errno.EPERM)

    @translate
    async def symlink(self, parent_inode, name, target, ctx):
        fail(errno.EPERM)

    @translate
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        fail(errno.EPERM)

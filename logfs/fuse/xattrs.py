"""Extended attributes of partitions and topics (the offsets, the topic settings).

Parametrised names (``position.<offset>``, ``offset.<position>``, ``time.<epoch_ms>``) answer through the
sparse indexes in O(log n) plus one bounded scan; one that needs the object store or a decompression
(:func:`in_memory` says so beforehand) is answered in a worker thread. Unknown names answer ENODATA at once: the
kernel asks for ``security.capability`` before every write.
"""

from __future__ import annotations

import errno
import os

from ..storage import TOPIC_SETTINGS
from ..storage.local.log import Log
from ..storage.manager import LogManager
from ..storage.tiered.manager import tier_stats
from ..view.text import LiveViews, SegmentView, live_view, log_positions, measure_start, open_view
from ..storage.errors import StorageIOError
from .control import SINK_PROTOCOL, SINK_PROTOCOL_XATTR
from .errors import disk_failed, fail, translate
from .inodes import ROOT

PREFIX = "user.logfs."
_TIER_NAMES = ("local_log_start_offset", "remote_log_end_offset", "remote_segment_count", "remote_size_bytes")
PARTITION_FIXED = ["log_start_offset", "log_end_offset", "recovery_point", "segment_count", "size_bytes",
                   *_TIER_NAMES]  # (what listxattr lists: CONTRACT section 4)
# Read by name only, not listed: the log directory holding the partition, and where a move under way takes it.
PARTITION_UNLISTED = ["log_dir", "future_log_dir"]
CONFIG_PREFIX = "config."


def _number(text: str) -> int:
    # ASCII digits only: str.isdigit() also accepts "²" or "١", which int() then rejects (or reads as digits).
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        fail(errno.ENODATA)
    return int(text)


def partition_get_pinned(log: Log, name: str) -> bytes:
    """:func:`partition_get` over a view of its own (a worker thread fetching tiered data: the live view is the
    request thread's)."""
    view = open_view(log)
    try:
        return partition_get(log, name, view)
    finally:
        view.release()


def partition_get(log: Log, name: str, view: SegmentView | None = None, *, own_view: bool = False,
                  views: LiveViews | None = None) -> bytes:
    """The value of ``name``; with ``own_view``, ``view`` is an open descriptor's (pinned, extended to the log's
    end) and the names of positions answer in it (:data:`VIEW_NAMES`). Without ``view``, lookups answer in the
    live view: the mount's (``views``), or one made now."""
    if not name.startswith(PREFIX):
        fail(errno.ENODATA)
    key = name[len(PREFIX):]
    if key == "log_start_offset":
        value = view.start_offset if own_view else log.log_start_offset
    elif key == "log_end_offset":
        value = log.log_end_offset
    elif key == "recovery_point":
        value = log.recovery_point
    elif key == "segment_count":
        value = len(log.segments)
    elif key == "size_bytes":
        value = log.size_bytes
    elif key == "log_dir":  # the log directory holding it (section 12)
        return os.path.dirname(log.directory).encode()
    elif key in _TIER_NAMES:
        value = tier_stats(log)[key]
    elif key.startswith("position."):
        target = _number(key[9:])
        value = _lookup(log, view, views, lambda v: v.position_of(target))
    elif key.startswith("offset."):
        target = _number(key[7:])
        value = _lookup(log, view, views, lambda v: v.offset_at(target))
    elif key.startswith("time."):
        ts = _number(key[5:])
        if own_view:
            value = view.offset_for_timestamp(ts)
        else:
            found = log.offset_for_timestamp(ts)
            value = log.log_end_offset if found is None else found
    else:
        value = None
    if value is None:
        fail(errno.ENODATA)
    return str(value).encode()


def in_memory(log: Log, name: str, view: SegmentView | None = None, views: LiveViews | None = None) -> bool:
    """Whether :func:`partition_get` of ``name`` (in ``view``, else in the live view of ``views``, or one made now:
    as :func:`partition_get`) needs neither the store nor a
    decompression (``SegmentView.lookup_in_memory``); the live view's start must be measured
    (``view.text.start_measured``). Only the lookups of parametrised names can need either."""
    key = name[len(PREFIX):] if name.startswith(PREFIX) else ""
    if not key.startswith(PARTITION_PARAMETRISED):
        return True
    kind, _, number = key.partition(".")
    if not (number.isascii() and number.isdigit()) or len(number) > 19:
        return True  # (ENODATA)
    with log.lock:  # (the live view's segments are read under the log's lock)
        target = int(number)
        view = view if view is not None else views.get(log) if views is not None else live_view(log)
        if kind == "position":
            return view.lookup_in_memory(offset=target)
        if kind == "offset":
            return view.lookup_in_memory(position=target)
        return view.lookup_in_memory(timestamp=target)


def _lookup(log: Log, view: SegmentView | None, views: LiveViews | None, lookup):
    """``lookup(view)`` through ``view`` (pinned), or through the live view (of ``views``, or made now) under the
    log's lock: its segments are not pinned, and a segment is read only under its log's lock or a pin
    (storage/local/open_files.py)."""
    if view is not None:
        return lookup(view)
    with log.lock:
        return lookup(views.get(log) if views is not None else live_view(log))


PARTITION_PARAMETRISED = ("position.", "offset.", "time.")
# The names that answer in an open descriptor's own view (fgetxattr; CONTRACT section 4, "Positions belong to a
# view"): everything that relates offsets to positions of the file the descriptor reads.
VIEW_NAMES = tuple(PREFIX + n for n in ("log_start_offset", *PARTITION_PARAMETRISED))


WRITABLE_LOG_START = PREFIX + "log_start_offset"  # setfattr on a partition: DeleteRecords
WRITABLE_LOG_DIR = PREFIX + "log_dir"  # setfattr on a partition: a move to another log directory
FUTURE_LOG_DIR = PREFIX + "future_log_dir"  # while a move is under way: where it goes


def delete_records(manager: LogManager, topic: str, partition: int, value: bytes) -> None:
    """``setfattr -n user.logfs.log_start_offset -v N``: Kafka's DeleteRecords (N, or -1 for the log end offset).
    Anything but an ASCII decimal is EINVAL, as is N past the log end offset."""
    text = value.decode("ascii", "replace").strip()
    if text != "-1" and (not (text.isascii() and text.isdigit()) or len(text) > 19):
        fail(errno.EINVAL)
    manager.delete_records(topic, partition, int(text))
    measure_start(manager.get_log(topic, partition))  # (a start inside a batch: measured here, in this worker)


def move(manager: LogManager, topic: str, partition: int, value: bytes) -> None:
    """``setfattr -n user.logfs.log_dir -v DIR``: move the partition to the log directory DIR (one of the mount's,
    as given or as its absolute path; EINVAL for any other; EBUSY while it is moving). Returns once the move has
    started: ``user.logfs.future_log_dir`` names DIR until it ends, and ``user.logfs.log_dir`` then does."""
    try:
        target = value.decode("utf-8").strip()
    except UnicodeDecodeError:
        fail(errno.EINVAL)
    if not target:
        fail(errno.EINVAL)
    manager.start_move(topic, partition, target)


def partition_set_error(name: str) -> int:
    """errno for setting/removing ``name`` on a partition file: its own (read-only) names are EPERM, any other
    ``user.logfs.`` name is an unknown key (EINVAL), other namespaces are not supported. (``log_start_offset``
    is writable: :func:`delete_records`; removing it is EPERM.)"""
    if not name.startswith(PREFIX):
        return errno.ENOTSUP
    key = name[len(PREFIX):]
    if key in PARTITION_FIXED or key in PARTITION_UNLISTED or key.startswith(PARTITION_PARAMETRISED):
        return errno.EPERM
    return errno.EINVAL


def partition_list() -> list[bytes]:
    return [(PREFIX + k).encode() for k in PARTITION_FIXED]


def topic_get(manager: LogManager, topic: str, name: str) -> bytes:
    if not name.startswith(PREFIX):
        fail(errno.ENODATA)
    key = name[len(PREFIX):]
    if key == "partitions":
        return str(manager.partition_count(topic)).encode()
    if key.startswith(CONFIG_PREFIX) and key[len(CONFIG_PREFIX):] in TOPIC_SETTINGS:
        setting = key[len(CONFIG_PREFIX):]
        overrides = manager.topic_overrides(topic)
        value = overrides.get(setting, manager.broker.topic_defaults.get(setting))
        return b"" if value is None else str(value).encode()  # unset logfs.* settings read as empty
    fail(errno.ENODATA)


def topic_set(manager: LogManager, topic: str, name: str, value: bytes | None) -> None:
    """Set (``value``) or remove (None) a config override. Unknown config keys and bad values are EINVAL;
    other names are not writable."""
    if not name.startswith(PREFIX + CONFIG_PREFIX):
        if value is None:
            fail(errno.ENODATA)
        if not name.startswith(PREFIX):
            fail(errno.ENOTSUP)
        # user.logfs.partitions is read-only; any other user.logfs. name is an unknown key.
        fail(errno.EPERM if name == PREFIX + "partitions" else errno.EINVAL)
    setting = name[len(PREFIX + CONFIG_PREFIX):]
    if value is None:
        manager.set_topic_config(topic, setting, None)
        return
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        fail(errno.EINVAL)
    manager.set_topic_config(topic, setting, text)


def topic_list() -> list[bytes]:
    names = [PREFIX + "partitions"] + [PREFIX + CONFIG_PREFIX + k for k in TOPIC_SETTINGS]
    return [n.encode() for n in names]


# -- a Kafka cluster mount (storage/cluster, CONTRACT section 15 "Administration"): a topic's config names are its
# config on the cluster (every name DescribeConfigs gives, Kafka's own), set and removed through
# IncrementalAlterConfigs; the cluster judges names and values (its INVALID_CONFIG is EINVAL, as a local mount answers
# an unknown name or a bad value). The ``logfs.*`` settings (how this mount shows lines) are no topic config of the
# cluster's: they read as on a local mount and are not set through a cluster mount. Each call runs in a worker thread.

def _cluster_config_name(name: str) -> bool:
    """Whether ``name`` is a topic config name the cluster answers (not one of logfs's own settings)."""
    return name.startswith(PREFIX + CONFIG_PREFIX) and not name.startswith(PREFIX + CONFIG_PREFIX + "logfs.")


_UNSET = object()


def cluster_topic_get(cluster, topic: str, name: str) -> bytes:
    value = cluster.topic_configs(topic).get(name[len(PREFIX + CONFIG_PREFIX):], _UNSET)
    if value is _UNSET:
        fail(errno.ENODATA)
    return b"" if value is None else value.encode()


def cluster_topic_list(cluster, topic: str) -> list[bytes]:
    names = [PREFIX + "partitions"] + [PREFIX + CONFIG_PREFIX + k for k in sorted(cluster.topic_configs(topic))]
    return [n.encode() for n in names]


def cluster_topic_set(cluster, topic: str, name: str, value: bytes | None) -> None:
    """Set (``value``) or remove (None) the topic's config ``name`` on the cluster; the refusals of the other names
    are a local mount's (:func:`topic_set`)."""
    if not _cluster_config_name(name):
        if name.startswith(PREFIX + CONFIG_PREFIX):
            fail(errno.EOPNOTSUPP)  # (logfs.*: this mount's view settings, not the cluster's)
        if value is None:
            fail(errno.ENODATA)
        if not name.startswith(PREFIX):
            fail(errno.ENOTSUP)
        fail(errno.EPERM if name == PREFIX + "partitions" else errno.EINVAL)
    setting = name[len(PREFIX + CONFIG_PREFIX):]
    text = None
    if value is not None:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            fail(errno.EINVAL)
    cluster.alter_topic_config(topic, setting, text)


def cluster_delete_records(manager: LogManager, topic: str, partition: int, value: bytes) -> None:
    """``setfattr -n user.logfs.log_start_offset -v N`` on a cluster mount: DeleteRecords on the cluster (the value
    parsed as on a local mount: an ASCII decimal or -1, else EINVAL), then the file starts there."""
    text = value.decode("ascii", "replace").strip()
    if text != "-1" and (not (text.isascii() and text.isdigit()) or len(text) > 19):
        fail(errno.EINVAL)
    manager.cluster.delete_records(topic, partition, int(text))
    measure_start(manager.get_log(topic, partition))


class Xattrs:
    """The extended attributes of the mount's entries, for :class:`~logfs.fuse.operations.Operations` (its handlers
    of the same names call these): the names and values are the functions above; a lookup that needs the store or
    a decompression runs in a worker thread (``handles``: one at a time per handle with its reads). ``resolve``
    is the mount's inode -> (topic, partition or None); ``measured`` measures a log start inside a tiered batch
    first (in a worker thread)."""

    def __init__(self, manager: LogManager, inodes, handles, control, live_views: LiveViews, *, resolve, measured,
                 read_only: bool, run_blocking):
        self.manager, self.inodes, self.handles, self.control = manager, inodes, handles, control
        self.live_views, self._resolve, self._measured = live_views, resolve, measured
        self.read_only, self.run_blocking = read_only, run_blocking

    @translate
    async def getxattr(self, inode, name, ctx):
        text = name.decode("utf-8", "replace")
        if inode == ROOT and text == SINK_PROTOCOL_XATTR:
            return SINK_PROTOCOL  # how the sink recognises a logfs mount
        if inode == ROOT or self.control.is_control(inode) or not text.startswith(PREFIX):
            fail(errno.ENODATA)
        topic, partition = self._resolve(inode)
        if partition is None:
            if self.manager.cluster is not None and _cluster_config_name(text):
                return await self.run_blocking(cluster_topic_get, self.manager.cluster, topic, text)
            return topic_get(self.manager, topic, text)
        if text == FUTURE_LOG_DIR:  # the directory a move under way goes to (not listed: only while moving)
            target = self.manager.moving.get((topic, partition))
            if target is None:
                fail(errno.ENODATA)
            return target.encode()
        plog = self.manager.logs[(topic, partition)]
        plog.log_dir.check()
        await self._measured(plog)  # (the live view's start)
        if text.startswith(VIEW_NAMES):
            handle = self.handle_for(inode, ctx)
            if handle is not None:
                if handle.fh in self.handles.fetching:
                    # Its view is a worker's, which a stalled store can hold for seconds: the live view answers
                    # instead if it has the same positions (checked and asked under the log's lock, which
                    # DeleteRecords, retention and the cleaner's swaps take to change them).
                    with plog.lock:
                        if handle.positions == log_positions(plog) and in_memory(plog, text, None, self.live_views):
                            return partition_get(plog, text, views=self.live_views)
                return await self._view_xattr(handle, text)
        try:
            if in_memory(plog, text, None, self.live_views):
                return partition_get(plog, text, views=self.live_views)
            async with self.handles.slots:
                return await self.run_blocking(partition_get_pinned, plog, text)
        except (OSError, StorageIOError) as exc:
            disk_failed(plog, exc, f"getxattr {text}")

    def handle_for(self, inode: int, ctx):
        """A readable handle open on ``inode`` (all have the same positions: fuse/inodes.py), the asking process's
        own if it has one; None if there is none: the path's xattrs answer in the view a new open gets."""
        readers = [h for h in self.inodes.handles(inode) if h.readable]
        if not readers:
            return None
        pid = getattr(ctx, "pid", None)
        # (one a worker thread is not reading through, if any)
        free = [h for h in readers if h.fh not in self.handles.fetching] or readers
        return next((h for h in free if h.pid == pid), free[0])

    async def _view_xattr(self, handle, text: str) -> bytes:
        """``text`` answered in ``handle``'s view: inline, or in a worker thread when it needs tiered data or a
        decompression, one at a time with the handle's reads (its view is not thread-safe)."""
        plog = handle.log

        def lookup() -> bytes:
            handle.length()  # (the view takes the segments rolled since: an offset appended since has a position)
            return partition_get(plog, text, handle.view, own_view=True)

        try:
            if handle.fh not in self.handles.fetching and in_memory(plog, text, handle.view):
                return lookup()
            # (and while a read of the handle runs in a worker thread, after it: the view is that thread's)
            return await self.handles.in_worker(handle.fh, lookup)
        except (OSError, StorageIOError) as exc:
            disk_failed(plog, exc, f"getxattr {text}")

    @translate
    async def listxattr(self, inode, ctx):
        if inode == ROOT:
            return [SINK_PROTOCOL_XATTR.encode()]
        if self.control.is_control(inode):
            return []
        topic, partition = self._resolve(inode)
        if partition is None and self.manager.cluster is not None:
            return await self.run_blocking(cluster_topic_list, self.manager.cluster, topic)
        return topic_list() if partition is None else partition_list()

    @translate
    async def setxattr(self, inode, name, value, ctx):
        text = name.decode("utf-8", "replace")
        if inode == ROOT or self.control.is_control(inode):
            fail(errno.ENOTSUP)
        topic, partition = self._resolve(inode)
        if partition is not None:
            if text not in (WRITABLE_LOG_START, WRITABLE_LOG_DIR):
                fail(partition_set_error(text))
            if self.read_only:
                fail(errno.EROFS)
            cluster = self.manager.cluster
            if cluster is not None:
                if text != WRITABLE_LOG_START:
                    fail(errno.EOPNOTSUPP)  # (the cluster places its replicas: AlterReplicaLogDirs is Kafka's tool's)
                await self.run_blocking(cluster_delete_records, self.manager, topic, partition, value)
                return
            await self.run_blocking(delete_records if text == WRITABLE_LOG_START else move, self.manager, topic,
                                    partition, value)
            return
        if self.read_only:
            fail(errno.EROFS)
        if self.manager.cluster is not None:
            await self.run_blocking(cluster_topic_set, self.manager.cluster, topic, text, value)
            return
        await self.run_blocking(topic_set, self.manager, topic, text, value)

    @translate
    async def removexattr(self, inode, name, ctx):
        text = name.decode("utf-8", "replace")
        if inode == ROOT or self.control.is_control(inode):
            fail(errno.ENODATA)
        topic, partition = self._resolve(inode)
        if partition is not None:
            fail(errno.EPERM if partition_set_error(text) == errno.EPERM else errno.ENODATA)
        if self.read_only:
            fail(errno.EROFS)
        if self.manager.cluster is not None:
            await self.run_blocking(cluster_topic_set, self.manager.cluster, topic, text, None)
            return
        await self.run_blocking(topic_set, self.manager, topic, text, None)

"""Checks of a mount's two paths, before anything is mounted.

Owns the refusals that would otherwise hang or hide: DATA_DIR and MOUNTPOINT the same directory, one inside the
other (the daemon would then reach its own files through its own mount and deadlock in the kernel), and a
MOUNTPOINT that is already a FUSE mount (a second mount would silently stack over the first). Paths are compared
after resolving symlinks.
"""

from __future__ import annotations

import os
import re

MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table(mountinfo: str = MOUNTINFO) -> list[tuple[str, str]]:
    """Every mount as (mount point, filesystem type), in mountinfo's order (a later mount on the same point stacks
    over an earlier one); empty when mountinfo cannot be read. Never a stat, which could hang on a dead FUSE
    connection."""
    table = []
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                head, sep, tail = line.partition(" - ")
                fields = head.split()
                if sep and len(fields) >= 5:
                    table.append((_unescape(fields[4]), tail.split(" ", 1)[0]))
    except OSError:
        return []
    return table


def fuse_mount_type(path: str, mountinfo: str = MOUNTINFO) -> str | None:
    """The filesystem type (``fuse.logfs``, ``fuse.sshfs``, ``fuse``...) of the topmost FUSE mount on exactly
    ``path``, or None when ``path`` is not a FUSE mount point (or mountinfo cannot be read)."""
    found = None
    for point, fstype in mount_table(mountinfo):
        if point == path:
            found = fstype if fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk")) else None
    return found


def _inside(path: str, directory: str) -> bool:
    return path != directory and os.path.commonpath([path, directory]) == directory


def check_metrics_file(path: str, data_dir: str, mountpoint: str) -> str | None:
    """Why ``logfs.metrics.file`` cannot be used (one line), or None: its directory must exist and be writable
    (the file is replaced by a rename from a temporary file beside it), and it must not be inside the mount (the
    daemon would write through itself) or the data directory."""
    real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    for directory, what in ((os.path.realpath(mountpoint), "the mount point"),
                            (os.path.realpath(data_dir), "the data directory")):
        if real == directory or _inside(real, directory):
            return f"logfs.metrics.file {path} is inside {what} {directory}"
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        return f"logfs.metrics.file {path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"logfs.metrics.file {path}: directory {parent} is not writable"
    if os.path.isdir(real):
        return f"logfs.metrics.file {path} is a directory"
    return None


def check_mount_paths(data_dir: str, mountpoint: str, mountinfo: str = MOUNTINFO) -> str | None:
    """Why mounting ``data_dir`` on ``mountpoint`` must be refused (one line), or None when it may go ahead."""
    data, mnt = os.path.realpath(data_dir), os.path.realpath(mountpoint)
    if data == mnt:
        return f"the data directory and the mount point are the same directory ({data})"
    if _inside(mnt, data):
        return f"the mount point {mnt} is inside the data directory {data}"
    if _inside(data, mnt):
        return f"the data directory {data} is inside the mount point {mnt}"
    fstype = fuse_mount_type(mnt, mountinfo)
    if fstype is not None:
        what = "a logfs mount" if fstype == "fuse.logfs" else f"a FUSE mount ({fstype})"
        return f"{mnt} is already {what}; unmount it first (fusermount3 -u {mnt})"
    return None

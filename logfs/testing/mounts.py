"""Mounts and the processes behind them, for the tests and the benchmarks: the one "is it mounted" check (the
product's reading of /proc/self/mountinfo, ``logfs.service.mountpoint.mount_table``: never a stat, which could hang
on a dead FUSE connection), the one way to take a FUSE mount down, the one command line of a logfs mount, and the
one finder of the daemon serving a data directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import logfs
from logfs.service.mountpoint import mount_table

# The checkout whose logfs this process imports: a daemon, a Spark worker or a helper process started from here
# gets it on PYTHONPATH, so that it runs the same code (a shared venv's editable install may point elsewhere).
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(logfs.__file__)))


def code_env(**extra: str) -> dict[str, str]:
    """This process's environment with CODE_ROOT first on PYTHONPATH, and ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = CODE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def mount_fstype(path: str | os.PathLike) -> str | None:
    """The filesystem type of the topmost mount on exactly ``path`` (``fuse.logfs``, ``tmpfs``...), or None."""
    target = os.path.abspath(path)
    found = None
    for point, fstype in mount_table():
        if point == target:
            found = fstype
    return found


def mounted_at(path: str | os.PathLike) -> bool:
    """Whether something is mounted exactly at ``path``."""
    return mount_fstype(path) is not None


def mountpoints_under(root: str | os.PathLike) -> list[str]:
    """Mount points at or below ``root``, deepest first."""
    root = os.path.abspath(root)
    found = {point for point, _ in mount_table() if point == root or point.startswith(root + "/")}
    return sorted(found, key=len, reverse=True)


def unmount_fuse(mountpoint: str | os.PathLike, lazy_fallback: bool = True) -> bool:
    """``fusermount3 -u``, then (if that failed, the mount busy or its daemon dead, and ``lazy_fallback``)
    ``fusermount3 -uz``. True if the plain unmount succeeded; nothing is done when nothing is mounted."""
    if not mounted_at(mountpoint):
        return True
    plain = subprocess.run(["fusermount3", "-u", os.fspath(mountpoint)], capture_output=True, timeout=30)
    if plain.returncode != 0 and lazy_fallback:
        subprocess.run(["fusermount3", "-uz", os.fspath(mountpoint)], capture_output=True, timeout=30)
    return plain.returncode == 0


def logfs_command(source: str | os.PathLike, mountpoint: str | os.PathLike, options=(),
                  foreground: bool = False, python: str = sys.executable) -> list[str]:
    """The command line a user types to mount ``source`` (a data directory, ``DIR1,DIR2`` or ``s3://...``) on
    ``mountpoint`` with ``-o options``."""
    cmd = [python, "-m", "logfs.cli", os.fspath(source), os.fspath(mountpoint)]
    if foreground:
        cmd.append("-f")
    if options:
        cmd += ["-o", ",".join(options)]
    return cmd


def wait_for(predicate, timeout: float = 60.0, what: str = "condition", interval: float = 0.02):
    """``predicate()``'s first true value, polled every ``interval`` seconds; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has closed its files and released DATA_DIR's lock; a detached
    daemon's parent is init, which may take a second and more to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def processes():
    """(pid, command-line arguments as bytes) of every process but this one whose command line can be read."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        yield int(name), args


def children(pid: int) -> list[int]:
    """The live (not zombie) children of ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            out.append(int(name))
    return out


def daemon_pids(data_dir: str | os.PathLike, mountpoint: str | os.PathLike | None = None) -> list[int]:
    """PIDs of live processes whose command line names ``data_dir`` as one argument and mentions logfs
    (the daemon, however it was started: python -m logfs.cli, the logfs script, mount.fuse3). A source that is not
    a path (``s3://...``) is matched as given; ``mountpoint``, if given, must be named too."""
    source = os.fspath(data_dir)
    target = os.fsencode(source if "://" in source else os.path.abspath(source))
    mnt = os.fsencode(os.path.abspath(mountpoint)) if mountpoint is not None else None
    pids = []
    for pid, args in processes():
        if b"logfs" not in b" ".join(args):
            continue
        if mnt is not None and mnt not in args:
            continue
        if any(a == target or a.endswith(b"#" + target) for a in args) and alive(pid):
            pids.append(pid)
    return sorted(pids)


def daemon_pid(data: str | os.PathLike) -> int | None:
    """The daemon serving ``data`` (a data directory, ``DIR1,DIR2`` or ``s3://...``), or None."""
    pids = daemon_pids(data)
    return pids[0] if pids else None

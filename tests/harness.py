"""The test harness: the one mount of a real logfs for every suite, and the pytest plugin around it (loaded by
tests/conftest.py; every suite imports its helpers by name: ``from harness import ...``).

A mounted test mounts a real logfs in its own tmp directory the way a user would (``python -m logfs.cli DATA MNT
[-o ...]``) through the ``mount_logfs`` fixture (or ``mount``, one default mount), drives it with real syscalls and
shell tools, and always unmounts in teardown (``fusermount3 -u``, falling back to ``fusermount3 -uz``, then
waiting for the daemon to exit). The plugin marks every test that mounts (``mount``; skipped where FUSE is
unusable), and fails a test whose daemon logged an ERROR, a CRITICAL or a traceback that the test did not declare
with ``@pytest.mark.daemon_errors(pattern, ...)`` (regular expressions; as S3QL fails a run on unexpected warnings).
The daemon's log is read from its stderr, kept for foreground mounts (``foreground=True``); a daemon-mode mount
sends its stderr to /dev/null as the command does for users, so it is not checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


from logfs.testing.mounts import (CODE_ROOT, alive, code_env as daemon_env, daemon_pids,  # noqa: F401
                                  logfs_command, mount_fstype, mounted_at, unmount_fuse, wait_for)

VENV_BIN = os.path.dirname(sys.executable)
LOGFS_SCRIPT = os.path.join(VENV_BIN, "logfs")
MOUNT_TIMEOUT = 30.0
EXIT_TIMEOUT = 20.0


def fuse_unusable_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed"
    return None


def deleted_files_held(pid: int) -> dict[str, str]:
    """The files process ``pid`` holds open that were unlinked: descriptor number -> the file's path (without
    the kernel's " (deleted)")."""
    held = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # (closed meanwhile)
            continue
        if target.endswith(" (deleted)"):
            held[name] = target[: -len(" (deleted)")]
    return held


class MountError(Exception):
    """A mount that did not come up: the command failed, or the foreground daemon exited or never answered."""


class LogfsMount:
    """One data directory + mountpoint, and the daemon serving it."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.source: str | None = None  # the log directories as given (DIR1,DIR2,...), when not just ``data``
        self.mnt = root / "mnt"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.options: list[str] = []
        self.wrapper: list[str] = []  # a command the daemon runs under (e.g. prlimit --nofile=N:N --)
        self.proc: subprocess.Popen | None = None  # foreground daemon, if started with -f
        self.stderr_path = root / "daemon.stderr"

    # -- paths -------------------------------------------------------------------------------------
    def path(self, *parts: str | int) -> str:
        return os.path.join(self.mnt, *(str(p) for p in parts))

    # -- lifecycle ---------------------------------------------------------------------------------
    def command(self, *options: str, foreground: bool = False) -> list[str]:
        return self.wrapper + logfs_command(self.source or self.data, self.mnt, options, foreground)

    def mount(self, *options: str, foreground: bool = False) -> None:
        """Mount with ``-o options``: in daemon mode (the command returns once the mount is usable) or in
        the foreground under a Popen we own (then wait for the mount to answer)."""
        assert not mounted_at(self.mnt), f"{self.mnt} is already mounted"
        self.options = list(options)
        if foreground:
            err = open(self.stderr_path, "ab")
            self.proc = subprocess.Popen(self.command(*options, foreground=True), stdin=subprocess.DEVNULL,
                                         stdout=err, stderr=err, env=daemon_env())
            err.close()

            def ready():
                if self.proc.poll() is not None:
                    raise MountError(f"daemon exited with {self.proc.returncode}: {self.stderr()}")
                return mounted_at(self.mnt) and os.stat(self.mnt).st_ino == 1

            try:
                wait_for(ready, MOUNT_TIMEOUT, what="the foreground mount")
            except TimeoutError as exc:
                raise MountError(f"{exc}: {self.stderr()}") from None
            return
        self.proc = None
        result = subprocess.run(self.command(*options), stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=MOUNT_TIMEOUT, env=daemon_env())
        if result.returncode != 0:
            raise MountError(f"mount failed ({result.returncode}): {result.stderr.decode()}")
        # The daemon-mode contract: once the command returned, the mount is usable.
        assert mounted_at(self.mnt)
        assert os.stat(self.mnt).st_ino == 1

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def pids(self) -> list[int]:
        return daemon_pids(self.source or self.data)

    def pid(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc.pid
        pids = self.pids()
        assert len(pids) == 1, f"expected one daemon for {self.data}, found {pids}"
        return pids[0]

    def wait_exit(self, pids: list[int], timeout: float = EXIT_TIMEOUT) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        wait_for(lambda: not any(alive(p) for p in pids), timeout, what=f"daemon {pids} to exit")

    def unmount(self, lazy_fallback: bool = True) -> None:
        """``fusermount3 -u`` (``-uz`` if busy or dead), then wait until the daemon has exited."""
        pids = self.pids()
        if self.proc is not None and self.proc.poll() is None:
            pids = sorted(set(pids) | {self.proc.pid})
        assert unmount_fuse(self.mnt, lazy_fallback) or lazy_fallback, f"fusermount3 -u {self.mnt} failed"
        self.wait_exit(pids)
        assert not mounted_at(self.mnt)

    def remount(self, *options: str, foreground: bool = False) -> None:
        self.unmount()
        self.mount(*(options or self.options), foreground=foreground)

    def kill9(self) -> None:
        """SIGKILL the daemon (no clean shutdown at all), then detach the dead mount with ``-uz``."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        self.wait_exit([pid])
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=30)
        wait_for(lambda: not mounted_at(self.mnt), 10, what="the lazy unmount")

    def cleanup(self) -> None:
        pids = self.pids()
        if self.proc is not None and self.proc.poll() is None:
            pids.append(self.proc.pid)
        unmount_fuse(self.mnt)
        try:
            self.wait_exit(pids, timeout=EXIT_TIMEOUT)
        except TimeoutError:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if mounted_at(self.mnt):
                subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=30)
            raise
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)

    # -- conveniences ------------------------------------------------------------------------------
    def getx(self, rel: str, name: str) -> str:
        """An xattr of ``MNT/rel`` (``user.logfs.`` is prepended when missing), as text."""
        if not name.startswith("user."):
            name = "user.logfs." + name
        return os.getxattr(self.path(rel), name).decode()

    def read(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def append(self, rel: str, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        fd = os.open(self.path(rel), os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)


# What in a daemon's log fails a test that did not expect it: the level of logsetup's line format, or a traceback.
UNEXPECTED = re.compile(r" (ERROR|CRITICAL) |^Traceback \(most recent call last\)")


def unexpected_daemon_errors(log: str, expected=()) -> list[str]:
    """The lines of a daemon's ``log`` that are an ERROR, a CRITICAL or a traceback matching none of the
    ``expected`` regular expressions."""
    return [line for line in log.splitlines()
            if UNEXPECTED.search(line) and not any(re.search(p, line) for p in expected)]


@contextlib.contextmanager
def mount_factory(base: Path, expected_errors=()):
    """The ``mount_logfs`` fixture's factory: ``make(*options, foreground=False, name="fs", root=None,
    prepare=None)`` -> a mounted LogfsMount under ``root or base``; ``prepare(m)`` runs before mounting. On exit
    every mount made is unmounted and its daemon reaped (all of them, then the first error is raised); then a
    daemon that logged an ERROR, CRITICAL or traceback matching none of ``expected_errors`` fails the test."""
    made: list[LogfsMount] = []

    def make(*options: str, foreground: bool = False, name: str = "fs", root: Path | None = None,
             prepare=None) -> LogfsMount:
        m = LogfsMount((root or base) / name)
        made.append(m)
        if prepare is not None:
            prepare(m)
        m.mount(*options, foreground=foreground)
        return m

    try:
        yield make
    finally:
        errors = []
        for m in made:
            try:
                m.cleanup()
            except Exception as exc:  # keep unmounting the others
                errors.append(exc)
        if errors:
            raise errors[0]
        logged = [(m, unexpected_daemon_errors(m.stderr(), expected_errors)) for m in made]
        logged = [(m, lines) for m, lines in logged if lines]
        if logged:
            pytest.fail("the daemon logged what this test did not expect (declare it with "
                        "@pytest.mark.daemon_errors(pattern) if it should):\n"
                        + "\n".join(f"{m.data}: {line}" for m, lines in logged for line in lines[:20]),
                        pytrace=False)


class FollowerMount(LogfsMount):
    """A follower mount: the source is ``s3://BUCKET/PREFIX``, the cache a directory of its own."""

    def __init__(self, root: Path, source: str):
        super().__init__(root)
        self.source = source
        self.cache = root / "cache"

    def command(self, *options: str, foreground: bool = False) -> list[str]:
        return logfs_command(self.source, self.mnt, (f"logfs.remote.cache.dir={self.cache}",) + options, foreground)

    def pids(self) -> list[int]:
        return daemon_pids(self.source, self.mnt)


def append_synced(path: str, lines: list[bytes]) -> None:
    """Append ``lines`` to the partition file ``path``, a ``write()`` each (each must take its whole line), then
    ``fsync``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for line in lines:
            assert os.write(fd, line + b"\n") == len(line) + 1
        os.fsync(fd)
    finally:
        os.close(fd)


def expect_errno(code: int, fn, *args, **kwargs):
    """Call ``fn`` and assert it fails with OSError ``code``."""
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    assert info.value.errno == code, (
        f"expected {errno.errorcode[code]}, got {errno.errorcode.get(info.value.errno, info.value.errno)}: "
        f"{info.value}")
    return info.value


def mkdir_refused(path: str, code: int, message: bytes) -> None:
    """mkdir(2) of ``path`` fails with ``code``, and so does mkdir(1), saying ``message``."""
    expect_errno(code, os.mkdir, path)
    r = sh(f"mkdir {shlex.quote(str(path))}", check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def sh(script: str, *, check: bool = True, env: dict | None = None, timeout: float = 60,
       input: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` with bash; with ``check``, assert exit status 0."""
    result = subprocess.run(["bash", "-c", script], capture_output=True, timeout=timeout, env=env, input=input)
    if check:
        assert result.returncode == 0, (
            f"{script!r} exited {result.returncode}: {result.stderr.decode(errors='replace')}")
    return result


# -- the pytest plugin --------------------------------------------------------------------------------------------
MOUNT_FIXTURES = {"mount_logfs", "faultfs"}
E2E = Path(__file__).resolve().parent / "e2e"


def pytest_configure(config):
    config.addinivalue_line("markers", "daemon_errors(*patterns): ERROR/CRITICAL lines or tracebacks the daemon may "
                                       "log in this test (regular expressions); any other fails it")


def items_in(items, conftest: str | os.PathLike) -> list:
    """The collected tests in the folder of ``conftest`` (a conftest's ``__file__``) or below it."""
    here = Path(conftest).parent
    return [item for item in items if here in Path(item.path).parents]


def mark_mount(item, reason: str | None) -> None:
    """Mark a test ``mount``; skip it if FUSE is unusable (``reason``, from fuse_unusable_reason())."""
    item.add_marker(pytest.mark.mount)
    if reason:
        item.add_marker(pytest.mark.skip(reason=reason))


# Tests that share something of the machine's own run in one pytest-xdist worker, one after the other (the suite
# runs in two: tools/dev.sh): the standalone Spark cluster (a session fixture: one cluster, not one per worker),
# and the `logfs` link in /usr/local/bin that mount(8) runs (one test's teardown removes it).
SHARED_BY_FIXTURE = {"spark_cluster": "spark-cluster", "cluster_driver": "spark-cluster",
                     "logfs_on_default_path": "mount-helper"}


def worker_group(item) -> str:
    """The pytest-xdist group ``item`` runs in (``--dist loadgroup``): a group of :data:`SHARED_BY_FIXTURE`, else its
    module, so that a module's fixtures are set up once, in one worker (as ``--dist loadfile`` would)."""
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in SHARED_BY_FIXTURE:
            return SHARED_BY_FIXTURE[fixture]
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # (before xdist's own hook reads the groups)
def pytest_collection_modifyitems(config, items):
    """Every test that mounts (the mounted suite, or a test using the mount fixtures) is marked ``mount``, and
    skipped where FUSE is unusable. Every test gets its pytest-xdist group (:func:`worker_group`)."""
    reason = fuse_unusable_reason()
    for item in items:
        if MOUNT_FIXTURES & set(getattr(item, "fixturenames", ())) or E2E in Path(item.path).parents:
            mark_mount(item, reason)
        if not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(worker_group(item)))


@pytest.fixture
def mount_logfs(tmp_path, request):
    """Factory: ``mount_logfs("num.partitions=3", foreground=False, name="m", root=None, prepare=None)`` -> a
    mounted LogfsMount. Every mount made through it is unmounted (and its daemon reaped) in teardown, and its log
    checked (``daemon_errors``)."""
    expected = [p for marker in request.node.iter_markers("daemon_errors") for p in marker.args]
    with mount_factory(tmp_path, expected) as make:
        yield make


@pytest.fixture
def public_root():
    """A directory every user can traverse (pytest's tmp_path is root's alone), for mounts with ``allow_other``:
    ``mount_logfs(..., root=public_root)``. Request it before ``mount_logfs``, so that the mounts in it are taken
    down before it is removed."""
    root = Path(tempfile.mkdtemp(prefix="logfs-public-", dir="/tmp"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


# /bin/sh's PATH when none is set. mount(8) is setuid and drops PATH from the environment before running
# mount.fuse3, which runs `/bin/sh -c 'logfs DATA MNT -o OPTS'`: so through mount(8) the logfs script must be
# found on this default PATH, whatever PATH the caller had.
SH_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

needs_mount_helper = pytest.mark.skipif(
    not (os.path.exists("/sbin/mount.fuse3") or os.path.exists("/usr/sbin/mount.fuse3")) or os.geteuid() != 0
    or not os.path.exists(LOGFS_SCRIPT),
    reason="needs root, mount.fuse3 and the logfs console script")


@pytest.fixture
def logfs_on_default_path():
    """Make `logfs` resolvable on /bin/sh's default PATH (a symlink in /usr/local/bin to this venv's script,
    removed afterwards) unless an installed one is already there: what mount(8) and an fstab line run."""
    if shutil.which("logfs", path=SH_DEFAULT_PATH):
        yield
        return
    link = "/usr/local/bin/logfs"
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(LOGFS_SCRIPT, link)
    try:
        yield
    finally:
        if os.path.islink(link) and os.readlink(link) == LOGFS_SCRIPT:
            os.unlink(link)


@pytest.fixture
def mount(mount_logfs) -> LogfsMount:
    """A default mount (num.partitions=1) with no topics yet."""
    return mount_logfs()

"""The ``logfs`` command: ``logfs DATA_DIR MOUNTPOINT [-f] [-o OPTS] [--config FILE]``.

Owns argument and ``-o`` parsing (FUSE options, ignored mount(8) options, Kafka broker settings), logging
set-up, daemonizing (the parent exits 0 only once the mount answers), signals, and sd_notify. A user error is
one clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import stat
import sys

from .storage import BrokerConfig, InvalidConfigError, LockedError, LogManager
from .storage.config import broker_keys
from .service.mountpoint import check_mount_paths
from .service.notify import notify

log = logging.getLogger("logfs")

# Passed to libfuse as they are.
FUSE_FLAGS = {
    "allow_other", "allow_root", "default_permissions", "ro", "rw", "auto_unmount", "nosuid", "suid", "nodev",
    "dev", "noexec", "exec", "noatime", "atime", "sync", "async", "dirsync",
}
FUSE_KEYED = {"fsname", "subtype", "max_read"}
# mount(8)/fstab options that mean nothing to FUSE.
IGNORED = {
    "defaults", "_netdev", "nofail", "auto", "noauto", "user", "users", "nouser", "owner", "group",
    "relatime", "norelatime", "strictatime", "nodiratime", "diratime", "lazytime", "nolazytime", "silent",
    "loud", "nofail", "nosymfollow", "symfollow", "iversion", "noiversion", "mand", "nomand",
}
IGNORED_PREFIXES = ("x-", "comment=", "context=", "fscontext=", "defcontext=", "rootcontext=", "helper=")


class UsageError(Exception):
    pass


def parse_properties(text: str, source: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        for sep in ("=", ":"):
            if sep in line:
                key, _, value = line.partition(sep)
                break
        else:
            raise UsageError(f"{source}:{number}: expected key=value, got {raw!r}")
        props[key.strip()] = value.strip()
    return props


def split_options(option_strings: list[str]) -> tuple[list[str], dict[str, str], bool, bool]:
    """-o values -> (FUSE options, broker settings, debug, read_only)."""
    fuse_opts: list[str] = []
    props: dict[str, str] = {}
    debug = read_only = False
    known = broker_keys()
    for group in option_strings:
        for opt in filter(None, (o.strip() for o in group.split(","))):
            key, has_value, value = opt.partition("=")
            if opt in IGNORED or opt.startswith(IGNORED_PREFIXES):
                continue
            if opt == "debug":
                debug = True
            elif opt in FUSE_FLAGS:
                if opt == "ro":
                    read_only = True
                if opt != "rw":
                    fuse_opts.append(opt)
            elif has_value and key in FUSE_KEYED:
                fuse_opts.append(opt)
            elif has_value and key in known:
                props[key] = value
            elif key in known:
                raise UsageError(f"setting {key!r} needs a value ({key}=...)")
            else:
                raise UsageError(f"unknown option {opt!r}")
    return fuse_opts, props, debug, read_only


def build_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="logfs", description="Mount a Kafka-format log store as a filesystem.")
    p.add_argument("data_dir", help="Kafka log directory (created if missing)")
    p.add_argument("mountpoint")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="FUSE options and Kafka broker settings, comma-separated")
    p.add_argument("--config", metavar="FILE", help="server.properties-style file of broker settings")
    return p


def journal_stderr() -> bool:
    """Whether stderr goes to the journal (or at least to systemd), so lines get ``<N>`` priority prefixes.

    ``JOURNAL_STREAM`` (``device:inode``) is set by systemd when stdout/stderr are connected to the journal;
    it is checked against stderr itself, since a child may inherit the variable with stderr redirected. Without
    it, ``INVOCATION_ID`` (set for every unit's processes) still means "run by systemd", e.g. a service whose
    stderr goes to syslog or kmsg, where the prefix is understood too."""
    stream = os.environ.get("JOURNAL_STREAM")
    if stream:
        try:
            device, inode = (int(x) for x in stream.split(":"))
            st = os.fstat(sys.stderr.fileno())
        except (ValueError, OSError, AttributeError):
            return False
        return (st.st_dev, st.st_ino) == (device, inode)
    return bool(os.environ.get("INVOCATION_ID"))


class _JournalFormatter(logging.Formatter):
    """``<N>logger: message``, the priority prefix on every line (journald parses it per line)."""

    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record):
        prefix = f"<{self.PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


class _UserErrorFilter(logging.Filter):
    """Drops errors marked ``extra={"user_error": True}``: in daemon mode the parent prints them."""

    def filter(self, record):
        return not getattr(record, "user_error", False)


def user_error(message: str) -> None:
    """One line for a user error (bad option, locked or unwritable directory, missing mountpoint), never a
    traceback; with a journal priority prefix under systemd."""
    prefix = "<3>" if journal_stderr() else ""
    print(f"{prefix}logfs: error: {message}", file=sys.stderr, flush=True)


def setup_logging(debug: bool, daemon: bool = False) -> logging.Handler:
    """Log records to stderr: ``<N>name: message`` under systemd (journald adds the time), otherwise
    ``time LEVEL name: message``. ``debug`` logs DEBUG from every module (the logger name says which; pyfuse3
    included). Without ``debug``, a daemonizing ``logfs`` on a terminal shows only warnings and errors before it
    detaches, and leaves startup errors to the parent's single ``logfs: error:`` line."""
    handler = logging.StreamHandler(sys.stderr)
    if journal_stderr():
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if daemon and not debug:
            handler.setLevel(logging.WARNING)
    if daemon:
        handler.addFilter(_UserErrorFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    logging.getLogger("pyfuse3").setLevel(logging.DEBUG if debug else logging.WARNING)
    return handler


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        user_error(message)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        fuse_opts, props, debug, read_only = split_options(args.options)
        if args.config:
            try:
                with open(args.config, encoding="utf-8") as f:
                    file_props = parse_properties(f.read(), args.config)
            except OSError as exc:
                raise UsageError(f"cannot read {args.config}: {exc.strerror}") from None
            unknown = set(file_props) - broker_keys()
            if unknown:
                raise UsageError(f"{args.config}: unknown setting {sorted(unknown)[0]!r}")
            props = {**file_props, **props}
        broker = BrokerConfig.from_properties(props)
    except (UsageError, InvalidConfigError) as exc:
        user_error(str(exc))
        return 2
    mountpoint = os.path.abspath(args.mountpoint)
    try:
        if not stat.S_ISDIR(os.stat(mountpoint).st_mode):
            user_error(f"mount point {args.mountpoint} is not a directory")
            return 2
    except FileNotFoundError:
        user_error(f"mount point {args.mountpoint} does not exist")
        return 2
    except OSError as exc:  # e.g. ENOTCONN: a dead FUSE mount is still attached there
        hint = ""
        if exc.errno == errno.ENOTCONN:
            hint = f" (a dead mount? detach it with fusermount3 -uz {args.mountpoint})"
        user_error(f"mount point {args.mountpoint}: {exc.strerror}{hint}")
        return 2
    data_dir = os.path.abspath(args.data_dir)
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        user_error(f"data directory {args.data_dir} is not a directory")
        return 2
    refused = check_mount_paths(data_dir, mountpoint)
    if refused:
        user_error(refused)
        return 2
    setup_logging(debug, daemon=not args.foreground)
    log.debug("broker settings %s; FUSE options %s", props, fuse_opts)
    if not any(o.startswith("fsname=") for o in fuse_opts):
        fuse_opts.append(f"fsname={os.path.abspath(args.data_dir)}")
    if not any(o.startswith("subtype=") for o in fuse_opts):
        fuse_opts.append("subtype=logfs")
    if args.foreground:
        return run(args.data_dir, mountpoint, broker, fuse_opts, read_only, ready=None)
    return daemonize(args.data_dir, mountpoint, broker, fuse_opts, read_only)


def daemonize(data_dir, mountpoint, broker, fuse_opts, read_only) -> int:
    """Fork; the child mounts and serves, the parent waits until the mount answers (or failed)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(write_fd)
        message = b""
        while True:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            message += chunk
        if message.startswith(b"OK"):
            return 0
        text = message.decode(errors="replace").strip() or "the daemon exited before the mount was ready"
        user_error(text.removeprefix("ERR "))
        _, status = os.waitpid(pid, 0)
        return 1
    os.close(read_fd)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)

    def ready(error: str | None = None):
        try:
            os.write(write_fd, b"OK\n" if error is None else f"ERR {error}\n".encode())
            os.close(write_fd)
        except OSError:
            pass
        if error is None:  # detach from the terminal's output once the mount is up
            if not journal_stderr():
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)

    code = run(data_dir, mountpoint, broker, fuse_opts, read_only, ready=ready)
    os._exit(code)


class _StopBeforeServing(BaseException):
    """A stop signal arrived while the logs were still loading."""


class StartupProgress:
    """Loading/recovery progress, as ``STATUS=`` (with ``EXTEND_TIMEOUT_USEC=``, so systemd's start timeout
    keeps being extended while recovery advances) and as log lines. After an unclean shutdown every segment from
    each partition's recovery point is re-validated, so the count is "segments recovered / total"."""

    STATUS_EVERY_S = 0.1
    LOG_EVERY_S = 2.0
    EXTEND_USEC = 60_000_000

    def __init__(self, recovering: bool, partitions: int = 0, clock=None, announce: str | None = None):
        import time

        self.clock = clock or time.monotonic
        self.recovering = recovering
        self._announce = announce if recovering else None
        self.started = self.clock()
        self.partitions = (0, partitions)
        self.segments = (0, 0)
        self._last_status = self._last_log = None

    def partition_done(self, done: int, total: int) -> None:
        self.partitions = (done, total)
        self._report(final=done == total)

    def segment_done(self, done: int, total: int) -> None:
        if (done, total) == self.segments:
            return
        self.segments = (done, total)
        self._report(final=False)

    def describe(self) -> str:
        verb = "recovering after an unclean shutdown" if self.recovering else "loading"
        (s_done, s_total), (p_done, p_total) = self.segments, self.partitions
        return f"{verb}: {s_done}/{s_total} segments, {p_done}/{p_total} partitions"

    def _report(self, final: bool) -> None:
        if self._announce is not None:
            log.info("%s was not shut down cleanly: recovering %d partitions", self._announce, self.partitions[1])
            self._announce = None
        now = self.clock()
        if final or self._last_status is None or now - self._last_status >= self.STATUS_EVERY_S:
            self._last_status = now
            notify(f"STATUS={self.describe()}\nEXTEND_TIMEOUT_USEC={self.EXTEND_USEC}")
        if final or self._last_log is None or now - self._last_log >= self.LOG_EVERY_S:
            self._last_log = now
            if final:
                verb = "recovered" if self.recovering else "loaded"
                log.info("%s %d/%d segments of %d partitions in %.1f s", verb, *self.segments,
                         self.partitions[1], now - self.started)
            elif self.recovering or now - self.started >= self.LOG_EVERY_S:
                log.info("%s", self.describe())


def run(data_dir, mountpoint, broker, fuse_opts, read_only, ready) -> int:
    import trio

    from .service.daemon import serve
    from .storage.errors import LogfsError
    from .storage.names import CLEAN_SHUTDOWN, DataDirScan

    def fail(message: str) -> int:
        log.error("%s", message, extra={"user_error": True})
        if ready:
            ready(message)
        return 1

    # A stop signal while the logs load abandons the start (nothing is changed that a restart would not redo);
    # once they are loaded, it is remembered, and serve() shuts down cleanly without mounting.
    stop = []

    def stop_while_loading(signum, _frame):
        raise _StopBeforeServing(signum)

    def stop_after_loading(signum, _frame):
        stop.append(signum)

    previous = {s: signal.signal(s, stop_while_loading) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        partitions = len(DataDirScan(data_dir).partitions)
    except OSError:  # missing (created below) or unreadable (reported below)
        partitions = 0
    recovering = partitions > 0 and not os.path.exists(os.path.join(data_dir, CLEAN_SHUTDOWN))
    # (The "recovering" line is logged by the first progress report, i.e. once the .lock is held: a store that
    # is merely in use by another daemon has no marker either, and is refused before anything is said of it.)
    progress = StartupProgress(recovering, partitions, announce=data_dir)
    notify(f"STATUS={'recovering logs' if recovering else 'loading logs'}")
    try:
        manager = LogManager(data_dir, broker, progress=progress.partition_done,
                             segment_progress=progress.segment_done)
    except _StopBeforeServing as stopped:
        notify("STOPPING=1\nSTATUS=stopped while loading")
        log.info("received %s while loading; stopped before mounting", signal.Signals(stopped.args[0]).name)
        return 0
    except LockedError as exc:
        return fail(str(exc))
    except OSError as exc:
        where = exc.filename or data_dir
        return fail(f"cannot open {where}: {exc.strerror or exc}")
    except LogfsError as exc:
        return fail(f"cannot load {data_dir}: {exc}")
    finally:
        for s in previous:
            signal.signal(s, stop_after_loading)
    try:
        return trio.run(serve, manager, mountpoint, fuse_opts, read_only, ready, lambda: bool(stop))
    except KeyboardInterrupt:
        manager.close()
        return 0
    except Exception:
        log.critical("unexpected error; the data directory was not closed cleanly", exc_info=True)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())

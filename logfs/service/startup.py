"""Starting a store: loading (or recovering) every partition with progress reports, then serving it.

Owns what happens between a parsed command line and a mounted filesystem: the loading progress as systemd
``STATUS=``/``EXTEND_TIMEOUT_USEC=`` and log lines, a stop signal during loading (which abandons the start), the
one-line errors for a store that cannot be opened, and the hand-over to :func:`logfs.service.daemon.serve`.
"""

from __future__ import annotations

import logging
import os
import signal

from ..storage import LockedError, LogManager
from ..storage.errors import LogfsError
from ..storage.names import CLEAN_SHUTDOWN, DataDirScan
from .notify import notify

log = logging.getLogger("logfs")


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

    def summary(self) -> dict:
        """What the metrics report of the start: seconds taken so far, whether it recovered, segments."""
        return {"seconds": self.clock() - self.started, "recovering": self.recovering,
                "segments": self.segments[1], "partitions": self.partitions[1]}

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


def run(data_dir, mountpoint, broker, fuse_opts, read_only, ready, follow: str | None = None,
        broker_dirs: list[str] | None = None, cluster: tuple[str, dict[str, str]] | None = None) -> int:
    """``follow``: a follower mount of the tiered log under this bucket prefix (data_dir is its cache).
    ``broker_dirs``: a running Kafka broker's log directories, mounted read-only (data_dir is logfs's cache).
    ``cluster``: (bootstrap servers, client settings) of a Kafka cluster as the store (data_dir is the cache)."""
    import trio  # here, with the daemon, so that `logfs --help` and option errors do not load pyfuse3 and trio

    from .daemon import serve

    clients = None  # a Kafka cluster's (storage/cluster), when it is the store

    def fail(message: str) -> int:
        if clients is not None:
            clients.close()
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
    partitions, recovering = 0, False
    for path in data_dir.split(","):  # (each log directory)
        try:
            found = len(DataDirScan(path).partitions)
        except OSError:  # missing (created below) or unreadable (reported below)
            found = 0
        partitions += found
        recovering = recovering or (found > 0 and not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN)))
    # (The "recovering" line is logged by the first progress report, i.e. once the .lock is held: a store that
    # is merely in use by another daemon has no marker either, and is refused before anything is said of it.)
    progress = StartupProgress(recovering, partitions, announce=data_dir)
    notify(f"STATUS={'recovering logs' if recovering else 'loading logs'}")
    if cluster is not None and broker.topic_defaults.get("logfs.isolation.level") != "read_committed":
        # The replica is a read_committed consumer's (storage/cluster/replica): aborted records never reach it.
        return fail("logfs.isolation.level=read_uncommitted is not available on a Kafka cluster mount (its "
                    "replica is read by a read_committed consumer)")
    if cluster is not None:
        # The cluster's clients first: the replica's directory is what the manager serves (storage/cluster).
        from ..storage.cluster import Cluster
        from ..storage.errors import ClusterError

        os.makedirs(data_dir, exist_ok=True)
        clients = Cluster(cluster[0], cluster[1], data_dir, broker, read_only=read_only)
        try:
            clients.start()
        except ClusterError as exc:
            return fail(str(exc))
        broker_dirs = [clients.replica_dir]
        data_dir = clients.logs_dir
    try:
        manager = LogManager(data_dir, broker, progress=progress.partition_done,
                             segment_progress=progress.segment_done, broker_dirs=broker_dirs)
    except _StopBeforeServing as stopped:
        if clients is not None:
            clients.close()
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
    startup = progress.summary()  # loading or recovery, before the store check below
    if clients is not None:
        manager.cluster = clients
        clients.attach(manager)
    from .tiering import RemoteSetupError, setup

    try:
        if follow is not None:
            from .follower import setup as setup_follower

            setup_follower(manager, follow)
        else:
            manager.attach_tiering(setup(manager))
    except (RemoteSetupError, OSError) as exc:
        manager.close()
        return fail(str(exc))
    try:
        return trio.run(serve, manager, mountpoint, fuse_opts, read_only, ready, lambda: bool(stop), startup)
    except KeyboardInterrupt:
        manager.close()
        return 0
    except Exception:
        log.critical("unexpected error; the data directory was not closed cleanly", exc_info=True)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if clients is not None:
            clients.close()  # (after the unmount: the last lines the handles held are produced by then)

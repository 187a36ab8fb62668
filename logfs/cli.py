"""The ``logfs`` command: ``logfs DATA_DIR MOUNTPOINT [-f] [-o OPTS] [--config FILE]``.

Owns argument and ``-o`` parsing (FUSE options, ignored mount(8) options, Kafka broker settings) and
daemonizing (the parent exits 0 only once the mount answers). Loading, serving and the log format live in
:mod:`logfs.service`. A user error is one clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import stat
import sys

from . import __version__
from .service.logsetup import journal_stderr, setup_logging, user_error
from .storage.log_dirs import parse_log_dirs
from .service.follower import default_cache_dir, parse_source
from .service.startup import run
from .storage import BrokerConfig, InvalidConfigError
from .storage.config import broker_keys
from .service.mountpoint import check_metrics_file, check_mount_paths

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


KAFKA_SCHEME = "kafka://"
KAFKA_PREFIX = "kafka."  # -o kafka.<name>=<value>: a client setting of a Kafka cluster mount, Kafka's name
# Client settings the mount's promises rest on (CONTRACT section 15): not the user's to change.
KAFKA_OWN = {"enable.idempotence", "acks", "enable.gapless.guarantee", "isolation.level", "group.id",
             "enable.auto.commit", "bootstrap.servers", "transactional.id"}


class UsageError(Exception):
    pass


def parse_kafka_source(source: str) -> str | None:
    """``kafka://HOST:PORT[,HOST:PORT...]`` -> the bootstrap servers (``HOST:PORT,...``); None for other sources."""
    if not source.startswith(KAFKA_SCHEME):
        return None
    hosts = [h.strip() for h in source[len(KAFKA_SCHEME):].rstrip("/").split(",")]
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{source}: expected kafka://HOST:PORT[,HOST:PORT...], got {host!r}")
    return ",".join(hosts)


def default_kafka_cache_dir(bootstrap: str) -> str:
    """Where a Kafka cluster mount keeps its replica when ``logfs.remote.cache.dir`` is not set: one directory per
    cluster under ``$XDG_CACHE_HOME/logfs`` (``/var/cache/logfs`` for root)."""
    import hashlib

    base = "/var/cache/logfs" if os.geteuid() == 0 else os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "logfs")
    digest = hashlib.blake2b(bootstrap.encode(), digest_size=6).hexdigest()
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in bootstrap)[:80]
    return os.path.join(base, f"kafka-{name}-{digest}")


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
            elif has_value and (key in known or key.startswith(KAFKA_PREFIX)):
                props[key] = value  # (kafka.*: a Kafka cluster mount's client settings, checked by the caller)
            elif key in known:
                raise UsageError(f"setting {key!r} needs a value ({key}=...)")
            else:
                raise UsageError(f"unknown option {opt!r}")
    if "allow_other" in fuse_opts and "default_permissions" not in fuse_opts:
        # Without it the kernel checks no mode at all: every user could read, append to and delete everything.
        fuse_opts.append("default_permissions")
    return fuse_opts, props, debug, read_only


def build_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="logfs", description="Mount a Kafka-format log store as a filesystem.",
                        epilog="A follower mount: logfs s3://BUCKET[/PREFIX] MOUNTPOINT -o logfs.remote.s3.endpoint=URL "
                               "mounts, read-only, the tiered log a writing logfs keeps under that bucket prefix "
                               "(options logfs.remote.cache.dir, logfs.remote.cache.bytes, logfs.follow.interval.ms; "
                               "credentials from the AWS chain). A running Kafka broker's log directory: logfs -o "
                               "ro,logfs.cache.dir=CACHE KAFKA_LOG_DIR MOUNTPOINT mounts it read-only, never writing "
                               "under it (logfs's indexes go to CACHE), and follows the broker's appends, rolls, "
                               "retention, transactions, restarts and moves (logfs.broker.poll.ms; inotify, "
                               "logfs.broker.inotify, logfs.broker.full.look.ms). A Kafka cluster as the store: logfs "
                               "kafka://HOST:PORT[,HOST:PORT...] MOUNTPOINT [-o kafka.<name>=<value>,"
                               "logfs.remote.cache.dir=DIR,logfs.remote.cache.bytes=N] appends through an "
                               "idempotent producer and reads through a local replica of the topics.")
    p.add_argument("data_dir", help="Kafka log directory (created if missing); DIR1,DIR2,... for several, as "
                                    "Kafka's log.dirs (one namespace, each partition in one of them); or "
                                    "s3://BUCKET[/PREFIX] for a read-only follower mount of a writer's tiered log; "
                                    "or kafka://HOST:PORT[,HOST:PORT...] for a Kafka cluster as the store")
    p.add_argument("mountpoint")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="FUSE options and Kafka broker settings, comma-separated")
    p.add_argument("--config", metavar="FILE", help="server.properties-style file of broker settings")
    p.add_argument("--version", action="version", version=f"logfs {__version__}")
    return p


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
        bootstrap = parse_kafka_source(args.data_dir)
        kafka = {k[len(KAFKA_PREFIX):]: v for k, v in props.items() if k.startswith(KAFKA_PREFIX)}
        if kafka and bootstrap is None:
            raise UsageError(f"unknown option {KAFKA_PREFIX}{next(iter(kafka))!r}: kafka.* settings are for a "
                             f"kafka://HOST:PORT mount")
        own = sorted(KAFKA_OWN & set(kafka))
        if own:
            raise UsageError(f"{KAFKA_PREFIX}{own[0]} is set by logfs (an idempotent producer with acks=all, a "
                             f"read_committed replica): remove it")
        props = {k: v for k, v in props.items() if not k.startswith(KAFKA_PREFIX)}
        follow = parse_source(args.data_dir) if bootstrap is None else None
        if follow is not None:  # a follower mount: the bucket is the store, a cache directory the data directory
            bucket, prefix = follow
            props = {**props, "remote.log.storage.system.enable": "true", "logfs.remote.s3.bucket": bucket,
                     "logfs.remote.s3.prefix": prefix}
        broker = BrokerConfig.from_properties(props)
    except (UsageError, InvalidConfigError, ValueError) as exc:
        user_error(str(exc))
        return 2
    source = args.data_dir
    if follow is not None:
        args.data_dir = broker.get("logfs.remote.cache.dir") or default_cache_dir(
            broker.get("logfs.remote.s3.endpoint"), follow[0], follow[1])
        read_only = True
        if "ro" not in fuse_opts:
            fuse_opts.append("ro")
    cluster = None
    if bootstrap is not None:  # a Kafka cluster as the store: the data directory is the cache (its replica)
        cluster = (bootstrap, kafka)
        args.data_dir = os.path.abspath(broker.get("logfs.remote.cache.dir") or default_kafka_cache_dir(bootstrap))
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
    try:
        data_dirs = parse_log_dirs(args.data_dir)  # DIR, or Kafka's log.dirs: DIR1,DIR2,...
    except ValueError as exc:
        user_error(str(exc))
        return 2
    for data_dir in data_dirs:
        if os.path.exists(data_dir) and not os.path.isdir(data_dir):
            user_error(f"data directory {data_dir} is not a directory")
            return 2
        refused = check_mount_paths(data_dir, mountpoint)
        if not refused and broker.get("logfs.metrics.file"):
            refused = check_metrics_file(broker.get("logfs.metrics.file"), data_dir, mountpoint)
        if refused:
            user_error(refused)
            return 2
    args.data_dir = ",".join(data_dirs)
    broker_dirs = None
    if follow is None and cluster is None and read_only and broker.get("logfs.cache.dir"):
        # A running Kafka broker's log directories (CONTRACT section 14): read in place, never written; logfs's own
        # files live in the cache, which is the mount's data directory.
        broker_dirs, source = data_dirs, args.data_dir
        cache = os.path.abspath(broker.get("logfs.cache.dir"))
        refused = check_mount_paths(cache, mountpoint)
        for data_dir in data_dirs:
            real, cache_real = os.path.realpath(data_dir), os.path.realpath(cache)
            if real == cache_real or cache_real.startswith(real + os.sep) or real.startswith(cache_real + os.sep):
                refused = f"the cache directory {cache} and the broker's log directory {data_dir} overlap"
        if refused:
            user_error(refused)
            return 2
        args.data_dir = cache
    setup_logging(debug, daemon=not args.foreground)
    log.debug("broker settings %s; FUSE options %s", props, fuse_opts)
    if not any(o.startswith("fsname=") for o in fuse_opts):
        # (libfuse splits options at commas: the ones between log directories are escaped)
        fuse_opts.append("fsname=" + (source if follow is not None or broker_dirs or cluster else args.data_dir
                                      ).replace(",", "\\,"))
    if not any(o.startswith("subtype=") for o in fuse_opts):
        fuse_opts.append("subtype=logfs")
    prefix = follow[1] if follow is not None else None
    if args.foreground:
        return run(args.data_dir, mountpoint, broker, fuse_opts, read_only, ready=None, follow=prefix,
                   broker_dirs=broker_dirs, cluster=cluster)
    return daemonize(args.data_dir, mountpoint, broker, fuse_opts, read_only, prefix, broker_dirs, cluster)


def daemonize(data_dir, mountpoint, broker, fuse_opts, read_only, follow=None, broker_dirs=None,
              cluster=None) -> int:
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

    code = run(data_dir, mountpoint, broker, fuse_opts, read_only, ready=ready, follow=follow,
               broker_dirs=broker_dirs, cluster=cluster)
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

"""Hand a topic logfs wrote to a Kafka broker with its offsets kept (CONTRACT.md section 13): the file work.

    logfs-kafka-handover DATA_DIR TOPIC KAFKA_LOG_DIRS [--dry-run]

A KRaft broker serves a partition directory only if its ``partition.metadata`` names a topic id the controller
knows, for a partition assigned to this broker (``LogManager.isStrayKraftReplica``; any other directory is renamed
``-stray`` at start-up), and topic ids cannot be chosen through the admin API. So the topic is created on the
cluster first (same partition count, one replica), the broker is stopped, and this command fills the broker's
empty partition directories with logfs's segments, keeping the broker's ``partition.metadata``:

1. Kafka's side is checked before anything is written: each of KAFKA_LOG_DIRS is formatted (``meta.properties``)
   and its ``.lock`` is free (taken here, as Kafka's ``FileChannel.tryLock`` takes it: a running broker holds it,
   and a broker started meanwhile refuses to start); TOPIC's partitions there are exactly logfs's, each with a
   topic id, and hold no record (only an empty segment at offset 0, or what an interrupted run of this command
   left, which its marker file names).
2. DATA_DIR is opened as a mount opens it (recovered if it was not unmounted cleanly) and closed cleanly (active
   indexes trimmed, the last time index entry written), then locked again for the copy: a mount cannot start.
3. Per partition: a marker file (``logfs-handover.json``, which Kafka ignores) first; every segment's ``.log``,
   ``.index``, ``.timeindex`` (and ``.txnindex``) copied under temporary names and fsynced, each batch checked
   (framing, CRC-32C, offsets) on the copy; the empty log's files and producer snapshots removed; the copies
   renamed into place; ``leader-epoch-checkpoint`` rebuilt from the batches' leader epochs, as Kafka's own
   recovery does (otherwise the broker's cache says its current epoch began at the log start, and a consumer
   holding a record's epoch 0 would be told the log was truncated).
4. Per Kafka log directory: ``recovery-point-offset-checkpoint`` and ``replication-offset-checkpoint`` (the high
   watermark) set to logfs's log end offset, ``log-start-offset-checkpoint`` to its log start offset (written
   atomically: temporary file, fsync, rename, directory fsync). Then the markers are removed.

DATA_DIR itself is not changed (beyond what a mount and a clean unmount do). logfs's own files (``.viewindex``,
``logfs-remote/``) are not copied. Exit status 0 done, 1 refused or failed (one line saying why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import mmap
import os
import sys
import time
from dataclasses import dataclass, field

from ..storage import LogManager, LogfsError, validate_topic_name
from ..storage import checkpoints as ckpt
from ..storage.errors import CorruptRecordError
from ..storage.format import records as rec
from ..storage.log_dirs import DataDir, parse_log_dirs
from ..storage.names import (
    INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, filename_prefix, parse_partition_number,
    parse_segment_file,
)

MARKER = "logfs-handover.json"  # in a Kafka partition directory while this command fills it
TMP = ".logfs-handover"  # suffix of a copy not yet renamed into place (Kafka ignores such names)
PARTITION_METADATA = "partition.metadata"
LEADER_EPOCHS = "leader-epoch-checkpoint"
META_PROPERTIES = "meta.properties"
KAFKA_LOCK = ".lock"
HIGH_WATERMARK = "replication-offset-checkpoint"
CHECKPOINTS = (ckpt.RECOVERY_POINT, ckpt.LOG_START_OFFSET, HIGH_WATERMARK)
SEGMENT_KINDS = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
INDEX_ENTRY = {INDEX_SUFFIX: 8, TIME_INDEX_SUFFIX: 12}
EMPTY_LOG_FILES = SEGMENT_KINDS + (".snapshot",)  # what a broker leaves in a partition that never had a record
KAFKA_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000  # log.retention.hours=168

log = logging.getLogger("logfs.tools.handover")


class HandoverError(Exception):
    """Refused or failed: one line for the operator."""


@dataclass
class Source:
    """One logfs partition: its directory, offsets and segments ((base offset, .log bytes), ascending)."""
    partition: int
    directory: str
    log_start_offset: int
    log_end_offset: int
    segments: list[tuple[int, int]]


@dataclass
class Target:
    """One Kafka partition directory, in log directory ``log_dir``."""
    partition: int
    directory: str
    log_dir: str
    topic_id: str
    reclaim: bool = False  # holds what an interrupted run of this command left (its marker)
    bytes: int = 0
    epochs: list[tuple[int, int]] = field(default_factory=list)
    oldest: int | None = None  # the smallest of its segments' largest timestamps (what time retention looks at)


# -- Kafka's side ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def kafka_locks(dirs: list[str]):
    """Each Kafka log directory's ``.lock``, held (POSIX record lock, as Java's FileChannel.tryLock on Linux)."""
    held: list[tuple[int, str, bool]] = []
    try:
        for d in dirs:
            if not os.path.isfile(os.path.join(d, META_PROPERTIES)):
                raise HandoverError(f"{d} is not a Kafka log directory ({META_PROPERTIES} is missing: format it and "
                                    "let the broker create the topic first)")
            path = os.path.join(d, KAFKA_LOCK)
            created = not os.path.exists(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise HandoverError(f"a Kafka broker is running on {d} (its {KAFKA_LOCK} is held): stop it first")
            held.append((fd, path, created))
        yield
    finally:
        for fd, path, created in held:
            if created:  # (a broker removes its .lock when it stops: leave the directory as it was)
                with contextlib.suppress(OSError):
                    os.unlink(path)
            os.close(fd)


def read_kafka_checkpoint(path: str) -> dict[tuple[str, int], int]:
    """A Kafka checkpoint file (missing: empty). Unlike logfs's reader this refuses a malformed file: it is
    rewritten with the entries of every other partition kept."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if lines[0].strip() != "0":
            raise ValueError(f"version {lines[0].strip()!r}")
        entries = {}
        for line in lines[2 : 2 + int(lines[1])]:
            topic, partition, offset = line.split()
            entries[(topic, int(partition))] = int(offset)
        if len(entries) != int(lines[1]):
            raise ValueError("fewer entries than its count")
        return entries
    except (OSError, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise HandoverError(f"cannot read {path} ({exc}): left alone, nothing done") from None


def topic_id_of(directory: str) -> str:
    """The topic id of a partition directory's ``partition.metadata`` (``version: 0`` / ``topic_id: <id>``)."""
    path = os.path.join(directory, PARTITION_METADATA)
    try:
        with open(path, encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except FileNotFoundError:
        raise HandoverError(f"{path} is missing: the broker would move {directory} aside as stray (create the topic "
                            "through the cluster, then stop the broker)") from None
    topic_id = fields.get("topic_id", "").strip()
    if fields.get("version", "").strip() != "0" or not topic_id:
        raise HandoverError(f"{path}: not a partition.metadata Kafka wrote")
    return topic_id


def find_targets(topic: str, kafka_dirs: list[str]) -> dict[int, Target]:
    targets: dict[int, Target] = {}
    for d in kafka_dirs:
        for name in sorted(os.listdir(d)):
            if not name.startswith(topic + "-"):
                continue
            rest = name[len(topic) + 1:]
            partition = parse_partition_number(rest)
            if partition is None:
                if rest.split(".", 1)[0].isdigit() and rest.endswith("-future"):
                    raise HandoverError(f"{os.path.join(d, name)}: a move between log directories is in progress")
                continue  # (-delete and -stray directories, other topics)
            path = os.path.join(d, name)
            if partition in targets:
                raise HandoverError(f"{topic}-{partition} is in two log directories: {targets[partition].directory} "
                                    f"and {path}")
            targets[partition] = Target(partition, path, d, topic_id_of(path))
    ids = {t.topic_id for t in targets.values()}
    if len(ids) > 1:
        raise HandoverError(f"the partitions of {topic} name different topic ids ({', '.join(sorted(ids))})")
    return targets


def check_empty(target: Target, topic: str, data_dir: str, checkpoints: dict[str, dict]) -> None:
    """A partition that never had a record (or one an interrupted run of this command was filling: reclaimed)."""
    marker = os.path.join(target.directory, MARKER)
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            earlier = json.load(f)
        if (earlier.get("data_dir"), earlier.get("topic"), earlier.get("partition")) != (
                data_dir, topic, target.partition):
            raise HandoverError(f"{marker} names another hand-over ({earlier}): left alone")
        target.reclaim = True
        return
    for name in os.listdir(target.directory):
        if name in (PARTITION_METADATA, LEADER_EPOCHS):
            continue
        parsed = parse_segment_file(name)
        snapshot = name.endswith(".snapshot") and name[:-9].isdigit()
        if parsed is None and not snapshot:
            raise HandoverError(f"{target.directory} holds {name}: not a partition that never had a record")
        if snapshot:
            continue
        base, kind, state = parsed
        if state or base != 0 or (kind == LOG_SUFFIX and os.path.getsize(os.path.join(target.directory, name))):
            raise HandoverError(f"{target.directory} holds records ({name}): the hand-over only fills partitions "
                                "that never had one (create a new topic)")
    key = (topic, target.partition)
    for name in CHECKPOINTS:
        if checkpoints[name].get(key, 0) != 0:
            raise HandoverError(f"{os.path.join(target.log_dir, name)} has {topic} {target.partition} at "
                                f"{checkpoints[name][key]}: that partition had records")


# -- logfs's side ----------------------------------------------------------------------------------------------
def logfs_sources(data_dir: str, topic: str) -> tuple[list[Source], dict[str, str]]:
    """TOPIC's partitions as logfs's engine loads them (recovering DATA_DIR if needed), then closed cleanly."""
    try:
        manager = LogManager(data_dir)
    except LogfsError as exc:
        raise HandoverError(f"{exc} (unmount logfs first)") from None
    try:
        if topic not in manager.topics:
            raise HandoverError(f"{data_dir} has no topic {topic!r}")
        overrides = manager.topic_overrides(topic)
        sources = []
        for plog in sorted(manager.topic_logs(topic), key=lambda p: p.partition):
            segments = [(s.base_offset, s.size) for s in plog.segments.as_list()]
            if plog.log_start_offset < segments[0][0]:
                raise HandoverError(f"{topic}-{plog.partition}: offsets {plog.log_start_offset} to "
                                    f"{segments[0][0]} are only in the tiered storage bucket (not handed over)")
            # Segments wholly below the log start offset (DeleteRecords before logfs's retention pass) are deleted
            # records: not copied (the broker would delete them at its first retention pass).
            segments = [seg for seg, after in zip(segments, segments[1:] + [None])
                        if after is None or after[0] > plog.log_start_offset]
            sources.append(Source(plog.partition, plog.directory, plog.log_start_offset, plog.log_end_offset,
                                  segments))
    finally:
        manager.close()
    return sources, overrides


@contextlib.contextmanager
def logfs_locked(data_dir: str, sources: list[Source]):
    """DATA_DIR's locks held again (no mount can start), and its segments as they were at the clean close."""
    dirs = [DataDir(p) for p in parse_log_dirs(data_dir)]
    try:
        for d in dirs:
            try:
                d.acquire_lock()
            except LogfsError as exc:
                raise HandoverError(f"{exc} (mounted again meanwhile?)") from None
        for s in sources:
            for base, size in s.segments:
                path = os.path.join(s.directory, filename_prefix(base) + LOG_SUFFIX)
                if not os.path.exists(path) or os.path.getsize(path) != size:
                    raise HandoverError(f"{path} changed since it was loaded (mounted meanwhile?): nothing done")
        yield
    finally:
        for d in dirs:
            d.release_lock()


# -- the copy --------------------------------------------------------------------------------------------------
def _copy(src: str, dst: str, length: int) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        left = length
        while left > 0:
            n = os.copy_file_range(fin.fileno(), fout.fileno(), left)
            if n == 0:
                raise HandoverError(f"{src} ended before its {length} bytes")
            left -= n
        fout.flush()
        st = os.fstat(fin.fileno())  # (Kafka falls back on a segment's mtime where it has no timestamp)
        os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        os.fsync(fout.fileno())


def _index_length(path: str, entry: int) -> int:
    """The bytes of an index's entries: all-zero slots at its end (a preallocated index) are not entries."""
    with open(path, "rb") as f:  # (at most segment.index.bytes: 10 MiB by default)
        data = f.read()
    used = len(data[: len(data) - len(data) % entry].rstrip(b"\0"))
    return -(-used // entry) * entry


def check_batches(path: str, base: int, expected_next: int | None, epochs: list[tuple[int, int]]) -> tuple[int, int]:
    """Walk a copied ``.log``: whole batches, CRC-32C, offsets ascending from ``base``. Leader epochs are added to
    ``epochs`` as Kafka's LeaderEpochFileCache.assign does when it recovers a segment. Returns its next offset and
    its largest timestamp (-1 without records)."""
    if expected_next is not None and base < expected_next:
        raise HandoverError(f"{path}: a segment based at {base}, below the previous one's end {expected_next}")
    size = os.path.getsize(path)
    next_offset, largest = base, -1
    if size == 0:
        return next_offset, largest
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as buf:
        pos = 0
        while pos < size:
            try:
                header = rec.validate(buf, pos)
            except CorruptRecordError as exc:
                raise HandoverError(f"{path}: {exc}: not handed over") from None
            if header.base_offset < next_offset:
                raise HandoverError(f"{path}: batch at position {pos} starts at offset {header.base_offset}, below "
                                    f"{next_offset}: not handed over")
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (not epochs or epoch != epochs[-1][0]):
                epochs[:] = [e for e in epochs if e[0] < epoch and e[1] < header.base_offset]
                epochs.append((epoch, header.base_offset))
            next_offset = header.next_offset
            largest = max(largest, header.max_timestamp)
            pos += header.size
    return next_offset, largest


def fill(source: Source, target: Target, topic: str, data_dir: str) -> None:
    """Copy one partition's segments into the Kafka partition directory (see the module's steps 3)."""
    k = target.directory
    marker = {"data_dir": data_dir, "topic": topic, "partition": source.partition, "topic_id": target.topic_id,
              "log_start_offset": source.log_start_offset, "log_end_offset": source.log_end_offset}
    ckpt.atomic_write(os.path.join(k, MARKER), (json.dumps(marker) + "\n").encode())
    for name in os.listdir(k):  # copies an interrupted run left
        if name.endswith(TMP):
            os.unlink(os.path.join(k, name))
    copies = []
    next_offset = None
    for base, size in source.segments:
        stem = filename_prefix(base)
        for kind in SEGMENT_KINDS:
            src = os.path.join(source.directory, stem + kind)
            if kind == TXN_INDEX_SUFFIX and not os.path.exists(src):
                continue
            length = size if kind == LOG_SUFFIX else (
                _index_length(src, INDEX_ENTRY[kind]) if kind in INDEX_ENTRY else os.path.getsize(src))
            tmp = os.path.join(k, stem + kind + TMP)
            _copy(src, tmp, length)
            target.bytes += length
            copies.append((tmp, os.path.join(k, stem + kind)))
            if kind == LOG_SUFFIX:
                next_offset, largest = check_batches(tmp, base, next_offset, target.epochs)
                if largest >= 0 and (target.oldest is None or largest < target.oldest):
                    target.oldest = largest
    if next_offset != source.log_end_offset:
        raise HandoverError(f"{topic}-{source.partition}: the segments end at offset {next_offset}, logfs's log end "
                            f"offset is {source.log_end_offset}: not handed over")
    for name in os.listdir(k):  # the empty log's files (or an interrupted run's): replaced
        if name != MARKER and not name.endswith(TMP) and name.endswith(EMPTY_LOG_FILES):
            os.unlink(os.path.join(k, name))
    for tmp, final in copies:
        os.rename(tmp, final)
    # Kafka's truncateFromStart(log start offset): the epoch that holds the log start begins there.
    kept = [e for e in target.epochs if e[1] > source.log_start_offset]
    below = [e for e in target.epochs if e[1] <= source.log_start_offset]
    target.epochs = ([(below[-1][0], source.log_start_offset)] if below else []) + kept
    lines = ["0", str(len(target.epochs))] + [f"{e} {o}" for e, o in target.epochs]
    ckpt.atomic_write(os.path.join(k, LEADER_EPOCHS), ("\n".join(lines) + "\n").encode())
    ckpt.fsync_dir(k)


# -- the command -----------------------------------------------------------------------------------------------
def handover(data_dir: str, topic: str, kafka_spec: str, dry_run: bool = False, out=None) -> None:
    """The command: ``out`` (default stdout) gets what it does, line by line; HandoverError when it refuses."""
    out = out or sys.stdout
    validate_topic_name(topic)
    data_dir = ",".join(parse_log_dirs(data_dir))
    for d in data_dir.split(","):
        if not os.path.isdir(d):
            raise HandoverError(f"{d} is not a directory (DATA_DIR: logfs's log directory)")
    kafka_dirs = parse_log_dirs(kafka_spec)
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731
    with kafka_locks(kafka_dirs):
        checkpoints = {d: {name: read_kafka_checkpoint(os.path.join(d, name)) for name in CHECKPOINTS}
                       for d in kafka_dirs}
        targets = find_targets(topic, kafka_dirs)
        if not targets:
            raise HandoverError(f"no partition of {topic} in {kafka_spec}: create the topic through the cluster "
                                "(as many partitions as logfs's, replication factor 1) while the broker runs (it "
                                "makes the partition directories), then stop the broker")
        for t in targets.values():
            check_empty(t, topic, data_dir, checkpoints[t.log_dir])
        sources, overrides = logfs_sources(data_dir, topic)
        mine = sorted(s.partition for s in sources)
        if mine != sorted(targets):
            raise HandoverError(f"logfs's {topic} has partitions {mine}, Kafka's {sorted(targets)} (in the "
                                f"directories given: name every one of the broker's log.dirs): create the Kafka "
                                f"topic with {len(mine)} partitions" + (
                                    "" if mine == list(range(len(mine))) else
                                    " (and add the missing ones to logfs's topic: touch MNT/TOPIC/N)"))
        topic_id = next(iter(targets.values())).topic_id
        need = sum(size for s in sources for _, size in s.segments)
        for d in kafka_dirs:
            st = os.statvfs(d)
            if st.f_bavail * st.f_frsize < need:
                raise HandoverError(f"{d} has {st.f_bavail * st.f_frsize} bytes free, the segments need {need}")
        say(f"{'would hand' if dry_run else 'handing'} over {topic} from {data_dir} to {kafka_spec}: "
            f"{len(sources)} partition{'s' * (len(sources) != 1)}, Kafka topic id {topic_id}")
        for s in sources:
            t = targets[s.partition]
            say(f"  {topic}-{s.partition}: offsets {s.log_start_offset} to {s.log_end_offset} (log start, log end), "
                f"{len(s.segments)} segments -> {t.directory}" + (" (finishing an interrupted run)" if t.reclaim
                                                                    else ""))
        if dry_run:
            say("dry run: nothing written")
            return
        with logfs_locked(data_dir, sources):
            for s in sources:
                fill(s, targets[s.partition], topic, data_dir)
                t = targets[s.partition]
                say(f"  {topic}-{s.partition}: {t.bytes} bytes copied and fsynced, every batch checked; leader epochs "
                    f"{' '.join(f'{e}@{o}' for e, o in t.epochs) or 'none'}")
        for d in kafka_dirs:
            mine_here = {(topic, s.partition): s for s in sources if targets[s.partition].log_dir == d}
            if not mine_here:
                continue
            values = {ckpt.RECOVERY_POINT: lambda s: s.log_end_offset, HIGH_WATERMARK: lambda s: s.log_end_offset,
                      ckpt.LOG_START_OFFSET: lambda s: s.log_start_offset}
            for name in CHECKPOINTS:
                entries = dict(checkpoints[d][name])
                entries.update({key: values[name](s) for key, s in mine_here.items()})
                ckpt.write_checkpoint(os.path.join(d, name), entries)
            say(f"  {d}: {', '.join(CHECKPOINTS)} written")
        for t in targets.values():
            os.unlink(os.path.join(t.directory, MARKER))
            ckpt.fsync_dir(t.directory)
    say(f"done: start the broker; {topic} serves the offsets above, with topic id {topic_id}")
    old = [t for t in targets.values() if t.oldest is not None
           and t.oldest < time.time() * 1000 - KAFKA_DEFAULT_RETENTION_MS]
    for t in sorted(old, key=lambda t: t.partition):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t.oldest / 1000))
        say(f"note: {topic}-{t.partition} has a segment whose newest record is from {when} UTC: the broker deletes it "
            "at its first retention pass unless the Kafka topic's retention.ms is longer than its age (Kafka's "
            "default is 7 days)")
    settings = {k: v for k, v in sorted(overrides.items()) if not k.startswith("logfs.")}
    if settings:
        say(f"logfs's settings of {topic} are not carried over; the Kafka topic keeps its own: "
            f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config "
            + ",".join(f"{k}={v}" for k, v in settings.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="logfs-kafka-handover",
        description="Fill a stopped Kafka broker's empty partitions of TOPIC with the segments logfs wrote in "
                    "DATA_DIR, offsets kept (README: \"Handing a topic to Kafka\").")
    parser.add_argument("data_dir", metavar="DATA_DIR", help="logfs's log directory (DIR1,DIR2 for several)")
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("kafka_log_dirs", metavar="KAFKA_LOG_DIRS", help="the broker's log.dirs (DIR1,DIR2)")
    parser.add_argument("--dry-run", action="store_true", help="check and print the plan, write nothing")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    try:
        handover(opts.data_dir, opts.topic, opts.kafka_log_dirs, opts.dry_run)
    except (HandoverError, LogfsError, ValueError, OSError) as exc:
        print(f"logfs-kafka-handover: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every name DATA_DIR holds, built and parsed here only (as Kafka's ``LogFileUtils`` and ``UnifiedLog``).

Owns: topic names (Kafka's legal-name and collision rules, and the internal names logfs never serves),
partition directories ``<topic>-<n>``, the directories renamed for deletion ``<topic>-<n>.<32 hex>-delete``,
segment files ``<20-digit base offset><kind>[<state>]`` with every kind (``.log .index .timeindex .viewindex``)
and state (``.deleted .cleaned .swap``) suffix, and the fixed files of the directory: the checkpoints, the
clean-shutdown marker, the topics file, ``.lock`` and the temporary names of atomic writes.
"""

from __future__ import annotations

import os
import re
import uuid

from .errors import InvalidTopicError

# -- topics ------------------------------------------------------------------------------------------------
TOPIC_MAX_LENGTH = 249
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]{1,%d}" % TOPIC_MAX_LENGTH)
# Topics Kafka reserves for itself: the KRaft metadata log, and the internal topics whose records are Kafka's own
# binary state. A directory of theirs in DATA_DIR is left alone (not served, never touched); mkdir refuses them.
INTERNAL_TOPICS = frozenset({"__cluster_metadata", "__consumer_offsets", "__transaction_state",
                             "__remote_log_metadata", "__share_group_state"})


def is_legal_topic(name: str) -> bool:
    """Kafka's rule: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    return name not in (".", "..") and _TOPIC_RE.fullmatch(name) is not None


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS


# Entries of the mount's root that are not topics (logfs.fuse.control): the sink's staging directory and its
# commit file. Kafka's rules allow these names for topics; logfs refuses them, so the mount can serve both.
MOUNT_STAGING = ".logfs-staging"
MOUNT_COMMIT = ".logfs-commit"
MOUNT_RESERVED = frozenset({MOUNT_STAGING, MOUNT_COMMIT})


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidTopicError` for a name a new topic may not have (illegal or reserved by Kafka or by
    the mount)."""
    if not is_legal_topic(name):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'")
    if is_internal_topic(name):
        raise InvalidTopicError(f"topic name {name!r} is reserved for Kafka's internal use")
    if name in MOUNT_RESERVED:
        raise InvalidTopicError(f"topic name {name!r} is reserved for the mount's own entries")


def collision_key(topic: str) -> str:
    """Kafka's ``Topic.unifyCollisionChars``: two topics whose keys are equal collide ('.' and '_' both
    become '_' in metric names), so the second is refused."""
    return topic.replace(".", "_")


# -- partition numbers and directories ---------------------------------------------------------------------
MAX_PARTITION = 2**31 - 1  # a Kafka partition number is an int32
_NUMBER_RE = re.compile(r"0|[1-9][0-9]{0,9}")


def parse_partition_number(text: str) -> int | None:
    """``text`` as a partition number: plain ASCII decimal, no sign, no leading zero, fitting an int32."""
    if _NUMBER_RE.fullmatch(text) is None:  # (str.isdigit would accept "²", which int() then rejects)
        return None
    number = int(text)
    return number if number <= MAX_PARTITION else None


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a directory name that is exactly ``<legal topic>-<partition number>``, else None.
    The one parser of partition directory names."""
    topic, sep, number = name.rpartition("-")
    if not sep or not is_legal_topic(topic):
        return None
    partition = parse_partition_number(number)
    return None if partition is None else (topic, partition)


# -- directories renamed for deletion ----------------------------------------------------------------------
DELETE_DIR_SUFFIX = "-delete"
_MAX_NAME_BYTES = 255
_DELETE_DIR_RE = re.compile(r"[a-zA-Z0-9._-]+-(?:0|[1-9][0-9]{0,9})\.[0-9a-f]{32}" + DELETE_DIR_SUFFIX)


def delete_dir_name(topic: str, partition: int, unique: str | None = None) -> str:
    """Kafka's ``logDeleteDirName``: ``<topic>-<n>.<32 hex>-delete``, the topic part cut so that the name fits
    in 255 bytes (a 249-character topic would not). Such a directory is only ever purged, so the cut is safe."""
    unique = unique or uuid.uuid4().hex
    suffix = f"-{partition}.{unique}{DELETE_DIR_SUFFIX}"
    return topic[: _MAX_NAME_BYTES - len(suffix)] + suffix


def is_delete_dir(name: str) -> bool:
    """Whether ``name`` is exactly what :func:`delete_dir_name` makes (``x-0-delete`` is not)."""
    return _DELETE_DIR_RE.fullmatch(name) is not None


FUTURE_DIR_SUFFIX = "-future"
_FUTURE_DIR_RE = re.compile(r"(.+)-(0|[1-9][0-9]{0,9})\.[0-9a-f]{32}" + FUTURE_DIR_SUFFIX)


def future_dir_name(topic: str, partition: int, unique: str | None = None) -> str:
    """Kafka's ``logFutureDirName``: ``<topic>-<n>.<32 hex>-future``, the copy a move between log directories
    builds in its target (ValueError when the name would not fit in 255 bytes: such a partition cannot move)."""
    name = f"{topic}-{partition}.{unique or uuid.uuid4().hex}{FUTURE_DIR_SUFFIX}"
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise ValueError(f"{topic}-{partition}: the name of its -future copy would be over {_MAX_NAME_BYTES} bytes")
    return name


def parse_future_dir(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a :func:`future_dir_name`, or None."""
    m = _FUTURE_DIR_RE.fullmatch(name)
    if m is None or not is_legal_topic(m.group(1)):
        return None
    return m.group(1), int(m.group(2))


# -- segment files -----------------------------------------------------------------------------------------
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
VIEW_INDEX_SUFFIX = ".viewindex"  # logfs's own: line positions of the text view (Kafka ignores it)
TXN_INDEX_SUFFIX = ".txnindex"  # Kafka's aborted transactions (storage/local/txn_index.py): kept; rewrites get theirs
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, VIEW_INDEX_SUFFIX)
ALL_SUFFIXES = (LOG_SUFFIX,) + INDEX_SUFFIXES
STATE_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)
_SEGMENT_RE = re.compile(r"([0-9]{20})(%s)(%s)?" % ("|".join(map(re.escape, ALL_SUFFIXES)),
                                                     "|".join(map(re.escape, STATE_SUFFIXES))))
_OFFSET_STEM_RE = re.compile(r"[0-9]+")


def filename_prefix(offset: int) -> str:
    """The 20-digit stem of a segment's files."""
    return f"{offset:020d}"


def segment_file_name(base_offset: int, kind: str, state: str = "") -> str:
    return filename_prefix(base_offset) + kind + state


def parse_segment_file(name: str) -> tuple[int, str, str] | None:
    """(base offset, kind suffix, state suffix or "") of a segment file name, or None for any other name."""
    m = _SEGMENT_RE.fullmatch(name)
    return None if m is None else (int(m.group(1)), m.group(2), m.group(3) or "")


def offset_from_file_name(name: str) -> int | None:
    """Kafka's ``offsetFromFileName``: the ASCII decimal before the first '.', of any length (tools accept
    segment files renamed by hand), or None."""
    stem = name.split(".", 1)[0]
    return int(stem) if _OFFSET_STEM_RE.fullmatch(stem) else None


def companion_file_name(name: str, kind: str) -> str:
    """The file of kind ``kind`` beside segment file ``name`` (same stem)."""
    return name.split(".", 1)[0] + kind


# -- fixed files of the data directory ---------------------------------------------------------------------
RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET = "log-start-offset-checkpoint"
CLEANER_OFFSET = "cleaner-offset-checkpoint"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
TOPICS_FILE = "logfs-topics.json"  # topic overrides and modes (Kafka ignores it)
LOCK_FILE = ".lock"
# Tiered storage's local state. In each tiered partition's directory, a subdirectory (Kafka and the loader only
# look at files there): the tiered segments' indexes, a copy of the manifest, and ``blocks/``, the cached ranges of
# their .log objects. In DATA_DIR, the partitions deleted whose objects are still to be deleted from the store.
REMOTE_CACHE_DIR = "logfs-remote"
REMOTE_DELETES_FILE = "logfs-remote-deletes.json"
# The Spark sink's publish primitive (logfs.storage.publish.transactions): the files its tasks stage, and the log of the
# transactions applied (which commits were appended, for exactly once; which are in flight, for recovery).
STAGING_DIR = ".logfs-staging"
TRANSACTIONS_FILE = "logfs-transactions.log"
TMP_SUFFIX = ".tmp"  # an atomic write's temporary, renamed over its target
OWN_FILES = frozenset({RECOVERY_POINT, LOG_START_OFFSET, CLEANER_OFFSET, CLEAN_SHUTDOWN, TOPICS_FILE, LOCK_FILE,
                       REMOTE_DELETES_FILE, TRANSACTIONS_FILE})
OWN_DIRS = frozenset({STAGING_DIR})
# A Kafka broker's own files in its log directory, which logfs leaves alone (a broker's directory mounts): the
# storage format's identity, the high watermarks, the KRaft bootstrap records.
KAFKA_FILES = frozenset({"meta.properties", "replication-offset-checkpoint", "bootstrap.checkpoint"})


def tmp_name(path: str) -> str:
    return path + TMP_SUFFIX


def is_own_file(name: str) -> bool:
    """A fixed file logfs writes in DATA_DIR (or the temporary of one a crash left behind)."""
    return name in OWN_FILES or (name.endswith(TMP_SUFFIX) and name[: -len(TMP_SUFFIX)] in OWN_FILES)


# -- what a data directory holds ---------------------------------------------------------------------------
class DataDirScan:
    """The entries of a data directory, by what they are: ``partitions`` ((topic, n), path), ``delete_dirs``
    (paths logfs renamed for deletion), ``future_dirs`` ((topic, n), path: the copies of moves between log
    directories), ``internal`` (Kafka's own partitions, served never), ``kafka_files`` (a broker's own files) and
    ``ignored`` (anything else, and symlinks whatever they are called: never touched)."""

    def __init__(self, data_dir: str):
        self.partitions: list[tuple[tuple[str, int], str]] = []
        self.delete_dirs: list[str] = []
        self.future_dirs: list[tuple[tuple[str, int], str]] = []
        self.internal: list[str] = []
        self.kafka_files: list[str] = []
        self.ignored: list[str] = []
        with os.scandir(data_dir) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                self._add(entry)

    def _add(self, entry: os.DirEntry) -> None:
        name = entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            if name in KAFKA_FILES and not entry.is_symlink():
                self.kafka_files.append(name)
            elif not is_own_file(name) or entry.is_symlink():
                self.ignored.append(name)
            return
        if is_delete_dir(name):
            self.delete_dirs.append(entry.path)
            return
        future = parse_future_dir(name)
        if future is not None:
            self.future_dirs.append((future, entry.path))
            return
        if name in OWN_DIRS and not entry.is_symlink():
            return
        parsed = parse_partition_dir(name)
        if parsed is None:
            self.ignored.append(name)
        elif is_internal_topic(parsed[0]):
            self.internal.append(name)
        else:
            self.partitions.append((parsed, entry.path))

"""Broker and topic settings, by their Kafka names.

Owns: the table of every accepted setting, its default (as in Kafka), its validation, the mapping from broker
(server.properties) names to topic-level names, and :class:`LogConfig`, the typed, immutable effective
configuration of one partition log. Never touches the disk.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

from .format import codecs
from .errors import InvalidConfigError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
# Kafka sets no cap on num.partitions; logfs refuses more than this per topic at mount. Creating one partition
# takes ~2 ms and an fd, so mkdir with 2**31-1 of them would run for days; 10,000 (about 20 s) is far past any
# topic a single broker serves.
MAX_NUM_PARTITIONS = 10_000

# Kafka parses every value as Java does, after String.trim() (which strips every character up to U+0020):
# Long.parseLong / Integer.parseInt (an optional sign, then decimal digits; so "+100" is 100, and "1_000", "1e3",
# "0x10" and " 1 0" are refused), Double.parseDouble, and "true"/"false" in any case. Python's int() and float()
# would accept "1_000", "inf" or non-ASCII digits, so the grammar is checked here first.
_JAVA_WHITESPACE = "".join(map(chr, range(0x21)))
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?")


def _trim(text: str) -> str:
    return text.strip(_JAVA_WHITESPACE)


def parse_long(text: str) -> int:
    """Java's ``Long.parseLong`` of the trimmed text (ASCII digits only)."""
    trimmed = _trim(text)
    if not _INTEGER.fullmatch(trimmed):
        raise InvalidConfigError(f"expected an integer, got {text!r}")
    value = int(trimmed)
    if not -LONG_MAX - 1 <= value <= LONG_MAX:
        raise InvalidConfigError(f"{text!r} does not fit in a 64-bit integer")
    return value


def parse_double(text: str) -> float:
    """Java's ``Double.parseDouble`` of the trimmed text (decimal or hexadecimal, optional f/d suffix)."""
    trimmed = _trim(text)
    if _DECIMAL.fullmatch(trimmed):
        return float(trimmed.rstrip("fFdD").replace("Infinity", "inf"))
    if _HEX_FLOAT.fullmatch(trimmed):
        return float.fromhex(trimmed.rstrip("fFdD"))
    raise InvalidConfigError(f"expected a number, got {text!r}")


def _long(lo: int | None = None, hi: int = LONG_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_long(text)
        if (lo is not None and value < lo) or value > hi:
            raise InvalidConfigError(f"value {value} is out of range [{lo}, {hi}]")
        return value

    return parse


def _share(text: str) -> float:
    value = parse_double(text)
    if not 0.0 < value <= 1.0:  # also refuses NaN
        raise InvalidConfigError(f"value {value} is out of range (0, 1]")
    return value


def _ratio(text: str) -> float:
    value = parse_double(text)
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise InvalidConfigError(f"value {value} is out of range [0, 1]")
    return value


def _double(text: str) -> float:
    value = parse_double(text)
    if value != value:
        raise InvalidConfigError(f"expected a number, got {text!r}")
    return value


def _policy(text: str) -> str:
    # Kafka's LIST type: the trimmed text split at commas (with the whitespace around them); every item must be
    # valid, so "compact,,delete" is refused as Kafka refuses it.
    parts = [p.strip(_JAVA_WHITESPACE) for p in _trim(text).split(",")]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise InvalidConfigError(f"cleanup.policy must be delete, compact or both, got {text!r}")
    return ",".join(sorted(set(parts), key=("compact", "delete").index))


def _text(text: str) -> str:
    if "\n" in text or text == "":
        raise InvalidConfigError("value must be non-empty and may not contain a newline")
    return text


def _free_text(text: str) -> str:
    if "\n" in text:
        raise InvalidConfigError("value may not contain a newline")
    return text.strip()


def _compression_type(text: str) -> str:
    # Kafka's STRING type with ValidString.in(...): trimmed, then one of the names exactly (case matters).
    value = _trim(text)
    if value not in codecs.COMPRESSION_TYPES:
        raise InvalidConfigError(f"expected one of {', '.join(codecs.COMPRESSION_TYPES)}, "
                                 f"got {text!r}")
    return value


def _level(codec: int) -> Callable[[str], int]:
    """A KIP-390 level setting: an INT (Integer.parseInt) in the codec's range (gzip: also -1)."""
    lo, hi = codecs.LEVEL_RANGES[codec]

    def parse(text: str) -> int:
        value = parse_long(text)
        try:
            return codecs.check_level(codec, value)
        except ValueError:
            extra = " or -1" if codec == codecs.GZIP else ""
            raise InvalidConfigError(f"value {value} is out of range [{lo}, {hi}]{extra}") from None

    return parse

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


def _isolation(text: str) -> str:
    # Kafka's consumer setting isolation.level: one of the two names, trimmed, in any case (Kafka's
    # CaseInsensitiveValidString); stored in lower case.
    value = _trim(text).lower()
    if value not in ISOLATION_LEVELS:
        raise InvalidConfigError(f"expected read_committed or read_uncommitted, got {text!r}")
    return value


def _absolute_path(text: str) -> str:
    path = _free_text(text)
    if path and (not path.startswith("/") or "\0" in path or path.endswith("/")):
        raise InvalidConfigError(f"expected an absolute file path, got {text!r}")
    return path


def _bool(text: str) -> bool:
    if _trim(text).lower() not in ("true", "false"):
        raise InvalidConfigError(f"expected true or false, got {text!r}")
    return _trim(text).lower() == "true"


def _only(parse: Callable[[str], object], accepted: Callable[[object], bool], why: str) -> Callable[[str], object]:
    """A broker setting logfs has no mechanism for: accepted only where its value asks for what logfs does."""

    def check(text: str) -> object:
        value = parse(text)
        if not accepted(value):
            raise InvalidConfigError(f"value {show(value)} is not supported: {why}")
        return value

    return check


def show(value: object) -> str:
    """The normalised text of a parsed value, as stored and as read back (Kafka shows the effective value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], object]
    default: str | None


# Topic-level settings: name -> (parser, Kafka default, broker key that supplies the default).
TOPIC_SETTINGS: dict[str, tuple[Setting, str | None]] = {
    s.name: (s, broker)
    for s, broker in [
        (Setting("cleanup.policy", _policy, "delete"), "log.cleanup.policy"),
        (Setting("retention.ms", _long(-1), "604800000"), "log.retention.ms"),
        (Setting("retention.bytes", _long(), "-1"), "log.retention.bytes"),
        (Setting("segment.bytes", _long(14, INT_MAX), "1073741824"), "log.segment.bytes"),
        (Setting("segment.ms", _long(1), "604800000"), "log.roll.ms"),
        (Setting("segment.jitter.ms", _long(0), "0"), "log.roll.jitter.ms"),
        (Setting("segment.index.bytes", _long(12, INT_MAX), "10485760"), "log.index.size.max.bytes"),
        (Setting("index.interval.bytes", _long(0, INT_MAX), "4096"), "log.index.interval.bytes"),
        (Setting("file.delete.delay.ms", _long(0), "60000"), "log.segment.delete.delay.ms"),
        (Setting("delete.retention.ms", _long(0), "86400000"), "log.cleaner.delete.retention.ms"),
        (Setting("min.cleanable.dirty.ratio", _ratio, "0.5"), "log.cleaner.min.cleanable.ratio"),
        (Setting("min.compaction.lag.ms", _long(0), "0"), "log.cleaner.min.compaction.lag.ms"),
        (Setting("max.compaction.lag.ms", _long(1), str(LONG_MAX)), "log.cleaner.max.compaction.lag.ms"),
        (Setting("max.message.bytes", _long(0, INT_MAX), "1048588"), "message.max.bytes"),
        (Setting("flush.messages", _long(1), str(LONG_MAX)), "log.flush.interval.messages"),
        (Setting("flush.ms", _long(0), str(LONG_MAX)), "log.flush.interval.ms"),
        (Setting("remote.storage.enable", _bool, "false"), None),
        (Setting("local.retention.ms", _long(-2), "-2"), "log.local.retention.ms"),
        (Setting("local.retention.bytes", _long(-2), "-2"), "log.local.retention.bytes"),
        # Compression (KIP-390 levels, Kafka 3.8): the broker settings have the topic names.
        (Setting("compression.type", _compression_type, "producer"), "compression.type"),
        (Setting("compression.zstd.level", _level(codecs.ZSTD), "3"), "compression.zstd.level"),
        (Setting("compression.lz4.level", _level(codecs.LZ4), "9"), "compression.lz4.level"),
        (Setting("compression.gzip.level", _level(codecs.GZIP), "-1"), "compression.gzip.level"),
        (Setting("logfs.key.separator", _text, None), "logfs.key.separator"),
        (Setting("logfs.null.marker", _text, None), "logfs.null.marker"),
        (Setting("logfs.writer.headers", _bool, "false"), "logfs.writer.headers"),
        # What a partition file shows of Kafka's transactions, as a consumer of that isolation.level reads them
        # (CONTRACT section 13): read_uncommitted shows the records of aborted transactions too, and on a running
        # broker's directory goes to its log end offset rather than the last stable offset.
        (Setting("logfs.isolation.level", _isolation, "read_committed"), "logfs.isolation.level"),
    ]
}

# Broker-only settings (no topic-level counterpart). logfs's own defaults differ from Kafka's in two, for its
# mechanisms: it loads and recovers the partitions with one thread, before mounting; and with nothing to wait for
# at mount (Kafka waits for its recovery threads and network), background tasks start at once.
BROKER_ONLY: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("num.partitions", _long(1, MAX_NUM_PARTITIONS), "1"),
        # A Kafka cluster as the store (logfs.storage.cluster): the replication factor of a topic mkdir creates
        # there; -1 is the cluster's own default.replication.factor (KIP-464).
        Setting("default.replication.factor", _long(-1, 32767), "-1"),
        Setting("log.retention.check.interval.ms", _long(1), "300000"),
        Setting("log.flush.offset.checkpoint.interval.ms", _long(0, INT_MAX), "60000"),
        Setting("log.flush.start.offset.checkpoint.interval.ms", _long(0, INT_MAX), "60000"),
        Setting("log.flush.scheduler.interval.ms", _long(), str(LONG_MAX)),
        Setting("log.cleaner.backoff.ms", _long(0), "15000"),
        Setting("log.cleaner.dedupe.buffer.size", _long(0), "134217728"),
        Setting("log.cleaner.io.buffer.size", _only(
            _long(0, INT_MAX), lambda v: v == 524288,
            "logfs's cleaner has no I/O buffers to size; remove the setting"), "524288"),
        Setting("log.cleaner.io.buffer.load.factor", _ratio, "0.9"),
        Setting("log.cleaner.io.max.bytes.per.second", _only(
            _double, lambda v: v == float("inf") or v >= 1.7976931348623157e308,
            "logfs does not throttle its cleaner; remove the setting"),
            "1.7976931348623157E308"),
        Setting("log.cleaner.threads", _long(0), "1"),
        # Kafka's throttle of the copy of an intra-broker move (here: a move between log directories, moves.py);
        # Kafka's default, unthrottled.
        Setting("replica.alter.log.dirs.io.max.bytes.per.second", _long(1), str(LONG_MAX)),
        # logfs's own pacing of that copy, whatever the disk: the share of the time the copy may spend copying
        # (and writing back); it sleeps the rest. 1 copies flat out (Kafka's default); both limits apply.
        Setting("logfs.move.disk.share", _share, "0.2"),
        Setting("log.cleaner.enable", _bool, "true"),
        Setting("log.initial.task.delay.ms", _long(0), "0"),
        # Tiered storage (logfs.storage.tiered.manager): the store is chosen by the service (logfs.service.tiering).
        Setting("remote.log.storage.system.enable", _bool, "false"),
        Setting("remote.log.manager.task.interval.ms", _long(1), "30000"),
        Setting("remote.log.manager.thread.pool.size", _long(1), "10"),
        Setting("logfs.remote.s3.bucket", _free_text, ""),
        Setting("logfs.remote.s3.endpoint", _free_text, ""),
        Setting("logfs.remote.s3.prefix", _free_text, ""),
        Setting("logfs.remote.s3.region", _free_text, "us-east-1"),
        Setting("logfs.remote.dir", _free_text, ""),
        Setting("logfs.remote.cache.bytes", _long(0), str(1 << 30)),
        # Follower mounts (logfs.service.follower): where the cache lives (empty: a directory per source under
        # /var/cache/logfs or ~/.cache/logfs), and how often the bucket is looked at for changes.
        Setting("logfs.remote.cache.dir", _free_text, ""),
        Setting("logfs.follow.interval.ms", _long(50, INT_MAX), "5000"),
        # A running Kafka broker's log directory mounted read-only (logfs.storage.broker): logfs's own files (the
        # indexes of the broker's segments, its state) live here; how often the broker's directory is looked at.
        Setting("logfs.cache.dir", _free_text, ""),
        Setting("logfs.broker.poll.ms", _long(10, INT_MAX), "250"),
        # ... whether inotify says which partitions changed (else each look stats every partition), and how often
        # every partition is looked at all the same (a missed or dropped event's bound).
        Setting("logfs.broker.inotify", _bool, "true"),
        Setting("logfs.broker.full.look.ms", _long(100, INT_MAX), "30000"),
        # A Kafka cluster as the store (logfs.storage.cluster.replica): whether the replica catches partitions up
        # with Kafka's Fetch (their batches kept as the broker sent them), and how far (offsets) its consumer may
        # fall behind on a partition before the Fetch catches that one up.
        Setting("logfs.kafka.direct.fetch", _bool, "true"),
        Setting("logfs.kafka.direct.fetch.lag", _long(1), "100000"),
        # Metrics (logfs.service.metrics): Prometheus's text format, written to this file (none when empty).
        Setting("logfs.metrics.file", _absolute_path, ""),
        Setting("logfs.metrics.interval.ms", _long(100, INT_MAX), "10000"),
        # The Spark sink (logfs.storage.publish.transactions): how long a writer's last applied commit is remembered (as
        # Kafka's transactional.id.expiration.ms), and how long an untouched staged file is kept.
        Setting("transactional.id.expiration.ms", _long(1, INT_MAX), "604800000"),
        Setting("logfs.staging.retention.ms", _long(1), "86400000"),
        Setting("num.recovery.threads.per.data.dir", _only(
            _long(1, INT_MAX), lambda v: v == 1,
            "logfs loads and recovers partitions with one thread, before it mounts; only 1 is accepted"), "1"),
    ]
}

# Broker aliases that are converted to the canonical millisecond key (Kafka: ms > minutes > hours).
_UNIT_ALIASES = {
    "log.retention.minutes": ("log.retention.ms", 60_000),
    "log.retention.hours": ("log.retention.ms", 3_600_000),
    "log.roll.hours": ("log.roll.ms", 3_600_000),
    "log.roll.jitter.hours": ("log.roll.jitter.ms", 3_600_000),
}

_BROKER_TO_TOPIC = {broker: name for name, (_, broker) in TOPIC_SETTINGS.items()}


def broker_keys() -> set[str]:
    return set(_BROKER_TO_TOPIC) | set(BROKER_ONLY) | set(_UNIT_ALIASES)


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Validated broker settings: the topic defaults (by topic-level name) plus the broker-only values."""

    topic_defaults: Mapping[str, str | None]
    broker: Mapping[str, object]

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "BrokerConfig":
        """Validate server.properties-style settings; unknown keys raise :class:`InvalidConfigError`."""
        resolved: dict[str, str] = {}
        # Lower-precedence unit aliases first, so the explicit ms key wins.
        ordered = sorted(props.items(), key=lambda kv: 0 if kv[0] in _UNIT_ALIASES else 1)
        for key, value in ordered:
            if key in _UNIT_ALIASES:
                target, factor = _UNIT_ALIASES[key]
                if target in props:
                    continue
                try:
                    resolved[target] = str(_long(None, INT_MAX)(value) * factor)  # an INT in Kafka
                except InvalidConfigError as exc:
                    raise InvalidConfigError(f"{key}: {exc}") from None
            elif key in _BROKER_TO_TOPIC or key in BROKER_ONLY:
                resolved[key] = value
            else:
                raise InvalidConfigError(f"unknown setting {key!r}")
        defaults: dict[str, str | None] = {}
        for name, (setting, broker_key) in TOPIC_SETTINGS.items():
            raw = resolved.get(broker_key) if broker_key else None
            if raw is not None:
                try:
                    raw = show(setting.parse(raw))
                except InvalidConfigError as exc:
                    raise InvalidConfigError(f"{broker_key}: {exc}") from None
            defaults[name] = raw if raw is not None else setting.default
        broker: dict[str, object] = {}
        for name, setting in BROKER_ONLY.items():
            raw = resolved.get(name, setting.default)
            try:
                broker[name] = setting.parse(raw)
            except InvalidConfigError as exc:
                raise InvalidConfigError(f"{name}: {exc}") from None
        if broker["remote.log.storage.system.enable"]:
            if not broker["logfs.remote.s3.bucket"] and not broker["logfs.remote.dir"]:
                raise InvalidConfigError("remote.log.storage.system.enable=true needs logfs.remote.s3.bucket "
                                         "(or logfs.remote.dir for a directory store)")
            if broker["logfs.remote.s3.bucket"] and broker["logfs.remote.dir"]:
                raise InvalidConfigError("logfs.remote.s3.bucket and logfs.remote.dir exclude each other")
        return cls(defaults, broker)

    def get(self, name: str):
        return self.broker[name]


def check_tiering_change(old: "LogConfig", new: "LogConfig", system_enabled: bool) -> None:
    """Kafka's rules for a topic's tiering settings: tiering needs the broker's remote storage system, is not
    for compacted topics, cannot be turned off once on (the tiered data would be lost), and local retention
    may not exceed whole-log retention."""
    if not new.remote_storage_enable:
        if old.remote_storage_enable:
            raise InvalidConfigError("remote.storage.enable cannot be turned off on a tiered topic")
        return
    if not system_enabled:
        raise InvalidConfigError("remote.storage.enable=true needs remote.log.storage.system.enable=true")
    if new.compact:
        raise InvalidConfigError("a compacted topic cannot be tiered (cleanup.policy compact with "
                                 "remote.storage.enable=true)")
    for local, whole, name in ((new.effective_local_retention_ms, new.retention_ms, "ms"),
                               (new.effective_local_retention_bytes, new.retention_bytes, "bytes")):
        if whole >= 0 and (local < 0 or local > whole):
            raise InvalidConfigError(f"local.retention.{name} ({local}) must not exceed retention.{name} ({whole})")


def validate_topic_setting(name: str, value: str) -> str:
    """Check one topic-level override; returns its normalised text (the effective value: "+100" -> "100")."""
    if name not in TOPIC_SETTINGS:
        raise InvalidConfigError(f"unknown topic setting {name!r}")
    setting, _ = TOPIC_SETTINGS[name]
    return show(setting.parse(value))


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """The effective, typed configuration of one partition log (topic overrides over broker defaults)."""

    cleanup_policy: str = "delete"
    retention_ms: int = 604800000
    retention_bytes: int = -1
    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    file_delete_delay_ms: int = 60000
    delete_retention_ms: int = 86400000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    max_message_bytes: int = 1048588
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    compression_type: str = "producer"
    compression_zstd_level: int = 3
    compression_lz4_level: int = 9
    compression_gzip_level: int = -1
    key_separator: bytes | None = None
    null_marker: bytes | None = None
    writer_headers: bool = False  # records appended through the mount carry logfs.pid/uid/comm headers
    isolation_level: str = "read_committed"  # logfs.isolation.level: what the files show of Kafka's transactions

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def read_uncommitted(self) -> bool:
        """Whether records of aborted (and, on a running broker, open) transactions are shown."""
        return self.isolation_level == "read_uncommitted"

    @property
    def codec(self) -> int:
        """The codec of the batches logfs writes for this topic (a Kafka attribute id, :mod:`.codecs`): 0 for
        ``uncompressed``, and for ``producer`` too (lines appended through the mount arrive as text)."""
        return codecs.COMPRESSION_TYPES[self.compression_type] or codecs.NONE

    @property
    def codec_level(self) -> int | None:
        """The level for :attr:`codec` (its ``compression.<codec>.level``); None for snappy and uncompressed."""
        return {codecs.ZSTD: self.compression_zstd_level, codecs.LZ4: self.compression_lz4_level,
                codecs.GZIP: self.compression_gzip_level}.get(self.codec)

    @property
    def effective_local_retention_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @classmethod
    def build(cls, defaults: Mapping[str, str | None], overrides: Mapping[str, str]) -> "LogConfig":
        values = {}
        for name, (setting, _) in TOPIC_SETTINGS.items():
            raw = overrides.get(name, defaults.get(name, setting.default))
            field = name.removeprefix("logfs.").replace(".", "_")
            if raw is None:
                values[field] = None
                continue
            parsed = setting.parse(raw)
            if field in ("key_separator", "null_marker"):
                parsed = raw.encode()
            values[field] = parsed
        return cls(**values)

    @classmethod
    def for_tests(cls, **kw) -> "LogConfig":
        return dataclasses.replace(cls(), **kw)

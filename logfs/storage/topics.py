"""The mount's topics: their settings (overrides of the broker's defaults) and the modes set through the mount,
persisted in the topics file (``DATA_DIR/logfs-topics.json``, which Kafka ignores; a copy in each log directory),
and the listing of topics.

:class:`TopicSettings` is held by the :class:`~logfs.storage.manager.LogManager` (its ``settings``), with the
manager's lock and its logs by topic (a setting applies to them; the file names only what they do not). The file
lists only the topics the partition directories do not already describe (those with overrides, and
those with no partition left), so a plain ``mkdir`` costs no rewrite of it. A setting changed applies to the
topic's logs at once.
"""

from __future__ import annotations

import json
import logging

from . import checkpoints as ckpt
from .config import TOPIC_SETTINGS, BrokerConfig, LogConfig, check_tiering_change, validate_topic_setting
from .errors import InvalidConfigError, NoSuchTopicError
from .local.log import Log
from .names import TOPICS_FILE, collision_key, is_internal_topic, is_legal_topic

log = logging.getLogger(__name__)


class TopicSettings:
    """The topics' overrides (``topics``: topic -> overrides) and modes (``attrs``: "", "topic", "topic/N" -> (mode,
    uid, gid)), persisted in every log directory's topics file, and the topic names that collide in Kafka's metric
    names (``collisions``)."""

    def __init__(self, dirs: list, broker: BrokerConfig, lock, topic_logs: dict[str, dict[int, Log]]):
        self.dirs, self.broker, self.lock = dirs, broker, lock  # (the lock: the manager's)
        self.topic_logs = topic_logs  # the manager's logs by topic: a setting applies to them at once
        self.topics: dict[str, dict[str, str]] = {}
        self.attrs: dict[str, tuple[int, int, int]] = {}
        self.collisions: dict[str, str] = {}  # collision_key -> topic

    def list_topics(self) -> list[str]:
        with self.lock:
            return sorted(self.topics)

    def load(self) -> None:
        """The topics file of every log directory, merged: the first directory's entries win (each directory has
        a copy, so that any one of them describes the topics)."""
        self.topics, self.attrs = {}, {}
        for d in reversed(self.dirs):
            topics, attrs = _read_topics_file(d.file(TOPICS_FILE))
            self.topics.update(topics)
            self.attrs.update(attrs)
        for topic, overrides in self.topics.items():  # drop overrides that no longer validate
            for key in list(overrides):
                try:
                    overrides[key] = validate_topic_setting(key, overrides[key])  # stored by an older parser
                except Exception:
                    log.warning("dropping invalid override %s=%r of topic %s", key, overrides[key], topic)
                    del overrides[key]

    def save(self, keep: str | None = None) -> None:
        """Write the topics file of every online directory (``keep``: a topic written even if its partitions
        describe it, one about to lose its last partition)."""
        # Only topics the partition directories do not already describe: those with overrides, and those
        # with no partition left. A plain new topic then costs no rewrite of this file, so mkdir stays O(1)
        # however many topics exist (it was O(topics): 46 ms per mkdir at 3,000 topics).
        with_partitions = {t for t, logs in self.topic_logs.items() if logs}
        data = {"version": 1, "topics": {t: {"config": c} for t, c in sorted(self.topics.items())
                                         if c or t not in with_partitions or t == keep},
                "attrs": {k: list(v) for k, v in sorted(self.attrs.items())}}
        # No indent=: that switches json to its pure-Python encoder, ~15 us per topic, and every mkdir rewrites
        # the file (46 ms per mkdir at 3,000 topics); the C encoder takes ~0.3 us per topic.
        raw = (json.dumps(data, sort_keys=True) + "\n").encode()
        # Every online directory gets a copy (nothing is written to an offline one); the first directory's error
        # is raised (the manager's own state), the others' are reported to their directory (offline; a full one
        # keeps its older copy).
        for i, d in enumerate(self.dirs):
            if d.offline:
                continue
            try:
                ckpt.atomic_write(d.file(TOPICS_FILE), raw)
            except OSError as exc:
                if i == 0:
                    raise
                d.log_dir.report(exc, f"writing {TOPICS_FILE}")

    def topic_config(self, topic: str) -> LogConfig:
        return LogConfig.build(self.broker.topic_defaults, self.topics.get(topic, {}))

    def remove(self, topic: str) -> None:
        """Forget a deleted topic's overrides and mode, on disk too (unless the file names it and cannot be
        rewritten: then nothing changes, and the error is raised). Under the lock."""
        overrides, attrs = self.topics.pop(topic), self.attrs.pop(topic, None)
        try:
            self.save()
        except OSError:
            if self._file_names(topic):  # on disk it would come back: change nothing
                self.topics[topic] = overrides
                if attrs is not None:
                    self.attrs[topic] = attrs
                raise
            log.warning("%s not rewritten after deleting topic %r (it does not name it)", TOPICS_FILE, topic)
        key = collision_key(topic)
        if self.collisions.get(key) == topic:
            del self.collisions[key]
            for other in self.topics:  # (two colliding topics can both come from an existing store)
                if collision_key(other) == key:
                    self.collisions[key] = other
                    break

    def _file_names(self, topic: str) -> bool:
        """Whether the first directory's topics file names ``topic``."""
        try:
            with open(self.dirs[0].file(TOPICS_FILE), encoding="utf-8") as f:
                return topic in json.load(f).get("topics", {})
        except (OSError, ValueError, AttributeError):
            return False

    def get_attrs(self, name: str) -> tuple[int, int, int] | None:
        """(mode bits, uid, gid) set for ``name`` ("" = root, "topic", "topic/N"), or None for the default."""
        return self.attrs.get(name)

    def set_attrs(self, name: str, mode: int, uid: int, gid: int) -> None:
        with self.lock:
            self.attrs[name] = (mode, uid, gid)
            self.save()

    def replace_overrides(self, topic: str, overrides: dict[str, str]) -> None:
        """Make ``overrides`` the topic's (a follower mount takes its writer's settings as published): invalid
        ones are dropped with a warning (a newer writer may know settings this one does not)."""
        with self.lock:
            clean = {}
            for key, value in overrides.items():
                try:
                    clean[key] = validate_topic_setting(key, value)
                except InvalidConfigError as exc:
                    log.warning("topic %s: ignoring the writer's setting %s=%r: %s", topic, key, value, exc)
            if clean == self.topics.get(topic):
                return
            self._apply_overrides(topic, clean, LogConfig.build(self.broker.topic_defaults, clean))

    def topic_overrides(self, topic: str) -> dict[str, str]:
        with self.lock:
            if topic not in self.topics:
                raise NoSuchTopicError(f"no topic {topic!r}")
            return dict(self.topics[topic])

    def set_topic_config(self, topic: str, key: str, value: str | None) -> None:
        """Set (or, with ``value=None``, remove) a topic override; applies to the topic's logs at once."""
        with self.lock:
            if topic not in self.topics:
                raise NoSuchTopicError(f"no topic {topic!r}")
            overrides = dict(self.topics[topic])
            if value is None:
                if key not in TOPIC_SETTINGS:
                    raise InvalidConfigError(f"unknown topic setting {key!r}")
                overrides.pop(key, None)
            else:
                overrides[key] = validate_topic_setting(key, value)
            new_config = LogConfig.build(self.broker.topic_defaults, overrides)
            check_tiering_change(self.topic_config(topic), new_config,
                                 self.broker.get("remote.log.storage.system.enable"))
            self._apply_overrides(topic, overrides, new_config)

    def _apply_overrides(self, topic: str, overrides: dict[str, str], config: LogConfig) -> None:
        """Make ``overrides`` the topic's, persisted, and ``config`` its logs' at once. Under the lock."""
        self.topics[topic] = overrides
        self.save()
        if config.read_uncommitted:
            # (before the config shows: a view made once it does finds every aborted batch measured)
            for partition_log in list(self.topic_logs.get(topic, {}).values()):
                partition_log.measure_aborted()
        for partition_log in list(self.topic_logs.get(topic, {}).values()):
            with partition_log.lock:
                partition_log.config = config


def _read_topics_file(path: str) -> tuple[dict, dict]:
    """(topic -> overrides, name -> (mode, uid, gid)) of one topics file; empty when missing or corrupt."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        topics = {t: dict(v.get("config", {})) for t, v in data.get("topics", {}).items()}
        attrs = {str(k): tuple(int(x) for x in v) for k, v in data.get("attrs", {}).items() if len(v) == 3}
    except FileNotFoundError:
        return {}, {}
    except (ValueError, AttributeError, TypeError):
        log.warning("%s is corrupt; topic overrides reset to broker defaults", path)
        return {}, {}
    for topic in [t for t in topics if not is_legal_topic(t) or is_internal_topic(t)]:
        log.warning("%s names topic %r, which is not a legal topic name; ignored", path, topic)
        del topics[topic]
    return topics, attrs

"""Which partitions of a logfs (Kafka) data directory a Spark query reads, and the reader it reads them with.

Reading is the storage's read-only reader (:mod:`logfs.storage.local.reader`: no ``.lock``, no writes, no mmap,
``pread`` only, tolerant of segments vanishing under retention and compaction); this module only names
partitions: ``<topic>-<partition>/`` directories (by the storage's one rule for those names), selected by a topic list, a pattern or an assignment, as Spark's Kafka source selects them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..storage import names
from ..storage.local import reader as storage_reader
from ..storage.errors import DataLossError

__all__ = ["DataLossError", "PartitionReader", "TopicPartition", "list_partitions", "topic_partition_of",
           "resolve_topics", "select_partitions"]


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def topic_partition_of(name: str) -> TopicPartition | None:
    """``orders-3`` -> TopicPartition('orders', 3); None for anything else. The rule is the storage's own
    (:func:`logfs.storage.names.parse_partition_dir`), so the source reads exactly the partitions the daemon
    serves."""
    parsed = names.parse_partition_dir(name)
    if parsed is None or names.is_internal_topic(parsed[0]):
        return None  # Kafka's own internal logs (__consumer_offsets, ...) are not topics of the mount either
    return TopicPartition(*parsed)


def list_partitions(data_dir: str) -> dict[TopicPartition, str]:
    """Every ``<topic>-<partition>`` directory of ``data_dir`` -> its path (``data_dir`` may be several log
    directories, ``DIR1,DIR2``, as the daemon takes them: each partition is in one)."""
    out = {}
    for log_dir in data_dir.split(","):
        try:
            names = os.listdir(log_dir)
        except FileNotFoundError:
            raise FileNotFoundError(f"logfs data directory {log_dir!r} does not exist") from None
        for name in names:
            tp = topic_partition_of(name)
            if tp is None:
                continue
            path = os.path.join(log_dir, name)
            if os.path.isdir(path):
                out[tp] = path
    return out


class PartitionReader(storage_reader.PartitionReader):
    """The storage's read-only reader of one partition, named by a TopicPartition."""

    def __init__(self, data_dir: str, tp: TopicPartition, directory: str | None = None):
        super().__init__(data_dir, tp.topic, tp.partition, directory)
        self.tp = tp

    def layout(self) -> tuple[int, int, list[int]]:
        """(log start offset, log end offset, segment base offsets), from one listing: what planning needs."""
        bases = self.segment_bases()
        end = self.log_end_offset(bases)
        return self.log_start_offset(bases, end), end, bases


def resolve_topics(data_dir: str, *, subscribe: list[str] | None = None, pattern: str | None = None,
                   assign: dict[str, list[int]] | None = None) -> dict[TopicPartition, str]:
    """The partitions of ``data_dir`` selected as :func:`select_partitions` does."""
    return select_partitions(list_partitions(data_dir), subscribe=subscribe, pattern=pattern, assign=assign)


def select_partitions(partitions: dict, *, subscribe: list[str] | None = None, pattern: str | None = None,
                      assign: dict[str, list[int]] | None = None) -> dict:
    """The partitions selected by exactly one of a topic list, a regex (full match, as Kafka's
    ``subscribePattern``) or an explicit topic -> partitions assignment (what it names and ``partitions``
    lacks is left out: see ``SourceOptions.bounds``)."""
    if subscribe is not None:
        wanted = set(subscribe)
        return {tp: p for tp, p in partitions.items() if tp.topic in wanted}
    if pattern is not None:
        regex = re.compile(pattern)
        return {tp: p for tp, p in partitions.items() if regex.fullmatch(tp.topic)}
    if assign is not None:
        return {tp: p for tp, p in partitions.items() if tp.partition in set(assign.get(tp.topic, ()))}
    raise ValueError("one of subscribe, pattern or assign is required")


"""The partitions a mount serves: their logs by (topic, partition) and by topic, and each topic's partition
numbers in order. Held by the :class:`~logfs.storage.manager.LogManager` (its ``served``), which adds and drops
logs under its lock; the dictionaries are read without it (a lookup of one key is atomic).
"""

from __future__ import annotations

import bisect

from .local.log import Log


class ServedPartitions:
    """``logs``: (topic, partition) -> Log; ``by_topic``: topic -> partition -> Log; each topic's numbers ascending,
    kept so as logs are added and dropped (a new partition is the next number: an append), so listing them or
    finding the next one sorts nothing. Sorting on every creation made a follower's catch-up of 20,000 partitions
    quadratic (docs/benchmarks.md, issue 33)."""

    def __init__(self):
        self.logs: dict[tuple[str, int], Log] = {}
        self.by_topic: dict[str, dict[int, Log]] = {}  # (no operation scans all the logs)
        self._numbers: dict[str, list[int]] = {}

    def add(self, plog: Log) -> None:
        self.logs[(plog.topic, plog.partition)] = plog
        logs = self.by_topic.setdefault(plog.topic, {})
        if plog.partition not in logs:
            bisect.insort(self._numbers.setdefault(plog.topic, []), plog.partition)  # (the next: at the end)
        logs[plog.partition] = plog

    def drop(self, topic: str, partition: int) -> Log | None:
        plog = self.logs.pop((topic, partition), None)
        logs = self.by_topic.get(topic)
        if logs is not None and logs.pop(partition, None) is not None:
            numbers = self._numbers[topic]
            del numbers[bisect.bisect_left(numbers, partition)]
            if not logs:
                del self.by_topic[topic], self._numbers[topic]
        return plog

    def numbers(self, topic: str) -> list[int]:
        """The topic's partition numbers, ascending (a copy: O(p) for its p partitions)."""
        return list(self._numbers.get(topic, ()))

    def count(self, topic: str) -> int:
        return len(self._numbers.get(topic, ()))

    def next_number(self, topic: str) -> int:
        """One past the topic's highest partition number (0 for none): the number a new partition gets (O(1))."""
        numbers = self._numbers.get(topic)
        return numbers[-1] + 1 if numbers else 0

    def of_topic(self, topic: str) -> list[Log]:
        """The logs of one topic's partitions (O(p); empty for an unknown topic)."""
        return list(self.by_topic.get(topic, {}).values())

"""Retention: which sealed segments a log may delete, by Kafka's three predicates.

- log start offset breach: a segment whose records all lie below the log start offset (always applies);
- ``retention.bytes`` breach: oldest segments while the log exceeds the limit by at least their size;
- ``retention.ms`` breach: segments whose largest timestamp is older than ``now - retention.ms``.

The size and time predicates apply only with ``cleanup.policy`` containing ``delete``. The active segment is
never deleted, so a log always keeps at least one segment (an idle active segment becomes deletable once the
time-based roll seals it). Deletion itself is :meth:`Log.delete_segments` (``.deleted`` rename, later unlink).
"""

from __future__ import annotations

from .log import Log
from .segment import LogSegment


def deletable_segments(log: Log, now_ms: int) -> list[LogSegment]:
    """The prefix of sealed segments that retention would delete now (no side effects)."""
    with log.lock:
        sealed = log.segments.as_list()[:-1]
        config = log.config
        start = log.log_start_offset
        out: list[LogSegment] = []
        excess = (log.size_bytes - config.retention_bytes) if (config.delete and config.retention_bytes >= 0) else -1
        for i, segment in enumerate(sealed):
            next_base = log.segments.as_list()[i + 1].base_offset
            breach = next_base <= start
            if not breach and config.delete:
                if excess >= 0 and excess - segment.size >= 0:
                    breach = True
                elif config.retention_ms >= 0 and now_ms - segment.largest_timestamp > config.retention_ms:
                    breach = True
            if not breach:
                break
            if excess >= 0:
                excess -= segment.size
            out.append(segment)
        return out


def delete_old_segments(log: Log, now_ms: int) -> int:
    """Apply retention to one log; returns the number of segments deleted."""
    with log.lock:
        victims = deletable_segments(log, now_ms)
        if victims:
            log.delete_segments(victims)
        return len(victims)

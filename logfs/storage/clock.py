"""Injected time.

Every part of the engine and the service that needs "now" takes a :class:`Clock`, so roll and retention timers
are tested by moving a :class:`ManualClock` instead of sleeping.
"""

import time


class Clock:
    """Wall-clock milliseconds since the epoch (record timestamps, segment ages)."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that only moves when told to. Not thread-safe; meant for tests."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now_ms = start_ms

    def time_ms(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


SYSTEM_CLOCK = Clock()

"""A seeded random walk over one partition against a simple in-memory model.

Operations: appends (keys, tombstones, empty values), rolls (explicit and by time), reads by offset, time and
view position, truncations, retention (delete_segments, log start offset increments), flushes, checkpoints,
config changes, and reopenings: clean close, crash-like abandon (optionally with garbage appended to the
active segment), and a crash image (a copy of the directory taken while it is open, with preallocated
indexes and stale checkpoints). Bounded: a fixed set of seeds, a fixed number of steps each.
"""

import os
import random
import shutil

import pytest

from logfs.storage import BrokerConfig, LogManager, ManualClock, OffsetOutOfRangeError
from logfs.view.text import live_view
from log_helpers import reopen_clean

STEPS = 300


class Model:
    def __init__(self):
        self.records = []  # (offset, timestamp, key, value), offsets contiguous from 0
        self.start = 0
        self.checkpointed_start = 0

    @property
    def end(self):
        return self.records[-1][0] + 1 if self.records else 0

    def visible(self):
        return [r for r in self.records if r[0] >= self.start]

    def text(self, sep, marker):
        out = []
        for _, _, key, value in self.visible():
            body = value if value is not None else (marker or b"")
            out.append((key + sep if sep and key is not None else b"") + body + b"\n")
        return b"".join(out)


class Walk:
    def __init__(self, seed, tmp_path):
        self.rng = random.Random(seed)
        self.tmp_path = tmp_path
        self.generation = 0
        self.data_dir = str(tmp_path / "data0")
        self.clock = ManualClock()
        rng = self.rng
        self.props = {
            "log.segment.bytes": str(rng.choice([600, 1500, 4000])),
            "log.index.interval.bytes": str(rng.choice([0, 100, 400, 4096])),
            "log.index.size.max.bytes": str(rng.choice([96, 240, 10485760])),
            "log.roll.ms": "60000",
            "log.segment.delete.delay.ms": str(rng.choice([0, 100])),
        }
        self.sep = rng.choice([None, b"=", b" :: "])
        self.marker = rng.choice([None, b"NULL"])
        self.model = Model()
        self.manager = None
        self.open()
        self.manager.create_topic("t")
        if self.sep:
            self.manager.set_topic_config("t", "logfs.key.separator", self.sep.decode())
        if self.marker:
            self.manager.set_topic_config("t", "logfs.null.marker", self.marker.decode())

    def open(self):
        self.manager = LogManager(self.data_dir, BrokerConfig.from_properties(self.props), clock=self.clock)

    @property
    def log(self):
        return self.manager.get_log("t", 0)

    # -- operations -----------------------------------------------------------------------------
    def append(self):
        rng = self.rng
        n = rng.choice([1, 1, 2, 5, 20])
        keys = [None if rng.random() < 0.4 else rng.choice([b"", b"k", b"key=1", b"user-7"]) for _ in range(n)]
        values = [None if rng.random() < 0.1 else bytes(rng.choice(b"xyz= ") for _ in range(rng.choice([0, 3, 40, 150])))
                  for _ in range(n)]
        ts = self.clock.time_ms()
        first, last = self.log.append(values, keys=keys)
        assert (first, last) == (self.model.end, self.model.end + n - 1)
        self.model.records += [(first + i, ts, keys[i], values[i]) for i in range(n)]
        self.clock.advance(rng.choice([0, 1, 7, 100]))

    def roll(self):
        before = len(self.log.segments)
        had_data = self.log.active_segment.size > 0
        new = self.log.roll()
        assert len(self.log.segments) == before + (1 if had_data else 0)
        assert new is self.log.active_segment and new.size == 0 and new.base_offset == self.model.end

    def roll_for_time(self):
        self.clock.advance(60_001)
        active_had_data = self.log.active_segment.size > 0
        assert self.log.maybe_roll_for_time() == active_had_data
        assert self.log.active_segment.size == 0

    def read(self):
        m = self.model
        offset = self.rng.randint(m.start, m.end)
        got = self.log.read(offset, max_bytes=self.rng.choice([1, 500, 1 << 20]))
        expected = [r for r in m.records if r[0] >= offset]
        assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == expected[: len(got)]
        assert bool(got) == bool(expected)
        for bad in (m.start - 1, m.end + 1):
            if bad >= 0 and (bad < m.start or bad > m.end):
                with pytest.raises(OffsetOutOfRangeError):
                    self.log.read(bad)

    def read_time(self):
        visible = self.model.visible()
        if not visible:
            assert self.log.offset_for_timestamp(0) is None
            return
        lo, hi = visible[0][1] - 5, visible[-1][1] + 5
        for target in [self.rng.randint(lo, hi) for _ in range(3)] + [hi]:
            expected = next((r[0] for r in visible if r[1] >= target), None)
            assert self.log.offset_for_timestamp(target) == expected, target

    def view(self):
        expected = self.model.text(self.sep, self.marker)
        view = live_view(self.log)
        assert view.length() == len(expected)
        for _ in range(3):
            pos = self.rng.randrange(len(expected) + 1)
            size = self.rng.choice([1, 50, 5000])
            assert view.read(pos, size) == expected[pos:pos + size]
        visible = self.model.visible()
        if visible:
            offset = self.rng.choice(visible)[0]
            pos = view.position_of(offset)
            prefix = Model()
            prefix.records = [r for r in visible if r[0] < offset]
            assert pos == len(prefix.text(self.sep, self.marker))
            assert view.offset_at(pos) == offset
            line_end = expected.index(b"\n", pos)
            assert view.offset_at(line_end) == offset
        assert view.position_of(self.model.end) == len(expected)

    def truncate(self):
        m = self.model
        offset = self.rng.randint(m.start, m.end)
        self.log.truncate_to(offset)
        m.records = [r for r in m.records if r[0] < offset]
        assert self.log.log_end_offset == offset

    def retention(self):
        segments = self.log.segments.as_list()
        if len(segments) < 2:
            return
        k = self.rng.randint(1, len(segments) - 1)
        self.log.delete_segments(segments[:k])
        self.model.start = max(self.model.start, segments[k].base_offset)
        assert self.log.log_start_offset == self.model.start
        self.clock.advance(self.rng.choice([0, 200]))
        self.log.purge_deleted()

    def advance_start(self):
        m = self.model
        offset = self.rng.randint(m.start, m.end)
        self.log.increment_log_start_offset(offset)
        m.start = offset

    def flush(self):
        self.log.flush()
        assert self.log.recovery_point == self.model.end

    def checkpoint(self):
        self.manager.checkpoint()
        self.model.checkpointed_start = self.log.log_start_offset

    def index_size(self):
        self.manager.set_topic_config("t", "segment.index.bytes", self.rng.choice(["96", "240", "100000"]))

    def reopen_clean(self):
        reopen_clean(self, self.open)

    def _after_crash(self, first_base):
        # A crash forgets log start offset increments made after the last checkpoint; the first segment's
        # base offset still bounds it from below.
        self.model.start = max(self.model.checkpointed_start, first_base)
        self.model.checkpointed_start = self.model.start

    def reopen_abandon(self):
        log = self.log
        first_base, active = log.segments.first.base_offset, log.active_segment.log_path
        self.manager.abandon()
        if self.rng.random() < 0.5:
            with open(active, "ab") as f:
                f.write(bytes(self.rng.randrange(256) for _ in range(self.rng.choice([3, 70, 300]))))
        self.open()
        assert not self.manager.had_clean_shutdown
        self._after_crash(first_base)

    def reopen_crash_image(self):
        first_base = self.log.segments.first.base_offset
        self.generation += 1
        image = str(self.tmp_path / f"data{self.generation}")
        shutil.copytree(self.data_dir, image)
        self.manager.abandon()
        self.data_dir = image
        self.open()
        self._after_crash(first_base)

    # -- invariants -------------------------------------------------------------------------------
    def check(self):
        log, m = self.log, self.model
        assert log.log_end_offset == m.end
        assert log.log_start_offset == m.start
        assert m.start <= log.recovery_point <= m.end
        segments = log.segments.as_list()
        assert segments[0].base_offset <= m.start
        for a, b in zip(segments, segments[1:]):
            assert a.next_offset == b.base_offset
            assert not a.active and a.size <= int(self.props["log.segment.bytes"])
        assert segments[-1].active
        on_disk = sorted(n for n in os.listdir(log.directory) if n.endswith(".log"))
        assert on_disk == [f"{s.base_offset:020d}.log" for s in segments]


OPERATIONS = [
    ("append", 10), ("roll", 1), ("roll_for_time", 1), ("read", 3), ("read_time", 2), ("view", 3),
    ("truncate", 1), ("retention", 1), ("advance_start", 1), ("flush", 1), ("checkpoint", 1),
    ("index_size", 1), ("reopen_clean", 1), ("reopen_abandon", 1), ("reopen_crash_image", 1),
]


@pytest.mark.parametrize("seed", range(24))
def test_random_walk_against_model(tmp_path, seed):
    walk = Walk(seed, tmp_path)
    names = [n for n, w in OPERATIONS for _ in range(w)]
    history = []
    try:
        for _ in range(STEPS):
            op = walk.rng.choice(names)
            history.append(op)
            getattr(walk, op)()
            walk.check()
        walk.view()
        walk.reopen_clean()
        walk.check()
        walk.view()
    except BaseException:
        print("seed", seed, "history", history)
        raise
    finally:
        if not walk.manager.closed:
            walk.manager.close()

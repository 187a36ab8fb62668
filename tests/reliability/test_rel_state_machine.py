"""A hypothesis state machine driving the ENGINE (LogManager, Log, logfs.view.text) against a simple model.

The topic is ``cleanup.policy=compact,delete`` with a key separator and a null marker, tiny segments and a
ManualClock, so every rule applies to one log: appends (keys, keyless records, tombstones, empty values), reads
by offset and by view position (position_of / offset_at), rolls, retention (``delete_old_segments``, predicted
from the model's timestamps and the log's segment bounds), compaction (``cleanable_range`` + ``clean`` with an
OffsetMap of random capacity, predicted record by record: keyless records dropped, superseded values dropped,
tombstones kept until ``delete.retention.ms`` after their first cleaning), flushes, checkpoints, clean remounts,
crashes (``abandon()`` and reopen with ``had_clean_shutdown=False``), crash images (a copy of the directory taken
while open), and crashes in the middle of a compaction swap (a copy taken before the swap, at its commit point,
after the first replaced segment was renamed ``.deleted``, or after the swap went live): the recovered log must
hold, for each group of segments being swapped, exactly the state before or exactly the state after cleaning.

SHORT: 60 examples of up to 40 steps, derandomized (the same ones each run). LONG: 600 examples of 80 steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from logfs.storage import BrokerConfig, LogManager, ManualClock
from logfs.storage.local.log import Log
from logfs.storage.cleaner.compaction import OffsetMap, cleanable_range, clean
from logfs.storage.local.retention import delete_old_segments
from logfs.storage.local.segment import LogSegment
from logfs.view.text import LineFormat, live_view
from log_helpers import reopen_clean

import rel_helpers
from log_helpers import read_all
from rel_helpers import record_stats, scale

RETENTION_MS = 5_000
DELETE_RETENTION_MS = 800
PROPS = {
    "log.segment.bytes": "600",
    "log.index.interval.bytes": "90",
    "log.index.size.max.bytes": "4096",
    "log.roll.ms": str(1 << 40),
    "log.segment.delete.delay.ms": "0",
    "log.cleanup.policy": "compact,delete",
    "log.retention.ms": str(RETENTION_MS),
    "log.cleaner.delete.retention.ms": str(DELETE_RETENTION_MS),
    "logfs.key.separator": "=",
    "logfs.null.marker": "NULL",
}
SEP, MARKER = b"=", b"NULL"
FMT = LineFormat(SEP, MARKER)

keys = st.sampled_from([None, b"a", b"b", b"c", b"d", b""])
values = st.one_of(st.none(), st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"_")))
STATS: dict = {}


def count(what: str, n: int = 1) -> None:
    STATS[what] = STATS.get(what, 0) + n


class Model:
    """The records of the log (offset -> (timestamp, key, value)), its start, and the cleaner's bookkeeping
    the model needs to predict compaction: which batch each record is in, and each batch's delete horizon."""

    def __init__(self):
        self.records: dict[int, tuple[int, bytes | None, bytes | None]] = {}
        self.end = 0
        self.start = 0
        self.checkpointed_start = 0
        self.batch_of: dict[int, int] = {}
        self.horizon: dict[int, int] = {}  # batch base offset -> delete horizon (set at first cleaning)
        self.cleaner_checkpoint: int | None = None

    def visible(self):
        return [(o, *self.records[o]) for o in sorted(self.records) if o >= self.start]

    def text(self) -> bytes:
        return b"".join(FMT.line(k, v) for _, _, k, v in self.visible())

    def copy(self) -> "Model":
        m = Model()
        m.records, m.end, m.start = dict(self.records), self.end, self.start
        m.checkpointed_start, m.batch_of, m.horizon = self.checkpointed_start, dict(self.batch_of), dict(self.horizon)
        m.cleaner_checkpoint = self.cleaner_checkpoint
        return m


def all_records(log):
    return [(r.offset, r.timestamp, r.key, r.value) for r in read_all(log)]


class LogMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="logfs-sm-")
        self.generation = 0
        self.data_dir = os.path.join(self.tmp, "d0")
        self.clock = ManualClock()
        self.model = Model()
        self.manager = LogManager(self.data_dir, BrokerConfig.from_properties(PROPS), clock=self.clock)
        self.manager.create_topic("t", 1)
        count("examples")

    @property
    def log(self):
        return self.manager.get_log("t", 0)

    def teardown(self):
        try:
            if not self.manager.closed:
                self.manager.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _open(self):
        self.manager = LogManager(self.data_dir, BrokerConfig.from_properties(PROPS), clock=self.clock)

    # -- appends, time, rolls ------------------------------------------------------------------------------
    @initialize(bursts=st.lists(st.lists(st.tuples(keys, values), min_size=1, max_size=8), min_size=0, max_size=12))
    def some_data(self, bursts):
        """Start from a few segments' worth of records (most rules need some to act on)."""
        for entries in bursts:
            self.append(entries, 200)

    @rule(bursts=st.lists(st.lists(st.tuples(keys, values), min_size=1, max_size=6), min_size=1, max_size=6),
          advance=st.sampled_from([0, 1, 50, 700]))
    def append_bursts(self, bursts, advance):
        for entries in bursts:
            self.append(entries, advance)

    @rule(entries=st.lists(st.tuples(keys, values), min_size=1, max_size=12), advance=st.sampled_from([0, 1, 50, 700]))
    def append(self, entries, advance):
        log, m = self.log, self.model
        ks = [k for k, _ in entries]
        vs = [v for _, v in entries]
        ts = self.clock.time_ms()
        first, last = log.append(vs, ks)
        assert (first, last) == (m.end, m.end + len(entries) - 1)
        for i, (k, v) in enumerate(entries):
            m.records[first + i] = (ts, k, v)
        m.end = last + 1
        for seg in log.segments.from_offset(first):  # learn the batch bounds (the cleaner keeps them)
            found = seg.translate_offset(first)
            if found is None:
                continue
            for _, header, _, _ in seg.batches_from(found[0]):
                for o in range(max(header.base_offset, first), header.last_offset + 1):
                    m.batch_of[o] = header.base_offset
        assert all(o in m.batch_of for o in range(first, last + 1))
        self.clock.advance(advance)
        count("appends")
        count("records_appended", len(entries))

    @rule(ms=st.sampled_from([1, 100, 900, 3_000, 6_000, DELETE_RETENTION_MS - 1, DELETE_RETENTION_MS,
                              RETENTION_MS, RETENTION_MS + 1]))
    def advance_clock(self, ms):
        self.clock.advance(ms)

    @rule()
    def roll(self):
        had_data = self.log.active_segment.size > 0
        before = len(self.log.segments)
        self.log.roll()
        assert len(self.log.segments) == before + int(had_data)
        count("rolls")

    # -- reads ----------------------------------------------------------------------------------------------
    @rule(data=st.data())
    def read_at_offset(self, data):
        m = self.model
        offset = data.draw(st.integers(min_value=m.start, max_value=m.end))
        got = self.log.read(offset, max_bytes=data.draw(st.sampled_from([1, 300, 1 << 20])))
        expected = [r for r in m.visible() if r[0] >= offset]
        assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == expected[: len(got)]
        assert bool(got) == bool(expected)
        count("reads_by_offset")

    @rule(data=st.data())
    def read_view(self, data):
        text = self.model.text()
        view = live_view(self.log)
        assert view.length() == len(text)
        pos = data.draw(st.integers(min_value=0, max_value=len(text)))
        size = data.draw(st.sampled_from([1, 7, 100, 5000]))
        assert view.read(pos, size) == text[pos:pos + size]
        visible = self.model.visible()
        if visible:
            o, _, k, v = data.draw(st.sampled_from(visible))
            start = len(b"".join(FMT.line(kk, vv) for oo, _, kk, vv in visible if oo < o))
            assert view.position_of(o) == start
            assert view.offset_at(start) == o
            assert view.offset_at(start + len(FMT.line(k, v)) - 1) == o
        assert view.position_of(self.model.end) == len(text)
        count("reads_by_position")

    # -- retention ------------------------------------------------------------------------------------------
    @rule()
    def retention(self):
        log, m = self.log, self.model
        now = self.clock.time_ms()
        segments = log.segments.as_list()
        expected = 0
        for i, seg in enumerate(segments[:-1]):  # predicted from the model's timestamps
            in_seg = [m.records[o][0] for o in m.records if seg.base_offset <= o < seg.next_offset]
            largest = max(in_seg) if in_seg else seg.largest_timestamp
            if segments[i + 1].base_offset <= m.start or now - largest > RETENTION_MS:
                expected += 1
            else:
                break
        deleted = delete_old_segments(log, now)
        assert deleted == expected, (deleted, expected)
        if deleted:
            m.start = max(m.start, log.segments.first.base_offset)
            for o in [o for o in m.records if o < m.start]:
                del m.records[o]
            count("retention_deletions", deleted)

    @rule()
    def retention_at_the_boundary(self):
        """Retention exactly at retention.ms after the oldest sealed segment's last record, then 1 ms later."""
        segments = self.log.segments.as_list()
        if len(segments) >= 2:
            first = segments[0]
            in_seg = [self.model.records[o][0] for o in self.model.records
                      if first.base_offset <= o < first.next_offset]
            due = (max(in_seg) if in_seg else first.largest_timestamp) + RETENTION_MS
            if self.clock.time_ms() <= due:
                self.clock.advance(due - self.clock.time_ms())
                self.retention()
                self.clock.advance(1)
        self.retention()

    # -- compaction -------------------------------------------------------------------------------------------
    def _predict_clean(self, m: Model, first_dirty: int, end: int, cleaned_ranges, now: int) -> Model:
        """The model after a cleaning pass that mapped [first_dirty, end) and rewrote ``cleaned_ranges``."""
        latest: dict[bytes, int] = {}
        for o in sorted(m.records):
            k = m.records[o][1]
            if first_dirty <= o < end and k is not None:
                latest[k] = o
        post = m.copy()
        in_cleaned = lambda o: any(lo <= o < hi for lo, hi in cleaned_ranges)  # noqa: E731
        kept_batches: dict[int, list[int]] = {}
        for o in sorted(m.records):
            if not in_cleaned(o):
                continue
            ts, k, v = m.records[o]
            batch = m.batch_of[o]
            horizon = m.horizon.get(batch)
            drop = False
            if o < end:
                if k is None:
                    drop = True
                elif latest.get(k, -1) > o:
                    drop = True
                elif v is None and horizon is not None and now >= horizon:
                    drop = True
            if drop:
                del post.records[o]
            else:
                kept_batches.setdefault(batch, []).append(o)
        for batch, kept in kept_batches.items():
            if batch not in m.horizon and any(m.records[o][2] is None for o in kept):
                post.horizon[batch] = now + DELETE_RETENTION_MS
        return post

    @rule(capacity=st.sampled_from([1, 2, 3, 1000]))
    def compact(self, capacity):
        log, m = self.log, self.model
        now = self.clock.time_ms()
        target = cleanable_range(log, m.cleaner_checkpoint, now)
        groups = []
        real_swap = Log.replace_segments

        def swap(plog, old, new):
            groups.append((old[0].base_offset, old[-1].next_offset))
            return real_swap(plog, old, new)

        Log.replace_segments = swap
        try:
            result = clean(log, target, OffsetMap(capacity), now)
        finally:
            Log.replace_segments = real_swap
        self.model = self._predict_clean(m, target.first_dirty, result.end_offset, groups, now)
        self.model.cleaner_checkpoint = result.end_offset
        count("compactions")
        count("compaction_groups_swapped", len(groups))
        count("records_compacted_away", len(m.records) - len(self.model.records))

    @rule(capacity=st.sampled_from([1, 3, 1000]), group=st.integers(min_value=0, max_value=2),
          point=st.sampled_from(["before-swap", "after-commit", "after-first-deleted", "after-live"]),
          small_segments=st.lists(st.lists(st.tuples(keys, values), min_size=1, max_size=3), max_size=4))
    def crash_during_compaction_swap(self, capacity, group, point, small_segments):
        for entries in small_segments:  # small sealed segments: cleaned together, as one group of several
            self.append(entries, 10)
            self.roll()
        log, m = self.log, self.model
        now = self.clock.time_ms()
        target = cleanable_range(log, m.cleaner_checkpoint, now)
        groups = []
        image = []
        real_swap, real_change_suffix = Log.replace_segments, LogSegment.change_suffix

        def take_image():
            self.generation += 1
            path = os.path.join(self.tmp, f"d{self.generation}")
            shutil.copytree(self.data_dir, path)
            image.append((path, len(groups) - 1))

        def swap(plog, old, new):
            groups.append((old[0].base_offset, old[-1].next_offset))
            if len(groups) - 1 != group or image:
                return real_swap(plog, old, new)
            if point == "before-swap":
                take_image()
                return real_swap(plog, old, new)
            calls = [0]

            def change_suffix(seg, suffix):
                real_change_suffix(seg, suffix)
                calls[0] += 1
                if not image and ((point == "after-commit" and calls[0] == 1)
                                  or (point == "after-first-deleted" and calls[0] == 2)
                                  or (point == "after-live" and seg is new and suffix == "")):
                    take_image()

            LogSegment.change_suffix = change_suffix
            try:
                return real_swap(plog, old, new)
            finally:
                LogSegment.change_suffix = real_change_suffix

        Log.replace_segments = swap
        try:
            result = clean(log, target, OffsetMap(capacity), now)
        finally:
            Log.replace_segments = real_swap
            LogSegment.change_suffix = real_change_suffix
        post = self._predict_clean(m, target.first_dirty, result.end_offset, groups, now)
        if not image:  # fewer groups than asked for: an ordinary pass
            self.model = post
            self.model.cleaner_checkpoint = result.end_offset
            count("compactions")
            return
        path, crashed_group = image[0]
        swapped = groups[:crashed_group] + ([groups[crashed_group]] if point != "before-swap" else [])
        # Expected: the ranges of the groups swapped at the moment of the image as after cleaning, the rest
        # as before.
        expected = m.copy()
        for lo, hi in swapped:
            for o in [o for o in expected.records if lo <= o < hi]:
                del expected.records[o]
            for o in [o for o in post.records if lo <= o < hi]:
                expected.records[o] = post.records[o]
            for b, h in post.horizon.items():
                if lo <= b < hi:
                    expected.horizon[b] = h
        first_base = log.segments.first.base_offset
        self.manager.abandon()
        self.data_dir = path
        self._open()
        assert not self.manager.had_clean_shutdown
        expected.start = max(m.checkpointed_start, first_base)
        expected.checkpointed_start = expected.start
        for o in [o for o in expected.records if o < expected.start]:
            del expected.records[o]
        self.model = expected
        count("crashes_mid_swap")
        count(f"crashes_mid_swap[{point}]")

    # -- durability, remounts, crashes ---------------------------------------------------------------------------
    @rule()
    def flush(self):
        self.log.flush()
        assert self.log.recovery_point == self.model.end

    @rule()
    def checkpoint(self):
        self.manager.checkpoint()
        self.model.checkpointed_start = self.log.log_start_offset

    @rule()
    def reopen_clean(self):
        reopen_clean(self, self._open)
        count("clean_reopens")

    @rule(image=st.booleans(), garbage=st.binary(max_size=80))
    def crash(self, image, garbage):
        """abandon() + reopen with had_clean_shutdown=False; optionally from a copy of the directory taken
        while the log was open; optionally with garbage after the active segment's last batch (a torn write)."""
        log, m = self.log, self.model
        first_base, active = log.segments.first.base_offset, os.path.basename(log.active_segment.log_path)
        if image:
            self.generation += 1
            path = os.path.join(self.tmp, f"d{self.generation}")
            shutil.copytree(self.data_dir, path)
            self.manager.abandon()
            self.data_dir = path
        else:
            self.manager.abandon()
        if garbage:
            with open(os.path.join(self.data_dir, "t-0", active), "ab") as f:
                f.write(garbage)
        self._open()
        assert not self.manager.had_clean_shutdown
        # A crash forgets log start offset moves made after the last checkpoint (not below the first segment).
        m.start = max(m.checkpointed_start, first_base)
        m.checkpointed_start = m.start
        count("crashes")
        count("crash_images" if image else "crashes_in_place")

    # -- invariants ---------------------------------------------------------------------------------------------
    @invariant()
    def log_matches_model(self):
        log, m = self.log, self.model
        assert log.log_start_offset == m.start
        assert log.log_end_offset == m.end
        assert m.start <= log.recovery_point <= m.end
        assert all_records(log) == m.visible()
        assert live_view(log).length() == len(m.text())
        segments = log.segments.as_list()
        for a, b in zip(segments, segments[1:]):
            assert a.next_offset <= b.base_offset
        assert segments[-1].active and segments[0].base_offset <= m.start
        on_disk = sorted(n for n in os.listdir(log.directory) if n.endswith(".log"))
        assert on_disk == [f"{s.base_offset:020d}.log" for s in segments]


def test_engine_state_machine(profile):
    run = settings(
        max_examples=scale(60, 600),
        stateful_step_count=scale(40, 80),
        deadline=None,
        derandomize=not rel_helpers.LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    STATS.clear()
    LogMachine.TestCase.settings = run
    try:
        LogMachine.TestCase().runTest()
    finally:
        record_stats("state_machine", **STATS)

"""LogSegment, after Kafka's LogSegmentTest."""

import os
import random

import pytest

from logfs.storage.format import records as rec
from logfs.storage.format.lines import LineStats
from logfs.storage.local.lifecycle import random_jitter
from logfs.storage.local.segment import LogSegment, batch_stats

T0 = 1_700_000_000_000


def make_segment(tmp_path, base=0, interval=10, max_index=1000 * 8, created_ms=0, jitter=0, active=True):
    return LogSegment(str(tmp_path), base, index_interval_bytes=interval, max_index_size=max_index,
                      created_ms=created_ms, roll_jitter_ms=jitter, active=active)


def put(segment, offset, values, ts=T0, keys=None, headers=None, timestamps=None):
    batch = rec.build_batch(offset, ts, values, keys, headers=headers, timestamps=timestamps)
    header = rec.parse_header(batch)
    segment.append(batch, header, batch_stats(batch))
    return header


def records_of(segment, start=0):
    out = []
    for _, header, buf, at in segment.batches_from(start):
        out.extend(rec.decode(buf, at, header.size))
    return out


def fill(segment, batches=30, per_batch=3, start_offset=None, ts_step=10):
    """Append ``batches`` batches of ``per_batch`` records; returns [(offset, ts, value)]."""
    offset = segment.base_offset if start_offset is None else start_offset
    model = []
    for b in range(batches):
        values = [f"value-{offset + i}".encode() for i in range(per_batch)]
        ts = [T0 + (offset + i) * ts_step for i in range(per_batch)]
        put(segment, offset, values, timestamps=ts)
        model += [(offset + i, ts[i], values[i]) for i in range(per_batch)]
        offset += per_batch
    return model


def test_append_and_read_back(tmp_path):
    seg = make_segment(tmp_path, base=40)
    model = fill(seg, batches=20, per_batch=4)
    assert seg.next_offset == 40 + 80
    assert seg.size == os.path.getsize(seg.log_path)
    got = records_of(seg)
    assert [(r.offset, r.timestamp, r.value) for r in got] == model
    assert seg.stats == LineStats(80, 0, 0, 0, sum(len(v) for _, _, v in model))
    assert seg.max_timestamp == model[-1][1] and seg.offset_of_max_timestamp == model[-1][0]
    assert seg.offset_index.entries > 5  # the small interval produced a sparse index
    seg.close()


def test_keys_headers_and_tombstones_round_trip(tmp_path):
    seg = make_segment(tmp_path)
    put(seg, 0, [b"a", None, b""], keys=[b"k1", b"k2", None],
        headers=[[("h", b"1")], [], [("x", None), ("y", b"\x00\xff")]])
    got = records_of(seg)
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
        (0, b"k1", b"a", (("h", b"1"),)), (1, b"k2", None, ()), (2, None, b"", (("x", None), ("y", b"\x00\xff"))),
    ]
    assert seg.stats == LineStats(records=3, keyed=2, nulls=1, key_bytes=4, value_bytes=1)
    seg.close()


def test_translate_offset(tmp_path):
    seg = make_segment(tmp_path, base=100, interval=200)
    fill(seg, batches=40, per_batch=5, start_offset=100)
    positions = [(pos, h) for pos, h, _, _ in seg.batches_from(0)]
    max_batch = max(h.size for _, h in positions)
    assert seg.offset_index.entries >= 5
    for offset in range(100, 300):
        found = seg.translate_offset(offset)
        expected = next((p, h) for p, h in positions if h.base_offset <= offset <= h.last_offset)
        assert found is not None
        assert found[0] == expected[0] and found[1] == expected[1]
        # The sparse index bounds the scan to about one index interval.
        start = seg.offset_index.lookup(offset).position
        assert found[0] - start <= seg.index_interval_bytes + max_batch
    assert seg.translate_offset(99) == (0, positions[0][1])  # below the base: first batch
    assert seg.translate_offset(300) is None
    seg.close()


def test_find_offset_by_timestamp(tmp_path):
    seg = make_segment(tmp_path, base=50, interval=100)
    model = fill(seg, batches=30, per_batch=3, start_offset=50, ts_step=10)
    assert seg.time_index.entries > 3
    for target in range(T0 + 490, T0 + 50 * 10 + 900 + 20, 3):
        expected = next((o for o, ts, _ in model if ts >= target), None)
        assert seg.find_offset_by_timestamp(target, 50) == expected, target
    # starting_offset excludes earlier records even if their timestamps qualify.
    assert seg.find_offset_by_timestamp(T0, 77) == 77
    assert seg.find_offset_by_timestamp(T0 + 80 * 10, 60) == 80
    seg.close()


def test_find_offset_by_timestamp_with_out_of_order_timestamps(tmp_path):
    seg = make_segment(tmp_path, interval=0)
    put(seg, 0, [b"a", b"b"], timestamps=[T0 + 50, T0 + 10])
    put(seg, 2, [b"c"], timestamps=[T0 + 30])
    put(seg, 3, [b"d", b"e"], timestamps=[T0 + 100, T0 + 60])
    assert seg.find_offset_by_timestamp(T0 + 50, 0) == 0
    assert seg.find_offset_by_timestamp(T0 + 51, 0) == 3
    assert seg.find_offset_by_timestamp(T0 + 20, 1) == 2
    assert seg.find_offset_by_timestamp(T0 + 101, 0) is None
    assert seg.max_timestamp == T0 + 100 and seg.offset_of_max_timestamp == 4  # shallow: batch last offset
    seg.close()


# -- roll conditions -------------------------------------------------------------------------------------

def test_should_roll_on_size(tmp_path):
    seg = make_segment(tmp_path)
    put(seg, 0, [b"x" * 100])
    size = seg.size
    far = 10**15
    assert not seg.should_roll(50, size + 50, far, 0, 1)  # exactly fits
    assert seg.should_roll(51, size + 50, far, 0, 1)
    assert not seg.should_roll(0, size, far, 0, 1)
    seg.close()


def test_should_roll_on_time_uses_first_batch_timestamp_not_creation(tmp_path):
    seg = make_segment(tmp_path, created_ms=0)
    big = 1 << 30
    assert not seg.should_roll(100, big, 1000, T0 + 10**9, 0)  # an empty segment never rolls for time
    put(seg, 0, [b"a"], ts=T0)
    put(seg, 1, [b"b"], ts=T0 + 900)
    assert not seg.should_roll(100, big, 1000, T0 + 500, 2)  # created_ms=0 is long ago, but irrelevant
    assert not seg.should_roll(100, big, 1000, T0 + 1000, 2)
    assert seg.should_roll(100, big, 1000, T0 + 1001, 2)
    seg.close()


def test_should_roll_on_time_without_records_uses_created_ms(tmp_path):
    seg = make_segment(tmp_path, created_ms=T0)
    put(seg, 0, [b"a"], ts=T0 - 10**6)
    seg.rolling_based_timestamp = None  # e.g. a segment whose first batch could not be read
    assert not seg.should_roll(0, 1 << 30, 1000, T0 + 1000, 1)
    assert seg.should_roll(0, 1 << 30, 1000, T0 + 1001, 1)
    seg.close()


def test_should_roll_on_time_minus_jitter(tmp_path):
    seg = make_segment(tmp_path, jitter=300)
    put(seg, 0, [b"a"], ts=T0)
    assert not seg.should_roll(0, 1 << 30, 1000, T0 + 700, 1)
    assert seg.should_roll(0, 1 << 30, 1000, T0 + 701, 1)
    seg.close()


def test_random_jitter_bounds():
    assert random_jitter(0, 1000) == 0
    values = {random_jitter(50, 1000) for _ in range(500)}
    assert values <= set(range(50)) and len(values) > 10
    assert {random_jitter(10_000, 20) for _ in range(200)} <= set(range(20))  # capped by segment.ms


def test_should_roll_when_offset_index_full(tmp_path):
    # 48 bytes: 6 offset index slots, 4 time index slots. A constant timestamp keeps the time index at one
    # entry, so the offset index is the one that fills.
    seg = make_segment(tmp_path, interval=0, max_index=6 * 8)
    big = 1 << 30
    for i in range(7):
        assert not seg.should_roll(10, big, big, T0, i)
        put(seg, i, [b"v"], ts=T0)
    # First batch gets no entry (nothing appended before it); the next six fill the 6 slots.
    assert seg.offset_index.entries == 6 and seg.offset_index.is_full
    assert seg.time_index.entries == 1 and not seg.time_index.is_full
    assert seg.should_roll(10, big, big, T0, 7)
    seg.close()


def test_should_roll_when_time_index_full(tmp_path):
    seg = make_segment(tmp_path, interval=0, max_index=4 * 12)  # offset index: 6 slots, time index: 4
    big = 1 << 30
    for i in range(4):
        assert not seg.should_roll(10, big, big, T0 + i, i)
        put(seg, i, [b"v"], ts=T0 + i)
    assert seg.time_index.entries == 3 and seg.time_index.is_full and not seg.offset_index.is_full
    assert seg.should_roll(10, big, big, T0 + 5, 4)
    seg.close()


def test_should_roll_on_relative_offset_overflow(tmp_path):
    seg = make_segment(tmp_path, base=1000)
    put(seg, 1000, [b"v"])
    big = 1 << 30
    assert not seg.should_roll(10, big, big, T0, 1000 + 2**31 - 1)
    assert seg.should_roll(10, big, big, T0, 1000 + 2**31)
    seg.close()


# -- truncation ------------------------------------------------------------------------------------------

def check_consistent(seg, model):
    """Everything derivable from the segment agrees with ``model`` [(offset, ts, value)]."""
    assert [(r.offset, r.timestamp, r.value) for r in records_of(seg)] == model
    end = model[-1][0] + 1 if model else seg.base_offset
    assert seg.next_offset == end
    assert seg.size == os.path.getsize(seg.log_path)
    assert seg.stats.records == len(model)
    assert seg.stats.value_bytes == sum(len(v) for _, _, v in model)
    for offset, _, _ in model:
        pos, header = seg.translate_offset(offset)
        assert header.base_offset <= offset <= header.last_offset
    for i in range(seg.offset_index.entries):
        rel, pos = seg.offset_index.entry(i)
        assert seg.base_offset + rel < end and pos < seg.size
    for i in range(seg.time_index.entries):
        assert seg.time_index.base_offset + seg.time_index.entry(i)[1] < end
    if model:
        assert seg.max_timestamp == max(ts for _, ts, _ in model)


@pytest.mark.parametrize("cut", [0, 1, 30, 31, 32, 33, 59, 60, 89, 90, 200])
def test_truncate_to(tmp_path, cut):
    seg = make_segment(tmp_path, interval=50)
    model = fill(seg, batches=30, per_batch=3, ts_step=10)
    seg.truncate_to(cut)
    kept = [m for m in model if m[0] < cut]
    check_consistent(seg, kept)
    # Appending continues right after the cut, and the result is consistent again.
    more = fill(seg, batches=5, per_batch=3, start_offset=seg.next_offset, ts_step=10)
    check_consistent(seg, kept + more)
    seg.close()


def test_truncate_in_the_middle_of_a_batch_keeps_keys_headers_timestamps(tmp_path):
    seg = make_segment(tmp_path, interval=0)
    put(seg, 0, [b"a", b"b"], timestamps=[T0, T0 + 1])
    put(seg, 2, [b"c", None, b"e", b"f"], keys=[b"k2", b"k3", None, b"k5"],
        headers=[[("h", b"2")], [("h", None)], [], [("z", b"")]], timestamps=[T0 + 5, T0 + 9, T0 + 7, T0 + 8])
    removed = seg.truncate_to(4)
    assert removed > 0
    got = records_of(seg)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (0, T0, None, b"a", ()), (1, T0 + 1, None, b"b", ()),
        (2, T0 + 5, b"k2", b"c", (("h", b"2"),)), (3, T0 + 9, b"k3", None, (("h", None),)),
    ]
    assert seg.next_offset == 4
    assert seg.max_timestamp == T0 + 9
    assert seg.stats == LineStats(4, 2, 1, 4, 3)
    for pos, header, buf, at in seg.batches_from(0):
        rec.validate(buf, at)  # the rewritten batch has a valid CRC
    seg.close()


def test_truncate_beyond_end_is_a_no_op(tmp_path):
    seg = make_segment(tmp_path)
    model = fill(seg, batches=3)
    size = seg.size
    assert seg.truncate_to(9) == 0
    assert seg.truncate_to(1000) == 0
    assert seg.size == size
    check_consistent(seg, model)
    seg.close()


# -- recovery --------------------------------------------------------------------------------------------

def reopen(tmp_path, seg, **kw):
    seg.close()
    return make_segment(tmp_path, base=seg.base_offset, interval=seg.index_interval_bytes, **kw)


def garbage_variants():
    valid = rec.build_batch(0, T0, [b"zzz"])
    bad_crc = bytearray(rec.build_batch(90, T0, [b"zzz"]))
    bad_crc[-1] ^= 0xFF
    return {
        "random": bytes(random.Random(7).randrange(256) for _ in range(100)),
        "short": b"\x00\x01\x02",
        "torn_batch": rec.build_batch(90, T0, [b"q" * 50])[:-7],
        "bad_crc": bytes(bad_crc),
        "offset_goes_back": valid,  # a valid batch whose offset is below the segment's next offset
        "bad_magic": rec.build_batch(90, T0, [b"x"])[:16] + b"\x01" + rec.build_batch(90, T0, [b"x"])[17:],
    }


@pytest.mark.parametrize("kind", sorted(garbage_variants()))
def test_recover_truncates_garbage(tmp_path, kind):
    seg = make_segment(tmp_path, interval=50)
    model = fill(seg, batches=30, per_batch=3)
    size = seg.size
    seg.close()
    garbage = garbage_variants()[kind]
    with open(seg.log_path, "ab") as f:
        f.write(garbage)
    again = make_segment(tmp_path, interval=50)
    assert again.size == size + len(garbage)
    assert again.recover() == len(garbage)
    assert again.size == size == os.path.getsize(again.log_path)
    check_consistent(again, model)
    fill(again, batches=1, start_offset=90)
    assert records_of(again)[-1].offset == 92
    again.close()


def test_recover_truncates_at_corruption_in_the_middle(tmp_path):
    seg = make_segment(tmp_path, interval=50)
    model = fill(seg, batches=30, per_batch=3)
    positions = [pos for pos, _, _, _ in seg.batches_from(0)]
    seg.close()
    with open(seg.log_path, "r+b") as f:
        f.seek(positions[10] + 70)  # inside the records of the 11th batch
        byte = f.read(1)
        f.seek(positions[10] + 70)
        f.write(bytes([byte[0] ^ 0x55]))
    again = make_segment(tmp_path, interval=50)
    full_size = again.size
    assert again.recover() == full_size - positions[10]
    assert again.size == positions[10] == os.path.getsize(again.log_path)
    check_consistent(again, model[:30])
    again.close()


def index_files(seg):
    return [seg.offset_index.path, seg.time_index.path, seg.view_index.path]


@pytest.mark.parametrize("damage", ["delete", "zero", "garbage"])
def test_recover_rebuilds_indexes(tmp_path, damage):
    seg = make_segment(tmp_path, base=7, interval=60)
    model = fill(seg, batches=40, per_batch=2, start_offset=7)
    seg.on_become_inactive()
    expected = [
        [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)],
        [seg.time_index.entry(i) for i in range(seg.time_index.entries)],
        [seg.view_index.entry(i) for i in range(seg.view_index.entries)],
    ]
    seg.close()
    for path in index_files(seg):
        if damage == "delete":
            os.unlink(path)
        elif damage == "zero":
            open(path, "wb").close()
        else:
            with open(path, "wb") as f:
                f.write(os.urandom(240))
    again = LogSegment(str(tmp_path), 7, index_interval_bytes=60, max_index_size=1000 * 8, active=False)
    assert again.recover() == 0
    again.on_become_inactive()
    got = [
        [again.offset_index.entry(i) for i in range(again.offset_index.entries)],
        [again.time_index.entry(i) for i in range(again.time_index.entries)],
        [again.view_index.entry(i) for i in range(again.view_index.entries)],
    ]
    assert got == expected
    check_consistent(again, model)
    again.close()


def test_load_state_matches_appended_state(tmp_path):
    seg = make_segment(tmp_path, base=3, interval=40)
    put(seg, 3, [b"a", None], keys=[b"k", None], ts=T0)
    fill(seg, batches=25, per_batch=3, start_offset=5)
    state = (seg.next_offset, seg.stats, seg.max_timestamp, seg.offset_of_max_timestamp, seg.size,
             seg.rolling_based_timestamp)
    for active in (True, False):
        seg.close()
        seg = LogSegment(str(tmp_path), 3, index_interval_bytes=40, max_index_size=1000 * 8, active=active)
        seg.load_state()
        assert (seg.next_offset, seg.stats, seg.max_timestamp, seg.offset_of_max_timestamp, seg.size,
                seg.rolling_based_timestamp) == state
    seg.close()


def test_on_become_inactive_trims_indexes(tmp_path):
    seg = make_segment(tmp_path, base=0, interval=200, max_index=100 * 12)
    fill(seg, batches=20, per_batch=2, ts_step=10)
    offset_entries, time_entries = seg.offset_index.entries, seg.time_index.entries
    assert time_entries > 2
    # The last batch was not indexed, so the time index lags behind the max timestamp until the roll.
    assert seg.time_index.last_entry().timestamp < seg.max_timestamp
    assert os.path.getsize(seg.offset_index.path) == 150 * 8  # preallocated (rounded down to 8)
    assert os.path.getsize(seg.time_index.path) == 100 * 12
    seg.on_become_inactive()
    assert not seg.active
    assert os.path.getsize(seg.offset_index.path) == offset_entries * 8
    # The time index gets its final entry (max timestamp so far) in its reserved slot.
    assert seg.time_index.entries == time_entries + 1
    assert os.path.getsize(seg.time_index.path) == (time_entries + 1) * 12
    assert seg.time_index.last_entry() == (seg.max_timestamp, seg.offset_of_max_timestamp)
    assert seg.max_timestamp == T0 + 39 * 10
    # The view index ends with the segment's totals.
    end = seg.view_index.last()
    assert end.position == seg.size and end.offset == seg.next_offset == 40 and end.stats == seg.stats
    assert os.path.getsize(seg.view_index.path) == seg.view_index.entries * seg.view_index.entry_size
    seg.close()


def test_become_active_again_after_roll_accepts_appends(tmp_path):
    seg = make_segment(tmp_path, interval=30)
    model = fill(seg, batches=10, per_batch=2)
    seg.on_become_inactive()
    seg.become_active(1000 * 8)
    assert os.path.getsize(seg.offset_index.path) == 1000 * 8
    model += fill(seg, batches=10, per_batch=2, start_offset=20)
    check_consistent(seg, model)
    seg.close()
    again = make_segment(tmp_path, interval=30)
    again.load_state()
    check_consistent(again, model)
    again.close()


def test_change_suffix_and_delete_files(tmp_path):
    seg = make_segment(tmp_path, base=12)
    fill(seg, batches=2, start_offset=12)
    seg.change_suffix(".deleted")
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(f"00000000000000000012{s}.deleted" for s in (".log", ".index", ".timeindex", ".viewindex"))
    assert records_of(seg)[0].offset == 12  # the fd survives the rename
    seg.deleted = True
    seg.close()
    seg.delete_files()
    assert os.listdir(tmp_path) == []

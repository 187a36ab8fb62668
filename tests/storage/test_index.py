"""OffsetIndex / TimeIndex / ViewIndex, after Kafka's OffsetIndexTest and TimeIndexTest."""

import bisect
import os
import random

import pytest

from logfs.storage.errors import CorruptRecordError
from logfs.storage.format.lines import LineStats
from logfs.storage.local.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset, ViewIndex
from logfs.storage.format import twins
from logfs.storage.format.lines import LineFormat

BASE = 45


def offset_index(tmp_path, max_entries=30, base=BASE, name="00000000000000000045.index", active=True):
    return OffsetIndex(str(tmp_path / name), base, max_entries * 8, active=active)


def time_index(tmp_path, max_entries=30, base=BASE, name="00000000000000000045.timeindex", active=True):
    return TimeIndex(str(tmp_path / name), base, max_entries * 12, active=active)


def all_entries(index):
    return [index.entry(i) for i in range(index.entries)]


# -- OffsetIndex ---------------------------------------------------------------------------------------

def test_offset_index_random_lookup(tmp_path):
    rng = random.Random(1)
    idx = offset_index(tmp_path, max_entries=64)
    offsets = sorted(rng.sample(range(BASE + 1, BASE + 10_000), 50))
    positions = sorted(rng.sample(range(1, 1_000_000), 50))
    for o, p in zip(offsets, positions):
        idx.append(o, p)
    assert idx.entries == 50
    model = list(zip(offsets, positions))
    for target in [BASE - 3, BASE, *offsets, *(o - 1 for o in offsets), *(o + 1 for o in offsets),
                   *rng.sample(range(BASE, BASE + 11_000), 200)]:
        below = [e for e in model if e[0] <= target]
        expected = OffsetPosition(*below[-1]) if below else OffsetPosition(BASE, 0)
        assert idx.lookup(target) == expected, target
    idx.close()


def test_offset_index_lookup_before_first_entry_returns_base(tmp_path):
    idx = offset_index(tmp_path)
    assert idx.lookup(BASE + 5) == (BASE, 0)  # empty index
    idx.append(BASE + 10, 400)
    assert idx.lookup(BASE + 9) == (BASE, 0)
    assert idx.lookup(0) == (BASE, 0)
    assert idx.lookup(BASE + 10) == (BASE + 10, 400)
    assert idx.lookup(BASE + 1_000) == (BASE + 10, 400)
    assert idx.last_entry() == (BASE + 10, 400)
    idx.close()


@pytest.mark.parametrize("offset,position", [(BASE + 10, 200), (BASE + 9, 300), (BASE + 11, 199)])
def test_offset_index_rejects_non_increasing_appends(tmp_path, offset, position):
    idx = offset_index(tmp_path)
    idx.append(BASE + 10, 200)
    with pytest.raises(CorruptRecordError):
        idx.append(offset, position)
    assert all_entries(idx) == [(10, 200)]
    idx.close()


def test_offset_index_rejects_offsets_outside_the_segment(tmp_path):
    idx = offset_index(tmp_path)
    with pytest.raises(CorruptRecordError):
        idx.append(BASE - 1, 10)
    with pytest.raises(CorruptRecordError):
        idx.append(BASE + 2**31, 10)
    idx.append(BASE + 2**31 - 1, 10)  # the largest relative offset fits
    assert idx.lookup(BASE + 2**31 + 5) == (BASE + 2**31 - 1, 10)
    idx.close()


def test_offset_index_truncate_to(tmp_path):
    # Kafka's truncateTest: entries at every offset 0..9, truncate at various points.
    idx = OffsetIndex(str(tmp_path / "00000000000000000000.index"), 0, 10 * 8)
    for i in range(10):
        idx.append(i, i * 10 + 1)  # first entry (0, 1) is never an all-zero slot
    idx.truncate_to(12)
    assert idx.entries == 10
    idx.truncate_to(10)
    assert idx.entries == 10
    assert idx.lookup(10) == (9, 91)
    idx.truncate_to(9)
    assert idx.entries == 9
    assert idx.lookup(10) == (8, 81)
    idx.truncate_to(5)
    assert idx.entries == 5
    assert idx.lookup(10) == (4, 41)
    assert idx.last_entry() == (4, 41)
    idx.truncate_to(0)
    assert idx.entries == 0
    assert idx.lookup(10) == (0, 0)
    # The truncated index is usable again, from scratch.
    idx.append(3, 7)
    assert idx.lookup(3) == (3, 7)
    idx.close()


def test_offset_index_truncate_zeroes_removed_slots_so_reopen_counts_correctly(tmp_path):
    path = tmp_path / "00000000000000000045.index"
    idx = offset_index(tmp_path, max_entries=20)
    for i in range(10):
        idx.append(BASE + 1 + i, 100 * (i + 1))
    idx.truncate_to(BASE + 5)
    assert idx.entries == 4
    idx.flush()
    idx.close_handler()  # no trim: the file stays preallocated, as after a crash
    assert os.path.getsize(path) == 20 * 8
    again = offset_index(tmp_path, max_entries=20)
    assert again.entries == 4
    assert again.last_entry() == (BASE + 4, 400)
    again.close()


def test_trim_to_valid_size_and_preallocation(tmp_path):
    path = tmp_path / "00000000000000000045.index"
    idx = offset_index(tmp_path, max_entries=30)
    assert os.path.getsize(path) == 30 * 8  # preallocated while active
    for i in range(7):
        idx.append(BASE + 1 + i, 10 * (i + 1))
    idx.trim_to_valid_size()
    assert os.path.getsize(path) == 7 * 8
    assert idx.max_entries == 7 and idx.is_full
    assert idx.lookup(BASE + 100) == (BASE + 7, 70)
    idx.resize(30 * 8)  # becoming active again
    assert os.path.getsize(path) == 30 * 8 and not idx.is_full
    idx.append(BASE + 50, 500)
    assert idx.entries == 8
    idx.close()  # close trims
    assert os.path.getsize(path) == 8 * 8


@pytest.mark.parametrize("trim", [True, False])
@pytest.mark.parametrize("active", [True, False])
def test_reopen_counts_entries(tmp_path, trim, active):
    path = tmp_path / "00000000000000000045.index"
    idx = offset_index(tmp_path, max_entries=50)
    expected = []
    for i in range(17):
        idx.append(BASE + 3 * i + 1, 40 * i + 7)
        expected.append((3 * i + 1, 40 * i + 7))
    idx.flush()
    if trim:
        idx.close()
    else:
        idx.close_handler()  # preallocated file with 33 zero slots at its end
        assert os.path.getsize(path) == 50 * 8
    again = offset_index(tmp_path, max_entries=50, active=active)
    assert again.entries == 17
    assert all_entries(again) == expected
    assert again.lookup(BASE + 1000) == (BASE + 49, 647)
    if active:
        assert again.max_entries == 50 and os.path.getsize(path) == 50 * 8
    again.close()


def _bytes_read() -> int:
    """Bytes this process has read through read()/pread() so far (/proc/self/io ``rchar``)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.parametrize("count", [0, 1, 2, 3, 511, 512, 513, 1000])
def test_reopen_of_a_preallocated_index_reads_a_few_slots_not_the_file(tmp_path, count):
    """A crash leaves the active segment's indexes preallocated (segment.index.bytes, 10 MiB by default): the
    entry count comes from a binary search over single slots, not from reading the file (50 partitions after a
    kill -9 took 3.8 s to mount when each index was read whole)."""
    path = tmp_path / "00000000000000000045.index"
    idx = offset_index(tmp_path, max_entries=(10 << 20) // 8)
    for i in range(count):
        idx.append(BASE + i + 1, 40 * i + 7)
    idx.flush()
    idx.close_handler()
    assert os.path.getsize(path) == 10 << 20
    before = _bytes_read()
    again = offset_index(tmp_path, max_entries=(10 << 20) // 8, active=True)
    assert _bytes_read() - before < 64 << 10
    assert again.entries == count
    if count:
        assert again.lookup(BASE + count) == (BASE + count, 40 * (count - 1) + 7)
    again.close()


def test_reopen_with_partial_trailing_entry(tmp_path):
    path = tmp_path / "00000000000000000045.index"
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 10)
    idx.append(BASE + 2, 20)
    idx.close()
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn write of a third entry
    again = offset_index(tmp_path, active=False)
    assert again.entries == 2
    assert again.last_entry() == (BASE + 2, 20)
    again.close()
    assert os.path.getsize(path) == 16


def test_reopen_active_index_larger_than_new_max_size_keeps_entries(tmp_path):
    # segment.index.bytes lowered between runs: the entries already there must survive and read back.
    idx = offset_index(tmp_path, max_entries=40)
    for i in range(30):
        idx.append(BASE + i + 1, 10 * (i + 1))
    idx.close()
    again = offset_index(tmp_path, max_entries=10, active=True)
    assert again.entries == 30
    assert again.lookup(BASE + 30) == (BASE + 30, 300)
    assert again.is_full
    again.sanity_check(10_000)
    again.close()


def test_offset_index_sanity_check(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 10)
    idx.append(BASE + 2, 20)
    idx.sanity_check(21)
    with pytest.raises(CorruptRecordError):
        idx.sanity_check(20)  # an entry points at or past the end of the log
    idx.close()
    raw = bytearray((tmp_path / "00000000000000000045.index").read_bytes())
    raw[8:16] = (0).to_bytes(4, "big") + (30).to_bytes(4, "big")  # offset goes backwards
    (tmp_path / "00000000000000000045.index").write_bytes(bytes(raw))
    again = offset_index(tmp_path, active=False)
    with pytest.raises(CorruptRecordError):
        again.sanity_check(1000)
    again.close()


# -- TimeIndex -----------------------------------------------------------------------------------------

def test_time_index_lookup(tmp_path):
    idx = time_index(tmp_path)
    assert idx.lookup(100) == TimestampOffset(-1, BASE)
    for i in range(1, 20):
        idx.maybe_append(100 + 10 * i, BASE + 2 * i)
    assert idx.entries == 19
    assert idx.lookup(99) == (-1, BASE)  # before the first entry
    assert idx.lookup(110) == (110, BASE + 2)
    assert idx.lookup(115) == (110, BASE + 2)
    assert idx.lookup(119) == (110, BASE + 2)
    assert idx.lookup(120) == (120, BASE + 4)
    assert idx.lookup(10_000) == (290, BASE + 38)
    assert idx.last_entry() == (290, BASE + 38)
    idx.close()


def test_time_index_ignores_non_increasing_timestamps_and_rejects_lower_offsets(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(1000, BASE + 10)
    idx.maybe_append(1000, BASE + 12)  # same timestamp: nothing new
    idx.maybe_append(900, BASE + 13)  # smaller timestamp: nothing new
    assert all_entries(idx) == [(1000, 10)]
    with pytest.raises(CorruptRecordError):
        idx.maybe_append(2000, BASE + 9)  # offset below the last entry
    idx.maybe_append(2000, BASE + 10)  # same offset, larger timestamp: replaces, no duplicate
    assert all_entries(idx) == [(2000, 10)]
    idx.maybe_append(3000, BASE + 11)
    assert all_entries(idx) == [(2000, 10), (3000, 11)]
    idx.close()


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_a_full_index_refuses_appends(tmp_path, kind):
    """An index of 5 entries is full at 5; a time index at 4, its last slot kept for the roll-time entry, which
    ``skip_full_check`` writes there."""
    idx = (offset_index if kind == "offset" else time_index)(tmp_path, max_entries=5)
    usable = 5 if kind == "offset" else 4

    def add(i: int) -> None:
        if kind == "offset":
            idx.append(BASE + 1 + i, 10 * (i + 1))
        else:
            idx.maybe_append(100 + i, BASE + i)

    assert idx.max_entries == 5
    for i in range(usable):
        assert not idx.is_full
        add(i)
    assert idx.is_full
    with pytest.raises(CorruptRecordError):
        add(100)
    assert idx.entries == usable
    if kind == "time":
        idx.maybe_append(200, BASE + 10, skip_full_check=True)
        assert idx.entries == 5
        assert idx.last_entry() == (200, BASE + 10)
        assert idx.lookup(1000) == (200, BASE + 10)
    idx.close()


def test_time_index_truncate_to(tmp_path):
    idx = time_index(tmp_path)
    for i in range(10):
        idx.maybe_append(1000 + i, BASE + 2 * i)  # offsets BASE, BASE+2, ..., BASE+18
    idx.truncate_to(BASE + 19)
    assert idx.entries == 10
    idx.truncate_to(BASE + 18)
    assert idx.entries == 9
    assert idx.last_entry() == (1008, BASE + 16)
    idx.truncate_to(BASE + 7)
    assert idx.entries == 4
    assert idx.last_entry() == (1003, BASE + 6)
    assert idx.lookup(5000) == (1003, BASE + 6)
    idx.truncate_to(BASE)
    assert idx.entries == 0
    assert idx.lookup(5000) == (-1, BASE)
    idx.maybe_append(10, BASE + 1)  # usable again
    assert idx.lookup(10) == (10, BASE + 1)
    idx.close()


@pytest.mark.parametrize("trim", [True, False])
def test_time_index_reopen_and_trim(tmp_path, trim):
    path = tmp_path / "00000000000000000045.timeindex"
    idx = time_index(tmp_path, max_entries=40)
    assert os.path.getsize(path) == 40 * 12
    for i in range(12):
        idx.maybe_append(1_700_000_000_000 + i, BASE + i)
    idx.flush()
    if trim:
        idx.close()
        assert os.path.getsize(path) == 12 * 12
    else:
        idx.close_handler()
        assert os.path.getsize(path) == 40 * 12
    again = time_index(tmp_path, max_entries=40)
    assert again.entries == 12
    assert again.last_entry() == (1_700_000_000_011, BASE + 11)
    assert again.lookup(1_700_000_000_005) == (1_700_000_000_005, BASE + 5)
    again.trim_to_valid_size()
    assert os.path.getsize(path) == 12 * 12
    again.close()


def test_time_index_sanity_check(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(100, BASE + 1)
    idx.maybe_append(200, BASE + 2)
    idx.sanity_check(0)
    idx.close()
    path = tmp_path / "00000000000000000045.timeindex"
    raw = bytearray(path.read_bytes())
    raw[12:20] = (50).to_bytes(8, "big")  # timestamp goes backwards
    path.write_bytes(bytes(raw))
    again = time_index(tmp_path, active=False)
    with pytest.raises(CorruptRecordError):
        again.sanity_check(0)
    again.close()


# -- ViewIndex -----------------------------------------------------------------------------------------

def test_view_index_floors_and_truncation(tmp_path):
    idx = ViewIndex(str(tmp_path / "00000000000000000045.viewindex"), BASE, 4 * ViewIndex.ENTRY.size)
    stats = [LineStats(10 * i, i, 0, 3 * i, 50 * i) for i in range(1, 8)]
    for i, s in enumerate(stats):  # grows past its initial size
        idx.append(BASE + 10 * (i + 1), 500 * (i + 1), s)
    assert idx.entries == 7
    plain = LineFormat()
    length = plain.length
    assert idx.floor_by_view(length(stats[0]) - 1, plain) is None
    assert idx.floor_by_view(length(stats[2]), plain).stats == stats[2]
    assert idx.floor_by_view(length(stats[2]) + 1, plain).stats == stats[2]
    assert idx.floor_by_offset(BASE + 9) is None
    assert idx.floor_by_offset(BASE + 35).offset == BASE + 30
    assert idx.floor_by_position(1499).position == 1000
    assert idx.floor_by_position(1500).position == 1500
    with pytest.raises(CorruptRecordError):
        idx.append(BASE + 100, 3500, stats[-1])  # position must increase
    idx.truncate_to_position(1500)
    assert idx.entries == 2 and idx.last().position == 1000
    idx.close()
    again = ViewIndex(str(tmp_path / "00000000000000000045.viewindex"), BASE, 4 * ViewIndex.ENTRY.size,
                      active=False)
    assert again.entries == 2 and again.last() == (BASE + 20, 1000, stats[1])
    again.close()


@pytest.mark.parametrize("fmt", [LineFormat(), LineFormat(separator=b"\t", null_marker=b"-")])
def test_view_index_ends_after_agree_with_a_search_of_every_entry(tmp_path, fmt):
    """What a tiered or compressed read needs cached (SegmentView._end_after): for any view byte, the position of
    the first entry whose view length before it is past that byte, from a window of the entries ahead. Every
    target from before the first entry to past the last agrees with a scan of all entries, for windows of every
    size, including entries with equal lengths (batches without lines) and a format with keys and nulls."""
    idx = ViewIndex(str(tmp_path / "00000000000000000045.viewindex"), BASE, 64 * ViewIndex.ENTRY.size)
    rng = random.Random(7)
    stats, records = [], 0
    for i in range(40):
        records += rng.choice((0, 1, 5))  # (0: an entry after a batch that shows no line)
        stats.append(LineStats(records, records // 2, records // 5, 3 * records, 40 * records))
        idx.append(BASE + 10 * (i + 1), 500 * (i + 1), stats[-1])
    lengths = [fmt.length(s) for s in stats]
    for count in (1, 2, 16, 64):
        for target in range(-1, lengths[-1] + 3):
            expected = next((500 * (k + 1) for k, n in enumerate(lengths) if n > target), None)
            found = idx.ends_after_view(max(target, 0), fmt, count)
            if found is None:
                assert expected is None or target < 0, (count, target)
                continue
            low, after, positions = found
            assert low <= max(target, 0) < after[-1] and after == sorted(after), (count, target)
            assert positions[bisect.bisect_right(after, max(target, 0))] == expected, (count, target)
    idx.close()


@pytest.mark.parametrize("kind", ["offset", "time", "view"])
def test_sanity_check_in_c_agrees_with_the_python_checks(tmp_path, monkeypatch, kind):
    """Loading a store checks every entry of every index in one C pass (_speedups.index_ok); built without a
    compiler, the Python column checks do it. Both accept and refuse exactly the same entries: valid indexes,
    and indexes with bytes of one entry overwritten at random (garbage, zeroes, swapped entries)."""
    from logfs.storage.local import index as index_module

    rnd = random.Random(kind)
    path = str(tmp_path / f"00000000000000000045.{kind}")
    n = 40
    if kind == "offset":
        idx = OffsetIndex(path, BASE, n * 8)
        for i in range(n - 1):
            idx.append(BASE + 3 * i + 1, 100 * i + 7)
        log_size = 100 * n
    elif kind == "time":
        idx = TimeIndex(path, BASE, n * 12)
        for i in range(n - 2):
            idx.maybe_append(1_700_000_000_000 + 10 * i, BASE + 3 * i + 1)
        log_size = 100 * n
    else:
        idx = ViewIndex(path, BASE, n * ViewIndex.ENTRY.size)
        for i in range(n - 1):
            idx.append(BASE + 3 * i + 1, 100 * i + 7, LineStats(2 * i, i, i // 2, 5 * i, 20 * i))
        log_size = 100 * n

    def verdicts(size):
        c = python = None
        try:
            idx.sanity_check(size)
            c = True
        except CorruptRecordError:
            c = False
        monkeypatch.setattr(index_module, "_speedups", None)
        try:
            idx.sanity_check(size)
            python = True
        except CorruptRecordError:
            python = False
        finally:
            monkeypatch.undo()
        return c, python

    assert index_module._speedups is not None
    assert verdicts(log_size) == (True, True)
    size = idx.entry_size
    mm = _FileBytes(idx._fd)
    pristine = bytes(mm[: idx.entries * size])
    outcomes = set()
    for _ in range(300):
        mm[: len(pristine)] = pristine
        at = rnd.randrange(idx.entries) * size
        how = rnd.randrange(4)
        if how == 0:  # garbage bytes somewhere in one entry
            k = rnd.randrange(1, size + 1)
            start = at + rnd.randrange(size - k + 1)
            mm[start : start + k] = rnd.randbytes(k)
        elif how == 1:  # one entry zeroed
            mm[at : at + size] = bytes(size)
        elif how == 2 and idx.entries > 1:  # two neighbours swapped
            j = at // size
            j = j - 1 if j else j + 1
            a, b = mm[at : at + size], mm[j * size : (j + 1) * size]
            mm[at : at + size], mm[j * size : (j + 1) * size] = b, a
        else:  # one field nudged by a small amount
            field = rnd.randrange(len(idx.ENTRY.format) - 1)
            values = list(idx.ENTRY.unpack(mm[at : at + size]))
            values[field] = max(0, values[field] + rnd.choice([-1, 1, -1000, 1000]))
            mm[at : at + size] = idx.ENTRY.pack(*values)
        c, python = verdicts(rnd.choice([log_size, 7, 100 * (n - 2) + 7, 100 * (n - 2) + 8]))
        assert c == python
        outcomes.add(c)
    assert outcomes == {True, False}  # both kinds of verdict were exercised
    mm[: len(pristine)] = pristine
    idx.close()


class _FileBytes:
    """An index file's bytes by slice, read and written with pread/pwrite (indexes are not memory-mapped)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __getitem__(self, s: slice) -> bytes:
        return os.pread(self.fd, s.stop - (s.start or 0), s.start or 0)

    def __setitem__(self, s: slice, data: bytes) -> None:
        assert len(data) == s.stop - (s.start or 0)
        os.pwrite(self.fd, data, s.start or 0)


def test_index_floor_in_c_matches_the_python_search(tmp_path):
    """_speedups.index_floor (the search by pread) and its Python twin give the same slot for every kind of index,
    every key field, below, inside, between and above the entries."""
    from logfs.storage.local import index as index_module

    assert index_module._speedups is not None
    rnd = random.Random(5)
    offsets = OffsetIndex(str(tmp_path / "0.index"), BASE, 1 << 16)
    times = TimeIndex(str(tmp_path / "0.timeindex"), BASE, 1 << 16)
    views = ViewIndex(str(tmp_path / "0.viewindex"), BASE, 1 << 16)
    stats = LineStats()
    offset, position, ts = BASE, 0, 1_000
    for _ in range(700):
        offset += rnd.randrange(1, 40)
        position += rnd.randrange(1, 5000)
        ts += rnd.randrange(0, 30)
        offsets.append(offset, position)
        times.maybe_append(ts, offset)
        views.append(offset, position, stats)
        n = rnd.randrange(1, 40)
        keyed, nulls = rnd.randrange(n + 1), rnd.randrange(n + 1)
        stats = stats + LineStats(n, keyed, nulls, rnd.randrange(100), rnd.randrange(10_000))
    fmts = [LineFormat(), LineFormat(b"=", None), LineFormat(None, b"NULL"), LineFormat(b"::", b"")]
    cases = [
        (offsets, 0, lambda e: e[0], lambda: rnd.randrange(-5, offset - BASE + 5), None),
        (times, 0, lambda e: e[0], lambda: rnd.randrange(900, ts + 50), None),
        (times, 1, lambda e: e[1], lambda: rnd.randrange(-5, offset - BASE + 5), None),
        (views, 0, lambda e: e[0], lambda: rnd.randrange(-5, offset - BASE + 5), None),
        (views, 1, lambda e: e[1], lambda: rnd.randrange(-5, position + 5), None),
    ] + [(views, 2, lambda e, f=f: f.length(LineStats(*e[2:])), lambda f=f: rnd.randrange(-5, f.length(stats) + 5), f)
         for f in fmts]
    for index, field, key, target, fmt in cases:
        sep = len(fmt.separator) if fmt and fmt.separator else 0
        marker = len(fmt.null_marker) if fmt and fmt.null_marker else 0
        keys = [key(index.entry(i)) for i in range(index.entries)]  # the model: a bisect of the entries' keys
        for _ in range(300):
            t = target()
            twin = twins.index_floor(index._fd, index.KIND, field, index.entries, t, sep, marker)
            assert index._search(t, field, sep, marker) == twin == bisect.bisect_right(keys, t) - 1, (field, fmt, t)
    for index in (offsets, times, views):
        index.close()

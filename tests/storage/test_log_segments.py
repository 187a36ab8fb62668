"""LogSegments: the ordered base offset -> segment map (Kafka's LogSegmentsTest)."""

import pytest

from logfs.storage.local.segments import LogSegments
from logfs.storage.local.segment import LogSegment


@pytest.fixture
def make(tmp_path):
    made = []

    def make(base):
        seg = LogSegment(str(tmp_path), base, index_interval_bytes=4096, max_index_size=1024)
        made.append(seg)
        return seg

    yield make
    for seg in made:
        seg.close()


def bases(segments):
    return [s.base_offset for s in segments]


def test_empty(make):
    segs = LogSegments()
    assert len(segs) == 0
    assert segs.floor(10) is None and segs.higher(10) is None
    assert segs.from_offset(0) == []
    assert list(segs) == []


def test_floor_higher_from_offset(make):
    a, b, c = make(0), make(10), make(20)
    segs = LogSegments([c, a, b])  # any order in, sorted out
    assert bases(segs) == [0, 10, 20]
    assert segs.first is a and segs.active is c
    assert segs.floor(-1) is None
    assert segs.floor(0) is a and segs.floor(9) is a
    assert segs.floor(10) is b and segs.floor(19) is b
    assert segs.floor(20) is c and segs.floor(10**9) is c
    assert segs.higher(-1) is a
    assert segs.higher(0) is b and segs.higher(9) is b
    assert segs.higher(10) is c
    assert segs.higher(20) is None
    assert bases(segs.from_offset(-5)) == [0, 10, 20]
    assert bases(segs.from_offset(0)) == [0, 10, 20]
    assert bases(segs.from_offset(15)) == [10, 20]
    assert bases(segs.from_offset(20)) == [20]
    assert bases(segs.from_offset(10**9)) == [20]


def test_add_remove(make):
    segs = LogSegments()
    a, c = make(0), make(20)
    segs.add(c)
    segs.add(a)
    b = make(10)
    segs.add(b)
    assert bases(segs) == [0, 10, 20] and len(segs) == 3
    b2 = make(10)  # same base: replaces
    segs.add(b2)
    assert len(segs) == 3 and segs.floor(15) is b2
    segs.remove(b)  # not the member any more: no-op
    assert len(segs) == 3 and segs.floor(15) is b2
    segs.remove(b2)
    assert bases(segs) == [0, 20]
    assert segs.floor(15) is a and segs.higher(0) is c
    segs.remove(make(5))  # never added: no-op
    assert bases(segs) == [0, 20]
    segs.remove(a)
    segs.remove(c)
    assert len(segs) == 0 and segs.floor(100) is None


def test_iteration_is_a_snapshot(make):
    segs = LogSegments([make(0), make(10)])
    seen = []
    for s in segs:
        seen.append(s.base_offset)
        if s.base_offset == 0:
            segs.add(make(20))
    assert seen == [0, 10]
    listed = segs.as_list()
    segs.remove(segs.first)
    assert bases(listed) == [0, 10, 20] and bases(segs) == [10, 20]

"""logfs.storage.format.lines: the one home of the line format (record -> line, line -> record) and of the rules for
which lines a topic accepts (one size rule, keys on compacted topics)."""

from __future__ import annotations

import itertools

import pytest

from logfs.storage import InvalidRecordError, LogConfig, RecordTooLargeError
from logfs.storage.format import lines
from logfs.storage.format.lines import LineFormat

FORMATS = [LineFormat(), LineFormat(b"=", None), LineFormat(None, b"NULL"), LineFormat(b"::", b"<nil>"),
           LineFormat(None, b"")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_parse_reads_back_what_line_renders(fmt):
    records = [(None, b"plain"), (None, b""), (b"k", b"v"), (b"", b"empty key"), (b"k", b""), (b"k", None),
               (None, None), (b"k", b"v=w::x")]
    for key, value in records:
        if key is not None and not fmt.separator:
            continue  # without a separator a key is not shown, so it cannot come back
        if value is None and fmt.null_marker is None or value is not None and value == fmt.null_marker:
            continue  # a tombstone shows as an empty value; a value equal to the marker reads back as one
        if key is None and fmt.separator and value is not None and fmt.separator in value:
            continue  # a keyless value holding the separator reads back as keyed, as in the README
        line = fmt.line(key, value)
        assert line.endswith(b"\n")
        assert fmt.parse(line[:-1]) == (key, value), (fmt, key, value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_parse_lines_is_parse_of_each_line(fmt):
    text = [b"a=b", b"NULL", b"", b"k::<nil>", b"::", b"x==y", b"<nil>"]
    values, keys = fmt.parse_lines(text)
    parsed = [fmt.parse(t) for t in text]
    assert values == [v for _, v in parsed]
    assert keys == ([k for k, _ in parsed] if fmt.separator else None)


def test_record_size_is_key_plus_value():
    fmt = LineFormat(b"::", b"NULL")
    assert fmt.record_size(b"key::value") == 8
    assert fmt.record_size(b"key::NULL") == 3  # a tombstone's value counts 0
    assert fmt.record_size(b"no separator") == 12
    assert LineFormat().record_size(b"k::v") == 4


@pytest.mark.parametrize("fmt", [LineFormat(), LineFormat(b"=", None), LineFormat(None, b"NUL"),
                                 LineFormat(b"==", b"NUL"), LineFormat(b"=N", b"N")])
def test_least_record_size_is_the_least_over_every_ending(fmt):
    """A partial line is refused as soon as, and only once, no ending of it can fit: the bound is exact."""
    alphabet = b"a=NUL"
    endings = [b""] + [bytes(t) for n in range(1, 4) for t in itertools.product(alphabet, repeat=n)]
    for n in range(0, 5):
        for head in itertools.product(alphabet, repeat=n):
            head = bytes(head)
            least = min(fmt.record_size(head + tail) for tail in endings)
            assert fmt.least_record_size(head) == least, (fmt, head)


def test_one_limit_for_every_producer():
    config = LogConfig.for_tests(max_message_bytes=100, segment_bytes=1 << 20)
    assert lines.max_record_size(config) == 100
    lines.check_record_size(config, 100)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        lines.check_record_size(config, 101)
    small = LogConfig.for_tests(max_message_bytes=1 << 20, segment_bytes=1000)
    assert lines.max_record_size(small) < 1000
    lines.check_record_size(small, lines.max_record_size(small))
    with pytest.raises(RecordTooLargeError, match="segment.bytes"):
        lines.check_record_size(small, lines.max_record_size(small) + 1)


def test_check_line_and_check_partial():
    keyed = LogConfig.for_tests(max_message_bytes=5, key_separator=b"=", cleanup_policy="compact")
    lines.check_line(keyed, b"k=1234")
    with pytest.raises(RecordTooLargeError):
        lines.check_line(keyed, b"k=12345")
    with pytest.raises(InvalidRecordError):
        lines.check_line(keyed, b"nokey")
    lines.check_partial(keyed, b"nokey")  # the separator may still come
    with pytest.raises(RecordTooLargeError):
        lines.check_partial(keyed, b"k=12345")
    unkeyed = LogConfig.for_tests(cleanup_policy="compact,delete")
    with pytest.raises(InvalidRecordError):
        lines.check_partial(unkeyed, b"x")  # no separator: no line can have a key
    lines.check_partial(LogConfig.for_tests(), b"x")


def test_append_lines_refuses_keyless_lines_on_a_compacted_topic(make_log):
    """The engine applies the key rule itself (any producer of lines), all or nothing."""
    plain = make_log(cleanup_policy="compact")
    with pytest.raises(InvalidRecordError):
        plain.append_lines(b"", b"a\n", 2)
    keyed = make_log(cleanup_policy="compact", key_separator=b"=", null_marker=b"NULL")
    with pytest.raises(InvalidRecordError):
        keyed.append_lines(b"k", b"=v\nnokey\n", 9)
    assert keyed.log_end_offset == 0
    assert keyed.append_lines(b"k", b"=v\nj=NULL\n", 10) == (0, 1)
    assert [(r.key, r.value) for r in keyed.read(0)] == [(b"k", b"v"), (b"j", None)]
    # Log.append stays the raw API (records from other writers, tests): it does not apply the line rules.
    assert keyed.append([b"raw"]) == (2, 2)

"""The line format of a partition file, in both directions, and which lines a topic accepts.

Record -> line (reading): ``[key + separator] + (value | null marker | "") + "\\n"``, the separator shown only
for a record with a key. Line -> record (appending): the text before the first separator is the key (a line
without it has none); a value equal to the null marker is a tombstone. The separator and marker are the topic's
``logfs.key.separator`` and ``logfs.null.marker``.

Which lines are refused, for every producer of lines (the handle's writes and the log's ``append_lines``):

- a record over the size limit: what counts is the record's key bytes plus its value bytes (a tombstone's
  value counts 0; the separator and the ``\\n`` are not part of the record), against ``max.message.bytes``, and
  against what one record may take of ``segment.bytes``;
- a record without a key on a topic whose ``cleanup.policy`` includes ``compact`` (as Kafka's validator).

Lives in the engine because ``Log.append_lines`` applies it; the view renders with it.
"""

from __future__ import annotations

from dataclasses import dataclass
import operator
from typing import NamedTuple

from . import records as rec
from ..errors import InvalidRecordError, RecordTooLargeError
from .speedups import C as _speedups

# Bytes of one record beyond its key and value, as a bound (length, attributes, deltas, lengths, header count):
# a record that cannot fit a segment with them and its batch header is refused like one over the limit.
_RECORD_FRAMING = 22
# A segment holds a record of at most segment.bytes minus this (its batch header and framing).
SEGMENT_SLACK = rec.HEADER_SIZE + _RECORD_FRAMING



class LineStats(NamedTuple):
    """Config-independent sizes of a run of records, from which a view length is computed for any key
    separator and null marker: records + value_bytes + [key_bytes + keyed * len(sep)] + nulls * len(marker)."""

    records: int = 0
    keyed: int = 0
    nulls: int = 0
    key_bytes: int = 0
    value_bytes: int = 0

    def __add__(self, other):  # type: ignore[override]
        return LineStats._make(map(operator.add, self, other))  # (C-level: every append adds one)


ZERO_STATS = LineStats()


@dataclass(frozen=True)
class LineFormat:
    separator: bytes | None = None
    null_marker: bytes | None = None
    # Which records have lines: with ``uncommitted`` (``logfs.isolation.level=read_uncommitted``) those of Kafka's
    # aborted transactions too, as a read_uncommitted consumer reads them; control batches never. Part of the
    # format because it changes the view's positions as a separator does (view/text.py keys its views by it).
    uncommitted: bool = False

    @classmethod
    def of(cls, config) -> "LineFormat":
        return cls(config.key_separator, config.null_marker, config.read_uncommitted)

    @property
    def plain(self) -> bool:
        """Lines are values as they are (no key, no tombstone): the bulk append path."""
        return not self.separator and self.null_marker is None

    # -- record -> line ------------------------------------------------------------------------------------
    def length(self, stats: LineStats) -> int:
        n = stats.records + stats.value_bytes
        if self.null_marker:
            n += stats.nulls * len(self.null_marker)
        if self.separator:
            n += stats.key_bytes + stats.keyed * len(self.separator)
        return n

    def line(self, key: bytes | None, value: bytes | None) -> bytes:
        body = value if value is not None else (self.null_marker or b"")
        if self.separator and key is not None:
            return key + self.separator + body + b"\n"
        return body + b"\n"

    def render(self, buf: bytes, at: int, size: int) -> tuple[bytes, list | None]:
        """Lines of one batch, and (when ``with_records``) nothing else: the fast path joins values."""
        header_attrs = int.from_bytes(buf[at + 21 : at + 23], "big")
        if header_attrs & rec.ATTR_CONTROL:
            return b"", None
        if _speedups is not None:
            batch = memoryview(buf)[at : at + size]
            if header_attrs & rec.ATTR_COMPRESSION_MASK:
                batch = rec.decompress_batch(batch)  # once per batch; no Python object per record
            return _speedups.render_records(batch, self.separator, self.null_marker), None
        raw = bytes(buf[at : at + size]) if (at or size != len(buf)) else buf
        batch = rec.decode_raw(raw)
        if self.separator is None:
            marker = self.null_marker or b""
            values = [r.value for r in batch]
            try:
                return b"\n".join(values) + b"\n", None
            except TypeError:  # a tombstone in the batch
                return b"\n".join(v if v is not None else marker for v in values) + b"\n", None
        line = self.line
        return b"".join([line(r.key, r.value) for r in batch]), None

    def records_with_lines(self, buf: bytes, at: int, size: int):
        """(offset, line length) of each record of one batch."""
        raw = bytes(buf[at : at + size])
        if int.from_bytes(raw[21:23], "big") & rec.ATTR_CONTROL:
            return []
        out = []
        sep_len = len(self.separator) if self.separator else 0
        marker_len = len(self.null_marker) if self.null_marker else 0
        for r in rec.decode_raw(raw):
            n = 1 + (len(r.value) if r.value is not None else marker_len)
            if sep_len and r.key is not None:
                n += len(r.key) + sep_len
            out.append((r.offset, n))
        return out

    # -- line -> record ------------------------------------------------------------------------------------
    def parse(self, line: bytes) -> tuple[bytes | None, bytes | None]:
        """(key, value) of one line without its ``\\n``."""
        key, value = None, line
        if self.separator:
            before, found, after = line.partition(self.separator)
            if found:
                key, value = before, after
        if self.null_marker is not None and value == self.null_marker:
            value = None
        return key, value

    def parse_lines(self, lines: list[bytes]) -> tuple[list[bytes | None], list[bytes | None] | None]:
        """(values, keys) of whole lines; keys is None when the format has no separator."""
        if self.plain:
            return lines, None  # type: ignore[return-value]
        keys: list[bytes | None] | None = None
        values: list[bytes | None] = lines  # type: ignore[assignment]
        if self.separator:
            keys, values = [], []
            sep = self.separator
            for line in lines:
                key, found, value = line.partition(sep)
                if found:
                    keys.append(key)
                    values.append(value)
                else:
                    keys.append(None)
                    values.append(line)
        marker = self.null_marker
        if marker is not None:
            values = [None if v == marker else v for v in values]
        return values, keys

    def record_size(self, line: bytes) -> int:
        """What one whole line counts against the size limit: its record's key + value bytes."""
        key, value = self.parse(line)
        return (len(key) if key is not None else 0) + (len(value) if value is not None else 0)

    def least_record_size(self, head: bytes) -> int:
        """The least :meth:`record_size` of any line that starts with ``head`` (a partial line), so a partial
        line is refused as soon as no ending can bring it within the limit, and never earlier."""
        marker = self.null_marker
        if self.separator:
            at = head.find(self.separator)
            if at >= 0:
                value = head[at + len(self.separator):]
                tombstone_yet = marker is not None and marker.startswith(value)
                return at + (0 if tombstone_yet else len(value))
            if marker is not None and marker.startswith(head):
                return 0  # may still end as a keyless tombstone
            # Or the separator comes, its first bytes perhaps already at the end of ``head``: the key is the
            # bytes before it, and the value may be empty.
            sep = self.separator
            return next(p for p in range(max(0, len(head) - len(sep) + 1), len(head) + 1)
                        if sep.startswith(head[p:]))
        if marker is not None and marker.startswith(head):
            return 0
        return len(head)


def line_stats(values: list[bytes | None], keys: list[bytes | None] | None) -> LineStats:
    """The :class:`LineStats` of records, from which :meth:`LineFormat.length` counts their lines."""
    if None in values:
        nulls = values.count(None)
        value_bytes = sum(len(v) for v in values if v is not None)
    else:
        nulls, value_bytes = 0, sum(map(len, values))
    keyed = key_bytes = 0
    if keys:
        keyed = len(keys) - keys.count(None)
        key_bytes = sum(len(k) for k in keys if k is not None)
    return LineStats(len(values), keyed, nulls, key_bytes, value_bytes)


def max_record_size(config) -> int:
    """The largest record (key + value bytes) the topic accepts."""
    return min(config.max_message_bytes, config.segment_bytes - SEGMENT_SLACK)


def check_record_size(config, largest: int) -> None:
    if largest > config.max_message_bytes:
        raise RecordTooLargeError(f"record of {largest} bytes exceeds max.message.bytes={config.max_message_bytes}")
    if largest > max_record_size(config):
        raise RecordTooLargeError(f"record of {largest} bytes cannot fit segment.bytes={config.segment_bytes}")


def check_keys(config, keys: list[bytes | None] | None) -> None:
    """A compacted topic refuses records without a key (``keys`` None: none has one)."""
    if config.compact and (keys is None or None in keys):
        raise InvalidRecordError("a compacted topic cannot accept a record without a key")


def check_line(config, line: bytes) -> None:
    """Raise what appending this one whole line (without ``\\n``) would raise."""
    fmt = LineFormat.of(config)
    check_record_size(config, fmt.record_size(line))
    check_keys(config, [fmt.parse(line)[0]])


def check_partial(config, head: bytes) -> None:
    """Raise as soon as every line starting with ``head`` is sure to be refused: too large, or on a compacted
    topic without a key separator (no line can have a key)."""
    fmt = LineFormat.of(config)
    check_record_size(config, fmt.least_record_size(head))
    if config.compact and not fmt.separator:
        check_keys(config, None)

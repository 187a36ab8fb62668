"""Print logfs segment files the way Kafka's ``kafka-dump-log.sh`` (kafka.tools.DumpLogSegments, 3.x to 4.2) does.

    logfs-dump-log-segments --files A.log,B.index,C.timeindex,D.txnindex
        [--deep-iteration] [--print-data-log] [--verify-index-only] [--index-sanity-check]

Output follows Kafka's: batch lines and ``| offset: ...`` record lines on stdout, ``Found N invalid bytes at the
end of <name>`` after the last whole batch; index mismatches, time index errors and non-consecutive record
offsets on stderr after all files, as Kafka prints them: in the order of the Scala hash maps it collects them in
(:class:`ScalaHashMap`), files named as Java's ``File`` names them. tests/kafka compares the output with Kafka's
own tool, line for line, on every kind of segment logfs writes. Kafka's exceptions become messages instead: a missing
file or companion ``.log``, a failed ``--index-sanity-check``, or undecodable records are reported on stderr
and make the exit status 1; bytes that cannot start a batch (bad length or magic) are counted as invalid
trailing bytes. Control records other than ABORT/COMMIT print ``controlType: NAME(id)``, not Kafka's JSON.
Both sanity checks ignore the all-zero preallocated slots at the end of an index, like the dump.
"""

from __future__ import annotations

import argparse
import bisect
import mmap
import os
import re
import struct
import sys
import time

from ..storage.format import records as rec
from ..storage.local.txn_index import read_txn_index
from ..storage.names import (
    INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, companion_file_name, offset_from_file_name,
)

RECORD_INDENT = "|"
NO_TIMESTAMP = -1
OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER", 4: "SNAPSHOT_FOOTER",
                 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}


class DumpError(Exception):
    """A condition Kafka's tool dies on; reported as a message, the run continues, exit status 1."""


class ScalaHashMap:
    """The iteration order of the Scala ``mutable.Map[String, _]`` (a ``mutable.HashMap``, 2.13) Kafka's tool
    collects its errors in, so they print in Kafka's order: buckets of a power-of-two table (16 at first, doubled by
    a ``put`` that finds size + 1 at three quarters of it, an update included), each bucket in ascending order of
    the spread hash of Java's ``String.hashCode``, equal hashes in insertion order."""

    def __init__(self) -> None:
        self._values: dict[str, list] = {}  # (a dict keeps first insertion order: the tie-break)
        self._length = 16

    def put(self, key: str, value: list) -> None:
        if len(self._values) + 1 >= int(self._length * 0.75):
            self._length *= 2
        self._values[key] = value

    def get(self, key: str) -> list | None:
        return self._values.get(key)

    def __bool__(self) -> bool:
        return bool(self._values)

    def items(self) -> list[tuple[str, list]]:
        rank = {key: i for i, key in enumerate(self._values)}
        return [(k, self._values[k]) for k in sorted(
            self._values, key=lambda k: (scala_hash(k) & (self._length - 1), scala_hash(k), rank[k]))]


def scala_hash(text: str) -> int:
    """Scala's ``HashMap`` hash of a String: Java's ``hashCode`` (over UTF-16 units) xor its upper half, as an Int."""
    h = 0
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


class Errors:
    """What Kafka collects while dumping and prints to stderr at the end (same maps, same order)."""

    def __init__(self):
        self.failed = False  # a record-level error was reported as it happened
        self.index_mismatches = ScalaHashMap()
        self.time_mismatches = ScalaHashMap()
        self.out_of_order = ScalaHashMap()
        self.not_found = ScalaHashMap()
        self.non_consecutive = ScalaHashMap()

    @staticmethod
    def prepend(to: ScalaHashMap, name: str, pair: tuple[int, int]) -> None:
        """Kafka's ``list ::= pair; map.put(name, list)`` (a put each time: the last pair prints first)."""
        to.put(name, [pair] + (to.get(name) or []))

    @staticmethod
    def append(to: ScalaHashMap, name: str, pair: tuple[int, int]) -> None:
        """Kafka's TimeIndexDumpErrors: the buffer is put once, on its first pair."""
        if to.get(name) is None:
            to.put(name, [])
        to.get(name).append(pair)

    def print(self, out) -> None:
        for name, pairs in self.index_mismatches.items():
            print(f"Mismatches in :{name}", file=out)
            for index_offset, log_offset in pairs:
                print(f"  Index offset: {index_offset}, log offset: {log_offset}", file=out)
        for name, pairs in self.time_mismatches.items():
            print(f"Found timestamp mismatch in :{name}", file=out)
            for index_ts, log_ts in pairs:
                print(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}", file=out)
        for name, pairs in self.out_of_order.items():
            print(f"Found out of order timestamp in :{name}", file=out)
            for index_ts, prev_ts in pairs:
                print(f"  Index timestamp: {index_ts}, Previously indexed timestamp: {prev_ts}", file=out)
        for _, pairs in self.not_found.items():
            print("The following indexed offsets are not found in the log.", file=out)
            for indexed, found in pairs:
                print(f"Indexed offset: {indexed}, found log offset: {found}", file=out)
        for name, pairs in self.non_consecutive.items():
            print(f"Non-consecutive offsets in {name}", file=out)
            for first, second in pairs:
                print(f"  {first} is followed by {second}", file=out)


def java_path(path: str) -> str:
    """``new File(path).toString()``: repeated slashes made one, no trailing slash."""
    path = re.sub("/+", "/", path)
    return path[:-1] if len(path) > 1 and path.endswith("/") else path


def absolute(path: str) -> str:
    """``File.getAbsolutePath``: relative to the working directory, nothing resolved (``..`` stays)."""
    path = java_path(path)
    return path if path.startswith("/") else java_path(os.path.join(os.getcwd(), path)) if path else os.getcwd()


# -- files ---------------------------------------------------------------------------------------
def read_file(path: str):
    """The file's bytes (memory-mapped: segments can be large)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    except FileNotFoundError:
        raise DumpError(f"{path} does not exist") from None
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror}") from None


def read_log(path: str):
    """A ``.log`` file's bytes, read again (a few times, briefly) while it ends in anything but whole, CRC-valid
    batches: the daemon grows the last batch of an active segment in place (records past the end, then the
    header), and a batch met mid-rewrite is not damage. A file that stays so is dumped as it is."""
    for attempt in range(5):
        buf = read_file(path)
        whole = 0
        last = None
        for pos, header in batches(buf):
            whole, last = pos + header.size, (pos, header)
        if whole == len(buf) and (last is None or rec.crc_of(buf, last[0], last[1].size) == last[1].crc):
            return buf
        time.sleep(0.002 * (attempt + 1))
    return buf


def start_offset(path: str) -> int:
    offset = offset_from_file_name(os.path.basename(path))
    if offset is None:
        raise DumpError(f"{path}: the file name does not start with a base offset")
    return offset


def companion(path: str, suffix: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(path)), companion_file_name(os.path.basename(path), suffix))


def batches(buf, pos: int = 0):
    """(position, header) of each whole v2 batch from ``pos``; stops where no batch can start."""
    while len(buf) - pos >= rec.HEADER_SIZE:
        try:
            header = rec.parse_header(buf, pos)
        except rec.CorruptRecordError:
            return
        if len(buf) - pos < header.size:
            return
        yield pos, header
        pos += header.size


def records(buf, pos: int, header: rec.BatchHeader, path: str):
    try:
        return list(rec.decode_raw(bytes(buf[pos : pos + header.size])))
    except Exception as exc:  # corrupt or undecodable (compressed) record data
        raise DumpError(f"cannot decode the records of the batch at position {pos} of {path}: {exc}") from None


def jbool(value) -> str:
    return "true" if value else "false"


def java_string(data: bytes) -> str:  # Kafka's StringDecoder: new String(bytes, UTF_8)
    return data.decode("utf-8", errors="replace")


def increment_sequence(sequence: int, increment: int) -> int:
    if sequence > 0x7FFFFFFF - increment:
        return increment - (0x7FFFFFFF - sequence) - 1
    return sequence + increment


# -- .log ----------------------------------------------------------------------------------------
def batch_line(buf, pos: int, h: rec.BatchHeader) -> str:
    attrs = h.attributes
    last_seq = -1 if h.base_sequence < 0 else increment_sequence(h.base_sequence, h.last_offset_delta)
    horizon = f"OptionalLong[{h.base_timestamp}]" if attrs & rec.ATTR_DELETE_HORIZON else "OptionalLong.empty"
    codec = rec.COMPRESSION_NAMES.get(h.compression, f"unknown({h.compression})")
    valid = rec.crc_of(buf, pos, h.size) == h.crc
    ts_type = "LogAppendTime" if h.timestamp_type else "CreateTime"
    return (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count}"
            f" baseSequence: {h.base_sequence} lastSequence: {last_seq} producerId: {h.producer_id}"
            f" producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch}"
            f" isTransactional: {jbool(attrs & rec.ATTR_TRANSACTIONAL)} isControl: {jbool(h.is_control)}"
            f" deleteHorizonMs: {horizon} position: {pos} {ts_type}: {h.max_timestamp} size: {h.size}"
            f" magic: {h.magic} compresscodec: {codec} crc: {h.crc} isvalid: {jbool(valid)}")


def record_line(h: rec.BatchHeader, r, print_data: bool) -> str:
    key, value = r.key, r.value
    seq = -1 if h.base_sequence < 0 else increment_sequence(h.base_sequence, r.offset - h.base_offset)
    line = (f"{RECORD_INDENT} offset: {r.offset} {'LogAppendTime' if h.timestamp_type else 'CreateTime'}:"
            f" {r.timestamp} keySize: {-1 if key is None else len(key)}"
            f" valueSize: {-1 if value is None else len(value)}"
            f" sequence: {seq} headerKeys: [{','.join(k for k, _ in r.headers)}]")
    if h.is_control:
        type_id = struct.unpack_from(">h", key, 2)[0] if key is not None and len(key) >= 4 else -1
        name = CONTROL_TYPES.get(type_id, "UNKNOWN")
        if name in ("ABORT", "COMMIT") and value is not None and len(value) >= 6:
            line += f" endTxnMarker: {name} coordinatorEpoch: {struct.unpack_from('>i', value, 2)[0]}"
        else:
            line += f" controlType: {name}({type_id})"
    elif print_data:
        if key is not None:
            line += f" key: {java_string(key)}"
        if value is not None:
            line += f" payload: {java_string(value)}"
    return line


def dump_log(path: str, opts, errors: Errors) -> None:
    print(f"Log starting offset: {start_offset(path)}")
    buf = read_log(path)
    deep = opts.deep_iteration or opts.print_data_log
    valid_bytes, last_offset = 0, -1
    for pos, header in batches(buf):
        print(batch_line(buf, pos, header))
        if deep:
            try:
                decoded = records(buf, pos, header, path)
            except DumpError as exc:  # Kafka dies here; report it and go on with the next batch
                sys.stdout.flush()
                print(f"Error: {exc}", file=sys.stderr)
                errors.failed, decoded = True, []
            for r in decoded:
                if last_offset != -1 and r.offset != last_offset + 1:
                    errors.prepend(errors.non_consecutive, absolute(path), (last_offset, r.offset))
                last_offset = r.offset
                print(record_line(header, r, opts.print_data_log))
        valid_bytes += header.size
    if len(buf) > valid_bytes:
        print(f"Found {len(buf) - valid_bytes} invalid bytes at the end of {os.path.basename(path)}")


# -- indexes -------------------------------------------------------------------------------------
def rel_field(entry: struct.Struct) -> int:
    return 1 if entry is TIME_ENTRY else 0


def index_entries(data, entry: struct.Struct) -> list[tuple]:
    """Entries up to the trailing all-zero preallocated slots (Kafka: a slot with relative offset 0 after
    the first ends the dump)."""
    out = []
    for i in range(len(data) // entry.size):
        fields = entry.unpack_from(data, i * entry.size)
        if i > 0 and fields[rel_field(entry)] == 0:
            break
        out.append(fields)
    return out


def sanity_check(path: str, data, entry: struct.Struct, base: int) -> None:
    entries = index_entries(data, entry)
    if entry is TIME_ENTRY and entries and entries[-1][0] < entries[0][0]:
        raise DumpError(f"Corrupt time index found, time index file ({absolute(path)}) has non-zero "
                        f"size but the last timestamp is {entries[-1][0]} which is less than the first "
                        f"timestamp {entries[0][0]}")
    if entries and entries[-1][rel_field(entry)] < 0:
        raise DumpError(f"Corrupt index found, index file ({absolute(path)}) has non-zero size but "
                        f"the last offset is {base + entries[-1][rel_field(entry)]} which is less than the "
                        f"base offset {base}")
    if len(data) % entry.size:
        raise DumpError(f"Index file {absolute(path)} is corrupt, found {len(data)} bytes which is "
                        f"neither positive nor a multiple of {entry.size}")
    print(f"{path} passed sanity check.")


def dump_index(path: str, opts, errors: Errors) -> None:
    base = start_offset(path)
    data = read_file(path)
    if len(data) < OFFSET_ENTRY.size:
        print(f"{path} is empty.")
        return
    if opts.index_sanity_check:
        return sanity_check(path, data, OFFSET_ENTRY, base)
    log = read_file(companion(path, LOG_SUFFIX))
    for rel, position in index_entries(data, OFFSET_ENTRY):
        found = next(batches(log, position), None) if 0 <= position < len(log) else None
        log_offset = found[1].last_offset if found else -1
        if log_offset != base + rel:  # Kafka prepends: the list prints last mismatch first
            errors.prepend(errors.index_mismatches, absolute(path), (base + rel, log_offset))
        if not opts.verify_index_only:
            print(f"offset: {base + rel} position: {position}")


def dump_time_index(path: str, opts, errors: Errors) -> None:
    base = start_offset(path)
    data = read_file(path)
    if opts.index_sanity_check:
        return sanity_check(path, data, TIME_ENTRY, base)
    log = read_file(companion(path, LOG_SUFFIX))
    index_path = companion(path, INDEX_SUFFIX)
    offsets = index_entries(read_file(index_path), OFFSET_ENTRY) if os.path.exists(index_path) else []
    keys = [base + rel for rel, _ in offsets]
    name, prev = absolute(path), NO_TIMESTAMP
    for timestamp, rel in index_entries(data, TIME_ENTRY):
        offset = base + rel
        slot = bisect.bisect_right(keys, offset) - 1
        position = offsets[slot][1] if slot >= 0 else 0
        found = next(((p, h) for p, h in batches(log, position) if h.last_offset >= offset), None)
        if found is None:
            errors.append(errors.not_found, name, (offset, -1))
        elif found[1].last_offset != offset:
            errors.append(errors.not_found, name, (offset, found[1].last_offset))
        else:
            max_ts = max((r.timestamp for r in records(log, *found, path)), default=NO_TIMESTAMP)
            if max_ts != timestamp:
                errors.append(errors.time_mismatches, name, (timestamp, max_ts))
            if prev >= timestamp:
                errors.append(errors.out_of_order, name, (timestamp, prev))
        if not opts.verify_index_only:
            print(f"timestamp: {timestamp} offset: {offset}")
        prev = timestamp


def dump_txn_index(path: str, opts, errors: Errors) -> None:
    """Kafka's aborted transactions (a broker's ``.txnindex``, or the one logfs's cleaner wrote for a segment it
    rewrote), one line per entry, whatever the options (as Kafka's ``dumpTxnIndex``)."""
    for txn in read_txn_index(path):
        print(f"version: 0 producerId: {txn.producer_id} firstOffset: {txn.first_offset} "
              f"lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}")


DUMPERS = {LOG_SUFFIX: dump_log, INDEX_SUFFIX: dump_index, TIME_INDEX_SUFFIX: dump_time_index,
           TXN_INDEX_SUFFIX: dump_txn_index}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="logfs-dump-log-segments",
        description="Parse log segment files and dump their contents (Kafka's DumpLogSegments format).")
    parser.add_argument("--files", required=True, help="comma-separated .log, .index, .timeindex and .txnindex files")
    parser.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    parser.add_argument("--print-data-log", action="store_true", help="print keys and payloads (implies deep)")
    parser.add_argument("--verify-index-only", action="store_true", help="only report index mismatches")
    parser.add_argument("--index-sanity-check", action="store_true",
                        help="only run the index sanity check done when a broker loads a segment")
    opts = parser.parse_args(argv)
    sys.stdout.reconfigure(encoding="utf-8", errors="replace")  # type: ignore[union-attr]
    errors, status = Errors(), 0
    for path in [java_path(f) for f in opts.files.split(",") if f]:
        print(f"Dumping {path}")
        name = os.path.basename(path)
        dumper = DUMPERS.get(name[name.rfind("."):] if "." in name else "")
        if dumper is None:
            print(f"Ignoring unknown file {path}", file=sys.stderr)
            continue
        try:
            if not os.path.isfile(path):
                raise DumpError(f"{path} does not exist" if not os.path.exists(path) else f"{path} is not a file")
            dumper(path, opts, errors)
        except DumpError as exc:
            sys.stdout.flush()
            print(f"Error: {exc}", file=sys.stderr)
            status = 1
    sys.stdout.flush()
    errors.print(sys.stderr)
    return 1 if errors.failed else status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
        sys.exit(1)

"""Kafka's own ``kafka.tools.DumpLogSegments`` over many files in one call, and its output parsed.

    dump = DumpLogSegments(client)                  # a started logfs.testing.kafka.KafkaClient (one JVM)
    result = dump.print_data(paths)                 # --deep-iteration --print-data-log over every .log
    result.records()                                # per-record dicts, in file order
    verify, sanity = dump.verify_indexes(paths)     # --verify-index-only, then --index-sanity-check
    assert not verify.problems and not sanity.problems

Kafka's tool ignores ``--verify-index-only`` when ``--index-sanity-check`` is given too (its sanity check returns
first), so :meth:`DumpLogSegments.verify_indexes` runs the two one after the other, each over all the files.

:func:`parse_dump` reads the tool's text (Kafka's or ``logfs-dump-log-segments``'s: the same format) into
:class:`Dump`: per file its batch lines, record lines, index entries and other lines, and stderr sorted into what
the tool reports there (index and time index mismatches, offsets not found, non-consecutive offsets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DUMP_MAIN = "kafka.tools.DumpLogSegments"
# Batch line fields are single tokens ("deleteHorizonMs: OptionalLong.empty"); so are a record line's up to its
# header keys.
_FIELD = re.compile(r"(\w+): (\S+)")
_RECORD = re.compile(r"\| offset: (-?\d+) (CreateTime|LogAppendTime|NoTimestampType): (-?\d+) keySize: (-?\d+)"
                     r" valueSize: (-?\d+)(?: sequence: (-?\d+) headerKeys: \[(.*?)\](?= |$))?")
_INDEX = re.compile(r"offset: (\d+) position: (\d+)")
_TIME_INDEX = re.compile(r"timestamp: (-?\d+) offset: (\d+)")
_ERROR_SECTIONS = {  # stderr's heading lines (prefixes), and the section each opens
    "Mismatches in :": "index_mismatches",
    "Found timestamp mismatch in :": "time_mismatches",
    "Found out of order timestamp in :": "out_of_order",
    "The following indexed offsets are not found in the log.": "not_found",
    "Non-consecutive offsets in ": "non_consecutive",
}
_BATCH_CARRIED = ("baseOffset", "lastOffset", "compresscodec", "isControl", "isTransactional", "producerId",
                  "isvalid", "magic")


def _value(text: str):
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


@dataclass
class DumpedFile:
    """What the tool printed for one file (after its ``Dumping <path>`` line)."""
    path: str
    lines: list[str] = field(default_factory=list)
    start_offset: int | None = None
    batches: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    index: list[dict] = field(default_factory=list)  # {"offset", "position"} or {"timestamp", "offset"}
    other: list[str] = field(default_factory=list)  # "... is empty.", "... passed sanity check.", invalid bytes


@dataclass
class Dump:
    args: list[str]
    stdout: str
    stderr: str
    status: int = 0
    error: str | None = None  # the exception the tool died of (Java's stack trace)
    files: dict[str, DumpedFile] = field(default_factory=dict)
    reported: dict[str, list] = field(default_factory=dict)  # stderr by section (see _ERROR_SECTIONS); "other"

    def records(self) -> list[dict]:
        return [r for f in self.files.values() for r in f.records]

    def batches(self) -> list[dict]:
        return [b for f in self.files.values() for b in f.batches]

    @property
    def problems(self) -> list[str]:
        """Everything wrong: stderr's lines other than non-consecutive offsets (a compacted log has gaps: Kafka
        reports them, they are not damage), an exception, a non-zero status, an invalid batch."""
        out = [line for section, lines in self.reported.items() if section != "non_consecutive" for line in lines]
        if self.error:
            out.append(self.error)
        if self.status:
            out.append(f"exit status {self.status}")
        out += [f"{f.path}: invalid batch at position {b['position']}" for f in self.files.values()
                for b in f.batches if b.get("isvalid") is not True]
        out += [f"{f.path}: {line}" for f in self.files.values() for line in f.other if "invalid bytes" in line]
        return out


def _record(line: str, batch: dict | None) -> dict:
    m = _RECORD.match(line)
    offset, ts_type, ts, key_size, value_size, sequence, header_keys = m.groups()
    r = {"offset": int(offset), "timestamp_type": ts_type, "timestamp": int(ts), "keySize": int(key_size),
         "valueSize": int(value_size), "sequence": None if sequence is None else int(sequence),
         "headerKeys": [] if not header_keys else header_keys.split(","), "key": None, "payload": None,
         "control": None}
    if batch is not None:
        r.update({name: batch.get(name) for name in _BATCH_CARRIED})
    rest = line[m.end():]
    if batch is not None and batch.get("isControl"):
        r["control"] = rest.strip()
        return r
    r.update(_key_and_payload(rest, r["keySize"], r["valueSize"]))
    return r


def _key_and_payload(rest: str, key_size: int, value_size: int) -> dict:
    """`` key: K payload: V`` (each only when present and printed). K may hold " payload: " itself: the split is
    the one whose key has ``keySize`` UTF-8 bytes, when there is one."""
    out = {}
    if rest.startswith(" key: ") and key_size >= 0:
        body = rest[len(" key: "):]
        if value_size < 0:
            return {"key": body}
        cuts = [m.start() for m in re.finditer(" payload: ", body)]
        cut = next((c for c in cuts if len(body[:c].encode("utf-8", "surrogatepass")) == key_size),
                   cuts[0] if cuts else len(body))
        out["key"] = body[:cut]
        rest = body[cut:]
    if rest.startswith(" payload: ") and value_size >= 0:
        out["payload"] = rest[len(" payload: "):]
    return out


def parse_dump(stdout: str, stderr: str = "", args: list[str] | None = None, status: int = 0,
               error: str | None = None) -> Dump:
    dump = Dump(list(args or []), stdout, stderr, status, error)
    current: DumpedFile | None = None
    batch: dict | None = None
    last_record: dict | None = None
    for line in stdout.split("\n")[:-1] if stdout.endswith("\n") else stdout.split("\n"):
        if line.startswith("Dumping "):
            current = DumpedFile(line[len("Dumping "):])
            dump.files[current.path] = current
            batch = last_record = None
            continue
        if current is None:
            continue
        current.lines.append(line)
        if line.startswith("Log starting offset: "):
            current.start_offset = int(line.rsplit(" ", 1)[1])
        elif line.startswith("baseOffset: "):
            batch = {k: _value(v) for k, v in _FIELD.findall(line)}
            batch["timestamp_type"] = "LogAppendTime" if "LogAppendTime" in batch else "CreateTime"
            current.batches.append(batch)
            last_record = None
        elif line.startswith("| offset: ") and _RECORD.match(line):
            last_record = _record(line, batch)
            current.records.append(last_record)
        elif _INDEX.fullmatch(line):
            offset, position = _INDEX.fullmatch(line).groups()
            current.index.append({"offset": int(offset), "position": int(position)})
        elif _TIME_INDEX.fullmatch(line):
            timestamp, offset = _TIME_INDEX.fullmatch(line).groups()
            current.index.append({"timestamp": int(timestamp), "offset": int(offset)})
        elif last_record is not None and not line.startswith("Found ") and (
                last_record["payload"] is not None or last_record["key"] is not None):
            # A key or payload holding a newline goes on on the next line.
            part = "payload" if last_record["payload"] is not None else "key"
            last_record[part] += "\n" + line
        else:
            current.other.append(line)
    section = "other"
    for line in stderr.splitlines():
        for heading, name in _ERROR_SECTIONS.items():
            if line.startswith(heading):
                section = name
                break
        dump.reported.setdefault(section, []).append(line)
    return dump


class DumpLogSegments:
    """Kafka's DumpLogSegments, run in a :class:`~logfs.testing.kafka.KafkaClient`'s JVM (no JVM start per run)."""

    def __init__(self, client):
        self.client = client

    def run(self, files, *options: str) -> Dump:
        args = ["--files", ",".join(str(f) for f in files), *options]
        r = self.client.run_main(DUMP_MAIN, args)
        return parse_dump(r["stdout"], r["stderr"], args, r["status"], r["error"])

    def print_data(self, files) -> Dump:
        """Every batch and record, keys and payloads (``--deep-iteration --print-data-log``)."""
        return self.run(files, "--deep-iteration", "--print-data-log")

    def verify_indexes(self, files) -> tuple[Dump, Dump]:
        """Each index entry checked against its log (``--verify-index-only``), then the broker's load-time
        sanity check (``--index-sanity-check``); only ``.index`` and ``.timeindex`` files of ``files`` are given."""
        indexes = [f for f in files if str(f).endswith((".index", ".timeindex"))]
        return self.run(indexes, "--verify-index-only"), self.run(indexes, "--index-sanity-check")

"""Exactly-once appends of staged batches: the publish primitive of the Spark sink (``logfs.spark.sink``).

The sink's tasks stage their rows as Kafka v2 batches in files of the staging area (:mod:`.staging`). The
driver's commit then names, per partition, the spans of staged files to append, and the *writer* it commits for:
``app`` (a batch job's id, or a streaming query's id) and ``version`` (0, or the micro-batch id). It reaches the
daemon as one JSON line written to the mount's commit file (``logfs.fuse.control``), and :meth:`Transactions.
request` answers it.

One commit (:meth:`Transactions.commit`), in a worker thread of the daemon, one commit at a time:

1. **Check.** A writer already applied (the transaction log knows its ``app`` at this ``version`` or a later
   one) is a *duplicate*: answered as applied, nothing appended (Spark may call a streaming commit twice for one
   batch, and replays the last batch after a driver crash). Else every partition must exist and every span be
   whole batches of the sink's making (v2, plain, CRC-valid, contiguous offset deltas, not transactional or
   control), within the topic's limits (``max.message.bytes`` per record, a key on every record of a compacted
   topic, all of a partition's batches in one segment). The staged files are fsynced. Any error is raised here,
   before anything changes.
2. **The commit point**: a ``commit`` record in the transaction log (``logfs-transactions.log``, fdatasync): the
   writer, the producer id of its batches, and per partition the spans, the record count, and the log end offset
   then (``from``: the batches land after it).
3. **Each partition in turn**: its batches are restamped (both timestamps = the append time, the producer id
   (a hash of the writer, 63 bits), epoch 0, base sequence = the records before it in this partition's part),
   their CRC-32C computed again, appended as ONE publish (:meth:`Log.append_staged`: no reader sees part of
   them), and flushed (fsync).
4. A ``done`` record (fdatasync); the staged files named, and the others under the commit's ``cleanup`` prefix,
   are removed.

A crash (kill -9, power cut) anywhere: before 2, nothing changed and the driver's retry or Spark's replay starts
over. From 2 on, the commit is applied in full whatever happens: when the daemon starts again, before it serves,
every commit without its ``done`` record is completed (:meth:`Transactions.complete`), partition by partition. A
partition whose log holds the transaction's records after ``from`` (recognised by the producer id of their
batches, which the compression rewrite and compaction keep) already has them; one that holds none gets them
appended from the staged files (still there: they are removed only after 4); one that holds some of them (only a
power cut can do that: the end of its log was lost) is cut back to before them and gets them again. The same
completion runs when a commit failed after its commit point (a disk error): every minute
(:meth:`Transactions.sweep`), or when its writer commits again; the failed request says it will be completed.

Idempotence lives in the transaction log (:mod:`.transaction_log`), with the writer's last applied version kept for
``transactional.id.expiration.ms`` after its last commit (Kafka's expiry of a transactional id). The producer
fields make the records self-describing in Kafka's own terms (``kafka-dump-log`` shows which commit wrote them).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import mmap
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Protocol

import crc32c as _crc32c

from .. import checkpoints as ckpt
from ..format import lines
from ..format import records as rec
from ..errors import (
    CommitIncompleteError, CorruptRecordError, InvalidRecordError, InvalidRequestError, LogfsError, NoSuchTopicError,
    RecordTooLargeError,
)
from ..clock import Clock
from ..config import BrokerConfig
from ..local.log import Log
from ..names import TRANSACTIONS_FILE
from ..local.segment_recovery import batch_stats
from .staging import StagedFiles, StagingArea, check_name
from .transaction_log import TransactionLog

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 << 20
_MAX_APP = 200
_NOT_ACCEPTED = rec.ATTR_COMPRESSION_MASK | rec.ATTR_TRANSACTIONAL | rec.ATTR_CONTROL
_STAMP = struct.Struct(">qqqhi")  # base timestamp, max timestamp, producer id, epoch, base sequence (at 27)
_CRC = struct.Struct(">I")
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def producer_id(app: str, version: int) -> int:
    """The producer id of a writer's batches: 63 bits of BLAKE2b of (app, version), so one commit's batches are
    recognisable in any partition's log without any other state."""
    digest = hashlib.blake2b(f"{app}\0{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF


# -- requests ---------------------------------------------------------------------------------------------------
@dataclass
class Part:
    """One partition's share of a commit: spans (staged file, position, length) of whole batches, in order."""

    topic: str
    partition: int
    spans: list[tuple[str, int, int]]
    records: int = 0
    bytes: int = 0
    batches: list = field(default_factory=list)  # (writable view of one batch, its LineStats), once prepared


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidRequestError(message)


def _int(value, what: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi,
             f"{what} must be an integer in [{lo}, {hi}], not {value!r}")
    return value


def _app(value) -> str:
    _require(isinstance(value, str) and 0 < len(value) <= _MAX_APP and value.isprintable(),
             f"app must be a printable string of 1-{_MAX_APP} characters, not {value!r}")
    return value


def _prefix(value, what: str) -> str | None:
    if value is None:
        return None
    _require(isinstance(value, str) and value.endswith(".") and len(value) > 1, f"{what} must end with '.'")
    check_name(value[:-1])
    return value


def parse_parts(raw) -> list[Part]:
    _require(isinstance(raw, list), "parts must be a list of [topic, partition, spans]")
    parts, seen = [], set()
    for item in raw:
        _require(isinstance(item, list) and len(item) == 3, "each part is [topic, partition, [[file, position, "
                 "length], ...]]")
        topic, partition, spans = item
        _require(isinstance(topic, str), f"topic must be a string, not {topic!r}")
        partition = _int(partition, "partition", 0, (1 << 31) - 1)
        _require((topic, partition) not in seen, f"partition {topic}/{partition} appears twice")
        seen.add((topic, partition))
        _require(isinstance(spans, list) and spans, f"{topic}/{partition}: spans must be a non-empty list")
        out = []
        for span in spans:
            _require(isinstance(span, list) and len(span) == 3, "each span is [file, position, length]")
            name, position, length = span
            out.append((check_name(name), _int(position, "position"), _int(length, "length", 1)))
        parts.append(Part(topic, partition, out))
    return parts


# -- the coordinator ------------------------------------------------------------------------------------------
class CommittedLogs(Protocol):
    """What the sink's commits need of the LogManager: its clock, first directory and settings, and its logs."""

    clock: Clock
    data_dir: str
    broker: BrokerConfig
    logs: dict[tuple[str, int], Log]
    topics: dict[str, dict[str, str]]


class Transactions:
    """The sink's commits for one data directory (the LogManager's ``transactions``)."""

    def __init__(self, manager: CommittedLogs):
        self.manager = manager
        self.clock = manager.clock
        self.staging = StagingArea(manager.data_dir)
        self.log = TransactionLog(os.path.join(manager.data_dir, TRANSACTIONS_FILE))
        self.lock = threading.Lock()
        self.expiration_ms = manager.broker.get("transactional.id.expiration.ms")
        self.retention_ms = manager.broker.get("logfs.staging.retention.ms")

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Load the transaction log, complete every commit a crash interrupted, then remove every staged file
        (what no completed commit needed is an attempt of a write that can no longer commit: its tasks wrote
        through the mount of a daemon that is gone)."""
        self.log.load(self.clock.time_ms(), self.expiration_ms)
        for record in list(self.log.pending.values()):
            try:
                offsets = self.complete(record)
                log.info("completed the commit of %s version %d interrupted by a crash: %s", record["app"],
                         record["v"], _describe(offsets))
            except (LogfsError, OSError) as exc:
                # Nothing more can be done for it (its staged files are gone, its partition is damaged): say so,
                # and never apply any of it again.
                log.error("the commit of %s version %d interrupted by a crash could not be completed: %s",
                          record["app"], record["v"], exc)
                self.log.append({"t": "done", "app": record["app"], "v": record["v"], "ms": self.clock.time_ms(),
                                 "offsets": [], "incomplete": str(exc)})
        removed = self.staging.remove(self.staging.names())
        if removed:
            log.info("removed %d staged file(s) left by writes that did not commit", removed)
        self._remove_empty_staging_dir()

    def close(self) -> None:
        with self.lock:
            self.log.close()
            self._remove_empty_staging_dir()

    def _remove_empty_staging_dir(self) -> None:
        """An empty staging directory goes (Kafka refuses to start on a DATA_DIR with a directory that is not a
        partition); it is created again by the next staged file."""
        try:
            os.rmdir(self.staging.path)
            ckpt.fsync_dir(os.path.dirname(self.staging.path))
        except (FileNotFoundError, OSError):
            pass

    # -- requests ----------------------------------------------------------------------------------
    def request(self, data: bytes) -> dict:
        """Answer one request of the commit file: ``{"op": "commit" | "abort" | "status", ...}``."""
        _require(len(data) <= MAX_REQUEST_BYTES, f"a request is at most {MAX_REQUEST_BYTES} bytes")
        try:
            req = json.loads(data)
        except ValueError as exc:
            raise InvalidRequestError(f"a request is one JSON object per line: {exc}") from None
        _require(isinstance(req, dict), "a request is a JSON object")
        op = req.get("op")
        if op == "commit":
            return self.commit(_app(req.get("app")), _int(req.get("version"), "version"),
                               parse_parts(req.get("parts")), cleanup=_prefix(req.get("cleanup"), "cleanup"),
                               close=bool(req.get("close", False)))
        if op == "abort":
            return self.abort(_prefix(req.get("prefix"), "prefix"), close=bool(req.get("close", True)))
        if op == "status":
            return self.status(_app(req.get("app")), _int(req.get("version"), "version"))
        raise InvalidRequestError(f"unknown op {op!r} (commit, abort or status)")

    def status(self, app: str, version: int) -> dict:
        with self.lock:
            last = self.log.apps.get(app)
            return {"ok": True, "applied": self.log.applied(app, version),
                    "pending": (app, version) in self.log.pending, "last_version": last[0] if last else None}

    def abort(self, prefix: str, close: bool = True) -> dict:
        """Remove the staged files under ``prefix`` (but any a commit still needs), and close it (no file may be
        created under it any more) unless ``close`` is false."""
        with self.lock:
            if close:
                self.staging.close_prefix(prefix)
            removed = self.staging.remove_prefix(prefix, self._needed())
            return {"ok": True, "removed": removed}

    def sweep(self) -> int:
        """Complete the commits a disk error interrupted after their commit point, and remove staged files
        untouched for ``logfs.staging.retention.ms`` (the service runs this every minute). Returns how many
        files went."""
        with self.lock:
            for record in list(self.log.pending.values()):
                try:
                    offsets = self.complete(record)
                except (LogfsError, OSError) as exc:
                    log.error("the commit of %s version %d is still not complete: %s", record["app"], record["v"],
                              exc)
                    continue
                log.info("completed the commit of %s version %d: %s", record["app"], record["v"],
                         _describe(offsets))
                self.staging.remove({span[0] for part in record["parts"] for span in part["spans"]},
                                    self._needed())
            return self.staging.sweep(self.retention_ms, self._needed())

    def _needed(self) -> set[str]:
        return {span[0] for record in self.log.pending.values() for part in record["parts"]
                for span in part["spans"]}

    def commit(self, app: str, version: int, parts: list[Part], *, cleanup: str | None = None,
               close: bool = False) -> dict:
        """Append ``parts`` exactly once for the writer (app, version); see the module's description."""
        with self.lock:
            named = {span[0] for part in parts for span in part.spans}
            try:
                if self.log.applied(app, version):
                    log.info("the commit of %s version %d was applied before: nothing appended again", app, version)
                    return {"ok": True, "duplicate": True, "offsets": {}}
                pending = self.log.pending.get((app, version))
                if pending is not None:  # a commit that failed after its commit point: complete it
                    offsets = self.complete(pending)
                    named |= {span[0] for part in pending["parts"] for span in part["spans"]}
                    return {"ok": True, "duplicate": False, "offsets": _offsets_json(offsets)}
                if not parts:
                    return {"ok": True, "duplicate": False, "offsets": {}}
                try:
                    offsets = self._commit(app, version, parts)
                except (LogfsError, OSError) as exc:
                    if (app, version) not in self.log.pending:
                        raise  # refused before its commit point: nothing changed
                    raise CommitIncompleteError(
                        f"the commit of {app} version {version} passed its commit point, and will be completed "
                        f"(by the service within a minute, or when it is committed again, or at the next start): "
                        f"{exc}", getattr(exc, "errno", None) or errno.EIO) from exc
                log.info("committed %s version %d: %s", app, version, _describe(offsets))
                return {"ok": True, "duplicate": False, "offsets": _offsets_json(offsets)}
            finally:
                if not (app, version) in self.log.pending:  # (else its files are needed to complete it)
                    if cleanup:
                        self.staging.remove_prefix(cleanup, self._needed())
                    self.staging.remove(named, self._needed())
                    if cleanup and close:
                        self.staging.close_prefix(cleanup)
                    self.log.maybe_compact(self.clock.time_ms(), self.expiration_ms)

    def _commit(self, app: str, version: int, parts: list[Part]) -> list:
        staged = StagedFiles(self.staging)
        try:
            logs = [self._prepare(part, staged) for part in parts]  # 1. every check; nothing changed yet
            staged.sync()
            record = {"t": "commit", "app": app, "v": version, "ms": self.clock.time_ms(),
                      "pid": producer_id(app, version),
                      "parts": [{"topic": p.topic, "p": p.partition, "from": plog.log_end_offset,
                                 "records": p.records, "bytes": p.bytes, "spans": [list(s) for s in p.spans]}
                                for p, plog in zip(parts, logs)]}
            self.log.append(record)  # 2. the commit point
            offsets = [self._append(plog, part, record["pid"]) for part, plog in zip(parts, logs)]  # 3.
            self.log.append({"t": "done", "app": app, "v": version, "ms": self.clock.time_ms(),  # 4.
                             "offsets": offsets})
            return offsets
        finally:
            for part in parts:
                part.batches.clear()
            staged.close()

    def complete(self, record: dict) -> list:
        """Complete a commit past its commit point (after a crash, or a disk error in step 3): each partition
        that does not hold all of its records gets them. Returns the offsets of each partition's records."""
        pid = record["pid"]
        staged = StagedFiles(self.staging)
        offsets = []
        try:
            for entry in record["parts"]:
                plog = self.manager.logs.get((entry["topic"], entry["p"]))
                if plog is None:
                    log.warning("%s-%d was deleted before the commit of %s version %d reached it", entry["topic"],
                                entry["p"], record["app"], record["v"])
                    continue
                found, first, at_end = _find(plog, entry["from"], pid)
                if found == entry["records"]:
                    offsets.append([entry["topic"], entry["p"], first, first + found - 1])
                    continue
                if found:
                    if not at_end:
                        raise CorruptRecordError(
                            f"{entry['topic']}-{entry['p']} holds {found} of the {entry['records']} records of "
                            f"the commit of {record['app']} version {record['v']}, and more after them")
                    log.warning("%s-%d: %d of the %d records of a commit survived a crash; appending them again",
                                entry["topic"], entry["p"], found, entry["records"])
                    plog.truncate_to(first)
                part = Part(entry["topic"], entry["p"], [tuple(s) for s in entry["spans"]])
                try:
                    self._prepare(part, staged, check_limits=False)
                    offsets.append(self._append(plog, part, pid))
                finally:
                    part.batches.clear()
            self.log.append({"t": "done", "app": record["app"], "v": record["v"], "ms": self.clock.time_ms(),
                             "offsets": offsets})
            return offsets
        finally:
            staged.close()

    # -- the steps -----------------------------------------------------------------------------------
    def _prepare(self, part: Part, staged: StagedFiles, check_limits: bool = True):
        """Check one partition's spans and map their batches (step 1); returns its Log."""
        plog = self.manager.logs.get((part.topic, part.partition))
        if plog is None:
            if part.topic not in self.manager.topics:
                raise NoSuchTopicError(f"no topic {part.topic!r}")
            raise NoSuchTopicError(f"topic {part.topic!r} has no partition {part.partition}")
        config = plog.config
        largest = lines.max_record_size(config)
        for name, position, length in part.spans:
            view = staged.view(name, position, length)
            at = 0
            while at < length:
                where = f"staged file {name!r} at {position + at}"
                try:
                    header = rec.validate(view, at)
                except CorruptRecordError as exc:
                    raise InvalidRequestError(f"{where}: {exc}") from None
                _require(not header.attributes & _NOT_ACCEPTED, f"{where}: a compressed, transactional or "
                         "control batch (the sink stages plain batches)")
                _require(header.records_count >= 1 and header.last_offset_delta == header.records_count - 1,
                         f"{where}: a batch's offset deltas must be 0..count-1")
                batch = view[at : at + header.size]
                stats = batch_stats(batch)
                if stats.records != header.records_count:
                    raise InvalidRequestError(f"{where}: the batch holds {stats.records} records, its header says "
                                              f"{header.records_count}")
                if check_limits:
                    if header.size - rec.HEADER_SIZE > largest:
                        _check_record_sizes(config, batch)
                    if config.compact and stats.keyed != stats.records:
                        raise InvalidRecordError(f"topic {part.topic!r} is compacted: every record needs a key")
                part.batches.append((batch, stats))
                part.records += header.records_count
                part.bytes += header.size
                at += header.size
        if check_limits and part.bytes > config.segment_bytes:
            raise RecordTooLargeError(f"{part.bytes} bytes for {part.topic}-{part.partition} in one commit: all of "
                                      f"a partition's records in a commit go into one segment, and segment.bytes="
                                      f"{config.segment_bytes}")
        return plog

    def _append(self, plog, part: Part, pid: int) -> list:
        """Restamp one partition's batches (append time, producer id, sequence, CRC) and append them as one
        publish, then flush (step 3). Returns [topic, partition, first offset, last offset]. A header is restamped
        in a copy of its 61 bytes; the CRC-32C goes on from it over the records as they are mapped."""
        now = self.clock.time_ms()
        sequence = 0
        batches = []
        for batch, stats in part.batches:
            head = bytearray(batch[: rec.HEADER_SIZE])
            body = batch[rec.HEADER_SIZE :]
            _STAMP.pack_into(head, 27, now, now, pid, 0, sequence)
            _CRC.pack_into(head, 17, _crc32c.crc32c(body, _crc32c.crc32c(memoryview(head)[21:])))
            sequence += rec.parse_header(head).records_count
            batches.append((head, body, stats))
        try:
            first, last = plog.append_staged(batches, now)
        finally:
            for _, body, _ in batches:
                body.release()
        plog.flush()
        return [part.topic, part.partition, first, last]


def _check_record_sizes(config, batch) -> None:
    """Each record's key + value + header bytes against max.message.bytes (the lines' rule, headers counted)."""
    for r in rec.decode(bytes(batch)):
        size = (len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)
        size += sum(len(k.encode()) + (len(v) if v is not None else 0) for k, v in r.headers)
        lines.check_record_size(config, size)


def _find(plog, start: int, pid: int) -> tuple[int, int, bool]:
    """Records of producer ``pid`` in ``plog`` at or after offset ``start``: (count, first offset, whether the
    last of them ends the log)."""
    count, first, end = 0, -1, -1
    with plog.snapshot() as snap:
        for segment in snap.segments:
            if segment.next_offset <= start:
                continue
            found = segment.translate_offset(start) if segment.base_offset < start else (0, None)
            if found is None:
                continue
            for _, header, _, _ in segment.batches_from(found[0]):
                if header.producer_id == pid:
                    if first < 0:
                        first = header.base_offset
                    count += header.records_count
                    end = header.next_offset
    return count, first, count > 0 and end == plog.log_end_offset


def _offsets_json(offsets: list) -> dict:
    out: dict = {}
    for topic, partition, first, last in offsets:
        out.setdefault(topic, {})[str(partition)] = [first, last]
    return out


def _describe(offsets: list) -> str:
    return ", ".join(f"{t}-{p} [{a}, {b}]" for t, p, a, b in offsets) or "nothing to append"

"""Partitions written by logfs's engine, one per kind of segment logfs writes (CONTRACT.md section 13), each with
the records that were appended to it, kept by the test (not read back through logfs): what Kafka must print.

Kinds: plain (keys, tombstones, headers, UTF-8 and non-UTF-8 bytes, bulk lines and tail batches grown in place,
several segments), each codec (sealed segments rewritten by the compressor), compacted and cleaned (and a cleaned
log then compressed), recovered after a crash (a torn batch and garbage past the end), and tiered then downloaded
back from the bucket.
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from logfs.remote import DirectoryStore
from logfs.remote.manifest import ManifestStore
from logfs.storage import BrokerConfig, LogConfig, LogManager, ManualClock, load_log
from logfs.storage.cleaner.compaction import OffsetMap, clean, cleanable_range
from logfs.storage.cleaner.process import compress_in_thread
from logfs.storage.format import records as rec
from logfs.storage.tiered.manager import RemoteLogManager

T0 = 1_700_000_000_000
CODECS = ("gzip", "snappy", "lz4", "zstd")
WORDS = ["GET", "POST", "/api/v1/orders", "200", "404", "user=alice", "héllo", "wörld", "日本語", "🙂", "a b"]


@dataclass
class Appended:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


@dataclass
class Partition:
    kind: str
    directory: Path
    records: list[Appended]
    codec: str = "none"  # of every batch of the sealed segments

    def files(self, suffixes=(".log", ".index", ".timeindex")) -> list[str]:
        return [str(self.directory / n) for n in sorted(os.listdir(self.directory))
                if n[:20].isdigit() and n[20:] in suffixes]


def _text(rng: random.Random, i: int) -> bytes:
    return (f"{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 8)))).encode()


def _append(log, clock, model: list, values, keys=None, headers=None, timestamp=None) -> None:
    first, last = log.append(values, keys, timestamp_ms=timestamp, headers=headers)
    assert last - first + 1 == len(values)
    ts = clock.time_ms() if timestamp is None else timestamp
    for j, value in enumerate(values):
        model.append(Appended(first + j, ts, keys[j] if keys else None, value,
                              list(headers[j]) if headers else []))


def _append_lines(log, clock, model: list, lines: list[bytes]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    first, last = log.append_lines(b"", data, len(data))
    assert last - first + 1 == len(lines)
    model += [Appended(first + j, clock.time_ms(), None, line) for j, line in enumerate(lines)]


def _fill(log, clock, rng: random.Random, n_batches: int = 40, keyed: bool = True) -> list[Appended]:
    """Records of every shape: keyed batches with headers and tombstones, bulk lines, single lines that grow the
    tail batch in place, explicit timestamps (also going back in time)."""
    model: list[Appended] = []
    for b in range(n_batches):
        n = rng.randint(1, 6)
        values = [None if keyed and rng.random() < 0.1 else _text(rng, len(model) + j) for j in range(n)]
        keys = [None if rng.random() < 0.2 else f"key-{rng.randrange(12)}".encode() for _ in range(n)] \
            if keyed else None
        if keyed:
            values = [v if v is not None or k is not None else b"" for v, k in zip(values, keys)]
        headers = [[(f"h{h}", None if rng.random() < 0.2 else _text(rng, h)) for h in range(rng.randrange(3))]
                   for _ in range(n)]
        timestamp = T0 - 5000 + b if b % 9 == 4 else None  # a CreateTime older than the ones before it
        _append(log, clock, model, values, keys, headers, timestamp)
        clock.advance(rng.choice([0, 1, 7]))
        if b % 10 == 3:
            _append_lines(log, clock, model, [_text(rng, len(model) + j) for j in range(rng.randint(20, 60))])
        if b % 10 == 6:
            for _ in range(rng.randint(3, 8)):  # single lines: the tail batch grows in place
                _append_lines(log, clock, model, [_text(rng, len(model))])
                clock.advance(1)
            log.flush()
    return model


def _sealed_and_closed(log) -> None:
    log.roll()
    log.flush()
    log.close()


def plain(root: Path) -> Partition:
    clock = ManualClock(T0)
    log = load_log(str(root / "plain-0"), "plain", 0,
                   LogConfig.for_tests(segment_bytes=4096, index_interval_bytes=256), clock=clock)
    model = _fill(log, clock, random.Random(1))
    # Bytes that are not UTF-8, an empty key and value, a key holding " payload: ".
    _append(log, clock, model, [b"\xff\xfe raw \x80 bytes", b"", b"after the odd key"],
            [b"\xc3(", b"", b"my payload: is here"])
    _sealed_and_closed(log)
    return Partition("plain", root / "plain-0", model)


def compressed(root: Path, codec: str) -> Partition:
    clock = ManualClock(T0)
    config = dataclasses.replace(LogConfig.for_tests(segment_bytes=1 << 20, index_interval_bytes=4096),
                                 compression_type=codec)
    log = load_log(str(root / f"{codec}-0"), codec, 0, config, clock=clock)
    rng = random.Random(2)
    model = _fill(log, clock, rng)
    log.roll()
    # Over 256 KiB of records (in few, long lines: fewer lines for Kafka to print): the rewrite makes more than
    # one batch of the segment, and indexes the second.
    _append_lines(log, clock, model, [b" ".join(_text(rng, len(model) + j) for _ in range(40)) for j in range(400)])
    model += _fill(log, clock, rng, n_batches=10)
    log.roll()
    log.flush()
    sealed = log.segments.as_list()[:-1]
    assert len(sealed) >= 2
    assert compress_in_thread(log, sealed, clock.time_ms()).segments_replaced == len(sealed)
    log.close()
    return Partition(codec, root / f"{codec}-0", model, codec)


def _compacted_model(model: list[Appended], end: int, drop_tombstones: bool) -> list[Appended]:
    """What Kafka's cleaner keeps of ``model`` when it cleaned up to ``end``: below ``end`` the last record of each
    key (a tombstone too, unless past delete.retention.ms), no keyless record; everything from ``end`` on."""
    last = {r.key: r.offset for r in model if r.offset < end and r.key is not None}
    return [r for r in model if r.offset >= end or (
        r.key is not None and last[r.key] == r.offset and not (drop_tombstones and r.value is None))]


def compacted(root: Path, codec: str | None = None) -> Partition:
    clock = ManualClock(T0)
    config = LogConfig.for_tests(segment_bytes=1024, index_interval_bytes=128, cleanup_policy="compact",
                                 delete_retention_ms=1000, file_delete_delay_ms=0)
    if codec:
        config = dataclasses.replace(config, compression_type=codec)
    name = f"compacted-{codec}" if codec else "compacted"
    log = load_log(str(root / f"{name}-0"), name, 0, config, clock=clock)
    rng = random.Random(3)
    model: list[Appended] = []
    for i in range(240):
        key = f"user-{rng.randrange(15)}".encode()
        value = None if rng.random() < 0.08 else _text(rng, i)
        _append(log, clock, model, [value], [key], [[("trace", str(i).encode())]] if i % 5 == 0 else None)
        clock.advance(3)
    result = clean(log, cleanable_range(log, None, clock.time_ms()), OffsetMap(10_000), clock.time_ms())
    assert log.segments.first.base_offset == 0 and result.end_offset > 100
    expected = _compacted_model(model, result.end_offset, drop_tombstones=False)
    if codec:
        log.roll()
        log.flush()
        compress_in_thread(log, log.segments.as_list()[:-1], clock.time_ms())
    log.close()
    return Partition(name, root / f"{name}-0", expected, codec or "none")


def recovered(root: Path) -> Partition:
    """A crash with unflushed records, a torn last batch and garbage past it; recovery, then more appends."""
    clock = ManualClock(T0)
    props = {"log.segment.bytes": "2048", "log.index.interval.bytes": "128"}
    data = root / "crash-data"
    mgr = LogManager(str(data), BrokerConfig.from_properties(props), clock=clock)
    mgr.create_topic("recovered", 1)
    log = mgr.get_log("recovered", 0)
    rng = random.Random(4)
    model = _fill(log, clock, rng, n_batches=30)
    log.flush(up_to=model[len(model) // 2].offset)
    mgr.checkpoint()
    model += _fill(log, clock, rng, n_batches=10)  # not flushed: the crash keeps the page cache's copy
    active = log.active_segment.log_path
    end = log.log_end_offset
    mgr.abandon()
    with open(active, "ab") as f:
        f.write(rec.build_batch(end, clock.time_ms(), [b"torn"])[:-3])
        f.write(os.urandom(300))
    mgr = LogManager(str(data), BrokerConfig.from_properties(props), clock=clock)
    assert mgr.had_clean_shutdown is False
    log = mgr.get_log("recovered", 0)
    assert log.log_end_offset == end
    clock.advance(100)
    model += _fill(log, clock, rng, n_batches=10)
    log.roll()
    mgr.close()
    return Partition("recovered", data / "recovered-0", model)


def tiered_downloaded(root: Path) -> Partition:
    """Segments uploaded to a bucket (the directory store), then each object fetched back through the store's
    API into a directory of their own: Kafka's files byte for byte."""
    clock = ManualClock(T0)
    archive = root / "bucket"
    archive.mkdir()
    props = {"log.segment.bytes": "4096", "log.index.interval.bytes": "512", "log.segment.delete.delay.ms": "0",
             "remote.log.storage.system.enable": "true", "logfs.remote.dir": str(archive)}
    mgr = LogManager(str(root / "tiered-data"), BrokerConfig.from_properties(props), clock=clock)
    rlm = RemoteLogManager(mgr.data_dir, mgr.logs, DirectoryStore(archive), cache_bytes=64 << 10)
    mgr.remote = rlm
    mgr.create_topic("tiered", 1)
    mgr.set_topic_config("tiered", "remote.storage.enable", "true")
    mgr.set_topic_config("tiered", "local.retention.bytes", "0")
    log = mgr.get_log("tiered", 0)
    model = _fill(log, clock, random.Random(5), n_batches=30)
    log.roll()
    log.flush()
    assert rlm.sync(log, clock.time_ms()) >= 3
    mgr.close()
    store = DirectoryStore(archive)
    manifest = ManifestStore(store).read("tiered", 0)
    out = root / "downloaded" / "tiered-0"
    out.mkdir(parents=True)
    for segment in manifest.segments:
        for kind in ("log", "index", "timeindex"):
            (out / f"{segment.base_offset:020d}.{kind}").write_bytes(store.get_bytes(segment.objects[kind].key))
    uploaded_end = manifest.remote_log_end_offset
    return Partition("tiered", out, [r for r in model if r.offset < uploaded_end])


def write_all(root: Path) -> list[Partition]:
    return [plain(root), *(compressed(root, c) for c in CODECS), compacted(root), compacted(root, "zstd"),
            recovered(root), tiered_downloaded(root)]

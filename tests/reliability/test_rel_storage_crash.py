"""Storage-level crash consistency (engine only, no mount).

A crash image is a copy of a partition directory taken while its log is open (indexes preallocated, no end
entries, checkpoints stale). Its active segment's ``.log`` is then cut at every byte boundary inside its last
batch, or has random bytes of the last batch flipped, and the directory is reopened with
``load_log(..., had_clean_shutdown=False)``. Recovery must truncate to the last valid batch, rebuild the
indexes, read back exactly the earlier batches, agree with the text view (length, bytes, positions, offsets),
keep appending at the right offset, and survive a clean close and reopen.

Kafka's v2 format does not checksum a batch's first 12 bytes' baseOffset (nor the partitionLeaderEpoch): a flip
there cannot be detected by any reader. Such flips are only required to leave the earlier batches intact and
the log usable; they are counted separately in the statistics.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from logfs.storage import LogConfig, ManualClock, load_log
from logfs.storage.format import records as rec
from logfs.storage.cleaner.process import compress_in_thread
from logfs.view.text import LineFormat, live_view

from rel_helpers import record_stats, scale

VARIANTS = {
    # name: (key separator, null marker, index.interval.bytes, recovery point)
    "plain-interval0-rp0": (None, None, 0, "zero"),
    "keyed-interval100-rpactive": (b"=", b"NULL", 100, "active"),
    "keyed-interval0-rpactive": (b" :: ", None, 0, "active"),
    "plain-interval4096-rp0": (None, b"~", 4096, "zero"),
    # sealed segments rewritten in zstd before the image (recovery from 0 re-validates them too)
    "zstd-keyed-interval100-rp0": (b"=", b"NULL", 100, "zero"),
}


def _config(sep, marker, interval, compression="producer"):
    return LogConfig.for_tests(segment_bytes=2000, index_interval_bytes=interval, segment_index_bytes=4096,
                               key_separator=sep, null_marker=marker, compression_type=compression)


def _build(directory, config, rng, clock, one_batch_active=False):
    """A log with sealed segments and an active segment of several batches; returns (log, batches), batches as
    lists of (offset, timestamp, key, value)."""
    log = load_log(directory, "t", 0, config, clock=clock, had_clean_shutdown=True)
    batches = []

    def append(n, big=False):
        keys = [None if rng.random() < 0.3 else b"k%d" % rng.randrange(5) for _ in range(n)]
        values = [None if (k is not None and rng.random() < 0.15) else
                  bytes(rng.choice(b"abc xyz\x00\xff=") for _ in range(rng.randrange(0, 120 if big else 40)))
                  for k in keys]
        ts = clock.time_ms()
        first, last = log.append(values, keys)
        assert last - first + 1 == n
        batches.append([(first + i, ts, keys[i], values[i]) for i in range(n)])
        clock.advance(rng.choice([1, 5, 100]))

    while len(log.segments) < 3:
        append(rng.randrange(1, 6))
    if one_batch_active:
        log.roll()
    else:
        for _ in range(rng.randrange(2, 5)):
            append(rng.randrange(1, 4))
    append(scale(3, 5), big=scale(False, True))  # the last batch (cut at each of its ~150 / ~400 bytes)
    return log, batches


def _text(records, sep, marker):
    fmt = LineFormat(sep, marker)
    return b"".join(fmt.line(k, v) for _, _, k, v in records)


def _check(log, records, sep, marker, rng, what, full=True):
    """The log holds exactly ``records``; indexes and the text view agree with them (at every record when
    ``full``, else at a sample)."""
    def sample(items):
        items = list(items)
        return items if full else rng.sample(items, min(6, len(items)))

    assert log.log_end_offset == (records[-1][0] + 1 if records else log.log_start_offset), what
    got = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        part = log.read(offset)
        assert part, what
        got += part
        offset = part[-1].offset + 1
    assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == records, what
    # Every record is found through the (rebuilt) offset index.
    for o, _, _, _ in sample(records):
        seg = log.segments.floor(o)
        found = seg.translate_offset(o)
        assert found is not None and found[1].base_offset <= o <= found[1].last_offset, (what, o)
    for seg in log.segments:
        seg.offset_index.sanity_check(seg.size)
        seg.time_index.sanity_check(seg.size)
        for i in range(seg.view_index.entries):  # view index entries sit on batch starts (or at the end)
            entry = seg.view_index.get(i)
            assert entry.position <= seg.size, what
            if entry.position < seg.size:
                header = rec.parse_header(seg.read(entry.position, rec.HEADER_SIZE))
                assert header.base_offset == entry.offset, (what, i, entry)
    text = _text(records, sep, marker)
    view = live_view(log)
    assert view.length() == len(text), what
    assert view.read(0, len(text) + 10) == text, what
    pos = 0
    fmt = LineFormat(sep, marker)
    starts = []
    for o, _, k, v in records:
        starts.append((o, pos))
        pos += len(fmt.line(k, v))
    for o, p in sample(starts):
        assert view.position_of(o) == p, (what, o)
        assert view.offset_at(p) == o, (what, p)
    assert view.position_of(log.log_end_offset) == len(text)
    for _ in range(5):
        p = rng.randrange(len(text) + 1)
        n = rng.choice([1, 17, 300])
        assert view.read(p, n) == text[p:p + n], (what, p, n)


def _fresh_copy(image, work) -> None:
    """``work``: a fresh copy of the crash image ``image`` (whatever was there before is gone)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(image, work)


def _reopen_and_check(image, work, config, sep, marker, expected, rng, rp, what, clock, mutate):
    _fresh_copy(image, work)
    mutate(work)
    log = load_log(work, "t", 0, config, clock=clock, had_clean_shutdown=False, recovery_point=rp)
    try:
        _check(log, expected, sep, marker, rng, what)
        # Appends continue at the recovered end, and a clean close + reopen keeps everything.
        clock.advance(3)
        ts = clock.time_ms()
        first, last = log.append([b"after-crash", None, b""], [b"k1", b"k2", None])
        assert first == log.log_start_offset + 0 if not expected else first == expected[-1][0] + 1, what
        more = expected + [(first, ts, b"k1", b"after-crash"), (first + 1, ts, b"k2", None), (first + 2, ts, None, b"")]
        _check(log, more, sep, marker, rng, what + " +append", full=False)
    finally:
        log.close()
    log = load_log(work, "t", 0, config, clock=clock, had_clean_shutdown=True)
    try:
        _check(log, more, sep, marker, rng, what + " +clean reopen", full=False)
    finally:
        log.close()


@pytest.mark.parametrize("variant", scale(["plain-interval0-rp0", "keyed-interval100-rpactive",
                                            "zstd-keyed-interval100-rp0"], list(VARIANTS)))
def test_cut_and_flip_last_batch_of_active_segment(tmp_path, profile, variant):
    sep, marker, interval, rp_kind = VARIANTS[variant]
    rng = random.Random(f"{variant}-7")
    clock = ManualClock()
    config = _config(sep, marker, interval, "zstd" if variant.startswith("zstd") else "producer")
    stats = {"images": 0, "cuts": 0, "flips": 0, "flips_detected": 0, "flips_base_offset_shifted": 0,
             "flips_epoch_harmless": 0, "reopens": 0, "losses": 0}
    for one_batch_active in (False, True):
        src = str(tmp_path / f"src-{one_batch_active}" / "t-0")
        log, batches = _build(src, config, rng, clock, one_batch_active)
        if config.codec:
            sealed = log.segments.as_list()[:-1]
            assert compress_in_thread(log, sealed, clock.time_ms()).segments_replaced == len(sealed)
            assert all(h.compression == config.codec for s in log.segments.as_list()[:-1]
                       for _, h, _, _ in s.batches_from(0) if h.records_count)
        image = str(tmp_path / f"image-{one_batch_active}")
        shutil.copytree(src, image)  # the crash image: taken while the log is open
        active = log.active_segment
        starts = [p for p, _, _, _ in active.batches_from(0)]
        last_pos, end = starts[-1], active.size
        log_name = os.path.basename(active.log_path)
        rp = 0 if rp_kind == "zero" else active.base_offset
        log.close()
        stats["images"] += 1
        earlier = [r for b in batches[:-1] for r in b]
        everything = earlier + batches[-1]
        work = str(tmp_path / "work" / "t-0")

        # Cut at every byte boundary inside the last batch (and the two ends).
        for cut in range(last_pos, end + 1):
            def truncate(d, cut=cut):
                os.truncate(os.path.join(d, log_name), cut)
            expected = everything if cut == end else earlier
            _reopen_and_check(image, work, config, sep, marker, expected, rng, rp,
                              f"{variant} one_batch={one_batch_active} cut={cut} of [{last_pos},{end}]", clock,
                              truncate)
            stats["cuts"] += 1
            stats["reopens"] += 2

        # Flip random bytes of the last batch.
        for _ in range(scale(40, 600)):
            at = rng.randrange(last_pos, end)
            delta = rng.randrange(1, 256)
            rel_at = at - last_pos

            def flip(d, at=at, delta=delta):
                with open(os.path.join(d, log_name), "r+b") as f:
                    f.seek(at)
                    b = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([b ^ delta]))
            what = f"{variant} one_batch={one_batch_active} flip byte {rel_at} of the last batch ^{delta:#x}"
            stats["flips"] += 1
            if rel_at < 8:  # baseOffset: not covered by the CRC (Kafka v2); undetectable unless out of range
                _fresh_copy(image, work)
                flip(work)
                log = load_log(work, "t", 0, config, clock=clock, had_clean_shutdown=False, recovery_point=rp)
                try:
                    got = log.read(log.log_start_offset, 1 << 30) if log.log_end_offset > log.log_start_offset else []
                    got = [(r.offset, r.timestamp, r.key, r.value) for r in got]
                    assert got[: len(earlier)] == earlier, what  # the earlier batches are intact
                    tail = got[len(earlier):]
                    if tail:  # accepted with a shifted base offset: same records, offsets only moved up
                        assert [r[1:] for r in tail] == [r[1:] for r in batches[-1]], what
                        assert tail[0][0] > earlier[-1][0] if earlier else True, what
                        stats["flips_base_offset_shifted"] += 1
                    else:
                        stats["flips_detected"] += 1
                    assert live_view(log).length() == len(_text(got, sep, marker)), what
                finally:
                    log.close()
                continue
            if 12 <= rel_at < 16:  # partitionLeaderEpoch: not covered by the CRC, and no effect on the records
                _reopen_and_check(image, work, config, sep, marker, everything, rng, rp, what, clock, flip)
                stats["flips_epoch_harmless"] += 1
                continue
            _reopen_and_check(image, work, config, sep, marker, earlier, rng, rp, what, clock, flip)
            stats["flips_detected"] += 1
            stats["reopens"] += 2
    record_stats("storage_crash", **stats)


# -- damaged view indexes after a clean shutdown (engine level) ------------------------------------------------
def _view_damages():
    import struct

    entry = struct.Struct(">IIIIIQQ")

    def garbage_first(data, rng):
        return rng.randbytes(entry.size) + data[entry.size:]

    def end_totals_off_by_one(data, rng):  # plausible, monotonic, wrong: only reading the log can tell
        *head, last = [data[i:i + entry.size] for i in range(0, len(data), entry.size)]
        fields = list(entry.unpack(last))
        fields[6] += 1  # value_bytes
        return b"".join(head) + entry.pack(*fields)

    def end_offset_off_by_one(data, rng):
        *head, last = [data[i:i + entry.size] for i in range(0, len(data), entry.size)]
        fields = list(entry.unpack(last))
        fields[0] += 1  # the segment's next offset
        return b"".join(head) + entry.pack(*fields)

    def swapped_entries(data, rng):
        parts = [data[i:i + entry.size] for i in range(0, len(data), entry.size)]
        if len(parts) >= 3:
            parts[0], parts[1] = parts[1], parts[0]
        return b"".join(parts)

    return {"garbage-first-entry": garbage_first, "end-totals-off-by-one": end_totals_off_by_one,
            "end-offset-off-by-one": end_offset_off_by_one, "swapped-entries": swapped_entries}


@pytest.mark.parametrize("damage", list(_view_damages()))
@pytest.mark.parametrize("which", ["sealed", "active"])
def test_damaged_view_index_after_clean_shutdown(tmp_path, profile, damage, which):
    """Regression: a damaged ``.viewindex`` was trusted after a clean shutdown (only "points past the log" was
    checked): a garbage first entry made every later append fail with EIO (non-increasing position), wrong end
    totals served a wrong view length. Entries are now sanity-checked and a segment's totals checked against the
    log from the entry before them (one index interval); a bad index is rebuilt."""
    rng = random.Random(f"{damage}-{which}")
    clock = ManualClock()
    config = _config(b"=", b"NULL", 100)
    directory = str(tmp_path / "t-0")
    log, batches = _build(directory, config, rng, clock)
    log.close()
    segments = sorted(n for n in os.listdir(directory) if n.endswith(".viewindex"))
    target = os.path.join(directory, segments[1] if which == "sealed" else segments[-1])
    with open(target, "rb") as f:
        data = f.read()
    with open(target, "wb") as f:
        f.write(_view_damages()[damage](data, rng))
    records = [r for b in batches for r in b]
    log = load_log(directory, "t", 0, config, clock=clock, had_clean_shutdown=True)
    try:
        _check(log, records, b"=", b"NULL", rng, f"{damage} in the {which} segment's view index")
        ts = clock.time_ms()
        first, _ = log.append([b"more"], [b"k"])
        _check(log, records + [(first, ts, b"k", b"more")], b"=", b"NULL", rng, "append after repair")
    finally:
        log.close()


def test_last_batch_with_a_rewritten_base_offset(tmp_path, profile):
    """baseOffset is outside the CRC (Kafka v2): a last batch whose base offset goes backwards (a duplicate of
    earlier offsets) must be cut by recovery; one that jumps forward within range is indistinguishable from a
    compacted gap and is kept (the records keep their bytes; their offsets move up)."""
    rng = random.Random(99)
    clock = ManualClock()
    config = _config(None, None, 0)
    src = str(tmp_path / "src" / "t-0")
    log, batches = _build(src, config, rng, clock)
    image = str(tmp_path / "image")
    shutil.copytree(src, image)
    active = log.active_segment
    last_pos = [p for p, _, _, _ in active.batches_from(0)][-1]
    log_name = os.path.basename(active.log_path)
    log.close()
    earlier = [r for b in batches[:-1] for r in b]
    base = batches[-1][0][0]
    work = str(tmp_path / "work" / "t-0")
    for new_base, kept in [(base - 1, False), (earlier[-1][0], False), (0, False), (active.base_offset, False),
                           (base + 1, True), (base + 1000, True), (1 << 40, False)]:
        def rewrite(d, new_base=new_base):
            with open(os.path.join(d, log_name), "r+b") as f:
                f.seek(last_pos)
                f.write(new_base.to_bytes(8, "big"))
        if kept:
            shifted = [(o - base + new_base, ts, k, v) for o, ts, k, v in batches[-1]]
            _reopen_and_check(image, work, config, None, None, earlier + shifted, rng, 0,
                              f"base offset {base} -> {new_base}", clock, rewrite)
        else:
            _reopen_and_check(image, work, config, None, None, earlier, rng, 0,
                              f"base offset {base} -> {new_base}", clock, rewrite)


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("which", ["sealed", "active"])
def test_damaged_last_index_entry_after_clean_shutdown(tmp_path, profile, suffix, which):
    """Regression: a plausible but wrong last entry in an .index/.timeindex (monotonic, so the old sanity checks
    passed) was trusted after a clean shutdown; a time index entry with a too-large offset then failed every
    append with EIO ("time index offset below last entry") and the clean shutdown with a traceback. The last
    entries are now checked against the batch they name; a bad index is rebuilt."""
    import struct

    rng = random.Random(f"{suffix}-{which}")
    clock = ManualClock()
    config = _config(None, None, 100)
    directory = str(tmp_path / "t-0")
    log, batches = _build(directory, config, rng, clock)
    log.close()
    names = sorted(n for n in os.listdir(directory) if n.endswith(suffix))
    target = os.path.join(directory, names[1] if which == "sealed" else names[-1])
    fmt = struct.Struct(">ii" if suffix == ".index" else ">qi")
    with open(target, "r+b") as f:
        data = f.read()
        assert len(data) >= fmt.size, "no entry to damage"
        last = list(fmt.unpack(data[-fmt.size:]))
        last[-1 if suffix == ".timeindex" else 0] += 1000  # the offset it names, past the segment
        f.seek(len(data) - fmt.size)
        f.write(fmt.pack(*last))
    records = [r for b in batches for r in b]
    log = load_log(directory, "t", 0, config, clock=clock, had_clean_shutdown=True)
    try:
        _check(log, records, None, None, rng, f"{which} {suffix}")
        ts = clock.time_ms()
        more = []
        for i in range(30):  # enough to add index entries after the damaged one
            first, _ = log.append([b"more %d" % i + b"x" * 50])
            more.append((first, ts, None, b"more %d" % i + b"x" * 50))
        _check(log, records + more, None, None, rng, "appends after repair", full=False)
    finally:
        log.close()
    log = load_log(directory, "t", 0, config, clock=clock, had_clean_shutdown=True)
    try:
        _check(log, records + more, None, None, rng, "reopened", full=False)
    finally:
        log.close()

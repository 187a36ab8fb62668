"""Every C function of the accelerator against its Python twin (logfs.storage.format.speedups.TWINS), on the same
inputs: the same bytes out, the same refusals."""

from __future__ import annotations

import os
import random

import pytest

from logfs.storage.format import records as rec
from logfs.storage.format import speedups

pytestmark = pytest.mark.skipif(speedups.C is None, reason="the C accelerator is not built (or turned off)")


def _lines(rnd: random.Random, n: int) -> bytes:
    return b"".join(rnd.randbytes(rnd.choice([0, 1, 20, 127, 128, 3000])).replace(b"\n", b"x") + b"\n"
                    for _ in range(n))


def _records(rnd: random.Random, n: int):
    values = [None if rnd.random() < 0.1 else rnd.randbytes(rnd.choice([0, 1, 5, 127, 128, 300, 20000]))
              for _ in range(n)]
    keys = [None if rnd.random() < 0.3 else rnd.randbytes(rnd.choice([0, 3, 200])) for _ in range(n)]
    return values, keys


def _plain_batches(rnd: random.Random, count: int) -> list[bytes]:
    batches, offset, ts = [], 100, 1_700_000_000_000
    for _ in range(count):
        values, keys = _records(rnd, rnd.choice([1, 3, 40]))
        stamps = [ts + rnd.randrange(1000) for _ in values]
        batches.append(rec.build_batch_generic(offset, ts, values, keys, timestamps=stamps))
        offset += len(values)
        ts += 1000
    return batches


def _encode_lines(rnd):
    data = _lines(rnd, rnd.choice([1, 2, 50, 700]))
    prefix = rnd.choice([b"", b"partial-"])
    return (prefix, data + rnd.randbytes(rnd.choice([0, 7])).replace(b"\n", b"y"), len(data),
            rnd.choice([100, 4096, 65536]))


def _grow_lines(rnd):
    (batch, count, _), = speedups.twin("encode_lines")(b"", b"a\nbb\n", 5, 65536)[0]
    rec.finish_batch(batch, 0, count, 1_700_000_000_000)
    data = _lines(rnd, rnd.choice([1, 3, 30]))
    return (batch, b"", data, len(data), rnd.randrange(0, 5000), rnd.choice([200, 4096, 1 << 20]))


def _encode_records(rnd):
    values, keys = _records(rnd, rnd.choice([1, 2, 63, 64, 65, 200]))
    return (values, rnd.choice([None, keys]))


def _render_records(rnd):
    values, keys = _records(rnd, rnd.choice([1, 64]))
    return (rec.build_batch_generic(7, 1_700_000_000_000, values, keys), rnd.choice([None, b"=", b"::"]),
            rnd.choice([None, b"NULL"]))


def _batch_stats(rnd):
    values, keys = _records(rnd, rnd.choice([1, 64]))
    return (rec.build_batch_generic(7, 1_700_000_000_000, values, keys),)


def _min_timestamp(rnd):
    """Batches whose records go back in time (negative deltas), LogAppendTime ones, control ones, empty ones."""
    values, keys = _records(rnd, rnd.choice([1, 2, 64]))
    base = rnd.choice([1_700_000_000_000, 0, -1])
    stamps = [base + rnd.randrange(-5000, 5000) for _ in values]
    attributes = rnd.choice([0, 0, rec.ATTR_TIMESTAMP_TYPE, rec.ATTR_CONTROL])
    if rnd.random() < 0.1:
        return (rec.build_batch_generic(3, base, [], last_offset_delta=4, attributes=attributes),)
    batch = rec.build_batch_generic(7, base, values, keys, timestamps=stamps, attributes=attributes)
    if rnd.random() < 0.1:  # a damaged one: both refuse it
        cut = rnd.randrange(rec.HEADER_SIZE, len(batch))
        batch = batch[:cut]
    return (batch,)


def _merge_batches(rnd):
    batches = _plain_batches(rnd, rnd.choice([1, 2, 9]))
    return (batches, rec.parse_header(batches[-1]).last_offset)


def _murmur2(rnd):
    return (rnd.randbytes(rnd.choice([0, 1, 2, 3, 4, 5, 17, 300])),)


def _index_floor(rnd, tmp_path):
    kind = rnd.choice([0, 1, 2])
    size = {0: 8, 1: 12, 2: 36}[kind]
    n = rnd.choice([0, 1, 2, 7, 100])
    entries, keys = bytearray(), 0
    for i in range(n):
        keys += rnd.randrange(0, 50)
        if kind == 0:
            entries += (keys).to_bytes(4, "big") + (i * 10).to_bytes(4, "big")
        elif kind == 1:
            entries += (1_700_000_000_000 + keys).to_bytes(8, "big") + (i * 3).to_bytes(4, "big")
        else:
            entries += b"".join(v.to_bytes(4, "big") for v in (i * 3, i * 100, keys, i, keys // 2))
            entries += (keys * 2).to_bytes(8, "big") + (keys * 5).to_bytes(8, "big")
    path = tmp_path / f"index-{rnd.random()}"
    path.write_bytes(bytes(entries[: len(entries) - rnd.choice([0, 0, 0, 5]) if n else 0]))
    fd = os.open(path, os.O_RDONLY)
    field = rnd.choice({0: [0], 1: [0, 1], 2: [0, 1, 2]}[kind])
    target = rnd.randrange(-5, keys * 20 + 10) + (1_700_000_000_000 if kind == 1 and field == 0 else 0)
    return (fd, kind, field, n, target, rnd.choice([0, 1, 2]), rnd.choice([0, 4]))


INPUTS = {
    "encode_lines": _encode_lines,
    "grow_lines": _grow_lines,
    "encode_records": _encode_records,
    "render_records": _render_records,
    "batch_stats": _batch_stats,
    "index_floor": _index_floor,
    "merge_batches": _merge_batches,
    "min_timestamp": _min_timestamp,
    "murmur2": _murmur2,
}


def _outcome(fn, args):
    args = [bytearray(a) if isinstance(a, bytearray) else a for a in args]  # each side grows its own copy
    try:
        out = fn(*args)
    except (ValueError, OSError) as exc:
        return ("refused", type(exc).__name__)
    return (out, [a for a in args if isinstance(a, bytearray)])


def test_every_c_function_has_a_twin_or_a_named_python_path():
    assert set(speedups.TWINS) | set(speedups.PYTHON_PATHS) == {
        name for name in dir(speedups.C) if not name.startswith("_") and callable(getattr(speedups.C, name))}
    assert set(INPUTS) == set(speedups.TWINS)


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_c_and_twin_give_the_same_bytes(name, seed, tmp_path):
    rnd = random.Random(f"{name}-{seed}")
    make = INPUTS[name]
    args = make(rnd, tmp_path) if name == "index_floor" else make(rnd)
    try:
        c = _outcome(getattr(speedups.C, name), args)
        py = _outcome(speedups.twin(name), args)
    finally:
        if name == "index_floor":
            os.close(args[0])
    assert c == py


def test_refusals_match():
    for args in [(b"", b"no newline", 10, 100), (b"a\nb", b"x\n", 2, 100), (b"", b"", 0, 100)]:
        assert _outcome(speedups.C.encode_lines, args) == _outcome(speedups.twin("encode_lines"), args)
    for args in [(bytearray(10), b"", b"x\n", 2, 0, 100)]:
        assert _outcome(speedups.C.grow_lines, args) == _outcome(speedups.twin("grow_lines"), args)
    plain = rec.build_batch_generic(0, 5, [b"a", b"b"], timestamps=[9, 5])
    for args in [(b"",), (plain[:60],), (rec.compress_batch(plain, 1),), (plain[:16] + b"\x01" + plain[17:],)]:
        assert _outcome(speedups.C.min_timestamp, args) == _outcome(speedups.twin("min_timestamp"), args) == (
            "refused", "ValueError")
    assert speedups.C.min_timestamp(plain) == speedups.twin("min_timestamp")(plain) == 5


def test_the_switch_turns_c_off_for_the_process(tmp_path):
    import subprocess
    import sys

    probe = "from logfs.storage.format import speedups; print(speedups.C is None)"
    env = {**os.environ, "LOGFS_NO_SPEEDUPS": "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"

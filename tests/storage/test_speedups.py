"""The C accelerator produces exactly the bytes of the pure-Python/aiokafka paths it replaces."""

import random

import pytest

from logfs.storage import records as rec
from logfs.view.text import LineFormat

speedups = pytest.importorskip("logfs._speedups")


def random_records(rnd, n):
    values = [None if rnd.random() < 0.1 else rnd.randbytes(rnd.choice([0, 1, 5, 127, 128, 300, 20000]))
              for _ in range(n)]
    keys = [None if rnd.random() < 0.3 else rnd.randbytes(rnd.choice([0, 3, 200])) for _ in range(n)]
    return values, keys


@pytest.mark.parametrize("seed", range(20))
def test_encode_matches_aiokafka_builder(seed):
    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.choice([1, 2, 63, 64, 65, 200, 2000]))
    ts = 1_700_000_000_000 + seed
    for k in (None, keys):
        fast = rec.build_batch(12345 + seed, ts, values, k)
        slow = rec.build_batch_generic(12345 + seed, ts, values, k)
        assert fast == slow
        rec.validate(fast)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("fmt", [LineFormat(), LineFormat(b"=", None), LineFormat(None, b"NULL"),
                                 LineFormat(b"::", b"<nil>")])
def test_render_matches_generic(seed, fmt):
    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.choice([1, 64, 500]))
    headers = [[("h", b"v")] if rnd.random() < 0.2 else [] for _ in values]
    batch = rec.build_batch_generic(7, 1_700_000_000_000, values, keys, headers)
    expected = b"".join(fmt.line(r.key, r.value) for r in rec.decode(batch))
    assert speedups.render_records(batch, fmt.separator, fmt.null_marker) == expected
    assert fmt.render(batch, 0, len(batch))[0] == expected


def test_render_rejects_malformed_and_compressed():
    batch = bytearray(rec.build_batch(0, 1, [b"abc", b"def"]))
    with pytest.raises(ValueError):
        speedups.render_records(bytes(batch[:70]))
    batch[22] |= 1  # gzip attribute
    with pytest.raises(ValueError):
        speedups.render_records(bytes(batch))


@pytest.mark.parametrize("seed", range(10))
def test_render_span_renders_whole_batches_up_to_want(seed):
    rnd = random.Random(seed)
    fmt = LineFormat(b"=", b"NULL") if seed % 2 else LineFormat()
    batches, offset = [], 0
    for _ in range(rnd.randrange(1, 8)):
        values, keys = random_records(rnd, rnd.randrange(1, 50))
        batches.append(rec.build_batch(offset, 1_700_000_000_000, values, keys))
        offset += len(values)
    rendered = [b"".join(fmt.line(r.key, r.value) for r in rec.decode(b)) for b in batches]
    buf = b"".join(batches)
    for want in (0, 1, len(rendered[0]), len(rendered[0]) + 1, sum(map(len, rendered)), 1 << 30):
        out, consumed, special, last_start, last_out = speedups.render_span(buf, want, fmt.separator,
                                                                            fmt.null_marker)
        k = sum(1 for n in range(len(batches)) if sum(map(len, rendered[:n])) < want) if want else 0
        k = max(k, 0)
        assert out == b"".join(rendered[:k])
        assert consumed == sum(map(len, batches[:k]))
        assert not special
        if k:
            assert last_start == sum(map(len, batches[: k - 1]))
            assert last_out == sum(map(len, rendered[: k - 1]))
    # A partial batch at the end is not rendered; a compressed batch stops the span.
    out, consumed, special, _, _ = speedups.render_span(buf[:-1], 1 << 30, fmt.separator, fmt.null_marker)
    assert consumed == sum(map(len, batches[:-1]))
    gz = bytearray(batches[-1])
    gz[22] |= 1
    out, consumed, special, _, _ = speedups.render_span(b"".join(batches[:-1]) + bytes(gz), 1 << 30,
                                                        fmt.separator, fmt.null_marker)
    assert special and consumed == sum(map(len, batches[:-1]))


@pytest.mark.parametrize("seed", range(10))
def test_batch_stats_matches_decoding(seed):
    from logfs.storage import segment

    rnd = random.Random(seed)
    values, keys = random_records(rnd, rnd.randrange(1, 300))
    batch = rec.build_batch(0, 1, values, keys)
    expected = (len(values), sum(k is not None for k in keys), sum(v is None for v in values),
                sum(len(k) for k in keys if k is not None), sum(len(v) for v in values if v is not None))
    assert speedups.batch_stats(batch) == expected
    assert tuple(segment.batch_stats(b"xx" + batch, 2, len(batch))) == expected

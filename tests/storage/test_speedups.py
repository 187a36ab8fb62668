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

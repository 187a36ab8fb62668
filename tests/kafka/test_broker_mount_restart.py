"""A broker restarted under its read-only mount (CONTRACT.md section 14; issue 45): a broker of this module's own,
stopped and started, and killed.

- a clean restart: an open file (``tail -f``-style) goes on reading, every line once, and the broker's own
  consumer reads the same records before and after;
- a crash whose tail the page cache lost (the test cuts the active segment in the middle of its last batch while
  the broker is down, as a power cut leaves it): the broker's recovery truncates it, and the offsets are used
  again by later appends; the mount shows what the files hold (never the bytes that are gone) and the later
  appends, as the broker's consumer reads them;
- the broker's server log shows no ERROR while the mount follows it.
"""

from __future__ import annotations

import errno
import os

import pytest

from logfs.storage.format import records as rec
from logfs.testing.kafka import running_broker

from harness import mounted_at, wait_for
from open_reader import OpenReader, produce_lines

pytestmark = pytest.mark.mount

TOPIC = "restarted"


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    with running_broker(tmp_path_factory.mktemp("kafka-broker-restart"), kafka_client) as b:
        b.create_topic(TOPIC, 1, {"internal.segment.bytes": "4096"})
        yield b


def produce(client, broker, start: int, count: int) -> bytes:
    return produce_lines(client, broker, TOPIC, [f"{TOPIC} line {i} {'r' * 30}".encode()
                                                 for i in range(start, start + count)])


def consumed(client, broker) -> list:
    return client.consume(broker.bootstrap, TOPIC, 0)


def as_text(records) -> bytes:
    return b"".join(r.value + b"\n" for r in records)


def errors_since(broker, at: int) -> list[str]:
    with open(broker.log_file, "rb") as f:
        f.seek(at)
        return [line for line in f.read().decode(errors="replace").splitlines() if " ERROR " in line]


def test_a_clean_restart_then_a_crash_that_lost_a_tail(broker, kafka_client, mount_logfs, tmp_path):
    log_dir = broker.log_dirs[0]
    part = log_dir / f"{TOPIC}-0"
    sent = produce(kafka_client, broker, 0, 60)
    log_at = broker.log_file.stat().st_size
    fs = mount_logfs("ro", f"logfs.cache.dir={tmp_path / 'cache'}", "logfs.broker.poll.ms=100",
                     prepare=lambda m: setattr(m, "source", str(log_dir)))
    reader = OpenReader(fs.path(TOPIC, 0))
    caught_up = reader.reaches
    try:
        caught_up(sent)
        before = consumed(kafka_client, broker)

        # A clean restart: nothing of the log changes; the open file goes on with the later appends.
        broker.stop()
        broker.start()
        assert consumed(kafka_client, broker) == before
        sent += produce(kafka_client, broker, 60, 60)
        caught_up(sent)
        assert fs.read(f"{TOPIC}/0") == as_text(consumed(kafka_client, broker)) == sent

        # A crash that lost the tail of the active segment (cut in its last batch while the broker is down).
        sent += produce(kafka_client, broker, 120, 30)
        caught_up(sent)
        broker.kill()
        active = max(part.glob("*.log"))
        data = active.read_bytes()
        at, last = 0, 0
        while at < len(data):
            last, at = at, at + rec.peek_size(data, at)
        os.truncate(active, last + 30)
        lost_from = rec.parse_header(data, last).base_offset
        broker.start()
        after = consumed(kafka_client, broker)
        assert [r.offset for r in after] == list(range(lost_from))  # (the broker's recovery cut the torn batch)
        more = produce(kafka_client, broker, 1000, 40)  # (at the lost offsets again)
        expected = as_text(consumed(kafka_client, broker))
        assert expected.endswith(more) and len(expected) < len(sent) + len(more)

        def shown():
            return fs.read(f"{TOPIC}/0") == expected

        wait_for(shown, 60, interval=0.1, what="the recovered log and the later appends through the mount")
        # The open file had read past what is gone: its next read fails (ESTALE), or shows only lines the log holds.
        try:
            tail = reader.file.read()
            assert set(tail.splitlines()) <= set(expected.splitlines()), tail[:200]
        except OSError as exc:
            assert exc.errno == errno.ESTALE, exc
        assert not errors_since(broker, log_at), errors_since(broker, log_at)
    finally:
        reader.close()
        if mounted_at(fs.mnt):
            fs.unmount()

"""kill -9 of the daemon at random moments during small appends (one line per write(), each growing the tail
batch of the active segment in place), then remount, many times.

Two writer processes append one self-checking line per write() and record each write() that returned; an
in-process reader (the Spark source's read-only PartitionReader, no JVM) reads the partition's tail in a loop
meanwhile. After each kill and remount:

- every line whose write() returned is there, once, each writer's lines in order; no torn or foreign line;
- kafka-python parses every segment (CRCs valid, no trailing bytes) and finds exactly the lines the mount serves;
- the concurrent reader never failed, never logged corruption, and always saw each writer's lines in order.

SHORT profile: 10 cycles; LONG (LOGFS_LONG=1): 50.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from rel_helpers import LINE_CODE, LINE_RE, make_line, parse_partition_dir_records, scale

pytestmark = pytest.mark.mount

SEED = int(os.environ.get("LOGFS_SEED", "15"))

WRITER = LINE_CODE + r'''
import os, sys
path, writer, ack_path, pad_max = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ack = open(ack_path, "a", buffering=1)
seq = 0
try:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    while True:
        line = make_line(writer, seq, 0, pad_max) + b"\n"
        assert os.write(fd, line) == len(line)
        ack.write("w %d\n" % seq)
        seq += 1
except OSError as exc:
    ack.write("error %d\n" % (exc.errno or 0))
'''


PAD_MAX = {"a": 20, "b": 100}  # writer a: ~25-byte lines, b: ~70 on average


def parse_line(line: bytes) -> tuple[str, int]:
    """(writer, seq) of a line a writer here wrote; AssertionError for anything else (torn, corrupt, spliced)."""
    m = LINE_RE.match(line)
    assert m, f"line not written by any writer: {line[:160]!r}"
    writer, seq = m.group("w").decode(), int(m.group("seq"))
    assert line == make_line(writer, seq, 0, PAD_MAX[writer[0]]), f"corrupt line: {line[:160]!r}"
    return writer, seq


def _acked(path) -> int:
    last = -1
    for line in open(path).read().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "w":
            last = max(last, int(rest))
    return last


class TailReader(threading.Thread):
    """The Spark source's reader reading the partition's tail in a loop: any exception is kept."""

    def __init__(self, data_dir: str):
        super().__init__(daemon=True)
        from logfs.spark.segments import PartitionReader, TopicPartition

        self.reader = PartitionReader(data_dir, TopicPartition("t", 0))
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.reads = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                start, end = self.reader.offsets()
                last: dict[str, int] = {}
                for r in self.reader.records(start, end):
                    writer, seq = parse_line(r.value)
                    assert seq > last.get(writer, -1), f"{writer}:{seq} after {last.get(writer)}"
                    last[writer] = seq
                self.reads += 1
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.failures.append(exc)
                return


def test_kill9_during_small_appends(mount_logfs, tmp_path, profile, caplog):
    cycles = scale(10, 50)
    rng = random.Random(SEED)
    fs = mount_logfs("num.partitions=1", "log.segment.bytes=65536", foreground=True)
    os.mkdir(fs.path("t"))
    partition = fs.path("t", 0)
    directory = str(fs.data / "t-0")
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    caplog.set_level(logging.DEBUG, logger="logfs.storage.local.reader")
    acked: dict[str, int] = {}
    reads = 0
    for cycle in range(cycles):
        writers = []
        for w, pad_max in PAD_MAX.items():
            name = f"{w}{cycle}"
            ack = ack_dir / f"{name}.ack"
            ack.write_text("")
            proc = subprocess.Popen([sys.executable, "-c", WRITER, partition, name, str(ack), str(pad_max)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            writers.append((name, ack, proc))
        tail = TailReader(str(fs.data))
        tail.start()
        deadline = time.monotonic() + 30
        while not all(_acked(ack) >= 0 for _, ack, _ in writers):  # both writing (interpreters started)
            assert time.monotonic() < deadline, "the writers never wrote"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        fs.kill9()
        tail.stop.set()
        tail.join(30)
        for name, ack, proc in writers:
            _, err = proc.communicate(timeout=30)
            assert b"Traceback" not in err, err.decode(errors="replace")[-2000:]
            acked[name] = _acked(ack)
        assert not tail.failures, f"cycle {cycle}: the tail reader failed: {tail.failures[0]!r}"
        reads += tail.reads
        fs.mount(*fs.options, foreground=True)

        content = fs.read("t/0")
        assert content.endswith(b"\n") or content == b""
        lines = content.split(b"\n")[:-1]
        ids = [parse_line(line) for line in lines]
        assert len(set(ids)) == len(ids), f"cycle {cycle}: duplicated lines"
        by_writer: dict[str, list[int]] = {}
        for writer, seq in ids:
            by_writer.setdefault(writer, []).append(seq)
        for name, last in acked.items():
            seqs = by_writer.get(name, [])
            # Every acknowledged line, in order, once; at most the one write in flight beyond.
            assert seqs[: last + 1] == list(range(last + 1)), f"cycle {cycle}: {name} lost acknowledged lines"
            assert len(seqs) <= last + 2, f"cycle {cycle}: {name} has lines never written"
        on_disk = parse_partition_dir_records(directory)
        assert [v for _, _, v in on_disk] == lines, f"cycle {cycle}: kafka-python disagrees with the mount"
        assert [o for o, _, _ in on_disk] == list(range(len(lines)))
    assert reads > cycles
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "the tail reader reported damage"
    assert sum(acked.values()) > 100 * cycles

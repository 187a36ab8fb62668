"""Startup after a kill -9 reports recovery progress (segments recovered / total) in STATUS= and in the log,
and the manager's segment-level progress callback that feeds it."""

from __future__ import annotations

import os
import re

from logfs.storage import BrokerConfig, LogManager

CLEAN = ".kafka_cleanshutdown"
OPTIONS = "num.partitions=3,log.segment.bytes=4096,log.index.interval.bytes=512"
PROGRESS = re.compile(r"^recovering after an unclean shutdown: (\d+)/(\d+) segments, (\d+)/(\d+) partitions$")


def _fill(mnt, topic: str, partitions: int, lines: int) -> None:
    os.mkdir(mnt / topic)
    for p in range(partitions):
        with open(mnt / topic / str(p), "a") as f:
            f.write("".join(f"{topic}-{p}-{i:05d}-" + "x" * 80 + "\n" for i in range(lines)))


def _segment_count(data) -> int:
    return sum(1 for d in os.listdir(data) if os.path.isdir(data / d)
               for n in os.listdir(data / d) if n.endswith(".log"))


def test_recovery_progress_after_kill9(service, notify_socket):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, OPTIONS, journal=True)
    sock.wait_for("READY", proc=proc)
    _fill(svc.mnt, "orders", 3, 300)
    _fill(svc.mnt, "events", 3, 100)
    expected = {p: (svc.mnt / "orders" / str(p)).read_bytes() for p in range(3)}
    svc.kill9()
    assert not os.path.exists(svc.data / CLEAN)
    segments = _segment_count(svc.data)
    assert segments >= 20

    sock2 = notify_socket(abstract=True)
    proc = svc.start(sock2, OPTIONS, journal=True)
    ready = sock2.wait_for("READY", proc=proc)
    assert ready.mounted and ready.root_ino == 1
    before_ready = [m for m in sock2.messages if m.received < ready.received]
    progress = [PROGRESS.match(m.fields["STATUS"]) for m in before_ready if "STATUS" in m.fields]
    progress = [(int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in progress if m]
    assert progress, [m.raw for m in sock2.messages]
    # Counted over all partitions: starts at 0, never goes back, ends with every segment and partition done.
    assert progress[0][0] == 0 and progress[0][1] == segments and progress[0][3] == 6, progress
    assert [p[0] for p in progress] == sorted(p[0] for p in progress)
    assert progress[-1] == (segments, segments, 6, 6), progress
    assert all("EXTEND_TIMEOUT_USEC" in m.fields for m in before_ready if "STATUS" in m.fields and
               PROGRESS.match(m.fields["STATUS"]))

    log = svc.stderr().split("\n")
    assert f"<6>logfs: recovering after an unclean shutdown: 0/{segments} segments, 0/6 partitions" in log, log
    assert any(re.match(rf"<6>logfs: recovered {segments}/{segments} segments of 6 partitions in ", line)
               for line in log), log
    assert "Traceback" not in svc.stderr()

    for p in range(3):
        assert (svc.mnt / "orders" / str(p)).read_bytes() == expected[p]
    assert svc.stop() == 0
    assert os.path.exists(svc.data / CLEAN)


def test_manager_segment_progress_counts_all_partitions(tmp_path):
    broker = BrokerConfig.from_properties({"log.segment.bytes": "2048", "num.partitions": "2"})
    m = LogManager(str(tmp_path), broker)
    m.create_topic("a")
    m.create_topic("b", partitions=1)
    for topic, partition in m.logs:
        m.get_log(topic, partition).append([b"v" * 100] * (30 if topic == "a" else 5))
    m.flush_all()
    m.abandon()
    total = sum(len(plog.segments) for plog in m.logs.values())
    assert total > 3

    seen_segments, seen_partitions = [], []
    m = LogManager(str(tmp_path), broker, progress=lambda d, t: seen_partitions.append((d, t)),
                   segment_progress=lambda d, t: seen_segments.append((d, t)))
    try:
        assert m.recovered
        assert seen_partitions == [(1, 3), (2, 3), (3, 3)]
        assert seen_segments[0] == (0, total) and seen_segments[-1] == (total, total)
        assert all(t == total for _, t in seen_segments)
        done = [d for d, _ in seen_segments]
        assert done == sorted(done) and set(range(total + 1)) <= set(done)
    finally:
        m.close()
    # Without the new argument, loading is as before.
    m = LogManager(str(tmp_path), broker)
    assert not m.recovered
    m.close()


def test_manager_segment_progress_total_corrects_itself(tmp_path):
    """The first total counts ``.log`` files; when a later partition's loader settles on fewer segments (here a
    stray ``notes.log`` in a-1 that is no segment), the total is corrected and the last report is done == total."""
    broker = BrokerConfig.from_properties({"log.segment.bytes": "2048", "num.partitions": "2"})
    m = LogManager(str(tmp_path), broker)
    m.create_topic("a")
    for p in range(2):
        m.get_log("a", p).append([b"v" * 100] * 40)
    m.flush_all()
    real = sum(len(plog.segments) for plog in m.logs.values())
    m.abandon()
    (tmp_path / "a-1" / "notes.log").write_text("not a segment\n")
    seen = []
    m = LogManager(str(tmp_path), broker, segment_progress=lambda d, t: seen.append((d, t)))
    try:
        assert seen[0] == (0, real + 1)
        assert seen[-1] == (real, real)
        assert {t for _, t in seen} == {real + 1, real}
        assert all(d <= t for d, t in seen)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    finally:
        m.close()

"""``logfs-kafka-handover`` (logfs/tools/handover.py) on a Kafka log directory laid out as a stopped broker leaves a
topic it created and never wrote (no JVM here: tests/kafka/test_handover.py runs the real broker): the files it
writes, the checkpoints of other partitions kept, the leader epochs rebuilt from the batches, an interrupted run
finished by the next, and every refusal (one line, nothing written)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from logfs.storage import BrokerConfig, LogManager, ManualClock
from logfs.storage.checkpoints import read_checkpoint
from logfs.tools import handover as ho

TOPIC_ID = "Zx0Kq3vSTyqzZ3xYbH4i0A"
T0 = 1_700_000_000_000


def kafka_dir(root: Path, partitions: int, topic: str = "t") -> Path:
    """What a KRaft broker leaves for a topic it created, then stopped cleanly (tests/kafka saw the same files)."""
    d = root / "kafka"
    d.mkdir()
    (d / "meta.properties").write_text("node.id=1\ndirectory.id=abc\nversion=1\ncluster.id=xyz\n")
    (d / ".kafka_cleanshutdown").write_text("")
    for p in range(partitions):
        part = d / f"{topic}-{p}"
        part.mkdir()
        (part / "partition.metadata").write_text(f"version: 0\ntopic_id: {TOPIC_ID}")
        (part / "leader-epoch-checkpoint").write_text("0\n1\n3 0\n")  # (restarted since: epoch 3)
        for suffix in (".log", ".index", ".timeindex"):
            (part / f"{0:020d}{suffix}").write_bytes(b"")
    entries = "".join(f"{topic} {p} 0\n" for p in range(partitions))
    for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint"):
        (d / name).write_text(f"0\n{partitions + 1}\nother 0 55\n{entries}")
    (d / "log-start-offset-checkpoint").write_text("0\n1\nother 0 7\n")
    return d


def logfs_data(root: Path, partitions: int = 2) -> tuple[Path, dict]:
    """A topic of ``partitions`` written by logfs's engine, several segments each; partition 1's start moved inside
    its third segment by DeleteRecords (no retention pass since: its first two segments are below the start)."""
    data = root / "data"
    manager = LogManager(str(data), BrokerConfig.from_properties({"log.segment.bytes": "1024"}),
                         clock=ManualClock(T0))
    manager.create_topic("t", partitions)
    for p in range(partitions):
        plog = manager.get_log("t", p)
        for i in range(60):
            plog.append([b"value %d" % i], [b"key-%d" % (i % 3)], headers=[[("h", b"%d" % i)]])
    bases = [s.base_offset for s in manager.get_log("t", 1).segments.as_list()]
    manager.delete_records("t", 1, bases[2] + 1)
    offsets = {p: (manager.get_log("t", p).log_start_offset, manager.get_log("t", p).log_end_offset,
                   [s.base_offset for s in manager.get_log("t", p).segments.as_list()]) for p in range(partitions)}
    manager.close()
    return data, offsets


def run(data: Path, kafka: Path, topic: str = "t", **kw) -> str:
    out = io.StringIO()
    ho.handover(str(data), topic, str(kafka), out=out, **kw)
    return out.getvalue()


def test_fills_the_partitions_and_sets_the_checkpoints(tmp_path):
    data, offsets = logfs_data(tmp_path)
    kafka = kafka_dir(tmp_path, 2)
    printed = run(data, kafka)
    assert "handing over t from" in printed and f"Kafka topic id {TOPIC_ID}" in printed
    for p, (start, end, bases) in offsets.items():
        part = kafka / f"t-{p}"
        kept = [b for b, after in zip(bases, bases[1:] + [None]) if after is None or after > start]
        assert (part / "partition.metadata").read_text() == f"version: 0\ntopic_id: {TOPIC_ID}"  # the broker's
        names = sorted(os.listdir(part))
        assert names == sorted([f"{b:020d}{s}" for b in kept for s in (".log", ".index", ".timeindex")]
                               + ["leader-epoch-checkpoint", "partition.metadata"])
        for b in kept:  # the segments byte for byte, the indexes up to their last entry
            for suffix in (".log", ".index", ".timeindex"):
                src = (data / f"t-{p}" / f"{b:020d}{suffix}").read_bytes()
                assert (part / f"{b:020d}{suffix}").read_bytes() == src
            assert os.stat(part / f"{b:020d}.log").st_mtime_ns == os.stat(data / f"t-{p}" / f"{b:020d}.log").st_mtime_ns
        assert (part / "leader-epoch-checkpoint").read_text() == f"0\n1\n0 {start}\n"
        assert f"t-{p}: offsets {start} to {end} (log start, log end)" in printed
    assert offsets[1][0] > offsets[1][2][1]  # (partition 1's first two segments were below its start: not copied)
    ends = {("t", p): end for p, (_, end, _) in offsets.items()}
    assert read_checkpoint(str(kafka / "recovery-point-offset-checkpoint")) == {("other", 0): 55, **ends}
    assert read_checkpoint(str(kafka / "replication-offset-checkpoint")) == {("other", 0): 55, **ends}
    assert read_checkpoint(str(kafka / "log-start-offset-checkpoint")) == {
        ("other", 0): 7, **{("t", p): start for p, (start, _, _) in offsets.items()}}
    assert not (kafka / ".lock").exists()  # (taken, and removed again: a stopped broker has none)
    with pytest.raises(ho.HandoverError, match="holds records"):
        run(data, kafka)


def test_an_interrupted_run_is_finished_by_the_next(tmp_path, monkeypatch):
    data, offsets = logfs_data(tmp_path)
    kafka = kafka_dir(tmp_path, 2)
    real = ho.ckpt.write_checkpoint

    def crash(path, entries):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ho.ckpt, "write_checkpoint", crash)  # the copies are in place, no checkpoint written
    with pytest.raises(OSError):
        run(data, kafka)
    assert all((kafka / f"t-{p}" / ho.MARKER).exists() for p in range(2))
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ho.HandoverError, match="names another hand-over"):
        run(other, kafka)  # (a marker of this run: only this run may finish it)
    monkeypatch.setattr(ho.ckpt, "write_checkpoint", real)
    assert "finishing an interrupted run" in run(data, kafka)
    assert not any((kafka / f"t-{p}" / ho.MARKER).exists() for p in range(2))
    assert not [n for p in range(2) for n in os.listdir(kafka / f"t-{p}") if n.endswith(ho.TMP)]
    assert read_checkpoint(str(kafka / "recovery-point-offset-checkpoint"))[("t", 1)] == offsets[1][1]


@pytest.mark.parametrize("case,message", [
    ("fewer Kafka partitions", r"logfs's t has partitions \[0, 1\], Kafka's \[0\]"),
    ("no Kafka topic", "no partition of t in"),
    ("no partition.metadata", "partition.metadata is missing: the broker would move"),
    ("records in Kafka", "holds records"),
    ("a checkpoint names records", "has t 1 at 12: that partition had records"),
    ("not formatted", "meta.properties is missing"),
    ("malformed checkpoint", "cannot read .*replication-offset-checkpoint"),
    ("no such logfs topic", "has no topic 'u'"),
    ("logfs mounted", "unmount logfs first"),
])
def test_refusals_write_nothing(tmp_path, case, message):
    data, _ = logfs_data(tmp_path)
    kafka = kafka_dir(tmp_path, 1 if case == "fewer Kafka partitions" else 2,
                      topic="u" if case == "no such logfs topic" else "t")
    if case == "no Kafka topic":
        for p in range(2):
            for n in os.listdir(kafka / f"t-{p}"):
                os.unlink(kafka / f"t-{p}" / n)
            os.rmdir(kafka / f"t-{p}")
    elif case == "no partition.metadata":
        os.unlink(kafka / "t-1" / "partition.metadata")
    elif case == "records in Kafka":
        (kafka / "t-1" / f"{0:020d}.log").write_bytes(b"x" * 100)
    elif case == "a checkpoint names records":
        (kafka / "replication-offset-checkpoint").write_text("0\n2\nt 0 0\nt 1 12\n")
    elif case == "not formatted":
        os.unlink(kafka / "meta.properties")
    elif case == "malformed checkpoint":
        (kafka / "replication-offset-checkpoint").write_text("0\n3\nt 0 0\n")
    before = {p: sorted(os.listdir(p)) for p in [kafka, *kafka.iterdir()] if p.is_dir()}
    manager = LogManager(str(data)) if case == "logfs mounted" else None  # (holds DATA_DIR's .lock, as a mount)
    try:
        with pytest.raises(ho.HandoverError, match=message):
            run(data, kafka, topic="u" if case == "no such logfs topic" else "t")
    finally:
        if manager is not None:
            manager.close()
    assert {p: sorted(os.listdir(p)) for p in [kafka, *kafka.iterdir()] if p.is_dir()} == before


def test_dry_run_writes_nothing_and_the_command_says_why_in_one_line(tmp_path, capsys):
    data, _ = logfs_data(tmp_path)
    kafka = kafka_dir(tmp_path, 2)
    assert ho.main([str(data), "t", str(kafka), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would hand over t from") and out.endswith("dry run: nothing written\n")
    assert all(os.path.getsize(kafka / f"t-{p}" / f"{0:020d}.log") == 0 for p in range(2))
    assert ho.main([str(data), "t", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("logfs-kafka-handover: error: ") and err.count("\n") == 1, err


def test_old_records_get_a_note_about_kafkas_retention(tmp_path):
    data, _ = logfs_data(tmp_path)  # (records from 2023: T0)
    printed = run(data, kafka_dir(tmp_path, 2))
    assert "note: t-0 has a segment whose newest record is from 2023-11-14" in printed
    assert "retention.ms" in printed

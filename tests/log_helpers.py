"""Helpers for tests that drive the engine's partition logs directly (no mount)."""

from __future__ import annotations

import glob
import os


def read_all(log) -> list:
    """Every record of ``log`` from its log start offset to its end, read a batch at a time."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        got = log.read(offset)
        if not got:
            break
        out += got
        offset = got[-1].offset + 1
    return out


def log_file_records(partition_dir) -> list:
    """Every record of a partition directory's ``.log`` files in order, parsed by kafka-python (a reader
    independent of logfs); every batch is asserted a v2 batch whose CRC checks."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    out = []
    for path in sorted(glob.glob(os.path.join(partition_dir, "*.log"))):
        with open(path, "rb") as f:
            records = MemoryRecords(f.read())
        while records.has_next():
            batch = records.next_batch()
            assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
            out.extend(batch)
    return out


def reopen_clean(machine, reopen) -> None:
    """A model-based test's clean restart: ``machine.manager`` closed cleanly, ``reopen()`` (which sets
    ``machine.manager`` and ``machine.log`` again), then what a clean shutdown keeps: its marker, and a recovery
    point at the log end; from then on the checkpointed start is the model's start."""
    machine.manager.close()
    reopen()
    assert machine.manager.had_clean_shutdown
    assert machine.log.recovery_point == machine.model.end
    machine.model.checkpointed_start = machine.model.start

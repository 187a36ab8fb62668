"""Kafka's per-directory text checkpoint files, written atomically.

Format (``OffsetCheckpointFile``)::

    0                 <- version
    2                 <- number of entries
    orders 0 1234     <- topic partition offset
    orders 1 99

Written as temp file, fsync, rename over, fsync of the directory: a crash leaves the old or the new file.
"""

from __future__ import annotations

import os

from .names import CLEAN_SHUTDOWN, CLEANER_OFFSET, LOG_START_OFFSET, RECOVERY_POINT, tmp_name  # noqa: F401


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    tmp = tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def write_checkpoint(path: str, offsets: dict[tuple[str, int], int]) -> None:
    lines = ["0", str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(path: str) -> dict[tuple[str, int], int]:
    """Entries of a checkpoint file; a missing or malformed file reads as empty (Kafka then recovers or
    falls back to the segments' own bounds, so a bad checkpoint is never fatal)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return {}
    try:
        if lines[0].strip() != "0":
            return {}
        count = int(lines[1])
        out = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split()
            out[(topic, int(partition))] = int(offset)
        if len(out) != count:
            return {}
        return out
    except (IndexError, ValueError):
        return {}

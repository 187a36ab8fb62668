"""Partition directories renamed for deletion (``<topic>-<n>.<id>-delete``), removed after
``file.delete.delay.ms``: a deleted partition's, or a moved partition's source. Held by the
:class:`~logfs.storage.manager.LogManager` (its ``deleted_dirs``); the service purges them in a worker thread, and
the next mount removes any a crash left behind.
"""

from __future__ import annotations

import os
import shutil
import threading

from .clock import Clock
from .log_dirs import DataDir


class DeletedDirs:
    """The directories renamed for deletion, each with the time it is due (ms)."""

    def __init__(self, dirs_by_path: dict[str, DataDir], clock: Clock):
        self.dirs_by_path, self.clock = dirs_by_path, clock
        self.lock = threading.Lock()
        self.pending: list[tuple[int, str]] = []

    def defer(self, path: str, delay_ms: int) -> None:
        """Remove ``path`` ``delay_ms`` from now."""
        with self.lock:
            self.pending.append((self.clock.time_ms() + delay_ms, path))

    def remove_now(self, path: str) -> None:
        """Remove ``path`` at once (a full disk: the room is needed now), whatever its delay."""
        with self.lock:
            self.pending = [(t, p) for t, p in self.pending if p != path]
        shutil.rmtree(path, ignore_errors=True)

    def purge_due(self, now_ms: int | None = None) -> int:
        """Remove the directories whose delay has passed. An error of the disk on the way takes that directory
        offline and is raised once all are tried; what is left behind is removed at the next mount."""
        now = self.clock.time_ms() if now_ms is None else now_ms
        with self.lock:
            due = [p for t, p in self.pending if t <= now]
            self.pending = [(t, p) for t, p in self.pending if t > now]
        failures: list[OSError] = []

        def failed(_fn, _path, exc_info) -> None:
            if not isinstance(exc_info[1], FileNotFoundError):  # (gone already: nothing to remove)
                failures.append(exc_info[1])

        for path in due:
            d = self.dirs_by_path.get(os.path.dirname(path))
            if d is not None and d.offline:
                continue  # (the next mount removes it)
            before = len(failures)
            shutil.rmtree(path, onerror=failed)
            if d is not None and len(failures) > before:
                d.log_dir.io_error(failures[before], f"removing {os.path.basename(path)} in {d.path}")
        if failures:
            raise failures[0]
        return len(due)

"""Loading the log directories at mount: each one's partitions, recovered from its checkpoints, and the moves a
crash interrupted settled. :class:`LogDirsLoader` runs once, from the :class:`~logfs.storage.manager.LogManager`'s
constructor: it fills the manager's logs and sets what loading found (``had_clean_shutdown``, ``recovered``, the
cleaner checkpoints)."""

from __future__ import annotations

import logging
import os
import shutil

from . import checkpoints as ckpt
from .errors import LogfsError
from .local.loader import load_log
from .log_dirs import DataDir
from .names import LOG_SUFFIX, DataDirScan, collision_key, parse_partition_dir, partition_dir_name

log = logging.getLogger(__name__)


class LogDirsLoader:
    """Loads every log directory of one LogManager (the manager's own files: its settings, its checkpoints)."""

    def __init__(self, manager):  # (a LogManager: not imported, it imports this module)
        self.manager = manager

    def load(self, progress, segment_progress=None) -> None:
        m = self.manager
        cleans = [d.take_clean_marker() for d in m.dirs]
        m.had_clean_shutdown = all(cleans)
        m.settings.load()
        m.cleaner_checkpoints = {}
        states: dict[str, tuple[dict, dict]] = {}
        entries: list[tuple[tuple[str, int], str, DataDir]] = []
        futures: list[tuple[tuple[str, int], str, DataDir]] = []
        for d in m.dirs:
            recovery, starts, cleaned = d.read_checkpoints()
            states[d.path] = (recovery, starts)
            scan = DataDirScan(d.path)
            for path in scan.delete_dirs:
                shutil.rmtree(path, ignore_errors=True)  # deletion already decided before the restart
            for name in scan.internal:
                log.warning("ignoring %s in %s: a partition of a topic Kafka reserves for itself (not served)",
                            name, d.path)
            # A broker's directory: the checkpoint entries of its internal partitions stay in the files.
            d.keep_entries((parse_partition_dir(name) for name in scan.internal), (recovery, starts, cleaned))
            m.cleaner_checkpoints.update((k, v) for k, v in cleaned.items() if k not in d.kept[2])
            if scan.kafka_files:
                log.info("%s is a Kafka broker's log directory (%s left untouched)", d.path,
                         ", ".join(scan.kafka_files))
            for name in scan.ignored:
                log.warning("ignoring %s in %s: not a partition directory (left untouched)", name, d.path)
            entries += [(key, path, d) for key, path in scan.partitions]
            futures += [(key, path, d) for key, path in scan.future_dirs]
        entries = self._settle_moves(entries, futures)
        total_done = [0]
        # Segment progress: [segments of the partitions loaded so far, segments of the current one], and the
        # .log files counted in the partitions still to load.
        seen = [0, 0]
        counts: list[int] = []
        if segment_progress is not None:
            counts = [sum(1 for n in os.listdir(path) if n.endswith(LOG_SUFFIX)) for _, path, _ in entries]
        still_to_load = sum(counts)
        configs: dict = {}  # one per topic (building one parses every setting)
        for index, ((topic, partition), path, d) in enumerate(entries):
            if topic not in m.topics:
                m.topics[topic] = {}
            if topic not in configs:
                configs[topic] = m.topic_config(topic)
            per_segment = None
            if segment_progress is not None:
                still_to_load -= counts[index]

                def per_segment(i: int, n: int, _after: int = still_to_load) -> None:
                    seen[1] = n
                    segment_progress(seen[0] + i, seen[0] + n + _after)
            recovery, starts = states[d.path]
            m.add_log(load_log(
                path, topic, partition, configs[topic],
                recovery_point=recovery.get((topic, partition), 0),
                log_start_offset=starts.get((topic, partition), 0),
                had_clean_shutdown=d.had_clean_shutdown, clock=m.clock, progress=per_segment,
                log_dir=d.log_dir, open_files=m.open_files,
            ))
            seen[0], seen[1] = seen[0] + seen[1], 0
            total_done[0] += 1
            if progress is not None:
                progress(total_done[0], len(entries))
        m.settings.collisions = {collision_key(t): t for t in m.topics}
        for d in m.dirs:
            d.drop_clean_marker()
        m.recovered = bool(entries) and not m.had_clean_shutdown
        m.settings.save()

    def _settle_moves(self, entries: list, futures: list) -> list:
        """Finish or undo the moves a crash interrupted (:mod:`~logfs.storage.moves`): a ``-future`` copy of a
        partition that is still live elsewhere never reached the commit point, and is removed; one whose partition
        is live nowhere passed it (the source was renamed for deletion), and is renamed live. A partition live in
        two directories is refused: which one is current cannot be told."""
        live: dict[tuple[str, int], str] = {}
        for key, path, _ in entries:
            if key in live:
                raise LogfsError(f"partition {key[0]}-{key[1]} is in two log directories ({live[key]} and {path}): "
                                 "remove the one that is not current, then mount again")
            live[key] = path
        for key, path, d in futures:
            if key in live:
                log.warning("removing %s: the copy of a move between log directories that did not finish (the "
                            "partition stays in %s)", path, os.path.dirname(live[key]))
                shutil.rmtree(path)
                continue
            target = os.path.join(d.path, partition_dir_name(*key))
            log.warning("completing the move of %s-%d to %s (interrupted after its commit point)", key[0], key[1],
                        d.path)
            os.rename(path, target)
            ckpt.fsync_dir(d.path)
            live[key] = target
            entries.append((key, target, d))
        return sorted(entries, key=lambda e: e[0])

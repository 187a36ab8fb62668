"""The daemon's metrics in Prometheus's text exposition format (0.0.4), written to a file for node_exporter's
textfile collector (``-o logfs.metrics.file=PATH``).

Owns the names, help texts and rendering of every metric, and the file: replaced atomically (a temporary file in
the same directory, renamed over it) every ``logfs.metrics.interval.ms`` and once more at clean shutdown. A
render reads what the rest of the daemon already keeps: each log's offsets and segments (under its lock, one
partition at a time), its traffic counters (:mod:`logfs.storage.counters`), the FUSE errors by errno
(:func:`logfs.fuse.errors.error_counts`), the tiering and background tasks' counts, /proc/self. Nothing on the
request path waits for it or does anything for it beyond incrementing integers. The periodic render runs in a
worker thread: at 20,000 partitions it is a few hundred thousand lines.

Names follow Prometheus's conventions: ``logfs_`` prefix, base units (``_bytes``, ``_seconds``), ``_total`` for
counters; per-partition series carry ``topic`` and ``partition`` labels (topic names need no escaping: Kafka's
name rules allow only ``[a-zA-Z0-9._-]``). Counters start at zero when the daemon starts (or a partition is
created); Prometheus's ``rate()`` handles the reset.
"""

from __future__ import annotations

import errno as errno_names
import logging
import os
import resource
import time

import trio

from .. import __version__
from ..fuse.errors import error_counts

log = logging.getLogger(__name__)

# name -> (type, help). The order here is the order in the file.
PARTITION_GAUGES = {
    "logfs_partition_log_start_offset": "First offset of the partition's log (the whole log's, with tiering).",
    "logfs_partition_log_end_offset": "Offset the next record appended to the partition gets.",
    "logfs_partition_size_bytes": "Bytes of the partition's segments on local disk.",
    "logfs_partition_segments": "Segments of the partition on local disk.",
}
PARTITION_COUNTERS = {
    "logfs_partition_appended_records_total": "Records appended to the partition since the daemon started.",
    "logfs_partition_appended_bytes_total": "Bytes of text write() calls on the partition's files took.",
    "logfs_partition_read_records_total": "Records whose line a read() of the partition's files returned.",
    "logfs_partition_read_bytes_total": "Bytes read() calls on the partition's files returned.",
}
TIER_GAUGES = {
    "logfs_partition_local_log_start_offset": "First offset of a tiered partition on local disk.",
    "logfs_partition_remote_log_end_offset": "Offset after the last tiered record (0 when none).",
    "logfs_partition_remote_size_bytes": "Bytes of a partition's tiered segments in the object store.",
    "logfs_partition_remote_segments": "Tiered segments of a partition in the object store.",
    "logfs_partition_remote_copy_lag_bytes": "Bytes of rolled local segments not yet tiered (Kafka's "
                                             "RemoteCopyLagBytes).",
    "logfs_partition_remote_copy_lag_segments": "Rolled local segments not yet tiered (Kafka's "
                                                "RemoteCopyLagSegments).",
}
TIER_COUNTERS = {
    "logfs_partition_remote_copied_segments_total": "Segments this daemon uploaded to the object store.",
    "logfs_partition_remote_copied_bytes_total": "Bytes of segments this daemon uploaded to the object store.",
    "logfs_partition_tiering_failures_total": "Tiering passes (upload, retention) of the partition that failed.",
}


class Metrics:
    """Renders the metrics of one mount: ``render()`` -> the exposition text. Thread-safe to call from a worker
    thread while the trio thread serves requests."""

    def __init__(self, manager, ops, service, startup: dict, clock=time.time):
        self.manager = manager
        self.ops = ops
        self.service = service
        self.startup = startup
        self.clock = clock
        self.render_seconds = 0.0  # how long the previous render took

    def render(self) -> str:
        began = time.perf_counter()
        out: list[str] = []
        self._partitions(out)
        self._daemon(out)
        self._process(out)
        self.render_seconds = time.perf_counter() - began
        return "\n".join(out) + "\n"

    # -- per partition ---------------------------------------------------------------------------------
    def _partitions(self, out: list[str]) -> None:
        names = [*PARTITION_GAUGES, *PARTITION_COUNTERS]
        tier_names = [*TIER_GAUGES, *TIER_COUNTERS]
        series: dict[str, list[str]] = {name: [] for name in names + tier_names}
        remote = self.manager.remote
        tiering = self.service.tiering if self.service is not None else None
        failed = dict(tiering.failed_passes) if tiering is not None else {}
        tiers = dict(remote.tiers) if remote is not None else {}
        for (topic, partition), plog in sorted(list(self.manager.logs.items())):
            with plog.lock:
                if plog.closed:
                    continue
                start, end = plog.log_start_offset, plog.log_end_offset
                segments = plog.segments.as_list()
                remote_segments = list(plog.remote_segments)
                tiered = plog.config.remote_storage_enable
            labels = f'{{topic="{topic}",partition="{partition}"}}'
            c = plog.counters
            values = (start, end, sum(s.size for s in segments), len(segments), c.appended_records(end),
                      c.appended_bytes, c.read_records, c.read_bytes)
            for name, value in zip(names, values):
                series[name].append(f"{name}{labels} {value}")
            if not tiered:
                continue
            remote_end = remote_segments[-1].next_offset if remote_segments else 0
            lagging = [s for s in segments[:-1] if s.next_offset > remote_end]
            tier = tiers.get((topic, partition))
            tier = tier if tier is not None and tier.log is plog else None
            values = (max(segments[0].base_offset, start), remote_end, sum(s.size for s in remote_segments),
                      len(remote_segments), sum(s.size for s in lagging), len(lagging),
                      tier.copied_segments if tier else 0, tier.copied_bytes if tier else 0,
                      failed.get((topic, partition), 0))
            for name, value in zip(tier_names, values):
                series[name].append(f"{name}{labels} {value}")
        helps = {**PARTITION_GAUGES, **PARTITION_COUNTERS, **TIER_GAUGES, **TIER_COUNTERS}
        for name, lines in series.items():
            if not lines and (name in TIER_GAUGES or name in TIER_COUNTERS):
                continue  # no tiered partition
            kind = "counter" if name.endswith("_total") else "gauge"
            out.append(f"# HELP {name} {helps[name]}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)

    # -- the daemon --------------------------------------------------------------------------------------
    def _daemon(self, out: list[str]) -> None:
        def family(name: str, kind: str, help_: str, samples: list[tuple[str, object]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {value}" for labels, value in samples)

        manager = self.manager
        family("logfs_build_info", "gauge", "The running logfs's version.", [(f'{{version="{__version__}"}}', 1)])
        family("logfs_topics", "gauge", "Topics in the mount.", [("", len(manager.topics))])
        family("logfs_partitions", "gauge", "Partitions in the mount.", [("", len(manager.logs))])
        family("logfs_open_files", "gauge", "Partition files open through the mount.",
               [("", self.ops.open_files if self.ops is not None else 0)])
        follower = manager.follower
        if follower is not None:
            family("logfs_follow_requests_total", "counter", "Requests a follower mount sent to the store to follow "
                   "its writer (looks at the follower index, manifests read).", [("", follower.requests)])
            family("logfs_follow_changes_total", "counter", "Changes of the writer's follower index applied.",
                   [("", follower.syncs)])
            family("logfs_follow_last_look_seconds", "gauge", "When the follower last looked at the store "
                   "successfully (seconds since the epoch).", [("", follower.last_sync_s)])
            family("logfs_follow_lag_offsets", "gauge", "Offsets the follower shows fewer than its writer published: "
                   "per topic, the remote_log_end_offset of each partition as the newest follower index read names "
                   "it, less the follower's log_end_offset, summed.",
                   [(f'{{topic="{topic}"}}', n) for topic, n in sorted(follower.lag_offsets().items())])
            now = self.clock()
            behind = max(0.0, now - follower.current_since_s) if follower.current_since_s else -1
            family("logfs_follow_lag_seconds", "gauge", "Seconds the follower may be behind its writer: since the "
                   "start of its last look at the store after which it showed everything the writer had published "
                   "(up to the follow interval while following; it grows while the store cannot be read; -1 before "
                   "the first). An idle writer does not make it grow.", [("", f"{behind:.3f}")])
            published = follower.applied_published_s
            family("logfs_follow_index_published_seconds", "gauge", "When the writer published the newest follower "
                   "index this follower applied (the writer's clock, seconds since the epoch; -1 for an older "
                   "writer's index, which carries no time). time() minus it: how old the newest change shown is.",
                   [("", f"{published:.3f}")])
            delay = follower.applied_at_s - published if published >= 0 else -1
            family("logfs_follow_apply_delay_seconds", "gauge", "From the writer publishing the newest follower "
                   "index this follower applied to the follower showing it (across hosts, clock skew adds to it; "
                   "-1 when unknown).", [("", f"{delay:.3f}")])
        labels = ['{log_dir="%s"}' % d.path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                  for d in manager.dirs]
        family("logfs_log_dir_offline", "gauge", "1 once the log directory went offline after an I/O error: its "
               "partitions answer EIO until the next mount recovers it.",
               [(label, int(d.offline)) for label, d in zip(labels, manager.dirs)])
        family("logfs_log_dir_io_errors_total", "counter", "I/O errors of the log directory's disk (the first takes "
               "it offline; a full disk is not counted).",
               [(label, d.log_dir.failures) for label, d in zip(labels, manager.dirs)])
        family("logfs_log_dir_partitions", "gauge", "Partitions the log directory holds.",
               [(label, d.partitions) for label, d in zip(labels, manager.dirs)])
        family("logfs_log_dir_moves_total", "counter", "Moves of partitions between log directories, by result "
               "(a failed one leaves the partition where it was, or completes at the next mount).",
               [('{result="done"}', manager.moves_done), ('{result="failed"}', manager.moves_failed)])
        family("logfs_log_dir_moves_running", "gauge", "Moves between log directories under way.",
               [("", len(manager.moving))])
        errors = sorted(error_counts().items())
        family("logfs_fuse_errors_total", "counter", "Requests the filesystem answered with an error, by "
               "request and errno.",
               [(f'{{op="{op}",errno="{errno_names.errorcode.get(code, str(code))}"}}', n)
                for (op, code), n in errors])
        stats = self.service.stats if self.service is not None else None
        if stats is not None:
            family("logfs_cleaner_runs_total", "counter", "Compactions of a partition completed.",
                   [("", stats.cleaner_runs)])
            family("logfs_cleaner_failures_total", "counter", "Compaction passes that failed (retried later).",
                   [("", stats.cleaner_failures)])
            family("logfs_cleaner_removed_records_total", "counter", "Records compaction removed.",
                   [("", stats.cleaner_removed_records)])
            family("logfs_cleaner_reclaimed_bytes_total", "counter", "Bytes compaction freed on disk.",
                   [("", stats.cleaner_reclaimed_bytes)])
            family("logfs_retention_deleted_segments_total", "counter", "Local segments deleted by retention "
                   "(tiered partitions: by the tiering task, not counted here).",
                   [("", stats.retention_deleted_segments)])
            family("logfs_compression_segments_total", "counter", "Sealed segments rewritten in their topic's "
                   "compression.type.", [("", stats.compressed_segments)])
            family("logfs_compression_failures_total", "counter", "Rewrites in a topic's compression.type that "
                   "failed (retried later, or the segments left as they are).", [("", stats.compression_failures)])
            family("logfs_compression_input_bytes_total", "counter", "Bytes of the segments the compression "
                   "rewrites replaced.", [("", stats.compression_bytes_before)])
            family("logfs_compression_output_bytes_total", "counter", "Bytes of the compressed segments that "
                   "replaced them.", [("", stats.compression_bytes_after)])
        remote = self.manager.remote
        if remote is not None:
            cache = remote.blocks
            family("logfs_remote_cache_bytes", "gauge", "Bytes of fetched tiered data in the local cache.",
                   [("", cache.used)])
            family("logfs_remote_cache_limit_bytes", "gauge", "The cache's bound (logfs.remote.cache.bytes).",
                   [("", cache.limit)])
            family("logfs_remote_fetch_requests_total", "counter", "Ranged GETs of tiered segments sent to the "
                   "object store for reads (on demand and read-ahead).", [("", cache.requests)])
            family("logfs_remote_fetched_bytes_total", "counter", "Bytes those GETs fetched.",
                   [("", cache.fetched_bytes)])
        cluster = self.manager.cluster
        if cluster is not None:  # a Kafka cluster as the store (storage/cluster)
            appends, replica = cluster.appends, cluster.replica
            family("logfs_kafka_produced_records_total", "counter", "Lines queued to the cluster's producer.",
                   [("", appends.produced)])
            family("logfs_kafka_acknowledged_records_total", "counter", "Lines the cluster acknowledged.",
                   [("", appends.acked)])
            family("logfs_kafka_failed_deliveries_total", "counter", "Lines whose delivery failed (each fails the "
                   "next call of its partition with EIO; those after it on the producer fail with it).",
                   [("", appends.failed_deliveries)])
            family("logfs_kafka_queued_records", "gauge", "Lines queued and not acknowledged yet.",
                   [("", appends.queued())])
            family("logfs_kafka_fetched_records_total", "counter", "Records the replica fetched.",
                   [("", replica.fetched_records)])
            family("logfs_kafka_direct_fetched_records_total", "counter", "Records of those the replica caught up "
                   "with Kafka's Fetch, kept in the batches the broker sent (the others came through its consumer).",
                   [("", replica.direct_records)])
            family("logfs_kafka_replica_bytes", "gauge", "Bytes of the replica's segments (bounded by "
                   "logfs.remote.cache.bytes, active segments excepted).", [("", replica.cache_used())])
            family("logfs_kafka_replica_lag_offsets", "gauge", "Per partition, the cluster's high watermark as "
                   "the replica's fetches saw it (noted every second), less the offset after the replica's last record "
                   "then (-1 when unknown).", [(f'{{topic="{t}",partition="{p}"}}', lag)
                                 for (t, p), lag in sorted(replica.lags().items())])
            family("logfs_kafka_fetch_failing", "gauge", "1 while the replica cannot fetch (no broker answers).",
                   [("", int(replica.error is not None))])
        startup = self.startup
        if startup:
            family("logfs_startup_duration_seconds", "gauge", "Time the daemon took to load (or, after an unclean "
                   "shutdown, recover) the data directory before mounting.", [("", f"{startup['seconds']:.6f}")])
            family("logfs_startup_recovery", "gauge", "1 if the last start recovered after an unclean shutdown.",
                   [("", int(startup["recovering"]))])
            family("logfs_startup_segments", "gauge", "Segments loaded (or re-validated) at the last start.",
                   [("", startup["segments"])])
        family("logfs_metrics_render_duration_seconds", "gauge", "Time the previous metrics render took.",
               [("", f"{self.render_seconds:.6f}")])

    # -- the process (the names of Prometheus client libraries' process collector) -------------------------
    def _process(self, out: list[str]) -> None:
        def gauge(name: str, help_: str, value, kind: str = "gauge") -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"])

        try:
            with open("/proc/self/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            page = resource.getpagesize()
            with open("/proc/stat", "rb") as f:
                boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
            with open("/proc/self/maps", "rb") as f:
                maps = f.read().count(b"\n")
            fds = len(os.listdir("/proc/self/fd"))
        except (OSError, StopIteration, IndexError, ValueError):
            return
        # /proc/self/stat after the command name: state is field 3, utime 14, stime 15, starttime 22, vsize 23,
        # rss 24 (pages).
        gauge("process_cpu_seconds_total", "User and system CPU time of the daemon, in seconds.",
              f"{(int(fields[11]) + int(fields[12])) / ticks:.2f}", "counter")
        gauge("process_start_time_seconds", "Start time of the daemon since the epoch, in seconds.",
              f"{boot + int(fields[19]) / ticks:.2f}")
        gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", int(fields[20]))
        gauge("process_resident_memory_bytes", "Resident memory size in bytes.", int(fields[21]) * page)
        gauge("process_open_fds", "Open file descriptors.", fds)
        gauge("process_max_fds", "The soft limit of open file descriptors (RLIMIT_NOFILE).",
              resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        gauge("logfs_process_memory_maps", "Memory mappings of the daemon (the kernel caps them at "
              "vm.max_map_count).", maps)


class MetricsFile:
    """The file: rendered in a worker thread every ``interval_s``, replaced atomically, readable by all (0644:
    node_exporter usually runs as another user). A failure to write (disk full, directory gone) is logged once
    until a write succeeds again; it never stops the daemon."""

    def __init__(self, path: str, metrics: Metrics, interval_s: float):
        self.path = path
        self.metrics = metrics
        self.interval_s = interval_s
        self.writes = 0
        self._failing: str | None = None

    async def run(self) -> None:
        while True:
            await trio.to_thread.run_sync(self.write)
            await trio.sleep(self.interval_s)

    def write(self) -> bool:
        try:
            write_atomically(self.path, self.metrics.render().encode())
        except OSError as exc:
            message = f"cannot write the metrics to {self.path}: {exc.strerror or exc}"
            if message != self._failing:
                log.error("%s", message)
                self._failing = message
            return False
        if self._failing is not None:
            log.info("metrics written to %s again", self.path)
            self._failing = None
        self.writes += 1
        return True


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` by a rename from a temporary file beside it, so a reader sees the old file or the new one,
    whole. Not fsynced: metrics are re-written every interval, and nothing relies on them after a crash. The
    temporary name starts with a dot and ends in ``.tmp``: node_exporter reads only ``*.prom``."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

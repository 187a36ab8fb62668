"""``tools/bench.py --only spark_time``: the ``logfs`` Spark source's read path against ``spark.read.text`` of the
same lines, and time windows (CONTRACT section 11) against a full scan, from a DATA_DIR and from the bucket.

One partition of the bench's JSON lines (256 MB; 4 MB with ``--quick``; ``--spark-time-mb N``), written by the engine with a
``ManualClock`` stepping 100 ms per append of 2,000 lines (so a time window is that fraction of the offsets),
16 MiB segments (1 MiB quick); the same lines in one ext4 file for ``spark.read.text``; the sealed segments put in
a SeaweedFS bucket as the daemon's tiering puts them (objects and manifest). ``local[2]``, best of 2 (1 with ``--quick``) after a
warm-up. Windows: 1% and 10% of the partition's time range in its middle, through the options
(``startingTimestamp``/``endingTimestamp``) and through pushed-down filters (``timestamp >= lo AND timestamp <
hi``: the lower bound starts the range through the time index, the upper one ends it at the first of the tiered
segments after it whose smallest timestamp is later, from the bucket only: see logfs/spark/pushdown.py), and the
last 1% through pushdown. The upload also times the tiering's scan for each segment's smallest timestamp.
Bytes of ``.log`` fetched from the bucket are counted by running the source's planner and read path in this process through a
counting wrapper of the store (the code Spark's executors run).
"""

from __future__ import annotations

import os
import shutil
import time

from logfs.testing.benchlib import local_spark, pyspark_or_skip


def _build(bench, data: str, size: int, segment: int) -> tuple[int, int, str]:
    """DATA_DIR with topic b (1 partition) holding the first ``size`` bytes of the bench's lines; the same lines
    in an ext4 file. Returns (first timestamp, last timestamp, text file)."""
    from logfs.storage import ManualClock
    from logfs.storage.config import BrokerConfig
    from logfs.storage.manager import LogManager

    text = os.path.join(bench.work, "spark_time", "lines.txt")
    clock = ManualClock()
    first = clock.time_ms()
    m = LogManager(data, BrokerConfig.from_properties({"num.partitions": "1", "log.segment.bytes": str(segment)}),
                   clock=clock)
    try:
        m.create_topic("b")
        log = m.get_log("b", 0)
        written = 0
        with open(bench.lines, "rb") as f, open(text, "wb") as out:
            while written < size:
                chunk = [f.readline() for _ in range(2000)]
                chunk = [x for x in chunk if x]
                if not chunk:
                    f.seek(0)
                    continue
                out.writelines(chunk)
                log.append([x[:-1] for x in chunk])
                written += sum(len(x) for x in chunk)
                clock.advance(100)
        last = clock.time_ms() - 100
        m.close()
    except BaseException:
        m.abandon()
        raise
    return first, last, text


def _upload(store, prefix: str, data: str) -> tuple[int, int, float]:
    """The sealed segments of b-0 and their manifest, as the tiering writes them (each segment's smallest
    timestamp by the tiering's own scan, ``SegmentFile.min_timestamp``); returns the bytes of .log, the largest
    timestamp tiered and the seconds those scans took."""
    from logfs.remote.manifest import ManifestStore, PartitionManifest, RemoteFile, RemoteSegment, segment_key
    from logfs.spark.segments import PartitionReader, TopicPartition
    from logfs.storage.local.reader import SegmentReader

    reader = PartitionReader(data, TopicPartition("b", 0))
    bases = reader.segment_bases()
    m = PartitionManifest("b", 0)
    scans = 0.0
    for i, base in enumerate(bases[:-1]):
        stem = os.path.join(data, "b-0", f"{base:020d}")
        headers = [h for h, _ in reader.batches(base, bases[i + 1])]
        objects = {}
        for ext in ("index", "timeindex", "viewindex", "log"):
            key = segment_key(prefix, "b", 0, base, ext)
            path = f"{stem}.{ext}"
            if os.path.exists(path):
                objects[ext] = RemoteFile(key, store.put_file(key, path) if ext == "log" else
                                          _put_small(store, key, path))
            else:
                store.put_bytes(key, b"")
                objects[ext] = RemoteFile(key, 0)
        started = time.perf_counter()
        with SegmentReader(os.path.dirname(stem), base) as segment:
            lowest = segment.min_timestamp()
        scans += time.perf_counter() - started
        m = m.with_segment(RemoteSegment(base, headers[-1].next_offset, os.path.getsize(f"{stem}.log"),
                                         max(h.max_timestamp for h in headers), objects, lowest))
    ManifestStore(store, prefix).write(m)
    return m.remote_size_bytes, m.segments[-1].max_timestamp, scans


def _put_small(store, key: str, path: str) -> int:
    with open(path, "rb") as f:
        body = f.read()
    store.put_bytes(key, body)
    return len(body)


def _fresh_jvm() -> None:
    """Stop the session and the JVM an earlier scenario of this process started, if any: the source's Python
    workers (the planner's too) inherit the JVM's environment, which must hold this scenario's store credentials."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        if proc is not None:
            proc.kill()
            proc.wait()
        SparkContext._gateway = None
        SparkContext._jvm = None


def spark_time(bench) -> None:
    if not pyspark_or_skip(bench, "spark_time"):
        return
    from pyspark.sql import functions as F
    from logfs.testing.seaweed import SeaweedS3

    from logfs.remote.s3 import S3Store
    from logfs.spark import bucket as bucket_mod
    from logfs.testing.stores import CountingStore
    from logfs.spark import datasource as ds
    from logfs.spark import register
    from logfs.spark.options import SourceOptions, plan_batch
    from logfs.spark.pushdown import Narrowing

    size = (4 << 20) if bench.quick else (256 << 20)
    if getattr(bench, "spark_time_mb", None):
        size = bench.spark_time_mb << 20
    segment = (1 << 20) if bench.quick else (16 << 20)
    data, _ = bench.dirs("spark_time")
    first, last, text = _build(bench, data, size, segment)
    sw = SeaweedS3(os.path.join(bench.work, "spark_time", "seaweed"))
    sw.start()
    saved = {k: os.environ.get(k) for k in sw.env()}
    spark = None
    try:
        sw.create_bucket()
        os.environ.update(sw.env())  # before the JVM starts: its Python workers inherit the credentials
        _fresh_jvm()  # (an earlier scenario's JVM was started without them)
        store = S3Store(sw.bucket, endpoint=sw.endpoint)
        tiered_bytes, tiered_last, scans = _upload(store, "bench", data)
        remote = f"s3://{sw.bucket}/bench"
        spark = local_spark("logfs-bench-time", 2)
        register(spark, pushdown=True)  # each query below loads its DataFrame again (README: Spark 4.3)

        def src(path: str, **options):
            r = spark.read.format("logfs").option("subscribe", "b").option("minPartitions", "2")
            if path.startswith("s3://"):
                r = r.option("s3.endpoint", sw.endpoint)
            for k, v in options.items():
                r = r.option(k, v)
            return r.load(path)

        def best(job) -> tuple[float, int]:
            out = []
            for _ in range(1 if bench.quick else 2):  # (--quick checks that the scenario runs)
                start = time.perf_counter()
                n = job()
                out.append((time.perf_counter() - start, n))
            return min(out)

        span = last - first
        mid = first + span // 2
        windows = {"1pct": (mid, mid + span // 100), "10pct": (mid, mid + span // 10)}
        tails = {"local": (last - span // 100, last + 1),  # the last 1% of the log, and of its tiered part
                 "bucket": (tiered_last - (tiered_last - first) // 100, tiered_last + 1)}
        needle = "u00042"  # ~1 line in 50,000 has this user
        src(data).count()  # warm-up: JVM, Python workers, page cache
        spark.read.text(text).count()
        row: dict = {"mb": size >> 20}
        t_text, n_text = best(lambda: spark.read.text(text).count())
        t_src, n_src = best(lambda: src(data).count())
        assert n_text == n_src, (n_text, n_src)
        row.update(records=n_src, s_text_count=t_text, s_source_count=t_src, count_vs_text=t_text / t_src)
        f_text, m_text = best(lambda: spark.read.text(text).where(F.col("value").contains(needle)).count())
        f_src, m_src = best(lambda: src(data).where(F.col("value").cast("string").contains(needle)).count())
        assert m_text == m_src, (m_text, m_src)
        row.update(s_text_filter=f_text, s_source_filter=f_src, filter_vs_text=f_text / f_src)
        for where, path in (("local", data), ("bucket", remote)):
            t_full, n_full = best(lambda: src(path).count())
            row[f"{where}_s_full"] = t_full
            for name, (lo, hi) in windows.items():
                t_opt, n_opt = best(lambda: src(path, startingTimestamp=str(lo), endingTimestamp=str(hi)).count())
                t_push, n_push = best(lambda: src(path).where(
                    (F.col("timestamp") >= F.timestamp_millis(F.lit(lo)))
                    & (F.col("timestamp") < F.timestamp_millis(F.lit(hi)))).count())
                assert n_opt == n_push, (where, name, n_opt, n_push)
                row[f"{where}_{name}_s_options"] = t_opt
                row[f"{where}_{name}_speedup_options"] = t_full / t_opt
                row[f"{where}_{name}_s_pushdown_mid"] = t_push
                row[f"{where}_{name}_speedup_pushdown_mid"] = t_full / t_push
            lo, hi = tails[where]
            t_tail, _ = best(lambda: src(path).where(
                (F.col("timestamp") >= F.timestamp_millis(F.lit(lo)))
                & (F.col("timestamp") < F.timestamp_millis(F.lit(hi)))).count())
            row[f"{where}_last1pct_s_pushdown"] = t_tail
            row[f"{where}_last1pct_speedup_pushdown"] = t_full / t_tail

        # Bytes of .log fetched from the bucket: the source's planner and read path, in this process.
        counting = CountingStore(store)
        original = bucket_mod.open_store
        bucket_mod.open_store = lambda *a, **k: counting
        try:
            def fetched(options: dict, narrowings=None) -> int:
                counting.log_bytes = 0
                opts = SourceOptions.parse({"path": remote, "s3.endpoint": sw.endpoint, "subscribe": "b",
                                            **options})
                for r in plan_batch(opts, narrowings):
                    for _ in ds.read_range(opts, r, ds.KAFKA_SCHEMA):
                        pass
                return counting.log_bytes

            row["bucket_log_bytes"] = tiered_bytes
            row["bucket_full_fetched_fraction"] = fetched({}) / tiered_bytes
            for name, (lo, hi) in windows.items():
                row[f"bucket_{name}_fetched_fraction_options"] = fetched(
                    {"startingTimestamp": str(lo), "endingTimestamp": str(hi)}) / tiered_bytes
                row[f"bucket_{name}_fetched_fraction_pushdown_mid"] = fetched(  # (translate's of lo <= ts < hi)
                    {}, [Narrowing(min_timestamp=lo, max_timestamp=hi - 1)]) / tiered_bytes
            row["bucket_last1pct_fetched_fraction_pushdown"] = fetched(
                {}, [Narrowing(min_timestamp=tails["bucket"][0], max_timestamp=tails["bucket"][1] - 1)]) / tiered_bytes
        finally:
            bucket_mod.open_store = original
        row["min_timestamp_scan_s"] = scans  # (the tiering's scan of every sealed segment, page cache warm)
        row["min_timestamp_scan_mb_s"] = tiered_bytes / 1e6 / scans if scans else 0.0
        row.update(target_count_vs_text=0.6, target_filter_vs_text=0.9, target_bucket_1pct_fraction=0.03,
                   target_bucket_1pct_speedup=10.0)
        bench.record("spark_time", **row)
        store.close()
    finally:
        if spark is not None:
            spark.stop()
        sw.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(os.path.join(bench.work, "spark_time"), ignore_errors=True)

"""The Spark scenarios of tools/bench.py: ``spark`` (spark.read.json(...).groupBy(...).count() over the mount
against the same lines on ext4) and ``spark_sink`` (the logfs sink against df.write.json, and its publish alone
against cp + fsync). Each takes the running ``bench.Bench`` (its sizes, its work directory and ``record``)."""

from __future__ import annotations

import os
import shutil
import time

from logfs.testing.benchlib import getx, local_spark, mount_logfs, pyspark_or_skip, timed_shell, unmount


def spark(bench):
    """spark.read.json(...).groupBy(...).count() over the mount versus the same lines on ext4."""
    if not pyspark_or_skip(bench, "spark"):
        return
    size = (8 << 20) if bench.quick else (1 << 30)  # (--quick checks that the scenario runs: a few seconds)
    data, mnt = bench.dirs("spark")
    ext4_dir = os.path.join(bench.work, "spark-ext4")
    os.makedirs(ext4_dir, exist_ok=True)
    mount_logfs(data, mnt, "num.partitions=2")
    os.mkdir(f"{mnt}/events")
    for p in range(2):
        timed_shell(f"head -c {size // 2} {bench.lines} | head -n -1 >> {mnt}/events/{p}")
        timed_shell(f"head -c {size // 2} {bench.lines} | head -n -1 > {ext4_dir}/{p}")
    spark = local_spark("logfs-bench", 4)
    try:
        def job(path):
            start = time.perf_counter()
            rows = spark.read.json(f"file://{path}").groupBy("user").count().collect()
            return time.perf_counter() - start, sum(r["count"] for r in rows)

        job(ext4_dir)  # JVM and code warm-up
        timed = 1 if bench.quick else 2
        t_ext4, n_ext4 = min(job(ext4_dir) for _ in range(timed))
        t_logfs, n_logfs = min(job(f"{mnt}/events") for _ in range(timed))
        assert n_ext4 == n_logfs
    finally:
        spark.stop()
        unmount(mnt, data)
        shutil.rmtree(ext4_dir, ignore_errors=True)
    bench.record("spark", mb=size >> 20, s_logfs=t_logfs, s_ext4=t_ext4, ratio_vs_ext4=t_ext4 / t_logfs,
                 records=n_logfs, target=0.8)


def spark_sink(bench):
    """The logfs sink against ``df.write.json`` to a local directory (same rows, same run), and the publish
    alone against ``cp`` + ``fsync`` of the same bytes."""
    if not pyspark_or_skip(bench, "spark_sink"):
        return
    from pyspark.sql import functions as F

    from logfs.spark import register, sink
    from logfs.storage.format import records as rec

    rows = 50_000 if bench.quick else 1_500_000
    data, mnt = bench.dirs("spark_sink")
    json_dir = os.path.join(bench.work, "spark_sink", "json")
    mount_logfs(data, mnt, "num.partitions=4")
    os.mkdir(f"{mnt}/out")
    spark = local_spark("logfs-bench-sink", 4)
    register(spark)
    try:
        df = spark.range(rows, numPartitions=4).select(
            F.format_string("u%05d", F.col("id") % 50000).alias("key"),
            F.format_string('{"ts":1700000000000,"user":"u%05d","action":"click","amount":%d,"pad":"%s"}',
                            F.col("id") % 50000, F.col("id"), F.lit("x" * 20)).alias("value")).cache()
        row_bytes = df.selectExpr("sum(length(key) + length(value))").first()[0] / rows

        def to_logfs() -> float:
            start = time.perf_counter()
            df.write.format("logfs").option("topic", "out").mode("append").save(mnt)
            return time.perf_counter() - start

        def to_json() -> float:
            start = time.perf_counter()
            df.write.mode("overwrite").json(f"file://{json_dir}")
            return time.perf_counter() - start

        to_logfs(), to_json()  # JVM, Python workers and code warm-up (and the cache filled)
        timed = 1 if bench.quick else 2
        t_logfs = min(to_logfs() for _ in range(timed))
        t_json = min(to_json() for _ in range(timed))
        appended = sum(int(getx(f"{mnt}/out/{p}", "log_end_offset")) for p in range(4))
        assert appended == (1 + timed) * rows, appended  # (the warm-up and the timed writes: each row once each)
    finally:
        spark.stop()
    # The publish alone: staged files through the mount, one commit request, against cp + fsync.
    size = (8 << 20) if bench.quick else (512 << 20)
    per_file = size // 4
    value = b"x" * 100
    batch = bytes(rec.build_batch(0, 0, [value] * 500))
    body = batch * (per_file // len(batch))
    for p in range(4):
        with open(f"{mnt}/.logfs-staging/b-1.{p}", "wb") as f:
            f.write(body)
            os.fsync(f.fileno())
    start = time.perf_counter()
    sink.control(mnt, {"op": "commit", "app": "b-1", "version": 0, "cleanup": "b-1.",
                       "parts": [["out", p, [[f"b-1.{p}", 0, len(body)]]] for p in range(4)]})
    t_publish = time.perf_counter() - start
    src = os.path.join(bench.work, "spark_sink", "cp-src")
    with open(src, "wb") as f:
        f.write(body * 4)
        os.fsync(f.fileno())
    start = time.perf_counter()
    shutil.copyfile(src, src + ".copy")
    fd = os.open(src + ".copy", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t_cp = time.perf_counter() - start
    unmount(mnt, data)
    shutil.rmtree(os.path.join(bench.work, "spark_sink"), ignore_errors=True)
    mb = len(body) * 4 / 1e6
    bench.record("spark_sink", rows=rows, row_bytes=row_bytes, rows_per_s_logfs=rows / t_logfs,
                 rows_per_s_json=rows / t_json, ratio_vs_json=t_json / t_logfs, publish_mb=mb,
                 publish_MBps=mb / t_publish, cp_fsync_MBps=mb / t_cp, publish_vs_cp=t_cp / t_publish)

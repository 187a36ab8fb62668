"""The Spark part of the compression scenario (tools/bench_compression.py): each data set's counts from its two
DATA_DIRs and, with logfs/testing/seaweed.py, from a bucket they are tiered to, in a driver process of its own
(``python tools/bench_compression_spark.py --spark-driver JSON``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from bench_compression_disk import SYSTEMS, TOPIC, Pair, segment_files, setx
from logfs.testing.benchlib import PY, ROOT, drop_caches, getx, local_spark, wait_for


# -- the driver --------------------------------------------------------------------------------------------------------
def spark_driver(request: dict) -> dict:
    """In a process of its own (``bench_compression_spark.py --spark-driver JSON``): one ``local[2]`` session, the
    ``logfs`` source registered; each job's count, cold (page cache dropped first) for the jobs named in
    ``cold``, then warm ``repeat`` times, jobs in turn (the order alternating). A first count warms the JVM and
    the Python workers up (not with ``quick``). Returns {job: {"cold": s, "warm": [s...], "count": n}}."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from logfs.spark import register

    spark = local_spark("logfs-bench-compression", 2,
                        **{"spark.driver.memory": "1g", "spark.python.worker.reuse": "true"})
    register(spark)
    jobs = request["jobs"]
    out: dict[str, dict] = {name: {"warm": []} for name in jobs}

    def count(name: str) -> float:
        job = jobs[name]
        reader = spark.read.format("logfs")
        for key, value in job["options"].items():
            reader = reader.option(key, value)
        start = time.perf_counter()
        n = reader.load(job["path"]).count()
        took = time.perf_counter() - start
        assert out[name].setdefault("count", n) == n, (name, n)
        return took

    try:
        if not request["quick"]:
            count(next(iter(jobs)))  # the JVM, the Python workers and the code warmed up
        for name in request["cold"]:
            drop_caches()
            out[name]["cold"] = count(name)
        for round_ in range(request["repeat"]):
            for name in (list(jobs) if round_ % 2 == 0 else list(jobs)[::-1]):
                out[name]["warm"].append(count(name))
    finally:
        spark.stop()
    return out


def run_spark(bench, jobs: dict, cold: list[str], extra_env: dict | None = None) -> dict:
    request = json.dumps({"jobs": jobs, "cold": cold, "repeat": bench.rounds, "quick": bench.quick})
    proc = subprocess.run([PY, os.path.join(ROOT, "tools", "bench_compression_spark.py"), "--spark-driver", request],
                          capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": ROOT, **(extra_env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"the Spark driver failed: {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print("compression: Spark counts (s):", json.dumps({k: [v.get("cold"), v["warm"]] for k, v in result.items()}),
          file=sys.stderr, flush=True)
    return result


def spark_available() -> str | None:
    try:
        import pyspark  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return "pyspark or pyarrow not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime"
    return None


def tier(bench, pairs: dict[str, Pair], sw) -> dict:
    """Mount every DATA_DIR again with tiering to ``sw`` (prefix ``<data set>-<topic>``), turn it on for the topic,
    wait until every sealed segment is uploaded. Returns {job: {"bytes", "end"}} as the partition reports them."""
    figures = {}
    for name, pair in pairs.items():
        for s in SYSTEMS:
            pair.mount(s, "remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={sw.bucket}",
                       f"logfs.remote.s3.endpoint={sw.endpoint}", f"logfs.remote.s3.prefix={name}-{s}",
                       "remote.log.manager.task.interval.ms=200", env=sw.env())
            try:
                setx(os.path.join(pair.mnt[s], TOPIC), "remote.storage.enable", "true")
                part = pair.part(s)
                sealed = len(segment_files(pair.data[s])) - 1
                wait_for(lambda: int(getx(part, "remote_segment_count")) >= sealed, 1800, f"the upload of {name}-{s}")
                figures[f"{name}-{s}"] = {"bytes": int(getx(part, "remote_size_bytes")),
                                          "end": int(getx(part, "remote_log_end_offset"))}
            finally:
                pair.unmount(s)
    return figures


def spark(bench, pairs: dict[str, Pair]) -> None:
    """The Spark counts, from each DATA_DIR and (with logfs/testing/seaweed.py) from the bucket, in one driver process."""
    reason = spark_available()
    if reason:
        for name in pairs:
            bench.record(f"compression_spark_{name}", skipped=reason)
            bench.record(f"compression_bucket_{name}", skipped=reason)
        return
    try:
        from logfs.testing.seaweed import SeaweedS3  # logfs/testing/seaweed.py
    except ImportError:
        SeaweedS3 = None
    options = {"subscribe": TOPIC, "minPartitions": "4"}
    jobs = {f"{name}-{s}": {"path": pair.data[s], "options": options} for name, pair in pairs.items() for s in SYSTEMS}
    cold = list(jobs)
    sw, tiered, env = None, {}, None
    try:
        if SeaweedS3 is None:
            for name in pairs:
                bench.record(f"compression_bucket_{name}",
                             skipped="no logfs/testing/seaweed.py (the SeaweedFS starter; tools never import tests/)")
        else:
            sw = SeaweedS3(os.path.join(bench.work, "compression-seaweed"))
            sw.start()
            sw.create_bucket()
            tiered = tier(bench, pairs, sw)
            env = sw.env()
            jobs.update({f"bucket-{name}-{s}": {"path": f"s3://{sw.bucket}/{name}-{s}",
                                                "options": {**options, "s3.endpoint": sw.endpoint}}
                         for name in pairs for s in SYSTEMS})
        result = run_spark(bench, jobs, cold=cold, extra_env=env)
    finally:
        if sw is not None:
            sw.shutdown()
            shutil.rmtree(os.path.join(bench.work, "compression-seaweed"), ignore_errors=True)
    for name in pairs:
        r = {s: result[f"{name}-{s}"] for s in SYSTEMS}
        assert r["plain"]["count"] == r["zstd"]["count"], r
        warm = {s: min(r[s]["warm"]) for s in SYSTEMS}
        bench.record(f"compression_spark_{name}", records=r["plain"]["count"],
                     s_count_plain=warm["plain"], s_count_zstd=warm["zstd"],
                     spark_local_ratio=warm["plain"] / warm["zstd"],
                     s_count_cold_plain=r["plain"]["cold"], s_count_cold_zstd=r["zstd"]["cold"],
                     spark_local_cold_ratio=r["plain"]["cold"] / r["zstd"]["cold"], target_spark_local=0.8,
                     best_of=bench.rounds)
        if not tiered:
            continue
        r = {s: result[f"bucket-{name}-{s}"] for s in SYSTEMS}
        f = {s: tiered[f"{name}-{s}"] for s in SYSTEMS}
        assert r["plain"]["count"] == r["zstd"]["count"] == f["plain"]["end"] == f["zstd"]["end"], (r, f)
        warm = {s: min(r[s]["warm"]) for s in SYSTEMS}
        bench.record(f"compression_bucket_{name}", records=r["plain"]["count"],
                     mb_bucket_plain=f["plain"]["bytes"] / 1e6, mb_bucket_zstd=f["zstd"]["bytes"] / 1e6,
                     s_count_plain=warm["plain"], s_count_zstd=warm["zstd"],
                     spark_bucket_ratio=warm["plain"] / warm["zstd"], target_spark_bucket=1.0,
                     best_of=bench.rounds)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--spark-driver":
    print(json.dumps(spark_driver(json.loads(sys.argv[2]))))

"""The Spark cluster scenario of tools/bench.py (``--only spark_cluster``): a tiered log read by the ``logfs``
data source on a standalone cluster (a Master and two 1-core Workers on 127.0.0.1, started here through
pyspark's spark-class), from the bucket (``load("s3://BUCKET/PREFIX")``, SeaweedFS started here) against the
same offsets from the daemon's local DATA_DIR.

A daemon appends ``size`` bytes of ~100-byte JSON lines to two partitions, tiers every rolled segment (local
retention off: the local copy stays), and is unmounted. Both reads then cover exactly offsets [0,
remote_log_end_offset) of each partition: a ``count()``, and a ``groupBy`` of the "user" field (by position) with
a count per group. Best of two runs each, bucket and local alternating; the JVMs run with their normal JIT.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from logfs.testing.benchlib import getx, mount_logfs, timed_shell, unmount, wait_for
from logfs.testing.spark_jvm import java_options

PARTITIONS = 2


def spark_cluster(bench) -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        bench.record("spark_cluster", skipped="pyspark not installed")
        return
    if bench.quick and os.environ.get("LOGFS_BENCH_QUICK_CLUSTER", "") in ("", "0"):
        # A cluster of its own (a Master, two Workers, a driver and its executors: six JVMs) is half a minute of
        # the test suite's quick run; tests/spark/test_spark_cluster.py runs the source on the suite's cluster.
        bench.record("spark_cluster", skipped="not with --quick unless LOGFS_BENCH_QUICK_CLUSTER=1 (six JVMs)")
        return
    from logfs.testing.seaweed import SeaweedS3
    from logfs.testing.spark_standalone import ClusterDriver, SparkCluster

    size = (16 << 20) if bench.quick else (1 << 30)
    work = Path(bench.work) / "spark-cluster"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sw = SeaweedS3(work / "seaweed")
    sw.start()
    cluster = driver = None
    data, mnt = bench.dirs("spark-cluster-log")
    try:
        sw.create_bucket()
        mount_logfs(data, mnt, f"num.partitions={PARTITIONS}", "remote.log.storage.system.enable=true",
                    f"logfs.remote.s3.bucket={sw.bucket}", f"logfs.remote.s3.endpoint={sw.endpoint}",
                    "logfs.remote.s3.prefix=bench", f"log.segment.bytes={max(1 << 20, size // 32)}",
                    "remote.log.manager.task.interval.ms=200", extra_env=sw.env())
        os.mkdir(f"{mnt}/t")
        subprocess.run(["setfattr", "-n", "user.logfs.config.remote.storage.enable", "-v", "true", f"{mnt}/t"],
                       check=True)
        for p in range(PARTITIONS):
            timed_shell(f"head -c {size // PARTITIONS} {bench.lines} | head -n -1 >> {mnt}/t/{p}")

        def tiered() -> bool:
            return all(int(getx(f"{mnt}/t/{p}", "remote_segment_count"))
                       >= int(getx(f"{mnt}/t/{p}", "segment_count")) - 1 for p in range(PARTITIONS))

        wait_for(tiered, 900, "every rolled segment tiered")
        ends = {str(p): int(getx(f"{mnt}/t/{p}", "remote_log_end_offset")) for p in range(PARTITIONS)}
        tiered_bytes = sum(int(getx(f"{mnt}/t/{p}", f"position.{ends[str(p)]}")) for p in range(PARTITIONS))
        unmount(mnt, data)

        (work / "cluster").mkdir()
        cluster = SparkCluster(work / "cluster").start()
        secrets = sw.env()
        driver = ClusterDriver(cluster, work / "driver.log", {
            **{f"spark.executorEnv.{k}": v for k, v in secrets.items()},
            "spark.executor.extraJavaOptions": f"-Dlogfs.bench=1 {java_options(fast_start=False)}",
            "spark.driver.extraJavaOptions": f"-Dlogfs.bench=1 {java_options(fast_start=False)}",
            "spark.executor.memory": "768m"}, secrets)
        common = {"subscribe": "t", "endingOffsets": json.dumps({"t": ends}), "minPartitions": "4"}
        sources = {"bucket": (f"s3://{sw.bucket}/bench", {**common, "s3.endpoint": sw.endpoint}),
                   "local": (data, common)}
        runs: dict[str, list[dict]] = {"bucket": [], "local": []}
        # Best of two each, after a first run that warms the executors' Python workers and the JIT; --quick (which
        # checks that the scenario runs, not its figures) runs each once.
        order = [*sources.items()] if bench.quick else [*sources.items()] * 2 + [("bucket", sources["bucket"])]
        for name, (path, options) in order:
            runs[name].append(driver.run("timed", timeout=1800, path=path, options=options))
        if not bench.quick:
            runs["bucket"].pop(0)
        records = sum(ends.values())
        for name, results in runs.items():
            for r in results:
                assert r["count"] == r["groupby_rows"] == records, (name, r, records)
        best = {name: {k: min(r[k] for r in results) for k in ("count_s", "groupby_s")}
                for name, results in runs.items()}
        row = {"mb": round(tiered_bytes / 1e6, 1), "records": records}
        for name in ("bucket", "local"):
            for q in ("count", "groupby"):
                row[f"s_{q}_{name}"] = best[name][f"{q}_s"]
                row[f"MBps_{q}_{name}"] = tiered_bytes / best[name][f"{q}_s"] / 1e6
        for q in ("count", "groupby"):
            row[f"ratio_{q}"] = best["local"][f"{q}_s"] / best["bucket"][f"{q}_s"]
        row["target"] = 0.5
        bench.record("spark_cluster", **row)
    finally:
        if driver is not None:
            driver.stop()
        if cluster is not None:
            cluster.stop()
        sw.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(os.path.join(bench.work, "spark-cluster-log"), ignore_errors=True)

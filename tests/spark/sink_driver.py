"""A Spark driver process for the sink's exactly-once tests (tests/spark/test_spark_sink_exactly_once.py): a process
of its own, because the tests kill it with -9, and because task retries need a ``local[N,F]`` master (the suite's
session is ``local[2]``: a failed task fails its job).

    python sink_driver.py batch MOUNT TOPIC ROWS MARKERS
        local[2,3] (retries; Spark never speculates in local mode: test_spark_sink_cluster.py does): ROWS rows (values "0".."ROWS-1", keys "k<id % 1000>") written with the sink; a
        UDF fails the first attempt of every third task half way through its rows (and leaves a file in MARKERS).
    python sink_driver.py stream DATA_DIR MOUNT SOURCE OUT CHECKPOINT MAX_OFFSETS
        A streaming query from topic SOURCE (the logfs source, DATA_DIR) into topic OUT (the sink, MOUNT),
        MAX_OFFSETS records per micro-batch, restarted from CHECKPOINT; it stops once it has read every record
        SOURCE holds. Prints "started" once the query runs, then each micro-batch's progress. local[2], or the
        master in LOGFS_SINK_MASTER (settings in LOGFS_SINK_CONF, sink options in LOGFS_SINK_OPTIONS, JSON).

The first line of stdout is "ready" once the SparkSession is up; the last is a JSON result.
"""

from __future__ import annotations

import json
import os
import sys
import time

from logfs.testing.spark_jvm import java_options


def session(master: str, **conf):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("logfs-sink-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g").config("spark.python.worker.reuse", "true")
               .config("spark.driver.extraJavaOptions", java_options()))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from logfs.spark import register

    register(spark)
    print("ready", flush=True)
    return spark


def batch(mount: str, topic: str, rows: int, markers: str) -> dict:
    from pyspark.sql import functions as F

    spark = session("local[2,3]")
    partitions = 6
    per_task = rows // partitions

    @F.udf("string")
    def fail_first_attempts(value):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.attemptNumber() == 0 and ctx.partitionId() % 3 == 0:
            state = fail_first_attempts.__dict__.setdefault("seen", {})
            seen = state[ctx.taskAttemptId()] = state.get(ctx.taskAttemptId(), 0) + 1
            if seen > per_task // 2:
                open(os.path.join(markers, f"failed-{ctx.partitionId()}"), "w").close()
                raise RuntimeError(f"first attempt of task {ctx.partitionId()} fails half way through")
        return value

    df = (spark.range(rows, numPartitions=partitions)
          .select(F.concat(F.lit("k"), (F.col("id") % 1000).cast("string")).alias("key"),
                  fail_first_attempts(F.col("id").cast("string")).alias("value")))
    started = time.monotonic()
    df.write.format("logfs").option("topic", topic).mode("append").save(mount)
    return {"seconds": time.monotonic() - started}


def stream(data_dir: str, mount: str, source: str, out: str, checkpoint: str, max_offsets: int) -> dict:
    from logfs.spark.segments import PartitionReader, list_partitions

    # On a cluster (the standalone one): LOGFS_SINK_MASTER, with LOGFS_SINK_CONF (JSON: more Spark settings) and
    # LOGFS_SINK_OPTIONS (JSON: more sink options, e.g. staging through the bucket).
    master = os.environ.get("LOGFS_SINK_MASTER", "local[2]")
    conf = json.loads(os.environ.get("LOGFS_SINK_CONF", "{}"))
    if master != "local[2]":
        conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m", "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
                "spark.executor.extraJavaOptions": java_options(), **conf}
    spark = session(master, **conf)
    ends = {tp.partition: PartitionReader(data_dir, tp).offsets()[1]
            for tp in list_partitions(data_dir) if tp.topic == source}
    query = (spark.readStream.format("logfs").option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load(data_dir)
             .select("key", "value")
             .writeStream.format("logfs").option("topic", out).option("checkpointLocation", checkpoint)
             .options(**json.loads(os.environ.get("LOGFS_SINK_OPTIONS", "{}")))
             .trigger(processingTime="100 milliseconds").start(mount))
    print("started", flush=True)
    batches = 0
    while True:
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = query.lastProgress
        if progress and progress["batchId"] >= batches:
            batches = progress["batchId"] + 1
            end = progress["sources"][0]["endOffset"]
            end = json.loads(end) if isinstance(end, str) else end
            print(json.dumps({"batch": progress["batchId"], "end": end}), flush=True)
            if end and all(int(end.get(source, {}).get(str(p), -1)) >= e for p, e in ends.items()):
                break
        time.sleep(0.05)
    query.stop()
    return {"batches": batches}


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "batch":
        result = batch(args[0], args[1], int(args[2]), args[3])
    else:
        result = stream(args[0], args[1], args[2], args[3], args[4], int(args[5]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

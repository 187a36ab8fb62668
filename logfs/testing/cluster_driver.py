"""A Spark driver on the standalone cluster, for the tests and tools/bench_cluster.py:
``python -m logfs.testing.cluster_driver spark://HOST:PORT [--conf K=V]...``.

Holds ONE SparkSession on the cluster (the logfs source registered) and serves jobs: one JSON request per line
on stdin (``{"job": NAME, "args": {...}}``), one JSON answer per line on stdout (``{"ok": true, "result": ...}``
or ``{"ok": false, "type": ..., "message": ...}``); the first line out is ``{"ready": ...}``. EOF on stdin stops
the session and exits. Only answers go to stdout: everything else (the JVM's output included) goes to stderr.
A job is a function ``job(spark, **args)`` in ``JOBS``; results may hold bytes (sent as ``{"$bytes": base64}``).
Started and spoken to by ``spark_standalone.ClusterDriver``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import traceback

from logfs.testing.spark_jvm import java_options

# Answers get a private copy of stdout; fd 1 becomes stderr before the JVM starts, so nothing else reaches it.
ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr



def executor_identity() -> dict:
    """Where the calling Python worker runs: its Spark executor id (from the log URL the standalone Worker
    gives the executor), the executor JVM's pid (the nearest ``java`` ancestor) and that JVM's parent (the Worker
    that launched it), and the logfs it imports."""
    from urllib.parse import parse_qs, urlparse

    import logfs

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "java":
                break
        pid = parent(pid)
    jvm = pid if pid > 1 else None
    query = parse_qs(urlparse(os.environ.get("SPARK_LOG_URL_STDERR", "")).query)
    return {"executor_id": query.get("executorId", [None])[0], "jvm_pid": jvm,
            "jvm_parent_pid": parent(jvm) if jvm else None, "python_pid": os.getpid(), "logfs": logfs.__file__}


def read(spark, path: str, options: dict, columns: list | None = None) -> dict:
    """A batch read with the logfs source; ``timestamp`` comes back as epoch ms. Returns every Spark partition's
    rows together with the executor that produced them (the source's read and this map run in one task)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("logfs")
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(path)
    df = df.select(*[F.expr("unix_millis(timestamp)").alias("timestamp") if c == "timestamp" else c
                     for c in (columns or df.columns)])

    def tagged(index, rows):
        yield {"index": index, "executor": executor_identity(), "rows": [r.asDict(recursive=True) for r in rows]}

    return {"partitions": df.rdd.mapPartitionsWithIndex(tagged).collect()}


def read_text(spark, path: str) -> dict:
    """``spark.read.text(path)`` (a mount's files, read as plain files by the executors): every Spark partition's
    lines, with the executor that read them."""

    def tagged(index, rows):
        yield {"index": index, "executor": executor_identity(), "lines": [r.value for r in rows]}

    return {"partitions": spark.read.text(path).rdd.mapPartitionsWithIndex(tagged).collect()}


def _stream_writer(spark, path: str, options: dict, checkpoint: str, output: str):
    reader = spark.readStream.format("logfs")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load(path).select("partition", "offset").writeStream.format("parquet")
            .option("path", output).option("checkpointLocation", checkpoint))


def _sink_offsets(spark, output: str) -> dict:
    rows = spark.read.parquet(output).collect()
    partitions = {r.partition for r in rows}
    return {str(p): sorted(r.offset for r in rows if r.partition == p) for p in partitions}


def stream(spark, path: str, options: dict, checkpoint: str, output: str) -> dict:
    """One ``Trigger.AvailableNow`` run of a stream with the logfs source into a parquet sink (restarting from
    ``checkpoint`` when it exists); returns every offset the sink holds (all runs), sorted, per partition."""
    query = _stream_writer(spark, path, options, checkpoint, output).trigger(availableNow=True).start()
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return {"offsets": _sink_offsets(spark, output),
            "end": query.lastProgress["sources"][0]["endOffset"] if query.lastProgress else None}


def timed(spark, path: str, options: dict) -> dict:
    """tools/bench.py's cluster scenario: the seconds of a ``count()`` and of a ``groupBy`` (of the JSON lines'
    "user" field, by its fixed position: Spark's JSON parser would swamp the read) over the logfs source."""
    import time

    from pyspark.sql import functions as F

    reader = spark.read.format("logfs")
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(path)
    start = time.perf_counter()
    count = df.count()
    count_s = time.perf_counter() - start
    start = time.perf_counter()
    groups = (df.groupBy(F.expr("substring(cast(value as string), 25, 6)").alias("user")).count()
              .agg(F.count("*").alias("groups"), F.sum("count").alias("rows")).collect()[0])
    return {"count": count, "count_s": count_s, "groupby_s": time.perf_counter() - start,
            "groups": groups["groups"], "groupby_rows": groups["rows"]}


RUNNING: dict = {}  # started continuous queries by id


def stream_start(spark, path: str, options: dict, checkpoint: str, output: str, interval: str) -> dict:
    """Start a stream with a processing-time trigger (``interval``, e.g. "1 second") into a parquet sink, from
    ``checkpoint``; it runs until ``stream_stop``. Returns its id."""
    query = _stream_writer(spark, path, options, checkpoint, output).trigger(processingTime=interval).start()
    RUNNING[query.id] = query
    return {"id": query.id}


def stream_progress(spark, id: str) -> dict:
    """The offsets a running stream has committed to its sink so far (its last micro-batch's end offsets,
    Kafka's JSON, or None before the first), and whether it failed."""
    query = RUNNING[id]
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    last = query.lastProgress  # reported once a micro-batch has committed to the sink
    end = last["sources"][0]["endOffset"] if last else None
    return {"end": json.loads(end) if isinstance(end, str) else end, "batch": last["batchId"] if last else None}


def stream_stop(spark, id: str, output: str) -> dict:
    """Stop a running stream; every offset its sink holds (all runs), per partition."""
    query = RUNNING.pop(id)
    query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return {"offsets": _sink_offsets(spark, output)}


def sink_write(spark, mount: str, options: dict, rows: int, markers: str, stall: int = -1) -> dict:
    """A batch write with the logfs sink: ``rows`` rows (values "0".., keys "k<id % 1000>") in 6 tasks, whose
    first attempts of tasks 0 and 3 fail half way through (a file in ``markers`` says so), and whose task
    ``stall`` (if any) stalls half way in its first attempt, for speculation (with the session's
    ``spark.speculation``) to run a copy."""
    import time

    from pyspark.sql import functions as F

    per_task = rows // 6

    @F.udf("string")
    def fail_first_attempts(value):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        seen = STATE[ctx.taskAttemptId()] = STATE.get(ctx.taskAttemptId(), 0) + 1
        if seen == 1:
            open(os.path.join(markers, f"ran-{executor_identity()['executor_id']}-{ctx.partitionId()}"), "w").close()
        if ctx.attemptNumber() == 0 and ctx.partitionId() % 3 == 0 and seen > per_task // 2:
            open(os.path.join(markers, f"failed-{ctx.partitionId()}"), "w").close()
            raise RuntimeError(f"first attempt of task {ctx.partitionId()} fails half way through")
        if ctx.partitionId() == stall and seen == per_task // 2:
            if ctx.attemptNumber() == 0:  # a straggler: Spark speculates (kills this attempt once the copy won)
                open(os.path.join(markers, f"stalled-{stall}"), "w").close()
                time.sleep(300)
            else:  # the speculative copy (this task has no failure to retry)
                open(os.path.join(markers, f"speculative-{stall}-{ctx.attemptNumber()}"), "w").close()
        return value

    df = (spark.range(rows, numPartitions=6)
          .select(F.concat(F.lit("k"), (F.col("id") % 1000).cast("string")).alias("key"),
                  fail_first_attempts(F.col("id").cast("string")).alias("value")))
    writer = df.write.format("logfs").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(mount)
    return {"ok": True}


STATE: dict = {}  # (in the executors' Python workers) rows seen per task attempt


def sink_stream(spark, data_dir: str, mount: str, source: str, options: dict, checkpoint: str) -> dict:
    """One Trigger.AvailableNow run of a stream from topic ``source`` (the logfs source, ``data_dir``) into the
    logfs sink (``mount``, ``options``), from ``checkpoint``; the number of micro-batches it ran."""
    writer = (spark.readStream.format("logfs").option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "700").load(data_dir).select("key", "value").writeStream
              .format("logfs").option("checkpointLocation", checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start(mount)
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return {"batches": len([p for p in query.recentProgress if p["numInputRows"] > 0])}


JOBS = {"read": read, "read_text": read_text, "timed": timed, "stream": stream, "stream_start": stream_start, "stream_progress": stream_progress,
        "stream_stop": stream_stop, "sink_write": sink_write, "sink_stream": sink_stream}


def encode(obj):
    if isinstance(obj, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(obj).decode()}
    raise TypeError(f"not JSON: {type(obj).__name__}")


def answer(message: dict) -> None:
    ANSWERS.write(json.dumps(message, default=encode) + "\n")


def await_executors(spark, wanted: int, timeout: float = 90.0) -> None:
    """Wait until ``wanted`` executors are registered. ``spark.scheduler.minRegisteredResourcesRatio`` does not
    do it on a standalone cluster without ``spark.cores.max`` (it expects 0 cores), and an executor can be lost
    and replaced later: a job started while the cluster is short runs on one executor only."""
    import time

    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while (have := len(tracker.getExecutorInfos()) - 1) < wanted:  # the driver is listed too
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {have} of {wanted} executors registered after {timeout} s")
        time.sleep(0.2)


def serve(spark, line: str, executors: int = 0) -> None:
    try:
        request = json.loads(line)
        await_executors(spark, executors)
        text = json.dumps({"ok": True, "result": JOBS[request["job"]](spark, **request.get("args", {}))},
                          default=encode)
    except Exception as exc:  # the test decides whether this error is the expected one
        traceback.print_exc()
        text = json.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)})
    ANSWERS.write(text + "\n")


def session(master: str, conf: list[str]):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logfs.spark import register

    builder = (
        SparkSession.builder.master(master).appName("logfs-cluster-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.driver.memory", "1g")
        # Tests move little data: C1 only, the serial collector and Spark's class archive start a JVM sooner
        # (logfs/testing/spark_jvm.py). Not for benchmarks: tools/bench_cluster.py sets its own.
        .config("spark.executor.extraJavaOptions", java_options())
        .config("spark.driver.extraJavaOptions", java_options())
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    )
    for setting in conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("master")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--executors", type=int, default=0, help="wait for this many executors before each job")
    args = parser.parse_args()
    spark = session(args.master, args.conf)
    sc = spark.sparkContext
    answer({"ready": True, "app_id": sc.applicationId, "master": sc.master, "driver_pid": os.getpid(),
            "driver_jvm_pid": sc._jvm.java.lang.ProcessHandle.current().pid()})
    try:
        for line in sys.stdin:
            serve(spark, line, args.executors)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

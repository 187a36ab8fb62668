#!/usr/bin/env python3
"""A Spark pipeline over a logfs mount: events in, per-user totals out, results checked.

1. Events are appended to topic ``events`` through the mount, one JSON line per event, into the partition
   Kafka's default partitioner gives the user (murmur2 of the key), so one user's events stay in order in one
   partition, as with a keyed producer.
2. A PySpark job reads the topic as plain files (``spark.read.json("file:///MNT/events")``; or, with
   ``--source logfs``, straight from DATA_DIR's segments with the ``logfs`` data source), counts events, buys
   and the amount bought per user.
3. The job writes the totals to topic ``user_totals`` with the ``logfs`` sink
   (``df.write.format("logfs").save(MOUNT)``): one keyed record per user (key: the user, value: the JSON
   totals), placed by Kafka's default partitioner, appended exactly once whatever Spark retries. The topic's
   ``logfs.key.separator`` (a tab) shows the keys in its files: ``user<TAB>{json}``. (Spark's own file writers,
   ``df.write.json``, cannot write to a mount: they need renames and temporary directories.)
4. The totals are read back through the mount and compared with totals computed in plain Python from the
   events as they were appended: each user exactly once, in the partition of its key.

    python tools/spark_pipeline.py                          # all in a temporary DATA_DIR it mounts itself
    python tools/spark_pipeline.py --mount /mnt/logs        # on an existing mount (topics are created)
    python tools/spark_pipeline.py --mount /mnt/logs --source logfs --data-dir /var/lib/logfs

Needs ``pip install -e '.[spark]'`` and Java 17+. Exit status 0 when the check passes.

``--writer append`` writes the totals the old way instead, each task appending its lines to the partition files
with O_APPEND (at-least-once: a task retried after its write appends its lines again; the check then keeps the
last line per user).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

EVENTS_TOPIC = "events"
TOTALS_TOPIC = "user_totals"
KEY_SEPARATOR = "\t"
ACTIONS = ("view", "click", "buy")
WRITE_CHUNK = 512 * 1024  # keep each write() well under the kernel's 1 MiB FUSE request size
EVENT_SCHEMA = "ts LONG, user STRING, action STRING, amount LONG"


# -- 1. producing events through the mount ----------------------------------------------------------------
def partition_of(key: str, partitions: int) -> int:
    """Kafka's default partitioner: toPositive(murmur2(key)) % partitions (the sink's, for keyed rows)."""
    from logfs.spark.sink_rows import murmur2

    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def append_lines(path: str, lines: list[str]) -> None:
    """Append complete lines to a partition file: O_APPEND, chunks of whole lines, retried on short writes."""
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        start = 0
        while start < len(data):
            end = min(len(data), start + WRITE_CHUNK)
            if end < len(data):
                end = data.rindex(b"\n", start, end) + 1
            view = memoryview(data)[start:end]
            while view:
                view = view[os.write(fd, view):]
            start = end
    finally:
        os.close(fd)


def ensure_topic(mnt: str, topic: str) -> int:
    """Create the topic if needed; returns its partition count (xattr ``user.logfs.partitions``)."""
    path = os.path.join(mnt, topic)
    if not os.path.isdir(path):
        os.mkdir(path)
    return int(os.getxattr(path, "user.logfs.partitions"))


def produce_events(mnt: str, count: int, *, topic: str = EVENTS_TOPIC, users: int = 40, seed: int = 7,
                   batch: int = 500) -> list[dict]:
    """Append ``count`` events; returns them as appended."""
    partitions = ensure_topic(mnt, topic)
    rng = random.Random(seed)
    events = []
    for first in range(0, count, batch):
        per_partition: dict[int, list[str]] = defaultdict(list)
        for _ in range(first, min(count, first + batch)):
            user = f"u{rng.randrange(users):03d}"
            action = rng.choices(ACTIONS, weights=(6, 3, 1))[0]
            event = {"ts": int(time.time() * 1000), "user": user, "action": action,
                     "amount": rng.randint(1, 500) if action == "buy" else 0}
            events.append(event)
            per_partition[partition_of(user, partitions)].append(json.dumps(event, separators=(",", ":")))
        for p, lines in per_partition.items():
            append_lines(os.path.join(mnt, topic, str(p)), lines)
    return events


# -- 2 and 3. the Spark job ------------------------------------------------------------------------------
def read_events(spark, mnt: str, *, topic: str = EVENTS_TOPIC, source: str = "mount",
                data_dir: str | None = None):
    from pyspark.sql import functions as F

    if source == "mount":
        # The topic directory is a directory of text files, one JSON object per line.
        return spark.read.schema(EVENT_SCHEMA).json(f"file://{os.path.abspath(mnt)}/{topic}")
    if source == "logfs":
        from logfs.spark import register

        register(spark)
        raw = spark.read.format("logfs").option("subscribe", topic).load(data_dir)
        return raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    raise ValueError(f"unknown source {source!r}")


def totals_of(events_df):
    from pyspark.sql import functions as F

    return events_df.groupBy("user").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(F.when(F.col("action") == "buy", 1).otherwise(0)).alias("buys"),
        F.sum(F.when(F.col("action") == "buy", F.col("amount")).otherwise(0)).alias("amount"),
    )


def _writer(mnt: str, topic: str, partitions: int):
    """The function each Spark task runs on its rows: append them to one partition of ``topic``."""
    topic_dir = os.path.join(os.path.abspath(mnt), topic)

    def write_partition(rows) -> None:
        by_partition: dict[int, list[str]] = defaultdict(list)
        for row in rows:
            record = {"user": row["user"], "events": int(row["events"]), "buys": int(row["buys"]),
                      "amount": int(row["amount"])}
            line = row["user"] + KEY_SEPARATOR + json.dumps(record, separators=(",", ":"))
            by_partition[partition_of(row["user"], partitions)].append(line)
        for p, lines in by_partition.items():
            append_lines(os.path.join(topic_dir, str(p)), lines)

    return write_partition


def run_job(spark, mnt: str, *, events_topic: str = EVENTS_TOPIC, totals_topic: str = TOTALS_TOPIC,
            source: str = "mount", data_dir: str | None = None, writer: str = "sink") -> int:
    """Read events, aggregate per user, write the totals to ``totals_topic``; returns the number of users."""
    from pyspark.sql import functions as F

    from logfs.spark import register

    if __name__ != "__main__":  # imported (e.g. by the tests): ship this module's functions to the workers
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    register(spark)
    partitions = ensure_topic(mnt, totals_topic)
    os.setxattr(os.path.join(mnt, totals_topic), "user.logfs.config.logfs.key.separator", KEY_SEPARATOR.encode())
    totals = totals_of(read_events(spark, mnt, topic=events_topic, source=source, data_dir=data_dir)).cache()
    try:
        if writer == "sink":
            (totals.select(F.col("user").alias("key"),
                           F.to_json(F.struct(F.col("user"), F.col("events").cast("long").alias("events"),
                                              F.col("buys").cast("long").alias("buys"),
                                              F.col("amount").cast("long").alias("amount"))).alias("value"))
             .write.format("logfs").option("topic", totals_topic).mode("append").save(os.path.abspath(mnt)))
        else:
            totals.foreachPartition(_writer(mnt, totals_topic, partitions))
        return totals.count()
    finally:
        totals.unpersist()


# -- 4. the check ----------------------------------------------------------------------------------------
def expected_totals(events: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for e in events:
        t = out.setdefault(e["user"], {"user": e["user"], "events": 0, "buys": 0, "amount": 0})
        t["events"] += 1
        if e["action"] == "buy":
            t["buys"] += 1
            t["amount"] += e["amount"]
    return out


def read_topic_lines(mnt: str, topic: str) -> list[tuple[int, str]]:
    partitions = int(os.getxattr(os.path.join(mnt, topic), "user.logfs.partitions"))
    out = []
    for p in range(partitions):
        with open(os.path.join(mnt, topic, str(p)), encoding="utf-8") as f:
            out += [(p, line.rstrip("\n")) for line in f]
    return out


class CheckFailed(Exception):
    """What the pipeline wrote is not what it should have."""


def _expect(ok, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def check(mnt: str, events: list[dict], *, events_topic: str = EVENTS_TOPIC,
          totals_topic: str = TOTALS_TOPIC, exactly_once: bool = True) -> dict[str, dict]:
    """Compare the totals read back through the mount with totals computed from ``events``; raises
    CheckFailed on any difference. With ``exactly_once`` (the sink), each user's totals must be there once;
    else the last line per user counts. Returns the totals read."""
    appended = [json.loads(line) for _, line in read_topic_lines(mnt, events_topic)]
    _expect(sorted(map(json.dumps, appended)) == sorted(map(json.dumps, events)),
            "the events topic does not hold exactly the events appended")
    got: dict[str, dict] = {}
    partitions = int(os.getxattr(os.path.join(mnt, totals_topic), "user.logfs.partitions"))
    for p, line in read_topic_lines(mnt, totals_topic):
        key, sep, body = line.partition(KEY_SEPARATOR)
        _expect(sep, f"a totals line without its key: {line!r}")
        record = json.loads(body)
        _expect(record["user"] == key, f"key {key!r} does not match {record}")
        _expect(p == partition_of(key, partitions), f"{key} landed in partition {p}")
        _expect(not (exactly_once and key in got), f"the totals of {key} are there twice")
        got[key] = record  # (at-least-once: the last line per key wins)
    want = expected_totals(events)
    if got != want:
        first = next((k, got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))
        raise CheckFailed(f"totals differ: {len(got)} users read, {len(want)} expected; first difference: {first}")
    return got


# -- running it ------------------------------------------------------------------------------------------
def spark_session(app_name: str = "logfs-pipeline"):
    # The Python workers must import the same logfs and pyarrow as this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.appName(app_name).master(os.environ.get("SPARK_MASTER", "local[2]"))
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _mount(data_dir: str, mnt: str, options: str) -> None:
    subprocess.run([sys.executable, "-m", "logfs.cli", data_dir, mnt, "-o", options], check=True, timeout=60)


def _unmount(mnt: str, data_dir: str) -> None:
    """Unmount, then wait for the daemon to finish its clean shutdown (it releases DATA_DIR/.lock last)."""
    subprocess.run(["fusermount3", "-u", mnt], check=False, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            fd = os.open(os.path.join(data_dir, ".lock"), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.1)
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mount", help="an existing logfs mount (default: mount a temporary DATA_DIR)")
    parser.add_argument("--data-dir", help="DATA_DIR of --mount (for --source logfs)")
    parser.add_argument("--source", choices=("mount", "logfs"), default="mount",
                        help="read the events as files on the mount, or from DATA_DIR with the logfs source")
    parser.add_argument("--writer", choices=("sink", "append"), default="sink",
                        help="write the totals with the logfs sink (exactly once), or append them from the tasks")
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=3, help="num.partitions of a temporary mount")
    args = parser.parse_args(argv)
    if args.source == "logfs" and args.mount and not args.data_dir:
        parser.error("--source logfs with --mount needs --data-dir")

    tmp = None
    mnt, data_dir = args.mount, args.data_dir
    if mnt is None:
        tmp = tempfile.mkdtemp(prefix="logfs-pipeline-")
        data_dir, mnt = os.path.join(tmp, "data"), os.path.join(tmp, "mnt")
        os.makedirs(mnt)
        _mount(data_dir, mnt, f"num.partitions={args.partitions}")
    try:
        started = time.monotonic()
        events = produce_events(mnt, args.events)
        print(f"appended {len(events)} events to {mnt}/{EVENTS_TOPIC}")
        spark = spark_session()
        try:
            users = run_job(spark, mnt, source=args.source, data_dir=data_dir, writer=args.writer)
        finally:
            spark.stop()
        print(f"wrote totals of {users} users to {mnt}/{TOTALS_TOPIC}")
        totals = check(mnt, events, exactly_once=args.writer == "sink")
        print(f"check passed: {len(totals)} users, {sum(t['events'] for t in totals.values())} events, "
              f"{sum(t['amount'] for t in totals.values())} bought, in {time.monotonic() - started:.1f}s")
        return 0
    except CheckFailed as exc:
        print(f"check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if tmp is not None:
            _unmount(mnt, data_dir)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

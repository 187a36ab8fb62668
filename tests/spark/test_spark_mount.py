"""Spark reads a logfs mount as plain files: text, JSON and CSV over a topic directory, a ``MNT/*/`` glob and
single partitions return exactly what ``cat`` shows, also when splits start in the middle of a file and while
appends go on.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time

import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F


def file_url(path) -> str:
    return "file://" + os.path.abspath(str(path))

pytestmark = pytest.mark.mount


@contextlib.contextmanager
def split_size(spark, max_bytes: int):
    """spark.sql.files.maxPartitionBytes (and openCostInBytes, so small files are not packed) for a block."""
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    old = {k: spark.conf.get(k, None) for k in keys}
    for k in keys:
        spark.conf.set(k, str(max_bytes))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def lines_by_file(df, column="value"):
    """{partition file name: Counter of lines} of a DataFrame read from the mount."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in df.select(F.input_file_name().alias("f"), F.col(column)).collect():
        out[row.f.rsplit("/", 2)[-2] + "/" + row.f.rsplit("/", 1)[-1]][row[column]] += 1
    return dict(out)


def cat_by_file(fs, topics):
    out = {}
    for topic in topics:
        for name in os.listdir(fs.path(topic)):
            text = fs.read(f"{topic}/{name}").decode()
            out[f"{topic}/{name}"] = collections.Counter(text.splitlines())
    return out


@pytest.fixture
def filled(mount_logfs):
    """A mount with topics ``events`` (3 partitions: JSON lines, one partition ~180 KB) and ``other`` (CSV)."""
    fs = mount_logfs("num.partitions=3", "log.segment.bytes=65536")
    os.mkdir(fs.path("events"))
    sizes = {0: 2500, 1: 40, 2: 0}
    for p, count in sizes.items():
        lines = [f'{{"p":{p},"i":{i},"pad":"{"x" * (i % 97)}"}}' for i in range(count)]
        for start in range(0, count, 300):  # several appends, several batches and segments
            fs.append(f"events/{p}", "".join(line + "\n" for line in lines[start:start + 300]))
    os.mkdir(fs.path("other"))
    fs.append("other/0", "".join(f"{i},name-{i},{i * 0.5}\n" for i in range(700)))
    return fs


def test_text_over_a_topic_directory_with_mid_file_splits(spark, filled):
    fs = filled
    assert os.path.getsize(fs.path("events/0")) > 150_000
    with split_size(spark, 16384):
        df = spark.read.text(file_url(fs.path("events")))
        # Splits start in the middle of the big partition file: far more input partitions than files.
        assert df.rdd.getNumPartitions() >= 150_000 // 16384
        got = lines_by_file(df)
    want = cat_by_file(fs, ["events"])
    want = {k: v for k, v in want.items() if v}  # an empty partition contributes no rows
    assert got == want
    assert sum(got["events/0"].values()) == 2500


def test_json_over_a_glob_of_topics_and_csv_of_one_partition(spark, filled):
    fs = filled
    with split_size(spark, 8192):
        events = spark.read.json(file_url(fs.path("events")))
        assert sorted(events.columns) == ["i", "p", "pad"]
        counts = {r.p: r["count"] for r in events.groupBy("p").count().collect()}
        assert counts == {0: 2500, 1: 40}
        assert events.where("p = 0").agg(F.sum("i")).first()[0] == sum(range(2500))
        # The glob MNT/*/ reads every topic: JSON of the CSV lines is a corrupt record each.
        everything = spark.read.text(file_url(fs.mnt) + "/*/")
        assert lines_by_file(everything) == {k: v for k, v in cat_by_file(fs, ["events", "other"]).items() if v}
        csv = spark.read.csv(file_url(fs.path("other/0")), schema="i INT, name STRING, half DOUBLE")
        rows = sorted((r.i, r.name, r.half) for r in csv.collect())
    assert rows == [(i, f"name-{i}", i * 0.5) for i in range(700)]
    single = spark.read.text(file_url(fs.path("events/1"))).collect()
    assert [r.value for r in single] == fs.read("events/1").decode().splitlines()


def test_appends_while_spark_reads_show_only_complete_lines(spark, mount_logfs):
    fs = mount_logfs("num.partitions=1")
    os.mkdir(fs.path("live"))
    written = [0]
    stop = threading.Event()

    def line(i):
        return f"line-{i:07d}-{'y' * (i % 61)}"

    def writer():
        while not stop.is_set():
            start = written[0]
            fs.append("live/0", "".join(line(i) + "\n" for i in range(start, start + 40)))
            written[0] = start + 40

    fs.append("live/0", "".join(line(i) + "\n" for i in range(4000)))
    written[0] = 4000
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        time.sleep(0.2)
        with split_size(spark, 16384):
            got = [r.value for r in spark.read.text(file_url(fs.path("live"))).collect()]
    finally:
        stop.set()
        thread.join(30)
    final = fs.read("live/0").decode().splitlines()
    assert len(final) == written[0] > 4000
    # Whatever size Spark listed, it read exactly the first N lines of the file: every one complete, none
    # twice, none skipped (a split reads on to the end of its last line; the last split may take one line
    # appended after the listing).
    n = len(got)
    assert n >= 4000
    assert sorted(got) == sorted(final[:n])

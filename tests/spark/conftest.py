"""Fixtures for the Spark suite: ONE local SparkSession for the whole test session, logfs mounts, and a real
standalone cluster (Master and two Workers on 127.0.0.1) with its own driver process (logfs.testing.spark_standalone).

The session is ``local[2]`` with the UI off, 2 shuffle partitions and UTC as its time zone; its Python workers
run this interpreter (PYSPARK_PYTHON), so they import the logfs and pyarrow under test. Java comes from the
machine (tools/dev.sh installs openjdk-17-jdk-headless); without it the Spark tests skip.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from logfs.testing.spark_jvm import java_options
from logfs.testing.spark_standalone import (ClusterDriver, SparkCluster, spark_class_unusable_reason,
                                            spark_missing_reason)
from remote_store import aws_env, creds, seaweed  # noqa: F401  (fixtures)


def pytest_configure(config):
    config.addinivalue_line("markers", "spark: needs PySpark and Java (tests/spark); deselect with -m 'not spark'")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    reason = spark_missing_reason()
    if reason:
        pytest.skip(reason)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logfs.testing.kafka_setup import spark_connector_jars

    # Spark's Kafka connector, when set-up resolved one (tests/kafka compare Spark's Kafka source with logfs's): on
    # the session's classpath from its start, as --jars would put it.
    connector = ",".join(str(jar) for jar in spark_connector_jars())
    session = (
        SparkSession.builder.master("local[2]").appName("logfs-tests")
        .config("spark.jars", connector)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_options(fast_start=False))  # (Spark's class archive)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from logfs.spark import register

    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A standalone Master and two 1-core Workers on 127.0.0.1 (logfs.testing.spark_standalone), started once per
    test session (only if a test asks for it) and stopped at its end, no JVM left behind."""
    reason = spark_missing_reason() or spark_class_unusable_reason()
    if reason:
        pytest.skip(reason)
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_driver(spark_cluster, request):
    """The driver for ``spark_cluster``: a separate Python process with ONE SparkSession on the cluster for the
    whole test session, running the jobs of logfs.testing.cluster_driver (``cluster_driver.run("read", ...)``).

    Why a process, and one per session: a Python process holds one active SparkContext, and the suite's
    ``spark`` (local[2]) must stay usable before and after cluster tests, in any order and under ``-k``; running
    the cluster session in the test process would mean stopping the local one and ordering the cluster tests
    last. Measured here (2 busy cores): the driver process is ready 8-12 s after spawn, 1-4 s more than
    switching the test process's JVM from local to the cluster (~8 s: starting the executors dominates both).
    The first job then takes ~10 s (Python workers start on the driver and on each executor), later ones ~1 s;
    a process per test would pay both again for every cluster test. Whole file (one test): ~30 s.
    """
    # The driver and the executors get the session's SeaweedFS credentials in their AWS chain (the bucket tests),
    # when SeaweedFS is available here.
    try:
        env = request.getfixturevalue("seaweed").env()
    except pytest.skip.Exception:
        env = {}
    # Speculation on, for stragglers only (a task running 10 s and 3x the median): the sink's test stalls one
    # task's first attempt so that a speculative copy runs on the other Worker; other jobs' tasks take ~1 s.
    speculation = {"spark.speculation": "true", "spark.speculation.interval": "200ms",
                   "spark.speculation.minTaskRuntime": "10s", "spark.speculation.multiplier": "3",
                   "spark.speculation.quantile": "0.5"}
    driver = SharedClusterDriver(spark_cluster, {**{f"spark.executorEnv.{k}": v for k, v in env.items()},
                                                 **speculation}, env)
    try:
        yield driver
    finally:
        driver.stop()


class SharedClusterDriver:
    """The session's ClusterDriver, started on first use; ``release()`` stops it, so that a test can run a driver
    of its own on the cluster (one application holds every core); the next ``run()`` starts it again."""

    def __init__(self, cluster: SparkCluster, conf: dict, env: dict):
        self.cluster, self.conf, self.env = cluster, conf, env
        self.driver: ClusterDriver | None = None
        self.starts = 0

    def _started(self) -> ClusterDriver:
        if self.driver is None:
            self.starts += 1
            self.driver = ClusterDriver(self.cluster, self.cluster.base / f"driver-{self.starts}.log", self.conf,
                                        self.env)
        return self.driver

    @property
    def info(self) -> dict:
        return self._started().info

    def run(self, job: str, timeout: float = 120.0, **args):
        return self._started().run(job, timeout, **args)

    def release(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    stop = release


"""Spark support: the ``logfs`` PySpark data source (batch and streaming), reading DATA_DIR segments directly, and
writing to topics through the mount, exactly once (:mod:`logfs.spark.sink`).

    from logfs.spark import register
    register(spark)                                   # once per SparkSession
    df = (spark.read.format("logfs").option("subscribe", "orders")
          .load("/var/lib/logfs"))                    # Spark's Kafka source schema
    df.write.format("logfs").option("topic", "copy").save("/mnt/logs")   # Spark's Kafka sink columns

Needs the ``spark`` extra (``pip install 'logfs[spark]'``: pyspark and pyarrow) and Java 17+. The Python
workers must be able to import logfs and pyarrow: set ``PYSPARK_PYTHON`` to the interpreter logfs is installed
in. :mod:`logfs.spark.segments` and :mod:`logfs.spark.options` do not import PySpark.
"""

from __future__ import annotations


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, *, pushdown: bool | None = None) -> None:
    """Register the ``logfs`` format with ``spark`` (a SparkSession) and, unless the session has set it itself,
    set Spark's filter pushdown for Python data sources (``spark.sql.python.filterPushdown.enabled``, off by
    default in Spark). The source reads correctly either way: with pushdown off it plans every read without it.

    ``pushdown=None`` (the default) turns it on when this Spark keeps a pushed-down read plan with its scan
    (:func:`read_plans_per_scan`), and leaves it off on Spark 4.3, which keeps the plan on the DataFrame: there a
    later query on the same DataFrame without pushable filters (``df.count()`` after ``df.where(...).count()``)
    reuses the narrowed plan and returns too few rows, and nothing in a Python data source can see that happen
    (README, "Filters are pushed down"; tests/spark/test_spark_time.py). ``True`` turns it on anyway (load the
    DataFrame again for each query), ``False`` leaves Spark's setting alone. Time ranges need no pushdown: the
    ``startingTimestamp``/``endingTimestamp`` options narrow the read in every session."""
    from .datasource import LogfsDataSource

    spark.dataSource.register(LogfsDataSource)
    if pushdown is None:
        pushdown = read_plans_per_scan(spark)
    if pushdown:
        try:
            if _unset(spark):
                spark.conf.set(PUSHDOWN_CONF, "true")
        except Exception as exc:  # a session that does not allow it (Spark Connect policies): read without
            import logging

            logging.getLogger(__name__).warning("logfs: could not turn on %s (%s): filters are not pushed down",
                                                PUSHDOWN_CONF, exc)


SCAN_BUILDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder"


def read_plans_per_scan(spark) -> bool:
    """Whether this Spark keeps the read plan that a filter pushdown produced with the scan it was pushed to
    (its ``PythonScanBuilder`` holds a ``readInfo`` of its own, as Spark's master does since the limit-pushdown
    work), rather than on the data source shared by every scan of a DataFrame (``PythonDataSourceV2.setReadInfo``,
    Spark 4.1-4.3). Only the first makes pushdown safe for a later query over the same DataFrame. False when it
    cannot be told (Spark Connect: no JVM in this process)."""
    try:
        jvm = spark._jvm
        cls = jvm.org.apache.spark.util.Utils.classForName(SCAN_BUILDER, True, False)
        return any(f.getName() == "readInfo" for f in cls.getDeclaredFields())
    except Exception:
        return False


def _unset(spark) -> bool:
    """Whether the session has not set the pushdown setting itself (it then reads as Spark's default)."""
    try:
        return not spark._jsparkSession.conf().contains(PUSHDOWN_CONF)
    except Exception:
        return True


def __getattr__(name: str):
    if name in ("LogfsDataSource", "source_schema", "KAFKA_SCHEMA"):
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(name)


__all__ = ["register", "read_plans_per_scan", "LogfsDataSource", "source_schema", "KAFKA_SCHEMA"]

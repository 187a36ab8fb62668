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


def register(spark, *, pushdown: bool = False) -> None:
    """Register the ``logfs`` format with ``spark`` (a SparkSession); with ``pushdown``, also turn on Spark's filter
    pushdown for Python data sources (``spark.sql.python.filterPushdown.enabled``, off by default), unless the
    session has set it itself. The source reads correctly either way: with pushdown off it plans every read
    without it.

    Off by default because of Spark 4.3: it keeps a pushed-down read plan on the DataFrame, so a later query on
    the same DataFrame without pushable filters (``df.count()`` after ``df.where(...).count()``) reuses the
    narrowed plan and returns too few rows (README, tests/spark/test_spark_time.py). Time ranges need no pushdown:
    the ``startingTimestamp``/``endingTimestamp`` options narrow the read in every session."""
    from .datasource import LogfsDataSource

    spark.dataSource.register(LogfsDataSource)
    if pushdown:
        try:
            if _unset(spark):
                spark.conf.set(PUSHDOWN_CONF, "true")
        except Exception as exc:  # a session that does not allow it (Spark Connect policies): read without
            import logging

            logging.getLogger(__name__).warning("logfs: could not turn on %s (%s): filters are not pushed down",
                                                PUSHDOWN_CONF, exc)


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


__all__ = ["register", "LogfsDataSource", "source_schema", "KAFKA_SCHEMA"]

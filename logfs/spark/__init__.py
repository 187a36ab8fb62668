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


def register(spark) -> None:
    """Register the ``logfs`` format with ``spark`` (a SparkSession)."""
    from .datasource import LogfsDataSource

    spark.dataSource.register(LogfsDataSource)


def __getattr__(name: str):
    if name in ("LogfsDataSource", "source_schema", "KAFKA_SCHEMA"):
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(name)


__all__ = ["register", "LogfsDataSource", "source_schema", "KAFKA_SCHEMA"]

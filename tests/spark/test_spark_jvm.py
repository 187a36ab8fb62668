"""logfs/testing/spark_jvm.py: the set-up made Spark's class archive, and a Spark JVM started with the rig's
options maps it (``-Xshare:on`` makes a JVM that cannot use it fail to start)."""

import os
import subprocess
import sys

import pytest

from logfs.testing.spark_jvm import archive_path, java_options

SESSION = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", sys.argv[1]).getOrCreate())
print(spark.range(10).count())
spark.stop()
"""


def test_the_set_up_made_the_archive_and_spark_jvms_map_it(tmp_path):
    archive = archive_path()
    assert archive is not None and archive.exists(), archive
    assert "-XX:SharedArchiveFile=" in java_options() and java_options().startswith("-XX:TieredStopAtLevel=1")
    assert java_options(fast_start=False).startswith("-XX:SharedArchiveFile=")
    # (java_options(fast_start=False) names the same archive with the same options, less the two flags.)
    proc = subprocess.run([sys.executable, "-c", SESSION, f"{java_options()} -Xshare:on"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "10", proc.stderr[-2000:]


def test_a_jvm_that_cannot_use_the_archive_starts_without_it_and_says_nothing(tmp_path):
    archive = archive_path()
    if archive is None or not archive.exists():
        pytest.skip("no archive")
    # Another classpath than Spark's: the archive does not apply, and the JVM runs as without it, silently.
    proc = subprocess.run(["java", *java_options().split(), "-cp", str(tmp_path), "-version"],
                          capture_output=True, text=True, timeout=60)
    quiet = proc.stderr.replace("sharing", "")  # ("mixed mode, sharing": the JDK's own archive, always there)
    assert proc.returncode == 0 and proc.stdout == "" and "cds" not in quiet and "shared" not in quiet, proc.stderr

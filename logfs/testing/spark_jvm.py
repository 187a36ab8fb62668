"""Java options for the Spark JVMs the tests and benchmarks start, and the class-data sharing archive that
halves their start (``python -m logfs.testing.spark_jvm``, run by the set-up, tools/dev.sh).

A Spark JVM here spends most of its start loading and verifying classes from Spark's ~250 jars. Java's
application class-data sharing (AppCDS, JDK 13+) maps the classes one run loaded from an archive instead. The set-up
runs one small local job (a session, the ``logfs`` source and sink, a shuffle, a stream) with
``-XX:ArchiveClassesAtExit`` and keeps the archive under ``<checkout>/.cache/spark-jvm`` (``LOGFS_SPARK_JVM_CACHE``
moves it), named by PySpark's version and the Java runtime, so a new one is made when either changes. Measured on
this 2-core machine: a local session started in 3.5-3.7 s with it against 6.9-7.7 s without, and its first job
ran in 1.9-2.1 s against 3.7-4.1 s.

Every JVM of the same Java and Spark classpath may use the archive: the drivers, the standalone Master and
Workers, their executors. A JVM whose classpath or runtime does not match the archive, or that finds none, starts
as it would without (``-Xshare:auto``, Java's default), and its CDS messages are off, so nothing changes on stdout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from .kafka_setup import CHECKOUT

# C1 only and the serial collector: JVMs that live seconds to minutes on 2 cores start ~2.5 s sooner (measured).
FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> Path:
    return Path(os.environ.get("LOGFS_SPARK_JVM_CACHE") or CHECKOUT / ".cache" / "spark-jvm")


@lru_cache(maxsize=1)
def archive_path() -> Path | None:
    """Where the archive of this PySpark and this Java runtime is (or would be); None without either."""
    try:
        import pyspark
    except ImportError:
        return None
    java = shutil.which("java")
    if java is None:
        return None
    runtime = Path(java).resolve()
    stat = runtime.stat()
    key = hashlib.sha256(f"{runtime}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / f"spark-{pyspark.__version__}-{key}.jsa"


def java_options(fast_start: bool = True) -> str:
    """``spark.driver.extraJavaOptions`` (and executors', and ``SPARK_DAEMON_JAVA_OPTS``): the archive when there
    is one, and with ``fast_start`` C1 only and the serial collector (not for benchmarks: C2 compiles long jobs'
    hot code; the archive alone takes 9.0 s of a session's start to 5.3, measured)."""
    archive = archive_path()
    options = [FAST_START] if fast_start else []
    if archive is not None and archive.exists():
        options += [f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    return " ".join(options)


# The job whose loaded classes the archive keeps: run in a process of its own by build_archive().
_WORKLOAD = r"""
import os, sys, tempfile
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark import SparkContext
from pyspark.sql import SparkSession, functions as F
from logfs.spark import register
from logfs.storage import ManualClock
from logfs.storage.config import BrokerConfig
from logfs.storage.manager import LogManager

work = tempfile.mkdtemp(prefix="logfs-spark-jvm-")
data = os.path.join(work, "data")
manager = LogManager(data, BrokerConfig.from_properties({"num.partitions": "2"}), clock=ManualClock())
manager.create_topic("t")
for p in range(2):
    manager.get_log("t", p).append([b'{"user": "u%d", "n": %d}' % (i % 7, i) for i in range(500)])
manager.close()
spark = (SparkSession.builder.master("local[2]").appName("logfs-spark-jvm-archive")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.driver.extraJavaOptions", sys.argv[1])
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
register(spark)
df = spark.read.format("logfs").option("subscribe", "t").load(data)
df.selectExpr("CAST(value AS STRING) AS v").groupBy(F.get_json_object("v", "$.user")).count().collect()
df.write.mode("overwrite").json(os.path.join(work, "json"))
spark.read.json(os.path.join(work, "json")).groupBy("value").count().collect()
spark.read.text(os.path.join(work, "json")).count()
query = (spark.readStream.format("logfs").option("subscribe", "t").load(data).writeStream.format("memory")
         .queryName("q").trigger(availableNow=True).start())
query.awaitTermination(300)
spark.stop()
gateway = SparkContext._gateway
proc = gateway.proc
gateway.shutdown()
proc.stdin.close()  # the JVM exits when its stdin closes, and writes the archive as it exits
proc.wait(300)
import shutil
shutil.rmtree(work)
"""


def build_archive(timeout: float = 600) -> Path | None:
    """Make the archive unless it exists; returns it (None: no PySpark or no Java). Raises RuntimeError with the
    job's output when the job fails or leaves no archive."""
    archive = archive_path()
    if archive is None or archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    for old in archive.parent.glob("spark-*.jsa"):  # another PySpark's or Java's
        old.unlink()
    tmp = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    options = f"{FAST_START} -XX:ArchiveClassesAtExit={tmp} {QUIET_CDS}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))}
    try:
        with tempfile.TemporaryDirectory(prefix="logfs-spark-jvm-") as cwd:
            proc = subprocess.run([sys.executable, "-c", _WORKLOAD, options], cwd=cwd, env=env, timeout=timeout,
                                  capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
            raise RuntimeError(f"the Spark JVM's class archive was not made (exit {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
        os.replace(tmp, archive)
    finally:
        if tmp.exists():
            tmp.unlink()
    return archive


def main() -> int:
    made = archive_path()
    if made is not None and made.exists():
        return 0
    try:
        archive = build_archive()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        # Only speed is lost: every JVM starts as it would without an archive.
        print(f"note: no class archive for Spark's JVMs ({e}); they start without one", file=sys.stderr)
        return 0
    if archive is not None:
        print(f"Spark JVMs: class archive {archive} ({archive.stat().st_size >> 20} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

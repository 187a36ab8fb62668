"""Apache Kafka's jars for the tests: where they are, and the set-up that puts them there.

``setup`` (``python -m logfs.testing.kafka setup``, which tools/dev.sh runs) resolves with Maven the Kafka of
``kafka_jvm/pom.xml`` (its version, and why, are said there) into ``<checkout>/.cache/kafka/jars`` (an ignored
folder; ``LOGFS_KAFKA_CACHE`` moves it), compiles ``kafka_jvm/KafkaClient.java`` against them into ``classes``, and
tries Spark's Kafka connector for the installed PySpark into ``spark-kafka-<version>``: its own version, else the
newest release of the same major version below it that Maven Central lists (PySpark 4.3.0 reaches PyPI before its
connector reaches Maven Central; the 4.2.0 connector, loaded into PySpark 4.3.0, reads topics: the tests show it).
When no candidate is served, a ``.unavailable`` note says why, set-up goes on, and it is asked for again a day
later. Each
step writes a stamp (a hash of what it was made from) and is skipped while its stamp is current: a second set-up
costs a fraction of a second. :func:`jars_dir` and :func:`client_classpath` raise :class:`KafkaNotSetUp`, saying
what to run, when set-up was not run (or was run for another POM).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
JVM_SOURCES = HERE / "kafka_jvm"
POM = JVM_SOURCES / "pom.xml"
SPARK_POM = JVM_SOURCES / "spark-pom.xml"
TOOLS_POM = JVM_SOURCES / "tools-pom.xml"
CLIENT_SOURCE = JVM_SOURCES / "KafkaClient.java"
LOG4J_CONFIG = JVM_SOURCES / "log4j2.properties"
CHECKOUT = HERE.parents[1]
# maven-dependency-plugin pinned: Maven 3.8's default (2.8) is a decade old.
COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
SPARK_CONNECTOR_ARTIFACTS = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
                             "commons-pool2")
RETRY_UNSERVED_S = 24 * 3600  # a connector the registry did not serve is asked for again a day later
CONNECTOR_METADATA = "https://repo.maven.apache.org/maven2/org/apache/spark/spark-sql-kafka-0-10_2.13/maven-metadata.xml"
CONNECTOR_VERSION_FILE = "connector-version"  # in spark-kafka-<pyspark version>: the connector's own version


class KafkaNotSetUp(RuntimeError):
    """Kafka's jars (or the compiled client) are missing or stale: set-up was not run."""


class KafkaError(RuntimeError):
    """A Kafka process failed, or a command of the client did."""


def kafka_version() -> str:
    return re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text()).group(1)


def cache_dir() -> Path:
    return Path(os.environ.get("LOGFS_KAFKA_CACHE") or CHECKOUT / ".cache" / "kafka")


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _jars_stamp() -> str:
    return _digest(POM.read_bytes(), COPY_DEPENDENCIES)


def _client_stamp() -> str:
    return _digest(CLIENT_SOURCE.read_bytes(), _jars_stamp())


def _stamp_ok(path: Path, stamp: str) -> bool:
    try:
        return path.read_text().strip() == stamp
    except FileNotFoundError:
        return False


def jars_dir() -> Path:
    """The directory of Kafka's jars (the broker's classpath), or :class:`KafkaNotSetUp`."""
    jars = cache_dir() / "jars"
    if not _stamp_ok(cache_dir() / "jars.stamp", _jars_stamp()) or not jars.is_dir():
        raise KafkaNotSetUp(
            f"Apache Kafka {kafka_version()}'s jars are not in {jars} (or were resolved from another {POM.name}): "
            f"run the set-up, `bash tools/dev.sh` (or `{sys.executable} -m logfs.testing.kafka setup`)")
    return jars


def java() -> str:
    found = shutil.which("java")
    if not found:
        raise KafkaNotSetUp("no `java` on PATH: run the set-up, `bash tools/dev.sh` (it installs Java 17)")
    return found


def kafka_classpath() -> str:
    return f"{jars_dir()}/*"


def client_classpath() -> str:
    """Kafka's jars and the compiled KafkaClient (compiled now if its source changed since)."""
    classes = cache_dir() / "classes"
    if not _stamp_ok(cache_dir() / "classes.stamp", _client_stamp()):
        with _locked():
            if not _stamp_ok(cache_dir() / "classes.stamp", _client_stamp()):
                _compile_client(lambda message: print(message, file=sys.stderr))
    return f"{classes}{os.pathsep}{kafka_classpath()}"


def spark_connector_jars() -> list[Path]:
    """The jars of Spark's Kafka connector at the installed PySpark's version, or [] (not served, or no PySpark)."""
    version = _pyspark_version()
    if version is None or not _stamp_ok(cache_dir() / f"spark-kafka-{version}.stamp", _spark_stamp(version)):
        return []
    folder = cache_dir() / f"spark-kafka-{version}"
    return sorted(folder.glob("*.jar"))


def spark_connector_version() -> str | None:
    """The version of the connector :func:`spark_connector_jars` holds (PySpark's own, or an earlier release of its
    major version), or None."""
    if not spark_connector_jars():
        return None
    marker = cache_dir() / f"spark-kafka-{_pyspark_version()}" / CONNECTOR_VERSION_FILE
    return marker.read_text().strip() if marker.exists() else _pyspark_version()


def spark_connector_status() -> str:
    """Why :func:`spark_connector_jars` is empty (or where the jars are)."""
    version = _pyspark_version()
    if version is None:
        return "PySpark is not installed"
    folder = cache_dir() / f"spark-kafka-{version}"
    if spark_connector_jars():
        return f"connector {spark_connector_version()} for PySpark {version}, resolved in {folder}"
    note = cache_dir() / f"spark-kafka-{version}.unavailable"
    if note.exists():
        return note.read_text().strip()
    return "set-up did not resolve it"


# -- set-up ---------------------------------------------------------------------------------------------------
@contextmanager
def _locked():
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise KafkaNotSetUp(f"no `{tool}` on PATH (tools/dev.sh installs it: openjdk-17-jdk-headless, maven)")
    return found


def _mvn_copy(pom: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_need("mvn"), "-q", "-B", "-f", str(pom), COPY_DEPENDENCIES,
                           f"-DoutputDirectory={out}", *args], capture_output=True, text=True)


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)


def _resolve_kafka(say) -> None:
    stamp_file, jars = cache_dir() / "jars.stamp", cache_dir() / "jars"
    if _stamp_ok(stamp_file, _jars_stamp()) and jars.is_dir():
        return
    say(f"resolving Apache Kafka {kafka_version()} with Maven into {jars} ...")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="jars.", dir=cache_dir()))
    r = _mvn_copy(POM, tmp)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KafkaError(f"Maven could not resolve {POM}:\n{r.stdout}{r.stderr}")
    _replace_dir(tmp, jars)
    stamp_file.write_text(_jars_stamp() + "\n")
    say(f"  {len(list(jars.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")


def _compile_client(say) -> None:
    classes = cache_dir() / "classes"
    say(f"compiling {CLIENT_SOURCE.name} into {classes} ...")
    tmp = Path(tempfile.mkdtemp(prefix="classes.", dir=cache_dir()))
    r = subprocess.run([_need("javac"), "-nowarn", "-encoding", "UTF-8", "-d", str(tmp), "-cp", kafka_classpath(),
                        str(CLIENT_SOURCE)], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KafkaError(f"javac failed on {CLIENT_SOURCE}:\n{r.stdout}{r.stderr}")
    _replace_dir(tmp, classes)
    (cache_dir() / "classes.stamp").write_text(_client_stamp() + "\n")


def perf_tools_classpath() -> str:
    """Kafka's jars and its performance tools (``org.apache.kafka:kafka-tools``: ConsumerPerformance,
    ProducerPerformance), resolved with Maven into ``tools-jars`` on first use: the benchmarks need them, the tests
    do not, so set-up does not fetch them."""
    folder, stamp_file = cache_dir() / "tools-jars", cache_dir() / "tools-jars.stamp"
    stamp = _digest(TOOLS_POM.read_bytes(), COPY_DEPENDENCIES, kafka_version())
    if not _stamp_ok(stamp_file, stamp):
        with _locked():
            if not _stamp_ok(stamp_file, stamp):
                tmp = Path(tempfile.mkdtemp(prefix="tools-jars.", dir=cache_dir()))
                r = _mvn_copy(TOOLS_POM, tmp, f"-Dkafka.version={kafka_version()}", "-DincludeArtifactIds=kafka-tools")
                if r.returncode != 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise KafkaError(f"Maven could not resolve {TOOLS_POM}:\n{r.stdout}{r.stderr}")
                _replace_dir(tmp, folder)
                stamp_file.write_text(stamp + "\n")
    return f"{folder}/*{os.pathsep}{kafka_classpath()}"


def _pyspark_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def _spark_stamp(version: str) -> str:
    return _digest(SPARK_POM.read_bytes(), COPY_DEPENDENCIES, version)


def _release_key(version: str) -> tuple[int, ...] | None:
    """``4.2.0`` -> (4, 2, 0); a preview or other qualified version -> None (never a fallback)."""
    return tuple(int(part) for part in version.split(".")) if re.fullmatch(r"\d+(\.\d+)*", version) else None


def connector_candidates(installed: str, listed: list[str]) -> list[str]:
    """The connector versions to ask for, in order: PySpark's own, then the newest release of the same major
    version below it among ``listed`` (Maven Central's versions of the connector). A connector is not taken from
    another major version, nor from a newer release than PySpark, nor from a preview."""
    mine = _release_key(installed)
    older = [v for v in listed if (key := _release_key(v)) is not None and mine is not None
             and key[0] == mine[0] and key < mine]
    return [installed] + sorted(older, key=_release_key, reverse=True)[:1]


def _listed_connector_versions() -> list[str]:
    import urllib.request

    try:
        with urllib.request.urlopen(CONNECTOR_METADATA, timeout=30) as response:
            return re.findall(r"<version>([^<]+)</version>", response.read().decode())
    except OSError:
        return []


def _resolve_spark_connector(say) -> None:
    version = _pyspark_version()
    if version is None:
        return
    folder = cache_dir() / f"spark-kafka-{version}"
    stamp_file = cache_dir() / f"spark-kafka-{version}.stamp"
    note = cache_dir() / f"spark-kafka-{version}.unavailable"
    if _stamp_ok(stamp_file, _spark_stamp(version)):
        return
    if note.exists() and time.time() - note.stat().st_mtime < RETRY_UNSERVED_S and \
            note.read_text().startswith(f"[{_spark_stamp(version)[:12]}]"):
        say(f"note: {note.read_text().strip()}")
        return
    reasons = []
    for candidate in connector_candidates(version, _listed_connector_versions()):
        say(f"resolving Spark's Kafka connector {candidate} for PySpark {version} into {folder} ...")
        tmp = Path(tempfile.mkdtemp(prefix="spark-kafka.", dir=cache_dir()))
        r = _mvn_copy(SPARK_POM, tmp, "-U", f"-Dspark.version={candidate}",
                      f"-DincludeArtifactIds={','.join(SPARK_CONNECTOR_ARTIFACTS)}")
        if r.returncode == 0:
            (tmp / CONNECTOR_VERSION_FILE).write_text(candidate + "\n")
            _replace_dir(tmp, folder)
            note.unlink(missing_ok=True)
            stamp_file.write_text(_spark_stamp(version) + "\n")
            return
        shutil.rmtree(tmp, ignore_errors=True)
        output = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)
        reason = next((line for line in output.splitlines() if "ERROR" in line), "Maven failed")
        reason = re.sub(r"^\[ERROR\] (Failed to execute goal on project [^:]*: )?", "", reason)
        reasons.append(re.sub(r" *\(https?://[^)]*\)| -> \[Help 1\]", "", reason)[:300])
    note.write_text(f"[{_spark_stamp(version)[:12]}] Spark's Kafka connector "
                    f"org.apache.spark:spark-sql-kafka-0-10_2.13 for PySpark {version} could not be resolved: "
                    f"{'; '.join(reasons)}\n")
    say(f"note: {note.read_text().strip()} (set-up goes on without it; asked again in a day)")


def setup(say=print, spark: bool = True) -> None:
    """Resolve Kafka's jars, compile the client, try Spark's connector; each only when not already done."""
    _need("java")
    _need("javac")
    with _locked():
        _resolve_kafka(say)
        if not _stamp_ok(cache_dir() / "classes.stamp", _client_stamp()):
            _compile_client(say)
        if spark:
            _resolve_spark_connector(say)

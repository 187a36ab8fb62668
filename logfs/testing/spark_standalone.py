"""A real Spark standalone cluster on 127.0.0.1 for the tests and tools/bench_cluster.py, and a driver process that runs
jobs on it. Imports nothing from the test suite (tests/spark/conftest.py makes fixtures of it).

``SparkCluster`` starts a Master and two Workers (one core, 1 GiB each) with pyspark's own launcher,
``$SPARK_HOME/bin/spark-class`` (SPARK_HOME is the pyspark package directory), every port chosen free, logs and
work directories in a private directory. The Workers start only once the Master answers (a Worker that finds no
Master retries after 5-15 s); start() returns when the Master's JSON lists both Workers ALIVE. Executors run
this interpreter (PYSPARK_PYTHON) with the code root of the logfs under test on PYTHONPATH, so they import the
tree under test.

``ClusterDriver`` is a Python process (``cluster_driver.py``) holding ONE SparkSession connected to the cluster
for the whole test session; tests send it jobs by name with JSON arguments and get JSON results (bytes travel
as ``{"$bytes": base64}``); an exception in a job comes back as ``ClusterJobError`` (type and message).

No JVM outlives the tests: every process (Master, each Worker with its executors, the driver with its JVM) is
its own process group; stop() terminates the groups, then kills them after a timeout, and is also registered
with ``atexit``. If the test process dies without running either (SIGKILL, SIGTERM), ``Reaper`` kills the
groups: a tiny watcher process that holds the read end of a pipe only the test process writes to, and kills
every group it was told about when that pipe reaches EOF.
"""

from __future__ import annotations

import atexit
import base64
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


from logfs.testing.mounts import code_env
from logfs.testing.seaweed import free_ports
from logfs.testing.spark_jvm import java_options

START_TIMEOUT = 120.0  # generous: the 2 cores may be busy with other tests
STOP_TIMEOUT = 15.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_missing_reason() -> str | None:
    """Why Spark cannot run here (PySpark or pyarrow missing, no working Java 17+), or None: the demo's Spark
    steps and the Spark tests skip with it."""
    try:
        for module, extra in (("pyspark", "spark"), ("pyarrow", "spark")):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install -e '.[{extra}]')"
    except (ImportError, ValueError) as exc:
        return f"PySpark cannot be imported: {exc}"
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if not os.access(java, os.X_OK):
            return f"JAVA_HOME={java_home} has no bin/java (unset it, or point it at a Java 17+ installation)"
    else:
        java = shutil.which("java")
        if java is None:
            return "no Java runtime: Spark needs Java 17+ (apt-get install openjdk-17-jdk-headless; tools/dev.sh does)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{java} -version` failed: {exc}"
    return None


def spark_class_unusable_reason() -> str | None:
    spark_class = spark_home() / "bin" / "spark-class"
    if not spark_class.is_file():
        return f"{spark_class} is missing (pyspark's pip package ships it)"
    if not os.access(spark_class, os.X_OK):
        return f"{spark_class} is not executable"
    return None


WORKER_HOSTS = ("127.0.0.1", "localhost")  # (localhost is 127.0.0.1 in /etc/hosts)


def cluster_env(**extra: str) -> dict[str, str]:
    """The environment of every cluster process: executors inherit their Worker's."""
    env = code_env()
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    env.update(extra)
    return env


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group pgid. Zombies do not count: spark-class's
    launcher subshell is left a zombie child of the JVM it exec'd, and once orphaned it waits for this machine's
    init to reap it, which took over 15 s here."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return True
    return False


def log_tail(path: Path, n: int = 30) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-n:])
    except OSError:
        return ""


_REAPER_CODE = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    word, _, pgid = line.partition(" ")
    if word == "add":
        groups.add(int(pgid))
    elif word == "forget":
        groups.discard(int(pgid))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Reaper:
    """Kills the process groups it was told about when the test process goes away without stopping them."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _REAPER_CODE], stdin=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def _say(self, word: str, pgid: int) -> None:
        if self.proc.stdin.closed:
            return
        self.proc.stdin.write(f"{word} {pgid}\n")
        self.proc.stdin.flush()

    def add(self, pgid: int) -> None:
        self._say("add", pgid)

    def forget(self, pgid: int) -> None:
        self._say("forget", pgid)

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def spawn(argv: list[str], log: Path, env: dict[str, str], reaper: Reaper, **kwargs) -> subprocess.Popen:
    """Start argv as its own process group (its children stay in it), stdout and stderr into log."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=kwargs.pop("stdout", out), stderr=out, env=env,
                                start_new_session=True, **kwargs)
    reaper.add(proc.pid)
    return proc


def stop_groups(procs: list[subprocess.Popen], reaper: Reaper, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM each process group, SIGKILL what is left after timeout; returns when every group is empty."""
    live = [p for p in procs if group_alive(p.pid)]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while any(group_alive(p.pid) for p in live) and time.monotonic() < deadline:
        time.sleep(0.1)  # a Worker's executors are in its group
    for p in live:
        if group_alive(p.pid):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()
    deadline = time.monotonic() + 10
    while any(group_alive(p.pid) for p in live):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes survived SIGKILL in groups {[p.pid for p in live if group_alive(p.pid)]}")
        time.sleep(0.05)
    for p in procs:
        reaper.forget(p.pid)


def get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class SparkCluster:
    """A standalone Master and ``workers`` Workers on 127.0.0.1; ``master_url`` is ``spark://127.0.0.1:P``."""

    def __init__(self, base: Path, workers: int = 2):
        self.base = Path(base)
        self.n_workers = workers
        self.master_port, self.master_ui_port, *self.worker_ui_ports = free_ports(2 + workers)
        self.master_url = f"spark://127.0.0.1:{self.master_port}"
        self.master_json = f"http://127.0.0.1:{self.master_ui_port}/json/"
        self.env = cluster_env(SPARK_LOCAL_DIRS=str(self.base / "local"),
                               # No REST submission server: it would take the fixed port 6066.
                               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                               # The daemons only coordinate: C1 only and the serial collector start them
                               # ~2.5 s sooner on 2 cores (measured).
                               SPARK_DAEMON_JAVA_OPTS=java_options())
        self.reaper = Reaper()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.startup_seconds = 0.0
        self._stopped = False

    def log(self, name: str) -> Path:
        return self.base / f"{name}.log"

    def _launch(self, name: str, cls: str, *args: str) -> subprocess.Popen:
        return spawn([str(spark_home() / "bin" / "spark-class"), cls, *args], self.log(name), self.env,
                     self.reaper, cwd=self.base)

    def _wait(self, what: str, ready, procs: list[subprocess.Popen], deadline: float):
        while True:
            for p, name in zip(procs, ["master"] + [f"worker-{i}" for i in range(len(procs) - 1)]):
                if p.poll() is not None:
                    raise RuntimeError(f"Spark {name} exited ({p.returncode}) before {what}:\n"
                                       f"{log_tail(self.log(name))}")
            try:
                state = get_json(self.master_json)
                if ready(state):
                    return state
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark cluster: no {what} within {START_TIMEOUT} s; master log:\n"
                                   f"{log_tail(self.log('master'))}")
            time.sleep(0.1)

    def alive_workers(self, state: dict) -> list[dict]:
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def start(self) -> "SparkCluster":
        t0 = time.monotonic()
        deadline = t0 + START_TIMEOUT
        atexit.register(self.stop)
        self.master = self._launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(self.master_port), "--webui-port", str(self.master_ui_port))
        self._wait("Master", lambda s: s.get("status") == "ALIVE", [self.master], deadline)
        for i, ui_port in enumerate(self.worker_ui_ports):
            work = self.base / f"work-{i}"
            work.mkdir(exist_ok=True)
            # Both on 127.0.0.1, but under two host names (WORKER_HOSTS): Spark runs a speculative copy of a task
            # only on another host than its running attempt's, compared by name.
            self.workers.append(self._launch(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "1g",
                "--host", WORKER_HOSTS[i % len(WORKER_HOSTS)], "--webui-port", str(ui_port), "--work-dir", str(work),
                self.master_url))
        self._wait(f"{self.n_workers} ALIVE workers", lambda s: len(self.alive_workers(s)) == self.n_workers,
                   [self.master, *self.workers], deadline)
        self.startup_seconds = time.monotonic() - t0
        return self

    def state(self) -> dict:
        return get_json(self.master_json)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        stop_groups([p for p in (*self.workers, self.master) if p is not None], self.reaper)
        self.reaper.close()
        atexit.unregister(self.stop)


class ClusterJobError(Exception):
    """A job failed in the cluster driver: ``type`` is the exception's class name, ``message`` its text."""

    def __init__(self, type_: str, message: str):
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message


def _decode(obj):
    if isinstance(obj, dict) and obj.keys() == {"$bytes"}:
        return base64.b64decode(obj["$bytes"])
    return obj


class ClusterDriver:
    """``cluster_driver.py`` connected to ``cluster``: ``run("read", path=..., options={...})``.

    Its application holds every core of the cluster while it lives, so a second driver on the same cluster
    would get no executor: add jobs to cluster_driver.py instead. ``conf`` adds Spark settings to the session
    (e.g. ``spark.executorEnv.AWS_ACCESS_KEY_ID``: executors inherit their Worker's environment plus these);
    ``env`` adds to the driver process's environment (its JVM, and the Python workers that plan data source
    reads, inherit it)."""

    def __init__(self, cluster: SparkCluster, log: Path, conf: dict[str, str] | None = None,
                 env: dict[str, str] | None = None):
        self.cluster = cluster
        self.log = log
        argv = [sys.executable, "-m", "logfs.testing.cluster_driver", cluster.master_url,
                "--executors", str(len(cluster.workers))]
        for key, value in (conf or {}).items():
            argv += ["--conf", f"{key}={value}"]
        self.proc = spawn(argv, log, cluster_env(SPARK_LOCAL_DIRS=str(cluster.base / "local"), **(env or {})), cluster.reaper,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buffer = b""
        self._stopped = False
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self.info = self._receive(START_TIMEOUT, "the SparkSession")
        except BaseException:  # a driver that never got ready is not asked to stop its session
            self.stop(graceful=False)
            raise
        self.startup_seconds = time.monotonic() - t0

    def _receive(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cluster driver: no answer for {what} within {timeout} s; its log:\n"
                                   f"{log_tail(self.log)}")
            if select.select([fd], [], [], min(left, 1.0))[0]:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"cluster driver exited ({self.proc.wait()}) during {what}; its log:\n"
                                       f"{log_tail(self.log)}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line, object_hook=_decode)

    def run(self, job: str, timeout: float = 120.0, **args):
        """Run ``job`` (a function in cluster_driver.JOBS) with ``args``; its JSON result, or ClusterJobError."""
        self.proc.stdin.write(json.dumps({"job": job, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        answer = self._receive(timeout, f"job {job!r}")
        if not answer["ok"]:
            raise ClusterJobError(answer["type"], answer["message"])
        return answer["result"]

    def stop(self, graceful: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:  # EOF: the driver stops its SparkSession (the application ends, the executors exit) and exits
            self.proc.stdin.close()
            if graceful:
                self.proc.wait(timeout=STOP_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop_groups([self.proc], self.cluster.reaper)
        atexit.unregister(self.stop)

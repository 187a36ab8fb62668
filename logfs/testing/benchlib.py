"""What the benchmarks share (tools/bench.py and every tools/bench_*.py): mounting and unmounting logfs, finding
its daemon, timing shell and file operations, writer processes, the markdown helpers, and the clean-up that leaves
nothing behind under a work directory. Imports nothing from the bench scripts, so none of them imports another's
``__main__``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

from logfs.testing.spark_jvm import java_options
from logfs.testing.mounts import (CODE_ROOT, alive, code_env, daemon_pid, daemon_pids, logfs_command,  # noqa: F401
                                  mounted_at, mountpoints_under, processes, unmount_fuse, wait_for)

PY = sys.executable
ROOT = CODE_ROOT  # the checkout a run measures: its daemons and helpers get it on PYTHONPATH (env())


# -- mounts -----------------------------------------------------------------------------------------------
def env():
    return code_env()


def mount_logfs(data: str, mnt: str, *opts: str, extra_env: dict | None = None) -> float:
    """Mount (daemon mode: returns once usable); returns the seconds the mount command took."""
    os.makedirs(mnt, exist_ok=True)
    start = time.perf_counter()
    subprocess.run(logfs_command(data, mnt, opts, python=PY), check=True, env={**env(), **(extra_env or {})},
                   stderr=subprocess.DEVNULL)
    took = time.perf_counter() - start
    if not mounted_at(mnt):
        raise RuntimeError(f"logfs is not mounted at {mnt} after its command returned")
    return took


def unmount(mnt: str, data: str | None = None) -> None:
    pid = daemon_pid(data) if data else None
    unmount_fuse(mnt)
    if pid:
        wait_for(lambda: not alive(pid), 120, "the daemon to exit")


def kill9(mnt: str, data: str) -> None:
    pid = daemon_pid(data)
    os.kill(pid, 9)
    wait_for(lambda: not alive(pid))
    subprocess.run(["fusermount3", "-uz", mnt], check=False)


class NullFS:
    """nullfs (logfs.testing.nullfs) mounted at ``mnt`` in a process of its own, its one file ``size`` bytes."""

    def __init__(self, mnt: str, size: int):
        self.mnt = mnt
        os.makedirs(mnt, exist_ok=True)
        self.proc = subprocess.Popen([PY, "-m", "logfs.testing.nullfs", mnt, "--size", str(size)], env=env())
        wait_for(lambda: mounted_at(mnt), 30, "nullfs")

    def close(self):
        unmount_fuse(self.mnt, lazy_fallback=False)
        self.proc.wait(30)


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed_shell(script: str) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", script], check=True)
    return time.perf_counter() - start


def make_lines(path: str, size: int) -> int:
    """~100-byte JSON lines; returns the line count."""
    count = 0
    with open(path, "wb") as f:
        written = 0
        chunk = []
        while written < size:
            line = b'{"id":%09d,"user":"u%05d","event":"click","payload":"%s"}\n' % (count, count % 50000, b"p" * 30)
            chunk.append(line)
            written += len(line)
            count += 1
            if len(chunk) >= 10000:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))
    return count


def append_file(src: str, dst: str, fsync: bool) -> float:
    """Seconds to ``cat src`` into ``dst`` opened ``O_APPEND`` (as ``cat src >> dst``), plus, with ``fsync``, an
    fsync of that descriptor before it is closed. Closing is timed too: it is when logfs commits a partial line."""
    start = time.perf_counter()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        subprocess.run(["cat", src], stdout=fd, check=True)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def read_file(path: str, size: int) -> float:
    """Seconds to ``cat path > /dev/null``."""
    assert os.stat(path).st_size == size, path
    with open(os.devnull, "wb") as null:
        start = time.perf_counter()
        subprocess.run(["cat", path], stdout=null, check=True)
        return time.perf_counter() - start


def _line_writer(path: str, writer: int, count: int, length: int, barrier, results) -> None:
    """One writer process: ``count`` lines of ``length`` bytes, one ``os.write`` each, on an O_APPEND fd."""
    try:
        lines = []
        for i in range(count):
            head = b"w%d %09d " % (writer, i)
            lines.append(head + b"x" * (length - len(head) - 1) + b"\n")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        barrier.wait(60)
        start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        for line in lines:
            os.write(fd, line)
        end = time.perf_counter()
        os.close(fd)
        results.put((start, end, None))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((0.0, 0.0, repr(exc)))


def line_writers(path: str, writers: int, count: int, length: int) -> float:
    """Seconds from the first writer's first line to the last writer's last, ``writers`` processes (not threads,
    so the client's GIL is not the ceiling) each appending ``count`` lines to ``path``."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_line_writer, args=(path, w, count, length, barrier, results))
             for w in range(writers)]
    for proc in procs:
        proc.start()
    spans = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    errors = [error for _, _, error in spans if error]
    if errors:
        raise RuntimeError(f"writer failed on {path}: {errors[0]}")
    return max(end for _, end, _ in spans) - min(start for start, _, _ in spans)


class TailWatcher:
    """A ``tail -f`` for the latency benchmarks: a thread reads on at the end of ``path`` (when nothing came, it
    sleeps ``idle`` seconds) and notes when each line shows, by the number that is the line's second word
    (``tail <seq> ...``). ``clock`` is the writer's clock (``time.perf_counter`` for a writer in this process,
    ``time.time`` for a record's CreateTime)."""

    def __init__(self, path: str, clock=time.perf_counter, idle: float = 0.005, chunk: int = 1 << 20):
        import threading

        self.path, self.clock, self.idle, self.chunk = path, clock, idle, chunk
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not os.path.exists(self.path):
            if self._stop.wait(0.01):
                return
        with open(self.path, "rb", buffering=0) as f:
            rest = b""
            while not self._stop.is_set():
                chunk = f.read(self.chunk)
                if not chunk:
                    time.sleep(self.idle)
                    continue
                now = self.clock()
                *whole, rest = (rest + chunk).split(b"\n")
                for line in whole:
                    self.seen[int(line.split()[1])] = now

    def finish(self, sent: dict[int, float], timeout: float = 30) -> dict:
        """Waits (at most ``timeout`` s) for every line of ``sent`` (seq -> when its write started), stops, and
        returns the delays: lines sent, missing, p50/p99/max in seconds."""
        deadline = time.perf_counter() + timeout
        while len(self.seen) < len(sent) and time.perf_counter() < deadline:
            time.sleep(0.05)
        self.stop()
        import statistics

        delays = sorted(self.seen[s] - sent[s] for s in self.seen if s in sent)
        q = statistics.quantiles(delays, n=100)
        return {"lines": len(sent), "missing": len(sent) - len(self.seen), "p50": q[49], "p99": q[98],
                "max": delays[-1]}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def getx(path: "str | int", name: str) -> str:
    """``user.logfs.<name>`` of a path (the view a new open gets) or of a descriptor (its own view)."""
    return os.getxattr(path, f"user.logfs.{name}").decode()


# -- markdown ---------------------------------------------------------------------------------------------------
def fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def met(ok: bool) -> str:
    return "yes" if ok else "no"


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return out + ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]


# -- reports ----------------------------------------------------------------------------------------------------
def machine() -> dict:
    """The machine a report's figures were taken on."""
    return {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}


def write_report(report: dict, text: str, json_path: str | None, markdown_path: str | None) -> None:
    """Write ``report`` as JSON to ``json_path`` (if given); print its markdown ``text`` and write it to
    ``markdown_path`` (if given)."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    print("\n" + text, end="", flush=True)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(text)


# -- Spark --------------------------------------------------------------------------------------------------------
def pyspark_or_skip(bench, name: str) -> bool:
    """Whether pyspark imports (its Python workers then run this interpreter, and logfs imports from ROOT);
    if not, ``name`` is recorded as skipped."""
    try:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        import pyspark  # noqa: F401
    except ImportError:
        bench.record(name, skipped="pyspark not installed")
        return False
    os.environ["PYTHONPATH"] = env()["PYTHONPATH"]  # its Python workers import this checkout's logfs
    return True


def local_spark(app: str, shuffle_partitions: int, **conf):
    """A quiet ``local[2]`` SparkSession (no UI, no progress bars, errors only in its log)."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").appName(app).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions)))
    # Spark's class archive, not the fast-start flags: the figures are of C2-compiled code (logfs/testing/spark_jvm.py)
    conf = {"spark.driver.extraJavaOptions": java_options(fast_start=False), **conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _processes_naming(root: str) -> list[int]:
    """This user's processes (other than this one) whose command line names a path at or below ``root``: the
    logfs daemons (detached, so not our children), nullfs, SeaweedFS, Spark JVMs a run started there."""
    uid, out = os.getuid(), []
    needle = os.path.abspath(root).encode()
    for pid, args in processes():
        if any(arg == needle or arg.startswith(needle + b"/") or (b"=" + needle) in arg for arg in args):
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    out.append(pid)
            except OSError:
                continue
    return out


def leave_nothing(workdir: str, remove: bool) -> None:
    """Undo what a run left under ``workdir``, whether it finished or failed: writer processes, mounts (logfs and
    nullfs; a plain unmount first, so a daemon can shut down cleanly, then a lazy one), every process still naming
    the directory (terminated, then killed), and, with ``remove``, the directory itself. Signals that would end
    the run are ignored meanwhile, so a second Ctrl-C or SIGTERM does not cut the clean-up short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)
    for point in mountpoints_under(workdir):
        unmount_fuse(point)
    for sig, grace in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        pids = _processes_naming(workdir)
        if sig == signal.SIGKILL and pids:
            print(f"bench: killing {pids}, still running after the clean-up", file=sys.stderr, flush=True)
        for pid in pids:  # SIGTERM to a logfs daemon is its clean shutdown
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _processes_naming(workdir) and time.monotonic() < deadline:
            time.sleep(0.05)
    if remove:
        shutil.rmtree(workdir, ignore_errors=True)
        if os.path.exists(workdir):
            print(f"bench: could not remove {workdir}", file=sys.stderr, flush=True)

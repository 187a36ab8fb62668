#!/usr/bin/env python3
"""The logfs tour: mounts a demo store and walks through what logfs is for, each step printed as the command a
user would type, followed by its output.

    python tools/demo.py               # the whole tour, Spark included (a few minutes at most; ~1 min here)
    python tools/demo.py --no-spark    # without the Spark steps
    python tools/demo.py --quick       # without Spark, and shorter pauses
    python tools/demo.py --unmount     # take the demo mount down (clean shutdown) and stop
    python tools/demo.py --dir DIR     # the demo's directory (default: ./demo at the checkout's root)

Steps: mount (with a metrics file and tiering to a local directory); topics, one of them zstd-compressed;
appends from the shell and from two writers at once; reading, and `tail -f` following appends; reads at offsets
and times through the xattrs; segments rolling and retention deleting the oldest; tiered storage; Spark reading
the mount's files (`spark.read.text`, a grouped query) and the `logfs` data source on DATA_DIR; the metrics
file. The mount stays up at the end, with the line that takes it down.

Something missing (fusermount3, getfattr, /dev/fuse) is one clear line and exit status 1; Spark's steps are
skipped with a line saying why when PySpark or Java is missing. The shell commands run with the checkout's
venv first on PATH (the `logfs` command). Tools never import the tests.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

try:
    from logfs.testing.mounts import alive, mounted_at, unmount_fuse
    from logfs.testing.spark_jvm import java_options
    from logfs.testing.spark_standalone import spark_missing_reason
except ImportError as exc:  # outside the set-up: one clear line, as for anything else missing
    sys.exit(f"demo: logfs cannot be imported ({exc}): pip install -e . in this checkout (bash tools/dev.sh does)")

CHECKOUT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.dirname(os.path.abspath(sys.executable))
EXIT_TIMEOUT = 30.0


class DemoError(Exception):
    """A step that cannot go on: printed as one line, exit status 1."""


# -- the demo's directory and mount ---------------------------------------------------------------------------
class Layout:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.cwd = os.path.dirname(self.root)      # commands run from here...
        self.name = os.path.basename(self.root)    # ...and name demo/mnt, demo/data
        self.data = os.path.join(self.root, "data")
        self.mnt = os.path.join(self.root, "mnt")
        self.remote = os.path.join(self.root, "remote")
        self.metrics = os.path.join(self.root, "logfs.prom")

    def rel(self, *parts: str) -> str:
        return os.path.join(self.name, *parts)


def lock_holders(data_dir: str) -> list[int]:
    """PIDs of processes holding DATA_DIR/.lock open: the daemon serving it."""
    target = os.path.join(os.path.abspath(data_dir), ".lock")
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == target:
                    pids.append(int(name))
                    break
            except OSError:
                continue
    return pids


def take_down(lay: Layout) -> bool:
    """Unmount the demo (``fusermount3 -u``, lazily if busy) and wait for its daemon's clean exit. True if there
    was a mount."""
    was_mounted = mounted_at(lay.mnt)
    pids = lock_holders(lay.data) if os.path.isdir(lay.data) else []
    unmount_fuse(lay.mnt)  # lazily if busy (a shell cd'd into it) or its daemon dead
    deadline = time.monotonic() + EXIT_TIMEOUT
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.05)
    if pids:
        raise DemoError(f"the logfs daemon (pid {pids[0]}) did not exit within {EXIT_TIMEOUT:.0f} s of the unmount")
    return was_mounted


# -- printing steps -------------------------------------------------------------------------------------------
class Tour:
    def __init__(self, lay: Layout, args):
        self.lay = lay
        self.args = args
        self.step_no = 0
        self.env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}

    def step(self, title: str) -> None:
        self.step_no += 1
        print(f"\n== {self.step_no}. {title}", flush=True)

    def note(self, text: str) -> None:
        print(textwrap.indent(text, "# "), flush=True)

    def sh(self, cmd: str, *, check: bool = False, what: str = "") -> subprocess.CompletedProcess:
        """Print ``$ cmd`` and run it in bash from the demo's parent directory, its output shown as it comes."""
        print(f"$ {cmd}", flush=True)
        r = subprocess.run(["bash", "-c", cmd], cwd=self.lay.cwd, env=self.env, check=False)
        if check and r.returncode != 0:
            raise DemoError(f"{what or cmd!r} failed (exit status {r.returncode})")
        return r

    def out(self, cmd: str) -> str:
        """Run a command silently and return its output (for waiting on something; never shown)."""
        r = subprocess.run(["bash", "-c", cmd], cwd=self.lay.cwd, env=self.env, capture_output=True, text=True)
        return r.stdout.strip()

    def xattr(self, path: str, name: str) -> str:
        try:
            return os.getxattr(path, f"user.logfs.{name}").decode()
        except OSError:
            return ""

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise DemoError(f"gave up waiting {timeout:.0f} s for {what}")
            time.sleep(0.1)


def missing_tools() -> list[str]:
    """What the shell steps need: a clear line each."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse is missing (load the fuse kernel module: modprobe fuse)")
    for tool, package in (("fusermount3", "fuse3"), ("getfattr", "attr"), ("setfattr", "attr")):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` is not installed (Debian package {package}; tools/dev.sh installs it)")
    if shutil.which("logfs", path=BIN + os.pathsep + os.environ.get("PATH", "")) is None:
        missing.append("the `logfs` command is not installed (pip install -e . in this checkout)")
    return missing


# -- the tour -------------------------------------------------------------------------------------------------
def order(by: str = "") -> str:
    """The shell that echoes order $i as a JSON line (items=(widget gadget gizmo) set before)."""
    return "echo '{\"id\":'$i',\"item\":\"'${items[i%3]}'\"" + (f',\"by\":\"{by}\"' if by else "") + "}'"


def tour(t: Tour) -> None:
    lay, args = t.lay, t.args
    m, d = lay.rel("mnt"), lay.rel("data")
    pause = 1 if args.quick else 3

    t.step("Mount a store: DATA_DIR is created if missing; `logfs` returns once the mount answers")
    opts = ",".join([
        "num.partitions=2",
        f"logfs.metrics.file=$PWD/{lay.rel('logfs.prom')}", "logfs.metrics.interval.ms=1000",
        "log.retention.check.interval.ms=500",
        "remote.log.storage.system.enable=true", f"logfs.remote.dir=$PWD/{lay.rel('remote')}",
        "remote.log.manager.task.interval.ms=1000",
    ])
    t.sh(f"logfs {d} {m} -o {opts}", check=True, what="mounting logfs")
    t.sh(f"findmnt -n -o TARGET,SOURCE,FSTYPE {m} || grep {shlex.quote(lay.mnt)} /proc/mounts")

    t.step("Topics are directories, partitions are files; a second topic stores its sealed segments with zstd")
    t.sh(f"mkdir {m}/orders && ls -l {m}/orders")
    t.sh(f"getfattr -n user.logfs.partitions {m}/orders")
    t.sh(f"mkdir {m}/applog && setfattr -n user.logfs.config.compression.type -v zstd {m}/applog"
         f" && setfattr -n user.logfs.config.segment.bytes -v 65536 {m}/applog")

    t.step("Append from the shell: one line is one record")
    t.sh(f"items=(widget gadget gizmo); for i in $(seq 0 99); do {order()} >> {m}/orders/0; done")
    t.sh(f"seq 1 20000 | awk '{{printf \"%s INFO api request id=%d user=u%03d handled in %d ms\\n\", "
         f"strftime(\"%FT%T\"), $1, $1 % 97, $1 % 900}}' >> {m}/applog/0")
    t.note("Two writers appending to one partition at once: lines interleave, never within a line.")
    t.sh(f"items=(widget gadget gizmo)\n"
         f"for i in $(seq 1000 1999); do {order('A')}; done >> {m}/orders/1 &\n"
         f"for i in $(seq 2000 2999); do {order('B')}; done >> {m}/orders/1 &\n"
         f"wait")
    t.sh(f"wc -l < {m}/orders/1; grep -c '\"by\":\"A\"' {m}/orders/1; "
         f"grep -cv '^{{\"id\":[0-9]*,\"item\":\"[a-z]*\",\"by\":\"[AB]\"}}$' {m}/orders/1   # torn lines")

    t.step("Read: plain files for every tool; `tail -f` follows appends")
    t.sh(f"head -3 {m}/orders/0; wc -l {m}/orders/0; stat -c 'st_size=%s' {m}/orders/0")
    t.sh(f"grep -c gadget {m}/orders/1")
    since_ms = int(time.time() * 1000)
    time.sleep(0.05)
    t.sh(f"timeout {pause + 1.5:g} tail -n 1 -f {m}/orders/0 &\n"
         f"items=(widget gadget gizmo); for i in $(seq 100 102); do sleep {pause / 4:g}; {order()} >> {m}/orders/0; done\n"
         f"wait   # tail -f printed the three new lines as they came")

    t.step("Offsets and times through the xattrs: where a record starts, which record a time or byte is")
    t.sh(f"getfattr -d {m}/orders/0")
    t.sh(f"pos=$(getfattr --only-values -n user.logfs.position.42 {m}/orders/0); echo $pos; "
         f"tail -c +$((pos+1)) {m}/orders/0 | head -2")
    t.sh(f"getfattr -n user.logfs.offset.1000 {m}/orders/0   # the record whose line holds byte 1000")
    t.note(f"{since_ms} is the time (epoch ms) just before the `tail -f` appends:")
    t.sh(f"off=$(getfattr --only-values -n user.logfs.time.{since_ms} {m}/orders/0); echo $off; "
         f"tail -c +$(( $(getfattr --only-values -n user.logfs.position.$off {m}/orders/0) + 1 )) {m}/orders/0")

    t.step("Compression: the zstd topic's sealed segments were rewritten in the background")
    applog = os.path.join(lay.mnt, "applog", "0")
    t.wait(lambda: os.path.exists(applog) and int(t.xattr(applog, "size_bytes") or 0) * 3
           < os.stat(applog).st_size, 60, "the background zstd rewrite of applog's sealed segments")
    t.sh(f"stat -c 'st_size=%s' {m}/applog/0; getfattr -d -m '^user.logfs.(size_bytes|segment_count)$' {m}/applog/0")
    t.sh(f"echo \"ratio: $(( $(stat -c %s {m}/applog/0) / $(getfattr --only-values -n user.logfs.size_bytes "
         f"{m}/applog/0) ))x\"   # st_size / stored bytes (the active segment is still plain)")
    t.sh(f"head -2 {m}/applog/0; ls -l {d}/applog-0/*.log | head -3   # 64 KiB segments, stored zstd")

    t.step("Rolling and retention: small segments on topic `clicks`, then a size limit")
    t.sh(f"mkdir {m}/clicks && setfattr -n user.logfs.config.segment.bytes -v 1024 {m}/clicks")
    t.sh(f"for n in 1 2 3; do seq -f 'click %g' $((n*100-99)) $((n*100)) >> {m}/clicks/0; "
         f"getfattr --only-values -n user.logfs.segment_count {m}/clicks/0; echo ' segments'; done")
    t.sh(f"ls {d}/clicks-0 | grep -c '\\.log$'; getfattr --only-values -n user.logfs.log_start_offset "
         f"{m}/clicks/0; echo")
    t.sh(f"setfattr -n user.logfs.config.retention.bytes -v 3000 {m}/clicks   # keep about 3 KB per partition")
    clicks = os.path.join(lay.mnt, "clicks", "0")
    t.wait(lambda: int(t.xattr(clicks, "log_start_offset") or 0) > 0, 30, "retention on topic clicks")
    t.note("The next retention check (log.retention.check.interval.ms=500) deleted the oldest segments:")
    t.sh(f"getfattr -d -m '^user.logfs.(log_start_offset|segment_count)$' {m}/clicks/0; "
         f"head -1 {m}/clicks/0; wc -l < {m}/clicks/0")
    t.sh(f"ls {d}/clicks-0 | grep deleted | head -3   # removed after file.delete.delay.ms (60 s)")

    t.step("Tiered storage: topic `events` keeps little locally; the rest is in the store (here a directory)")
    t.sh(f"mkdir {m}/events && setfattr -n user.logfs.config.segment.bytes -v 2048 {m}/events"
         f" && setfattr -n user.logfs.config.remote.storage.enable -v true {m}/events"
         f" && setfattr -n user.logfs.config.local.retention.bytes -v 4096 {m}/events")
    t.sh(f"seq -f 'event %g' 1 2000 >> {m}/events/0")
    events = os.path.join(lay.mnt, "events", "0")
    t.wait(lambda: int(t.xattr(events, "local_log_start_offset") or 0) > 0, 60,
           "tiering and local retention on topic events")
    t.sh(f"getfattr -d -m 'log_start_offset|remote_log_end_offset|segment_count' {m}/events/0")
    t.sh(f"wc -l < {m}/events/0; head -1 {m}/events/0   # the whole log, read from both tiers")
    t.sh(f"ls {lay.rel('remote')}/events-0 | head -5")
    t.note("An S3 bucket instead of a directory: -o logfs.remote.s3.bucket=B,logfs.remote.s3.endpoint=URL "
           "(README \"Tiered storage\";\n`python -m pytest tests/tiered` runs it against a SeaweedFS server).")

    if args.no_spark or args.quick:
        t.step("Spark: skipped (--quick / --no-spark)")
    else:
        reason = spark_missing_reason()
        if reason:
            t.step("Spark: skipped")
            t.note(f"The Spark steps need PySpark and Java: {reason}.")
        else:
            spark_steps(t)

    t.step("Metrics: the Prometheus textfile the daemon rewrites every second here (10 s by default)")
    t.wait(lambda: os.path.exists(lay.metrics) and 'topic="events"' in open(lay.metrics).read(), 30,
           "the metrics file")
    time.sleep(1.1)  # one more interval: the last steps' figures
    t.sh(f"grep -E '^logfs_(topics|partitions|open_files|build_info)|^logfs_partition_(log_end_offset|appended_records_"
         f"total|read_bytes_total)\\{{topic=\"orders\"|^logfs_(compression_(segments|input_bytes|output_bytes)_total|"
         f"retention_deleted_segments_total)|^logfs_partition_remote_size_bytes|^process_resident' {lay.rel('logfs.prom')}")


# (With the class archive the set-up made for Spark's JVMs, when there is one: a session starts in half the time.)
SPARK_SESSION = """\
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.extraJavaOptions", os.environ["LOGFS_DEMO_JAVA_OPTIONS"]).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
"""


def spark_steps(t: Tour) -> None:
    """Runs the Spark lines in a child Python (this interpreter): its JVM's start-up chatter goes to a file,
    shown only if the child fails."""
    lay = t.lay
    t.step("Spark reads the mount's files as plain text files (nothing logfs-specific)")
    t.note(f"In `PYSPARK_PYTHON={sys.executable} pyspark`, type the lines after >>>. Here the demo runs them\n"
           f"(starting Spark takes 10-20 s):")
    t.sh(f"cat {lay.rel('mnt')}/orders/* | wc -l")
    lines = [
        ("STEP", ""),
        ("CODE", f'spark.read.text("file://{lay.mnt}/orders").count()'),
        ("CODE", f'spark.read.json("file://{lay.mnt}/orders").groupBy("item").count().orderBy("item").show()'),
        ("STEP", "The `logfs` data source on the same topic: offsets, partitions, timestamps, read from DATA_DIR"),
        ("CODE", "from logfs.spark import register; register(spark)"),
        ("CODE", f'df = spark.read.format("logfs").option("subscribe", "orders").load("{lay.data}")'),
        ("CODE", 'df.groupBy("partition").agg(F.count("*").alias("records"), F.min("offset"), F.max("offset"))'
                 '.orderBy("partition").show()'),
        ("CODE", 'df.where("partition = 0 AND offset >= 100").selectExpr("offset", "timestamp", '
                 '"CAST(value AS STRING) AS value").show(truncate=False)'),
    ]
    script = SPARK_CHILD.replace("@LINES@", repr(lines)).replace("@SESSION@", SPARK_SESSION)
    env = {**t.env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": t.env.get("SPARK_LOCAL_IP", "127.0.0.1"), "LOGFS_DEMO_STEP": str(t.step_no),
           "LOGFS_DEMO_JAVA_OPTIONS": java_options(fast_start=False)}
    with tempfile.TemporaryFile(mode="w+") as err:
        r = subprocess.run([sys.executable, "-c", script], cwd=lay.cwd, env=env, stderr=err, check=False)
        t.step_no += 1
        if r.returncode != 0:
            err.seek(0)
            tail = "".join(err.readlines()[-25:])
            t.note(f"The Spark steps failed (exit status {r.returncode}); the end of their output:\n{tail.rstrip()}")
            raise DemoError("the Spark steps failed (output above); `--no-spark` skips them")


SPARK_CHILD = r'''
import code, os, sys
step = int(os.environ["LOGFS_DEMO_STEP"])
from pyspark.sql import SparkSession, functions as F
@SESSION@
ns = {"spark": spark, "F": F}
for kind, text in @LINES@:
    if kind == "STEP":
        if text:
            step += 1
            print(f"\n== {step}. {text}", flush=True)
        continue
    print(">>> " + text, flush=True)
    exec(compile(text, "<demo>", "single"), ns)
    sys.stdout.flush()
spark.stop()
'''


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="no Spark, shorter pauses")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark steps")
    p.add_argument("--unmount", action="store_true", help="take the demo mount down and stop")
    p.add_argument("--dir", default=os.path.join(CHECKOUT, "demo"),
                   help="the demo's directory: DATA_DIR is DIR/data, the mount DIR/mnt (default: ./demo)")
    args = p.parse_args(argv)
    lay = Layout(args.dir)
    started = time.monotonic()
    try:
        if args.unmount:
            if take_down(lay):
                print(f"unmounted {lay.mnt} (clean shutdown)")
            else:
                print(f"nothing mounted at {lay.mnt}")
            return 0
        missing = missing_tools()
        if missing:
            for line in missing:
                print(f"demo: {line}", file=sys.stderr)
            return 1
        take_down(lay)  # a previous run's mount
        for sub in ("data", "remote"):
            shutil.rmtree(os.path.join(lay.root, sub), ignore_errors=True)
        for sub in ("mnt", "remote"):
            os.makedirs(os.path.join(lay.root, sub), exist_ok=True)
        print(f"logfs demo in {lay.root} (commands run from {lay.cwd})", flush=True)
        t = Tour(lay, args)
        tour(t)
    except DemoError as exc:
        print(f"\ndemo: {exc}", file=sys.stderr)
        if mounted_at(lay.mnt):
            print(f"demo: the mount is still up: python tools/demo.py --unmount (or: fusermount3 -u {lay.mnt})",
                  file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ndemo: interrupted; take the mount down with: fusermount3 -u {lay.mnt}", file=sys.stderr)
        return 130
    took = time.monotonic() - started
    print(f"\nDone in {took:.0f} s. logfs is still mounted at {lay.mnt}: look around "
          f"(ls, cat, getfattr -d, echo >>).\n"
          f"Take it down with: fusermount3 -u {lay.mnt}    (or: bash tools/dev.sh demo --unmount)\n"
          f"As a service: systemd/logfs@.service (README \"Running under systemd\").", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

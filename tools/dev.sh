#!/usr/bin/env bash
# One-command set-up for a fresh Debian machine, then: `demo` mounts a demo store, `test` runs the suite.
#   bash tools/dev.sh demo     |     bash tools/dev.sh test [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:-test}; shift || true

need_apt=()
for pair in fusermount3:fuse3 pkg-config:pkg-config getfattr:attr java:openjdk-17-jdk-headless \
    javac:openjdk-17-jdk-headless mvn:maven gcc:gcc systemd-analyze:systemd; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
[ -e /usr/include/fuse3/fuse_lowlevel.h ] || need_apt+=(libfuse3-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# Headers for the C accelerator (logfs/_speedups.c) and pyfuse3.
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || need_apt+=(python3-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi
[ -e /dev/fuse ] || { echo "error: /dev/fuse is missing (load the fuse module)" >&2; exit 1; }

# pip, less one notice that is about the machine, not logfs: for each package it names every index directory of
# the machine's pip configuration (find-links, extra-index-url file:// entries) that does not exist, ~50 lines.
# Everything else pip prints, errors included, is shown, and its exit status kept.
quiet_pip() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  grep -v -E "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$" "$log" >&2 || true
  rm -f "$log"
  return $rc
}

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
quiet_pip .venv/bin/pip install -q --upgrade pip
quiet_pip .venv/bin/pip install -q -e '.[test]'
# The C accelerator is optional (the build goes on without it); say so when it is missing, as it costs speed.
.venv/bin/python -c 'import logfs._speedups' 2>/dev/null \
  || echo "note: logfs's C accelerator was not built (no C compiler?): logfs runs on its slower pure-Python paths" >&2
# Byte-code for the package (an editable install leaves it as source): every daemon, Spark worker and tool the
# tests start imports it, and where PYTHONDONTWRITEBYTECODE is set (it is on the machines here) Python would
# compile it anew in each: 0.7 of a daemon's 1.6-2.4 s start, measured. Python still checks each .pyc against its
# source's mtime, so an edit after this is compiled in memory, never run stale.
.venv/bin/python -m compileall -q -j 0 logfs tools >/dev/null
# The same for PySpark in the zip Spark puts first on its Python workers' path, which PyPI ships as source only:
# every worker compiled PySpark, 1.05 s of CPU each, ~15 workers per streaming query (logfs/testing/pyspark_zip.py).
.venv/bin/python -m logfs.testing.pyspark_zip
# Java's class-data sharing archive for Spark's JVMs (made once per PySpark and Java; ~45 s): a session starts in
# half the time (logfs/testing/spark_jvm.py).
.venv/bin/python -m logfs.testing.spark_jvm
# Apache Kafka for tests/kafka (logfs/testing/kafka.py): its jars resolved with Maven into .cache/kafka, the test
# client compiled, Spark's Kafka connector tried. Skipped when already done (a stamp of the POM).
.venv/bin/python -m logfs.testing.kafka setup

case "$action" in
  test)
    # (.cache/last-test-run.xml: every test's duration, for trimming the suite to its budget)
    # Two pytest-xdist workers (LOGFS_TEST_WORKERS; 0: one process): much of a test's time is waiting (a daemon's
    # mount, a JVM, a roll or a retention tick), so two overlap it. Each test module runs whole in one worker
    # (its fixtures set up once), and tests sharing one machine-wide thing in one group (tests/harness.py).
    exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${LOGFS_TEST_WORKERS:-2}" --dist loadgroup \
      --no-loadscope-reorder --durations=25 --junitxml=.cache/last-test-run.xml "$@"
    ;;
  demo)
    exec .venv/bin/python tools/demo.py "$@"
    ;;
  *)
    echo "usage: $0 demo|test" >&2; exit 2
    ;;
esac

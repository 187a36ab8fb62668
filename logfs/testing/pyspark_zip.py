"""Byte-code for the PySpark that Spark's Python workers import (``python -m logfs.testing.pyspark_zip``, run by
the set-up, tools/dev.sh).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on every Python worker's ``PYTHONPATH``
(``PythonUtils.sparkPythonPath``), so each worker imports PySpark from the zip, not from site-packages. PyPI's
PySpark ships that zip as source only, and zipimport never writes byte-code, so every worker compiles PySpark
anew: measured here, importing ``pyspark.daemon`` and a data-source worker module took 1.39 s of CPU from the
zip against 0.34 s from site-packages. A streaming query with the ``logfs`` source and sink starts about fifteen
such workers, so a driver's first micro-batch took 15 s, and 10 s with this.

This adds an unchecked-hash ``.pyc`` next to each module of the zips (zipimport's own layout, ``pkg/mod.pyc``),
compiled by the running interpreter: a worker of another Python version finds a foreign magic number and
falls back to the source, and the source stays, so tracebacks are unchanged. PySpark's own tests are left as
they are. Idempotent: a zip that holds any ``.pyc`` is left alone. A reinstall of PySpark restores the
original zips; run this again after one.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # the layout of an unchecked-hash .pyc (PEP 552)


def spark_python_zips() -> list[str]:
    """The zips Spark puts on its Python workers' path, from the PySpark this interpreter imports."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(os.path.abspath(pyspark.__file__))
    return sorted(glob.glob(os.path.join(home, "python", "lib", "*.zip")))


def add_bytecode(path: str) -> int:
    """Rewrite the zip at ``path`` with a ``.pyc`` beside each ``.py`` outside a ``tests`` package; returns how
    many were added (0: the zip already had byte-code). The new zip replaces the old one atomically."""
    with zipfile.ZipFile(path) as z:
        if any(name.endswith(".pyc") for name in z.namelist()):
            return 0
    added = 0
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                data = src.read(info)
                dst.writestr(info, data)
                name = info.filename
                if not name.endswith(".py") or "/tests/" in f"/{name}":
                    continue
                with warnings.catch_warnings():  # (PySpark's own SyntaxWarnings, printed at every compile)
                    warnings.simplefilter("ignore")
                    code = compile(data, os.path.join(path, name), "exec", dont_inherit=True)
                pyc = zipfile.ZipInfo(name + "c", info.date_time)
                pyc.compress_type = zipfile.ZIP_STORED  # (read whole at each import: no inflating)
                dst.writestr(pyc, bytes(_code_to_hash_pyc(code, importlib.util.source_hash(data), False)))
                added += 1
        with open(tmp, "rb") as f:  # (durable before it replaces the zip every Spark worker imports from)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return added


def main() -> int:
    try:
        zips = spark_python_zips()
    except ImportError:
        print("pyspark_zip: PySpark is not installed: nothing to do", file=sys.stderr)
        return 0
    for path in zips:
        added = add_bytecode(path)
        if added:
            print(f"{os.path.basename(path)}: byte-code added for {added} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

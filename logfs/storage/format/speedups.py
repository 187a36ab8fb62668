"""The one home of the C accelerator (``logfs/_speedups.c``): its one import, the one switch that turns it off for
the process, and the table of each C function's Python twin.

:data:`C` is the extension module, or None: not built (no C compiler), built from an older source that lacks a
function of :data:`TWINS` (a stale build is not used half-way), or turned off by ``LOGFS_NO_SPEEDUPS=1`` in the
environment before logfs is imported (the pure-Python paths then serve everything: a comparison, or a machine
whose build is suspect). Callers test ``C is not None`` and otherwise take the twin. Every pair gives the same
bytes: ``tests/storage/test_speedups_parity.py`` runs each over the same inputs.

:data:`TWINS` names each twin as ``"module:function"``, with C's signature: the twins live with the code they
serve (some above this package, which must not import them), so the table holds names. The format's own twins are
in :mod:`~logfs.storage.format.twins`. This module imports nothing of logfs: everything may import it.
"""

from __future__ import annotations

import importlib
import os

#: C function -> its Python twin, a function with the same signature and the same bytes out ("module:function").
TWINS = {
    "encode_lines": "logfs.storage.format.twins:encode_lines",
    "grow_lines": "logfs.storage.format.twins:grow_lines",
    "encode_records": "logfs.storage.format.twins:encode_records",
    "render_records": "logfs.storage.format.twins:render_records",
    "batch_stats": "logfs.storage.format.twins:batch_stats",
    "min_timestamp": "logfs.storage.format.twins:min_timestamp",
    "merge_batches": "logfs.storage.format.twins:merge_batches",
    "index_floor": "logfs.storage.format.twins:index_floor",
    "murmur2": "logfs.spark.sink_rows:murmur2",
}
#: C functions whose Python path is not yet a function of the same signature: where it is, and what compares them.
PYTHON_PATHS = {
    "render_window": "logfs.view.text SegmentView's Python render (tests/storage/test_speedups.py)",
    "seek_line": "logfs.view.text SegmentView's record walk (tests/storage/test_speedups.py)",
    "index_ok": "logfs.storage.local.index's sanity_check methods (tests/storage/test_index.py)",
    "decode_columns": "logfs.spark.datasource's Python decode (tests/spark/test_spark_datasource.py)",
    "partition_rows": "logfs.spark.sink_rows's Python partitioner (tests/spark/test_spark_sink_encode.py)",
    "encode_arrow": "logfs.spark.sink_rows.encode_rows_py (tests/spark/test_spark_sink_encode.py)",
}


def _load():
    if os.environ.get("LOGFS_NO_SPEEDUPS", "") not in ("", "0"):
        return None
    try:
        from ... import _speedups
    except ImportError:  # built without a compiler
        return None
    if not all(hasattr(_speedups, name) for name in (*TWINS, *PYTHON_PATHS)):
        return None  # a build older than logfs/_speedups.c: all or nothing
    return _speedups


#: The C accelerator, or None: every caller then takes the Python twin.
C = _load()


def twin(name: str):
    """The Python twin of C function ``name`` (imported on first use: some live above this package)."""
    module, _, function = TWINS[name].partition(":")
    return getattr(importlib.import_module(module), function)

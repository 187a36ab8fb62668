"""logfs/testing/pyspark_zip.py: byte-code beside each module in the zips Spark puts on its Python workers' path,
used by zipimport, tests left as source, the source kept, idempotent; and the set-up leaves PySpark's zips so."""

import os
import subprocess
import sys
import zipfile

import pytest

from logfs.testing.pyspark_zip import add_bytecode, spark_python_zips


def make_zip(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", "def where():\n    raise RuntimeError('from mod')\n")
        z.writestr("pkg/tests/test_mod.py", "x = 1\n")
        z.writestr("pkg/data.txt", "not python")


def imported_from(zip_path, module):
    code = (f"import traceback, {module} as m\n"
            "try:\n    m.where()\nexcept RuntimeError:\n    tb = traceback.format_exc()\n"
            "print(m.__file__); print('raise RuntimeError' in tb)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(zip_path)},
                         capture_output=True, text=True, check=True).stdout.split()
    return out


def test_byte_code_is_added_used_and_added_once(tmp_path):
    path = tmp_path / "lib.zip"
    make_zip(path)
    assert imported_from(path, "pkg.mod") == [f"{path}/pkg/mod.py", "True"]
    assert add_bytecode(str(path)) == 2  # pkg/__init__.py and pkg/mod.py; not the tests, not the data
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert names == {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc", "pkg/tests/test_mod.py",
                         "pkg/data.txt"}
        assert z.read("pkg/data.txt") == b"not python"
    # zipimport loads the byte-code, and a traceback still shows the source line (the .py stays).
    assert imported_from(path, "pkg.mod") == [f"{path}/pkg/mod.pyc", "True"]
    before = path.stat().st_mtime_ns
    assert add_bytecode(str(path)) == 0 and path.stat().st_mtime_ns == before
    assert [p.name for p in tmp_path.iterdir()] == ["lib.zip"]  # no temporary file left


def test_a_zip_that_is_not_one_is_refused_and_kept(tmp_path):
    path = tmp_path / "bad.zip"
    path.write_bytes(b"not a zip")
    with pytest.raises(zipfile.BadZipFile):
        add_bytecode(str(path))
    assert path.read_bytes() == b"not a zip"


def test_the_set_up_left_pysparks_zips_with_byte_code():
    pytest.importorskip("pyspark")
    zips = spark_python_zips()
    assert any(os.path.basename(z) == "pyspark.zip" for z in zips), zips
    for path in zips:
        with zipfile.ZipFile(path) as z:
            assert "pyspark/daemon.pyc" in z.namelist() or not path.endswith("pyspark.zip")
            assert any(n.endswith(".pyc") for n in z.namelist()), path

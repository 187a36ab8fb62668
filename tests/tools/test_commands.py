"""What users run: ``logfs --version``, the CLI's option handling, and a non-editable install (``pip install .``)
that brings the C accelerator and the console commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logfs import __version__
from logfs.cli import main, split_options

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"logfs {__version__}"


@pytest.mark.parametrize("given,expected", [
    (["allow_other"], ["allow_other", "default_permissions"]),
    (["allow_other,default_permissions"], ["allow_other", "default_permissions"]),
    (["default_permissions", "allow_other"], ["default_permissions", "allow_other"]),
    (["ro"], ["ro"]),
    (["allow_root"], ["allow_root"]),
])
def test_allow_other_always_brings_default_permissions(given, expected):
    fuse_opts, _, _, _ = split_options(given)
    assert fuse_opts == expected


@pytest.mark.parametrize("option,message", [
    ("log.retention.ms=1_000", "log.retention.ms: expected an integer, got '1_000'"),
    ("num.recovery.threads.per.data.dir=4", "num.recovery.threads.per.data.dir: value 4 is not supported"),
    ("log.cleaner.io.max.bytes.per.second=1000000", "not supported: logfs does not throttle its cleaner"),
])
def test_bad_broker_setting_is_one_clear_line_and_nothing_mounted(tmp_path, capsys, option, message):
    (tmp_path / "mnt").mkdir()
    assert main([str(tmp_path / "data"), str(tmp_path / "mnt"), "-o", option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("logfs: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "data").exists()


def test_accepted_broker_setting_value_is_normalised():
    _, props, _, _ = split_options(["log.retention.ms=+100"])
    from logfs.storage import BrokerConfig

    assert BrokerConfig.from_properties(props).topic_defaults["retention.ms"] == "100"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_wheel_install_works_without_the_source_tree(tmp_path):
    """``pip install .`` (a built wheel, not -e): the C accelerator is compiled in, ``logfs --version``,
    ``logfs-dump-log-segments`` and ``logfs-kafka-handover`` run from the install alone (the checkout is not on the
    path)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "*.so", "__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"),
                    str(src)], check=True, capture_output=True, timeout=600)
    target = tmp_path / "target"
    wheel = next((tmp_path / "wheel").glob("logfs-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run([sys.executable, "-c", "import logfs, logfs._speedups as s; print(logfs.__file__, "
                            "s.__file__)"], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [str(target / "logfs" / "__init__.py"),
                                    str(next((target / "logfs").glob("_speedups*.so")))]
    version = subprocess.run([str(target / "bin" / "logfs"), "--version"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"logfs {__version__}"
    dump = subprocess.run([str(target / "bin" / "logfs-dump-log-segments"), "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    assert "usage: logfs-dump-log-segments" in dump.stdout
    handover = subprocess.run([str(target / "bin" / "logfs-kafka-handover"), "--help"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, check=True)
    assert "usage: logfs-kafka-handover" in handover.stdout

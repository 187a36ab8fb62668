"""Driving faultfs (logfs.testing.faultfs, a process of its own) from a test: start, inject, inspect, stop.

    with FaultFS(tmp_path / "lower", tmp_path / "data") as fs:   # SOURCE, MOUNTPOINT (both made if missing)
        rule = fs.fail("write", r"\\.log$", errno="EIO", nth=3)  # the 3rd write to a .log from now fails
        ...                                                       # run the code under test on fs.mountpoint
        assert [f["op"] for f in fs.injected()] == ["write"]
        fs.clear(rule)

Imports nothing of the test suite (so tools use it too: tools/bench_log_dirs.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from logfs.testing.mounts import code_env, mounted_at



class FaultFSError(RuntimeError):
    pass


class FaultFS:
    """A faultfs daemon: ``source_dir`` seen at ``mountpoint``, with faults injected on request.

    ``start()`` spawns it (foreground, its stderr in ``self.log_path``) and returns once the mount answers;
    ``stop()`` unmounts (``fusermount3 -u``, lazily if still busy after ``timeout``) and reaps it, killing it
    if needed. Also a context manager. The control socket lives in a private short directory (unix socket
    paths are limited to 108 bytes, pytest's tmp_path can be longer)."""

    def __init__(self, source_dir, mountpoint, *, python: str | None = None, extra_args=()):
        self.source = Path(source_dir).resolve()
        self.mountpoint = Path(mountpoint).resolve()
        self.python = python or sys.executable
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self.control: str | None = None
        self.log_path: str | None = None
        self._sock: socket.socket | None = None
        self._file = None
        self._lock = threading.Lock()

    # -- life cycle ---------------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> "FaultFS":
        if self.proc is not None:
            raise FaultFSError("already started")
        self.source.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.mkdtemp(prefix="faultfs-")
        self.control = os.path.join(self._dir, "control.sock")
        self.log_path = os.path.join(self._dir, "faultfs.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                # The mountpoint with a trailing "/": the e2e helpers find a logfs daemon by an argument equal to
                # its DATA_DIR (daemon_pids), and this daemon must not look like one.
                [self.python, "-m", "logfs.testing.faultfs", str(self.source), str(self.mountpoint) + "/", "--control", self.control,
                 "-f", *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=code_env())
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                output = self.output()
                self._cleanup()
                raise FaultFSError(f"faultfs exited with {self.proc.returncode}: {output}")
            if os.path.exists(self.control) and mounted_at(self.mountpoint):
                try:
                    self.ping()
                    return self
                except OSError:
                    self._disconnect()
            if time.monotonic() > deadline:
                self.stop()
                raise FaultFSError(f"faultfs did not come up in {timeout}s: {self.output()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Unmount and reap. Returns the daemon's exit status (None if it was never started)."""
        if self.proc is None:
            return None
        self._disconnect()
        deadline = time.monotonic() + timeout
        lazy = False
        while mounted_at(self.mountpoint) and self.proc.poll() is None:
            done = subprocess.run(["fusermount3", "-u"] + (["-z"] if lazy else []) + [str(self.mountpoint)],
                                  capture_output=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                lazy = True  # still busy: detach it, the daemon ends when the last user lets go
            time.sleep(0.05)
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if mounted_at(self.mountpoint):  # the daemon died with its mount: a dead connection, remove it
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        status = self.proc.returncode
        self._cleanup()
        return status

    def kill(self) -> None:
        """kill -9 the daemon (its mount then answers ENOTCONN until stop())."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _cleanup(self) -> None:
        self._disconnect()
        if self._dir:
            self._last_output = self.output()
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self.proc = None

    def output(self) -> str:
        """What the daemon wrote (its stderr)."""
        if self._dir and self.log_path and os.path.exists(self.log_path):
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        return getattr(self, "_last_output", "")

    def __enter__(self) -> "FaultFS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- requests -----------------------------------------------------------------------------------------
    def _disconnect(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(self, **req) -> dict:
        """One control request (see faultfs.py); raises FaultFSError when the daemon refuses it."""
        with self._lock:
            if self._sock is None:
                if self.control is None:
                    raise FaultFSError("faultfs is not started")
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(30)
                sock.connect(self.control)
                self._sock, self._file = sock, sock.makefile("rb")
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._file.readline()
            except OSError:
                self._disconnect()
                raise
            if not line:
                self._disconnect()
                raise FaultFSError("faultfs closed the control connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise FaultFSError(reply.get("error", "refused"))
        return reply

    def ping(self) -> int:
        return self.request(cmd="ping")["pid"]

    def fail(self, op, path: str = "", errno="EIO", nth: int | None = None, count: int | None = None,
             probability: float | None = None, seed=None, delay_ms: float | None = None) -> int:
        """Fail calls of ``op`` (a name, a list of names, or "*") on paths matching the regex ``path`` (searched
        in the path relative to the source directory) with ``errno`` (name or number; None with ``delay_ms``:
        only slow them down). From the ``nth`` matching call on (1-based, counted from now), ``count`` calls
        fail (default 1; unlimited with ``probability``; -1: until cleared), each with ``probability`` from a
        generator seeded with ``seed`` if given. Returns the rule's id."""
        req = {"cmd": "add", "op": op, "path": path, "errno": errno}
        for key, value in (("nth", nth), ("count", count), ("probability", probability), ("seed", seed),
                           ("delay_ms", delay_ms)):
            if value is not None:
                req[key] = value
        return self.request(**req)["id"]

    def delay(self, op, path: str = "", delay_ms: float = 100.0, **kwargs) -> int:
        """Slow matching calls by ``delay_ms`` instead of failing them (same arguments as fail())."""
        return self.fail(op, path, errno=None, delay_ms=delay_ms, **kwargs)

    def fsyncgate(self, path: str = "") -> int:
        """Writes to files matching ``path`` are dropped when an fsync of the file fails (see faultfs.py)."""
        return self.request(cmd="add", kind="fsyncgate", path=path)["id"]

    def power_cut(self) -> dict:
        """Every file under a gate (``fsyncgate(path)``, added before the writes) loses what was written to it since
        its last successful fsync, as in a power cut; kill the writers first. {"files": N, "writes": M, "paths": [the
        files cut back, relative to the source]}."""
        return self.request(cmd="powercut")

    def clear(self, rule_id: int | None = None) -> list[int]:
        """Remove one rule, or all of them; returns the ids removed."""
        req = {"cmd": "clear"}
        if rule_id is not None:
            req["id"] = rule_id
        return self.request(**req)["cleared"]

    def stats(self) -> dict:
        """{"ops": {op: {"calls", "faults", "delays"}}, "rules": [...], "injected": [the last 100 faults]}."""
        return self.request(cmd="stats")

    def calls(self, op: str) -> int:
        return self.stats()["ops"].get(op, {}).get("calls", 0)

    def injected(self, since: int = 0) -> list[dict]:
        """The faults injected (oldest first, the last 1000 kept): {"seq", "rule", "op", "path", "errno", ...}."""
        return self.request(cmd="injected", since=since)["injected"]

    def reset_stats(self) -> None:
        self.request(cmd="reset_stats")

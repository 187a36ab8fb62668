"""Logging as a service: journald priority prefixes when stderr is the journal (JOURNAL_STREAM) or the process
runs under systemd (INVOCATION_ID); ``-o debug`` logs DEBUG per module; a user error is one line, never a
traceback, whichever way logfs was started; a stop signal while loading is a quiet, clean stop."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import signal
import subprocess
import sys

import pytest

from service_helpers import mounted_at, systemd_env

from logfs.service.logsetup import LateReleaseReply, _JournalFormatter

JOURNAL_LINE = re.compile(r"^<[0-7]>[A-Za-z0-9_.]+: ")
PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [A-Za-z0-9_.]+: ")


def _lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line]


def test_journal_prefixes_when_stderr_is_the_journal_stream(service, notify_socket):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, journal=True, env={"INVOCATION_ID": None})
    sock.wait_for("READY", proc=proc)
    with pytest.raises(OSError):
        os.mkdir(svc.mnt / "bad name!")
    assert svc.stop() == 0
    lines = _lines(svc.stderr())
    assert lines and all(JOURNAL_LINE.match(line) for line in lines), lines
    assert any(line.startswith("<6>logfs.service.daemon: mounted ") for line in lines), lines
    assert "<6>logfs.service.daemon: received SIGTERM" in lines
    assert "<6>logfs.service.daemon: clean shutdown complete" in lines
    assert not any(line.startswith("<7>") for line in lines), "DEBUG lines without -o debug"


@pytest.mark.parametrize("env,journal", [
    ({"INVOCATION_ID": "abc"}, False),  # under systemd, stderr not the journal (StandardError=file:...)
    ({"INVOCATION_ID": None, "JOURNAL_STREAM": "1:1"}, False),  # inherited JOURNAL_STREAM naming another file
    ({"INVOCATION_ID": None}, False),  # not under systemd at all
], ids=["invocation-id", "foreign-journal-stream", "terminal"])
def test_log_format_follows_the_environment(service, notify_socket, env, journal):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, env=env, journal=journal)
    sock.wait_for("READY", proc=proc)
    assert svc.stop() == 0
    lines = _lines(svc.stderr())
    pattern = JOURNAL_LINE if env.get("INVOCATION_ID") else PLAIN_LINE
    assert lines and all(pattern.match(line) for line in lines), lines


def test_debug_option_logs_debug_per_module(service, notify_socket):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, "debug,num.partitions=2", journal=True)
    sock.wait_for("READY", proc=proc)
    with pytest.raises(OSError):
        os.mkdir(svc.mnt / "bad name!")  # EINVAL, logged at DEBUG by the FUSE layer
    assert svc.stop() == 0
    lines = _lines(svc.stderr())
    assert all(JOURNAL_LINE.match(line) for line in lines), lines
    debug_modules = {line[3:].split(":", 1)[0] for line in lines if line.startswith("<7>")}
    assert {"logfs", "logfs.service.daemon", "logfs.service.notify", "logfs.fuse.errors", "pyfuse3"} <= \
        debug_modules, debug_modules
    assert any(line.startswith("<7>logfs.fuse.errors: mkdir: ") and "EINVAL" in line for line in lines), lines
    assert any("sd_notify READY=1" in line for line in lines)


def test_journal_formatter_prefixes_every_line():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("logfs.x", logging.ERROR, __file__, 1, "failed\nsecond line", None,
                                   sys.exc_info())
    out = _JournalFormatter("%(name)s: %(message)s").format(record).split("\n")
    assert len(out) > 3 and all(line.startswith("<3>") for line in out), out
    assert out[0] == "<3>logfs.x: failed" and out[1] == "<3>second line"


# -- user errors -----------------------------------------------------------------------------------------
def _ro_tmpfs(path) -> bool:
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True).returncode:
        return False
    (path / "data").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
    return True


CASES = {
    # name: (extra argv, expected exit status, text the line must contain)
    "unknown-option": (["-o", "bogus"], 2, "unknown option 'bogus'"),
    "invalid-value": (["-o", "log.segment.bytes=abc"], 2, "log.segment.bytes"),
    "missing-config": (["--config", "/nonexistent/server.properties"], 2, "cannot read /nonexistent"),
    "missing-mountpoint": ([], 2, "does not exist"),
    "mountpoint-is-a-file": ([], 2, "is not a directory"),
    "data-dir-is-a-file": ([], 2, "is not a directory"),
    "locked-data-dir": ([], 1, ".lock is held"),
    "unwritable-data-dir": ([], 1, "Read-only file system"),
}


@pytest.mark.parametrize("journal", [False, True], ids=["terminal", "journal"])
@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "daemon"])
@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_never_a_traceback(tmp_path, case, foreground, journal):
    extra, status, needle = CASES[case]
    data, mnt = tmp_path / "data", tmp_path / "mnt"
    mnt.mkdir()
    holder = None
    ro = tmp_path / "ro"
    try:
        if case == "missing-mountpoint":
            mnt.rmdir()
        elif case == "mountpoint-is-a-file":
            mnt.rmdir()
            mnt.write_text("")
        elif case == "data-dir-is-a-file":
            data.write_text("")
        elif case == "locked-data-dir":
            data.mkdir()
            holder = os.open(data / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif case == "unwritable-data-dir":
            if os.geteuid() != 0 or not _ro_tmpfs(ro):
                pytest.skip("needs root to mount a read-only tmpfs")
            data = ro / "data"
        err_path = tmp_path / "stderr"
        with open(err_path, "wb") as err:
            env = {"INVOCATION_ID": None}
            if journal:
                st = os.fstat(err.fileno())
                env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
            cmd = [sys.executable, "-m", "logfs.cli", str(data), str(mnt), *extra] + (["-f"] if foreground else [])
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=30,
                               env=systemd_env(**env))
        text = err_path.read_text()
        lines = _lines(text)
        assert r.returncode == status, text
        assert "Traceback" not in text
        assert len(lines) == 1, lines
        assert needle in lines[0], lines
        if journal:
            assert lines[0].startswith("<3>logfs: "), lines
        elif not foreground or status == 2:
            assert lines[0].startswith("logfs: error: "), lines
        else:
            assert " ERROR logfs: " in lines[0], lines
        assert not (mnt.is_dir() and mounted_at(mnt))
    finally:
        if holder is not None:
            os.close(holder)
        if ro.is_dir() and mounted_at(ro):
            subprocess.run(["umount", str(ro)], capture_output=True)


def test_usage_error_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(tmp_path)], capture_output=True, text=True,
                       timeout=30, env=systemd_env(INVOCATION_ID="x"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == "<3>logfs: error: the following arguments are required: mountpoint"


# -- a stop signal while the logs load -------------------------------------------------------------------
def test_sigterm_while_recovering_is_a_clean_stop(service, notify_socket):
    """systemctl stop during a long recovery: STOPPING=1, exit 0, nothing mounted, no traceback; the next start
    recovers and serves everything. (Whether the signal lands mid-load or just after it, the outcome is the same.)"""
    svc = service()
    sock = notify_socket()
    options = "num.partitions=4,log.segment.bytes=2048,log.index.interval.bytes=256"
    proc = svc.start(sock, options, journal=True)
    sock.wait_for("READY", proc=proc)
    os.mkdir(svc.mnt / "t")
    body = {}
    for p in range(4):
        body[p] = "".join(f"{p}-{i:05d}-{'y' * 60}\n" for i in range(1500))
        with open(svc.mnt / "t" / str(p), "a") as f:
            f.write(body[p])
    svc.kill9()

    sock2 = notify_socket(abstract=True)
    proc = svc.start(sock2, options, journal=True)
    sock2.wait_for("STATUS", proc=proc, prefix="recovering after an unclean shutdown: ")
    proc.send_signal(signal.SIGTERM)
    assert sock2.wait_for("STOPPING", proc=proc).fields["STOPPING"] == "1"
    assert proc.wait(20) == 0, svc.stderr()
    sock2.drain(0.05)
    assert "READY" not in {k for m in sock2.messages for k in m.fields}
    assert not mounted_at(svc.mnt)
    assert "Traceback" not in svc.stderr()
    assert re.search(r"<6>logfs(\.service\.daemon)?: .*(stopped before mounting|stop requested before mounting)",
                     svc.stderr()), svc.stderr()

    sock3 = notify_socket()
    proc = svc.start(sock3, options)
    assert sock3.wait_for("READY", proc=proc).mounted
    for p in range(4):
        assert (svc.mnt / "t" / str(p)).read_text() == body[p]
    assert svc.stop() == 0


def test_a_release_reply_after_the_unmount_is_no_error():
    """pyfuse3's failed reply to a RELEASE whose request the kernel dropped (an unmount right after a close) is
    INFO; any other failed reply stays an ERROR (the filter logsetup puts on pyfuse3's logger)."""
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("pyfuse3", logging.ERROR, __file__, 1, message, None, None)

    for call in ("fuse_release", "fuse_releasedir"):
        late = record(f"{call}(): fuse_reply_* failed with No such file or directory")
        assert LateReleaseReply().filter(late) and late.levelno == logging.INFO and late.levelname == "INFO"
    for other in ("fuse_read(): fuse_reply_* failed with No such file or directory",
                  "fuse_release(): fuse_reply_* failed with Input/output error"):
        kept = record(other)
        assert LateReleaseReply().filter(kept) and kept.levelno == logging.ERROR

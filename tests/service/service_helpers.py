"""Helpers for the service tests: the unit files in systemd/, a notify socket the test owns, and a daemon started
the way ``logfs@.service``'s ExecStart starts it.

The mount helpers (``mounted_at``, ``daemon_env``, ``wait_for``...) are the end-to-end suite's, from
tests/e2e/harness.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import alive, daemon_env, mounted_at, wait_for
from logfs.testing.unit_sandbox import unit_settings

REPO = Path(__file__).resolve().parent.parent.parent
SYSTEMD_DIR = REPO / "systemd"
SERVICE_UNIT = SYSTEMD_DIR / "logfs@.service"
START_TIMEOUT = 30.0

__all__ = ["REPO", "SYSTEMD_DIR", "SERVICE_UNIT", "mounted_at", "daemon_env", "wait_for", "unit_settings", "setting",
           "systemd_escape_path", "exec_command", "NotifySocket", "ServiceDaemon", "stat_with_timeout",
           "systemd_env"]


# -- unit files ------------------------------------------------------------------------------------------
def setting(path: Path, section: str, key: str) -> list[str]:
    return [v for k, v in unit_settings(path).get(section, []) if k == key]


def systemd_escape_path(path: str) -> str:
    """``systemd-escape --path`` (the instance name of logfs@.service for a mountpoint)."""
    if shutil.which("systemd-escape"):
        return subprocess.run(["systemd-escape", "--path", path], capture_output=True, text=True,
                              check=True).stdout.strip()
    out = []
    for i, ch in enumerate(path.strip("/")):
        if ch == "/":
            out.append("-")
        elif ch.isalnum() or ch in ":_" or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out) or "-"


def _unit_environment(unit: Path, instance: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in setting(unit, "Service", "Environment"):
        for word in shlex.split(value):
            key, _, val = word.partition("=")
            env[key] = val.replace("%i", instance)
    return env


def _expand_word(word: str, env: dict[str, str]) -> list[str]:
    """systemd's command-line variable expansion for one word: ``$VAR`` alone splits at whitespace (zero or
    more arguments), ``${VAR}`` is replaced in place (exactly one argument), ``$$`` is a literal ``$``."""
    whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if whole:
        return env.get(whole.group(1), "").split()

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), "")

    return [re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word)]


def exec_command(key: str, mountpoint: str, overrides: dict[str, str] | None = None,
                 unit: Path = SERVICE_UNIT) -> list[str]:
    """The argv systemd would run for ``key`` (ExecStart, ExecStopPost) of logfs@<escaped mountpoint>.service,
    with ``overrides`` playing /etc/logfs/<instance>.conf, and the ``logfs`` program replaced by this
    checkout's ``python -m logfs.cli``. A leading ``-`` (ignore failure) is dropped."""
    (line,) = setting(unit, "Service", key)
    instance = systemd_escape_path(mountpoint)
    if line.startswith("-"):
        line = line[1:]
    env = _unit_environment(unit, instance)
    env.update(overrides or {})

    def specifiers(word: str) -> str:  # per word, after splitting (as systemd does): %f may contain spaces
        return re.sub(r"%[%fiI]", lambda m: {"%%": "%", "%f": mountpoint, "%i": instance,
                                              "%I": mountpoint.strip("/")}[m.group(0)], word)

    argv = [arg for word in shlex.split(line) for arg in _expand_word(specifiers(word), env)]
    if os.path.basename(argv[0]) == "logfs":
        argv = [sys.executable, "-m", "logfs.cli", *argv[1:]]
    return argv


def systemd_env(**extra: str) -> dict[str, str]:
    """The daemon's environment as a service: this checkout on PYTHONPATH, INVOCATION_ID set, no inherited
    NOTIFY_SOCKET/WATCHDOG_*/JOURNAL_STREAM (the test adds what it wants)."""
    env = daemon_env()
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM", "INVOCATION_ID"):
        env.pop(key, None)
    env["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


# -- the notify socket -----------------------------------------------------------------------------------
@dataclass
class Message:
    fields: dict[str, str]
    pid: int
    received: float
    raw: str
    mounted: bool = False  # for READY=1: the mountpoint was a live logfs mount when it arrived
    root_ino: int | None = None


class NotifySocket:
    """An AF_UNIX datagram socket the test owns, bound to a path or (``abstract=True``) to an abstract name;
    ``address`` is what NOTIFY_SOCKET should hold. Each datagram is recorded with the sender's PID
    (SCM_CREDENTIALS), as systemd checks it against the main PID (NotifyAccess=main)."""

    _count = 0

    def __init__(self, directory: Path, abstract: bool = False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if abstract:
            name = f"logfs-test-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            NotifySocket._count += 1
            path = str(directory / f"notify{NotifySocket._count}.sock")
            self.sock.bind(path)
            self.address = path
        self.messages: list[Message] = []
        self.mountpoint: str | None = None

    def close(self):
        self.sock.close()

    def receive(self, timeout: float) -> Message | None:
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except (socket.timeout, BlockingIOError):
            return None
        pid = -1
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _uid, _gid = struct.unpack("iII", payload[:12])
        raw = data.decode()
        fields = dict(line.partition("=")[::2] for line in raw.split("\n") if line)
        message = Message(fields, pid, time.monotonic(), raw)
        if "READY" in fields and self.mountpoint is not None:
            # Checked the moment READY arrives: is the mountpoint a live logfs mount answering requests?
            message.mounted = mounted_at(self.mountpoint)
            st = stat_with_timeout(self.mountpoint, 10) if message.mounted else None
            message.root_ino = st.st_ino if st else None
        self.messages.append(message)
        return message

    def wait_for(self, key: str, timeout: float = START_TIMEOUT, proc: subprocess.Popen | None = None,
                 value: str | None = None, prefix: str | None = None) -> Message:
        """Receive until a datagram with ``key`` (equal to ``value``, or starting with ``prefix``) arrives; fail
        if ``proc`` exits first."""

        def matches(m: Message) -> bool:
            got = m.fields.get(key)
            return got is not None and (value is None or got == value) and (prefix is None or got.startswith(prefix))

        deadline = time.monotonic() + timeout
        for m in self.messages:
            if matches(m):
                return m
        while time.monotonic() < deadline:
            m = self.receive(min(0.1, deadline - time.monotonic()))
            if m is not None and matches(m):
                return m
            if m is None and proc is not None and proc.poll() is not None:
                while (m := self.receive(0.05)) is not None:  # what it sent before exiting
                    if matches(m):
                        return m
                raise AssertionError(f"daemon exited ({proc.returncode}) before sending {key}; "
                                     f"got {[x.raw for x in self.messages]}")
        raise AssertionError(f"no {key} within {timeout}s; got {[x.raw for x in self.messages]}")

    def drain(self, seconds: float) -> list[Message]:
        deadline = time.monotonic() + seconds
        got = []
        while (left := deadline - time.monotonic()) > 0:
            m = self.receive(left)
            if m is not None:
                got.append(m)
        return got

    def values(self, key: str) -> list[str]:
        return [m.fields[key] for m in self.messages if key in m.fields]


def stat_with_timeout(path: str, timeout: float) -> os.stat_result | None:
    """os.stat in a thread, so that a mount that does not answer fails the test instead of hanging it."""
    result: list = []

    def target():
        try:
            result.append(os.stat(path))
        except OSError as exc:
            result.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if not result or isinstance(result[0], OSError):
        return None
    return result[0]


# -- a daemon started like the service ------------------------------------------------------------------
@dataclass
class ServiceDaemon:
    """DATA_DIR + mountpoint under ``root``, and a ``logfs -f`` started with logfs@.service's ExecStart."""

    root: Path
    data: Path = field(init=False)
    mnt: Path = field(init=False)
    proc: subprocess.Popen | None = None
    stderr_path: Path = field(init=False)

    def __post_init__(self):
        self.data = self.root / "data"
        self.mnt = self.root / "mnt"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.stderr_path = self.root / "daemon.stderr"

    def command(self, options: str = "", args: str = "") -> list[str]:
        return exec_command("ExecStart", str(self.mnt),
                            {"DATA_DIR": str(self.data), "LOGFS_OPTIONS": options, "LOGFS_ARGS": args})

    def start(self, notify: NotifySocket | None, options: str = "", *, env: dict[str, str] | None = None,
              wrapper: list[str] | None = None, journal: bool = False) -> subprocess.Popen:
        """Start the daemon (NOTIFY_SOCKET -> ``notify``). ``journal``: stderr is "the journal stream", i.e.
        JOURNAL_STREAM names the stderr file, as systemd sets it for StandardError=journal."""
        assert self.proc is None or self.proc.poll() is not None
        assert not mounted_at(self.mnt)
        extra = dict(env or {})
        if notify is not None:
            extra["NOTIFY_SOCKET"] = notify.address
            notify.mountpoint = str(self.mnt)
        err = open(self.stderr_path, "ab")
        if journal:
            st = os.fstat(err.fileno())
            extra["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        self.proc = subprocess.Popen((wrapper or []) + self.command(options), stdin=subprocess.DEVNULL,
                                     stdout=err, stderr=err, env=systemd_env(**extra))
        err.close()
        return self.proc

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send ``sig`` (systemctl stop: SIGTERM) and wait for the exit status."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        """SIGKILL, then what ExecStopPost does (detach the dead mount lazily)."""
        self.proc.kill()
        self.proc.wait(20)
        subprocess.run(exec_command("ExecStopPost", str(self.mnt)), capture_output=True, timeout=30)
        wait_for(lambda: not mounted_at(self.mnt), 10, what="the lazy unmount")

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if mounted_at(self.mnt):
            r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, timeout=30)
            if r.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=30)
        if self.proc is not None:
            wait_for(lambda: not alive(self.proc.pid) or self.proc.poll() is not None, 20, what="daemon exit")

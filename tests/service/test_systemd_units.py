"""The unit files in systemd/: `systemd-analyze verify` passes on each, the service unit has the settings the
README promises (and none that would hide the mount from the host), ExecStart expands as documented,
ExecStopPost detaches a dead logfs mount but nothing else, and a tiering daemon run under the unit's own
sandbox (logfs.testing.unit_sandbox: capabilities, NoNewPrivileges, the system call filter and address families) reaches
its S3 store."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from service_helpers import (
    SERVICE_UNIT, SYSTEMD_DIR, daemon_env, exec_command, mounted_at, setting, systemd_escape_path, unit_settings,
    wait_for,
)

UNITS = sorted(p for p in SYSTEMD_DIR.iterdir() if p.suffix in (".service", ".mount", ".socket", ".target"))
LOGFS_SCRIPT = os.path.join(os.path.dirname(sys.executable), "logfs")
INSTALLED_PATH = "/usr/local/bin/logfs"

# Settings that give the service its own mount namespace or overlay part of the tree: the FUSE mount would be
# made inside the service's namespace (invisible to the host), or fail.
NAMESPACING = {
    "PrivateMounts", "PrivateTmp", "PrivateDevices", "ProtectSystem", "ProtectHome", "ReadOnlyPaths",
    "ReadWritePaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths", "TemporaryFileSystem", "BindPaths",
    "BindReadOnlyPaths", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectProc", "ProcSubset", "ProtectHostname", "PrivateNetwork", "PrivateUsers",
    "PrivateIPC", "DynamicUser", "RootDirectory", "RootImage", "MountAPIVFS", "StateDirectory",
    "RuntimeDirectory", "CacheDirectory", "LogsDirectory", "ConfigurationDirectory",
}


def test_units_exist():
    names = {p.name for p in UNITS}
    assert "logfs@.service" in names
    assert any(n.endswith(".mount") for n in names)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package: systemd)")
@pytest.mark.parametrize("unit", UNITS, ids=[p.name for p in UNITS])
def test_systemd_analyze_verify(unit, tmp_path):
    """`systemd-analyze verify` on a copy of the unit; the only change: ExecStart's /usr/local/bin/logfs (the
    README's install step) points at this checkout's script, since verify requires the program to exist."""
    text = unit.read_text()
    if INSTALLED_PATH in text:
        assert os.access(LOGFS_SCRIPT, os.X_OK), LOGFS_SCRIPT
        text = text.replace(INSTALLED_PATH, LOGFS_SCRIPT)
    copy = tmp_path / unit.name
    copy.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    output = (r.stdout + r.stderr).strip()
    assert r.returncode == 0, output
    ours = [line for line in output.splitlines() if "logfs" in line or unit.stem in line]
    assert not ours, output


def test_service_unit_settings():
    service = dict(unit_settings(SERVICE_UNIT)["Service"])
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # configuration errors are not retried
    assert service["WatchdogSec"]
    assert service["KillSignal"] == "SIGTERM"
    assert "ExecStopPost" in service
    assert "CAP_SYS_ADMIN" in service["CapabilityBoundingSet"].split()
    assert service["DeviceAllow"] == "/dev/fuse rw"
    assert "@mount" in service["SystemCallFilter"].split()
    present = {k for k, _ in unit_settings(SERVICE_UNIT)["Service"]} & NAMESPACING
    assert not present, f"these would hide the mount from the host or break it: {present}"
    assert service.get("MountFlags", "shared") == "shared"
    (exec_start,) = setting(SERVICE_UNIT, "Service", "ExecStart")
    assert exec_start.startswith(INSTALLED_PATH + " ")
    assert " -f " in f" {exec_start} ", "Type=notify needs the daemon in the foreground (it is the main PID)"
    assert "%f" in exec_start


def test_address_families_allow_tiering():
    """AF_UNIX for sd_notify and the journal; AF_INET and AF_INET6 for tiered storage's S3 endpoint. Nothing
    else (netlink, packet, ...): the daemon needs none."""
    (families,) = setting(SERVICE_UNIT, "Service", "RestrictAddressFamilies")
    assert set(families.split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # the hardening around it stays
    service = dict(unit_settings(SERVICE_UNIT)["Service"])
    assert service["NoNewPrivileges"] == "yes"
    assert service["CapabilityBoundingSet"] == "CAP_SYS_ADMIN"
    assert service["SystemCallFilter"] == "@system-service @mount"
    assert service["SystemCallArchitectures"] == "native"
    assert service["RestrictNamespaces"] == "yes"


def test_mount_unit_is_named_after_its_mountpoint():
    for unit in (p for p in UNITS if p.suffix == ".mount"):
        mount = dict(unit_settings(unit)["Mount"])
        assert mount["Type"] == "fuse.logfs"
        assert unit.name == systemd_escape_path(mount["Where"]) + ".mount"


def test_exec_start_expansion():
    mnt = "/mnt/my logs-1"
    instance = systemd_escape_path(mnt)
    argv = exec_command("ExecStart", mnt)
    assert argv == [sys.executable, "-m", "logfs.cli", f"/var/lib/logfs/{instance}", mnt, "-f", "-o", ""]
    argv = exec_command("ExecStart", "/mnt/logs", {"DATA_DIR": "/srv/kafka", "LOGFS_OPTIONS": "allow_other,a=b",
                                                   "LOGFS_ARGS": "--config /etc/logfs/server.properties"})
    assert argv[3:] == ["/srv/kafka", "/mnt/logs", "-f", "-o", "allow_other,a=b", "--config",
                        "/etc/logfs/server.properties"]


def test_exec_start_with_no_options_mounts(service, notify_socket):
    """The unit's default ExecStart (an empty -o list) is accepted."""
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, "")
    assert sock.wait_for("READY", proc=proc).mounted
    assert svc.stop() == 0


def _stop_post(mnt) -> subprocess.CompletedProcess:
    return subprocess.run(exec_command("ExecStopPost", str(mnt)), capture_output=True, text=True, timeout=30)


def test_exec_stop_post_detaches_a_dead_logfs_mount(service, notify_socket):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock)
    sock.wait_for("READY", proc=proc)
    os.mkdir(svc.mnt / "t")
    with open(svc.mnt / "t" / "0", "a") as f:
        f.write("before the crash\n")
        f.flush()
        os.fsync(f.fileno())
    proc.kill()
    proc.wait(20)
    assert mounted_at(svc.mnt), "a SIGKILLed FUSE daemon leaves its mount behind"
    with pytest.raises(OSError):
        os.listdir(svc.mnt)  # ENOTCONN
    r = _stop_post(svc.mnt)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not mounted_at(svc.mnt), 10, what="the lazy unmount")
    # The restart (Restart=on-failure) then mounts again, recovering the partition.
    sock2 = notify_socket(abstract=True)
    proc = svc.start(sock2)
    assert sock2.wait_for("READY", proc=proc).mounted
    assert "recovering logs" in sock2.values("STATUS")
    assert (svc.mnt / "t" / "0").read_text() == "before the crash\n"
    assert svc.stop() == 0


def test_exec_stop_post_is_a_no_op_without_a_mount(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = _stop_post(mnt)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_exec_stop_post_leaves_other_filesystems_alone(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        r = _stop_post(mnt)
        assert r.returncode == 0, r.stderr
        assert mounted_at(mnt), "ExecStopPost unmounted a filesystem that is not logfs"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ---- the unit's sandbox, applied without systemd -------------------------------------------------------------
needs_sandbox = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("systemd-analyze") is None
    or not os.path.exists("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    reason="logfs.testing.unit_sandbox needs x86-64, systemd-analyze and the kernel headers' system call numbers")

PROBE = r"""
import ctypes, errno, json, socket
out = {}
for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_DGRAM).close()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
out["CapBnd"] = int(status["CapBnd"], 16)
out["NoNewPrivs"] = status["NoNewPrivs"].strip()
out["Seccomp"] = status["Seccomp"].strip()
libc = ctypes.CDLL(None, use_errno=True)
out["ptrace"] = "ok" if libc.syscall(101, 0, 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]  # PTRACE_TRACEME
print(json.dumps(out))
"""


def _unit_with(tmp_path: Path, key: str, value: str) -> Path:
    """A copy of the service unit with ``key=`` set to ``value``."""
    lines = [f"{key}={value}" if line.startswith(f"{key}=") else line
             for line in SERVICE_UNIT.read_text().splitlines()]
    copy = tmp_path / "logfs@.service"
    copy.write_text("\n".join(lines) + "\n")
    return copy


def _sandboxed(unit: Path) -> list[str]:
    return [sys.executable, "-m", "logfs.testing.unit_sandbox", str(unit), "--"]


def _probe(unit: Path) -> dict:
    r = subprocess.run(_sandboxed(unit) + [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                       env=daemon_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_sandbox
def test_the_sandbox_applies_the_units_restrictions(tmp_path):
    """What the daemon test below relies on: the helper really restricts the process as the unit says."""
    unconfined = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert json.loads(unconfined.stdout)["ptrace"] == "ok", "the probe's refused call must work unconfined"
    got = _probe(SERVICE_UNIT)
    assert got["NoNewPrivs"] == "1" and got["Seccomp"] == "2"
    assert got["CapBnd"] == 1 << 21  # CAP_SYS_ADMIN only
    assert got["ptrace"] == "EPERM"  # not in @system-service: SystemCallErrorNumber=EPERM
    assert (got["AF_UNIX"], got["AF_INET"], got["AF_INET6"]) == ("ok", "ok", "ok")
    assert got["AF_NETLINK"] == got["AF_PACKET"] == "EAFNOSUPPORT"
    # the unit as it was before tiering: no IP socket at all
    old = _probe(_unit_with(tmp_path, "RestrictAddressFamilies", "AF_UNIX"))
    assert (old["AF_UNIX"], old["AF_INET"], old["AF_INET6"]) == ("ok", "EAFNOSUPPORT", "EAFNOSUPPORT")


SEGMENT = 64 * 1024


def _tiering_options(seaweed, prefix: str) -> str:
    # the endpoint by name, so that name resolution runs under the filter too
    return ",".join(["remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={seaweed.bucket}",
                     f"logfs.remote.s3.endpoint=http://localhost:{seaweed.s3}", f"logfs.remote.s3.prefix={prefix}",
                     "remote.log.manager.task.interval.ms=200", f"log.segment.bytes={SEGMENT}"])


def _aws_env(seaweed, tmp_path: Path) -> dict[str, str]:
    return {**seaweed.env(), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
            "AWS_CONFIG_FILE": str(tmp_path / "no-config"), "AWS_EC2_METADATA_DISABLED": "true"}


def _start_tiering_daemon(svc, sock, seaweed, unit: Path, prefix: str, tmp_path: Path):
    proc = svc.start(sock, _tiering_options(seaweed, prefix), env=_aws_env(seaweed, tmp_path),
                     wrapper=_sandboxed(unit))
    assert sock.wait_for("READY", proc=proc).mounted
    status = open(f"/proc/{proc.pid}/status").read()
    assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status, "the daemon is not running sandboxed"
    os.mkdir(svc.mnt / "t")
    subprocess.run(["setfattr", "-n", "user.logfs.config.remote.storage.enable", "-v", "true", str(svc.mnt / "t")],
                   check=True)
    with open(svc.mnt / "t" / "0", "ab") as f:
        for i in range(8):
            f.write(b"".join(b"line %06d of segment %d %s\n" % (n, i, b"x" * 40) for n in range(1000)))
    return proc


def _bucket_keys(seaweed, prefix: str) -> list[str]:
    listing = seaweed._client().list_objects_v2(Bucket=seaweed.bucket, Prefix=prefix + "/")
    return [o["Key"] for o in listing.get("Contents", [])]


def _getx(path: Path, name: str) -> str:
    return os.getxattr(path, f"user.logfs.{name}").decode()


@needs_sandbox
def test_a_tiering_daemon_under_the_units_sandbox_uploads(service, notify_socket, seaweed, tmp_path):
    """The acceptance: the unit lets a tiering daemon reach its store. The daemon is started with the unit's
    ExecStart under the unit's restrictions; rolled segments end up in SeaweedFS."""
    svc = service()
    sock = notify_socket()
    prefix = "unit-" + uuid.uuid4().hex[:8]
    _start_tiering_daemon(svc, sock, seaweed, SERVICE_UNIT, prefix, tmp_path)
    part = svc.mnt / "t" / "0"
    wait_for(lambda: int(_getx(part, "remote_segment_count")) >= 3, 60, interval=0.2, what="segments tiered")
    keys = _bucket_keys(seaweed, prefix)
    assert f"{prefix}/t-0/{0:020d}.log" in keys, keys
    assert "cannot be reached" not in svc.stderr() and "failed" not in svc.stderr(), svc.stderr()
    assert svc.stop() == 0


@needs_sandbox
def test_with_af_unix_alone_a_tiering_daemon_cannot_reach_its_store(service, notify_socket, seaweed, tmp_path):
    """The unit as it was (RestrictAddressFamilies=AF_UNIX): the mount comes up, every attempt to reach the store
    fails (socket() refused with EAFNOSUPPORT, as the probe above shows; botocore reports it as a connection
    error), nothing is uploaded. (What the test above would catch if the unit regressed.)"""
    svc = service()
    sock = notify_socket()
    prefix = "unix-" + uuid.uuid4().hex[:8]
    _start_tiering_daemon(svc, sock, seaweed, _unit_with(tmp_path, "RestrictAddressFamilies", "AF_UNIX"), prefix,
                          tmp_path)
    wait_for(lambda: "tiering of t-0 failed" in svc.stderr(), 30, interval=0.2, what="a failed upload")
    assert "cannot be reached" in svc.stderr()  # the check at mount
    assert "unreachable (EndpointConnectionError)" in svc.stderr()
    assert int(_getx(svc.mnt / "t" / "0", "segment_count")) >= 3  # segments rolled, waiting for their upload
    assert _getx(svc.mnt / "t" / "0", "remote_segment_count") == "0"
    assert _bucket_keys(seaweed, prefix) == []
    assert svc.stop() == 0

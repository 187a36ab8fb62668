"""The unit files in systemd/: `systemd-analyze verify` passes on each, the service unit has the settings the
README promises (and none that would hide the mount from the host), ExecStart expands as documented, and
ExecStopPost detaches a dead logfs mount but nothing else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from service_helpers import (
    SERVICE_UNIT, SYSTEMD_DIR, exec_command, mounted_at, setting, systemd_escape_path, unit_settings, wait_for,
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
    assert "AF_UNIX" in service["RestrictAddressFamilies"].split()  # sd_notify
    assert "@mount" in service["SystemCallFilter"].split()
    present = {k for k, _ in unit_settings(SERVICE_UNIT)["Service"]} & NAMESPACING
    assert not present, f"these would hide the mount from the host or break it: {present}"
    assert service.get("MountFlags", "shared") == "shared"
    (exec_start,) = setting(SERVICE_UNIT, "Service", "ExecStart")
    assert exec_start.startswith(INSTALLED_PATH + " ")
    assert " -f " in f" {exec_start} ", "Type=notify needs the daemon in the foreground (it is the main PID)"
    assert "%f" in exec_start


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

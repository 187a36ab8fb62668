"""chmod/chown on mount entries apply at once, persist across remounts, and go with a deleted partition."""

import os
import shlex
import shutil
import stat
import subprocess

import pytest

from harness import sh


def test_chmod_chown_persist_across_remount(mount):
    os.mkdir(mount.path("t"))
    mount.append("t/0", b"x\n")
    os.chmod(mount.path("t", 0), 0o600)
    os.chmod(mount.path("t"), 0o700)
    os.chown(mount.path("t", 0), 65534, 65534)
    st = os.stat(mount.path("t", 0))
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (65534, 65534)
    assert stat.S_ISREG(st.st_mode)
    mount.remount()
    st = os.stat(mount.path("t", 0))
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (65534, 65534)
    assert stat.S_IMODE(os.stat(mount.path("t")).st_mode) == 0o700
    assert stat.S_ISDIR(os.stat(mount.path("t")).st_mode)
    assert mount.read("t/0") == b"x\n"
    # A partition deleted and created again starts with the default mode.
    os.unlink(mount.path("t", 0))
    open(mount.path("t", 0), "a").close()
    assert stat.S_IMODE(os.stat(mount.path("t", 0)).st_mode) == 0o644


def as_nobody(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash", "-c", script],
                          capture_output=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_allow_other_always_enforces_modes(public_root, mount_logfs):
    """-o allow_other alone (as in the README's systemd example) must not let every user past the modes: logfs
    adds default_permissions. nobody may not read, append to, create or remove; root still may."""
    fs = mount_logfs("allow_other", root=public_root)
    assert "default_permissions" in open("/proc/self/mounts").read().split(str(fs.mnt), 1)[1].split("\n", 1)[0]
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"secret\n")
    os.chmod(fs.path("t", 0), 0o600)
    os.chmod(fs.path("t"), 0o700)
    t0, topic = shlex.quote(fs.path("t", 0)), shlex.quote(fs.path("t"))
    for script in (f"cat {t0}", f"echo x >> {t0}", f"mkdir {shlex.quote(fs.path('new'))}", f"rm -r {topic}"):
        r = as_nobody(script)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (script, r.stderr)
    assert fs.read("t/0") == b"secret\n" and os.listdir(fs.mnt) == ["t"]
    # The mount is open to other users where the modes say so.
    os.chmod(fs.path("t"), 0o755)
    os.chmod(fs.path("t", 0), 0o644)
    assert as_nobody(f"cat {t0}").stdout == b"secret\n"
    # Root still may do everything.
    fs.append("t/0", b"root\n")
    os.mkdir(fs.path("new"))
    sh(f"rm -r {topic}")
    assert os.listdir(fs.mnt) == ["new"]

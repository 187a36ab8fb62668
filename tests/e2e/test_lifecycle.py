"""CONTRACT section 1: running, mounting through mount(8), unmounting, signals, and refusing bad starts."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from harness import (
    LOGFS_SCRIPT, VENV_BIN, LogfsMount, daemon_env, daemon_pids, mount_fstype, mounted_at, needs_mount_helper, sh,
)

CLEAN = ".kafka_cleanshutdown"


def fill(fs: LogfsMount) -> dict[str, bytes]:
    os.mkdir(fs.path("a"))
    os.mkdir(fs.path("b"))
    sh(f"touch {fs.path('b', 1)}")
    content = {
        "a/0": b"".join(b"a0 %d\n" % i for i in range(3000)),
        "b/0": b"b0 first\nb0 second\n",
        "b/1": b"".join(b"b1 %d\n" % i for i in range(10)),
    }
    for rel, data in content.items():
        fs.append(rel, data)
    return content


def test_daemon_mode_returns_once_usable(mount):
    # The fixture's mount already asserted exit 0 and a usable mount right after the command returned.
    assert mount_fstype(mount.mnt) == "fuse.logfs"
    assert os.path.exists(os.path.join(mount.data, ".lock"))
    assert not os.path.exists(os.path.join(mount.data, CLEAN)), "the clean-shutdown marker is removed while mounted"
    assert len(mount.pids()) == 1
    assert os.path.isdir(mount.data)  # created when missing
    os.mkdir(mount.path("t"))
    assert os.listdir(mount.mnt) == ["t"]
    assert b"fuse.logfs" in sh(f"df -T {shlex.quote(str(mount.mnt))}").stdout


def test_data_offsets_and_configs_survive_remount(mount_logfs):
    fs = mount_logfs("log.segment.bytes=2000", "num.partitions=1")
    content = fill(fs)
    sh(f"setfattr -n user.logfs.config.retention.bytes -v 99999999 {fs.path('a')}")
    sh(f"setfattr -n user.logfs.config.logfs.key.separator -v : {fs.path('b')}")
    attrs = {rel: {n: fs.getx(rel, n) for n in ("log_start_offset", "log_end_offset", "segment_count",
                                                  "size_bytes")} for rel in content}
    positions = {rel: fs.getx(rel, "position.2") for rel in content}
    assert int(attrs["a/0"]["segment_count"]) > 1
    fs.unmount()
    assert os.path.exists(os.path.join(fs.data, CLEAN))
    assert not fs.pids()
    fs.mount("log.segment.bytes=2000")
    assert not os.path.exists(os.path.join(fs.data, CLEAN))
    assert sorted(os.listdir(fs.mnt)) == ["a", "b"]
    assert sorted(os.listdir(fs.path("b"))) == ["0", "1"]
    for rel, data in content.items():
        assert fs.read(rel) == data
        assert os.stat(fs.path(rel)).st_size == len(data)
        for name, value in attrs[rel].items():
            assert fs.getx(rel, name) == value, (rel, name)
        assert fs.getx(rel, "position.2") == positions[rel]
    # recovery point after a clean shutdown covers everything
    assert fs.getx("a/0", "recovery_point") == attrs["a/0"]["log_end_offset"]
    assert fs.getx("a", "config.retention.bytes") == "99999999"
    assert fs.getx("b", "config.logfs.key.separator") == ":"
    assert fs.getx("a", "partitions") == "1" and fs.getx("b", "partitions") == "2"
    # Appends continue at the right offsets.
    fs.append("a/0", "after remount\n")
    assert fs.getx("a/0", "log_end_offset") == "3001"
    assert fs.read("a/0") == content["a/0"] + b"after remount\n"


def test_partial_line_closed_just_before_unmount_is_kept(mount):
    os.mkdir(mount.path("t"))
    for i in range(20):
        fd = os.open(mount.path("t", 0), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"line-%d" % i)
        os.close(fd)
    mount.unmount(lazy_fallback=False)
    mount.mount()
    assert mount.read("t/0") == b"".join(b"line-%d\n" % i for i in range(20))


def test_mtime_is_the_last_append_time(mount):
    os.mkdir(mount.path("t"))
    before = time.time_ns() // 1_000_000 * 1_000_000
    mount.append("t/0", b"".join(b"m %d\n" % i for i in range(5000)))
    after = time.time_ns()
    mtime = os.stat(mount.path("t", 0)).st_mtime_ns
    assert before <= mtime <= after + 1_000_000


def test_mtime_stable_across_remount(mount_logfs):
    fs = mount_logfs("log.segment.bytes=2000")
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"".join(b"m %d\n" % i for i in range(3000)))  # many rolls: a slow append
    mtime = os.stat(fs.path("t", 0)).st_mtime_ns
    fs.remount()
    assert os.stat(fs.path("t", 0)).st_mtime_ns == mtime


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_foreground_clean_shutdown(mount_logfs, sig):
    fs = mount_logfs(foreground=True)
    os.mkdir(fs.path("t"))
    fs.append("t/0", "one\ntwo\n")
    # A handle with a held partial line: a clean shutdown commits it.
    fd = os.open(fs.path("t", 0), os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"three-partial")
    try:
        fs.proc.send_signal(sig)
        assert fs.proc.wait(20) == 0, fs.stderr()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert not mounted_at(fs.mnt)
    assert os.path.exists(os.path.join(fs.data, CLEAN))
    fs.mount()
    assert fs.read("t/0") == b"one\ntwo\nthree-partial\n"
    assert fs.getx("t/0", "recovery_point") == "3"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_daemon_mode_clean_shutdown(mount, sig):
    os.mkdir(mount.path("t"))
    mount.append("t/0", "kept\n")
    pid = mount.pid()
    os.kill(pid, sig)
    mount.wait_exit([pid])
    assert not mounted_at(mount.mnt)
    assert os.path.exists(os.path.join(mount.data, CLEAN))
    mount.mount()
    assert mount.read("t/0") == b"kept\n"


def test_umount_is_clean_shutdown(mount):
    os.mkdir(mount.path("t"))
    mount.append("t/0", "x\n")
    pid = mount.pid()
    sh(f"umount {shlex.quote(str(mount.mnt))}")
    mount.wait_exit([pid])
    assert os.path.exists(os.path.join(mount.data, CLEAN))
    assert not mounted_at(mount.mnt)


def test_second_daemon_on_same_data_dir_fails(mount, tmp_path):
    other = tmp_path / "other-mnt"
    other.mkdir()
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(mount.data), str(other)], capture_output=True,
                       timeout=30, env=daemon_env())
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "logfs: error:" in err and ("in use" in err or "lock" in err), err
    assert "Traceback" not in err
    assert not mounted_at(other)
    assert len(mount.pids()) == 1
    # In the foreground too.
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(mount.data), str(other), "-f"], capture_output=True,
                       timeout=30, env=daemon_env())
    assert r.returncode != 0 and ("in use" in r.stderr.decode() or "lock" in r.stderr.decode())
    assert not mounted_at(other)
    # The first mount is unharmed.
    os.mkdir(mount.path("still-works"))
    assert os.listdir(mount.mnt) == ["still-works"]


@pytest.mark.parametrize("opts,needle", [
    ("no.such.setting=1", "no.such.setting"),
    ("bogus", "bogus"),
    ("log.segment.bytes=abc", "log.segment.bytes"),
    ("log.segment.bytes=1", "log.segment.bytes"),
    ("num.partitions=0", "num.partitions"),
    ("log.cleanup.policy=shred", "cleanup"),
    ("log.retention.ms", "log.retention.ms"),
    ("compression.type=bogus", "compression.type"),  # CONTRACT section 8: a mount-time error
    ("compression.zstd.level=23", "compression.zstd.level"),
    ("compression.lz4.level=18", "compression.lz4.level"),
    ("compression.gzip.level=10", "compression.gzip.level"),
    ("remote.log.manager.thread.pool.size=0", "remote.log.manager.thread.pool.size"),
])
def test_bad_option_fails_and_mounts_nothing(tmp_path, opts, needle):
    data, mnt = tmp_path / "data", tmp_path / "mnt"
    mnt.mkdir()
    for extra in ([], ["-f"]):
        r = subprocess.run([sys.executable, "-m", "logfs.cli", str(data), str(mnt), "-o", opts, *extra],
                           capture_output=True, timeout=30, env=daemon_env())
        assert r.returncode != 0
        err = r.stderr.decode()
        assert needle in err, err
        assert "Traceback" not in err
        assert not mounted_at(mnt)
        assert not daemon_pids(data)


def test_bad_config_file_fails(tmp_path):
    data, mnt = tmp_path / "data", tmp_path / "mnt"
    mnt.mkdir()
    cfg = tmp_path / "server.properties"
    cfg.write_text("# comment\nlog.segment.bytes=4096\nnot.a.setting=3\n")
    r = subprocess.run([sys.executable, "-m", "logfs.cli", str(data), str(mnt), "--config", str(cfg)],
                       capture_output=True, timeout=30, env=daemon_env())
    assert r.returncode != 0 and "not.a.setting" in r.stderr.decode()
    assert not mounted_at(mnt)


def test_config_file_settings_apply(mount_logfs, tmp_path):
    cfg = tmp_path / "server.properties"
    cfg.write_text("# broker\nnum.partitions=2\nlog.segment.bytes=4096\nmessage.max.bytes = 777\n")
    fs = LogfsMount(tmp_path / "cfg")
    try:
        r = subprocess.run(fs.command("num.partitions=4") + ["--config", str(cfg)], capture_output=True, timeout=30,
                           env=daemon_env())
        assert r.returncode == 0, r.stderr.decode()
        os.mkdir(fs.path("t"))
        assert fs.getx("t", "partitions") == "4"  # -o wins over the file
        assert fs.getx("t", "config.segment.bytes") == "4096"
        assert fs.getx("t", "config.max.message.bytes") == "777"
    finally:
        fs.cleanup()


def _path_env() -> dict[str, str]:
    return daemon_env(PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))


def _helper_mounts(fs, cmd, env=None, fstype="fuse.logfs"):
    """Mount ``fs`` by running ``cmd`` (a mount helper, or mount(8)), which must succeed."""
    r = subprocess.run(cmd, capture_output=True, timeout=60, env=_path_env() if env is None else env)
    assert r.returncode == 0, r.stderr.decode()
    assert mounted_at(fs.mnt) and (fstype is None or mount_fstype(fs.mnt) == fstype)


def _serves(fs, configs: dict[str, str], path: str | None = None, line: str = ""):
    """A new topic t has these configs; a line appended to ``path`` reads back."""
    os.mkdir(fs.path("t"))
    for key, value in configs.items():
        assert fs.getx("t", key) == value
    if path is not None:
        fs.append(path, line)
        assert fs.read(path) == line.encode()


def _unmounts_cleanly(fs, umount8: bool):
    """umount(8) (the daemon exits) or fs.unmount: the shutdown is clean."""
    if umount8:
        pid = fs.pid()
        sh(f"umount {shlex.quote(str(fs.mnt))}")
        fs.wait_exit([pid])
    else:
        fs.unmount(lazy_fallback=False)
    assert os.path.exists(os.path.join(fs.data, CLEAN))


@pytest.fixture
def helper_fs(tmp_path):
    """A LogfsMount (not mounted) for a test to mount through a mount helper; cleaned up after it."""
    fs = LogfsMount(tmp_path / "m")
    yield fs
    fs.cleanup()


@needs_mount_helper
@pytest.mark.parametrize("how", ["type", "hash"])
def test_mount_fuse3_helper_directly(how, helper_fs):
    """mount.fuse3 itself (what mount(8) and fstab run), with the venv on PATH."""
    if how == "type":
        cmd = ["mount.fuse3", str(helper_fs.data), str(helper_fs.mnt), "-t", "logfs", "-o",
               "rw,log.segment.bytes=100000,num.partitions=2"]
    else:
        cmd = ["mount.fuse3", f"logfs#{helper_fs.data}", str(helper_fs.mnt), "-o",
               "defaults,_netdev,noauto,nofail,users,x-systemd.requires=foo,log.segment.bytes=100000,"
               "num.partitions=2"]
    _helper_mounts(helper_fs, cmd)
    _serves(helper_fs, {"config.segment.bytes": "100000", "partitions": "2"}, "t/1", "through mount.fuse3\n")
    _unmounts_cleanly(helper_fs, umount8=False)


@needs_mount_helper
def test_mount_t_fuse_logfs(logfs_on_default_path, helper_fs):
    _helper_mounts(helper_fs, ["mount", "-t", "fuse.logfs", str(helper_fs.data), str(helper_fs.mnt), "-o",
                               "log.segment.bytes=100000,num.partitions=2"])
    _serves(helper_fs, {"config.segment.bytes": "100000", "partitions": "2"}, "t/0", "via mount(8)\n")
    _unmounts_cleanly(helper_fs, umount8=True)


@needs_mount_helper
def test_mount_t_fuse_hash_syntax_ignores_fstab_options(logfs_on_default_path, helper_fs):
    _helper_mounts(helper_fs, ["mount", "-t", "fuse", f"logfs#{helper_fs.data}", str(helper_fs.mnt), "-o",
                               "defaults,_netdev,noauto,nofail,x-systemd.automount,log.index.interval.bytes=1024"],
                   fstype=None)
    _serves(helper_fs, {"config.index.interval.bytes": "1024"}, "t/0", "hash syntax\n")
    _unmounts_cleanly(helper_fs, umount8=False)


@needs_mount_helper
def test_mount_t_fuse_logfs_bad_option_fails(logfs_on_default_path, helper_fs):
    r = subprocess.run(["mount", "-t", "fuse.logfs", str(helper_fs.data), str(helper_fs.mnt), "-o", "log.bogus=1"],
                       capture_output=True, timeout=60, env=_path_env())
    assert r.returncode != 0
    assert b"log.bogus" in r.stderr
    assert not mounted_at(helper_fs.mnt)


@needs_mount_helper
def test_fstab_line(tmp_path, logfs_on_default_path, helper_fs):
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# test fstab\n{helper_fs.data} {helper_fs.mnt} fuse.logfs defaults,_netdev,noauto,nofail,"
                     f"x-systemd.after=network-online.target,log.segment.bytes=50000 0 0\n")
    _helper_mounts(helper_fs, ["mount", "-T", str(fstab), str(helper_fs.mnt)], env=daemon_env())
    _serves(helper_fs, {"config.segment.bytes": "50000"})
    _unmounts_cleanly(helper_fs, umount8=True)


def test_fuse_options_pass_through(mount_logfs):
    fs = mount_logfs("fsname=my-logs", "default_permissions", "allow_other", "noatime", "num.partitions=2")
    with open("/proc/self/mountinfo") as f:
        line = next(l for l in f if l.split()[4] == str(fs.mnt))
    after = line.split(" - ", 1)[1].split()
    assert after[0] == "fuse.logfs" and after[1] == "my-logs", line
    assert "allow_other" in after[2] and "default_permissions" in after[2], line
    os.mkdir(fs.path("t"))
    assert fs.getx("t", "partitions") == "2"


@needs_mount_helper
def test_several_log_directories_through_mount_and_fstab(tmp_path, logfs_on_default_path, helper_fs):
    """``mount -t fuse.logfs DIR1,DIR2 MNT`` and the same as an fstab line (CONTRACT section 12): the first field is
    Kafka's log.dirs, and the source /proc/mounts shows."""
    dirs = [str(tmp_path / "disk1"), str(tmp_path / "disk2")]
    helper_fs.source = ",".join(dirs)
    _helper_mounts(helper_fs, ["mount", "-t", "fuse.logfs", helper_fs.source, str(helper_fs.mnt), "-o",
                               "num.partitions=2"])
    with open("/proc/self/mounts") as f:
        assert any(line.split()[:2] == [helper_fs.source, str(helper_fs.mnt)] for line in f)
    _serves(helper_fs, {"partitions": "2"}, "t/1", "in the second log directory\n")
    assert [helper_fs.getx(f"t/{p}", "log_dir") for p in (0, 1)] == dirs
    pid = helper_fs.pid()
    sh(f"umount {shlex.quote(str(helper_fs.mnt))}")
    helper_fs.wait_exit([pid])
    assert all(os.path.exists(os.path.join(d, CLEAN)) for d in dirs)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{helper_fs.source} {helper_fs.mnt} fuse.logfs defaults,_netdev,noauto 0 0\n")
    _helper_mounts(helper_fs, ["mount", "-T", str(fstab), str(helper_fs.mnt)], env=daemon_env())
    assert helper_fs.read("t/1") == b"in the second log directory\n"
    helper_fs.unmount(lazy_fallback=False)
    assert all(os.path.exists(os.path.join(d, CLEAN)) for d in dirs)

"""chmod/chown on mount entries apply at once, persist across remounts, and go with a deleted partition."""

import os
import stat


def test_chmod_chown_persist_across_remount(fs):
    os.mkdir(fs.path("t"))
    fs.append("t/0", b"x\n")
    os.chmod(fs.path("t", 0), 0o600)
    os.chmod(fs.path("t"), 0o700)
    os.chown(fs.path("t", 0), 65534, 65534)
    st = os.stat(fs.path("t", 0))
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (65534, 65534)
    assert stat.S_ISREG(st.st_mode)
    fs.remount()
    st = os.stat(fs.path("t", 0))
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (65534, 65534)
    assert stat.S_IMODE(os.stat(fs.path("t")).st_mode) == 0o700
    assert stat.S_ISDIR(os.stat(fs.path("t")).st_mode)
    assert fs.read("t/0") == b"x\n"
    # A partition deleted and created again starts with the default mode.
    os.unlink(fs.path("t", 0))
    open(fs.path("t", 0), "a").close()
    assert stat.S_IMODE(os.stat(fs.path("t", 0)).st_mode) == 0o644

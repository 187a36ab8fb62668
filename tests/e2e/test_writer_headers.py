"""``logfs.writer.headers`` through a real mount: records appended by real processes carry their pid, uid and
command name as Kafka record headers, read back by kafka-python from the segment files and by the dump tool,
while ``cat`` shows exactly the lines written."""

from __future__ import annotations

import errno
import glob
import os
import subprocess
import sys

from harness import expect_errno, sh
from log_helpers import log_file_records

WRITER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, b"from python\n")
os.close(fd)
with open("/proc/self/comm") as f:
    print(os.getpid(), f.read().strip())
"""


def kafka_records(data_dir, topic="t", partition=0) -> list[tuple]:
    """(offset, value, headers) of every record of the partition's .log files, parsed by kafka-python."""
    records = log_file_records(os.path.join(data_dir, f"{topic}-{partition}"))
    return [(r.offset, r.value, tuple(r.headers)) for r in records]


def test_writer_identity_reaches_kafka_python_and_the_text_view_is_unchanged(public_root, mount_logfs):
    fs = mount_logfs("allow_other", root=public_root)
    os.mkdir(fs.path("t"))
    part = fs.path("t", 0)
    fs.append("t/0", b"untagged\n")
    assert fs.getx("t", "config.logfs.writer.headers") == "false"
    os.setxattr(fs.path("t"), "user.logfs.config.logfs.writer.headers", b"true")
    assert fs.getx("t", "config.logfs.writer.headers") == "true"

    # A Python process that says who it is.
    out = subprocess.run([sys.executable, "-c", WRITER, part], capture_output=True, text=True, check=True).stdout
    py_pid, py_comm = out.split()
    # `cmd >> file`: the shell's child opens the file, then execs /bin/echo; the name is read after the exec.
    shell_pid = sh(f"/bin/echo from echo >> {part}; echo $$").stdout.decode().strip()
    # Another user (65534): a mount with allow_other, the partition made writable for all.
    os.chmod(part, 0o666)
    sh(f"setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'printf \"from nobody\\n\" >> {part}'")

    view = b"untagged\nfrom python\nfrom echo\nfrom nobody\n"
    assert fs.read("t/0") == view  # the text view shows no header
    assert os.stat(part).st_size == len(view)
    fs.unmount()  # (everything flushed: kafka-python reads the files)
    got = kafka_records(fs.data)
    assert [v for _, v, _ in got] == [b"untagged", b"from python", b"from echo", b"from nobody"]
    assert got[0][2] == ()
    python, echo, nobody = (dict(h) for _, _, h in got[1:])
    assert [k for k, _ in got[1][2]] == ["logfs.pid", "logfs.uid", "logfs.comm"]
    assert python == {"logfs.pid": py_pid.encode(), "logfs.uid": b"0", "logfs.comm": py_comm.encode()}
    assert echo["logfs.comm"] == b"echo" and echo["logfs.uid"] == b"0"
    assert int(echo["logfs.pid"]) > 0 and echo["logfs.pid"] != shell_pid.encode()  # the forked child, not the shell
    assert nobody["logfs.uid"] == b"65534" and nobody["logfs.comm"] == b"sh"  # printf: a builtin of that sh

    # The dump tool shows them as Kafka's DumpLogSegments does: the header keys of each record.
    dump = subprocess.run([sys.executable, "-m", "logfs.tools.dump",
                           "--files", *sorted(glob.glob(os.path.join(fs.data, "t-0", "*.log"))),
                           "--print-data-log"], capture_output=True, text=True, check=True).stdout
    lines = [line for line in dump.splitlines() if "| offset:" in line]
    assert len(lines) == 4
    assert "headerKeys: []" in lines[0] and "payload: untagged" in lines[0]
    for line, value in zip(lines[1:], ["from python", "from echo", "from nobody"]):
        assert "headerKeys: [logfs.pid,logfs.uid,logfs.comm]" in line and f"payload: {value}" in line


def test_invalid_values_are_einval(mount_logfs):
    fs = mount_logfs()
    os.mkdir(fs.path("t"))
    for bad in (b"yes", b"1", b"tru"):
        expect_errno(errno.EINVAL, os.setxattr, fs.path("t"), "user.logfs.config.logfs.writer.headers", bad)
    assert fs.getx("t", "config.logfs.writer.headers") == "false"


def test_the_setting_survives_a_remount_and_cat_is_unchanged(mount_logfs):
    fs = mount_logfs()
    os.mkdir(fs.path("t"))
    os.setxattr(fs.path("t"), "user.logfs.config.logfs.writer.headers", b"true")
    lines = b"".join(b"line %d\n" % i for i in range(1000))
    fs.append("t/0", lines)
    fs.remount()
    assert fs.getx("t", "config.logfs.writer.headers") == "true"
    fs.append("t/0", b"after the remount\n")
    assert sh(f"cat {fs.path('t', 0)}").stdout == lines + b"after the remount\n"
    fs.unmount()
    got = kafka_records(fs.data)
    assert len(got) == 1001 and all(dict(h)["logfs.pid"] for _, _, h in got)

"""sd_notify as logfs@.service (Type=notify) sees it: the daemon is started with the unit's ExecStart and
NOTIFY_SOCKET pointing at a datagram socket the test owns (a path, and an abstract ``@name``)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from service_helpers import mounted_at, stat_with_timeout, wait_for

CLEAN = ".kafka_cleanshutdown"


@pytest.mark.parametrize("abstract", [False, True], ids=["path-socket", "abstract-socket"])
def test_ready_after_mount_answers_then_stopping_on_sigterm(service, notify_socket, abstract):
    sock = notify_socket(abstract=abstract)
    assert sock.address.startswith("@") == abstract
    svc = service()
    proc = svc.start(sock, "num.partitions=2")

    ready = sock.wait_for("READY", proc=proc)
    assert ready.fields["READY"] == "1"
    # The moment READY=1 arrived, the mountpoint was a live logfs mount that answered a stat (root inode 1).
    assert ready.mounted, "READY=1 before the mount existed"
    assert ready.root_ino == 1, "READY=1 before the mount answered"
    assert ready.pid == proc.pid, "notifications must come from the main PID (NotifyAccess=main)"
    before_ready = [m for m in sock.messages if m.received <= ready.received and m is not ready]
    assert any("STATUS" in m.fields for m in before_ready), [m.raw for m in sock.messages]
    assert "serving 0 partitions" in ready.fields.get("STATUS", ""), ready.raw

    # The mount works.
    os.mkdir(svc.mnt / "t")
    with open(svc.mnt / "t" / "1", "a") as f:
        f.write("hello\n")
    assert (svc.mnt / "t" / "1").read_text() == "hello\n"

    # systemctl stop: SIGTERM -> STOPPING=1, then a clean unmount and exit 0.
    proc.send_signal(signal.SIGTERM)
    stopping = sock.wait_for("STOPPING", proc=proc)
    assert stopping.fields["STOPPING"] == "1" and stopping.pid == proc.pid
    assert proc.wait(20) == 0, svc.stderr()
    sock.drain(0.05)
    assert not mounted_at(svc.mnt)
    assert os.path.exists(svc.data / CLEAN)
    statuses = sock.values("STATUS")
    assert statuses[-1].startswith("stopped"), statuses
    assert all(m.pid == proc.pid for m in sock.messages)
    # Order: loading..., READY, STOPPING, stopped.
    keys = [next(k for k in ("READY", "STOPPING", "STATUS") if k in m.fields) for m in sock.messages]
    assert keys.index("READY") < keys.index("STOPPING") == len(keys) - 2, [m.raw for m in sock.messages]
    assert "Traceback" not in svc.stderr()


def test_unmount_sends_stopping_and_exits_clean(service, notify_socket):
    sock = notify_socket()
    svc = service()
    proc = svc.start(sock)
    sock.wait_for("READY", proc=proc)
    subprocess.run(["fusermount3", "-u", str(svc.mnt)], check=True, timeout=30)
    assert sock.wait_for("STOPPING", proc=proc).fields["STOPPING"] == "1"
    assert proc.wait(20) == 0, svc.stderr()
    assert os.path.exists(svc.data / CLEAN)


def test_status_reports_partitions_on_a_clean_start(service, notify_socket):
    svc = service()
    sock = notify_socket()
    proc = svc.start(sock, "num.partitions=3")
    sock.wait_for("READY", proc=proc)
    os.mkdir(svc.mnt / "a")
    os.mkdir(svc.mnt / "b")
    assert svc.stop() == 0

    sock2 = notify_socket(abstract=True)
    proc = svc.start(sock2, "num.partitions=3")
    ready = sock2.wait_for("READY", proc=proc)
    assert ready.fields["STATUS"].startswith("serving 6 partitions"), ready.raw
    statuses = sock2.values("STATUS")
    loading = [s for s in statuses if s.startswith("loading: ")]
    assert loading and loading[-1] == "loading: 6/6 segments, 6/6 partitions", statuses
    assert not any("recover" in s for s in statuses), statuses
    # Every progress report extends the start timeout.
    assert all("EXTEND_TIMEOUT_USEC" in m.fields for m in sock2.messages if m.fields.get("STATUS", "").startswith(
        "loading: "))
    assert svc.stop() == 0


def test_watchdog_pings_when_enabled_for_this_pid(service, notify_socket):
    sock = notify_socket()
    svc = service()
    # systemd sets WATCHDOG_PID to the main PID; `exec` keeps the shell's PID for the daemon.
    wrapper = ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh"]
    proc = svc.start(sock, env={"WATCHDOG_USEC": "200000"}, wrapper=wrapper)
    ready = sock.wait_for("READY", proc=proc)
    pings = [m for m in sock.drain(1.0) if m.fields.get("WATCHDOG") == "1"]
    # Every WATCHDOG_USEC/2 = 0.1 s: about ten in a second; allow for a slow machine.
    assert len(pings) >= 4, [m.raw for m in sock.messages]
    assert all(m.pid == proc.pid for m in pings)
    assert all(m.received > ready.received for m in pings)
    assert svc.stop() == 0


@pytest.mark.parametrize("env", [{"WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}, {}],
                         ids=["other-pid", "not-enabled"])
def test_no_watchdog_pings_unless_enabled_for_this_pid(service, notify_socket, env):
    sock = notify_socket()
    svc = service()
    proc = svc.start(sock, env=env)
    sock.wait_for("READY", proc=proc)
    sock.drain(0.4)
    assert not sock.values("WATCHDOG")
    assert svc.stop() == 0


def test_no_notify_socket_is_fine(service):
    svc = service()
    proc = svc.start(None)
    wait_for(lambda: mounted_at(svc.mnt) and (stat_with_timeout(str(svc.mnt), 5) or None), 30,
             what="the mount")
    assert proc.poll() is None
    assert svc.stop() == 0
    assert os.path.exists(svc.data / CLEAN)


def test_unreachable_notify_socket_does_not_break_the_daemon(service, tmp_path):
    svc = service()
    proc = svc.start(None, env={"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    wait_for(lambda: mounted_at(svc.mnt) and (stat_with_timeout(str(svc.mnt), 5) or None), 30,
             what="the mount")
    assert svc.stop() == 0
    assert "Traceback" not in svc.stderr()

"""logfs.service.notify on its own (no mount): addresses, datagrams, the watchdog interval; and serve()'s
stop-before-mounting path."""

from __future__ import annotations

import os

import pytest

from logfs.service import notify as sd
from logfs.service.daemon import serve
from logfs.storage import LogManager
from service_helpers import NotifySocket


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_sends_one_datagram(tmp_path, monkeypatch, abstract):
    sock = NotifySocket(tmp_path, abstract=abstract)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        assert sd.notify("STATUS=hello\nEXTEND_TIMEOUT_USEC=5")
        m = sock.receive(2)
        assert m.raw == "STATUS=hello\nEXTEND_TIMEOUT_USEC=5"
        assert m.fields == {"STATUS": "hello", "EXTEND_TIMEOUT_USEC": "5"}
        assert m.pid == os.getpid()
    finally:
        sock.close()


@pytest.mark.parametrize("value", [None, "", "relative/path", "/nonexistent/notify.sock", "@no-such-abstract-name"])
def test_notify_without_a_listener_is_a_quiet_no_op(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sd.notify("READY=1") is False


@pytest.mark.parametrize("usec,pid,expected", [
    ("2000000", None, 1.0),
    ("2000000", "self", 1.0),
    ("2000000", "1", None),  # meant for another process
    ("0", None, None),
    ("abc", None, None),
    (None, None, None),
])
def test_watchdog_interval(monkeypatch, usec, pid, expected):
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert sd.watchdog_interval_s() == expected


async def test_stop_signal_between_loading_and_serving_closes_cleanly_without_mounting(tmp_path, monkeypatch):
    sock = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
    manager = LogManager(str(tmp_path / "data"))
    manager.create_topic("t")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    readiness = []
    try:
        assert await serve(manager, str(mnt), [], False, readiness.append, lambda: True) == 0
        assert manager.closed
        assert os.path.exists(tmp_path / "data" / ".kafka_cleanshutdown")
        assert readiness == []  # never reported ready
        m = sock.receive(2)
        assert m.fields["STOPPING"] == "1"
        assert not os.path.ismount(mnt)
    finally:
        sock.close()
        if not manager.closed:
            manager.close()

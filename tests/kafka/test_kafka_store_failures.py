"""A Kafka cluster as the store, while no broker answers (CONTRACT.md section 15, "Failures"; issue 46).

A broker of this module's own (it is stopped and started again), a ``kafka://`` mount with a short
``delivery.timeout.ms``: lines written and ``fsync``ed while the broker is up are in the mount's replica; the broker
stops; a write and ``fsync`` then fail with ``EIO`` (the call returns: bounded by ``delivery.timeout.ms``, no hang),
and the next ``write`` of the same partition works again (the failure is reported once); the cached lines are read as
before; the broker starts again and appends go on, the failed line never reaching the cluster; the unmount works, also
with the broker stopped; a stop signal ends an ``fsync`` waiting for no broker, and the daemon.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

import pytest

from logfs.testing.kafka import running_broker

from harness import daemon_pids, expect_errno, wait_for

pytestmark = pytest.mark.mount

DELIVERY_TIMEOUT_MS = 3000


@pytest.fixture(scope="module")
def broker(tmp_path_factory, kafka_client):
    with running_broker(tmp_path_factory.mktemp("kafka-store-failures"), kafka_client) as b:
        yield b


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.daemon_errors(r"fsync: .*(not delivered|not acknowledged)", r"write: .*(not delivered|refused)",
                           r"flush_appends: .*(not delivered|not acknowledged)")
def test_broker_stopped(mount_logfs, broker, kafka_client, tmp_path):
    def prepare(m):
        m.source = f"kafka://{broker.bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)

    m = mount_logfs(f"logfs.remote.cache.dir={tmp_path / 'cache'}", "logfs.broker.poll.ms=50",
                    f"kafka.delivery.timeout.ms={DELIVERY_TIMEOUT_MS}", "kafka.request.timeout.ms=1000",
                    foreground=True, name="m", prepare=prepare)
    os.mkdir(m.path("down"))
    before = b"".join(b"before %d\n" % i for i in range(100))
    fd = os.open(m.path("down", 0), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, before)
        os.fsync(fd)
        wait_for(lambda: read(m.path("down", 0)) == before, 30, what="the replica to hold the lines")

        broker.stop()
        try:
            os.write(fd, b"lost\n")  # queued: write() returns
            expect_errno(errno.EIO, os.fsync, fd)  # not acknowledged within delivery.timeout.ms
            assert read(m.path("down", 0)) == before  # cached reads go on
            assert m.getx("down/0", "position.50") == str(before.index(b"before 50\n"))
        finally:
            broker.start()
        os.write(fd, b"after\n")  # the failure was reported once: this write is taken, on a new producer
        os.fsync(fd)
    finally:
        os.close(fd)
    records = kafka_client.consume(broker.bootstrap, "down", 0)
    assert [r.value for r in records] == [b"before %d" % i for i in range(100)] + [b"after"]
    wait_for(lambda: read(m.path("down", 0)) == before + b"after\n", 30, what="the mount to show the new line")

    # Unmounting with no broker answering: the daemon exits (nothing left queued, the fetcher stops).
    broker.stop()
    try:
        m.unmount()
    finally:
        broker.start()


@pytest.mark.daemon_errors(r"fsync: .*not acknowledged before the mount stopped")
def test_stop_signal_during_a_waiting_fsync(mount_logfs, broker, tmp_path):
    """A stop signal while an ``fsync`` waits for a cluster that does not answer (``delivery.timeout.ms`` of a
    minute): the ``fsync`` fails with ``EIO`` and the daemon exits, without waiting for the timeout."""
    def prepare(m):
        m.source = f"kafka://{broker.bootstrap}"
        m.pids = lambda: daemon_pids(m.source, m.mnt)

    m = mount_logfs(f"logfs.remote.cache.dir={tmp_path / 'cache'}", "kafka.delivery.timeout.ms=60000",
                    foreground=True, name="m", prepare=prepare)
    os.mkdir(m.path("stopping"))
    fd = os.open(m.path("stopping", 0), os.O_WRONLY | os.O_APPEND)
    failed: list[int] = []

    def fsync() -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            failed.append(exc.errno)

    broker.stop()
    try:
        os.write(fd, b"never acknowledged\n")
        waiting = threading.Thread(target=fsync)
        waiting.start()
        waiting.join(1.0)  # (it waits: nothing answers)
        assert waiting.is_alive()
        m.proc.send_signal(signal.SIGTERM)
        m.wait_exit([m.proc.pid])  # (well before delivery.timeout.ms)
        waiting.join(30)
        assert not waiting.is_alive()
        assert failed and failed[0] in (errno.EIO, errno.ENOTCONN), failed
    finally:
        try:
            os.close(fd)
        except OSError as exc:  # (the daemon is gone: the descriptor is closed all the same)
            assert exc.errno == errno.ENOTCONN
        broker.start()

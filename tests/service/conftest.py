"""Fixtures for the service suite: a notify socket the test owns and daemons started like logfs@.service."""

from __future__ import annotations

import pytest

from service_helpers import NotifySocket, ServiceDaemon
from harness import fuse_unusable_reason, items_in, mark_mount

from remote_store import seaweed  # noqa: F401  (fixture: the tiering test's S3 store)

NEEDS_FUSE = {"service", "notify_socket"}


def pytest_collection_modifyitems(config, items):
    reason = fuse_unusable_reason()
    for item in items_in(items, __file__):
        if NEEDS_FUSE & set(getattr(item, "fixturenames", ())):
            mark_mount(item, reason)


@pytest.fixture
def notify_socket(tmp_path):
    """Factory: ``notify_socket(abstract=False)`` -> a bound NotifySocket, closed at teardown."""
    made: list[NotifySocket] = []

    def make(abstract: bool = False) -> NotifySocket:
        s = NotifySocket(tmp_path, abstract=abstract)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def service(tmp_path):
    """Factory: ``service(name="svc")`` -> a ServiceDaemon (not started); stopped and unmounted at teardown."""
    made: list[ServiceDaemon] = []

    def make(name: str = "svc") -> ServiceDaemon:
        d = ServiceDaemon(tmp_path / name)
        made.append(d)
        return d

    yield make
    errors = []
    for d in made:
        try:
            d.cleanup()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]

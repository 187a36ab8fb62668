"""Fixtures for the service suite: a notify socket the test owns and daemons started like logfs@.service."""

from __future__ import annotations

from pathlib import Path

import pytest

from service_helpers import NotifySocket, ServiceDaemon
from harness import fuse_unusable_reason

from remote_store import seaweed  # noqa: F401  (fixture: the tiering test's S3 store)

NEEDS_FUSE = {"service", "notify_socket"}


def pytest_collection_modifyitems(config, items):
    reason = fuse_unusable_reason()
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        if NEEDS_FUSE & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mount)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


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

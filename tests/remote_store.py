"""The SeaweedFS server of logfs/testing/seaweed.py (one copy of the code, shared with tools/bench.py), and the pytest
fixtures over it.

The fixtures (``seaweed``, ``seaweed_outage``, ``aws_env``, ``creds``, ``stall_proxy``) are shared the way
the harness is: a conftest imports them by name (``from remote_store import seaweed, aws_env``; tests/ is on
``sys.path`` as the root conftest's directory); pytest then offers them to that directory's tests.
"""

from __future__ import annotations

import pytest

from logfs.testing.seaweed import SeaweedS3, StallProxy, free_ports, weed_binary  # noqa: F401


def s3_tiering(store, prefix: str, *, segment_bytes: int, interval_ms: int, endpoint: str | None = None,
               bucket: str | None = None) -> tuple[str, ...]:
    """The -o options of a mount tiering to ``store`` (a SeaweedS3) under ``prefix``: segments of
    ``segment_bytes``, the upload task every ``interval_ms``, a tiered segment's local copy deleted at once."""
    return ("remote.log.storage.system.enable=true", f"logfs.remote.s3.bucket={bucket or store.bucket}",
            f"logfs.remote.s3.endpoint={endpoint or store.endpoint}", f"logfs.remote.s3.prefix={prefix}",
            f"log.segment.bytes={segment_bytes}", f"remote.log.manager.task.interval.ms={interval_ms}",
            "log.segment.delete.delay.ms=0")

# ---- pytest fixtures (imported by name into a conftest to use them) ------------------------------------------

@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A running SeaweedFS with S3 auth on and the bucket ``seaweed.bucket`` created; stopped at session end.

    Tests that stop it (``seaweed.stop()``) must start it again before they end (use ``seaweed_outage``).
    """
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        server.create_bucket()
        server.warm_up()
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def seaweed_outage(seaweed):
    """The session's SeaweedFS, brought back up after the test however the test ends."""
    yield seaweed
    if seaweed.proc is None:
        seaweed.start()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """An AWS credential chain that holds only what the test puts in it (no profile, file or instance role)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


@pytest.fixture
def creds(aws_env, seaweed):
    """The session's SeaweedFS, with its credentials (and only those) in this test's AWS chain."""
    for k, v in seaweed.env().items():
        aws_env.setenv(k, v)
    return seaweed


@pytest.fixture
def stall_proxy(seaweed):
    proxy = StallProxy(seaweed.s3)
    yield proxy
    proxy.close()

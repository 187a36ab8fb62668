"""Fixtures for tiered storage: the shared SeaweedFS (tests/remote_store.py); mounts come from the harness."""

from remote_store import aws_env, creds, seaweed, seaweed_outage, stall_proxy  # noqa: F401  (fixtures)

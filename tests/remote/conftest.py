"""Fixtures for the remote store tests: one SeaweedFS per session (started only if a test asks for it)."""

from remote_store import aws_env, seaweed, seaweed_outage, stall_proxy  # noqa: F401  (fixtures)

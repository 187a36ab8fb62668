"""Fixtures for the remote store tests: one SeaweedFS per session (started only if a test asks for it)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remote_store import aws_env, seaweed, seaweed_outage, stall_proxy  # noqa: E402,F401  (fixtures)

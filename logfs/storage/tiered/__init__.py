"""Tiered storage (KIP-405): the remote log manager (upload, manifest commit, local and whole-log retention,
reconciliation at start), the remote segment read like a local one, and the block cache it reads through.

Imports the foundation, format, local, :mod:`logfs.remote` (the store interface), and the cleaner's
``needs_rewrite`` (a segment is uploaded only once in its topic's codec).
"""

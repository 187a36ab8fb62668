"""Rewriting sealed segments: compaction (Kafka's Cleaner, policy apart from mechanism), the rewrite in the
topic's codec (compression), and the child process both run in (process). Each result is swapped in by the
local log's one crash-safe protocol (:func:`~logfs.storage.local.lifecycle.replace_segments`).

Imports the foundation, format and local; nothing imports it but tiering (which segments still await their
rewrite), the manager's callers and the service.
"""

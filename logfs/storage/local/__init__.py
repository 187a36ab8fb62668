"""The local log, Kafka's ``log`` package: sparse indexes, segments (one ``.log`` and its indexes), a log's
ordered segments and the snapshots that pin them, one partition (:class:`~logfs.storage.local.log.Log`), its
recovery (loader), retention, the process's open-file budget, and the read-only reader other processes use.

Imports the storage's foundation and :mod:`logfs.storage.format`; never the cleaner, tiering, publish or the
manager, which build on it.
"""

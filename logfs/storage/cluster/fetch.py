"""Kafka's Fetch request, spoken directly: the record batches of a partition as the broker sends them.

The replica (:mod:`.replica`) fills a partition it is far behind on with this, not with its consumer: the batches
Kafka sends are already Kafka-format batches with their own offsets, timestamps, compression and CRCs, so they are
written into the replica's segments as they come, with no record decoded or encoded again. A consumer
(librdkafka) hands every record over as an object, which the replica then re-encodes: measured on 1,000,000
100-byte records, ~58,000 records/s with librdkafka's defaults, 138,000 with its largest fetches, against
Kafka's own ``kafka-consumer-perf-test`` at ~600,000 (docs/benchmarks.md).

Only what that needs: Fetch version 4 (the oldest Kafka 4 serves, KIP-896; the newest without tagged fields, and
enough: isolation level, last stable offset, aborted transactions), one connection per broker. A connection logs in
as the consumer does with the same settings (:mod:`.security`: TLS, then SASL PLAIN or SCRAM): SaslHandshake
version 1 and SaslAuthenticate version 1 (Kafka 4 serves 0-1 and 0-2; version 0 of the handshake sends the tokens
unframed, and SaslAuthenticate's version 2 only adds tagged fields), before the first Fetch. A login the broker
refuses is :class:`AuthenticationError`, which the replica does not retry at once. A session with a lifetime
(the broker's ``connections.max.reauth.ms``) is closed before the broker would close it, and the next request logs
in on a new connection (Kafka's re-authentication on the same connection, KIP-368, is not needed for that).
Everything the consumer does better stays with it: the replica hands a partition back to its consumer at the first
error, the first transactional or control batch, or once it has caught up (see ``Replica._fetch_bulk``).

No trio, no pyfuse3: blocking sockets with timeouts, in the replica's thread.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass

from .security import AuthenticationFailed, DirectSecurity

FETCH = 1  # Kafka's api keys and the versions spoken
FETCH_VERSION = 4
SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION = 17, 1
SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION = 36, 1
ERRORS = {33: "UNSUPPORTED_SASL_MECHANISM", 34: "ILLEGAL_SASL_STATE", 58: "SASL_AUTHENTICATION_FAILED"}
REAUTH_MARGIN = 0.8  # a session with a lifetime is logged in again after this share of it
READ_COMMITTED = 1
CLIENT_ID = b"logfs-replica"

_HEAD = struct.Struct(">ihhih")  # size, api key, api version, correlation id, client id's length
_FETCH = struct.Struct(">iiiib")  # replica id, max wait, min bytes, max bytes, isolation level
_PART_REQ = struct.Struct(">iqi")  # partition, fetch offset, partition max bytes
_PART_RESP = struct.Struct(">ihqq")  # partition, error code, high watermark, last stable offset


class FetchError(Exception):
    """The broker could not be asked (connection refused or closed, a timeout, an answer that is not Kafka's)."""


class AuthenticationError(FetchError):
    """The broker refused this client: its SASL login (a wrong password, a mechanism it does not enable), or the
    TLS handshake (a certificate one side does not trust, a host name the broker's certificate does not name)."""


@dataclass
class PartitionData:
    error: int  # Kafka's error code (0: none)
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]] | None  # (producer id, first offset) of aborted transactions in range
    records: memoryview  # whole batches, then possibly the beginning of one more (cut by the fetch's bound)


class Connection:
    """One broker's connection: requests sent and answered one at a time; TLS and the SASL login of ``security``
    (None: PLAINTEXT) at each connect."""

    def __init__(self, host: str, port: int, timeout: float, security: DirectSecurity | None = None):
        self.address = (host, port)
        self.timeout = timeout
        self.security = security
        self._sock: socket.socket | None = None
        self._correlation = 0
        self._session_ends = float("inf")  # (monotonic) when the SASL session's lifetime runs out

    def _connected(self) -> socket.socket:
        if self._sock is not None and time.monotonic() >= self._session_ends:
            self.close()  # (the broker would close it at the lifetime's end: a new login first)
        if self._sock is None:
            try:
                sock = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as exc:
                raise FetchError(str(exc)) from None  # (fetch() names the broker)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            try:
                if self.security is not None and self.security.tls is not None:
                    try:
                        sock = self.security.tls.wrap_socket(sock, server_hostname=self.address[0])
                    except ssl.SSLError as exc:  # (not a timeout nor a reset: the handshake's refusal)
                        raise AuthenticationError(f"TLS: {exc}") from None
                self._sock = sock
                if self.security is not None and self.security.mechanism is not None:
                    self._login()
            except BaseException:
                sock.close()
                self._sock = None
                raise
        return self._sock

    def _login(self) -> None:
        """SaslHandshake, then SaslAuthenticate requests carrying the mechanism's exchange."""
        security = self.security
        mechanism = security.mechanism.encode()
        try:
            answer = self._request(SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION,
                                   struct.pack(">h", len(mechanism)) + mechanism)
            (error,) = struct.unpack_from(">h", answer, 0)
            if error:
                (count,) = struct.unpack_from(">i", answer, 2)
                enabled, pos = [], 6
                for _ in range(max(count, 0)):
                    (length,) = struct.unpack_from(">h", answer, pos)
                    enabled.append(bytes(answer[pos + 2:pos + 2 + length]).decode())
                    pos += 2 + length
                raise AuthenticationError(f"SASL {security.mechanism}: {ERRORS.get(error, error)} (the broker enables "
                                          f"{', '.join(enabled) or 'none'})")
            exchange = security.exchange()
            token = next(exchange)
            while True:
                answer = self._request(SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION,
                                       struct.pack(">i", len(token)) + token)
                error, length = struct.unpack_from(">hh", answer, 0)
                message = bytes(answer[4:4 + max(length, 0)]).decode(errors="replace")
                pos = 4 + max(length, 0)
                (size,) = struct.unpack_from(">i", answer, pos)
                reply = bytes(answer[pos + 4:pos + 4 + max(size, 0)])
                (lifetime_ms,) = struct.unpack_from(">q", answer, pos + 4 + max(size, 0))
                if error:
                    raise AuthenticationError(f"SASL {security.mechanism}: {ERRORS.get(error, error)}: {message}")
                try:
                    token = exchange.send(reply)
                except StopIteration:
                    break
        except AuthenticationFailed as exc:
            raise AuthenticationError(str(exc)) from None
        except struct.error as exc:
            raise FetchError(f"not a SASL answer: {exc}") from None
        self._session_ends = (time.monotonic() + REAUTH_MARGIN * lifetime_ms / 1000 if lifetime_ms > 0
                              else float("inf"))

    def _request(self, api_key: int, version: int, body: bytes) -> memoryview:
        """One request (header version 1) on the connected socket; the answer after its correlation id."""
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        head = _HEAD.pack(_HEAD.size - 4 + len(CLIENT_ID) + len(body), api_key, version, self._correlation,
                          len(CLIENT_ID))
        try:
            self._sock.sendall(head + CLIENT_ID + body)
            (size,) = struct.unpack(">i", self._read(self._sock, 4))
            answer = memoryview(self._read(self._sock, size))
        except ssl.SSLError as exc:
            if "alert" in str(exc).lower():  # (TLS 1.3: the broker refuses a client's certificate after the handshake)
                raise AuthenticationError(f"TLS: {exc}") from None
            raise FetchError(str(exc)) from None
        except OSError as exc:
            raise FetchError(str(exc)) from None
        if len(answer) < 4:
            raise FetchError(f"an answer of {len(answer)} bytes")
        (correlation,) = struct.unpack_from(">i", answer, 0)
        if correlation != self._correlation:
            raise FetchError(f"answer {correlation} to request {self._correlation}")
        return answer[4:]

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._session_ends = float("inf")

    def fetch(self, partitions: dict[str, list[tuple[int, int]]], *, max_wait_ms: int = 0, max_bytes: int = 32 << 20,
              partition_max_bytes: int = 8 << 20) -> dict[tuple[str, int], PartitionData]:
        """One Fetch of ``partitions`` (topic -> [(partition, offset)]), read_committed. Raises FetchError (the
        connection is closed: the next call connects again), AuthenticationError when the login is refused."""
        body = bytearray(_FETCH.pack(-1, max_wait_ms, 1, max_bytes, READ_COMMITTED))
        body += struct.pack(">i", len(partitions))
        for topic, parts in partitions.items():
            name = topic.encode()
            body += struct.pack(">h", len(name)) + name + struct.pack(">i", len(parts))
            for partition, offset in parts:
                body += _PART_REQ.pack(partition, offset, partition_max_bytes)
        where = f"{self.address[0]}:{self.address[1]}"
        try:
            self._connected()
            answer = self._request(FETCH, FETCH_VERSION, bytes(body))
        except AuthenticationError as exc:
            self.close()
            raise AuthenticationError(f"{where}: {exc}") from None
        except (OSError, FetchError) as exc:
            self.close()
            raise FetchError(f"{where}: {exc}") from None
        try:
            return self._parse(answer)
        except (struct.error, IndexError, UnicodeDecodeError, FetchError) as exc:
            self.close()
            raise FetchError(f"{where}: not a Fetch answer: {exc}") from None

    @staticmethod
    def _read(sock: socket.socket, size: int) -> bytearray:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = sock.recv_into(view[got:])
            if not n:
                raise FetchError("the broker closed the connection")
            got += n
        return buf

    @staticmethod
    def _parse(view: memoryview) -> dict[tuple[str, int], PartitionData]:
        _throttle, topics = struct.unpack_from(">ii", view, 0)
        pos = 8
        out = {}
        for _ in range(topics):
            (length,) = struct.unpack_from(">h", view, pos)
            topic = bytes(view[pos + 2: pos + 2 + length]).decode()
            pos += 2 + length
            (count,) = struct.unpack_from(">i", view, pos)
            pos += 4
            for _ in range(count):
                partition, error, high, stable = _PART_RESP.unpack_from(view, pos)
                pos += _PART_RESP.size
                (n_aborted,) = struct.unpack_from(">i", view, pos)
                pos += 4
                aborted = None
                if n_aborted >= 0:
                    aborted = [struct.unpack_from(">qq", view, pos + 16 * i) for i in range(n_aborted)]
                    pos += 16 * n_aborted
                (size,) = struct.unpack_from(">i", view, pos)
                pos += 4
                size = max(size, 0)
                if pos + size > len(view):
                    raise FetchError("records past the answer's end")
                out[(topic, partition)] = PartitionData(error, high, stable, aborted, view[pos: pos + size])
                pos += size
        return out

"""Kafka's Fetch request, spoken directly: the record batches of a partition as the broker sends them.

The replica (:mod:`.replica`) fills a partition it is far behind on with this, not with its consumer: the batches
Kafka sends are already Kafka-format batches with their own offsets, timestamps, compression and CRCs, so they are
written into the replica's segments as they come, with no record decoded or encoded again. A consumer
(librdkafka) hands every record over as an object, which the replica then re-encodes: measured on 1,000,000
100-byte records, ~58,000 records/s with librdkafka's defaults, 138,000 with its largest fetches, against
Kafka's own ``kafka-consumer-perf-test`` at ~600,000 (docs/benchmarks.md).

Only what that needs: Fetch version 4 (the oldest Kafka 4 serves, KIP-896; the newest without tagged fields, and
enough: isolation level, last stable offset, aborted transactions), one connection per broker, PLAINTEXT only
(the replica keeps its consumer, which speaks every security protocol, for anything else). Everything the
consumer does better stays with it: the replica hands a partition back to its consumer at the first error, the
first transactional or control batch, or once it has caught up (see ``Replica._fetch_bulk``).

No trio, no pyfuse3: blocking sockets with timeouts, in the replica's thread.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

FETCH = 1  # Kafka's api key
FETCH_VERSION = 4
READ_COMMITTED = 1
CLIENT_ID = b"logfs-replica"

_HEAD = struct.Struct(">ihhih")  # size, api key, api version, correlation id, client id's length
_FETCH = struct.Struct(">iiiib")  # replica id, max wait, min bytes, max bytes, isolation level
_PART_REQ = struct.Struct(">iqi")  # partition, fetch offset, partition max bytes
_PART_RESP = struct.Struct(">ihqq")  # partition, error code, high watermark, last stable offset


class FetchError(Exception):
    """The broker could not be asked (connection refused or closed, a timeout, an answer that is not Kafka's)."""


@dataclass
class PartitionData:
    error: int  # Kafka's error code (0: none)
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]] | None  # (producer id, first offset) of aborted transactions in range
    records: memoryview  # whole batches, then possibly the beginning of one more (cut by the fetch's bound)


class Connection:
    """One broker's connection: requests sent and answered one at a time."""

    def __init__(self, host: str, port: int, timeout: float):
        self.address = (host, port)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._correlation = 0

    def _connected(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as exc:
                raise FetchError(f"{self.address[0]}:{self.address[1]}: {exc}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def fetch(self, partitions: dict[str, list[tuple[int, int]]], *, max_wait_ms: int = 0, max_bytes: int = 32 << 20,
              partition_max_bytes: int = 8 << 20) -> dict[tuple[str, int], PartitionData]:
        """One Fetch of ``partitions`` (topic -> [(partition, offset)]), read_committed. Raises FetchError (the
        connection is closed: the next call connects again)."""
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        body = bytearray(_FETCH.pack(-1, max_wait_ms, 1, max_bytes, READ_COMMITTED))
        body += struct.pack(">i", len(partitions))
        for topic, parts in partitions.items():
            name = topic.encode()
            body += struct.pack(">h", len(name)) + name + struct.pack(">i", len(parts))
            for partition, offset in parts:
                body += _PART_REQ.pack(partition, offset, partition_max_bytes)
        head = _HEAD.pack(_HEAD.size - 4 + len(CLIENT_ID) + len(body), FETCH, FETCH_VERSION, self._correlation,
                          len(CLIENT_ID))
        try:
            sock = self._connected()
            sock.sendall(head + CLIENT_ID + body)
            (size,) = struct.unpack(">i", self._read(sock, 4))
            answer = self._read(sock, size)
        except (OSError, FetchError) as exc:
            self.close()
            raise FetchError(f"{self.address[0]}:{self.address[1]}: {exc}") from None
        try:
            return self._parse(memoryview(answer))
        except (struct.error, IndexError, UnicodeDecodeError, FetchError) as exc:
            self.close()
            raise FetchError(f"{self.address[0]}:{self.address[1]}: not a Fetch answer: {exc}") from None

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

    def _parse(self, view: memoryview) -> dict[tuple[str, int], PartitionData]:
        correlation, _throttle, topics = struct.unpack_from(">iii", view, 0)
        if correlation != self._correlation:
            raise FetchError(f"answer {correlation} to request {self._correlation}")
        pos = 12
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

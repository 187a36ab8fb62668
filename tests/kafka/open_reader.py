"""What the broker-mount tests share: a ``tail -f``-style reader, and a producer of one partition's lines."""

from __future__ import annotations

from harness import wait_for


class OpenReader:
    """One open file, read on at its end, like ``tail -f``: what it has seen, in order."""

    def __init__(self, path) -> None:
        self.file = open(path, "rb")
        self.seen = b""

    def read(self) -> bytes:
        """What came since the last read (or nothing), added to :attr:`seen`."""
        got = self.file.read()
        self.seen += got
        return got

    def reaches(self, want: bytes, timeout: float = 60, also=lambda: True, what: str = "the open reader") -> None:
        """Read on until it has seen as many bytes as ``want`` (and ``also()`` holds); then it has seen exactly
        ``want``: each line once, in order."""
        def check():
            self.read()
            return len(self.seen) >= len(want) and also()

        wait_for(check, timeout, interval=0.05, what=what)
        assert self.seen == want  # each line once, in order

    def close(self) -> None:
        self.file.close()


def produce_lines(client, broker, topic: str, values: list[bytes]) -> bytes:
    """``values`` to partition 0 of ``topic`` by Kafka's idempotent producer, in small batches; the text a
    partition file shows for them."""
    sent = client.produce(broker.bootstrap, [{"topic": topic, "partition": 0, "value": v} for v in values],
                          enable_idempotence="true", linger_ms="0", batch_size="600")
    assert len(sent) == len(values)
    return b"".join(v + b"\n" for v in values)

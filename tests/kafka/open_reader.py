"""What the broker-mount and Kafka-store tests share: a ``tail -f``-style reader, GNU ``tail -f`` itself, and a
producer of one partition's lines."""

from __future__ import annotations

import subprocess
import threading

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


class TailF:
    """GNU ``tail -c +1 -f`` of a file, the command a user runs, started now; what it printed is collected by a
    thread. A context manager: the command ends with the block."""

    def __init__(self, path) -> None:
        self.proc = subprocess.Popen(["tail", "-c", "+1", "-f", str(path)], stdout=subprocess.PIPE)
        self._seen = bytearray()
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
            self._seen.extend(chunk)

    def shows(self, want: bytes, timeout: float = 30, what: str = "tail -f to show every line once") -> None:
        """Wait until it printed exactly ``want``."""
        wait_for(lambda: bytes(self._seen) == want, timeout, what=what)

    def __enter__(self) -> "TailF":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()


def produce_lines(client, broker, topic: str, values: list[bytes]) -> bytes:
    """``values`` to partition 0 of ``topic`` by Kafka's idempotent producer, in small batches; the text a
    partition file shows for them."""
    sent = client.produce(broker.bootstrap, [{"topic": topic, "partition": 0, "value": v} for v in values],
                          enable_idempotence="true", linger_ms="0", batch_size="600")
    assert len(sent) == len(values)
    return b"".join(v + b"\n" for v in values)

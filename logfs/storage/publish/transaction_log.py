"""``DATA_DIR/logfs-transactions.log``: the sink's transaction log (:mod:`.transactions` writes it).

One record per line, ``<crc32c of the JSON, 8 hex> <json>``, appended with fdatasync:

- ``{"t": "commit", "app", "v", "ms", "pid", "parts": [{"topic", "p", "from", "records", "bytes", "spans"}]}``:
  a commit's commit point (it is then applied in full, after a crash too);
- ``{"t": "done", "app", "v", "ms", "offsets": [[topic, partition, first, last], ...]}``: applied;
- ``{"t": "state", "apps": {app: [last version applied, ms of its commit]}}``: the first record of a rewritten log.

Loading stops at the first line that does not check (an append a crash cut) and cuts the file there. Every
COMPACT_EVERY records the file is rewritten (temporary file, fsync, rename) with the live state only: the writers'
last versions not expired (``transactional.id.expiration.ms`` after their last commit) and the commits not done.
"""

from __future__ import annotations

import json
import logging
import os

import crc32c as _crc32c

from .. import checkpoints as ckpt

log = logging.getLogger(__name__)

COMPACT_EVERY = 10_000  # records appended before the log is rewritten with the live state only


class TransactionLog:
    """The log's state in memory: ``apps`` (last version applied per writer) and ``pending`` (commits past their
    commit point, not done). Not thread-safe: :class:`~.transactions.Transactions` serialises its use."""

    def __init__(self, path: str):
        self.path = path
        self.apps: dict[str, list[int]] = {}  # app -> [last version applied, ms of its commit]
        self.pending: dict[tuple[str, int], dict] = {}  # commits past their commit point, not done
        self._fd = -1
        self._appended = 0

    def load(self, now_ms: int, expiration_ms: int) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        good = 0
        for line in data.splitlines(keepends=True):
            record = _decode_line(line)
            if record is None:
                log.warning("%s: cut at byte %d (a record that does not check: an append a crash interrupted)",
                            self.path, good)
                break
            self._apply(record)
            good += len(line)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if good < len(data):
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        self._appended = data.count(b"\n")
        if self._expire(now_ms, expiration_ms) or self._appended > COMPACT_EVERY:
            self.compact()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _apply(self, record: dict) -> None:
        kind = record.get("t")
        if kind == "state":
            self.apps = {a: list(v) for a, v in record["apps"].items()}
        elif kind == "commit":
            self.pending[(record["app"], record["v"])] = record
        elif kind == "done":
            self.pending.pop((record["app"], record["v"]), None)
            last = self.apps.get(record["app"])
            self.apps[record["app"]] = [max(record["v"], last[0]) if last else record["v"], record["ms"]]

    def _expire(self, now_ms: int, expiration_ms: int) -> bool:
        busy = {app for app, _ in self.pending}
        old = [a for a, (_, ms) in self.apps.items() if now_ms - ms > expiration_ms and a not in busy]
        for app in old:
            del self.apps[app]
        return bool(old)

    def append(self, record: dict) -> None:
        """Append one record, durably (fdatasync), then apply it."""
        data = _encode_line(record)
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(28, f"short write to {self.path}")
        os.fdatasync(self._fd)
        self._apply(record)
        self._appended += 1

    def maybe_compact(self, now_ms: int, expiration_ms: int) -> None:
        if self._appended > COMPACT_EVERY:
            self._expire(now_ms, expiration_ms)
            self.compact()

    def compact(self) -> None:
        records = [{"t": "state", "apps": self.apps}] + list(self.pending.values())
        ckpt.atomic_write(self.path, b"".join(_encode_line(r) for r in records))
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._appended = len(records)

    def applied(self, app: str, version: int) -> bool:
        last = self.apps.get(app)
        return last is not None and last[0] >= version


def _encode_line(record: dict) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x %s\n" % (_crc32c.crc32c(body), body)


def _decode_line(line: bytes) -> dict | None:
    if not line.endswith(b"\n") or len(line) < 11 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != _crc32c.crc32c(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None

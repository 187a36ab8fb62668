"""sd_notify: the systemd notification protocol, written out (it is one datagram).

``NOTIFY_SOCKET`` names an AF_UNIX datagram socket, a path or (leading ``@``) an abstract-namespace name.
Without it, :func:`notify` does nothing. What logfs sends (``Type=notify``, see systemd/logfs@.service):

- ``STATUS=...`` while loading/recovering (partitions and segments done / total) and once serving;
- ``EXTEND_TIMEOUT_USEC=...`` with each startup progress report, so a long recovery that keeps making progress
  is not killed by ``TimeoutStartSec``;
- ``READY=1`` once the mount answers a request (a ``stat`` of the mountpoint went through the kernel to us);
- ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while serving, when the watchdog is enabled for this process;
- ``STOPPING=1`` as shutdown begins (signal or unmount).
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify_address() -> str | bytes | None:
    """The socket address from ``NOTIFY_SOCKET`` (abstract names as ``\\0name``), or None."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or address[0] not in "/@":
        return None
    if address.startswith("@"):
        return "\0" + address[1:]
    return address


def notify(message: str) -> bool:
    """Send one sd_notify datagram (newline-separated ``KEY=value`` lines). True if it was sent."""
    address = notify_address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.debug("sd_notify %r failed: %s", message, exc)
        return False
    if not message.startswith("WATCHDOG=1"):
        log.debug("sd_notify %s", message.replace("\n", " | "))
    return True


def watchdog_interval_s() -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, if the watchdog is enabled for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2_000_000 if value > 0 else None

"""How the daemon logs: to stderr, with journald priority prefixes under systemd, and user errors as one line.

Owns the format of every log line (``<N>logger: message`` for the journal, ``time LEVEL logger: message``
otherwise), the rule that a daemonizing ``logfs`` leaves startup errors to its parent's single
``logfs: error:`` line, and that line itself.
"""

from __future__ import annotations

import logging
import os
import sys


def journal_stderr() -> bool:
    """Whether stderr goes to the journal (or at least to systemd), so lines get ``<N>`` priority prefixes.

    ``JOURNAL_STREAM`` (``device:inode``) is set by systemd when stdout/stderr are connected to the journal;
    it is checked against stderr itself, since a child may inherit the variable with stderr redirected. Without
    it, ``INVOCATION_ID`` (set for every unit's processes) still means "run by systemd", e.g. a service whose
    stderr goes to syslog or kmsg, where the prefix is understood too."""
    stream = os.environ.get("JOURNAL_STREAM")
    if stream:
        try:
            device, inode = (int(x) for x in stream.split(":"))
            st = os.fstat(sys.stderr.fileno())
        except (ValueError, OSError, AttributeError):
            return False
        return (st.st_dev, st.st_ino) == (device, inode)
    return bool(os.environ.get("INVOCATION_ID"))


class _JournalFormatter(logging.Formatter):
    """``<N>logger: message``, the priority prefix on every line (journald parses it per line)."""

    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record):
        prefix = f"<{self.PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


class _UserErrorFilter(logging.Filter):
    """Drops errors marked ``extra={"user_error": True}``: in daemon mode the parent prints them."""

    def filter(self, record):
        return not getattr(record, "user_error", False)


class LateReleaseReply(logging.Filter):
    """pyfuse3's ERROR when the reply to a RELEASE (or RELEASEDIR) finds the request gone (``fuse_release():
    fuse_reply_* failed with No such file or directory``) is logged at INFO: the kernel sends it after ``close()``
    returned, without waiting for it, and an unmount right after a close (``cat f; umount``, a test's remount) ends
    the connection before the reply; the release itself was done, nothing is lost. Any other failed reply stays an
    ERROR."""

    MESSAGES = tuple(f"{call}(): fuse_reply_* failed with No such file or directory"
                     for call in ("fuse_release", "fuse_releasedir"))

    def filter(self, record):
        if record.levelno == logging.ERROR and record.getMessage() in self.MESSAGES:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def user_error(message: str) -> None:
    """One line for a user error (bad option, locked or unwritable directory, missing mountpoint), never a
    traceback; with a journal priority prefix under systemd."""
    prefix = "<3>" if journal_stderr() else ""
    print(f"{prefix}logfs: error: {message}", file=sys.stderr, flush=True)


def setup_logging(debug: bool, daemon: bool = False) -> logging.Handler:
    """Log records to stderr: ``<N>name: message`` under systemd (journald adds the time), otherwise
    ``time LEVEL name: message``. ``debug`` logs DEBUG from every module (the logger name says which; pyfuse3
    included). Without ``debug``, a daemonizing ``logfs`` on a terminal shows only warnings and errors before it
    detaches, and leaves startup errors to the parent's single ``logfs: error:`` line."""
    handler = logging.StreamHandler(sys.stderr)
    if journal_stderr():
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if daemon and not debug:
            handler.setLevel(logging.WARNING)
    if daemon:
        handler.addFilter(_UserErrorFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    pyfuse3_log = logging.getLogger("pyfuse3")
    pyfuse3_log.setLevel(logging.DEBUG if debug else logging.WARNING)
    if not any(isinstance(f, LateReleaseReply) for f in pyfuse3_log.filters):
        pyfuse3_log.addFilter(LateReleaseReply())
    return handler

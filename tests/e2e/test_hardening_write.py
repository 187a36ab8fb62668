"""Issue 13.1 on a real mount: the kernel cuts a write() of more than 1 MiB into 1 MiB FUSE requests, so a line
over max.message.bytes can be refused after its first request was taken. No byte of it is ever appended, and the
lines after it are (the handle semantics themselves are in tests/ops/test_ops_write_semantics.py)."""

from __future__ import annotations

import errno
import logging
import os
import shlex

import pytest

from harness import expect_errno, sh

BIG = 2_000_000  # one line, two FUSE requests
REQUEST = 1 << 20


@pytest.fixture(scope="module")
def big_line():
    return b"x" * BIG


@pytest.fixture
def limited_mount(mount_logfs):
    """A mount with three topics, each with its own max.message.bytes."""
    fs = mount_logfs()
    # "wide": the limit falls in the second request of a 2 MB write; "narrow": in its first.
    for topic, limit in (("wide", 1_500_000), ("narrow", 100_000), ("small", 100)):
        os.mkdir(fs.path(topic))
        os.setxattr(fs.path(topic), "user.logfs.config.max.message.bytes", str(limit).encode())
    return fs


def write_all(fd: int, data: bytes) -> None:
    """What cat, dd and Python's buffered files do: write the rest after a short write, stop at an error."""
    while data:
        data = data[os.write(fd, data):]


def test_one_write_over_1mib_appends_no_fragment(limited_mount, big_line):
    for topic in ("wide", "narrow"):
        fd = os.open(limited_mount.path(topic, 0), os.O_WRONLY | os.O_APPEND)
        try:
            assert os.write(fd, b"before\n") == 7
            if topic == "wide":
                # The first request (up to 1 MiB: 256 pages of the caller's buffer) was taken before the line
                # proved too long: the caller sees a short write.
                assert REQUEST - 4096 < os.write(fd, big_line) <= REQUEST
            else:
                expect_errno(errno.EFBIG, os.write, fd, big_line)
            assert os.write(fd, b"\nafter\n") == 7
        finally:
            os.close(fd)
        assert limited_mount.read(f"{topic}/0") == (b"before\nafter\n" if topic == "wide" else b"before\n\nafter\n")


def test_a_writer_that_resends_after_a_short_write(limited_mount, big_line):
    """wide: the refused request carried the line's end and the next line; the caller resends them."""
    fd = os.open(limited_mount.path("wide", 0), os.O_WRONLY | os.O_APPEND)
    try:
        write_all(fd, big_line + b"\nafter\n")
        # 3 MB: the resent rest of the line fails in its first request, so the caller sees EFBIG and stops ...
        expect_errno(errno.EFBIG, write_all, fd, b"y" * 1_000_000 + big_line + b"\n")
        write_all(fd, b"\nok\n")  # ... and the next newline it sends ends the refused line
    finally:
        os.close(fd)
    assert limited_mount.read("wide/0") == b"after\nok\n"


def test_python_logging_of_a_message_over_the_limit(limited_mount, big_line, capsys):
    """logging.FileHandler writes each message with one write() of its buffered file; one over the limit is
    lost (with a "Logging error" report on stderr when the refusal reaches the caller), the next ones are kept,
    and nothing of it is appended."""
    for topic in ("wide", "narrow"):
        logger = logging.getLogger(f"logfs.test.{topic}")
        logger.propagate = False
        handler = logging.FileHandler(limited_mount.path(topic, 0), mode="a")
        logger.addHandler(handler)
        try:
            logger.warning("first")
            logger.warning(big_line.decode())
            logger.warning("after")
        finally:
            logger.removeHandler(handler)
            handler.close()
        assert limited_mount.read(f"{topic}/0") == b"first\nafter\n"
    assert "Logging error" in capsys.readouterr().err  # narrow: the first request failed, logging says so


def test_cat_of_a_line_over_the_limit_fails_and_appends_nothing(limited_mount, big_line, tmp_path):
    src = tmp_path / "big.txt"
    src.write_bytes(b"before\n" + big_line + b"\nafter\n")
    r = sh(f"cat {shlex.quote(str(src))} >> {shlex.quote(limited_mount.path('wide', 0))}", check=False)
    assert r.returncode != 0 and b"too large" in r.stderr.lower()
    assert limited_mount.read("wide/0") == b"before\n"
    assert limited_mount.getx("wide/0", "log_end_offset") == "1"


def test_the_issues_60_plus_60_sequence(limited_mount):
    fd = os.open(limited_mount.path("small", 0), os.O_WRONLY | os.O_APPEND)
    try:
        assert os.write(fd, b"before\n") == 7
        assert os.write(fd, b"a" * 60) == 60
        expect_errno(errno.EFBIG, os.write, fd, b"b" * 60)
        assert os.write(fd, b"\n") == 1
        assert os.write(fd, b"after\n") == 6
    finally:
        os.close(fd)
    assert limited_mount.read("small/0") == b"before\nafter\n"

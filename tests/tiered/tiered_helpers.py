"""Helpers shared by the tiered storage tests that drive a LogManager without FUSE."""

from __future__ import annotations

from logfs.view.text import open_view


def view_text(plog) -> bytes:
    """Everything a new open of ``plog``'s file reads, from its start."""
    view = open_view(plog)
    try:
        return view.read(0, view.length() + 10)
    finally:
        view.release()

"""Which thread serves FUSE requests: the request loop must never wait for the object store, nor spend its time
decompressing. The daemon marks the thread that serves requests (:func:`mark_request_thread`); the engine's reads
that would fetch from the store or decompress ask :func:`on_request_thread` and raise
:class:`~logfs.storage.errors.FetchNeededError` there instead, and the caller repeats the call in a worker thread.
"""

from __future__ import annotations

import threading

_thread = threading.local()


def mark_request_thread(on: bool = True) -> None:
    """The calling thread serves requests: reads there never fetch, they raise FetchNeededError instead."""
    _thread.no_fetch = on


def may_fetch() -> bool:
    """Whether the calling thread may wait for the store (any thread but the request thread)."""
    return not getattr(_thread, "no_fetch", False)


def on_request_thread() -> bool:
    """Whether the calling thread serves requests (:func:`mark_request_thread`): CPU-heavy work (decompressing a
    batch) does not run there either; callers raise FetchNeededError to be repeated in a worker thread."""
    return getattr(_thread, "no_fetch", False)

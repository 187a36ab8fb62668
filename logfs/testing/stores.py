"""Object-store wrappers for tests and benchmarks: what a read path fetched, counted at the store."""

from __future__ import annotations


class CountingStore:
    """A remote store whose ranged GETs of ``.log`` objects are counted (``log_bytes``, ``log_gets``); anything
    else goes to the wrapped store as it is."""

    def __init__(self, store):
        self.store = store
        self.log_bytes = 0
        self.log_gets = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get_range(self, key, start, length, **kw):
        data = self.store.get_range(key, start, length, **kw)
        if key.endswith(".log"):
            self.log_bytes += len(data)
            self.log_gets += 1
        return data

    def close(self) -> None:
        """Nothing: the wrapped store stays its owner's (a reader that closes the store it opened does not close
        the one a test or a bench handed it)."""

"""Count the function hops and layer crossings of one append and one random read, as ARCHITECTURE.md reports.

Drives the FUSE ``Operations`` class directly (no kernel): a topic with one partition holding some records, then
one ``write()`` of a 100-byte line on an ``O_APPEND`` handle (a new batch after bulk writes), a second one (it
grows that batch in place), and one ``read()`` of 4 KiB at a position that is
not where the previous read ended (so it goes through the index). A profiler counts every Python function of
``logfs`` entered during each call ("hops"), and every call whose callee is in a different layer than its caller
("crossings": fuse, view, storage, service; C functions of ``logfs._speedups`` count as storage).

    PYTHONPATH=$PWD python tools/hops.py    # prints a table (PYTHONPATH: this checkout's logfs, not an installed one)
"""

from __future__ import annotations

import os
import sys
import tempfile

import trio

from logfs.fuse.operations import ROOT, Operations
from logfs.storage.manager import LogManager

LAYERS = ("fuse", "view", "storage", "service", "spark", "remote")


def _layer(module: str) -> str | None:
    if module == "logfs._speedups":
        return "storage"
    if not module.startswith("logfs."):
        return None
    part = module.split(".")[1]
    return part if part in LAYERS else part


class Counter:
    def __init__(self):
        self.hops = 0
        self.crossings = 0
        self.path: list[str] = []
        self._stack: list[str | None] = []

    def __call__(self, frame, event, arg):
        if event in ("call", "c_call"):
            if event == "call":
                module = frame.f_globals.get("__name__", "")
                name = frame.f_code.co_qualname
            else:
                module = getattr(arg, "__module__", None) or ""
                name = getattr(arg, "__qualname__", getattr(arg, "__name__", "?"))
            layer = _layer(module)
            caller = next((x for x in reversed(self._stack) if x is not None), None)
            if layer is not None:
                self.hops += 1
                if caller is not None and caller != layer:
                    self.crossings += 1
                self.path.append(f"{layer}:{name}")
            self._stack.append(layer)
        elif event in ("return", "c_return", "c_exception"):
            if self._stack:
                self._stack.pop()


async def _profiled(op, *args) -> Counter:
    """The hops and crossings of one awaited call of ``op``."""
    counter = Counter()
    sys.setprofile(counter)
    try:
        await op(*args)
    finally:
        sys.setprofile(None)
    return counter


async def _measure() -> dict[str, Counter]:
    with tempfile.TemporaryDirectory() as tmp:
        manager = LogManager(tmp)
        ops = Operations(manager, run_blocking=lambda fn, *a: trio.to_thread.run_sync(fn, *a))
        await ops.mkdir(ROOT, b"t", 0o755, None)
        topic_ino = (await ops.lookup(ROOT, b"t", None)).st_ino
        part_ino = (await ops.lookup(topic_ino, b"0", None)).st_ino
        wfi = await ops.open(part_ino, os.O_WRONLY | os.O_APPEND, None)
        line = b"x" * 99 + b"\n"
        for _ in range(200):
            await ops.write(wfi.fh, 0, line * 100)
        rfi = await ops.open(part_ino, os.O_RDONLY, None)
        await ops.read(rfi.fh, 0, 4096)  # warm caches the way a first read does
        results = {"append": await _profiled(ops.write, wfi.fh, 0, line),
                   # the next line: it grows the batch the previous one started (the everyday write)
                   "small append (tail batch grown)": await _profiled(ops.write, wfi.fh, 0, line),
                   "read": await _profiled(ops.read, rfi.fh, 1_000_003, 4096)}
        await ops.release(rfi.fh)
        await ops.release(wfi.fh)
        manager.close()
        return results


def main() -> None:
    results = trio.run(_measure)
    print("| path | hops (logfs functions entered) | layer crossings |")
    print("| --- | ---: | ---: |")
    for name, c in results.items():
        print(f"| one {name} | {c.hops} | {c.crossings} |")
    if "-v" in sys.argv:
        for name, c in results.items():
            print(f"\n{name}:")
            for step in c.path:
                print("   ", step)


if __name__ == "__main__":
    main()

"""What tools/bench_compression.py and tools/bench_compression_spark.py share: a data set's two DATA_DIRs (``Pair``:
topic ``t`` uncompressed in ``plain``, in zstd in ``zstd``) and their mounts, and what is on disk in them (the
segments, their first batch's codec, whether the background rewrite is done, and whether it is running)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import threading

from logfs.testing.benchlib import mount_logfs, mounted_at, unmount, wait_for

ZSTD = 4
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TOPIC = "t"
SYSTEMS = ("plain", "zstd")


# -- what is on disk --------------------------------------------------------------------------------------------
def segment_files(data: str) -> list[str]:
    """The partition's ``.log`` files, by base offset (the last one is the active segment)."""
    return sorted(glob.glob(os.path.join(data, f"{TOPIC}-0", "*.log")))


def first_codec(path: str) -> int:
    """The codec bits of a segment file's first batch (its attributes, bytes 21-22); -1 for a file gone (renamed
    by a swap in flight) or too short."""
    try:
        with open(path, "rb") as f:
            head = f.read(23)
    except FileNotFoundError:
        return -1
    return head[22] & 0x07 if len(head) == 23 else -1


def compressed_count(data: str) -> tuple[int, int]:
    """(sealed segments whose first batch is in zstd, sealed segments); a rewrite in flight counts as not done."""
    sealed = segment_files(data)[:-1]
    pending = glob.glob(os.path.join(data, f"{TOPIC}-0", "*.cleaned")) + \
        glob.glob(os.path.join(data, f"{TOPIC}-0", "*.swap"))
    done = sum(first_codec(p) == ZSTD for p in sealed)
    return (done - len(pending) if pending else done), len(sealed)


def wait_compressed(data: str, timeout: float = 1800) -> None:
    def all_done() -> bool:
        done, sealed = compressed_count(data)
        return sealed > 0 and done == sealed

    wait_for(all_done, timeout, f"the background rewrite of {data}")


def base_of(path: str) -> int:
    return int(os.path.basename(path).split(".")[0])


def sealed_log_bytes(data: str) -> int:
    return sum(os.path.getsize(p) for p in segment_files(data)[:-1])


class ChildWatch:
    """Samples (every ``interval`` s) whether a daemon has a child process running the cleaner's module (the
    background rewrite runs there): ``seen`` is True once any sample found one."""

    def __init__(self, pid: int, interval: float = 0.02):
        self.pid, self.interval = pid, interval
        self.seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _children(self) -> list[str]:
        kids = []
        for children in glob.glob(f"/proc/{self.pid}/task/*/children"):
            try:
                with open(children) as f:
                    kids += f.read().split()
            except OSError:
                pass
        return kids

    def _run(self) -> None:
        while not self._stop.is_set():
            for kid in self._children():
                try:
                    with open(f"/proc/{kid}/cmdline", "rb") as f:
                        if b"cleaner_process" in f.read():
                            self.seen = True
                except OSError:
                    pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# -- the mounts ----------------------------------------------------------------------------------------
def setx(path: str, key: str, value: str) -> None:
    subprocess.run(["setfattr", "-n", f"user.logfs.config.{key}", "-v", value, path], check=True)


class Pair:
    """One data set's two DATA_DIRs (``plain``, ``zstd``) under ``root``, and their mounts."""

    def __init__(self, root: str, opts: tuple[str, ...]):
        self.root, self.opts = root, opts
        shutil.rmtree(root, ignore_errors=True)
        self.data = {s: os.path.join(root, s, "data") for s in SYSTEMS}
        self.mnt = {s: os.path.join(root, s, "mnt") for s in SYSTEMS}
        for s in SYSTEMS:
            os.makedirs(self.mnt[s])

    def part(self, system: str) -> str:
        return os.path.join(self.mnt[system], TOPIC, "0")

    def mount(self, system: str, *extra: str, env: dict | None = None) -> None:
        mount_logfs(self.data[system], self.mnt[system], *self.opts, *extra, extra_env=env)

    def unmount(self, system: str) -> None:
        unmount(self.mnt[system], self.data[system])

    def create(self) -> None:
        for s in SYSTEMS:
            self.mount(s)
            os.mkdir(os.path.join(self.mnt[s], TOPIC))
        setx(os.path.join(self.mnt["zstd"], TOPIC), "compression.type", "zstd")

    def close(self) -> None:
        for s in SYSTEMS:
            if mounted_at(self.mnt[s]):
                self.unmount(s)

#!/usr/bin/env python3
"""A demo mount: starts logfs on ./demo/data at ./demo/mnt, appends and reads through the shell, shows the
xattrs and the Kafka files underneath, and leaves the mount up to play with (``--unmount`` to take it down)."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "demo"))
DATA, MNT = os.path.join(ROOT, "data"), os.path.join(ROOT, "mnt")
BIN = os.path.dirname(sys.executable)


def sh(cmd: str) -> None:
    print(f"$ {cmd}")
    subprocess.run(cmd, shell=True, check=False, env={**os.environ, "PATH": BIN + ":" + os.environ["PATH"]})


def main() -> int:
    if os.path.ismount(MNT):
        subprocess.run(["fusermount3", "-u", MNT], check=False)
    if "--unmount" in sys.argv:
        return 0
    shutil.rmtree(DATA, ignore_errors=True)
    os.makedirs(MNT, exist_ok=True)
    sh(f"logfs {DATA} {MNT} -o num.partitions=2,log.segment.bytes=4096")
    sh(f"mkdir {MNT}/orders && ls -l {MNT}/orders")
    sh(f"for i in $(seq 1 100); do echo '{{\"id\":'$i',\"item\":\"widget\"}}' >> {MNT}/orders/0; done")
    sh(f"head -3 {MNT}/orders/0 && wc -l {MNT}/orders/0 && stat -c 'size=%s' {MNT}/orders/0")
    sh(f"getfattr -d {MNT}/orders/0")
    sh(f"pos=$(getfattr --only-values -n user.logfs.position.42 {MNT}/orders/0); tail -c +$((pos+1)) {MNT}/orders/0 | head -2")
    sh(f"ls {DATA}/orders-0 | head")
    print(f"\nlogfs is mounted at {MNT}. Unmount with: fusermount3 -u {MNT}  (or: bash tools/dev.sh demo --unmount)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

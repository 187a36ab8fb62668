#!/usr/bin/env python3
"""Kafka's DumpLogSegments for logfs segment files: a thin wrapper over the installed command
``logfs-dump-log-segments`` (:mod:`logfs.tools.dump`), for running from a checkout.

    python tools/dump_log_segments.py --files A.log,B.index,C.timeindex
        [--deep-iteration] [--print-data-log] [--verify-index-only] [--index-sanity-check]
"""

import sys

from logfs.tools.dump import main

if __name__ == "__main__":
    sys.exit(main())

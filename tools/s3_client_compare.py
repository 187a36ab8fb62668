"""Measure S3 client candidates against a local SeaweedFS, for docs/remote-client.md.

Candidates: boto3 with its defaults and as logfs's S3Store configures it, minio, obstore.

Run once by hand (a measurement, not a test): ``pip install minio obstore`` (candidates only, not project
dependencies), then ``python tools/s3_client_compare.py``. It starts its own
SeaweedFS (logfs/testing/seaweed.py), then for each client: import time in a fresh interpreter, then
latency and CPU (process time, this process only: the server runs in another process) per 4 KiB ranged GET,
per 1 MiB and 8 MiB PUT and GET, each the median of several rounds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from logfs.testing.seaweed import SeaweedS3

IMPORTS = {
    "boto3": "import boto3, botocore.config; boto3.client('s3', region_name='us-east-1')",
    "minio": "import minio; minio.Minio('127.0.0.1:9', secure=False)",
    "logfs S3Store (boto3)": "import logfs.remote.s3 as m; m.S3Store('b', endpoint='http://127.0.0.1:9')",
    "obstore": "import obstore; from obstore.store import S3Store; S3Store('b', endpoint='http://127.0.0.1:9', "
               "region='us-east-1', client_options={'allow_http': True})",
}


def import_time(stmt: str, rounds: int = 5) -> float:
    best = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {stmt}; "
                              "print(time.perf_counter()-t)"], capture_output=True, text=True, check=True, cwd=ROOT,
                             env={**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                                  "PYTHONPATH": str(ROOT)})
        best.append(float(out.stdout))
    return statistics.median(best)


def clients(s3: SeaweedS3):
    import boto3
    from botocore.config import Config
    b = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id=s3.access_key,
                     aws_secret_access_key=s3.secret_key, config=Config(s3={"addressing_style": "path"}))
    yield "boto3", {
        "put": lambda k, d: b.put_object(Bucket=s3.bucket, Key=k, Body=d),
        "get": lambda k: b.get_object(Bucket=s3.bucket, Key=k)["Body"].read(),
        "range": lambda k, o, n: b.get_object(Bucket=s3.bucket, Key=k, Range=f"bytes={o}-{o + n - 1}")["Body"].read(),
    }
    os.environ.update(AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key)
    from logfs.remote.s3 import S3Store
    ls = S3Store(s3.bucket, endpoint=s3.endpoint)
    yield "logfs S3Store (boto3)", {
        "put": ls.put_bytes, "get": ls.get_bytes, "range": ls.get_range,
    }
    import io

    import minio
    m = minio.Minio(s3.endpoint.removeprefix("http://"), access_key=s3.access_key, secret_key=s3.secret_key,
                    secure=False, region="us-east-1")

    def mget(k, o=0, n=0):
        r = m.get_object(s3.bucket, k, offset=o, length=n)
        try:
            return r.read()
        finally:
            r.close()
            r.release_conn()
    yield "minio", {
        "put": lambda k, d: m.put_object(s3.bucket, k, io.BytesIO(d), len(d)),
        "get": lambda k: mget(k),
        "range": lambda k, o, n: mget(k, o, n),
    }
    import obstore
    from obstore.store import S3Store
    o = S3Store(s3.bucket, endpoint=s3.endpoint, region="us-east-1", access_key_id=s3.access_key,
                secret_access_key=s3.secret_key, virtual_hosted_style_request=False,
                client_options={"allow_http": True})
    yield "obstore", {
        "put": lambda k, d: obstore.put(o, k, d),
        "get": lambda k: bytes(obstore.get(o, k).bytes()),
        "range": lambda k, off, n: bytes(obstore.get_range(o, k, start=off, length=n)),
    }


def measure(fn, rounds: int) -> tuple[float, float]:
    """(median wall ms, mean CPU ms) per call."""
    walls = []
    cpu0 = time.process_time()
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls) * 1e3, (time.process_time() - cpu0) / rounds * 1e3


def main() -> None:
    print("| client | import ms | 4 KiB ranged GET ms (CPU ms) | 1 MiB PUT | 1 MiB GET | 8 MiB PUT | 8 MiB GET |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        s3 = SeaweedS3(Path(d))
        s3.start()
        s3.create_bucket()
        try:
            data = {1: os.urandom(1 << 20), 8: os.urandom(8 << 20)}
            for name, ops in clients(s3):
                imp = import_time(IMPORTS[name]) * 1e3
                ops["put"](f"{name}/big8", data[8])
                for _ in range(5):  # warm the connection pool
                    ops["range"](f"{name}/big8", 0, 4096)
                cells = []
                offs = iter(range(10 ** 9))
                rw, rc = measure(lambda: ops["range"](f"{name}/big8", (next(offs) * 4096) % (8 << 20), 4096), 300)
                cells.append(f"{rw:.2f} ({rc:.2f})")
                for mib in (1, 8):
                    n = 20 if mib == 1 else 6
                    pw, pc = measure(lambda: ops["put"](f"{name}/obj{mib}", data[mib]), n)
                    gw, gc = measure(lambda: ops["get"](f"{name}/obj{mib}"), n)
                    assert ops["get"](f"{name}/obj{mib}") == data[mib]
                    cells += [f"{pw:.1f} ({pc:.1f})", f"{gw:.1f} ({gc:.1f})"]
                print(f"| {name} | {imp:.0f} | " + " | ".join(cells) + " |", flush=True)
        finally:
            s3.shutdown()


if __name__ == "__main__":
    main()

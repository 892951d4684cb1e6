"""Requests per image and bytes fetched per byte decoded, reading a bucket (issue 31, items 3-4).

Starts the test suite's moto S3 server (``tests/buckets.py``) with the fault proxy
(``tests/faultproxy.py``) in front of it at ``latency`` seconds to the first byte, uploads an
image folder as it is (``folder``) and as Parquet shards (``shards``, ``stoker convert`` with its
defaults), and reads one epoch of each layout named (batch 256, RandomResizedCrop 224, the
given workers). Prints the GETs the proxy counted per image and ``stats().requests``::

    python scripts/bucket_requests.py /tmp/bucket-folder 0.02 2 shards,folder
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import stoker  # noqa: E402
from buckets import S3Server  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from stoker.cli.convert import convert  # noqa: E402
from stoker.datasets import make_image_folder  # noqa: E402


def main(folder: pathlib.Path, latency: float, workers: int, layouts: list[str]) -> None:
    """Measure each layout and print a line for it."""
    if not folder.exists():
        make_image_folder(folder, classes=4, per_class=300, seed=1)
    shards = pathlib.Path(f"{folder}-shards")
    if not shards.exists():
        convert(folder, shards, progress=False)
    os.environ["XDG_CACHE_HOME"] = f"{folder}-cache-{os.getpid()}"
    with S3Server() as s3:
        os.environ.update(s3.env())
        bucket = s3.bucket()
        s3.upload(shards, f"s3://{bucket}/shards")
        s3.upload(folder, f"s3://{bucket}/folder")
        with FaultProxy(s3.endpoint, latency=latency) as proxy:
            os.environ.update(proxy.env())
            for layout in layouts:
                options = {"batch_size": 256, "image_size": 224, "workers": workers, "seed": 0}
                with stoker.Loader(f"s3://{bucket}/{layout}", **options) as loader:
                    before = proxy.gets(f"/{layout}/")
                    t0 = time.perf_counter()
                    n = sum(len(y) for _, y in loader)
                    seconds = time.perf_counter() - t0
                    gets = proxy.gets(f"/{layout}/") - before
                    r = loader.stats().requests
                print(
                    f"{layout}: {n} images, {n / seconds:.0f} img/s; proxy GETs {gets} = "
                    f"{gets / n:.3f} per image; stats: {r['gets_per_image']:.3f} GETs per "
                    f"image, fetched/decoded {r['fetched_per_decoded']:.3f}, latency median "
                    f"{r['latency_median_ms']:.1f} ms p99 {r['latency_p99_ms']:.1f} ms, retries "
                    f"{r['retries']}, throttled {r['throttled']}"
                )


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))

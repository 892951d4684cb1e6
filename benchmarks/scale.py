"""Data at scale: loader memory vs dataset size, and reads from a cold page cache.

1. Memory: steady-state PSS of the whole process tree (parent + workers) for a 2,000-sample
   and a 200,000-sample CSV source (the same JPEGs listed many times, so the work per batch is
   identical and only the index grows). Goal: within 10%.
2. Cold cache: loader throughput from the image folder and from Parquet shards when every
   file's pages are dropped before each epoch with posix_fadvise(POSIX_FADV_DONTNEED), as for
   a dataset bigger than RAM; warm-cache epochs beside them.

    python benchmarks/scale.py --data /data/imagenet_like --shards /tmp/shards
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import statistics
import tempfile
import time

import stoker
from stoker.cli.bench import tree_pss


def make_csv(files: list[str], rows: int, path: str) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        for i in range(rows):
            w.writerow([files[i % len(files)], i % 10])
    return path


def steady_pss(source: str, batches: int = 12) -> tuple[float, float]:
    """(PSS MiB after `batches` batches, bytes of index per sample)."""
    with stoker.Loader(source, batch_size=256, image_size=224, workers=2) as loader:
        it = loader.stream()
        for _ in range(batches):
            next(it)
        pss = tree_pss() / 2**20
        index = loader.source.index
        per = (index.blob.nbytes + index.offsets.nbytes + loader.source.labels.nbytes) / len(
            loader.source
        )
    return pss, per


def drop_pages(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def epoch_rate(loader: stoker.Loader) -> float:
    t0, n = time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    return n / (time.perf_counter() - t0)


def cold_vs_warm(source: str, files: list[str], epochs: int) -> tuple[float, float]:
    cold, warm = [], []
    with stoker.Loader(source, batch_size=256, image_size=224, workers=2) as loader:
        epoch_rate(loader)  # start-up
        for _ in range(epochs):
            drop_pages(files)
            cold.append(epoch_rate(loader))
            warm.append(epoch_rate(loader))
    return statistics.median(cold), statistics.median(warm)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/data/imagenet_like")
    p.add_argument("--shards", default="/tmp/shards")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(args.data, "*", "*.jpg")))[:2000]
    tmp = tempfile.mkdtemp()
    for rows in (2_000, 200_000):
        pss, per = steady_pss(make_csv(files, rows, os.path.join(tmp, f"{rows}.csv")))
        print(f"{rows:>7,} samples: steady PSS {pss:,.1f} MiB, index {per:.0f} bytes/sample")
    all_files = sorted(glob.glob(os.path.join(args.data, "*", "*.jpg")))
    shard_files = sorted(glob.glob(os.path.join(args.shards, "*.parquet")))
    for name, source, paths in (
        ("folder", args.data, all_files),
        ("shards", args.shards, shard_files),
    ):
        cold, warm = cold_vs_warm(source, paths, args.epochs)
        print(
            f"{name}: cold cache {cold:,.0f} img/s, warm {warm:,.0f} img/s "
            f"(median of {args.epochs})"
        )


if __name__ == "__main__":
    main()

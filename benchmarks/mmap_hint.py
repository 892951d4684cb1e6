"""Cold rows of a memory-mapped array through the read-ahead window: page faults alone vs
``MADV_WILLNEED`` first (what ``NpySource.read`` does).

What it does
Maps each given file read-only as raw rows of 224 x 224 x 3 uint8 (150,528 bytes, an ImageNet
image as a ``.npy`` row) and reads every row once, in a random order, in batches of 64 through
``ReadAhead``: four variants (read_ahead=0 and "auto", each with and without the hint) take
turns batch by batch on the same files, so a cache warming up during the run (the machine's or,
on a virtual machine, the host's) favours none. Each row is copied, as a decode would touch it.

Cold means cold: pass big files nobody has read since the machine started (old wheels,
archives; files you just wrote are still in the host's cache on a virtual machine). The files
are only read. Pages are dropped first (``POSIX_FADV_DONTNEED``), which cannot drop the pages of
a file some process has mapped (a loaded library): don't pass those.

Usage
    python benchmarks/mmap_hint.py /opt/pypi/files/*.whl
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from stoker.sources.arrays import NpySource  # noqa: E402
from stoker.sources.readahead import ReadAhead, ReadSettings  # noqa: E402

SHAPE = (224, 224, 3)
ROW = int(np.prod(SHAPE))
BATCH = 64


class RawRows(NpySource):
    """A file read as rows of ``SHAPE`` uint8, with NpySource's reading (and its hint)."""

    def __init__(self, path: str) -> None:
        n = os.path.getsize(path) // ROW
        self.path, self.shape, self.classes = path, (n, *SHAPE), None
        self.labels = np.zeros(n, np.int64)
        self._array = None

    def _images(self) -> np.ndarray:
        if self._array is None:
            self._array = np.memmap(self.path, mode="r", dtype=np.uint8, shape=self.shape)
        return self._array


class FaultsOnly(RawRows):
    """The same rows without the hint: each page waits for its own fault."""

    def read(self, index: int) -> np.ndarray:
        return np.asarray(self._images()[index])


VARIANTS = [(w, kind) for w in (0, "auto") for kind in (FaultsOnly, RawRows)]


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(files: list[str]) -> tuple[collections.Counter, collections.Counter]:
    seconds: collections.Counter = collections.Counter()
    rows: collections.Counter = collections.Counter()
    for f, path in enumerate(files):
        drop(path)
        readers = [
            ReadAhead(kind(path), ReadSettings(window=w, page_cache="keep")) for w, kind in VARIANTS
        ]
        n = os.path.getsize(path) // ROW
        order = np.random.default_rng(f).permutation(n)
        for j, start in enumerate(range(0, n - BATCH + 1, BATCH)):
            v = (j + f) % len(VARIANTS)
            batch, reads = order[start : start + BATCH], readers[v]
            t0 = time.perf_counter()
            reads.start(batch)
            for i in batch:
                np.array(reads.take(int(i))[0])
            seconds[v] += time.perf_counter() - t0
            rows[v] += len(batch)
        for reads in readers:
            reads.close()
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="big files not read since the machine started")
    args = parser.parse_args()
    files = [p for p in args.files if os.path.getsize(p) >= BATCH * ROW]
    print(
        f"{len(files)} files, {sum(map(os.path.getsize, files)) / 1e9:.2f} GB; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    seconds, rows = measure(files)
    for v, (w, kind) in enumerate(VARIANTS):
        hint = "faults only" if kind is FaultsOnly else "MADV_WILLNEED"
        rate = rows[v] / seconds[v]
        print(
            f"read_ahead={w!r:6} {hint:13} {rate:6.0f} rows/s  {rate * ROW / 1e6:4.0f} MB/s"
            f"  ({rows[v]} rows)"
        )


if __name__ == "__main__":
    main()

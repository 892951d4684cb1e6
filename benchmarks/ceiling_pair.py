"""Is stoker at the 2-core ceiling? The ceiling measured with BOTH cores busy, beside stoker.

compare.py's ceiling is one pinned core's rate x 2, measured while the other core idles; on a
machine whose clock boosts when only one core works, that overstates what two busy cores can
do. This script interleaves, for --rounds rounds: a stoker epoch (workers=2), one pinned
single-core run alone, and two pinned single-core runs at the same time (one per core), and
reports stoker / (solo x 2) and stoker / (sum of the concurrent pair).

stoker is timed like compare.py times it (`common.time_stream`, steady row): its workers fill
the prefetch ring while the pinned runs go on, so the batches made ahead are drained untimed
first. (An earlier version timed `len(loader)` batches straight away and so counted those
ready-made batches: its stoker figure, and the 1.11 ratio quoted from it, were ~15% high.)

    python benchmarks/ceiling_pair.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import stoker
from stoker.cli.bench import busy_cores_rate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DATA = "/data/imagenet_like"
OPTIONS = {"batch_size": 256, "image_size": 224, "augment": "train"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=6.0)
    args = p.parse_args()
    rows = []
    with stoker.Loader(DATA, workers=2, **OPTIONS) as loader:
        stream = loader.stream()
        common.time_stream(stream, len(loader))  # warm-up
        for r in range(args.rounds):
            steady, _ = common.time_stream(stream, len(loader))
            common.wait_idle()
            solo = busy_cores_rate(DATA, OPTIONS, 1, args.seconds)[0]
            pair = sum(busy_cores_rate(DATA, OPTIONS, 2, args.seconds))
            rows.append((steady.rate, 2 * solo, pair))
            print(
                f"round {r + 1}: stoker {steady.rate:,.0f}, solo x2 {2 * solo:,.0f}, "
                f"pair {pair:,.0f} img/s",
                flush=True,
            )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(
        f"medians: stoker {med[0]:,.0f}, one core x 2 {med[1]:,.0f}, two busy cores "
        f"{med[2]:,.0f} img/s"
    )
    print(
        f"stoker / (one core x 2) = {med[0] / med[1]:.2f}; "
        f"stoker / (two busy cores) = {med[0] / med[2]:.2f}"
    )


if __name__ == "__main__":
    main()
